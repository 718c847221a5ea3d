// maxsim_fwd.cu: fused MaxSim forward on tensor cores, sm_80 and later: mma.sync m16n8k16 for
// fp16 / bf16 (fp32 accumulate), m16n8k32 for int8 x int8 (int32 accumulate, per-token
// scales: the document scale applied per row before the max, the query scale after it) and
// three m16n8k8 TF32 steps for fp32 at fp32 accuracy (3xTF32, common.cuh's Mma16816<float>).
//
//   out[q, n] = sum over real query tokens i of  max over real doc tokens j of  <q_i, d_nj>
//
// The [queries x docs x Lq x Ld] similarity tensor never leaves registers.
//
// Mapping. Document tokens sit on the MMA M dimension, query tokens on N. A block owns a
// group of whole queries, stacked into BN = WARPS_N * 8 * NT columns (query g, token i is
// column g * Lq + i), kept resident in shared memory for the block's lifetime, and a
// contiguous range of documents (grid.x) which it streams through a STAGES-deep cp.async
// ring of BM-row tiles (BM = WARPS_M * 16 * MT). One document tile in shared memory thus
// serves every stacked query. Warp (wm, wn) computes rows [wm*16*MT, +16*MT) x columns
// [wn*8*NT, +8*NT) of each tile over the whole padded dim (KSTEPS * 16) and folds the result
// element-wise into a running max held in registers; lanes and warps are reduced once per
// document, not once per tile. grid.y enumerates query groups. In pairs mode (score_pairs)
// block n scores query n against document n only.
//
// Masks. A masked or out-of-range document row is never read: cp.async zero-fills it and
// the row gets a -FLT_MAX bias, so it can never win the max (padding is not 0); a tile with
// no masked or padding row skips the bias. A masked query token is zero-filled and left out
// of the sum. A document with no real token scores -inf. Non-finite policy: a real token
// holding NaN or +-inf makes the score NaN. A non-finite document element makes its row's
// similarity with every column non-finite (x * inf and 0 * inf alike), so one column per row,
// summed per document, finds it (2 adds per 16-row tile instead of a running min per
// element); a non-finite query element is found once, when the query block lands; the max
// itself (NaN propagates, +-inf checked) covers the rest.
//
// Argmax (MAXSIM_ARGMAX=1, training): each running max carries the index of its row; ties go
// to the lowest document-token index (strict > within a thread, which meets rows in
// increasing order; explicit index comparison across lanes and warps). The index is written
// per (query, doc, query token), -1 for a masked query token or a document with no real token.
//
// Shared memory (dynamic, bytes): 2 * LDS * (BN + STAGES * BM) for the query block and the
// tile ring (streaming k: STAGES query blocks, and 8 * BN for sColSrc), plus 4 * (2 * STAGES * BM + (2 + 2 * ARGMAX) * WARPS_M * BN + 3 * BN + 4 * WARPS)
// for row biases and scales, the cross-warp max (and argmax) of two documents in flight, the
// per-column query index, scale and non-finite flag, and per-warp document flags; _plan/configs.py
// mirrors this formula. Rows and k-steps are counted in
// 16-bit units: a k-step is 32 bytes (16 fp16 or 32 int8 elements).
//
// Streamed k (MAXSIM_STREAM_K=1, dims past a resident query block: fat embeddings): each ring
// slot holds KSTEPS k-steps of a document tile and of the query block, a step is one (tile,
// k chunk), the accumulators carry over a tile's chunks and the fold runs after its last. The
// query block's columns are set up once (sColSrc: where each column's row starts, -1 for a
// column that is zero-filled), its non-finite tokens found by one pass over global memory.
//
// Any dim and alignment: a row's chunks past dim are zero-filled (a tail chunk partly), and
// rows are copied in pieces of LOAD_BYTES, the alignment of every row start (codecs.cuh); but
// where the planner asks (SHIFTED_ROWS: 16-bit rows on 4 bytes, fp16 dim 130's 260-byte rows)
// document rows come in whole 16-byte chunks from the 16 bytes the row starts in: the row
// lands in shared memory as far past its row's start as it lies past 16 bytes (its shift, kept
// per row in sShift), and its A fragments are read a word at a time from there. One query at
// fp16 dim 130: 3.35 -> 2.48 ms against 4 GB; rows on 8 bytes gained nothing (fp16 dim 100)
// or lost (fp32 dim 130: 4.76 -> 6.80 ms): bench/results/cliffs-2026-12-04-f2e636a-shifted-ab.txt.
//
// Preconditions (checked in Python): dim at most KSTEPS k-steps (any dim streaming k); int8
// scales non-negative (quantize_int8 makes them so); every row start LOAD_BYTES-aligned (base
// pointers, doc and row strides); below 4, dim's bytes a multiple of LOAD_BYTES too; query
// length <= BN; pairs mode uses docs_per_block == 1.

