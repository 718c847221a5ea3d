// codecs.cuh: element formats, one codec each: what a kernel may ask of the type it reads.
//   Codec<T>::BITS         bits per element
//   Codec<T>::CHUNK_ELEMS  elements per 16-byte chunk (one cp.async, one ldmatrix row)
//   Codec<T>::SCALED       tokens carry a per-token scale (int8: x ~ value * scale): the document's
//                          is applied before the max, the query's (non-negative) after it
//   Codec<T>::Acc          the accumulator type: float, double for float64
//   Codec<T>::EXPONENT     a float format's exponent bits (all ones: NaN or inf), 0 for int8
// with convert<Acc, T> (one element widened), load4 (four of them) and stage_query_chunk (a
// query chunk into shared memory). Kernels never test sizeof(T): a new format (fp8, 4-bit) is
// one more codec here and one entry of cupy_maxsim/_gpu/registry.FORMATS, whose bits and
// scaling tests/test_packaging.py holds to these.
#pragma once

template <typename T> struct Codec;
#define MAXSIM_CODEC(T, BITS_, SCALED_, ACC, EXPONENT_)                        \
    template <> struct Codec<T> {                                              \
        static constexpr int BITS = BITS_, CHUNK_ELEMS = 128 / BITS_;         \
        static constexpr bool SCALED = SCALED_;                                \
        static constexpr unsigned long long EXPONENT = EXPONENT_;              \
        typedef ACC Acc;                                                       \
    };
MAXSIM_CODEC(fp16_t, 16, false, float, 0x7c00u)
MAXSIM_CODEC(bf16_t, 16, false, float, 0x7f80u)
MAXSIM_CODEC(float, 32, false, float, 0x7f800000u)
MAXSIM_CODEC(double, 64, false, double, 0x7ff0000000000000ull)
MAXSIM_CODEC(i8, 8, true, float, 0u)
// float32 scored at fp32 accuracy as three fp16 products (the Hopper kernel's documents-on-M
// split build, MAXSIM_FP32_SPLIT): what the tensor cores read are fp16 halves of each operand
// scaled by a power of two per token, so the format is 16-bit and scaled (the scales undone
// after the products, as int8's). See split_halves below; bench/split_study.py counts its error.
struct fp32_split_t { u16 bits; };
MAXSIM_CODEC(fp32_split_t, 16, true, float, 0x7c00u)

// ---- float32 as fp16 halves (fp32_split_t) --------------------------------------------------
// A token x is scaled by 2^k (exact), y = x 2^k, so that its largest |y| lies in [2^14, 2^15):
// inside fp16's range, and the small halves below out of fp16's subnormals but for elements
// 2^-25 of the largest. Then y = big + small + r, big = fp16(y), small = fp16(y - big) (y - big
// is exact in fp32), |r| <= 2^-22 |y| + 2^-24.9. A product of two tokens is taken as
// big.big + big.small + small.big: each term exact in fp32, at most about 3.1 2^-22 |y_q y_d|
// + 2^-24 (|y_q| + |y_d|) off a coordinate (split_study.representation_bound). The kernels read
// the token's magnitude as the largest of its elements' bits with the sign cleared (an integer
// max orders finite floats by magnitude; inf and NaN compare above every finite one).
constexpr u32 SPLIT_NON_FINITE_BITS = 0x7f800000u;
// k for a token whose largest |x| has the bits `magnitude` (finite): 141 - its biased exponent
// (largest in [2^(E-127), 2^(E-126)) -> [2^14, 2^15)), at most 126 (2^-k stays a normal
// float; tokens below 2^-112 keep what precision that leaves), 0 for a zero token.
__device__ __forceinline__ int split_exponent(u32 magnitude) {
    return magnitude == 0u ? 0 : min(126, 141 - (int)(magnitude >> 23));
}
// The documents' exponents that mark a row written as zeros (masked, or past the document) or
// as non-finite (its scale NaN): maxsim_quantize.cu's maxsim_split_exponents writes them, the
// Hopper kernel's split build reads them.
constexpr int SPLIT_ZERO = 1000, SPLIT_BAD = 1001;
// A row's exponent code from its lanes' largest magnitudes (each lane's max of its elements'
// bits, sign cleared), reduced over the warp: SPLIT_ZERO if not `real` (masked), SPLIT_BAD if it
// holds NaN or inf, else split_exponent. The one decision of the queries' split and the
// documents' exponents. LANES: lanes a row (a warp of 16-lane rows reduces each half apart).
template <int LANES = 32>
__device__ __forceinline__ int split_row_code(bool real, u32 magnitude) {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1) magnitude = max(magnitude, __shfl_xor_sync(0xffffffffu, magnitude, offset));
    return !real ? SPLIT_ZERO : magnitude >= SPLIT_NON_FINITE_BITS ? SPLIT_BAD : split_exponent(magnitude);
}
__device__ __forceinline__ float power_of_two(int k) { return __uint_as_float((u32)(127 + k) << 23); }
// The fp16 halves of two scaled elements a, b (a at the lower address), packed as one 32-bit
// word each: big, and small = fp16(y - big).
__device__ __forceinline__ void split_halves(float a, float b, u32& big, u32& small) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(big) : "f"(b), "f"(a));  // (the first operand: the upper half)
    float big_a, big_b;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.f32.f16 %0, lo;\ncvt.f32.f16 %1, hi;\n}\n"
        : "=f"(big_a), "=f"(big_b) : "r"(big));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(small) : "f"(b - big_b), "f"(a - big_a));
}
// Which product a split k-atom holds. Per 64 elements c of the dim (one fp16 atom of 128
// bytes) the documents' atoms are [big_c, small_c, big_c] (the Hopper kernel's producer writes
// the first two from one read and copies the third) and the queries' [big_c, big_c, small_c]:
// atom 3c + p of the split row pairs with atom 3c + p of the split query.
__device__ __forceinline__ bool split_atom_is_small_query(int atom) { return atom % 3 == 2; }
// Documents split before (maxsim_split_documents) are stored [big_c, small_c] (a third fewer
// bytes than the three atoms): k-atom 3c + p is stored atom 2c + (p == 1), big_c read twice.
__device__ __forceinline__ int split_document_atom(int atom) { return atom / 3 * 2 + (atom % 3 == 1); }
constexpr int SPLIT_DOCUMENT_PARTS = 2, SPLIT_QUERY_PARTS = 3;  // stored atoms per 64 elements

