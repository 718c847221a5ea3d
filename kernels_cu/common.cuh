// common.cuh: types, scalar conversions, reductions, the argument structs and sm_80+
// tensor-core helpers shared by every kernel family. No CUDA headers are included, so the same
// source compiles through CuPy's RawModule and through bare NVRTC (the CI compile check) alike;
// the loader concatenates this file, codecs.cuh and epilogue.cuh in front of each .cu source
// (_gpu/registry.HEADERS) instead of #include-ing them, so CuPy's source-hash cache sees header
// edits.
#pragma once

typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef signed char i8;

// 16-bit float storage types. Only their bits travel through shared memory and the tensor
// cores; arithmetic happens after conversion to float.
struct fp16_t { u16 bits; };
struct bf16_t { u16 bits; };

#define MAXSIM_FLT_MAX 3.402823466e+38f
#define MAXSIM_INF __int_as_float(0x7f800000)
#define MAXSIM_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_float(fp16_t x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_float(bf16_t x) { return __uint_as_float(((u32)x.bits) << 16); }
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ double to_double(fp16_t x) { return (double)to_float(x); }
__device__ __forceinline__ double to_double(bf16_t x) { return (double)to_float(x); }
__device__ __forceinline__ double to_double(float x) { return (double)x; }
__device__ __forceinline__ double to_double(double x) { return x; }