#ifndef MAXSIM_WARPS_M
#define MAXSIM_WARPS_M 4
#endif
#ifndef MAXSIM_WARPS_N
#define MAXSIM_WARPS_N 1
#endif
#ifndef MAXSIM_MT
#define MAXSIM_MT 1
#endif
#ifndef MAXSIM_NT
#define MAXSIM_NT 4
#endif
#ifndef MAXSIM_STAGES
#define MAXSIM_STAGES 4
#endif
#ifndef MAXSIM_KSTEPS
#define MAXSIM_KSTEPS 8
#endif
#ifndef MAXSIM_B_IN_REGISTERS
#define MAXSIM_B_IN_REGISTERS 1
#endif
#ifndef MAXSIM_ARGMAX
#define MAXSIM_ARGMAX 0
#endif
#ifndef MAXSIM_STREAM_K
#define MAXSIM_STREAM_K 0
#endif
#ifndef MAXSIM_SHIFTED_ROWS
#define MAXSIM_SHIFTED_ROWS 0
#endif
#ifndef MAXSIM_MIN_BLOCKS
#define MAXSIM_MIN_BLOCKS 1
#endif

namespace fwd {
constexpr int WARPS_M = MAXSIM_WARPS_M, WARPS_N = MAXSIM_WARPS_N;
constexpr int MT = MAXSIM_MT, NT = MAXSIM_NT, STAGES = MAXSIM_STAGES, KSTEPS = MAXSIM_KSTEPS;
constexpr bool ARGMAX = MAXSIM_ARGMAX != 0;
constexpr bool STREAM_K = MAXSIM_STREAM_K != 0;
constexpr int Q_TILES = STREAM_K ? STAGES : 1;  // query blocks in shared memory
constexpr int WARPS = WARPS_M * WARPS_N, THREADS = 32 * WARPS;
constexpr int BM = WARPS_M * 16 * MT;
constexpr int BN = WARPS_N * 8 * NT;
constexpr int KPAD = KSTEPS * 16;
// +8 elements (16 bytes) per row: the 8 rows an ldmatrix reads land on distinct banks.
constexpr int LDS = KPAD + 8;
constexpr int CHUNKS = KPAD / 8;  // 16-byte chunks per row
// Shifted rows (on 4 or 8 bytes): whole 16-byte chunks, one more than CHUNKS a row (its shift
// pushes the row's last bytes into the row's padding: LDS's +8 elements).
constexpr bool SHIFTED_ROWS = MAXSIM_SHIFTED_ROWS != 0;
static_assert(!SHIFTED_ROWS || LOAD_BYTES == 4 || LOAD_BYTES == 8, "shifted rows are rows on 4 or 8 bytes");
constexpr int ROW_CHUNKS = CHUNKS + (SHIFTED_ROWS ? 1 : 0);
static_assert(NT % 2 == 0, "NT must be even: B fragments are loaded two n-tiles at a time");
static_assert(STAGES >= 2, "the cp.async ring needs at least two stages");
// Query (B) fragments stay in registers when they fit in 64 of them; else re-read per k-step.
// fp32's count twice: ptxas keeps their TF32 halves (Mma16816<float>) in registers too
// (measured in the compile report: 56 bytes spilled at 8 k-steps when counted once).
template <typename T> __host__ __device__ constexpr bool b_in_registers() {
    return MAXSIM_B_IN_REGISTERS && !STREAM_K && KSTEPS * NT * 2 * (Codec<T>::BITS == 32 ? 2 : 1) <= 64;
}
// The k (bytes) an int8 accumulator sums, for its exact conversion (accumulator_to_float):
// unbounded streaming k.
constexpr int ACC_K = STREAM_K ? (1 << 30) : KSTEPS * 32;
// Dynamic shared memory the kernel needs (the formula in the header comment; carve_shared lays
// it out). _plan.configs.MmaConfig.shared_bytes mirrors it: the compile checks build every
// variant with the Python value as MAXSIM_EXPECT_SHARED_BYTES.
constexpr int SHARED_BYTES = 2 * LDS * (Q_TILES * BN + STAGES * BM) + (STREAM_K ? 8 * BN : 0) +
                             4 * (2 * STAGES * BM + (2 + 2 * ARGMAX) * WARPS_M * BN + 3 * BN + 4 * WARPS) +
                             (SHIFTED_ROWS ? 4 * STAGES * BM : 0);
#ifdef MAXSIM_EXPECT_SHARED_BYTES
static_assert(SHARED_BYTES == MAXSIM_EXPECT_SHARED_BYTES, "_plan.configs.MmaConfig.shared_bytes disagrees");
#endif
}  // namespace fwd

