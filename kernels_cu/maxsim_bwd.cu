// maxsim_bwd.cu: MaxSim backward from the argmax the forward saved, deterministic and free of
// float atomics. With s[i, n] = sum_t <q[i, t], d[n, a[i, n, t]]> and g = dL/ds:
//
//   dq[i, t] = sum_n g[i, n] * d[n, a[i, n, t]]                   (a gather: the token owns it)
//   dd[n, k] = sum_{(i, t) : a[i, n, t] = k} g[i, n] * q[i, t]    (a scatter, inverted below)
//
// a = -1 (masked query token, document with no real token) contributes nothing. Gradients are
// accumulated in fp32 (fp64 for float64 inputs) in a fixed order and written once, in the
// input dtype: the same inputs give bitwise the same gradients.
//
// A backward is one launch where a document's sources fit in shared memory and dQ needs no
// document chunks (in-batch training: maxsim_bwd_fused_*, dD blocks inverting their own rows'
// winners), else two: maxsim_bwd_csr_dq_* (the inverse CSR of the winners, then dQ) and
// maxsim_bwd_dd_* (dD, then the sum of dQ's document chunks). A training step is host-bound,
// each launch costing microseconds of host time.
//
// maxsim_bwd_csr_dq_*, first blocks: one block per document inverts its argmax into CSR in
// three phases (no sort, no global atomics):
//   count: count_warps warps each count their contiguous share of the document's (i, t)
//          sources per destination token, in shared memory (integer atomics: exact);
//   scan:  per token, an exclusive scan over warps, then over tokens, gives each warp a cursor
//          into the token's list and each token its range [begin, end);
//   fill:  each warp walks its share in order, ranks equal destinations with __match_any_sync
//          and writes the source at cursor + rank: lists come out in (i, t) order, every run.
// Shared memory (dynamic, bytes): 4 * (count_warps * L + 2 * L + 2), L = the longest
// document; _plan/configs.py mirrors this formula. The launch gives every block that much, dQ's
// too, so Python keeps it within a quarter of an SM where it can (documents up to about
// 4,800 tokens on the H200; longer ones take up to the block limit, then, past about 19,000
// tokens, a global scratch of that size per document (csr_counts) with one count warp).
//
// maxsim_bwd_csr_dq_*, the other blocks: dQ, one warp per (query token, 128-wide dim chunk,
// document chunk). Lanes read the argmax and g of 64 documents at once and broadcast them;
// each lane accumulates 4 dims, 8 document rows in flight (16-bit rows; 4 otherwise; a weight
// of 0 marks a document the token has no winner in); 16-bit rows on 16 bytes take the wide
// layout (gather_rows_wide: 8 dims a lane, the warp's halves adding the first and the second
// half of each batch of documents, their sums added at the end). With one document chunk the
// warp writes grad_q directly; with several it writes fp32 partials, which blocks past the
// documents of the dD launch sum in chunk order.
//
// maxsim_bwd_dd_*: one block per (document, row group). Each destination row is owned by one
// warp, which sums its sources in list order and writes the row once (zeros for a token
// nobody chose); a warp walks the light sources of rows_per_warp consecutive rows as one
// contiguous segment, so that sparse rows (ColPali: about one source per patch) do not cost a
// round trip each; dense rows in the wide layout are walked two at a time instead, a row per
// half-warp. Hot rows (more than HOT_ROW sources, e.g. a token every query picks) are
// split over all warps of the block into contiguous parts, added in warp order.
//
// Preconditions (checked in Python): q, d unit dim stride; vector_loads only when q and d
// start on 16 bytes and every row start and dim are multiples of 4 elements; the _wide kernels
// only for 16-bit types where they are multiples of 8, every row under 2^32 16-byte steps
// from its array's start, and grad_q, grad_d on 16 bytes; sources holds sources_per_doc
// (Nq * Lq, or Lq in pairs mode) entries per document, fewer than 2^31 in all per document.

namespace bwd {
// The most warps per block the kernels handle (their shared arrays); they run with 8
// (_plan/configs.BWD_THREADS) and read the count from blockDim.
constexpr int WARPS = 16;
constexpr int DIM_CHUNK = 128;  // 32 lanes x 4 dims
constexpr int MAX_BLOCK_ROWS = 1024;  // rows per dD block: warps * rows_per_warp (Python keeps it)
constexpr int HOT_ROW = 64;     // rows with more sources are split over the block's warps
#ifndef MAXSIM_BWD_INFLIGHT
#define MAXSIM_BWD_INFLIGHT 4
#endif
#ifndef MAXSIM_BWD_MIN_BLOCKS
#define MAXSIM_BWD_MIN_BLOCKS 4
#endif
// The one-launch kernel holds dD's walk with its blocks' own lists: at 64 registers (4 blocks)
// ptxas spilled a register or two on some architectures, so it runs with up to 80 (3 blocks).
#ifndef MAXSIM_BWD_FUSED_MIN_BLOCKS
#define MAXSIM_BWD_FUSED_MIN_BLOCKS 3
#endif
// Rows loaded before they are accumulated (2 for float64: registers) and blocks per SM: 4 and 4
// measured best on the H200 (occupancy beats rows in flight; bench/results/tune-backward-*.log).
constexpr int INFLIGHT = MAXSIM_BWD_INFLIGHT;
// The wide layout's rows loaded before they are added, per half-warp: 4 (16 registers of raw
// rows) spilled in the dQ and dD kernels at 64 registers (sm_80 to sm_90).
constexpr int WIDE_INFLIGHT = 3;
template <typename A> struct Inflight { static constexpr int value = sizeof(A) == 8 ? (INFLIGHT < 2 ? INFLIGHT : 2) : INFLIGHT; };
}  // namespace bwd

