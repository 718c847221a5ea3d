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
// latency-bound), and the segments' candidates selected again by the same kernel, reading
// them through their positions (cupy_maxsim/_topk.py: the rounds). Order key of an element
// (larger: better), by its class: live elements by their score's float order, NaN below
// every other score; then excluded (class 1), then padding (class 0) last. search.py
// sorts the k chosen (a k-sized sort) by the same order. Deterministic: the histograms count
// with integer atomics, and the writing pass goes in index order with block scans.

#define TOPK_THREADS 512
#define TOPK_ITEMS 8  // elements a thread loads at once: several loads in flight, not one
// Keys a block keeps in shared memory (dynamic, 4 bytes each: 64 KB): the first pass reads the
// scores (through their positions, in rounds after the first) and computes the keys, the other
// passes read them back from shared memory, not from global memory at its latency (each pass
// over a 16k segment cost ~15 us, ncu 2026-12-01). Keys past it are read again.
#define TOPK_CACHED_KEYS 16384
// The most positions the last round can rank in the kernel (8 bytes each in the keys' room).
#define TOPK_RANKED_MAX (TOPK_CACHED_KEYS / 2)

// Classes of an element (cupy_maxsim/_topk.py: PADDING, EXCLUDED, LIVE).
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

// The order key of position `at` of a row (`allowed`: a byte a position, 0 excluded; null: all live).
__device__ __forceinline__ unsigned topk_key_at(const float* row, const unsigned char* allowed, int at) {
    return topk_key(row[at], allowed == nullptr || allowed[at] ? TOPK_LIVE : TOPK_EXCLUDED);
}

// Exclusive prefix sum of `value` over the block in thread order, and the block's total.
__device__ __forceinline__ int topk_block_sum_scan(int value, int* warp_sums, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int inclusive = warp_inclusive_sum(value, lane);
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    int before = 0;
    total = 0;
#pragma unroll
    for (int w = 0; w < TOPK_THREADS / 32; ++w) {
        const int sum = warp_sums[w];
        before += w < warp ? sum : 0;
        total += sum;
    }
    __syncthreads();  // warp_sums is reused by the next call
    return before + inclusive - value;
}

// Counts `key`'s digit at `shift` into the shared `histogram` where `counted` (the whole warp
// calls it: a vote). A row's scores mostly share their top byte, and a shared-memory atomic per
// element on one address serialises. (Past the first passes most warps count none: no vote for
// them.)
__device__ __forceinline__ void topk_count_digit(unsigned key, bool counted, int shift, int* histogram) {
    const unsigned counting = __ballot_sync(0xffffffffu, counted);
    if (!counting) return;
    const unsigned digit = (key >> shift) & 0xffu;
    // The common case, one digit for the whole warp, by a shuffle and a vote; else an atomic an
    // element (a row's digits past the top byte spread: few lanes share an address). A match.any
    // for every element took 1.01-1.27x as long (the selection of 1 x 1M, k=10 to 2048;
    // ab-topk-2026-12-02-689500f).
    const int leader = __ffs(counting) - 1;
    const unsigned first_digit = __shfl_sync(0xffffffffu, digit, leader);
    if (__all_sync(0xffffffffu, !counted || digit == first_digit)) {
        if ((int)(threadIdx.x & 31) == leader) atomicAdd(&histogram[first_digit], __popc(counting));
    } else if (counted) {
        atomicAdd(&histogram[digit], 1);
    }
}