// Where lane `lane` points ldmatrix.x4 for the B fragments of n-tiles 2*np and 2*np+1 of warp
// column block warp_n at k-step ks: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
// (n 8-15, k 8-15) give b0, b1 of the first n-tile and b0, b1 of the second.
__device__ __forceinline__ const u16* b_fragment_address(const u16* sQ, int warp_n, int np, int ks,
                                                         int lane) {
    using namespace fwd;
    return sQ + (warp_n * 8 * NT + np * 16 + (lane >> 4) * 8 + (lane & 7)) * LDS + ks * 16 +
           ((lane >> 3) & 1) * 8;
}

namespace fwd {
// The block's shared memory, as the header comment lays it out.
struct Shared {
    u16* sQ;          // [Q_TILES][BN][LDS]: the query block (streaming k: one per ring slot)
    u16* sD;          // [STAGES][BM][LDS]: the document tile ring
    i64* sColSrc;     // streaming k: [BN] the column's row in q (elements), -1: zero-filled
    float* sBias;     // [STAGES][BM]: 0 for a real row, -FLT_MAX for padding and masked rows
    float* sScale;    // int8: [STAGES][BM] per-row document scale
    float* sColScale; // int8: [BN] per-column query scale
    float* sRedMax;   // [2 parities][WARPS_M][BN]: a document's maxima per warp row
    int* sColQuery;   // [BN]: the column's query in the group, -1 if none
    int* sColBad;     // [BN]: the query token holds NaN or inf
    int* sHasRow;     // [2 parities][WARPS]
    int* sDocBad;     // [2 parities][WARPS]: a real row is not finite
    int* sRedArg;     // ARGMAX: [2 parities][WARPS_M][BN]
    int* sShift;      // SHIFTED_ROWS: [STAGES][BM] bytes a tile row lies past its line's start
};
__device__ __forceinline__ Shared carve_shared(unsigned char* smem) {
    Shared S;
    S.sQ = (u16*)smem;
    S.sD = S.sQ + Q_TILES * BN * LDS;
    S.sColSrc = (i64*)(S.sD + STAGES * BM * LDS);  // rows are 16-byte multiples: aligned
    S.sBias = (float*)(S.sColSrc + (STREAM_K ? BN : 0));
    S.sScale = S.sBias + STAGES * BM;
    S.sColScale = S.sScale + STAGES * BM;
    S.sRedMax = S.sColScale + BN;
    S.sColQuery = (int*)(S.sRedMax + 2 * WARPS_M * BN);
    S.sColBad = S.sColQuery + BN;
    S.sHasRow = S.sColBad + BN;
    S.sDocBad = S.sHasRow + 2 * WARPS;
    S.sRedArg = S.sDocBad + 2 * WARPS;
    S.sShift = S.sRedArg + (ARGMAX ? 2 * WARPS_M * BN : 0);
    return S;
}

// The producer side of the ring: which (document, tile) the next load fetches, and the load.
// Every document has at least one tile, so an empty document still reaches the epilogue and
// scores -inf. Each thread always copies the same 16-byte column chunk of rows my_row,
// my_row + ROW_STEP, ...: the per-row work is an add and a compare, not a division and a 64-bit
// multiply. Chunk slots are a power of two (KSTEPS = 6 has 12 chunks: 16 slots, 4 idle).
constexpr int CHUNK_SLOTS = ROW_CHUNKS <= 4 ? 4 : ROW_CHUNKS <= 8 ? 8 : ROW_CHUNKS <= 16 ? 16 : ROW_CHUNKS <= 32 ? 32 : 64;
constexpr int ROW_STEP = THREADS / CHUNK_SLOTS;
static_assert(THREADS % CHUNK_SLOTS == 0 && BM % ROW_STEP == 0 && BN % ROW_STEP == 0, "tile rows must split evenly");
// k chunks per row: 1, or streaming k, KSTEPS k-steps each over the whole dim.
template <typename T> __device__ __forceinline__ int k_chunks(int dim) {
    constexpr int ELEMS = CHUNKS * Codec<T>::CHUNK_ELEMS;
    return STREAM_K ? (dim + ELEMS - 1) / ELEMS : 1;
}
// Streaming k, the loader walks (document, tile, k chunk) and copies the query block's chunk
// into the same slot.
template <typename T> struct TileLoader {
    DocLayout layout;
    i64 doc, doc_end, base, length, first_token;
    int tile, tiles, my_chunk, my_row, my_chunk_bytes, kc, kchunks;

    __device__ __forceinline__ TileLoader(const ForwardArgs& args, const DocLayout& layout_, i64 doc_begin, i64 end,
                                          int tid)
        : layout(layout_), doc(doc_begin), doc_end(end), tile(0), kc(0) {
        doc_extent(layout, doc, base, length, first_token);
        tiles = max(1, (int)((length + BM - 1) / BM));
        my_chunk = tid % CHUNK_SLOTS, my_row = tid / CHUNK_SLOTS;
        kchunks = k_chunks<T>(args.dim);
        set_chunk_bytes(args);
    }
    __device__ __forceinline__ void set_chunk_bytes(const ForwardArgs& args) {
        my_chunk_bytes = chunk_bytes<T>(args.dim, (kc * CHUNKS + my_chunk) * Codec<T>::CHUNK_ELEMS);
    }
    __device__ __forceinline__ void advance(const ForwardArgs& args) {
        if constexpr (STREAM_K) {
            kc = kc + 1 == kchunks ? 0 : kc + 1;
            set_chunk_bytes(args);
            if (kc != 0) return;
        }
        if (++tile == tiles) {
            tile = 0;
            if (++doc < doc_end) {
                doc_extent(layout, doc, base, length, first_token);
                tiles = max(1, (int)((length + BM - 1) / BM));
            }
        }
    }
    // The next tile into ring slot `stage` (cp.async; rows past the document or masked are
    // zero-filled and biased).
    __device__ __forceinline__ void issue(const ForwardArgs& args, const Shared& S, int stage) {
        constexpr int ELEMS = Codec<T>::CHUNK_ELEMS;
        const T* __restrict__ d = (const T*)args.d;
        if (doc >= doc_end || my_chunk >= ROW_CHUNKS) {
            if (doc < doc_end) advance(args);
            return;
        }
        const int element = (kc * CHUNKS + my_chunk) * ELEMS;  // of the row, this thread's chunk
        if (STREAM_K && my_chunk < CHUNKS) {
            const T* q = (const T*)args.q;
            u16* q_dst = S.sQ + stage * BN * LDS + my_row * LDS + my_chunk * 8;
#pragma unroll
            for (int col = my_row; col < BN; col += ROW_STEP, q_dst += ROW_STEP * LDS) {
                const i64 start = S.sColSrc[col];
                const int bytes = start >= 0 ? my_chunk_bytes : 0;
                copy_chunk<LOAD_BYTES>(q_dst, bytes ? (const void*)(q + start + element) : (const void*)q, bytes);
            }
        }
        u16* dst = S.sD + stage * BM * LDS + my_row * LDS + my_chunk * 8;
        i64 row = (i64)tile * BM + my_row;
        const T* src = d + base + row * args.d_row_stride + element;
        // Scale of this document's row 0 (padded: by doc; packed: by token index).
        const i64 scale_base = args.offsets == nullptr ? doc * args.d_scale_doc_stride
                                                       : first_token * args.d_scale_row_stride;
        const i64 src_step = ROW_STEP * args.d_row_stride;
#pragma unroll
        for (int r = my_row; r < BM; r += ROW_STEP) {
            bool real = row < length;
            if (real && args.d_mask != nullptr)
                real = args.d_mask[doc * args.d_mask_doc_stride + row * args.d_mask_row_stride] != 0;
            int shift = 0;
            if constexpr (SHIFTED_ROWS) {  // this thread's chunk of the 16-byte lines the row's k chunk spans
                const unsigned char* start = (const unsigned char*)(src - element);
                shift = (int)((size_t)start & 15);
                const unsigned char* line = start - shift + kc * KPAD * 2 + my_chunk * 16;
                const long long left = start + (i64)args.dim * (Codec<T>::BITS / 8) - line;  // the row's bytes from it on
                const int bytes = real ? (int)min(max(left, 0ll), 16ll) : 0;
                // (the first line's bytes before the row: the row before it, in d's allocation,
                // which starts on 16 bytes; they land before the row's first element, unread).
                // A row's cut last line comes in pieces: a 16-byte copy of fewer source bytes
                // still addresses the whole line, past the end of d's allocation for its last
                // row (memcheck: bench/sanitize_forward.py, fp16 rows on 4 bytes).
                if (bytes == 16) cp_async_16(dst, line, 16);
                else copy_chunk<LOAD_BYTES>(dst, bytes ? (const void*)line : (const void*)d, bytes);
            } else {
                const int bytes = real ? my_chunk_bytes : 0;
                copy_chunk<LOAD_BYTES>(dst, bytes ? (const void*)src : (const void*)d, bytes);
            }
            if (my_chunk == 0) {
                if constexpr (SHIFTED_ROWS) S.sShift[stage * BM + r] = real ? shift : 0;
                S.sBias[stage * BM + r] = real ? 0.f : -MAXSIM_FLT_MAX;
                // Asynchronous like the tile itself: a plain load here would stall the producer
                // on every tile (measured: int8 ran slower than fp16). Masked rows get scale 0.
                if constexpr (Codec<T>::SCALED)
                    cp_async_4(S.sScale + stage * BM + r,
                               real ? (const void*)(args.d_scale + scale_base + row * args.d_scale_row_stride)
                                    : (const void*)args.d_scale,
                               real ? 4 : 0);
            }
            dst += ROW_STEP * LDS;
            src += src_step;
            row += ROW_STEP;
        }
        advance(args);
    }
};

// Streaming k: each column's query, scale and row in q, and whether the token holds NaN or
// inf, by one warp per column reading the row from global memory (a 16-byte chunk a lane,
// codecs.cuh's query_chunk_non_finite as the Hopper split group's: 16-bit pieces where rows are
// off 16 bytes; a bad token is zero-filled from then on, so that it stays a witness for
// non-finite documents). Ends with a barrier: the loader reads sColSrc.
template <typename T>
__device__ __forceinline__ void stream_query_columns(const ForwardArgs& args, const Shared& S, i64 first_query,
                                                     int group_size, int tid) {
    for (int col = tid; col < BN; col += THREADS) {
        const int g = col / args.query_length, token = col % args.query_length;
        const i64 query = first_query + g;
        bool real = g < group_size;
        if (real && args.q_mask != nullptr)
            real = args.q_mask[query * args.q_mask_query_stride + token * args.q_mask_row_stride] != 0;
        S.sColQuery[col] = real ? g : -1;
        if constexpr (Codec<T>::SCALED) S.sColScale[col] = real ? query_scale(args, query, token) : 0.f;
        S.sColSrc[col] = real ? query * args.q_query_stride + token * args.q_row_stride : -1;
    }
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    for (int col = warp; col < BN; col += WARPS) {
        bool bad = false;
        if constexpr (!Codec<T>::SCALED) {  // (int8 tokens are finite)
            if (S.sColSrc[col] >= 0)  // a lane a 16-byte chunk of the token
                for (int chunk = lane; chunk * Codec<T>::CHUNK_ELEMS < args.dim; chunk += 32)
                    bad |= query_chunk_non_finite<T, LOAD_BYTES>(args, first_query + col / args.query_length,
                                                                 col % args.query_length, chunk);
        }
        bad = __any_sync(0xffffffffu, bad);
        if (lane == 0) {
            S.sColBad[col] = bad;
            if (bad) S.sColSrc[col] = -1;
        }
    }
    __syncthreads();
}

// Query block -> shared memory, once (a cp.async group of its own, committed here).
template <typename T>
__device__ __forceinline__ void stage_queries(const ForwardArgs& args, const Shared& S, i64 first_query,
                                              int group_size, int tid) {
    if constexpr (STREAM_K) {
        stream_query_columns<T>(args, S, first_query, group_size, tid);
        cp_async_commit();  // empty: where the resident query block's group would be
        return;
    }
    for (int c = tid; c < BN * CHUNKS; c += THREADS) {
        const int col = c / CHUNKS, chunk = c % CHUNKS;
        const int g = col / args.query_length, token = col % args.query_length;
        const i64 query = first_query + g;
        const bool real = stage_query_chunk<T>(args, S.sQ + col * LDS + chunk * 8, query, token, chunk, g < group_size);
        if (chunk == 0) {
            S.sColQuery[col] = real ? g : -1;
            if constexpr (Codec<T>::SCALED) S.sColScale[col] = real ? query_scale(args, query, token) : 0.f;
        }
    }
    cp_async_commit();
}

// A finished document's per-column buffers as the epilogue asks them (epilogue.cuh's Tokens)
// for one query, whose token i is column `first + i`: the max over the warps' partial maxima.
struct FinishedColumns {
    const float* red_max;
    const int* red_arg;
    const int* sColQuery;
    const float* sColScale;
    const int* sColBad;
    int first;
    __device__ __forceinline__ bool real(int i) const { return sColQuery[first + i] >= 0; }
    __device__ __forceinline__ float max(int i, int& winner) const {
        float m = MAXSIM_NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS_M; ++w) {
            const float other = red_max[w * BN + first + i];
            if constexpr (ARGMAX) {
                const int other_arg = red_arg[w * BN + first + i];
                if (other > m || (other == m && (unsigned)other_arg < (unsigned)winner)) winner = other_arg;
            }
            m = max_nan(m, other);
        }
        return m;
    }
    __device__ __forceinline__ int winner(int, int found) const { return found; }
    __device__ __forceinline__ float scale(int i) const { return sColScale[first + i]; }
    __device__ __forceinline__ bool bad(int i) const { return sColBad[first + i] != 0; }
};