// Where document n's rows start (elements) and how many it has.
__device__ __forceinline__ void bwd_doc_extent(const BackwardArgs& args, i64 doc, i64& base, i64& length,
                                               i64& first_token) {
    const DocLayout layout = make_doc_layout(args.d_doc_stride, args.d_row_stride, args.doc_length,
                                             args.offsets, args.offsets_are_64bit);
    doc_extent(layout, doc, base, length, first_token);
}

// The gather both gradients are made of: lane l holds the offset (elements, from `base`) and
// the weight of the l-th of `count` rows; the warp adds weight * row[dim0, dim0 + 4) for each
// row in lane order into acc, Inflight rows (16-bit vector rows: twice that) loaded before they
// are accumulated, in the same order either way. before_row(j)
// runs (warp-uniformly) just before row j is added: the dD walk closes finished rows there.
template <typename T, typename A, typename BeforeRow>
__device__ __forceinline__ void gather_rows(const T* base, i64 my_offset, A my_weight, int count, int dim0,
                                            int valid, bool vector, A (&acc)[4], BeforeRow before_row) {
    if constexpr (Codec<T>::BITS == 16) {
        // 16-bit rows with 8-byte loads (vector: dim % 4 == 0, so a lane has 4 dims or none):
        // rows stay raw until they are added, 2 registers each instead of 4 converted ones, so
        // twice the rows are in flight in the same registers (the gathers wait on L2 round trips).
        if (vector) {
            constexpr int RAW_ROWS = 2 * bwd::INFLIGHT;
            for (int j0 = 0; j0 < count; j0 += RAW_ROWS) {
                uint2 rows[RAW_ROWS];
#pragma unroll
                for (int u = 0; u < RAW_ROWS; ++u) {
                    const int src = j0 + u;
                    const i64 offset = __shfl_sync(0xffffffffu, my_offset, src & 31);
                    rows[u] = src < count && valid > 0 ? *(const uint2*)(base + offset + dim0) : make_uint2(0, 0);
                }
#pragma unroll
                for (int u = 0; u < RAW_ROWS; ++u) {
                    if (j0 + u >= count) break;  // count is the warp's: no lane leaves a shuffle
                    before_row(j0 + u);
                    const A weight = __shfl_sync(0xffffffffu, my_weight, j0 + u);  // (the weights: no registers held)
                    const u32 words[2] = {rows[u].x, rows[u].y};
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        T t;
                        t.bits = (u16)(words[e / 2] >> (16 * (e % 2)));
                        acc[e] += weight * convert<A, T>(t);
                    }
                }
            }
            return;
        }
    }
    constexpr int INFLIGHT_ROWS = bwd::Inflight<A>::value;
    for (int j0 = 0; j0 < count; j0 += INFLIGHT_ROWS) {
        A rows[INFLIGHT_ROWS][4];
        A weights[INFLIGHT_ROWS];
#pragma unroll
        for (int u = 0; u < INFLIGHT_ROWS; ++u) {
            const int src = j0 + u;
            const i64 offset = __shfl_sync(0xffffffffu, my_offset, src & 31);
            weights[u] = __shfl_sync(0xffffffffu, my_weight, src & 31);
            if (src < count && valid > 0)
                load4<T, A>(base + offset + dim0, valid, vector, rows[u]);
            else
                rows[u][0] = rows[u][1] = rows[u][2] = rows[u][3] = 0, weights[u] = 0;
        }
#pragma unroll
        for (int u = 0; u < INFLIGHT_ROWS; ++u) {
            if (j0 + u >= count) break;
            before_row(j0 + u);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[e] += weights[u] * rows[u][e];
        }
    }
}
template <typename T, typename A>
__device__ __forceinline__ void gather_rows(const T* base, i64 my_offset, A my_weight, int count, int dim0,
                                            int valid, bool vector, A (&acc)[4]) {
    gather_rows<T, A>(base, my_offset, my_weight, count, dim0, valid, vector, acc, [](int) {});
}