// Max that propagates NaN (NumPy semantics). IEEE fmaxf would drop a NaN silently.
__device__ __forceinline__ float max_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ double max_nan(double a, double b) { return (b > a || b != b) ? b : a; }
// x, or NaN where x is +-inf: x * 0 + x in one rounding is x for every finite x (x * 0 is a
// zero of x's sign), NaN for +-inf and NaN. Folded by max_nan, no non-finite value is lost (an
// -inf one would lose to any finite value). Inline PTX: nothing may simplify x * 0.
__device__ __forceinline__ float nan_if_infinite(float x) {
    float r;
    asm("fma.rn.f32 %0, %1, 0f00000000, %1;" : "=f"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ double min_plain(double a, double b) { return b < a ? b : a; }
__device__ __forceinline__ float min_plain(float a, float b) { return fminf(a, b); }

// Inclusive prefix sum of `value` over the lanes of a warp (every lane calls it, with its lane:
// threadIdx.x itself where only warp 0 calls, which saves the mask).
__device__ __forceinline__ int warp_inclusive_sum(int value, int lane) {
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
        const int other = __shfl_up_sync(0xffffffffu, value, offset);
        value += lane >= offset ? other : 0;
    }
    return value;
}

// Every scalar argument of the forward kernels, passed by value as one struct: the host packs
// it with a single struct.pack (_gpu/args.FORWARD_ARGS mirrors the field order), which costs far
// less per launch than two dozen separate arguments. 8-byte fields come first, then 4-byte
// fields, so there is no padding to get wrong. The pointers a repeated call changes lead (its
// arrays, results, masks and scales), so that a replayed launch patches them with one
// pack_into (_gpu/args.ArgTemplate, FORWARD_HEAD).
struct ForwardArgs {
    const void* q;
    const void* d;
    void* out;
    void* argmax;                // training: winning document token per (query, doc, query token), or null
    const unsigned char* q_mask;
    const unsigned char* d_mask;
    const float* q_scale;        // int8 only: per-token scales, (Nq, Lq) strides below
    const float* d_scale;        // int8 only: (Nd, Ld) padded, or (T,) packed (row stride only)
    i64 q_query_stride, q_row_stride, q_dim_stride;
    i64 q_mask_query_stride, q_mask_row_stride;
    i64 d_doc_stride, d_row_stride, d_dim_stride, doc_length;
    const void* offsets;
    i64 d_mask_doc_stride, d_mask_row_stride;
    i64 num_docs, docs_per_block;
    i64 out_query_stride;
    i64 q_scale_query_stride, q_scale_row_stride;
    i64 d_scale_doc_stride, d_scale_row_stride;
    i64 argmax_query_stride, argmax_doc_stride;  // token stride 1; int16 or int32 elements
    i64 doc_rotation;  // wgmma kernel: query group y starts its document range y * this later
    // wgmma kernel: the launch's last query group's own ranges, whose warpgroups past the last
    // query idle (longer ranges: fewer MMAs a document), or 0: its ranges are the others' and
    // every warpgroup multiplies (they keep reading the documents the others read, from L2).
    i64 last_group_docs_per_block;
    // The first long_ranges blocks (grid x) take docs_per_block documents each, the rest one
    // fewer: every SM of a one-wave grid streams where ceil-sized ranges would leave some idle
    // (813 documents over 132 blocks: 21 of 7 and 111 of 6, not 117 of 7). At most 2^31 - 1
    // (block_doc_range reads it as 32-bit): the grid's x where every range is whole.
    i64 long_ranges;
    int num_queries, query_length, dim, offsets_are_64bit;
    int queries_per_group, pairs, rows_per_chunk, argmax_is_32bit;
};
static_assert(sizeof(ForwardArgs) == 32 * 8 + 8 * 4, "ForwardArgs must have no padding");

// The documents [begin, end) of grid block `block` whose ranges hold `per` documents each
// (ForwardArgs.long_ranges: one fewer past the long ones); empty past the last document. The
// block and long_ranges are 32-bit (a grid's x is below 2^31).
__device__ __forceinline__ void block_doc_range(const ForwardArgs& args, int block, i64 per, i64& begin, i64& end) {
    const int long_ranges = (int)args.long_ranges;
    begin = (i64)block * per - max(block - long_ranges, 0);  // (less the short ranges before it)
    end = min((i64)(block + 1) * per - max(block + 1 - long_ranges, 0), args.num_docs);
}

// Saved argmax: the winning token's index within its document, -1 for a masked query token
// or a document with no real token. int16 when every document is shorter than 32768 tokens.
__device__ __forceinline__ void store_argmax(void* argmax, int is_32bit, i64 index, int value) {
    if (is_32bit) ((int*)argmax)[index] = value;
    else ((short*)argmax)[index] = (short)value;
}
__device__ __forceinline__ int load_argmax(const void* argmax, int is_32bit, i64 index) {
    return is_32bit ? ((const int*)argmax)[index] : (int)((const short*)argmax)[index];
}

// Every scalar argument of the backward kernels (maxsim_bwd.cu), packed like ForwardArgs
// (_gpu/args.BACKWARD_ARGS mirrors it). q and d have unit dim stride (the caller copies a
// strided operand once); grad_q and grad_d are contiguous, in the input dtype.
struct BackwardArgs {
    // The pointers of one forward's arrays, its gradients and its scratch lead, then
    // grad_scores': a step's staged arguments patch them in (_gpu/args.ArgTemplate, BACKWARD_HEAD
    // and BACKWARD_GRAD).
    const void* q;
    const void* d;
    const void* argmax;
    void* grad_q;
    void* grad_d;
    int* sources;       // scratch: the inverse CSR, sources_per_doc entries per document
    int* row_ranges;    // scratch: per row (and one per document), its light and hot list starts
    int* csr_counts;    // scratch for documents too long for shared memory, or null
    float* partial;     // scratch: dQ partial sums per document chunk, or null (one chunk)
    const float* grad;  // (Nq, Nd) scores' gradient, float32
    i64 grad_query_stride, grad_doc_stride;
    i64 q_query_stride, q_row_stride;
    i64 d_doc_stride, d_row_stride, doc_length;
    const void* offsets;
    i64 argmax_query_stride, argmax_doc_stride;
    i64 csr_counts_stride;
    i64 num_docs, sources_per_doc, docs_per_chunk;
    int num_queries, query_length, dim, offsets_are_64bit;
    int pairs, argmax_is_32bit, count_warps, vector_loads;
    int rows_per_warp, reserved;
};
static_assert(sizeof(BackwardArgs) == 24 * 8 + 10 * 4, "BackwardArgs must have no padding");

// float -> storage type, round to nearest even.
__device__ __forceinline__ void store_value(fp16_t* p, float x) {
    u16 bits;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(x));
    p->bits = bits;
}
__device__ __forceinline__ void store_value(bf16_t* p, float x) {
    u16 bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
    p->bits = bits;
}
__device__ __forceinline__ void store_value(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_value(double* p, double x) { *p = x; }

// Document rows: where doc `doc` starts (in elements) and how many tokens it has. Padded
// batches use a fixed length and a doc stride; packed corpora use cu_seqlens-style offsets
// (int32 or int64, as the caller gave them: no conversion copy).
struct DocLayout {
    i64 doc_stride;          // padded: elements between documents
    i64 row_stride;          // elements between consecutive tokens of one document
    i64 padded_length;       // padded: Ld; unused when packed
    const void* offsets;     // packed: (Nd + 1,) token offsets, else nullptr
    int offsets_are_64bit;
};

__device__ __forceinline__ DocLayout make_doc_layout(i64 doc_stride, i64 row_stride, i64 padded_length,
                                                    const void* offsets, int offsets_are_64bit) {
    DocLayout layout;
    layout.doc_stride = doc_stride;
    layout.row_stride = row_stride;
    layout.padded_length = padded_length;
    layout.offsets = offsets;
    layout.offsets_are_64bit = offsets_are_64bit;
    return layout;
}

// A document's token range [begin, end): loaded from the offsets when packed, else [0, Ld).
// Split from doc_extent so that a caller can issue the loads a while before it needs them.
__device__ __forceinline__ void doc_bounds(const DocLayout& L, i64 doc, i64& begin, i64& end) {
    if (L.offsets == nullptr) {
        begin = 0, end = L.padded_length;
    } else if (L.offsets_are_64bit) {
        begin = ((const i64*)L.offsets)[doc], end = ((const i64*)L.offsets)[doc + 1];
    } else {
        begin = ((const int*)L.offsets)[doc], end = ((const int*)L.offsets)[doc + 1];
    }
}

// base: element offset of the document's first token; first_token: its index in the packed
// array (0 when padded).
__device__ __forceinline__ void extent_of_bounds(const DocLayout& L, i64 doc, i64 begin, i64 end, i64& base,
                                                 i64& length, i64& first_token) {
    base = L.offsets == nullptr ? doc * L.doc_stride : begin * L.row_stride;
    length = end - begin;
    first_token = begin;
}

// first_token: index of the document's first token in the packed array (0 when padded).
// (The loads written out here, not through doc_bounds: that form made the backward's CSR kernel
// spill registers on sm_80.)
__device__ __forceinline__ void doc_extent(const DocLayout& L, i64 doc, i64& base, i64& length,
                                           i64& first_token) {
    first_token = 0;
    if (L.offsets == nullptr) {
        base = doc * L.doc_stride;
        length = L.padded_length;
    } else {
        i64 begin, end;
        if (L.offsets_are_64bit) {
            begin = ((const i64*)L.offsets)[doc];
            end = ((const i64*)L.offsets)[doc + 1];
        } else {
            begin = ((const int*)L.offsets)[doc];
            end = ((const int*)L.offsets)[doc + 1];
        }
        base = begin * L.row_stride;
        length = end - begin;
        first_token = begin;
    }
}

// ---- sm_80+ tensor-core and async-copy helpers -------------------------------------------

__device__ __forceinline__ u32 smem_address(const void* p) {
    u32 address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
    return address;
}

// 16-byte global->shared copy; fewer than 16 source bytes zero-fill the rest (0 = all zeros,
// no global read at all, which is how masked and out-of-range tokens cost no bandwidth).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)),
                 "l"(gmem), "r"(src_bytes));
}
// 4-byte variant (per-row scales), same zero-fill rule.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)),
                 "l"(gmem), "r"(src_bytes));
}
// 8-byte variant (rows aligned to 8 bytes), same zero-fill rule.
__device__ __forceinline__ void cp_async_8(void* smem, const void* gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_address(smem)),
                 "l"(gmem), "r"(src_bytes));
}