// A finished document's scores, summed one iteration later, after the barrier the pipeline
// needs anyway (no extra __syncthreads per document); per-document buffers alternate by
// parity, and one warp sums each query with its lanes over query tokens (epilogue.cuh).
template <typename T>
__device__ __forceinline__ void finish_document(const ForwardArgs& args, const Shared& S, i64 finished_doc,
                                                int parity, i64 first_query, int group_size, int warp, int lane) {
    const float* red_max = S.sRedMax + parity * WARPS_M * BN;
    const int* red_arg = S.sRedArg + parity * WARPS_M * BN;
    bool doc_has_row = false, doc_bad = false;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        doc_has_row |= S.sHasRow[parity * WARPS + w] != 0;
        doc_bad |= S.sDocBad[parity * WARPS + w] != 0;
    }
    for (int g = warp; g < group_size; g += WARPS)
        warp_finish_document<ARGMAX, Codec<T>::SCALED>(
            args, first_query + g, finished_doc, lane, doc_has_row, doc_bad,
            FinishedColumns{red_max, red_arg, S.sColQuery, S.sColScale, S.sColBad, g * args.query_length});
}

template <typename Acc> __device__ __forceinline__ void zero_tile(Acc (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0;
}

// The warp's rows x columns of one tile over its KSTEPS k-steps (the whole padded dim, or one
// k chunk streaming k): acc += tile_d x query.
// SHIFTED_ROWS: `shifts` are the tile rows' (sShift), and the A fragments are the words ldmatrix
// would give (rows lane/4 and lane/4 + 8, bytes 4 (lane % 4) of each 16-byte half of the k-step)
// read from each row's shifted start.
template <typename T, typename Acc>
__device__ __forceinline__ void multiply_tile(Acc (&acc)[MT][NT][4], const u16* tile_d, const u16* sQ,
                                              u32 (&b_regs)[b_in_registers<T>() ? KSTEPS : 1][NT / 2][4],
                                              int warp_m, int warp_n, int lane, const int* shifts) {
    const unsigned char* a_rows[MT][2];  // SHIFTED_ROWS: this thread's two rows of each m-tile, from its word
    if constexpr (SHIFTED_ROWS) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = warp_m * 16 * MT + mt * 16 + (lane >> 2) + 8 * h;
                a_rows[mt][h] = (const unsigned char*)(tile_d + r * LDS) + shifts[r] + 4 * (lane & 3);
            }
    }
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            if constexpr (SHIFTED_ROWS) {
                a[mt][0] = *(const u32*)(a_rows[mt][0] + ks * 32), a[mt][1] = *(const u32*)(a_rows[mt][1] + ks * 32);
                a[mt][2] = *(const u32*)(a_rows[mt][0] + ks * 32 + 16), a[mt][3] = *(const u32*)(a_rows[mt][1] + ks * 32 + 16);
            } else {
                ldmatrix_x4(a[mt], tile_d + (warp_m * 16 * MT + mt * 16 + (lane & 15)) * LDS + ks * 16 + (lane >> 4) * 8);
            }
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            u32 b_smem[4];
            constexpr bool B_IN_REGISTERS = b_in_registers<T>();
            if constexpr (!B_IN_REGISTERS) ldmatrix_x4(b_smem, b_fragment_address(sQ, warp_n, np, ks, lane));
            const u32(&b)[4] = B_IN_REGISTERS ? b_regs[B_IN_REGISTERS ? ks : 0][np] : b_smem;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                Mma16816<T>::run(acc[mt][2 * np], a[mt], b[0], b[1]);
                Mma16816<T>::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// The running max (and argmax) of a document so far, per thread: its columns' maxima over