// 16-bit rows with 16-byte loads (the _wide kernels: rows 16-byte aligned, dim % 8 == 0):
// each half of the warp covers a 128-wide dim chunk (16 lanes x 8 dims), so one instruction
// moves two rows, one per half, and the per-row overhead (shuffles, addresses, bounds, the loop)
// is paid once for both. H200, ColBERT in-batch: the two-launch backward executed ~45 (dD) and
// ~20 (dQ) warp instructions per gathered row against 8 for the converts and FMAs alone
// (bench/NOTES.md, fourteenth day). Lane `first + j` (this half's first, at most 16 apart)
// holds the offset and weight of the half's j-th row, j < my_count <= 16; each half adds
// weight * row[dim0, dim0 + 8) for its rows in order into acc. count_max: the larger count of
// the two halves. Offsets count 16 bytes (8 elements) from `base`: one 32-bit shuffle a row
// (Python keeps them under 2^32). Rows past a half's count, and lanes past dim (in_dims
// false), load nothing and add nothing.
template <typename T>
__device__ __forceinline__ void gather_rows_wide(const T* base, u32 my_offset, float my_weight, int first,
                                                 int my_count, int count_max, int dim0, bool in_dims,
                                                 float (&acc)[8]) {
    constexpr int RAW_ROWS = bwd::WIDE_INFLIGHT;  // per half: twice that per warp in flight
    const uint4* rows16 = (const uint4*)base + dim0 / 8;
    for (int j0 = 0; j0 < count_max; j0 += RAW_ROWS) {
        uint4 rows[RAW_ROWS];
#pragma unroll
        for (int u = 0; u < RAW_ROWS; ++u) {
            const u32 offset = __shfl_sync(0xffffffffu, my_offset, (first + j0 + u) & 31);
            rows[u] = j0 + u < my_count && in_dims ? rows16[offset] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < RAW_ROWS; ++u) {
            if (j0 + u >= count_max) break;  // warp-uniform: no lane leaves a shuffle
            const float weight = __shfl_sync(0xffffffffu, my_weight, (first + j0 + u) & 31);
            if (j0 + u >= my_count) continue;  // this half's rows are done
            const u32 words[4] = {rows[u].x, rows[u].y, rows[u].z, rows[u].w};
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                T t;
                t.bits = (u16)(words[e / 2] >> (16 * (e % 2)));
                acc[e] += weight * convert<float, T>(t);
            }
        }
    }
}

// A row's offset from its array's start: elements, or 16-byte steps in the wide layout.
template <bool WIDE> struct RowOffset { typedef i64 type; };
template <> struct RowOffset<true> { typedef u32 type; };

// N sums to N consecutive elements at p: one vector store where `vector` (p aligned to the
// vector: outputs are fresh allocations, dim a multiple of N) and all N are inside the row
// (16-bit: 8 or 16 bytes; 8 float32: two 16-byte pieces), else element by element. A row's
// vector stores write each 32-byte sector once; 2-byte element stores came back to each
// sector 4 times (ColPali's backward: dD 27.7 -> 22.9 us; bench/NOTES.md, fourteenth day).
template <typename T, typename A, int N>
__device__ __forceinline__ void store_sums(T* p, const A (&v)[N], int valid, bool vector) {
    if constexpr (Codec<T>::BITS == 16) {
        if (vector && valid == N) {
            u32 words[N / 2];
#pragma unroll
            for (int w = 0; w < N / 2; ++w) {
                T low, high;
                store_value(&low, v[2 * w]);
                store_value(&high, v[2 * w + 1]);
                words[w] = (u32)low.bits | ((u32)high.bits << 16);
            }
            if constexpr (N == 8)
                *(uint4*)p = make_uint4(words[0], words[1], words[2], words[3]);
            else
                *(uint2*)p = make_uint2(words[0], words[1]);
            return;
        }
    } else if constexpr (Codec<T>::BITS == 32 && N == 8) {  // (N == 4: a float4 spilled dd_fp32 on sm_80)
        if (vector && valid == N) {
#pragma unroll
            for (int e = 0; e < N; e += 4)
                *(float4*)(p + e) = make_float4((float)v[e], (float)v[e + 1], (float)v[e + 2], (float)v[e + 3]);
            return;
        }
    }
#pragma unroll
    for (int e = 0; e < N; ++e)
        if (e < valid) store_value(p + e, v[e]);
}

// dQ block (block_x, block_y, block_z): query tokens, dim chunk, document chunk.
template <typename T, bool WIDE>
__device__ __forceinline__ void maxsim_bwd_dq(const BackwardArgs& args, i64 block_x, int block_y, i64 block_z) {
    typedef typename Codec<T>::Acc A;
    using namespace bwd;
    const int lane = threadIdx.x & 31;
    const i64 token_index = block_x * (blockDim.x >> 5) + (threadIdx.x >> 5);  // query * Lq + t
    const i64 num_tokens = (i64)args.num_queries * args.query_length;
    if (token_index >= num_tokens) return;
    const i64 query = token_index / args.query_length;
    const int token = (int)(token_index % args.query_length);
    // WIDE (16-byte loads): the two halves of the warp take the first and second half of each
    // batch's documents and add their sums at the end, lanes l and l + 16 holding the same dims.
    constexpr int DIMS = WIDE ? 8 : 4;  // a lane's
    const int dim0 = block_y * DIM_CHUNK + (WIDE ? (lane & 15) * 8 : lane * 4);
    const int valid = min(DIMS, args.dim - dim0);
    const bool vector = args.vector_loads != 0;
    const T* d = (const T*)args.d;

    i64 doc_begin = block_z * args.docs_per_chunk;
    i64 doc_end = min(doc_begin + args.docs_per_chunk, args.num_docs);
    if (args.pairs) doc_begin = query, doc_end = query + 1;

    // Lane l fetches the winner and weight of documents n0 + l, n0 + 32 + l, ... (PREFETCH
    // batches of 32, all loads in flight at once); the warp then walks them in order.
    constexpr int PREFETCH = 2;  // 4 spilled beside the raw rows in flight (gather_rows); chunks are mostly <= 64 documents
    A acc[DIMS] = {};
    for (i64 n0 = doc_begin; n0 < doc_end; n0 += 32 * PREFETCH) {
        A my_weight[PREFETCH];
        typename RowOffset<WIDE>::type my_base[PREFETCH];  // WIDE: in 16-byte steps
#pragma unroll
        for (int u = 0; u < PREFETCH; ++u) {
            const i64 my_doc = n0 + 32 * u + lane;
            my_weight[u] = 0;
            my_base[u] = 0;
            if (my_doc < doc_end) {
                i64 base, length, first_token;
                bwd_doc_extent(args, my_doc, base, length, first_token);
                const int row = load_argmax(args.argmax, args.argmax_is_32bit,
                                            query * args.argmax_query_stride + my_doc * args.argmax_doc_stride + token);
                const A weight = (A)args.grad[query * args.grad_query_stride + my_doc * args.grad_doc_stride];
                const bool won = row >= 0 && row < length;
                my_weight[u] = won ? weight : (A)0;
                // (not the document's start where it has no winner: an empty last packed
                // document starts past the last row)
                const i64 element = won ? base + (i64)row * args.d_row_stride : 0;
                my_base[u] = WIDE ? (u32)(element >> 3) : element;
            }
        }
#pragma unroll
        for (int u = 0; u < PREFETCH; ++u) {
            const i64 batch = n0 + 32 * u;
            if (batch >= doc_end) break;
            const int count = (int)min((i64)32, doc_end - batch);
            if constexpr (WIDE) {  // the batch's first half of documents in the first half-warp
                const int first_count = min(16, (count + 1) / 2);
                const bool second = lane & 16;
                gather_rows_wide<T>(d, my_base[u], my_weight[u], second ? first_count : 0,
                                    second ? count - first_count : first_count, first_count, dim0,
                                    valid > 0, acc);
            } else
                gather_rows<T, A>(d, my_base[u], my_weight[u], count, dim0, valid, vector, acc);
        }
    }
    if constexpr (WIDE) {  // the second half's sum onto the first's (a fixed order: bitwise repeatable)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += __shfl_down_sync(0xffffffffu, acc[e], 16);
        if (lane & 16) return;
    }
    if (valid <= 0) return;
    const i64 out = token_index * args.dim + dim0;
    if (args.partial != nullptr)
        store_sums<float, A, DIMS>(args.partial + block_z * num_tokens * args.dim + out, acc, valid, vector);
    else
        store_sums<T, A, DIMS>((T*)args.grad_q + out, acc, valid, vector);
}