// A 16-byte chunk of a row into shared memory: its first `bytes` (0 to 16) from `gmem`, zeros
// after, for rows whose starts are aligned to ALIGN bytes (a dim that is not a multiple of a
// chunk, or rows of an odd dim packed back to back): one cp.async at 16, pieces of 8 or 4 bytes,
// and below 4 (cp.async's smallest) plain loads of ALIGN bytes and one store, synchronous; the
// planner then makes `bytes` a multiple of ALIGN. `gmem` must be a valid address even when
// `bytes` is 0 (nothing is read then): pieces past `bytes` pass the chunk's start.
template <int ALIGN> __device__ __forceinline__ void copy_chunk(void* smem, const void* gmem, int bytes) {
    static_assert(ALIGN == 1 || ALIGN == 2 || ALIGN == 4 || ALIGN == 8 || ALIGN == 16, "a power of two to 16");
    if constexpr (ALIGN == 16) {
        cp_async_16(smem, gmem, bytes);
    } else if constexpr (ALIGN >= 4) {
#pragma unroll
        for (int p = 0; p < 16 / ALIGN; ++p) {
            const int piece = min(max(bytes - p * ALIGN, 0), ALIGN);
            const void* src = piece ? (const void*)((const unsigned char*)gmem + p * ALIGN) : gmem;
            void* dst = (unsigned char*)smem + p * ALIGN;
            if constexpr (ALIGN == 8) cp_async_8(dst, src, piece);
            else cp_async_4(dst, src, piece);
        }
    } else {
        union { uint4 chunk; u16 halves[8]; unsigned char bytes[16]; } v;
#pragma unroll
        for (int e = 0; e < 16 / ALIGN; ++e) {
            if constexpr (ALIGN == 2) v.halves[e] = 2 * e < bytes ? ((const u16*)gmem)[e] : (u16)0;
            else v.bytes[e] = e < bytes ? ((const unsigned char*)gmem)[e] : (unsigned char)0;
        }
        *(uint4*)smem = v.chunk;
    }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(smem)));
}