// Conversion of one element to the accumulator type (Codec<T>::Acc).
template <typename A, typename T> __device__ __forceinline__ A convert(T x);
template <> __device__ __forceinline__ float convert<float, fp16_t>(fp16_t x) { return to_float(x); }
template <> __device__ __forceinline__ float convert<float, bf16_t>(bf16_t x) { return to_float(x); }
template <> __device__ __forceinline__ float convert<float, float>(float x) { return x; }
template <> __device__ __forceinline__ float convert<float, signed char>(signed char x) { return (float)x; }
template <> __device__ __forceinline__ double convert<double, double>(double x) { return x; }

// An MMA accumulator as float. int8: exact while |x| <= 2^22, which holds for products of
// int8 summed over K <= 256 (128 * 128 * 256 = 2^22): x is added into the mantissa of 1.5 * 2^23
// and that float subtracted back, an integer add and a float add instead of I2F, which issues at
// an eighth of the float rate and was the int8 fold's bottleneck. Longer K converts with I2F.
template <int K> __device__ __forceinline__ float accumulator_to_float(int x) {
    if constexpr (K <= 256) return __int_as_float(x + 0x4B400000) - 12582912.f;
    else return (float)x;
}
template <int K> __device__ __forceinline__ float accumulator_to_float(float x) { return x; }

// Four consecutive elements, widened to the accumulator type: one 8-byte (16-bit types) or
// 16-byte (float) load when `vector` (16-byte aligned rows, dim a multiple of 4), else
// element by element with a bound check (dim not a multiple of 4).
template <typename T, typename A>
__device__ __forceinline__ void load4(const T* p, int valid, bool vector, A (&out)[4]) {
    if (vector && valid >= 4) {
        if constexpr (Codec<T>::BITS == 16) {
            const uint2 v = *(const uint2*)p;
            const u16 h[4] = {(u16)(v.x & 0xffff), (u16)(v.x >> 16), (u16)(v.y & 0xffff), (u16)(v.y >> 16)};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                T t;
                t.bits = h[e];
                out[e] = convert<A, T>(t);
            }
            return;
        } else if constexpr (Codec<T>::BITS == 32) {
            const float4 v = *(const float4*)p;
            out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) out[e] = e < valid ? convert<A, T>(p[e]) : (A)0;
}

// The alignment of every row start of q and d, in bytes (a power of two, 1 to 16: the
// planner's forward.load_alignment): rows are copied to shared memory in pieces of this size
// (common.cuh's copy_chunk). The Hopper kernel's TMA needs 16.
#ifndef MAXSIM_LOAD_BYTES
#define MAXSIM_LOAD_BYTES 16
#endif
constexpr int LOAD_BYTES = MAXSIM_LOAD_BYTES;

// Bytes of a row's 16-byte chunk that starts at element `element` that hold the row's
// elements (the rest, past dim, are zero-filled): 16, 0, or the tail of a dim that is not a
// multiple of a chunk.
template <typename T> __device__ __forceinline__ int chunk_bytes(int dim, int element) {
    return min(16, max(0, (dim - element) * (Codec<T>::BITS / 8)));
}