// Sums the dQ partials of the document chunks in chunk order, as block `block` of `blocks`
// (never float64: the float64 path keeps one chunk).
template <typename T>
__device__ __forceinline__ void maxsim_bwd_dq_reduce(const BackwardArgs& args, i64 block, i64 blocks) {
    const i64 total = (i64)args.num_queries * args.query_length * args.dim;
    const i64 chunks = (args.num_docs + args.docs_per_chunk - 1) / args.docs_per_chunk;
    for (i64 i = block * blockDim.x + threadIdx.x; i < total; i += blocks * blockDim.x) {
        float sum = 0.f;
        for (i64 c = 0; c < chunks; ++c) sum += args.partial[c * total + i];
        store_value((T*)args.grad_q + i, sum);
    }
}

// Exclusive scan of values[0, n) in place (all threads of the block call it); returns the total.
__device__ __forceinline__ int block_exclusive_scan(int* values, int n, int* warp_sums) {
    using namespace bwd;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
    int carry = 0;
    for (int base = 0; base < n; base += blockDim.x) {
        const int i = base + tid;
        const int v = i < n ? values[i] : 0;
        const int inclusive = warp_inclusive_sum(v, lane);
        if (lane == 31) warp_sums[warp] = inclusive;
        __syncthreads();
        int before = carry;
        for (int w = 0; w < warp; ++w) before += warp_sums[w];
        if (i < n) values[i] = before + inclusive - v;
        int chunk_total = 0;
        for (int w = 0; w < warps; ++w) chunk_total += warp_sums[w];
        carry += chunk_total;
        __syncthreads();
    }
    return carry;
}

// Source e = (query, token) of a document -> its winner's row relative to the window
// [row_begin, row_begin + rows) of the document's rows, or -1 outside it (never trust an index
// past the document: a foreign argmax cannot make us write out of bounds).
__device__ __forceinline__ int source_winner(const BackwardArgs& args, i64 doc, i64 first_query, int query_length,
                                             int length, int row_begin, int rows, int e) {
    const i64 query = first_query + e / query_length;
    const int row = load_argmax(args.argmax, args.argmax_is_32bit,
                                query * args.argmax_query_stride + doc * args.argmax_doc_stride + e % query_length);
    const int relative = row - row_begin;
    return row >= 0 && row < length && relative >= 0 && relative < rows ? relative : -1;
}

// The windowed winners of sources e, e + 32, ... (N of them, -1 past `end`): all loads in
// flight at once.
template <int N>
__device__ __forceinline__ void source_winners(const BackwardArgs& args, i64 doc, i64 first_query, int query_length,
                                               int length, int row_begin, int rows, int e, int end, int (&out)[N]) {
#pragma unroll
    for (int u = 0; u < N; ++u)
        out[u] = e + 32 * u < end
                     ? source_winner(args, doc, first_query, query_length, length, row_begin, rows, e + 32 * u)
                     : -1;
}