// One tensor-core step over 32 bytes of k: m16n8k16 for 16-bit floats (fp32 accumulate),
// m16n8k32 for int8 (int32 accumulate, exact). The fragments are the same bytes either way, so
// one ldmatrix layout serves both.
template <typename T> struct Mma16816;
template <> struct Mma16816<i8> {
    typedef int acc_t;
    static __device__ __forceinline__ void run(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma16816<fp16_t> {
    typedef float acc_t;
    static __device__ __forceinline__ void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma16816<bf16_t> {
    typedef float acc_t;
    static __device__ __forceinline__ void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// float32 on tensor cores at float32 accuracy (3xTF32): 32 bytes of k are 8 elements, one
// m16n8k8 TF32 step, whose fragments are the same bytes in the same lanes as the 16-bit ones
// (an fp32 element is a pair of b16 to ldmatrix), so the kernels load them alike. Each element
// x is split into big = tf32(x) and small = tf32(x - big) (x - big is exact); x * y is taken as
// big*big + big*small + small*big, leaving out small*small and the rounding of the smalls, each
// at most 2^-22 |x y|: about 2^-21 relative per product, against 2^-11 for one TF32 pass. The
// small terms go first so that the big one does not swamp them. Three MMAs of half the 16-bit
// rate: six times the 16-bit MMA time per element (the sweep in bench/cliffs.py measures it).
__device__ __forceinline__ void split_tf32(u32 x, u32& big, u32& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(__uint_as_float(x)));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(__uint_as_float(x) - __uint_as_float(big)));
}
// ... by integer ops (the Hopper kernel's TF32 builds split every document element in shared
// memory: cvt.rna.tf32 issues at a quarter of the rate): big = x rounded to TF32, half-ulp away from zero (adding 2^12 to the bit pattern
// carries into the exponent where it should), small = x - big, exact, whose low bits the tensor
// cores drop (at most 2^-10 of small: 2^-21 of x). A non-finite x makes small NaN, and the
// document's scores NaN, as with every non-finite document element.
__device__ __forceinline__ void split_tf32_bits(u32 x, u32& big, u32& small) {
    big = (x + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(__uint_as_float(x) - __uint_as_float(big));
}
// ... or where the tensor cores read x itself as big (an fp32 operand in shared memory, of which
// they keep the TF32 bits: big = x truncated to TF32), the small half alone: x - big, exact, at
// most 2^-10 |x|, of which they again keep the TF32 bits (at most 2^-21 of x lost). A
// non-finite x makes it NaN (inf - inf, or NaN).
__device__ __forceinline__ u32 truncate_tf32_bits(u32 x) {
    return __float_as_uint(__uint_as_float(x) - __uint_as_float(x & 0xffffe000u));
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> struct Mma16816<float> {
    typedef float acc_t;
    // The split is plain (not volatile) asm: an A fragment met by several n-tiles is split once.
    static __device__ __forceinline__ void run(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        u32 a_big[4], a_small[4], b_big[2], b_small[2];
#pragma unroll
        for (int e = 0; e < 4; ++e) split_tf32(a[e], a_big[e], a_small[e]);
        split_tf32(b0, b_big[0], b_small[0]);
        split_tf32(b1, b_big[1], b_small[1]);
        mma_tf32(c, a_small, b_big[0], b_big[1]);
        mma_tf32(c, a_big, b_small[0], b_small[1]);
        mma_tf32(c, a_big, b_big[0], b_big[1]);
    }
};