// Warp 0: the digit where the histogram's count from the top (digit 255 down) reaches
// `remaining`, and what remains of it there; each lane sums 8 digits, a warp scan finds the
// lane (thread 0 walking 256 digits was ~5 us a pass).
__device__ __forceinline__ void topk_find_digit(const int* histogram, unsigned prefix, int shift, int remaining,
                                                unsigned& s_prefix, int& s_remaining) {
    const int lane = threadIdx.x;
    int counts[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) sum += counts[j] = histogram[255 - lane * 8 - j];
    const int inclusive = warp_inclusive_sum(sum, lane);
    const int exclusive = inclusive - sum;
    // (the counted keys are never fewer than `remaining`; were they, digit 0, as a walk ends)
    if ((exclusive < remaining && remaining <= inclusive) || (lane == 31 && inclusive < remaining)) {
        int digit = 255 - lane * 8, above = exclusive;
#pragma unroll
        for (int j = 0; j < 7; ++j) {
            if (above + counts[j] >= remaining) break;
            above += counts[j];
            --digit;
        }
        s_prefix = prefix | ((unsigned)digit << shift);
        s_remaining = remaining - above;
    }
}

// The k positions this block wrote to out[0..k) (its row's k best: the last round), put in rank
// order: key descending, then position ascending (search's order), padding (-1) last; a
// bitonic sort of (~key, position) pairs in `slots` (shared, TOPK_RANKED_MAX of them: the
// cached keys' room, done with by now). So search sorts nothing after the kernel: CuPy's
// argsort (thrust) waits for the stream, and the small operations after it then each cost
// their host time in full (the score kernel no longer hides them).
__device__ __forceinline__ void topk_rank(int* out, int k, const float* row, const unsigned char* allowed,
                                          unsigned long long* slots) {
    __syncthreads();  // every position written, every cached key read
    int width = 1;
    while (width < k) width <<= 1;
    for (int i = threadIdx.x; i < width; i += TOPK_THREADS) {
        unsigned long long slot = ~0ull;  // past k: after everything
        if (i < k) {
            const int at = out[i];
            const unsigned key = at < 0 ? (unsigned)TOPK_PADDING : topk_key_at(row, allowed, at);
            slot = ((unsigned long long)~key << 32) | (unsigned)at;
        }
        slots[i] = slot;
    }
    __syncthreads();
    for (int size = 2; size <= width; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < width / 2; i += TOPK_THREADS) {
                const int low = 2 * i - (i & (stride - 1)), high = low + stride;
                const unsigned long long a = slots[low], b = slots[high];
                if ((a > b) == ((low & size) == 0)) slots[low] = b, slots[high] = a;
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS) out[i] = (int)(unsigned)slots[i];
}