// Inverts the winners of document `doc` that fall in its rows [row_begin, row_begin + rows)
// (all threads of the block call it): count, scan, fill. `list` receives the sources, the
// light rows' (at most HOT_ROW sources) first, row after row, then the hot rows'; `ranges`
// the pair (light start, hot start) of each row k = 0 .. rows (the last one: the totals):
// light row k owns list[light[k], light[k + 1]), hot row k list[hot[k], hot[k + 1]).
// `counts` (count_warps x rows), `light` and `hot` (rows + 1 each) are scratch, in shared or
// global memory (generic addressing: same code).
__device__ __forceinline__ void invert_winners(const BackwardArgs& args, i64 doc, int length, int row_begin, int rows,
                                               int count_warps, int* counts, int* light, int* hot, int* list,
                                               int* ranges) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __shared__ int warp_sums[bwd::WARPS];
    const int query_length = args.query_length;
    const i64 first_query = args.pairs ? doc : 0;
    const int sources = args.pairs ? query_length : args.num_queries * query_length;  // < 2^31
    const int share = (sources + count_warps - 1) / count_warps;
    const int my_begin = warp * share, my_end = min(sources, (warp + 1) * share);
    constexpr int AHEAD = 4;  // loads issued before their results are used

    // count: each of count_warps warps its contiguous share of the sources, per row
    for (int i = tid; i < count_warps * rows; i += blockDim.x) counts[i] = 0;
    __syncthreads();
    if (warp < count_warps) {
        int* my_counts = counts + warp * rows;
        for (int e0 = my_begin; e0 < my_end; e0 += 32 * AHEAD) {
            int winners[AHEAD];
            source_winners<AHEAD>(args, doc, first_query, query_length, length, row_begin, rows, e0 + lane, my_end,
                                  winners);
#pragma unroll
            for (int u = 0; u < AHEAD; ++u)
                if (winners[u] >= 0) atomicAdd(my_counts + winners[u], 1);
        }
    }
    __syncthreads();
    // scan: per row over warps (cursor offsets), then over rows, light and hot apart
    for (int k = tid; k < rows; k += blockDim.x) {
        int total = 0;
        for (int w = 0; w < count_warps; ++w) {
            const int c = counts[w * rows + k];
            counts[w * rows + k] = total;
            total += c;
        }
        const bool is_hot = total > bwd::HOT_ROW;
        light[k] = is_hot ? 0 : total;
        hot[k] = is_hot ? total : 0;
    }
    __syncthreads();
    const int light_total = block_exclusive_scan(light, rows, warp_sums);
    const int hot_total = block_exclusive_scan(hot, rows, warp_sums);
    if (tid == 0) light[rows] = light_total, hot[rows] = hot_total;
    __syncthreads();
    for (int i = tid; i < count_warps * rows; i += blockDim.x) {
        const int k = i % rows;
        const bool is_hot = hot[k + 1] > hot[k];
        counts[i] += is_hot ? light_total + hot[k] : light[k];
    }
    for (int k = tid; k <= rows; k += blockDim.x) {
        ranges[2 * k] = light[k];
        ranges[2 * k + 1] = light_total + hot[k];
    }
    __syncthreads();
    // fill, in source order: equal rows ranked with __match_any_sync
    if (warp < count_warps) {
        int* cursors = counts + warp * rows;
        const unsigned lanes_below = (1u << lane) - 1;
        for (int e0 = my_begin; e0 < my_end; e0 += 32 * AHEAD) {
            int winners[AHEAD];
            source_winners<AHEAD>(args, doc, first_query, query_length, length, row_begin, rows, e0 + lane, my_end,
                                  winners);
#pragma unroll
            for (int u = 0; u < AHEAD; ++u) {
                const int row = winners[u];
                const bool real = row >= 0;
                const unsigned active = __ballot_sync(0xffffffffu, real);
                unsigned peers = 0;
                int position = 0;
                if (real) {
                    peers = __match_any_sync(active, row);
                    position = cursors[row] + __popc(peers & lanes_below);
                }
                __syncwarp();
                if (real && (peers & lanes_below) == 0) cursors[row] += __popc(peers);
                if (real) list[position] = e0 + u * 32 + lane;
                __syncwarp();
            }
        }
    }
    __syncthreads();
}

// The inverse CSR of one whole document (one block per document, two-launch backward): the
// list at sources + doc * sources_per_doc, the ranges at row_ranges entries row0 + doc + k.
__device__ __forceinline__ void build_inverse_csr(const BackwardArgs& args, i64 doc) {
    extern __shared__ __align__(16) unsigned char smem[];
    i64 doc_base, length64, first_token;
    bwd_doc_extent(args, doc, doc_base, length64, first_token);
    const int length = (int)length64;
    if (length == 0) return;
    const int count_warps = args.count_warps;
    // Counts and starts live in shared memory, or, for documents too long for it, in this
    // document's slice of a global scratch buffer.
    int* counts = args.csr_counts != nullptr ? args.csr_counts + doc * args.csr_counts_stride : (int*)smem;
    int* light = counts + count_warps * length;
    int* hot = light + length + 1;
    const i64 entry0 = (args.offsets == nullptr ? doc * length : first_token) + doc;
    invert_winners(args, doc, length, 0, length, count_warps, counts, light, hot,
                   args.sources + doc * args.sources_per_doc, args.row_ranges + 2 * entry0);
}