// the rows it meets, whether one was real, and the non-finite witness (one column of every
// row this thread sees: non-finite iff a row is).
struct RunningMax {
    float max[NT][2];
    int arg[ARGMAX ? NT : 1][2];
    bool has_row;
    float row_sum;
};

// Fold a tile into the running max. A tile with no masked or padding row (no d_mask, wholly
// inside the document) needs no bias (BIASED false): the common case skips a quarter of the
// per-element work.
template <typename T, bool BIASED, typename Acc>
__device__ __forceinline__ void fold_tile(RunningMax& run, const Acc (&acc)[MT][NT][4], const Shared& S, int stage,
                                          int tile, int warp_m, int lane) {
    constexpr bool SCALED = Codec<T>::SCALED;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int r = warp_m * 16 * MT + mt * 16 + (lane >> 2);
        float bias_lo = 0.f, bias_hi = 0.f;
        if (BIASED) {
            bias_lo = S.sBias[stage * BM + r], bias_hi = S.sBias[stage * BM + r + 8];
            run.has_row |= (bias_lo == 0.f) | (bias_hi == 0.f);
        } else {
            run.has_row = true;
        }
        const float scale_lo = SCALED ? S.sScale[stage * BM + r] : 1.f;
        const float scale_hi = SCALED ? S.sScale[stage * BM + r + 8] : 1.f;
        // Masked rows are zero-filled (scale 0): they add 0.
        auto value = [](Acc x) { return accumulator_to_float<ACC_K>(x); };
        run.row_sum += value(acc[mt][0][0]) * scale_lo + value(acc[mt][0][2]) * scale_hi;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            // 16-bit inputs: scale is 1 and the multiply folds away at compile time.
            const float v0 = BIASED ? fmaf(value(acc[mt][nt][0]), scale_lo, bias_lo) : value(acc[mt][nt][0]) * scale_lo;
            const float v1 = BIASED ? fmaf(value(acc[mt][nt][1]), scale_lo, bias_lo) : value(acc[mt][nt][1]) * scale_lo;
            const float v2 = BIASED ? fmaf(value(acc[mt][nt][2]), scale_hi, bias_hi) : value(acc[mt][nt][2]) * scale_hi;
            const float v3 = BIASED ? fmaf(value(acc[mt][nt][3]), scale_hi, bias_hi) : value(acc[mt][nt][3]) * scale_hi;
            const float best0 = max_nan(v0, v2), best1 = max_nan(v1, v3);
            if constexpr (ARGMAX) {
                // Rows meet this thread in increasing order: strict > keeps the first.
                const int row = tile * BM + r;
                if (best0 > run.max[nt][0]) run.arg[nt][0] = v2 > v0 ? row + 8 : row;
                if (best1 > run.max[nt][1]) run.arg[nt][1] = v3 > v1 ? row + 8 : row;
            }
            run.max[nt][0] = max_nan(run.max[nt][0], best0);
            run.max[nt][1] = max_nan(run.max[nt][1], best1);
        }
    }
}

