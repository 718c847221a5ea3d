// maxsim_fwd_simt.cu: MaxSim forward on CUDA cores, for what the tensor-core kernel does not
// take: float32 (scored to fp32 accuracy, not tf32), float64 (computed in float64), and
// fp16 / bf16 / int8 inputs that are misaligned, have a dim that is not a whole number of
// 16-byte chunks, or a dim too large for the resident query block. int8 similarities are
// q_scale * d_scale * dot, scaled before the max. Any stride, any dim, sm_80 and later (sm_60 would do).
//
// Mapping. A 1-D grid strides over (query, document) pairs (pair = query * Nd + doc; in pairs
// mode pair = doc = query). A block of SIMT_THREADS threads gives each thread one query token
// (tid, tid + SIMT_THREADS, ... for long queries) and walks the document in chunks of
// rows_per_chunk tokens staged in shared memory, converted to the accumulator type; each
// thread keeps its token's running max in a register. A fixed-order tree then sums the
// per-token maxima, so results are bitwise reproducible.
//
// Shared memory (dynamic, bytes): rows_per_chunk * dim * sizeof(accumulator) for the chunk,
// plus (SIMT_THREADS + rows_per_chunk) * sizeof(accumulator) + rows_per_chunk + SIMT_THREADS
// for the reduction, row scales, validity flags and non-finite flags; _plan/configs.py mirrors
// this formula.
//
// Semantics match maxsim_fwd.cu: masked document tokens never win, masked query tokens add
// nothing, a document with no real token scores -inf, and a non-finite similarity between
// real tokens makes the score NaN. With args.argmax set (training) each token's winning row
// is saved as in maxsim_fwd.cu (first maximum wins; -1 for a masked token or empty document).

#ifndef MAXSIM_SIMT_THREADS
#define MAXSIM_SIMT_THREADS 128
#endif