// dD rows of document `doc`'s row group `group` (all threads of the block call it), from the
// row lists of invert_winners: `list`, and `ranges`, whose pair k is row k's (light start, hot
// start), or with `block_ranges` row block_first + k's (the block's own lists).
// Each warp owns rows_per_warp consecutive rows:
// their light sources are contiguous in the list, so the warp walks them as one segment, 32
// list entries and 8 query rows in flight at a time, and writes each row once when the walk
// passes its end (zeros for a row nobody chose). Then each hot row of the block is summed by
// all warps in contiguous parts, added in warp order.
template <typename T, bool WIDE>
__device__ __forceinline__ void dd_row_group(const BackwardArgs& args, i64 doc, int group, int length, i64 row0,
                                             const int* list, const int* ranges, bool block_ranges) {
    typedef typename Codec<T>::Acc A;
    using namespace bwd;
    __shared__ __align__(16) A sPartial[WARPS * DIM_CHUNK];
    __shared__ int sHotRows[MAX_BLOCK_ROWS];  // this block's hot rows, in no particular order
    __shared__ int sHotCount;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int rows_per_warp = args.rows_per_warp;
    if (threadIdx.x == 0) sHotCount = 0;
    __syncthreads();
    const int block_first = group * warps * rows_per_warp;
    if (block_first >= length) return;

    const int query_length = args.query_length;
    const i64 first_query = args.pairs ? doc : 0;
    const int range_first = block_ranges ? block_first : 0;  // (block_first: re-derived, not held)
    auto light_start = [&](int k) { return ranges[2 * (k - range_first)]; };
    auto hot_start = [&](int k) { return ranges[2 * (k - range_first) + 1]; };
    const T* q = (const T*)args.q;
    T* grad_d = (T*)args.grad_d;
    const bool vector = args.vector_loads != 0;
    auto source = [&](int position, i64& offset, A& weight) {  // list entry -> query row, weight
        const int e = list[position];
        const i64 query = first_query + e / query_length;
        offset = query * args.q_query_stride + (i64)(e % query_length) * args.q_row_stride;
        weight = (A)args.grad[query * args.grad_query_stride + doc * args.grad_doc_stride];
    };
    auto store_row = [&](int row, int dim0, int valid, const A (&acc)[4]) {
        store_sums<T, A, 4>(grad_d + (row0 + row) * args.dim + dim0, acc, valid, vector);
    };
    const int warp_first = block_first + warp * rows_per_warp;
    const int warp_last = min(length, warp_first + rows_per_warp);
    // Lane l: whether row g0 + l (l < rows) is hot; the block's hot rows are noted once, and
    // each is summed block-wide below.
    auto note_hot_rows = [&](int g0, int rows, bool hot) {
        const unsigned hot_lanes = __ballot_sync(0xffffffffu, hot && lane < rows);
        int slot = 0;
        if (lane == 0 && hot_lanes) slot = atomicAdd(&sHotCount, __popc(hot_lanes));
        slot = __shfl_sync(0xffffffffu, slot, 0);
        if (hot && lane < rows) sHotRows[slot + __popc(hot_lanes & ((1u << lane) - 1))] = g0 + lane;
    };
    // WIDE (16-bit rows, 16-byte loads; Python takes these kernels for dense rows, about 8 or
    // more sources a row): a warp walks its rows two at a time, a row per half, each half its
    // row's sources in list order (the same sums, bit for bit, as the segment walk's), with no
    // row boundary to test per source. Sparse rows (ColPali) keep the segment walk, which fills
    // all 32 lanes with list entries.
    for (int chunk0 = 0; chunk0 < args.dim; chunk0 += DIM_CHUNK) {
        const int dim0 = chunk0 + lane * 4;
        const int valid = min(4, args.dim - dim0);
        if constexpr (WIDE) {
            if (chunk0 == 0)
                for (int g0 = warp_first; g0 < warp_last; g0 += 32) {
                    const int k = min(g0 + lane, warp_last - 1);
                    note_hot_rows(g0, min(32, warp_last - g0), hot_start(k + 1) > hot_start(k));
                }
            const int wide_dim0 = chunk0 + (lane & 15) * 8;
            const bool in_dims = wide_dim0 < args.dim;
            for (int g = warp_first; g < warp_last; g += 2) {
                const int row = min(g + (lane >> 4), warp_last - 1), mine = lane & 15;
                const bool has_row = g + (lane >> 4) < warp_last;
                const int begin = light_start(row);
                const int count = has_row ? light_start(row + 1) - begin : 0;  // 0 for a hot row
                const int count_max = max(count, __shfl_xor_sync(0xffffffffu, count, 16));
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int p0 = 0; p0 < count_max; p0 += 16) {
                    i64 my_offset = 0;
                    A my_weight = 0;
                    if (p0 + mine < count) source(begin + p0 + mine, my_offset, my_weight);
                    gather_rows_wide<T>(q, (u32)(my_offset >> 3), my_weight, lane & 16, max(0, min(16, count - p0)),
                                        min(16, count_max - p0), wide_dim0, in_dims, acc);
                }
                if (has_row && in_dims && hot_start(row + 1) == hot_start(row))
                    store_sums<T, float, 8>(grad_d + (row0 + row) * args.dim + wide_dim0, acc, 8, true);
            }
        } else {
            for (int g0 = warp_first; g0 < warp_last; g0 += 32) {
                const int rows = min(32, warp_last - g0);
                // Lane l: row g0 + l's light end and whether it is hot.
                const int k = g0 + min(lane, rows - 1);
                const int light_end = light_start(k + 1);
                const bool hot = hot_start(k + 1) > hot_start(k);
                const int segment_begin = light_start(g0), segment_end = __shfl_sync(0xffffffffu, light_end, rows - 1);
                if (chunk0 == 0) note_hot_rows(g0, rows, hot);
                int current = 0, current_end = __shfl_sync(0xffffffffu, light_end, 0);
                bool current_hot = __shfl_sync(0xffffffffu, hot, 0);
                A acc[4] = {0, 0, 0, 0};
                // Passing `position` closes every row that ends at or before it.
                auto close_rows_up_to = [&](int position) {
                    while (current < rows && position >= current_end) {
                        if (!current_hot) store_row(g0 + current, dim0, valid, acc);
                        acc[0] = acc[1] = acc[2] = acc[3] = 0;
                        ++current;
                        current_end = __shfl_sync(0xffffffffu, light_end, min(current, 31));
                        current_hot = __shfl_sync(0xffffffffu, hot, min(current, 31));
                    }
                };
                for (int p0 = segment_begin; p0 < segment_end; p0 += 32) {
                    i64 my_offset = 0;
                    A my_weight = 0;
                    if (p0 + lane < segment_end) source(p0 + lane, my_offset, my_weight);
                    gather_rows<T, A>(q, my_offset, my_weight, min(32, segment_end - p0), dim0, valid, vector, acc,
                                      [&](int j) { close_rows_up_to(p0 + j); });
                }
                close_rows_up_to(0x7fffffff);  // the last row, and rows nobody chose after it
            }
        }
        // Hot rows of this block: every warp sums a contiguous part; parts added in warp order
        // (each row's bits do not depend on the order the rows are visited in).
        __syncthreads();
        for (int h = 0; h < sHotCount; ++h) {
            const int row = sHotRows[h];
            const int begin = hot_start(row), end = hot_start(row + 1);
            const int part = (end - begin + warps - 1) / warps;
            const int my_begin = min(end, begin + warp * part), my_end = min(end, begin + (warp + 1) * part);
            A acc[4] = {0, 0, 0, 0};
            for (int s0 = my_begin; s0 < my_end; s0 += 32) {
                i64 my_offset = 0;
                A my_weight = 0;
                if (s0 + lane < my_end) source(s0 + lane, my_offset, my_weight);
                gather_rows<T, A>(q, my_offset, my_weight, min(32, my_end - s0), dim0, valid, vector, acc);
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) sPartial[warp * DIM_CHUNK + lane * 4 + e] = acc[e];
            __syncthreads();
            if (warp == 0) {
                A sum[4] = {0, 0, 0, 0};
                for (int w = 0; w < warps; ++w)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sum[e] += sPartial[w * DIM_CHUNK + lane * 4 + e];
                store_row(row, dim0, valid, sum);
            }
            __syncthreads();
        }
    }
}

