// maxsim_topk.cu: the k best of each row of a block of search scores, exactly, without sorting
// the row (search.py sorted every block's scores whole: +8% on 1 query x 1M documents, 1 ms at
// 10k). One block per (row, segment of the row):
//
//   1. a radix select over order keys (4 passes of 8 bits, a histogram each) finds the
//      segment's k-th best key T and how many of the keys equal to T make up the k;
//   2. one pass in index order writes the positions of the keys above T and of the first of
//      those equal to T (the lowest positions: search's ties), in increasing order, -1 past
//      the segment's own length when it holds k or fewer.
//
// A long row is cut into segments (a block each: one block reading a million scores is
// latency-bound), and the segments' candidates selected again by the same kernel
// (_gpu/launch.top_k_indices). Order key of an element (larger: better), by its class byte
// (`classes`, or every element live where null): live elements by their score's float order,
// NaN below every other score; then excluded (class 1), then padding (class 0) last. search.py
// sorts the k chosen (a k-sized sort) by the same order. Deterministic: the histograms count
// with integer atomics, and the writing pass goes in index order with block scans.

#define TOPK_THREADS 512
#define TOPK_ITEMS 8  // elements a thread loads at once: several loads in flight, not one

// Classes of an element (the `classes` bytes).
#define TOPK_PADDING 0
#define TOPK_EXCLUDED 1
#define TOPK_LIVE 2

__device__ __forceinline__ unsigned topk_key(float score, int klass) {
    if (klass != TOPK_LIVE) return (unsigned)klass;  // padding 0, excluded 1
    if (score != score) return 2u;                   // NaN
    // Sign flip for positives, all bits for negatives: unsigned order = float order (-inf
    // becomes 0x007fffff, above NaN's 2). -0.0 is 0.0 first: equal scores, one key (their tie
    // goes to the lower position, as in a sort of the floats).
    const unsigned bits = score == 0.f ? 0u : __float_as_uint(score);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Exclusive prefix sum of `flag` over the block in thread order, and the block's total.
__device__ __forceinline__ int topk_block_scan(bool flag, int* warp_sums, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
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
    return before + __popc(ballot & ((1u << lane) - 1u));
}

// Segment blockIdx.x of row blockIdx.y: elements [segment * segment_length, +segment_length)
// of `scores` (n floats a row, `row_stride` apart; `classes`: bytes, `class_stride` apart, 0:
// one row for all) -> the positions (within the row) of its k best, increasing, -1 padded, to
// chosen[(row * segments + segment) * k ...].
__device__ __forceinline__ void topk_select(const float* scores, i64 row_stride, int n, int k, int segment_length,
                                            const unsigned char* classes, i64 class_stride, int* chosen) {
    __shared__ int histogram[256];
    __shared__ int warp_sums[TOPK_THREADS / 32];
    __shared__ unsigned s_prefix;
    __shared__ int s_remaining;
    const int first = blockIdx.x * segment_length;
    const int length = min(segment_length, n - first);
    const float* row = scores + (i64)blockIdx.y * row_stride + first;
    const unsigned char* klass = classes == nullptr ? nullptr : classes + (i64)blockIdx.y * class_stride + first;
    int* out = chosen + ((i64)blockIdx.y * gridDim.x + blockIdx.x) * k;
    auto key_at = [&](int i) { return topk_key(row[i], klass == nullptr ? TOPK_LIVE : klass[i]); };
    constexpr int TILE = TOPK_THREADS * TOPK_ITEMS;

    if (length <= k) {  // the whole segment, then padding
        for (int i = threadIdx.x; i < k; i += TOPK_THREADS) out[i] = i < length ? first + i : -1;
        return;
    }
    unsigned prefix = 0u, mask = 0u;
    int remaining = k;  // of the best keys still to place under the current prefix
#pragma unroll 1
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) histogram[b] = 0;
        __syncthreads();
        for (int start = 0; start < length; start += TILE) {  // (whole warps: the match below)
            unsigned keys[TOPK_ITEMS];
#pragma unroll
            for (int j = 0; j < TOPK_ITEMS; ++j) {
                const int i = start + j * TOPK_THREADS + threadIdx.x;
                keys[j] = i < length ? key_at(i) : 0u;
            }
            const int lane = threadIdx.x & 31;
#pragma unroll
            for (int j = 0; j < TOPK_ITEMS; ++j) {
                const bool counted = start + j * TOPK_THREADS + (int)threadIdx.x < length && (keys[j] & mask) == prefix;
                // One atomic per digit a warp holds: a row's scores mostly share their top byte,
                // and a shared-memory atomic per element on one address serialises.
                const unsigned digit = (keys[j] >> shift) & 0xffu;
                const unsigned peers = __match_any_sync(0xffffffffu, counted ? digit : 0x100u | lane);
                if (counted && lane == __ffs(peers) - 1) atomicAdd(&histogram[digit], __popc(peers));
            }
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
        __syncthreads();  // the histogram is cleared next pass
    }
    // prefix is the k-th best key T; `remaining` of the keys equal to T belong to the k.
    const unsigned threshold = prefix;
    int taken = 0, equal_seen = 0;
    for (int start = 0; start < length; start += TILE) {
        unsigned keys[TOPK_ITEMS];
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; ++j) {
            const int i = start + j * TOPK_THREADS + threadIdx.x;
            keys[j] = i < length ? key_at(i) : 0u;
        }
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; ++j) {  // in index order
            const int i = start + j * TOPK_THREADS + threadIdx.x;
            const bool equal = i < length && keys[j] == threshold;
            int equal_total, take_total;
            const int equal_before = equal_seen + topk_block_scan(equal, warp_sums, equal_total);
            const bool take = i < length && (keys[j] > threshold || (equal && equal_before < remaining));
            const int position = taken + topk_block_scan(take, warp_sums, take_total);
            if (take) out[position] = first + i;
            taken += take_total, equal_seen += equal_total;
        }
    }
}

// THREADS: the block size _gpu/launch.top_k_indices launches with (TOPK_THREADS).
#define MAXSIM_TOPK_ENTRY(NAME, THREADS)                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        NAME(const float* scores, i64 row_stride, int n, int k, int segment_length,                  \
             const unsigned char* classes, i64 class_stride, int* chosen) {                          \
        topk_select(scores, row_stride, n, k, segment_length, classes, class_stride, chosen);        \
    }
MAXSIM_TOPK_ENTRY(maxsim_topk_select, TOPK_THREADS)
