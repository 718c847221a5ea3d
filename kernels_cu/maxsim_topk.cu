// maxsim_topk.cu: the k best of each row of a block of search scores, exactly, without sorting
// the row (search.py sorted every block's scores whole: +8% on 1 query x 1M documents and 1 ms
// on 10k). One block a row:
//
//   1. a radix select over order keys (4 passes of 8 bits, a histogram each) finds the k-th
//      best key T and how many of the keys equal to T make up the k;
//   2. one pass in index order writes the indices of the keys above T and of the first of
//      those equal to T (the lowest indices: search's ties), in index order.
//
// Order key of a score (larger: better): finite scores and +-inf by their float order, NaN
// below every one of them, an excluded document (allowed[i] == 0) below NaN; search.py then
// sorts the k chosen (a k-sized sort) by its order, which is the same. Deterministic: the
// histograms count with integer atomics, and the writing pass goes in index order with a
// block scan (no atomics). Requires k < n (the caller takes a whole row itself) and a block of
// TOPK_THREADS threads.

#define TOPK_THREADS 1024

__device__ __forceinline__ unsigned topk_key(float score, bool allowed) {
    if (!allowed) return 0u;
    const unsigned bits = __float_as_uint(score);
    if (score != score) return 1u;  // NaN
    // Sign flip for positives, all bits for negatives: unsigned order = float order (-inf
    // becomes 0x007fffff, above NaN's 1).
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Exclusive prefix sum of `flag` over the block in thread order, and the block's total.
__device__ __forceinline__ int topk_block_scan(int flag, int* warp_sums, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    const int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) warp_sums[warp] = __popc(ballot);
    __syncthreads();
    int before = 0;
    total = 0;
    for (int w = 0; w < TOPK_THREADS / 32; ++w) {
        const int count = warp_sums[w];
        before += w < warp ? count : 0;
        total += count;
    }
    __syncthreads();  // warp_sums is reused by the next call
    return before + before_in_warp;
}

// Row `blockIdx.x` of `scores` (n floats, `row_stride` apart): the indices of its k best, in
// increasing index order, to `chosen` (k int32 a row). `allowed`: n bytes, one row for all
// (an Index's live documents), or null.
__device__ __forceinline__ void topk_select(const float* scores, i64 row_stride, int n, int k,
                                            const unsigned char* allowed, int* chosen) {
    __shared__ int histogram[256];
    __shared__ int warp_sums[TOPK_THREADS / 32];
    __shared__ unsigned s_prefix;
    __shared__ int s_remaining;
    const float* row = scores + (i64)blockIdx.x * row_stride;
    auto key_at = [&](int i) { return topk_key(row[i], allowed == nullptr || allowed[i] != 0); };

    unsigned prefix = 0u, mask = 0u;
    int remaining = k;  // of the best keys still to place under the current prefix
#pragma unroll 1
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) histogram[b] = 0;
        __syncthreads();
        for (int start = 0; start < n; start += TOPK_THREADS) {  // (whole warps: the match below)
            const int i = start + threadIdx.x, lane = threadIdx.x & 31;
            const unsigned key = i < n ? key_at(i) : 0u;
            const bool counted = i < n && (key & mask) == prefix;
            // One atomic per digit a warp holds: the scores of a row mostly share their top
            // byte, and a shared-memory atomic per element on one address serialises.
            const unsigned digit = (key >> shift) & 0xffu;
            const unsigned peers = __match_any_sync(0xffffffffu, counted ? digit : 0x100u | lane);
            if (counted && lane == __ffs(peers) - 1) atomicAdd(&histogram[digit], __popc(peers));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            // The digit where the count from the top reaches `remaining`.
            int digit = 255, above = 0;
            for (; digit > 0 && above + histogram[digit] < remaining; --digit) above += histogram[digit];
            s_prefix = prefix | ((unsigned)digit << shift);
            s_remaining = remaining - above;
        }
        __syncthreads();
        prefix = s_prefix, remaining = s_remaining, mask |= 0xffu << shift;
        __syncthreads();  // histogram is cleared next pass
    }
    // prefix is the k-th best key T; `remaining` of the keys equal to T belong to the k.
    const unsigned threshold = prefix;
    int taken = 0, equal_seen = 0;
    int* out = chosen + (i64)blockIdx.x * k;
    for (int start = 0; start < n; start += TOPK_THREADS) {
        const int i = start + threadIdx.x;
        const unsigned key = i < n ? key_at(i) : 0u;
        const bool equal = i < n && key == threshold;
        int equal_total;
        const int equal_before = equal_seen + topk_block_scan(equal, warp_sums, equal_total);
        const bool take = i < n && (key > threshold || (equal && equal_before < remaining));
        int take_total;
        const int position = taken + topk_block_scan(take, warp_sums, take_total);
        if (take) out[position] = i;
        taken += take_total, equal_seen += equal_total;
    }
}

// THREADS: the block size _gpu/launch.top_k_indices launches with (TOPK_THREADS).
#define MAXSIM_TOPK_ENTRY(NAME, THREADS)                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const float* scores, i64 row_stride, int n, \
                                                               int k, const unsigned char* allowed,      \
                                                               int* chosen) {                            \
        topk_select(scores, row_stride, n, k, allowed, chosen);                                        \
    }
MAXSIM_TOPK_ENTRY(maxsim_topk_select, TOPK_THREADS)
