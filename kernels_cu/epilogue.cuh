// epilogue.cuh: the per-document epilogue every forward kernel shares. A finished document's
// maxima (one per query token) become its winners (the argmax) and one score per query, under
// the MaxSim semantics: a masked query token adds 0 and has no winner; a document without a
// real token scores -inf and has no winners; a non-finite similarity between real tokens makes
// the score NaN. emit_score is the one place a score reaches memory: a fused top-k offers the
// document there instead.
#pragma once

// The score of a document from its query tokens' summed maxima.
template <typename A> __device__ __forceinline__ A document_score(A sum, bool doc_has_row, bool non_finite) {
    return !doc_has_row ? (A)MAXSIM_NEG_INF : non_finite ? (A)__int_as_float(0x7fffffff) : sum;
}

// Query `query`'s score of document `doc`, written where ForwardArgs says.
template <typename A> __device__ __forceinline__ void emit_score(const ForwardArgs& args, i64 query, i64 doc, A score) {
    ((A*)args.out)[query * args.out_query_stride + doc] = score;
}

// A finished document for query `query`, by one warp, its lanes over the query's tokens (the
// tensor-core kernels). `tokens` is the kernel's view of its per-document buffers, asked in
// this order, each only when needed (the kernels run this with their accumulators live, at the
// register limit): real(i): token i is a real query token (not masked or padding);
// max(i, winner): its max over the document's real rows (before the query scale), setting
// `winner` where the max's reduction finds it; winner(i, found): its winning row; scale(i) (int8)
// and bad(i): the token's scale and whether it holds NaN or inf. doc_has_row: the document has
// a real token; doc_bad: one of its real rows is not finite.
template <bool ARGMAX, bool SCALED, typename Tokens>
__device__ __forceinline__ void warp_finish_document(const ForwardArgs& args, i64 query, i64 doc, int lane,
                                                     bool doc_has_row, bool doc_bad, const Tokens& tokens) {
    float sum = 0.f;
    bool non_finite = false;
    for (int i = lane; i < args.query_length; i += 32) {
        const i64 argmax_index = query * args.argmax_query_stride + doc * args.argmax_doc_stride + i;
        if (!tokens.real(i)) {
            if constexpr (ARGMAX) store_argmax(args.argmax, args.argmax_is_32bit, argmax_index, -1);
            continue;
        }
        int found = -1;
        float m = tokens.max(i, found);
        if constexpr (ARGMAX)
            store_argmax(args.argmax, args.argmax_is_32bit, argmax_index, !doc_has_row ? -1 : tokens.winner(i, found));
        if constexpr (SCALED) m *= tokens.scale(i);
        non_finite |= !(m < MAXSIM_INF) || m == MAXSIM_NEG_INF || tokens.bad(i) || doc_bad;
        sum += m;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    non_finite = __any_sync(0xffffffffu, non_finite);
    if (lane == 0) emit_score(args, query, doc, document_score(sum, doc_has_row, non_finite));
}

// A part of a document instead of the whole (one query group's split rings at fat dims:
// _forward's document parts, whose records maxsim_parts_merge folds into the document's score):
// record `part` of query `query` (Lq + 1 floats from args.out + (query * out_query_stride +
// part) * (Lq + 1)) holds each query token's max over the part's real rows as the score would
// add it (scaled; NaN where the token itself is not finite; 0 for a token that is not real,
// which adds nothing), then the part's flags: 1 it has a real row, 2 one is not finite. The
// max over a document's parts is the max over its rows (max_nan is exact in any grouping, and
// scaling by a positive scale keeps the order), so the merged score is the whole document's.
template <bool SCALED, typename Tokens>
__device__ __forceinline__ void warp_emit_part(const ForwardArgs& args, i64 query, i64 part, int lane, bool has_row,
                                               bool bad, const Tokens& tokens) {
    float* record = (float*)args.out + (query * args.out_query_stride + part) * (args.query_length + 1);
    for (int i = lane; i < args.query_length; i += 32) {
        float m = 0.f;
        if (tokens.real(i)) {
            int found = -1;
            m = tokens.max(i, found);
            if constexpr (SCALED) m *= tokens.scale(i);
            if (tokens.bad(i)) m = __int_as_float(0x7fffffff);
        }
        record[i] = m;
    }
    if (lane == 0) record[args.query_length] = __int_as_float((has_row ? 1 : 0) | (bad ? 2 : 0));
}
