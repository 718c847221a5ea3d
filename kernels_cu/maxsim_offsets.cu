// maxsim_offsets.cu: the checks score_packed and score_backward make on device-resident
// packed-document offsets, in one launch and one 32-byte read back (they were eleven CuPy
// operations, whose host time showed in every packed call):
//
//   summary = (first offset, last offset, number of decreasing steps, longest step)
//
// The caller zeroes summary[2] and summary[3]; each warp adds its count and its maximum with
// integer atomics (exact, and the same in any order). Offsets are int32 or int64 with a stride
// in elements (a strided view is read in place).

__device__ __forceinline__ void offsets_summary(const void* offsets, i64 count, i64 stride, int is_64bit,
                                                i64* summary) {
    auto at = [&](i64 i) -> i64 {
        return is_64bit ? ((const i64*)offsets)[i * stride] : (i64)((const int*)offsets)[i * stride];
    };
    unsigned long long decreasing = 0;
    i64 longest = 0;
    // A decrease is a comparison of neighbours, not the sign of their difference (which wraps
    // past int64). The longest step counts only rising steps (it is read only when none
    // decreases), their difference taken unsigned: no signed overflow whatever the values.
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i + 1 < count; i += (i64)gridDim.x * blockDim.x) {
        const i64 here = at(i), next = at(i + 1);
        decreasing += next < here;
        const unsigned long long step = (unsigned long long)next - (unsigned long long)here;
        if (next > here && step <= 0x7fffffffffffffffULL && (i64)step > longest) longest = (i64)step;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        decreasing += __shfl_xor_sync(0xffffffffu, decreasing, offset);
        const i64 other = __shfl_xor_sync(0xffffffffu, longest, offset);
        longest = other > longest ? other : longest;
    }
    if ((threadIdx.x & 31) == 0) {
        if (decreasing) atomicAdd((unsigned long long*)summary + 2, decreasing);
        if (longest > 0) atomicMax(summary + 3, longest);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) summary[0] = at(0), summary[1] = at(count - 1);
}

// THREADS: the block size _gpu/launch.offsets_summary launches with.
#define MAXSIM_OFFSETS_ENTRY(NAME, THREADS)                                                               \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const void* offsets, i64 count, i64 stride, \
                                                               int is_64bit, i64* summary) {              \
        offsets_summary(offsets, count, stride, is_64bit, summary);                                      \
    }
MAXSIM_OFFSETS_ENTRY(maxsim_offsets_summary, 256)