// Segment blockIdx.x of row blockIdx.y of this round's elements: the row's first n scores
// (`scores`, rows `row_stride` apart) or, where `positions` is given, the n elements at
// positions[row * n + i] of the row (the candidates of the round before; -1: padding). Each
// element's class: padding where its position is -1, else excluded where `allowed` (a byte a
// position, shared by the rows; null: all) is 0, else live. -> the row positions of the
// segment's k best, in the order of the elements (in rank order where `ranked`: the last round,
// one segment a row, k at most TOPK_RANKED_MAX), -1 padded, to
// chosen[(row * segments + segment) * k ...]. (Gathering here, not in CuPy, keeps a round one
// launch: the gathers and class arrays between rounds were seven small kernels a round.)
__device__ __forceinline__ void topk_select(const float* scores, i64 row_stride, int n, int k, int segment_length,
                                            const unsigned char* allowed, const int* positions, int* chosen,
                                            int ranked) {
    __shared__ int histogram[256];
    __shared__ int warp_sums[TOPK_THREADS / 32];
    __shared__ unsigned s_prefix;
    __shared__ int s_remaining;
    extern __shared__ unsigned cached_keys[];  // TOPK_CACHED_KEYS
    const int first = blockIdx.x * segment_length;
    const int length = min(segment_length, n - first);
    const float* row = scores + (i64)blockIdx.y * row_stride;
    const int* candidates = positions == nullptr ? nullptr : positions + (i64)blockIdx.y * n + first;
    int* out = chosen + ((i64)blockIdx.y * gridDim.x + blockIdx.x) * k;
    auto position_at = [=](int i) { return candidates == nullptr ? first + i : candidates[i]; };
    auto key_at = [=](int i) {
        const int at = position_at(i);
        return at < 0 ? (unsigned)TOPK_PADDING : topk_key_at(row, allowed, at);
    };
    const int cached = min(length, TOPK_CACHED_KEYS);
    // Element i's key in a pass after the first (which stored it): from shared memory.
    auto cached_key_at = [=](int i) { return i < cached ? cached_keys[i] : key_at(i); };
    constexpr int TILE = TOPK_THREADS * TOPK_ITEMS;

    if (length <= k) {  // the whole segment, then padding
        for (int i = threadIdx.x; i < k; i += TOPK_THREADS) out[i] = i < length ? position_at(i) : -1;
        if (ranked) topk_rank(out, k, row, allowed, reinterpret_cast<unsigned long long*>(cached_keys));
        return;
    }
    unsigned prefix = 0u, mask = 0u;
    int remaining = k;  // of the best keys still to place under the current prefix
#pragma unroll 1
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) histogram[b] = 0;
        __syncthreads();
        for (int start = 0; start < length; start += TILE) {  // (whole warps: the vote below)
            unsigned keys[TOPK_ITEMS];
#pragma unroll
            for (int j = 0; j < TOPK_ITEMS; ++j) {
                const int i = start + j * TOPK_THREADS + threadIdx.x;
                keys[j] = i >= length ? 0u : shift != 24 ? cached_key_at(i) : key_at(i);
                if (shift == 24 && i < cached) cached_keys[i] = keys[j];
            }
#pragma unroll
            for (int j = 0; j < TOPK_ITEMS; ++j) {
                const bool counted = start + j * TOPK_THREADS + (int)threadIdx.x < length && (keys[j] & mask) == prefix;
                topk_count_digit(keys[j], counted, shift, histogram);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) topk_find_digit(histogram, prefix, shift, remaining, s_prefix, s_remaining);
        __syncthreads();
        prefix = s_prefix, remaining = s_remaining, mask |= 0xffu << shift;
        __syncthreads();  // the histogram is cleared next pass
    }
    // prefix is the k-th best key T; `remaining` of the keys equal to T belong to the k. The
    // writing pass: each thread owns TOPK_ITEMS consecutive elements of a tile, so one block
    // scan of its (above T, equal to T) counts gives every element's place; element i goes to
    // (keys above T before i) + min(keys equal to T before i, remaining) (a scan per element
    // was 0.1 ms of a 16k segment's 0.11, ncu 2026-12-01).
    const unsigned threshold = prefix;
    int above_seen = 0, equal_seen = 0;
    for (int start = 0; start < length; start += TILE) {
        const int base = start + (int)threadIdx.x * TOPK_ITEMS;
        unsigned above_bits = 0u, equal_bits = 0u;  // a bit an element: above T, equal to T
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; ++j) {
            if (base + j < length) {  // (past the segment: neither)
                const unsigned key = cached_key_at(base + j);
                above_bits |= (unsigned)(key > threshold) << j;
                equal_bits |= (unsigned)(key == threshold) << j;
            }
        }
        const int above = __popc(above_bits), equal = __popc(equal_bits);
        int total;  // counts of at most TILE: above in the low 16 bits, equal in the high
        const int before = topk_block_sum_scan((equal << 16) | above, warp_sums, total);
        int above_before = above_seen + (before & 0xffff), equal_before = equal_seen + (before >> 16);
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; ++j) {
            const bool is_above = (above_bits >> j) & 1u, is_equal = (equal_bits >> j) & 1u;
            if (is_above || (is_equal && equal_before < remaining))
                out[above_before + min(equal_before, remaining)] = position_at(base + j);
            above_before += is_above, equal_before += is_equal;
        }
        above_seen += total & 0xffff, equal_seen += total >> 16;
    }
    if (ranked) topk_rank(out, k, row, allowed, reinterpret_cast<unsigned long long*>(cached_keys));
}

// THREADS: the block size _gpu/launch.top_k_indices launches with (TOPK_THREADS).
#define MAXSIM_TOPK_ENTRY(NAME, THREADS)                                                             \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        NAME(const float* scores, i64 row_stride, int n, int k, int segment_length,                  \
             const unsigned char* allowed, const int* positions, int* chosen, int ranked) {          \
        topk_select(scores, row_stride, n, k, segment_length, allowed, positions, chosen, ranked);   \
    }