template <typename T>
__device__ __forceinline__ void maxsim_fwd_simt(const ForwardArgs args) {
    typedef typename Codec<T>::Acc A;
    const T* __restrict__ q = (const T*)args.q;
    const T* __restrict__ d = (const T*)args.d;
    const unsigned char* __restrict__ q_mask = args.q_mask;
    const unsigned char* __restrict__ d_mask = args.d_mask;
    const i64 q_query_stride = args.q_query_stride, q_row_stride = args.q_row_stride;
    const i64 q_dim_stride = args.q_dim_stride, q_mask_query_stride = args.q_mask_query_stride;
    const i64 q_mask_row_stride = args.q_mask_row_stride, d_row_stride = args.d_row_stride;
    const i64 d_dim_stride = args.d_dim_stride, d_mask_doc_stride = args.d_mask_doc_stride;
    const i64 d_mask_row_stride = args.d_mask_row_stride, num_docs = args.num_docs;
    const int num_queries = args.num_queries, query_length = args.query_length, dim = args.dim;
    const int rows_per_chunk = args.rows_per_chunk, pairs = args.pairs;
    // int8: similarity = q_scale[i] * d_scale[j] * dot, applied before the max.
    constexpr bool SCALED = Codec<T>::SCALED;
    constexpr int THREADS = MAXSIM_SIMT_THREADS;
    extern __shared__ __align__(16) unsigned char smem[];
    A* sRows = (A*)smem;
    A* sPartial = sRows + (i64)rows_per_chunk * dim;
    A* sRowScale = sPartial + THREADS;
    unsigned char* sRowReal = (unsigned char*)(sRowScale + rows_per_chunk);
    unsigned char* sNonFinite = sRowReal + rows_per_chunk;

    const int tid = threadIdx.x;
    const A neg_inf = (A)MAXSIM_NEG_INF, pos_inf = (A)MAXSIM_INF;
    const DocLayout layout = make_doc_layout(args.d_doc_stride, d_row_stride, args.doc_length,
                                             args.offsets, args.offsets_are_64bit);

    const i64 total = pairs ? num_docs : (i64)num_queries * num_docs;
    for (i64 pair = blockIdx.x; pair < total; pair += gridDim.x) {
        const i64 query = pairs ? pair : pair / num_docs;
        const i64 doc = pairs ? pair : pair % num_docs;
        i64 base, length, first_token;
        doc_extent(layout, doc, base, length, first_token);
        const i64 scale_base = args.offsets == nullptr ? doc * args.d_scale_doc_stride
                                                       : first_token * args.d_scale_row_stride;

        A partial = 0;
        bool non_finite = false, doc_has_row = false;
        for (int token0 = 0; token0 < query_length; token0 += THREADS) {
            const int token = token0 + tid;
            bool active = token < query_length;
            if (active && q_mask != nullptr)
                active = q_mask[query * q_mask_query_stride + token * q_mask_row_stride] != 0;
            const T* q_row = q + query * q_query_stride + (i64)token * q_row_stride;
            A q_token_scale = 1;
            if constexpr (SCALED)
                if (active)
                    q_token_scale = args.q_scale[query * args.q_scale_query_stride +
                                                 token * args.q_scale_row_stride];
            A best = neg_inf, lowest = pos_inf;
            int best_row = -1;
            for (i64 row0 = 0; row0 < length; row0 += rows_per_chunk) {
                const int rows = (int)min((i64)rows_per_chunk, length - row0);
                __syncthreads();  // the previous chunk is no longer read
                for (int r = tid; r < rows; r += THREADS) {
                    bool real = true;
                    if (d_mask != nullptr)
                        real = d_mask[doc * d_mask_doc_stride + (row0 + r) * d_mask_row_stride] != 0;
                    sRowReal[r] = real;
                    if constexpr (SCALED)
                        sRowScale[r] = args.d_scale[scale_base + (row0 + r) * args.d_scale_row_stride];
                }
                for (i64 e = tid; e < (i64)rows * dim; e += THREADS) {
                    const int r = (int)(e / dim), k = (int)(e % dim);
                    sRows[e] = convert<A, T>(d[base + (row0 + r) * d_row_stride + k * d_dim_stride]);
                }
                __syncthreads();
                for (int r = 0; r < rows; ++r) {
                    if (!sRowReal[r]) continue;
                    doc_has_row = true;
                    if (!active) continue;
                    A dot = 0;
                    const A* row = sRows + (i64)r * dim;
                    for (int k = 0; k < dim; ++k)
                        dot += convert<A, T>(q_row[k * q_dim_stride]) * row[k];
                    if constexpr (SCALED) dot = dot * q_token_scale * sRowScale[r];
                    if (dot > best) best_row = (int)(row0 + r);  // strict: the first maximum wins
                    best = max_nan(best, dot);
                    lowest = min_plain(lowest, dot);
                }
            }
            if (active && doc_has_row) {
                non_finite |= !(best < pos_inf) || lowest == neg_inf;
                partial += best;
            }
            if (args.argmax != nullptr && token < query_length)
                store_argmax(args.argmax, args.argmax_is_32bit,
                             query * args.argmax_query_stride + doc * args.argmax_doc_stride + token,
                             active && doc_has_row ? best_row : -1);
        }

        sPartial[tid] = partial;
        sNonFinite[tid] = non_finite;
        __syncthreads();
        for (int width = THREADS / 2; width > 0; width >>= 1) {
            if (tid < width) {
                sPartial[tid] += sPartial[tid + width];
                sNonFinite[tid] |= sNonFinite[tid + width];
            }
            __syncthreads();
        }
        if (tid == 0) emit_score(args, query, doc, document_score(sPartial[0], doc_has_row, sNonFinite[0] != 0));
        __syncthreads();  // sPartial is reused by the next pair
    }
}

#define MAXSIM_FWD_SIMT_ENTRY(NAME, T)                                                      \
    extern "C" __global__ void __launch_bounds__(MAXSIM_SIMT_THREADS, 1) NAME(const ForwardArgs args) { \
        maxsim_fwd_simt<T>(args);                                                          \
    }

MAXSIM_FWD_SIMT_ENTRY(maxsim_fwd_simt_fp16, fp16_t)
MAXSIM_FWD_SIMT_ENTRY(maxsim_fwd_simt_bf16, bf16_t)
MAXSIM_FWD_SIMT_ENTRY(maxsim_fwd_simt_fp32, float)
MAXSIM_FWD_SIMT_ENTRY(maxsim_fwd_simt_fp64, double)
MAXSIM_FWD_SIMT_ENTRY(maxsim_fwd_simt_int8, i8)
