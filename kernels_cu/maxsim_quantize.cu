// maxsim_quantize.cu: per-token symmetric int8 quantisation (cupy_maxsim.quantize_int8 on the
// GPU), one warp a token, in one launch: it was a dozen CuPy operations a block of tokens, each
// compiled on a new machine's first call, and an int8 Index quantises every query it is given.
// Bit for bit the NumPy path's arithmetic (cupy_maxsim/_int8.py), in float32:
//
//   scale = max |x| / 127 (NaN if the token holds a NaN), safe = scale > 0 ? scale : 1,
//   value = clip(rint(x / safe), -127, 127) with NaN and +-inf quotients 0; masked tokens 0, 0.
//
// float64 tokens are rounded to float32 first, as the NumPy path does.

template <typename T>
__device__ __forceinline__ float quantize_input(T x) { return to_float(x); }
template <>
__device__ __forceinline__ float quantize_input<double>(double x) { return (float)x; }

template <typename T>
__device__ __forceinline__ void quantize_rows(const T* x, i64 rows, int dim, const unsigned char* mask,
                                              signed char* values, float* scales) {
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
        const T* in = x + row * dim;
        signed char* out = values + row * dim;
        if (mask != nullptr && !mask[row]) {
            for (int c = lane; c < dim; c += 32) out[c] = 0;
            if (lane == 0) scales[row] = 0.f;
            continue;
        }
        float largest = 0.f;
        bool nan = false;
        for (int c = lane; c < dim; c += 32) {
            const float magnitude = fabsf(quantize_input(in[c]));
            nan |= magnitude != magnitude;
            largest = fmaxf(largest, magnitude);
        }
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1)
            largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
        nan = __any_sync(0xffffffffu, nan);
        const float scale = nan ? __int_as_float(0x7fc00000) : largest / 127.f;  // (IEEE division)
        const float safe = scale > 0.f ? scale : 1.f;
        for (int c = lane; c < dim; c += 32) {
            const float quotient = quantize_input(in[c]) / safe;
            const float finite = isfinite(quotient) ? quotient : 0.f;
            out[c] = (signed char)fminf(fmaxf(rintf(finite), -127.f), 127.f);
        }
        if (lane == 0) scales[row] = scale;
    }
}

// THREADS: the block size _gpu/launch.quantize_int8 launches with (QUANTIZE_THREADS).
#define QUANTIZE_THREADS 256
#define MAXSIM_QUANTIZE_ENTRY(NAME, T)                                                                \
    extern "C" __global__ void __launch_bounds__(QUANTIZE_THREADS)                                     \
        NAME(const T* x, i64 rows, int dim, const unsigned char* mask, signed char* values, float* scales) { \
        quantize_rows<T>(x, rows, dim, mask, values, scales);                                         \
    }
MAXSIM_QUANTIZE_ENTRY(maxsim_quantize_fp16, fp16_t)
MAXSIM_QUANTIZE_ENTRY(maxsim_quantize_bf16, bf16_t)
MAXSIM_QUANTIZE_ENTRY(maxsim_quantize_fp32, float)
MAXSIM_QUANTIZE_ENTRY(maxsim_quantize_fp64, double)