MAXSIM_TOPK_ENTRY(maxsim_topk_select, TOPK_THREADS)

// ---- The wide selection: one row's k best by every block of the GPU at once ----
//
// The rounds above read a long row in segments of at least 4k elements, one block each, and
// select the segments' candidates again: at 1 x 1M, k=1000, three rounds of 62, 4 and 1 blocks,
// 134 us (ncu-search-int8-2026-12-04-72f1b5e), the later rounds latency-bound on a block or
// four. Here the same radix select runs over the whole row at once, a chunk of TOPK_WIDE_CHUNK
// elements a block (or several, where the row has more chunks than the grid has blocks), in one
// cooperative launch (every block resident: _gpu/launch.top_k_wide) with a grid barrier after
// each step: each pass's blocks add their digit counts to the row's histogram of that pass in
// global memory (integer atomics: deterministic), and every block then reads it to extend the
// prefix; then the k positions are written (those above the k-th best key T in any order,
// through a counter; those equal to T, the lowest positions first, through the counts of T of
// the chunks before, which the last pass kept) and ranked by counting. 30-37 us at 1M under ncu,
// where seven launches (a pass each, at 2228bf3) took 45-60 (ab-search-wide-2026-12-04-70042d4).
#define TOPK_WIDE_CHUNK (TOPK_THREADS * TOPK_ITEMS)
#define TOPK_WIDE_PASSES 4
// A row's state, ints: each pass's histogram, the counter of positions above T, then each
// chunk's histogram of the last pass; after the rows' states, the grid barrier's count. Zero
// before the launch (but the chunks' histograms).
#define TOPK_WIDE_HEAD (TOPK_WIDE_PASSES * 256 + 1)
#define TOPK_WIDE_COUNTER (TOPK_WIDE_PASSES * 256)

// Every block of the grid reaches the `round`th barrier (from 1) before any goes on; what a
// block wrote before it is visible after it (read with __ldcg: not from a stale L1 line).
__device__ __forceinline__ void topk_grid_sync(unsigned* arrived, unsigned round) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned target = round * gridDim.x * gridDim.y;
        __threadfence();
        atomicAdd(arrived, 1u);
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrived) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

// One chunk's keys, TOPK_ITEMS a thread: element j * TOPK_THREADS + thread (`strided`: the
// passes, coalesced) or thread * TOPK_ITEMS + j (the write: a thread's run in position order).
// Past the row: 0 (`valid` clear).
__device__ __forceinline__ void topk_chunk_keys(const float* row, const unsigned char* allowed, int n, int chunk,
                                                bool strided, unsigned (&keys)[TOPK_ITEMS], unsigned& valid) {
    valid = 0u;
#pragma unroll
    for (int j = 0; j < TOPK_ITEMS; ++j) {
        const int at = chunk * TOPK_WIDE_CHUNK + (strided ? j * TOPK_THREADS + (int)threadIdx.x
                                                          : (int)threadIdx.x * TOPK_ITEMS + j);
        keys[j] = at < n ? topk_key_at(row, allowed, at) : 0u;
        valid |= (unsigned)(at < n) << j;
    }
}

// The shared `histogram` added to global `counts` (nonzero bins only, atomically).
__device__ __forceinline__ void topk_flush_histogram(const int* histogram, int* counts) {
    for (int b = threadIdx.x; b < 256; b += TOPK_THREADS)
        if (histogram[b]) atomicAdd(&counts[b], histogram[b]);
}