// dD of the two-launch backward: blocks (document, row group) from the global inverse CSR;
// blocks past the documents (x >= num_docs) sum the dQ partials instead (maxsim_bwd_dq_reduce).
template <typename T, bool WIDE>
__device__ __forceinline__ void maxsim_bwd_dd(const BackwardArgs& args) {
    if ((i64)blockIdx.x >= args.num_docs) {
        maxsim_bwd_dq_reduce<T>(args, (blockIdx.x - args.num_docs) * (i64)gridDim.y + blockIdx.y,
                                (gridDim.x - args.num_docs) * (i64)gridDim.y);
        return;
    }
    const i64 doc = blockIdx.x;
    i64 doc_base, length, first_token;
    bwd_doc_extent(args, doc, doc_base, length, first_token);
    const i64 row0 = args.offsets == nullptr ? doc * length : first_token;
    dd_row_group<T, WIDE>(args, doc, blockIdx.y, (int)length, row0, args.sources + doc * args.sources_per_doc,
                    args.row_ranges + 2 * (row0 + doc), false);
}

// The first launch of a backward: blocks [0, num_docs) invert one document's winners each
// (build_inverse_csr, which needs only the winners), the blocks after them compute dQ, the
// grid (x: query tokens, y: dim chunks, z: document chunks) flattened in that order. One
// launch instead of two, and the CSR's latency-bound blocks run beside dQ's gathers.
template <typename T, bool WIDE>
__device__ __forceinline__ void maxsim_bwd_csr_dq(const BackwardArgs& args) {
    if ((i64)blockIdx.x < args.num_docs) {
        build_inverse_csr(args, blockIdx.x);
        return;
    }
    // 32-bit: the whole grid is under 2^31 blocks (64-bit division costs registers dQ has not).
    const u32 dq_block = blockIdx.x - (u32)args.num_docs;
    const u32 tokens_per_block = blockDim.x >> 5;
    const u32 grid_x = (u32)(((i64)args.num_queries * args.query_length + tokens_per_block - 1) / tokens_per_block);
    const u32 grid_y = (args.dim + bwd::DIM_CHUNK - 1) / bwd::DIM_CHUNK;
    maxsim_bwd_dq<T, WIDE>(args, dq_block % grid_x, (int)(dq_block / grid_x % grid_y), dq_block / (grid_x * grid_y));
}

