// maxsim_parts.cu: documents scored in parts (_forward's document parts). One query group at
// fat dims reads a few fat documents a ring (fp32 dim 2560: 1,302 documents of 3 MB over 396
// rings), and a block's last document, read by one ring alone, was the call's tail (0.92 of the
// floor on an H100). Scored as parts of whole tiles (packed tokens, every part its own
// "document"), the rings take units a fraction of a document long; the forward writes each
// part's record (epilogue.cuh, warp_emit_part) and maxsim_parts_merge folds a document's
// records into its score by the epilogue every forward shares (warp_finish_document).

// Part p of document n covers its tiles [p T / parts, (p + 1) T / parts) of T = ceil(length /
// tile_rows), as packed tokens: part_offsets[n * parts + p] is its first token (a part of no
// tiles is empty), part_offsets[num_docs * parts] the last document's end. Documents are the
// packed `offsets` (int32 or int64, `is_64bit`), or padded ones of `doc_length` tokens each,
// back to back (offsets null).
__device__ __forceinline__ void parts_offsets(const void* offsets, int is_64bit, i64 doc_length, i64 num_docs,
                                              int parts, int tile_rows, i64* part_offsets) {
    auto at = [&](i64 i) -> i64 {
        if (offsets == nullptr) return i * doc_length;
        return is_64bit ? ((const i64*)offsets)[i] : (i64)((const int*)offsets)[i];
    };
    const i64 count = num_docs * parts;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i <= count; i += (i64)gridDim.x * blockDim.x) {
        if (i == count) {
            part_offsets[i] = at(num_docs);
            continue;
        }
        const i64 doc = i / parts, part = i % parts, first = at(doc), end = at(doc + 1);
        const i64 tiles = (end - first + tile_rows - 1) / tile_rows;
        part_offsets[i] = min(first + tile_rows * (part * tiles / parts), end);
    }
}

// A document's query tokens as warp_finish_document reads them: each token's max over the
// records of the parts that have a real row (`rows`: bit p for part p).
struct MergedParts {
    const float* first;  // the document's first part's record
    int parts, record;   // its parts, and the floats a record (Lq + 1)
    unsigned rows;
    __device__ __forceinline__ bool real(int) const { return true; }  // (a token that is not real: 0 in every record)
    __device__ __forceinline__ float max(int i, int&) const {
        float m = -MAXSIM_FLT_MAX;  // (no part has a row: the score is -inf whatever this is)
        for (int p = 0; p < parts; ++p)
            if (rows >> p & 1) m = max_nan(m, first[p * record + i]);
        return m;
    }
    __device__ __forceinline__ int winner(int, int found) const { return found; }
    __device__ __forceinline__ float scale(int) const { return 1.f; }
    __device__ __forceinline__ bool bad(int) const { return false; }  // (NaN in its records)
};

// One warp a (query, document) of the problem `args` describes (its scores' out and strides):
// the records of its `parts` parts (at most 32) from `records`, laid out as the forward wrote
// them for num_docs * parts documents.
__device__ __forceinline__ void parts_merge(const ForwardArgs& args, const float* records, int parts) {
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x / 32);
    const int record = args.query_length + 1;
    for (i64 w = ((i64)blockIdx.x * blockDim.x + threadIdx.x) / 32; w < (i64)args.num_queries * args.num_docs;
         w += warps) {
        const i64 query = w / args.num_docs, doc = w % args.num_docs;
        const float* first = records + (query * args.num_docs + doc) * parts * record;
        const int flags = lane < parts ? __float_as_int(first[lane * record + args.query_length]) : 0;
        const unsigned rows = __ballot_sync(0xffffffffu, flags & 1);
        const bool bad = __any_sync(0xffffffffu, flags & 2);
        warp_finish_document<false, false>(args, query, doc, lane, rows != 0, bad, MergedParts{first, parts, record, rows});
    }
}

// The merge's second argument, one struct (a prepared launch's arguments are ForwardArgs and one
// struct after it: _gpu/args.ArgTemplate; _gpu/launch.part_records packs it).
struct PartRecords {
    const float* records;
    int parts;
};

// THREADS: the block size _gpu/launch launches these with.
#define MAXSIM_PARTS_ENTRY(NAME, THREADS)                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const void* offsets, int is_64bit, i64 doc_length, \
                                                               i64 num_docs, int parts, int tile_rows,          \
                                                               i64* part_offsets) {                           \
        parts_offsets(offsets, is_64bit, doc_length, num_docs, parts, tile_rows, part_offsets);                \
    }
#define MAXSIM_MERGE_ENTRY(NAME, THREADS)                                                                     \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const ForwardArgs args, const PartRecords parts) { \
        parts_merge(args, parts.records, parts.parts);                                                        \
    }
MAXSIM_PARTS_ENTRY(maxsim_parts_offsets, 256)
MAXSIM_MERGE_ENTRY(maxsim_parts_merge, 256)