// float32 tokens split for the Hopper kernel's fp32 split build (codecs.cuh, fp32_split_t): the
// token scaled by 2^k (split_exponent of its largest magnitude) and written as fp16 halves, per
// 64 elements c the atoms [big_c, big_c, small_c] for queries (192 halves), [big_c, small_c]
// for DOCUMENTS (128: the kernel reads big_c twice, split_document_atom); zeros past the dim.
// Its scale 2^-k, NaN if the token holds NaN or inf (its elements then zeros); masked tokens
// zeros, scale 0 (a query's) or 1 (a document's, as its producer-split build writes a masked
// row: the fold skips it). Rows as split_exponent_rows takes them: `rows` of documents of
// doc_length rows at doc_stride and row_stride elements (mask likewise); the halves come out
// contiguous, [rows][PARTS * 64 * atoms]. A launch whose rows all lie on 16 bytes with a dim
// of a multiple of 4 (the presplit build's: TMA rows) reads 16-byte vectors (split_vector_rows);
// other launches go a pair of elements at a time, a warp a row.
//
// split_vector_rows: a row on LANES lanes (16 for dims up to 64: two rows side by side in a
// warp), each lane's four elements in one 64 of the dim. A lane holds SPLIT_HELD_VECTORS
// vectors in registers between the magnitude and the split (one read of HBM): of as many rows
// as fit, one after another (dim 128: 8 rows a warp at once, 4 KB in flight; dim 1024: one),
// so that a warp's loads keep enough bytes in flight whatever the dim. Rows past 1024 elements
// are read twice (the second from L2).
constexpr int SPLIT_HELD_VECTORS = 8;
// A float's magnitude as the split reads it: its bits, sign cleared (split_row_code's input).
__device__ __forceinline__ u32 magnitude_bits(float x) { return __float_as_uint(x) & 0x7fffffffu; }
// Both split paths' layout of a row's halves: the word of part `part` of chunk c's pair o
// (elements 2 o, 2 o + 1 of the 64), which part holds the small halves, and the row's scale.
template <bool DOCUMENTS> __device__ __forceinline__ int split_word(int c, int part, int o) {
    return c * 32 * (DOCUMENTS ? SPLIT_DOCUMENT_PARTS : SPLIT_QUERY_PARTS) + part * 32 + o;
}
template <bool DOCUMENTS> __device__ __forceinline__ bool split_part_is_small(int part) {
    return DOCUMENTS ? part == 1 : split_atom_is_small_query(part);
}
template <bool DOCUMENTS> __device__ __forceinline__ float split_row_scale(bool real, int code) {
    return !real ? (DOCUMENTS ? 1.f : 0.f) : code == SPLIT_BAD ? __int_as_float(0x7fc00000) : power_of_two(-code);
}
template <bool DOCUMENTS, int LANES>
__device__ __forceinline__ void split_vector_rows(const float* x, i64 rows, i64 doc_length, i64 doc_stride,
                                                  i64 row_stride, int dim, const unsigned char* mask,
                                                  i64 mask_doc_stride, i64 mask_row_stride, u16* halves, float* scales) {
    constexpr int PARTS = DOCUMENTS ? SPLIT_DOCUMENT_PARTS : SPLIT_QUERY_PARTS, SIDE = 32 / LANES;
    constexpr int HELD = DOCUMENTS ? SPLIT_HELD_VECTORS : SPLIT_HELD_VECTORS / 2;  // (queries: three parts spill at 8)
    const int lane = (threadIdx.x & 31) % LANES, sub = (threadIdx.x & 31) / LANES;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    const int atoms = (dim + 63) / 64, per_row = (dim + 4 * LANES - 1) / (4 * LANES);  // a row's vectors a lane
    const bool held = per_row <= HELD;  // (the same for the launch)
    const int deep = held ? HELD / per_row : 1;  // rows a lane holds at once
    // Held vector i: of the lane's row r_of[i] (past `deep`: none), its j_of[i]-th vector.
    int r_of[HELD], j_of[HELD];
#pragma unroll
    for (int i = 0; i < HELD; ++i) r_of[i] = held ? i / per_row : (i == 0 ? 0 : HELD), j_of[i] = held ? i % per_row : 0;
    const auto bits = [](float4 u) {
        return max(max(magnitude_bits(u.x), magnitude_bits(u.y)), max(magnitude_bits(u.z), magnitude_bits(u.w)));
    };
    const float4 zeros = make_float4(0.f, 0.f, 0.f, 0.f);
    for (i64 first = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * SIDE * deep; first < rows;
         first += warps * SIDE * deep) {
        float4 v[HELD];
        u32 magnitude[HELD];
        bool real[HELD];
        const float* in[HELD];
        // The lane's first row (first + sub) as (doc, token); each next held row SIDE on (one
        // 64-bit division a group: a division a vector spilled).
        i64 at = first + sub, doc = at / doc_length, token = at % doc_length;
#pragma unroll
        for (int i = 0; i < HELD; ++i) {
            if (i > 0 && j_of[i] == 0 && r_of[i] < deep) {
                at += SIDE, token += SIDE;
                while (token >= doc_length) token -= doc_length, ++doc;
            }
            in[i] = x + doc * doc_stride + token * row_stride;
            real[i] = r_of[i] < deep && at < rows && (mask == nullptr || mask[doc * mask_doc_stride + token * mask_row_stride]);
            const int c = 4 * lane + 4 * LANES * j_of[i];
            v[i] = held && real[i] && c < dim ? *(const float4*)(in[i] + c) : zeros;
            magnitude[i] = bits(v[i]);
        }
        if (!held && real[0])  // (one row a lane: its magnitude over the whole row, v unused)
            for (int c = 4 * lane; c < dim; c += 4 * LANES) magnitude[0] = max(magnitude[0], bits(*(const float4*)(in[0] + c)));
#pragma unroll
        for (int i = 0; i < HELD; ++i)
#pragma unroll
            for (int offset = LANES / 2; offset > 0; offset >>= 1)
                magnitude[i] = max(magnitude[i], __shfl_xor_sync(0xffffffffu, magnitude[i], offset));
#pragma unroll
        for (int i = 0; i < HELD; ++i) {
            const int r = r_of[i];
            const i64 row = first + sub + SIDE * r;
            if (r >= deep || row >= rows) continue;
            u32 row_magnitude = 0u;  // (the row's vectors: those held with the same r)
#pragma unroll
            for (int other = 0; other < HELD; ++other)
                if (r_of[other] == r) row_magnitude = max(row_magnitude, magnitude[other]);
            const int code = split_row_code<1>(real[i], row_magnitude);  // (reduced over the lanes above)
            const bool zero = code >= SPLIT_ZERO;
            const float scale = power_of_two(zero ? 0 : code);
            u32* out = (u32*)(halves + row * PARTS * 64 * atoms);  // pairs of halves
            // Elements e..e + 3 (pairs o, o + 1 of chunk c) from u: every part's pair of words.
            auto write = [&](int e, float4 u) {
                if (zero) u = zeros;
                uint2 big, small;
                split_halves(u.x * scale, u.y * scale, big.x, small.x);
                split_halves(u.z * scale, u.w * scale, big.y, small.y);
                const int c = e / 64, o = (e % 64) / 2;
#pragma unroll
                for (int part = 0; part < PARTS; ++part)
                    *(uint2*)(out + split_word<DOCUMENTS>(c, part, o)) = split_part_is_small<DOCUMENTS>(part) ? small : big;
            };
            const int e = 4 * lane + 4 * LANES * j_of[i];
            if (held) {
                if (e < 64 * atoms) write(e, v[i]);
            } else {
                for (int f = e; f < 64 * atoms; f += 4 * LANES)
                    write(f, !zero && f < dim ? *(const float4*)(in[i] + f) : zeros);
            }
            if (lane == 0 && j_of[i] == 0) scales[row] = split_row_scale<DOCUMENTS>(real[i], code);
        }
    }
}
template <bool DOCUMENTS>
__device__ __forceinline__ void split_rows(const float* x, i64 rows, i64 doc_length, i64 doc_stride, i64 row_stride,
                                           int dim, const unsigned char* mask, i64 mask_doc_stride,
                                           i64 mask_row_stride, u16* halves, float* scales) {
    if (dim % 4 == 0 && ((size_t)x & 15) == 0 && doc_stride % 4 == 0 && row_stride % 4 == 0) {  // (uniform)
        if (dim <= 64)
            split_vector_rows<DOCUMENTS, 16>(x, rows, doc_length, doc_stride, row_stride, dim, mask, mask_doc_stride,
                                             mask_row_stride, halves, scales);
        else
            split_vector_rows<DOCUMENTS, 32>(x, rows, doc_length, doc_stride, row_stride, dim, mask, mask_doc_stride,
                                             mask_row_stride, halves, scales);
        return;
    }
    constexpr int PARTS = DOCUMENTS ? SPLIT_DOCUMENT_PARTS : SPLIT_QUERY_PARTS;
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    const int atoms = (dim + 63) / 64;
    for (i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows; row += warps) {
        const i64 doc = row / doc_length, token = row % doc_length;
        const float* in = x + doc * doc_stride + token * row_stride;
        u32* out = (u32*)(halves + row * PARTS * 64 * atoms);  // pairs of halves
        const bool real = mask == nullptr || mask[doc * mask_doc_stride + token * mask_row_stride];
        u32 magnitude = 0u;
#pragma unroll 4
        for (int c = lane; real && c < dim; c += 32) magnitude = max(magnitude, magnitude_bits(in[c]));
        const int code = split_row_code(real, magnitude);
        const bool zero = code >= SPLIT_ZERO;
        const float scale = power_of_two(zero ? 0 : code);
        for (int pair = lane; pair < 32 * atoms; pair += 32) {  // elements 2 pair, 2 pair + 1
            const int e = 2 * pair, c = e / 64, o = (e % 64) / 2;
            const float a = !zero && e < dim ? in[e] * scale : 0.f, b = !zero && e + 1 < dim ? in[e + 1] * scale : 0.f;
            u32 big, small;
            split_halves(a, b, big, small);
#pragma unroll
            for (int part = 0; part < PARTS; ++part)
                out[split_word<DOCUMENTS>(c, part, o)] = split_part_is_small<DOCUMENTS>(part) ? small : big;
        }
        if (lane == 0) scales[row] = split_row_scale<DOCUMENTS>(real, code);
    }
}
// Queries: contiguous tokens (q is small: made contiguous first).
extern "C" __global__ void __launch_bounds__(QUANTIZE_THREADS)
    maxsim_quantize_fp32_split(const float* x, i64 rows, int dim, const unsigned char* mask, u16* halves, float* scales) {
    split_rows<false>(x, rows, rows, 0, dim, dim, mask, 0, 1, halves, scales);
}
// Documents: docs x doc_length rows (packed: one document of every token) where they lie.
extern "C" __global__ void __launch_bounds__(QUANTIZE_THREADS)
    maxsim_split_documents(const float* x, i64 docs, i64 doc_length, i64 doc_stride, i64 row_stride, int dim,
                           const unsigned char* mask, i64 mask_doc_stride, i64 mask_row_stride, u16* halves,
                           float* scales) {
    split_rows<true>(x, docs * doc_length, doc_length, doc_stride, row_stride, dim, mask, mask_doc_stride,
                     mask_row_stride, halves, scales);
}