// A document is finished: reduce over the 8 row lanes here (over warps in finish_document),
// publish the maxima and flags under `parity`, and reset the running max.
__device__ __forceinline__ void publish_document(RunningMax& run, const Shared& S, int parity, int warp_m,
                                                 int warp_n, int warp, int lane) {
    float* red_max = S.sRedMax + parity * WARPS_M * BN;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float m = run.max[nt][j];
            int arg = ARGMAX ? run.arg[ARGMAX ? nt : 0][j] : -1;
#pragma unroll
            for (int offset = 4; offset < 32; offset <<= 1) {
                const float other = __shfl_xor_sync(0xffffffffu, m, offset);
                if constexpr (ARGMAX) {
                    const int other_arg = __shfl_xor_sync(0xffffffffu, arg, offset);
                    if (other > m || (other == m && (unsigned)other_arg < (unsigned)arg)) arg = other_arg;
                }
                m = max_nan(m, other);
            }
            if (lane < 4) {
                const int col = warp_n * 8 * NT + nt * 8 + 2 * lane + j;
                red_max[warp_m * BN + col] = m;
                if constexpr (ARGMAX) S.sRedArg[parity * WARPS_M * BN + warp_m * BN + col] = arg;
            }
            run.max[nt][j] = MAXSIM_NEG_INF;
            if constexpr (ARGMAX) run.arg[nt][j] = -1;
        }
    const bool warp_has_row = __any_sync(0xffffffffu, run.has_row);
    const bool warp_bad = __any_sync(0xffffffffu, !(fabsf(run.row_sum) < MAXSIM_INF));
    if (lane == 0) S.sHasRow[parity * WARPS + warp] = warp_has_row, S.sDocBad[parity * WARPS + warp] = warp_bad;
    run.has_row = false;
    run.row_sum = 0.f;
}
}  // namespace fwd