// Row blockIdx.y's k best positions, ranked (key descending, then position ascending), into
// chosen[row * k ...]; candidates[row * k ...] is the k positions unranked (scratch). Dynamic
// shared memory: the row's (~key, position) pairs to rank, 8 bytes each (k at most TOPK_RANKED_MAX).
__device__ __forceinline__ void topk_wide(const float* scores, i64 row_stride, int n, int k,
                                          const unsigned char* allowed, int* state, int* candidates, int* chosen) {
    __shared__ int histogram[256];
    __shared__ int warp_sums[TOPK_THREADS / 32];
    __shared__ int counts[TOPK_THREADS / 32][32];
    __shared__ unsigned s_prefix;
    __shared__ int s_remaining;
    extern __shared__ unsigned long long pairs[];
    const int chunks = (n + TOPK_WIDE_CHUNK - 1) / TOPK_WIDE_CHUNK;
    const i64 row_ints = TOPK_WIDE_HEAD + 256 * (i64)chunks;
    int* row_state = state + (i64)blockIdx.y * row_ints;
    unsigned* arrived = reinterpret_cast<unsigned*>(state + gridDim.y * row_ints);
    const float* row = scores + (i64)blockIdx.y * row_stride;
    unsigned prefix = 0u, mask = 0u, keys[TOPK_ITEMS], valid;
    int remaining = k;

    // The passes: digit 3 - pass of the keys under the prefix so far.
    for (int pass = 0; pass < TOPK_WIDE_PASSES; ++pass) {
        const int shift = 24 - 8 * pass;
        const bool last = pass == TOPK_WIDE_PASSES - 1;  // (each chunk's own counts kept)
        for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) histogram[b] = 0;
        __syncthreads();
        for (int chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
            topk_chunk_keys(row, allowed, n, chunk, true, keys, valid);
#pragma unroll
            for (int j = 0; j < TOPK_ITEMS; ++j)
                topk_count_digit(keys[j], ((valid >> j) & 1u) && (keys[j] & mask) == prefix, shift, histogram);
            if (last) {
                __syncthreads();
                // (topk_flush_histogram's loop, keeping the chunk's counts: a `kept` argument to
                // it compiled to 121 more SASS lines in this kernel, NVRTC 13)
                for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) {
                    row_state[TOPK_WIDE_HEAD + chunk * 256 + b] = histogram[b];
                    if (histogram[b]) atomicAdd(&row_state[pass * 256 + b], histogram[b]);
                    histogram[b] = 0;
                }
                __syncthreads();
            }
        }
        if (!last) {
            __syncthreads();
            topk_flush_histogram(histogram, row_state + pass * 256);
        }
        topk_grid_sync(arrived, pass + 1);
        for (int b = threadIdx.x; b < 256; b += TOPK_THREADS) histogram[b] = __ldcg(&row_state[pass * 256 + b]);
        __syncthreads();
        if (threadIdx.x < 32) topk_find_digit(histogram, prefix, shift, remaining, s_prefix, s_remaining);
        __syncthreads();
        prefix = s_prefix, remaining = s_remaining, mask |= 0xffu << shift;
        __syncthreads();  // (s_prefix is written again next pass)
    }

    // The write: `remaining` of the keys equal to T (= prefix) belong to the k.
    const unsigned threshold = prefix;
    int* out = candidates + (i64)blockIdx.y * k;
    for (int chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
        int equal_chunks = 0;  // keys equal to T in the chunks before this one
        for (int c = threadIdx.x; c < chunk; c += TOPK_THREADS)
            equal_chunks += __ldcg(&row_state[TOPK_WIDE_HEAD + c * 256 + (threshold & 0xffu)]);
        int equal_before;
        topk_block_sum_scan(equal_chunks, warp_sums, equal_before);
        topk_chunk_keys(row, allowed, n, chunk, false, keys, valid);
        unsigned above_bits = 0u, equal_bits = 0u;
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; ++j) {
            above_bits |= (unsigned)(((valid >> j) & 1u) && keys[j] > threshold) << j;
            equal_bits |= (unsigned)(((valid >> j) & 1u) && keys[j] == threshold) << j;
        }
        // Above T: a slot range a warp from the counter (one atomic a warp).
        const int above = __popc(above_bits), lane = threadIdx.x & 31;
        const int inclusive = warp_inclusive_sum(above, lane);
        int warp_slot = 0;
        if (lane == 31 && inclusive) warp_slot = atomicAdd(&row_state[TOPK_WIDE_COUNTER], inclusive);
        int slot = __shfl_sync(0xffffffffu, warp_slot, 31) + inclusive - above;
        // Equal to T: in position order, after the chunks before.
        int unused;
        equal_before += topk_block_sum_scan(__popc(equal_bits), warp_sums, unused);
        const int base = chunk * TOPK_WIDE_CHUNK + (int)threadIdx.x * TOPK_ITEMS;