// The fp32 split build's document exponents (maxsim_fwd_wgmma.cu, FP32_SPLIT), read as the
// tiles' scales are: for each row of `docs` documents of `doc_length` rows (packed: one
// document of every token) at doc_stride and row_stride elements, split_exponent of its
// largest magnitude, SPLIT_BAD if it holds NaN or inf, SPLIT_ZERO if masked; [docs * doc_length].
// Once a launch, not in each query group's blocks: a row's exponent needs all of it before
// any chunk is split. A warp takes SPLIT_EXPONENT_ROWS rows at once, their loads issued
// together (at dim 64 a row is two loads a lane: one row a warp left HBM waiting).
constexpr int SPLIT_EXPONENT_ROWS = 4;
__device__ __forceinline__ void split_exponent_rows(const float* x, i64 docs, i64 doc_length, i64 doc_stride,
                                                    i64 row_stride, int dim, const unsigned char* mask,
                                                    i64 mask_doc_stride, i64 mask_row_stride, int* exponents) {
    const int lane = threadIdx.x & 31;
    const i64 rows = docs * doc_length, warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 first = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * SPLIT_EXPONENT_ROWS; first < rows;
         first += warps * SPLIT_EXPONENT_ROWS) {
        const float* in[SPLIT_EXPONENT_ROWS];
        bool real[SPLIT_EXPONENT_ROWS];
        u32 magnitude[SPLIT_EXPONENT_ROWS];
#pragma unroll
        for (int r = 0; r < SPLIT_EXPONENT_ROWS; ++r) {
            const i64 row = first + r, doc = row / doc_length, token = row % doc_length;
            real[r] = row < rows && (mask == nullptr || mask[doc * mask_doc_stride + token * mask_row_stride]);
            in[r] = x + doc * doc_stride + token * row_stride;
            magnitude[r] = 0u;
        }
#pragma unroll 2
        for (int c = lane; c < dim; c += 32)
#pragma unroll
            for (int r = 0; r < SPLIT_EXPONENT_ROWS; ++r)
                if (real[r]) magnitude[r] = max(magnitude[r], magnitude_bits(in[r][c]));
#pragma unroll
        for (int r = 0; r < SPLIT_EXPONENT_ROWS; ++r) {
            const int code = split_row_code(real[r], magnitude[r]);
            if (lane == 0 && first + r < rows) exponents[first + r] = code;
        }
    }
}
#define MAXSIM_EXPONENTS_ENTRY(NAME, THREADS)                                                                \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                    \
        NAME(const float* x, i64 docs, i64 doc_length, i64 doc_stride, i64 row_stride, int dim,              \
             const unsigned char* mask, i64 mask_doc_stride, i64 mask_row_stride, int* exponents) {          \
        split_exponent_rows(x, docs, doc_length, doc_stride, row_stride, dim, mask, mask_doc_stride,         \
                            mask_row_stride, exponents);                                                     \
    }
MAXSIM_EXPONENTS_ENTRY(maxsim_split_exponents, QUANTIZE_THREADS)