// Whether token `token` of query `query` is real: in the block's group, and not masked.
__device__ __forceinline__ bool query_token_real(const ForwardArgs& args, i64 query, int token, bool in_group) {
    bool real = in_group;
    if (real && args.q_mask != nullptr)
        real = args.q_mask[query * args.q_mask_query_stride + token * args.q_mask_row_stride] != 0;
    return real;
}
// Stages 16-byte chunk `chunk` of token `token` of query `query` in shared memory at `dst`,
// zero-filled when the token is not real (outside the block's group, masked) and past dim, and
// returns whether it is real. Both forward kernels stage their query block this way.
template <typename T>
__device__ __forceinline__ bool stage_query_chunk(const ForwardArgs& args, void* dst, i64 query, int token,
                                                  int chunk, bool in_group) {
    constexpr int ELEMS = Codec<T>::CHUNK_ELEMS;
    const bool real = query_token_real(args, query, token, in_group);
    const int bytes = real ? chunk_bytes<T>(args.dim, chunk * ELEMS) : 0;
    const T* src = (const T*)args.q + query * args.q_query_stride + token * args.q_row_stride + chunk * ELEMS;
    copy_chunk<LOAD_BYTES>(dst, bytes ? (const void*)src : args.q, bytes);
    return real;
}
// int8: the per-token query scale.
__device__ __forceinline__ float query_scale(const ForwardArgs& args, i64 query, int token) {
    return args.q_scale[query * args.q_scale_query_stride + token * args.q_scale_row_stride];
}

// Sets `bad` if a 16-byte chunk of 16-bit or fp32 elements holds NaN or inf (an exponent of
// all ones), tested a 32-bit word (two 16-bit elements or one fp32) at a time.
template <typename T> __device__ __forceinline__ void note_non_finite(bool& bad, const uint4& c) {
    static_assert(Codec<T>::BITS == 16 || Codec<T>::BITS == 32, "16-bit or fp32 tokens");
    const u32 low = (u32)Codec<T>::EXPONENT, high = Codec<T>::BITS == 16 ? low << 16 : low;
    const u32 words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) bad |= (words[w] & low) == low || (words[w] & high) == high;
}
// Whether 16-byte chunk `chunk` of token `token` of query `query` (16-bit or fp32, read from q;
// past dim, zeros) holds NaN or inf: for the builds that stream the query unstaged (the Hopper
// split group, rows on 16 bytes; the mma.sync kernel streaming k, rows at ALIGN bytes, any).
// Rows off 16 bytes, and a dim's partial last chunk, are read in 16-bit pieces.
template <typename T, int ALIGN = 16>
__device__ __forceinline__ bool query_chunk_non_finite(const ForwardArgs& args, i64 query, int token, int chunk) {
    constexpr int ELEMS = Codec<T>::CHUNK_ELEMS;
    const T* src = (const T*)args.q + query * args.q_query_stride + token * args.q_row_stride + chunk * ELEMS;
    const int bytes = chunk_bytes<T>(args.dim, chunk * ELEMS);
    uint4 c = make_uint4(0, 0, 0, 0);
    if (ALIGN >= 16 && bytes == 16) {
        c = *(const uint4*)src;
    } else {  // 16-bit pieces (registers, not a local array)
        u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int h = 0; h < 8; ++h)
            if (2 * h < bytes) w[h / 2] |= (u32)((const u16*)src)[h] << (16 * (h % 2));
        c = make_uint4(w[0], w[1], w[2], w[3]);
    }
    bool bad = false;
    note_non_finite<T>(bad, c);
    return bad;
}
// Whether a staged query token (16-bit or fp32) holds NaN or inf, and if so zeroes it, so that
// it stays a valid witness for non-finite document elements (a non-finite document element
// makes 0 * inf = NaN against a zero token too). `row`: 16-byte aligned, `chunks` 16-byte
// chunks; with atom_bytes > 0 the row is in the 128-byte swizzle layout (chunk k of row r in
// atom k / 8 at position (k % 8) ^ (r % 8); `row` points at its line in the first atom). Both
// forward kernels check their query block this way, once.
template <typename T>
__device__ __forceinline__ bool zero_if_non_finite(u16* row, int chunks, int swizzle_row = 0, int atom_bytes = 0) {
    auto chunk_at = [&](int k) {
        return (uint4*)((unsigned char*)row +
                        (atom_bytes ? (k / 8) * atom_bytes + (((k % 8) ^ (swizzle_row % 8)) << 4) : k * 16));
    };
    bool bad = false;
#pragma unroll 4
    for (int k = 0; k < chunks; ++k) note_non_finite<T>(bad, *chunk_at(k));
    if (bad)
        for (int k = 0; k < chunks; ++k) *chunk_at(k) = make_uint4(0, 0, 0, 0);
    return bad;
}