#pragma unroll
        for (int j = 0; j < TOPK_ITEMS; ++j) {
            if ((above_bits >> j) & 1u) out[slot++] = base + j;
            if ((equal_bits >> j) & 1u) {
                if (equal_before < remaining) out[k - remaining + equal_before] = base + j;
                ++equal_before;
            }
        }
    }
    topk_grid_sync(arrived, TOPK_WIDE_PASSES + 1);

    // The rank: 32 candidates at a time, each warp counting the pairs before them in a slice.
    const int groups = (k + 31) / 32;
    if ((int)blockIdx.x >= groups) return;
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS) {
        const int at = __ldcg(&out[i]);
        pairs[i] = ((unsigned long long)~topk_key_at(row, allowed, at) << 32) | (unsigned)at;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slice = (k + TOPK_THREADS / 32 - 1) / (TOPK_THREADS / 32), stop = min(k, (warp + 1) * slice);
    for (int group = blockIdx.x; group < groups; group += gridDim.x) {
        const int i = group * 32 + lane;
        const unsigned long long mine = i < k ? pairs[i] : 0ull;
        int before = 0;
        for (int j = warp * slice; j < stop; ++j) before += pairs[j] < mine;
        counts[warp][lane] = before;
        __syncthreads();
        if (warp == 0 && i < k) {
            int rank = 0;
#pragma unroll
            for (int w = 0; w < TOPK_THREADS / 32; ++w) rank += counts[w][lane];
            chosen[(i64)blockIdx.y * k + rank] = (int)(unsigned)mine;
        }
        __syncthreads();  // (counts is written again next group)
    }
}

// THREADS: the block size _gpu/launch.top_k_wide launches with (TOPK_THREADS), cooperatively. (Without
// the 1, ptxas kept it to 40 registers and spilled on sm_80.)
#define MAXSIM_TOPK_WIDE_ENTRY(NAME, THREADS)                                                        \
    extern "C" __global__ void __launch_bounds__(THREADS, 1)                                         \
        NAME(const float* scores, i64 row_stride, int n, int k, const unsigned char* allowed, int* state, \
             int* candidates, int* chosen) {                                                         \
        topk_wide(scores, row_stride, n, k, allowed, state, candidates, chosen);                      \
    }
MAXSIM_TOPK_WIDE_ENTRY(maxsim_topk_wide, TOPK_THREADS)

// Search's answer from the last round's ranked positions, in one launch (it was a dozen small
// CuPy operations, each compiled on a new machine's first search and each a launch): for row
// blockIdx.y and rank j, the score at position p = chosen[row * k + j] of the row, and the id
// of that document: ids[start + p] (an Index's own ids; null: start + p). Padding (p = -1) and
// excluded documents (`allowed`, a byte a position of this block, is 0) give -inf and -1.
__device__ __forceinline__ void topk_finish(const float* scores, i64 row_stride, const int* chosen, int k, i64 start,
                                            const unsigned char* allowed, const i64* ids, float* out_scores,
                                            i64* out_ids) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= k) return;
    const i64 at = (i64)blockIdx.y * k + j;
    const int p = chosen[at];
    const bool real = p >= 0 && (allowed == nullptr || allowed[p]);
    out_scores[at] = real ? scores[(i64)blockIdx.y * row_stride + p] : __int_as_float(0xff800000);  // -inf
    out_ids[at] = real ? (ids == nullptr ? start + p : ids[start + p]) : -1;
}