template <typename T>
__device__ __forceinline__ void maxsim_fwd_mma(const ForwardArgs args) {
    using namespace fwd;
    typedef typename Mma16816<T>::acc_t Acc;
    // int8: similarities are q_scale[i] * d_scale[j] * (integer dot). The document scale is
    // applied per row before the max; the (non-negative) query scale factors out of the max and
    // is applied once per column.
    constexpr bool SCALED = Codec<T>::SCALED;
    extern __shared__ __align__(16) unsigned char smem[];
    const Shared S = carve_shared(smem);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp % WARPS_M, warp_n = warp / WARPS_M;
    i64 doc_begin, doc_end;
    block_doc_range(args, blockIdx.x, args.docs_per_block, doc_begin, doc_end);
    if (doc_begin >= doc_end) return;
    const i64 first_query = args.pairs ? doc_begin : (i64)blockIdx.y * args.queries_per_group;
    const int group_size = args.pairs ? 1 : (int)min((i64)args.queries_per_group, args.num_queries - first_query);
    const DocLayout layout = make_doc_layout(args.d_doc_stride, args.d_row_stride, args.doc_length,
                                             args.offsets, args.offsets_are_64bit);

    stage_queries<T>(args, S, first_query, group_size, tid);
    TileLoader<T> loader(args, layout, doc_begin, doc_end, tid);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        loader.issue(args, S, s);
        cp_async_commit();
    }

    // The query block is the oldest cp.async group: once it lands, each warp keeps its
    // columns' B fragments in registers for the whole kernel (when they fit), so the inner
    // loop reads only document fragments from shared memory.
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    // Non-finite query tokens, once (int8 tokens cannot be; their scales are checked with the
    // max): such a column scores NaN through sColBad and is zeroed. The row pitch keeps rows
    // 16-byte aligned.
    if constexpr (!STREAM_K) {  // (streaming k: stream_query_columns found them)
        for (int col = tid; col < BN; col += THREADS) {
            bool bad = false;
            if constexpr (!SCALED) bad = zero_if_non_finite<T>(S.sQ + col * LDS, CHUNKS);
            S.sColBad[col] = bad;
        }
        __syncthreads();
    }
    constexpr bool B_IN_REGISTERS = b_in_registers<T>();
    u32 b_regs[B_IN_REGISTERS ? KSTEPS : 1][NT / 2][4];
    if constexpr (B_IN_REGISTERS) {
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks)
#pragma unroll
            for (int np = 0; np < NT / 2; ++np)
                ldmatrix_x4(b_regs[ks][np], b_fragment_address(S.sQ, warp_n, np, ks, lane));
    }

    i64 doc = doc_begin, base_unused, length, first_unused;
    doc_extent(layout, doc, base_unused, length, first_unused);
    int tiles = max(1, (int)((length + BM - 1) / BM)), tile = 0;
    i64 pending_doc = -1;
    int parity = 0;
    const int kchunks = k_chunks<T>(args.dim);
    int kc = 0;
    // fp32 streaming k: each k chunk into a fresh accumulator, added to the tile's sum by a
    // rounding add. The tensor cores' accumulation truncates; over a fat dim its bias toward
    // zero came to 1.7e-5 of the score at dim 2560 (tests/results/2026-12-01-h200-gpu-cliffs-1a41b57.log),
    // while partial sums of either sign leave no bias.
    constexpr bool CHUNK_SUMS = STREAM_K && Codec<T>::BITS == 32;
    Acc acc[MT][NT][4], sum[MT][NT][4];  // (sum: CHUNK_SUMS only, else dead)
    RunningMax run;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            run.max[nt][j] = MAXSIM_NEG_INF;
            if constexpr (ARGMAX) run.arg[nt][j] = -1;
        }
    run.has_row = false;
    run.row_sum = 0.f;

    for (int stage = 0; doc < doc_end; stage = (stage + 1) % STAGES) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (pending_doc >= 0) {
            finish_document<T>(args, S, pending_doc, parity ^ 1, first_query, group_size, warp, lane);
            pending_doc = -1;
        }
        loader.issue(args, S, (stage + STAGES - 1) % STAGES);
        cp_async_commit();

        if (kc == 0 || CHUNK_SUMS) zero_tile(acc);
        multiply_tile<T>(acc, S.sD + stage * BM * LDS, S.sQ + (STREAM_K ? stage * BN * LDS : 0), b_regs, warp_m,
                         warp_n, lane, S.sShift + stage * BM);
        if constexpr (CHUNK_SUMS) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sum[mt][nt][e] = kc == 0 ? acc[mt][nt][e] : sum[mt][nt][e] + acc[mt][nt][e];
        }
        if (STREAM_K && ++kc < kchunks) continue;  // the tile's next k chunk
        kc = 0;
        const auto& tile_sum = CHUNK_SUMS ? sum : acc;
        // Each call inlines into its own specialised copy.
        if (args.d_mask == nullptr && (i64)(tile + 1) * BM <= length)
            fold_tile<T, false>(run, tile_sum, S, stage, tile, warp_m, lane);
        else
            fold_tile<T, true>(run, tile_sum, S, stage, tile, warp_m, lane);

        if (++tile < tiles) continue;
        publish_document(run, S, parity, warp_m, warp_n, warp, lane);
        pending_doc = doc;
        parity ^= 1;
        tile = 0;
        if (++doc < doc_end) {
            doc_extent(layout, doc, base_unused, length, first_unused);
            tiles = max(1, (int)((length + BM - 1) / BM));
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    if (pending_doc >= 0) finish_document<T>(args, S, pending_doc, parity ^ 1, first_query, group_size, warp, lane);
}

#define MAXSIM_FWD_MMA_ENTRY(NAME, T)                                                      \
    extern "C" __global__ void __launch_bounds__(fwd::THREADS, MAXSIM_MIN_BLOCKS) NAME(const ForwardArgs args) { \
        maxsim_fwd_mma<T>(args);                                                          \
    }

MAXSIM_FWD_MMA_ENTRY(maxsim_fwd_fp16, fp16_t)
MAXSIM_FWD_MMA_ENTRY(maxsim_fwd_bf16, bf16_t)
// fp32 at 16 accumulator tiles per warp spills registers past 6 k-steps (each fragment also held
// as two TF32 halves) or streaming k (the chunk sums): no entry there (_plan/configs.fp32_entry
// mirrors this rule).
#if MAXSIM_MT * MAXSIM_NT < 16 || (MAXSIM_KSTEPS <= 6 && !MAXSIM_STREAM_K)
MAXSIM_FWD_MMA_ENTRY(maxsim_fwd_fp32, float)
#endif
MAXSIM_FWD_MMA_ENTRY(maxsim_fwd_int8, i8)
