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