// THREADS: the block size _gpu/launch.top_k_finish launches with (TOPK_FINISH_THREADS).
#define TOPK_FINISH_THREADS 256
#define MAXSIM_TOPK_FINISH_ENTRY(NAME, THREADS)                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        NAME(const float* scores, i64 row_stride, const int* chosen, int k, i64 start,               \
             const unsigned char* allowed, const i64* ids, float* out_scores, i64* out_ids) {        \
        topk_finish(scores, row_stride, chosen, k, start, allowed, ids, out_scores, out_ids);        \
    }
MAXSIM_TOPK_FINISH_ENTRY(maxsim_topk_finish, TOPK_FINISH_THREADS)

// Two rows of candidates merged into their k best, without a sort (search.py sorted the
// concatenation with CuPy's argsort, which waits for the stream): for row blockIdx.x, lists A
// (ka, the best so far) and B (kb, the next block's), each already in search's order (a
// better order key first, ties in id order) and every id of A below every id of B, so that a
// tie goes to A. An element's rank in the merge is its place in its own list plus the
// elements of the other list before it (a binary search: B's strictly better ones for an
// element of A; A's better or equal ones for an element of B). order[row][rank] = its
// position in the concatenation (A then B), out_scores and out_ids its score and id, for the
// ranks below k (k at most ka + kb). Excluded candidates (id -1) take the excluded class's key:
// after every live one.
__device__ __forceinline__ unsigned topk_merge_key(const float* scores, const i64* ids, i64 at) {
    return topk_key(scores[at], ids[at] >= 0 ? TOPK_LIVE : TOPK_EXCLUDED);
}

__device__ __forceinline__ void topk_merge(const float* a_scores, const i64* a_ids, int ka, const float* b_scores,
                                           const i64* b_ids, int kb, int k, i64* order, float* out_scores,
                                           i64* out_ids) {
    const i64 row = blockIdx.x;
    const i64 a0 = row * ka, b0 = row * kb;
    for (int i = threadIdx.x; i < ka + kb; i += blockDim.x) {
        const bool in_a = i < ka;
        const unsigned key = in_a ? topk_merge_key(a_scores, a_ids, a0 + i) : topk_merge_key(b_scores, b_ids, b0 + i - ka);
        // The other list's elements before this one: the first of them that is not (a
        // binary search over a list in descending key order).
        const float* other_scores = in_a ? b_scores : a_scores;
        const i64* other_ids = in_a ? b_ids : a_ids;
        const i64 other0 = in_a ? b0 : a0;
        int low = 0, high = in_a ? kb : ka;
        while (low < high) {
            const int middle = (low + high) >> 1;
            const unsigned other = topk_merge_key(other_scores, other_ids, other0 + middle);
            if (in_a ? other > key : other >= key)
                low = middle + 1;
            else
                high = middle;
        }
        const int rank = (in_a ? i : i - ka) + low;
        if (rank < k) {
            const i64 at = row * k + rank;
            order[at] = i;
            out_scores[at] = in_a ? a_scores[a0 + i] : b_scores[b0 + i - ka];
            out_ids[at] = in_a ? a_ids[a0 + i] : b_ids[b0 + i - ka];
        }
    }
}

// THREADS: the block size _gpu/launch.top_k_merge launches with (TOPK_MERGE_THREADS).
#define TOPK_MERGE_THREADS 256
#define MAXSIM_TOPK_MERGE_ENTRY(NAME, THREADS)                                                       \
    extern "C" __global__ void __launch_bounds__(THREADS)                                            \
        NAME(const float* a_scores, const i64* a_ids, int ka, const float* b_scores, const i64* b_ids, \
             int kb, int k, i64* order, float* out_scores, i64* out_ids) {                           \
        topk_merge(a_scores, a_ids, ka, b_scores, b_ids, kb, k, order, out_scores, out_ids);         \
    }
MAXSIM_TOPK_MERGE_ENTRY(maxsim_topk_merge, TOPK_MERGE_THREADS)