// The one-launch backward, where a document's sources fit in shared memory (_plan/configs.py
// decides): blocks [0, dQ's) compute dQ in one document chunk (grad_q written directly), the
// blocks after them dD, one per (document, row group of warps * rows_per_warp rows), each
// inverting only the winners in its own rows, into lists in its shared
// memory, then summing them. No block waits on another: no scratch, no second launch, and a
// training step's backward costs one launch of host time (on torch's backward thread, where a
// launch took 13 us on the H200: bench/results/host-timeline-ab-2026-11-30-a8ca6d6.txt).
// Shared memory (dynamic, bytes): 4 * (warps * R + 4 * (R + 1) + S), R = warps * rows_per_warp,
// S = sources_per_doc; _plan/configs.py mirrors this formula.
template <typename T, bool WIDE>
__device__ __forceinline__ void maxsim_bwd_fused(const BackwardArgs& args) {
    extern __shared__ __align__(16) unsigned char smem[];
    // Grid (dQ columns + documents, row groups): dQ's blocks fill the first columns (linear index
    // x * groups + y, up to grid_x * grid_y), document n's row groups column dQ's + n. A
    // document and its group are then special registers less a parameter, which the dD walk
    // re-reads instead of holding them (its 64 registers are all taken).
    const u32 tokens_per_block = blockDim.x >> 5;
    const u32 grid_x = (u32)(((i64)args.num_queries * args.query_length + tokens_per_block - 1) / tokens_per_block);
    const u32 grid_y = (args.dim + bwd::DIM_CHUNK - 1) / bwd::DIM_CHUNK;
    const u32 dq_columns = (grid_x * grid_y + gridDim.y - 1) / gridDim.y;
    if (blockIdx.x < dq_columns) {
        const u32 dq_block = blockIdx.x * gridDim.y + blockIdx.y;
        if (dq_block < grid_x * grid_y) maxsim_bwd_dq<T, WIDE>(args, dq_block % grid_x, (int)(dq_block / grid_x), 0);
        return;
    }
    const i64 doc = blockIdx.x - dq_columns;
    i64 doc_base, length64, first_token;
    bwd_doc_extent(args, doc, doc_base, length64, first_token);
    const int length = (int)length64;
    const int warps = blockDim.x >> 5, block_rows = warps * args.rows_per_warp;
    const int row_begin = blockIdx.y * block_rows;
    if (row_begin >= length) return;  // the whole block: a shorter document
    const int rows = min(block_rows, length - row_begin);
    // The list first and the ranges after it: their addresses are a parameter away from the
    // shared base, re-read by the dD walk rather than held.
    int* list = (int*)smem;                                 // [sources_per_doc]
    int* ranges = list + args.sources_per_doc;              // [2 * (block_rows + 1)]
    int* counts = ranges + 2 * (block_rows + 1);            // [warps][block_rows]
    int* light = counts + warps * block_rows;               // [block_rows + 1]
    int* hot = light + block_rows + 1;                      // [block_rows + 1]
    invert_winners(args, doc, length, row_begin, rows, warps, counts, light, hot, list, ranges);
    dd_row_group<T, WIDE>(args, doc, blockIdx.y, length, args.offsets == nullptr ? doc * length : first_token, list, ranges,
                    true);
}

// 256 threads: the block size each kernel is launched with (_plan/configs.BWD_THREADS); MIN_BLOCKS:
// per SM. WIDE: the 16-byte layout (gather_rows_wide) for 16-bit rows on 16 bytes with dense dD
// rows (_plan/backward.py picks the _wide kernels), a kernel of its own so that each layout gets the
// registers it needs.
#define MAXSIM_BWD_ENTRY(NAME, STAGE, T, WIDE, MIN_BLOCKS)                                         \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) NAME(const BackwardArgs args) { \
        STAGE<T, WIDE>(args);                                                                  \
    }
MAXSIM_BWD_ENTRY(maxsim_bwd_csr_dq_fp16, maxsim_bwd_csr_dq, fp16_t, false, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_csr_dq_bf16, maxsim_bwd_csr_dq, bf16_t, false, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_csr_dq_fp32, maxsim_bwd_csr_dq, float, false, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_csr_dq_fp64, maxsim_bwd_csr_dq, double, false, 1)  // registers
MAXSIM_BWD_ENTRY(maxsim_bwd_csr_dq_fp16_wide, maxsim_bwd_csr_dq, fp16_t, true, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_csr_dq_bf16_wide, maxsim_bwd_csr_dq, bf16_t, true, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_dd_fp16, maxsim_bwd_dd, fp16_t, false, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_dd_bf16, maxsim_bwd_dd, bf16_t, false, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_dd_fp32, maxsim_bwd_dd, float, false, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_dd_fp64, maxsim_bwd_dd, double, false, 1)  // registers
MAXSIM_BWD_ENTRY(maxsim_bwd_dd_fp16_wide, maxsim_bwd_dd, fp16_t, true, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_dd_bf16_wide, maxsim_bwd_dd, bf16_t, true, MAXSIM_BWD_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_fused_fp16, maxsim_bwd_fused, fp16_t, false, MAXSIM_BWD_FUSED_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_fused_bf16, maxsim_bwd_fused, bf16_t, false, MAXSIM_BWD_FUSED_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_fused_fp32, maxsim_bwd_fused, float, false, MAXSIM_BWD_FUSED_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_fused_fp64, maxsim_bwd_fused, double, false, 1)  // registers
MAXSIM_BWD_ENTRY(maxsim_bwd_fused_fp16_wide, maxsim_bwd_fused, fp16_t, true, MAXSIM_BWD_FUSED_MIN_BLOCKS)
MAXSIM_BWD_ENTRY(maxsim_bwd_fused_bf16_wide, maxsim_bwd_fused, bf16_t, true, MAXSIM_BWD_FUSED_MIN_BLOCKS)
