// maxsim_fwd_wgmma.cu: fused MaxSim forward for many stacked queries on Hopper (sm_90a):
// warpgroup MMA (wgmma.mma_async), queries from registers, document tiles from shared memory,
// a producer warpgroup feeding the tensor cores through an mbarrier ring.
//
//   out[q, n] = sum over real query tokens i of  max over real doc tokens j of  <q_i, d_nj>
//
// Why a second forward kernel. With mma.sync (maxsim_fwd.cu) every stacked query fragment is
// re-read from shared memory for every document tile, and the epilogue sits between MMAs, so
// many-query shapes are bound by shared-memory bandwidth and instruction issue. Here the roles
// swap: query tokens are the wgmma M dimension (64 rows per warpgroup, their A fragments
// loaded once into registers for the block's lifetime) and document tokens the N dimension
// (a tile of TILE_N = 64 or 128 rows read by the tensor cores straight from shared memory). The
// MMA runs asynchronously. With 64-row tiles, while the tensor cores work on tile t the warps
// fold tile t-1 (two accumulator sets) into a running max along each accumulator row, two rows
// per thread; with 128-row tiles (one set: the registers of two) a warpgroup multiplies, then
// folds, while the block's other warpgroups keep the tensor cores busy.
//
// Roles. A block has WARPGROUPS (2 or 3) consumer warpgroups and one producer warpgroup. The
// producer streams the block's document tiles into a STAGES-deep ring (TMA or cp.async, below)
// and publishes each one on its "full" mbarrier; consumers release a slot on its "empty"
// mbarrier once their MMAs on it are done. There is no block-wide barrier in the main loop: a
// consumer warpgroup never waits for another, nor for the loads of tiles it does not need yet.
// Each warpgroup owns whole queries (GROUP_ROWS / Lq of them, query j's token i at row
// query_row_of(j * Lq + i)) and sums its own scores with a warpgroup-local named barrier per
// document. With one query group (SPLIT_DOCS, memory-bound) the warpgroups hold the same
// queries instead and split the block's documents, each taking them from a ring of its own
// (STAGES / WARPGROUPS slots) fed by a producer warp of its own, which claims the block's next
// document whenever it opens one. With many queries (DOCS_ON_M, below) the document tiles are
// the MMA's A and the queries its B.
//
// Mapping. grid.x is a contiguous range of documents (persistent), grid.y a query group of
// WARPGROUPS * (GROUP_ROWS / Lq) queries (one warpgroup's worth when splitting documents).
// Every document starts a new tile; its last tile is partial and biased. A tile read from L2
// serves every row of the block.
//
// Shared-memory tile layout (what the wgmma descriptor describes): K-major with the 128-byte
// swizzle, as TMA would write it: the tile is split in k into atoms of 128 bytes per row, and
// within a row the 16-byte chunk c sits at position c ^ (row % 8). The producer's lanes
// 8k..8k+7 copy one row's 128-byte line of an atom: one full line of global memory, 8 distinct
// bank groups of shared memory. A k-step of the MMA is the descriptor advanced 32 bytes within
// an atom, or to the next atom.
//
// Copies. Where the operands meet TMA's rules (_gpu/tma.doc_tile_map), one producer lane
// issues each tile as TMA boxes (the tensor memory accelerator swizzles them, and fills rows
// past the tensor with zeros; a packed document's last tile holds the next document's first
// tokens, masked rows whatever they hold); otherwise the producer warpgroup copies with
// cp.async and zero-fills padding and masked rows itself, and the chunks past a dim that is
// not a multiple of 16 bytes; rows whose starts sit on 4 or 8 bytes only (dim 100 in 16-bit,
// a view shifted off 16 bytes) are copied in pieces of LOAD_BYTES (codecs.cuh, copy_chunk).
//
// Masks, non-finite inputs, int8 scales and the argmax follow maxsim_fwd.cu exactly: the
// consumers replace the similarities of padding, masked and past-the-document columns by
// -FLT_MAX (from the tile's length and the mask, only in tiles that have such columns), so that
// whatever those rows hold cannot leak; a document with no real token scores -inf; a
// non-finite query token is flagged and zeroed once; a non-finite document element shows up in
// every row's similarities with its column, so every thread sums one row over the document's
// real columns as a witness (DOCS_ON_M: its real rows against one query column; int8 elements
// are finite, so there the witness checks the document scales); ties in the argmax go to the
// lowest document-token index.
//
// Shared memory (dynamic, bytes; SHARED_BYTES): 1024 for alignment, STAGES * TILE_BYTES for
// the tile ring (a slot: a tile's ATOMS atoms, or streaming k one; STREAM_QUERY then its
// SLOT_QUERY_BYTES of query atoms after the document's, and no query block), QUERY_BYTES for the query
// block (QUERY_ROWS * LDS * 2, read once into registers; streaming k its 32 real rows, read per
// atom; or with DOCS_ON_M held there in the swizzled layout, WARPGROUPS * ATOMS * 16384), then
// 4 * (STAGES * TILE_N + 3 * QUERY_ROWS + (1 + ARGMAX) * MAX_SLOTS + 4 * WARPS) for
// document scales, the row (DOCS_ON_M: per-warp column) maxima and argmax of two documents in
// flight, per-row query index, scale and non-finite flag, and per-warp document
// flags, then 16 * STAGES for the mbarriers and 16 * STAGES + 8 for the document claims
// (splitting documents: each slot's document position and length, the block's counter), and
// for TF32 builds (fp32) 2 * WARPGROUPS * ATOM_BYTES after the ring (each warpgroup's two
// buffers of an atom's small halves), for the fp32 split build SPLIT_STAGES * SPLIT_STAGE_BYTES
// there (its producer's staged float32 chunks);
// _plan/configs.WgmmaConfig mirrors this formula (the compile checks assert it).
//
// Preconditions (checked in Python): as maxsim_fwd.cu, plus query_length <= 64, KSTEPS even
// and <= 8 (streaming k: a multiple of 4, at least the dim's), LOAD_BYTES at least 4 (cp.async's
// smallest piece); not pairs mode.

#ifndef MAXSIM_WARPGROUPS
#define MAXSIM_WARPGROUPS 3
#endif
#ifndef MAXSIM_STAGES
#define MAXSIM_STAGES 6
#endif
#ifndef MAXSIM_KSTEPS
#define MAXSIM_KSTEPS 8
#endif
#ifndef MAXSIM_ARGMAX
#define MAXSIM_ARGMAX 0
#endif
#ifndef MAXSIM_TILE_N
#define MAXSIM_TILE_N 64
#endif
#ifndef MAXSIM_SPLIT_DOCS
#define MAXSIM_SPLIT_DOCS 0
#endif
#ifndef MAXSIM_HALF_ROWS
#define MAXSIM_HALF_ROWS 0
#endif
#ifndef MAXSIM_DOCS_ON_M
#define MAXSIM_DOCS_ON_M 0
#endif
#ifndef MAXSIM_STREAM_K
#define MAXSIM_STREAM_K 0
#endif
#ifndef MAXSIM_TF32
#define MAXSIM_TF32 0
#endif
#ifndef MAXSIM_STREAM_QUERY
#define MAXSIM_STREAM_QUERY 0
#endif
#ifndef MAXSIM_TURNS
#define MAXSIM_TURNS 0
#endif
#ifndef MAXSIM_FP32_SPLIT
#define MAXSIM_FP32_SPLIT 0
#endif
#ifndef MAXSIM_TF32_STRETCH
#define MAXSIM_TF32_STRETCH 0
#endif
#ifndef MAXSIM_PART_MAXIMA
#define MAXSIM_PART_MAXIMA 0
#endif

namespace wg {
constexpr int WARPGROUPS = MAXSIM_WARPGROUPS, STAGES = MAXSIM_STAGES, KSTEPS = MAXSIM_KSTEPS;
constexpr bool ARGMAX = MAXSIM_ARGMAX != 0;
constexpr bool SPLIT_DOCS = MAXSIM_SPLIT_DOCS != 0;  // see below
// HALF_ROWS (splitting documents, at most 32 query rows: one query of <= 32 tokens): the query
// rows sit in the first 8 of every warp's 16 accumulator rows, so that each thread's second
// row (lane/4 + 8) is padding and its fold is skipped: the fold's work halves on every
// scheduler, where rows 32-63 of the warpgroup would leave two of its four warps folding zeros.
constexpr bool HALF_ROWS = MAXSIM_HALF_ROWS != 0;
constexpr int ROW_HALVES = HALF_ROWS ? 1 : 2;  // accumulator rows per thread that hold query rows
constexpr int CONSUMER_WARPS = 4 * WARPGROUPS, WARPS = CONSUMER_WARPS + 4;  // + the producer group
constexpr int CONSUMER_THREADS = 32 * CONSUMER_WARPS;
constexpr int THREADS = 32 * WARPS;
// Registers: the launch gives every thread 65536 / THREADS; the producer warpgroup hands most
// of its share to the consumers (setmaxnreg), which hold two accumulator sets and the query
// fragments.
// int8 consumers also scale every column (more registers); with three of them their producer
// must fit in fewer (it copies fewer bytes per row): 32 leaves the consumers their 160.
template <typename T> __host__ __device__ constexpr int producer_registers() {
    // Splitting documents, a producer warp copies whole tiles (more addresses in flight) for
    // consumers with one accumulator set.
    // The fp32 split builds: 88 (the staged producer splits the documents itself; the presplit
    // one's TMA producer spilled at 56), their two consumer warpgroups keep 208, with the
    // flushes' sums.
    return MAXSIM_FP32_SPLIT ? 88 : SPLIT_DOCS ? 80 : Codec<T>::SCALED && WARPGROUPS > 2 ? 32 : 56;
}
template <typename T> __host__ __device__ constexpr int consumer_registers() {
    const int pool = 65536 / THREADS * THREADS;
    const int share = (pool - 128 * producer_registers<T>()) / (128 * WARPGROUPS) / 8 * 8;
    return share > 240 ? 240 : share;
}
static_assert(WARPGROUPS >= 2 && WARPGROUPS <= 3, "consumers need 144-152 registers: at most 3 warpgroups");
constexpr int TILE_N = MAXSIM_TILE_N;        // document rows per tile (the wgmma N)
// DOCS_ON_M (many queries, compute-bound): the roles of the operands swap. A document tile is
// the wgmma's A (its 64 rows the M dimension, read by descriptor from the ring) and a
// warpgroup's QUERY_COLS query rows its B (N = 128: four 32-token queries, staged once in the
// same swizzled layout). The max over a document's rows is then an element-wise running max
// per query column across its tiles (each thread's two rows folded at once; a document's first
// tile starts them), and the reduction across lanes and warps happens once per document instead
// of once per tile (across the 8 lanes of a quad by halves: keep_max_of_halves); each
// m64n128k16 does twice the work of an m64n64k16 per instruction. The argmax adds a winning row
// per column, two 16-bit rows per register (only int16 winners are saved this way), which three
// warpgroups' registers hold (int8's do not: two warpgroups there, and for dim 256).
// A document's close (the reduction, the warpgroup barrier, the sums) leaves the tensor cores
// idle, since every warpgroup reaches a document's end at the same time; issuing the next
// tile's MMAs before it would overlap the two, but ptxas then serializes every wgmma of the
// kernel (a wgmma in flight across the close's divergent code: C7518), which measured slower.
constexpr bool DOCS_ON_M = MAXSIM_DOCS_ON_M != 0;
// M_HALVES (documents on M streaming k, TILE_N 128: fat dims, 16-bit): each warpgroup multiplies
// a slot's 128 document rows as two m64 halves into two accumulator sets against the same query
// atom, so that a query atom read from L2 (streamed: 16 KB a warpgroup a slot) serves 128 rows
// instead of 64. The streaming builds moved 32-71 GB through L2 at 80-83% of its throughput for
// 32 queries (bench/results/ncu-32q-l2-2026-12-06-e0deff3-h100.txt). Its price: 64 more
// accumulator registers a thread (two warpgroups' 224 hold them), slots of 16 KB of documents.
// (The second half's code sits under `if constexpr`: written as loops over the halves, the
// 64-row builds' code changed and the fp32 split's staged build spilled.)
constexpr int M_HALVES = DOCS_ON_M ? MAXSIM_TILE_N / 64 : 1;
// TURNS (documents on M, k resident): the warpgroups hand a tile's MMAs to the tensor cores in
// turns, warpgroup 0, 1, 2, 0, ... (a named barrier each: a warpgroup waits for its turn, issues,
// and passes the turn on), so that the first one's MMAs finish first and it folds while the
// others' multiply, where all three, woken by the same full slot, issued together, finished
// together and folded together with the tensor cores idle (FlashAttention-3's ping-pong
// schedule). Streaming k holds a turn across a tile's slots: the ring could not hold them.
constexpr bool TURNS = MAXSIM_TURNS != 0;
// STREAM_K (one query of at most 32 tokens, dims past 8 k-steps: fat embeddings): a ring slot
// holds one swizzle atom of a tile (128 bytes of each row's k) instead of the whole tile, and a
// tile's atoms follow each other through the ring into one accumulator set; the query stays in
// shared memory (its 32 real rows only, HALF_ROWS), its fragments loaded per atom (ldmatrix).
// KSTEPS is then a capacity (the query block's width); the dim's atoms are counted at run time.
// With DOCS_ON_M (many queries at fat dims, 320 fp16 and 640 int8 in two warpgroups' blocks) the
// same ring of atoms feeds every warpgroup, each multiplying an atom against the same atom of its
// resident query block; a slot is freed once the next atom's MMAs are in the tensor cores' hands.
constexpr bool STREAM_K = MAXSIM_STREAM_K != 0;
// STREAM_QUERY (DOCS_ON_M and STREAM_K, dims whose query blocks do not fit: past 320 fp16): the
// query blocks stream too, each ring slot holding the documents' atom and, after it, every
// warpgroup's query atom for the same k (one TMA box of its queries' rows from q as it is).
// Nothing zeroes the query rows: a masked or padding row (another group's query, or stale bytes
// past the box) only fills its own column, which no score reads. Non-finite elements (16-bit)
// are found through the similarities themselves, as the reference defines them: the fold takes
// every similarity as nan_if_infinite (an -inf one would lose any max) into NaN-propagating
// maxima, so that a real token's maximum is NaN wherever one of its similarities with a real
// row is not finite (a non-finite element makes every similarity of its row or token so). No
// query column is known to be finite (the witness), and scanning every slot's atoms for them
// held the tensor cores at half their rate (0.54 of it at fp16 dims 768 and 2560, 0.69-0.71
// without the scans: bench/results/cliffs-2026-12-03-scan-ab.txt).
constexpr bool STREAM_QUERY = MAXSIM_STREAM_QUERY != 0;
// MAXSIM_STREAM_QUERY == 2 (a query count that leaves a group's last box short: two to four
// queries, or 10): no box of q's map reaches past q's last query (Block::query_box_first).
// Whole groups keep the plain boxes' code (1): the checks cost them 10-15% as one build
// (bench/results/cliffs-2026-12-03-ab-5bc8257-a8dbb96.txt).
constexpr bool BOXES_WITHIN_Q = MAXSIM_STREAM_QUERY == 2;
// STREAM_QUERY splitting documents (one query at fat dims, streaming k): the query's atom rides
// in each slot after the document's (its rows as q holds them, one box of the group's queries,
// from L2) instead of staying resident, so that the ring, not the query, takes the shared
// memory: a resident query of dim 2560 (164 KB) left rings of three slots, 0.90 of the floor
// (bench/results/cliffs-2026-12-03-9bc7498-stream-wg-fp32.txt). Query rows past the box and
// non-finite query tokens get zero fragments (stream_query_frags), as staging zeroed them.
constexpr bool SPLIT_STREAM_QUERY = STREAM_QUERY && SPLIT_DOCS;
// TF32 (fp32 at fp32 accuracy, streaming k; a module of its own: the fp32 entry alone): every
// element x is taken as big + small, and every product of the four is taken: |x y - (xb +
// xs)(yb + ys)| <= 2^-20 |x y| or so. The query's halves (big = x rounded to TF32 by integer
// ops, an exact TF32 value; small = x - big, exact in fp32, of which the tensor cores keep the
// TF32 bits: common.cuh split_tf32_bits) go to the accumulator rows that half rows leave
// padding: a thread's row lane/4 takes big, its row lane/4 + 8 small (the A registers), so that
// one wgmma multiplies both. Two wgmmas per k-step take the document's halves: big is the atom
// as it landed (the tensor cores read an fp32 operand as TF32 by dropping its 13 low bits), small
// = x - big (truncate_tf32_bits), which the consuming warpgroup writes into a buffer of its own
// once the atom lands. Each warpgroup has two such buffers and two accumulator sets: atom i+1
// is split and handed to the tensor cores while atom i's products are added. Each atom's
// products go into fresh accumulators, added to the tile's sums by rounding FADDs (the
// accumulators' own additions truncate: a bias over a long k). MAXSIM_TF32 == 2 (precision
// "high", opt-in): the document as the tensor cores read fp32 (TF32, at most 2^-10 off an
// element), the query still split: one wgmma a k-step, no split of the atom.
constexpr bool TF32 = MAXSIM_TF32 != 0;
constexpr bool SPLIT_DOCUMENT = MAXSIM_TF32 == 1;
// TF32_DOC_ROWS (MAXSIM_TF32 == 3; one query at fp32 accuracy, the query resident): the split
// rings' documents on M. A slot's atom (64 document rows) is the MMA's A, from registers: each
// thread's fragments loaded once (ldmatrix), x as it is (the tensor cores keep its TF32 bits)
// and its small half x - trunc(x) made in registers. The query is B, staged once split (rows
// 0-31 its big halves, rounded to TF32; 32-63 its small ones, x - big) in swizzled atoms. Three
// m64n32k8 a k-step into one accumulator set, x.qb + xs.qb + x.qs (3xTF32 without the small
// halves' product): 96 query columns of tensor work a k-step where the split document takes
// two m64n64 (128), and no stores of small halves, no fence and no warpgroup barrier an atom;
// the slot is free as soon as its fragments are in registers. An atom's products go into fresh
// accumulators, added to the tile's sums by rounding FADDs (as the split document's). The fold
// is the docs-on-M one over rows (a running max a query column, two rows a thread), reduced at
// a document's end over the lanes of a column and the warps (column maxima, as DOCS_ON_M);
// winners as DOCS_ON_M keeps them (document rows in 16 bits: documents shorter than 32768).
constexpr bool TF32_DOC_ROWS = MAXSIM_TF32 == 3;
// TF32_STRETCH (a split document, > 0): one accumulator set instead of two, the atoms of a tile
// accumulating in it by stretches of TF32_STRETCH atoms (the tensor cores' truncating additions
// over at most 8 TF32_STRETCH MMAs: 1.7e-5 relative over 960 MMAs in the seventeenth session,
// about 0.15 ulp an MMA), each stretch then added to the sums by rounding FADDs; an atom's slot is freed once the atom after it is in the
// tensor cores' hands. One warpgroup's chain an atom (wait, split, barrier, MMAs, the adds) is
// the one-query fp32 forward's pace (bench/results/ncu-fp32-one-query-2026-12-06-c8022da-h100.txt):
// without the second set the registers hold three warpgroups, three chains an SM.
constexpr int TF32_STRETCH = MAXSIM_TF32_STRETCH;
// PART_MAXIMA (one query group's split rings streaming k: _forward's document parts): each
// "document" is a part of one, and its finish writes the part's record (epilogue.cuh,
// warp_emit_part) instead of a score; maxsim_parts.cu merges a document's records.
constexpr bool PART_MAXIMA = MAXSIM_PART_MAXIMA != 0;
static_assert(!PART_MAXIMA || (SPLIT_DOCS && STREAM_K && !ARGMAX), "parts: one query group's streaming builds, no winners");
static_assert(TF32_STRETCH == 0 || SPLIT_DOCUMENT, "stretches of one accumulator set: the split-document builds");
// FP32_SPLIT (fp32 at fp32 accuracy, many queries; a module of its own: the fp32_split entry
// alone): documents on M streaming k and the query atoms, in fp16. Every element is scaled by
// a power of two per token and taken as fp16 big + small (codecs.cuh, fp32_split_t), and
// three products are kept, big.big + big.small + small.big: a k atom of the dim (64 elements)
// becomes three, the documents' [big, small, big] against the queries' [big, big, small], so
// the consumers run the 16-bit build's loop over three times the atoms. The producer's lanes
// convert the documents' float32 rows themselves: each chunk of 64 elements staged by cp.async
// (stage_split_chunk, SPLIT_STAGES ahead), then at its first slot split into that slot's big
// halves and the next slot's small ones (convert_split_chunk: each element read once), its
// third slot a copy of the first (copy_split_big). Converting a chunk ahead into its stage and
// copying each part into its slot as it freed measured 10% slower (one more copy a part:
// bench/results/cliffs-2026-12-05-split-staged-h100.txt). The rows' exponents come from one
// launch before (_gpu/launch.split_exponents), the queries split from q
// (_gpu/launch.split_queries, the same helpers). Scaled as int8 is: a document row's 2^-k in
// the fold, a query token's after its maximum. fp16 runs at
// the bf16 rate, so three products are 1.5 times the MMA work of a bf16 cell of the same bytes,
// where 3xTF32 is 3 (bench/results/split-study-2026-12-05.txt).
constexpr bool FP32_SPLIT = MAXSIM_FP32_SPLIT != 0;
// MAXSIM_FP32_SPLIT 1: the producer splits the documents' float32 rows itself (staged, below);
// 2: the documents come split already (launch.split_documents: fp16 halves [big_c, small_c]
// per 64 elements and their rows' float scales), copied by TMA as 16-bit tiles are (k-atom a
// from stored atom split_document_atom(a): big_c twice), their scales as int8's: the
// consumers' side is the same build.
constexpr bool SPLIT_STAGED = MAXSIM_FP32_SPLIT == 1, SPLIT_BEFORE = MAXSIM_FP32_SPLIT == 2;
constexpr int QUERY_COLS = 128;
constexpr int ACC = DOCS_ON_M ? QUERY_COLS / 2 : TILE_N / 2;  // accumulator registers per thread (64 x N / 128)
// N = 64: two accumulator sets, tile t-1 folded while tile t multiplies. N = 128: one set (the
// registers of two), and the other warpgroups' MMAs run while one folds.
// SPLIT_DOCS (one query group, memory-bound): every consumer warpgroup holds the same query
// rows and takes documents of the block's range as its producer warp claims them (the next
// unclaimed one, so that warpgroups finish together), so that several tile loops run per SM.
// Each warpgroup has a ring of its own (RING slots, fed by a producer warp of its own): in one
// shared ring a warpgroup's next tile could lie a whole ring ahead, where the full barrier's
// parity cannot tell that tile from the slot's previous one. With 128-row tiles one
// accumulator set per warpgroup; with 64-row tiles two (their 32 registers each), as below.
// DOUBLE_BUFFERED (64-row tiles, k resident): two accumulator sets, tile t multiplied while tile
// t-1 is folded. Splitting documents too, up to 4 k-steps: one set left each warpgroup's wait,
// MMA, fold and release serial a tile, and two were 5-14% faster on one query's 64-row tiles
// (ragged packed int8 -12%: bench/results/ab-split-double-buffer-2026-12-04-dafca99.txt); a
// split consumer has 144 registers, and 6-8 k-steps of query fragments beside two sets spilled.
// A step hands tile t to the tensor cores, then folds tile t-1: the two sets alternate, so the
// registers the running MMA writes are never the ones being read. A split ring's end still
// issues its slot's MMAs (into accumulators no one folds, from whatever the slot holds):
// skipping them with the tile before in flight made ptxas serialize every wgmma (C7518).
constexpr bool DOUBLE_BUFFERED = TILE_N == 64 && !STREAM_K && (!SPLIT_DOCS || KSTEPS <= 4);
constexpr int RINGS = SPLIT_DOCS ? WARPGROUPS : 1;
constexpr int RING = STAGES / RINGS;  // slots per ring
// Producer warps copying one ring's tiles with cp.async (one per ring when splitting).
constexpr int COPY_WARPS = SPLIT_DOCS ? 1 : 4;
// FP32_SPLIT: the tile rows a producer lane converts (rows my_row + 4p, p < SPLIT_PASSES).
constexpr int SPLIT_PASSES = TILE_N / COPY_WARPS / 4;
// The producer stages the documents' float32 chunks (64 elements of the dim, a tile's 64 rows)
// in shared memory by cp.async, SPLIT_STAGES chunks ahead of the one it converts: loads into
// registers left one round trip a few rows (a register's worth) in flight, and the split ran at
// a quarter of the bf16 speed, its producer waiting
// (bench/results/cliffs-2026-12-05-7132dad-split-h100.txt). A stage: each producer lane's
// 16-byte pieces of its rows, [row pass][half][lane] (conflict-free), then the tile's 64
// exponents (staged with its first chunk).
constexpr int SPLIT_STAGES = 3;
constexpr int SPLIT_STAGE_BYTES = TILE_N * 64 * 4 + TILE_N * 4;
// The tensor cores' fp32 accumulation truncates: a long k into one accumulator comes out low (a
// bias: 1.7e-5 relative over 960 MMAs, the seventeenth session). The split build's consumers
// start fresh accumulators every SPLIT_FLUSH_ATOMS atoms (96 MMAs, 512 elements of the dim)
// and add them into sums by rounding FADDs, as the TF32 builds add each atom.
constexpr int SPLIT_FLUSH_ATOMS = 24;
constexpr int GROUP_ROWS = DOCS_ON_M ? QUERY_COLS : 64;   // query rows a consumer warpgroup holds
constexpr int BLOCK_ROWS = GROUP_ROWS * WARPGROUPS;       // query rows of the block's accumulators
constexpr int QUERY_ROWS = SPLIT_DOCS ? 64 : BLOCK_ROWS;  // distinct query rows
// A document's maxima as the warps publish them: per query row [2 parities][BLOCK_ROWS], or
// (DOCS_ON_M) per query column and warp, [2 parities][CONSUMER_WARPS][QUERY_COLS].
// TF32_DOC_ROWS: the same per warp and query row (query_row_of of its token), 64 a warp.
constexpr bool COLUMN_MAXIMA = DOCS_ON_M || TF32_DOC_ROWS;
constexpr int COLUMN_SLOTS = DOCS_ON_M ? QUERY_COLS : 64;
constexpr int MAX_SLOTS = COLUMN_MAXIMA ? 2 * CONSUMER_WARPS * COLUMN_SLOTS : 2 * BLOCK_ROWS;
static_assert(TILE_N == 64 || TILE_N == 128, "wgmma tiles of 64 or 128 document rows");
constexpr int KPAD = KSTEPS * 16;            // 16-bit units per row
constexpr int CHUNKS = KPAD / 8;             // 16-byte chunks per row
constexpr int LDS = KPAD + 8;                // query block row pitch (ldmatrix without conflicts)
// A tile is ATOMS swizzle atoms side by side in k, each TILE_N rows x 128 bytes (64 fp16 or
// 128 int8 of k), the rows' 16-byte chunks permuted by (chunk ^ row % 8).
constexpr int ATOMS = (KSTEPS + 3) / 4;
constexpr int ATOM_BYTES = TILE_N * 128;
constexpr int SLOT_ATOMS = STREAM_K ? 1 : ATOMS;  // atoms of a tile in one ring slot
// DOCS_ON_M: a warpgroup's query block, ATOMS atoms of QUERY_COLS rows x 128 bytes.
constexpr int QUERY_ATOM_BYTES = QUERY_COLS * 128, QUERY_BLOCK_BYTES = ATOMS * QUERY_ATOM_BYTES;
// Bytes of a ring slot: the documents' atoms, and STREAM_QUERY every warpgroup's query atom.
// A slot's query bytes (STREAM_QUERY): every warpgroup's atom, or splitting documents the one
// group's (its 32 real rows: half rows).
constexpr int SLOT_QUERY_BYTES = !STREAM_QUERY ? 0 : SPLIT_DOCS ? 32 * 128 : WARPGROUPS * QUERY_ATOM_BYTES;
constexpr int TILE_BYTES = SLOT_ATOMS * ATOM_BYTES + SLOT_QUERY_BYTES;
// TF32 (split document): each warpgroup's two of small halves; FP32_SPLIT: the producer's stages.
constexpr int SMALL_BYTES = SPLIT_DOCUMENT ? 2 * WARPGROUPS * ATOM_BYTES : SPLIT_STAGED ? SPLIT_STAGES * SPLIT_STAGE_BYTES : 0;
// The query region: rows of LDS elements (ldmatrix), or DOCS_ON_M the warpgroups' swizzled
// blocks (whole atoms: more than LDS rows when KSTEPS is not a multiple of 4, e.g. dim 96).
// STREAM_K keeps only the 32 real rows (HALF_ROWS) of the 64.
constexpr int STORED_QUERY_ROWS = STREAM_K ? 32 : QUERY_ROWS;
// TF32_DOC_ROWS: the query's split rows, ATOMS atoms of 64 rows x 128 bytes.
constexpr int SPLIT_QUERY_ATOM_BYTES = 64 * 128;
constexpr int QUERY_BYTES = STREAM_QUERY ? 0 : DOCS_ON_M ? WARPGROUPS * QUERY_BLOCK_BYTES
                          : TF32_DOC_ROWS ? ATOMS * SPLIT_QUERY_ATOM_BYTES : STORED_QUERY_ROWS * LDS * 2;
static_assert(QUERY_BYTES % 128 == 0 && TILE_BYTES % 128 == 0, "the document scales (after the ring and the "
              "query) are written by TMA: 128-byte aligned");
// Dynamic shared memory the kernel needs (the formula in the header comment).
constexpr int SHARED_BYTES = 1024 + STAGES * TILE_BYTES + SMALL_BYTES + QUERY_BYTES +
                             4 * (STAGES * TILE_N + 3 * QUERY_ROWS + (1 + ARGMAX) * MAX_SLOTS + 4 * WARPS) +
                             16 * STAGES + 16 * STAGES + 8;
#ifdef MAXSIM_EXPECT_SHARED_BYTES  // the compile checks: _plan.configs.WgmmaConfig.shared_bytes
static_assert(SHARED_BYTES == MAXSIM_EXPECT_SHARED_BYTES, "_plan.configs.WgmmaConfig.shared_bytes disagrees");
#endif
static_assert(!HALF_ROWS || SPLIT_DOCS, "half rows: one query group of at most 32 rows");
static_assert(!DOCS_ON_M || (!SPLIT_DOCS && (TILE_N == 64 || (STREAM_K && !FP32_SPLIT && !TF32))),
              "documents on M: many queries, 64-row tiles (128 streaming k, 16-bit: M_HALVES)");
static_assert(!TURNS || (DOCS_ON_M && !STREAM_K), "turns: documents on M, k resident");
// Warpgroup row of the query group's row f (query j's token i: f = j * Lq + i).
__device__ __forceinline__ int query_row_of(int f) { return HALF_ROWS ? 16 * (f / 8) + f % 8 : f; }
// ... and back: the group row a warpgroup row holds, or -1 (a padding row).
__device__ __forceinline__ int group_row_of(int row) { return !HALF_ROWS ? row : row % 16 < 8 ? row / 16 * 8 + row % 16 : -1; }
static_assert(STAGES >= 3, "the ring needs two slots in the tensor cores' hands and one loading");
static_assert(STAGES % RINGS == 0 && RING >= 2, "split rings of at least two slots: one multiplying, one loading");
static_assert((KSTEPS <= 8 || STREAM_K) && KSTEPS % 2 == 0, "query fragments live in registers; chunks come in fours");
static_assert(!STREAM_K || ((DOCS_ON_M || (SPLIT_DOCS && HALF_ROWS)) && KSTEPS % 4 == 0),
              "streaming k: one query (half rows) or documents on M, whole atoms");
static_assert(LOAD_BYTES >= 4, "rows below 4-byte alignment take the mma.sync kernel (plain loads)");
static_assert(!TF32 || (STREAM_K && SPLIT_DOCS) || (DOCS_ON_M && !SPLIT_DOCUMENT),
              "TF32: one query streaming k (one atom a slot), or documents on M under precision high");
static_assert(!STREAM_QUERY || (STREAM_K && (DOCS_ON_M || (SPLIT_DOCS && HALF_ROWS))),
              "streaming queries: streaming k, documents on M or one query's half rows");
static_assert(!TF32_DOC_ROWS || (SPLIT_DOCS && HALF_ROWS && STREAM_K && !STREAM_QUERY && TF32_STRETCH == 0),
              "TF32 documents on M: one query resident, streaming k");
static_assert(!BOXES_WITHIN_Q || DOCS_ON_M, "a split group's one box holds its queries: always within q");
static_assert(!FP32_SPLIT || (DOCS_ON_M && STREAM_K && STREAM_QUERY && !TF32),
              "fp32 split: documents on M streaming k and the query atoms");
static_assert(!STREAM_QUERY || TILE_BYTES % 1024 == 0, "a slot's query atom lands on a 1024-byte swizzle boundary");
}  // namespace wg

// Two 8x8 b16 matrices (lanes 0-7 and 8-15 give their rows' addresses), one per register.
__device__ __forceinline__ void ldmatrix_x2(u32 (&r)[2], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(smem_address(smem)));
}

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle layout: 8-row groups
// 1024 bytes apart (stride byte offset), the leading byte offset unused (k never leaves an
// atom within one MMA). Atoms must be 1024-byte aligned: the swizzle is a function of address bits.
__device__ __forceinline__ unsigned long long tile_descriptor(const void* tile) {
    return (unsigned long long)((smem_address(tile) & 0x3ffff) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) |
           (1ull << 62);
}
// Descriptor offset (16-byte units) of k-step ks: 32 bytes into its atom.
__device__ __forceinline__ unsigned kstep_offset(int ks) { return ((ks / 4) * wg::ATOM_BYTES + (ks % 4) * 32) >> 4; }
// ... in a DOCS_ON_M query block.
__device__ __forceinline__ unsigned query_kstep_offset(int ks) {
    return ((ks / 4) * wg::QUERY_ATOM_BYTES + (ks % 4) * 32) >> 4;
}

__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses to accumulators across the asynchronous MMA.
template <int N> __device__ __forceinline__ void pin(float (&acc)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
__device__ __forceinline__ void pin(int (&acc)[wg::ACC]) {
#pragma unroll
    for (int i = 0; i < wg::ACC; ++i) asm volatile("" : "+r"(acc[i])::"memory");
}

// The asm operands of one wgmma: the ACC accumulators, four A registers, the B descriptor and
// the accumulate flag (a predicate: 0 on a tile's first k-step).
#if MAXSIM_TILE_N == 64
#define MAXSIM_WGMMA_D(C) C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]),  \
        C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]),  \
        C(d[20]), C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]),  \
        C(d[30]), C(d[31])
#define MAXSIM_WGMMA_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p"
#define MAXSIM_WGMMA_PRED "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
#define MAXSIM_WGMMA_N "n64"
#endif
#define MAXSIM_WGMMA_D64(C) C(d[0]), C(d[1]), C(d[2]), C(d[3]), C(d[4]), C(d[5]), C(d[6]), C(d[7]), C(d[8]), C(d[9]),  \
        C(d[10]), C(d[11]), C(d[12]), C(d[13]), C(d[14]), C(d[15]), C(d[16]), C(d[17]), C(d[18]), C(d[19]),  \
        C(d[20]), C(d[21]), C(d[22]), C(d[23]), C(d[24]), C(d[25]), C(d[26]), C(d[27]), C(d[28]), C(d[29]),  \
        C(d[30]), C(d[31]), C(d[32]), C(d[33]), C(d[34]), C(d[35]), C(d[36]), C(d[37]), C(d[38]), C(d[39]),  \
        C(d[40]), C(d[41]), C(d[42]), C(d[43]), C(d[44]), C(d[45]), C(d[46]), C(d[47]), C(d[48]), C(d[49]),  \
        C(d[50]), C(d[51]), C(d[52]), C(d[53]), C(d[54]), C(d[55]), C(d[56]), C(d[57]), C(d[58]), C(d[59]),  \
        C(d[60]), C(d[61]), C(d[62]), C(d[63])
#define MAXSIM_WGMMA_D64_LIST "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#if MAXSIM_TILE_N == 128
#define MAXSIM_WGMMA_D(C) MAXSIM_WGMMA_D64(C)
#define MAXSIM_WGMMA_REGS MAXSIM_WGMMA_D64_LIST ", {%64, %65, %66, %67}, %68, p"
#define MAXSIM_WGMMA_PRED "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
#define MAXSIM_WGMMA_N "n128"
#endif

// D (64 x N) = or += A (64 x 32 bytes of k, registers) * B (tile descriptor), one k-step, for
// each format: its accumulator type and asm constraint, its shape and types, the immediates
// after the predicate (16-bit: scale A by 1, scale B by 1, B not transposed (K-major); fp32
// (TF32 builds: k-steps of 8 elements, A's registers exact TF32 values, see TF32): the scales
// only, TF32 operands being K-major only; int8: exact int32 accumulation, none).
template <typename T> struct WgmmaTile;
#define MAXSIM_WGMMA_RS(T, ACC_T, C, SHAPE_TYPES, IMMEDIATES)                                        \
    template <> struct WgmmaTile<T> {                                                                \
        typedef ACC_T acc_t;                                                                         \
        static __device__ __forceinline__ void run(ACC_T (&d)[wg::ACC], const u32 (&a)[4],           \
                                                   unsigned long long desc, int accumulate) {        \
            asm volatile(MAXSIM_WGMMA_PRED "wgmma.mma_async.sync.aligned.m64" MAXSIM_WGMMA_N SHAPE_TYPES \
                         " " MAXSIM_WGMMA_REGS IMMEDIATES ";\n}\n"                                   \
                         : MAXSIM_WGMMA_D(C)                                                         \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));  \
        }                                                                                            \
    };
MAXSIM_WGMMA_RS(fp16_t, float, "+f", "k16.f32.f16.f16", ", 1, 1, 0")
MAXSIM_WGMMA_RS(fp32_split_t, float, "+f", "k16.f32.f16.f16", ", 1, 1, 0")  // (its fp16 halves)
MAXSIM_WGMMA_RS(bf16_t, float, "+f", "k16.f32.bf16.bf16", ", 1, 1, 0")
MAXSIM_WGMMA_RS(float, float, "+f", "k8.f32.tf32.tf32", ", 1, 1")
MAXSIM_WGMMA_RS(i8, int, "+r", "k32.s32.s8.s8", "")

// DOCS_ON_M: D (64 document rows x 128 query rows) = or += A (document tile descriptor) * B
// (query block descriptor), one k-step; both K-major; per format its accumulator type and asm
// constraint, shape and types, and the immediates after the predicate (16-bit: scales 1, no
// transpose; fp32 under precision "high", MAXSIM_TF32 2: both operands read as TF32, the tensor
// cores dropping each element's 13 low bits, k-steps of 8, scales 1 and no transpose immediates;
// int8: none).
template <typename T> struct WgmmaDocsOnM;
#define MAXSIM_WGMMA_SS(T, ACC_T, C, SHAPE_TYPES, IMMEDIATES)                                                 \
    template <> struct WgmmaDocsOnM<T> {                                                                        \
        static __device__ __forceinline__ void run(ACC_T (&d)[wg::ACC], unsigned long long a_desc,              \
                                                   unsigned long long b_desc, int accumulate) {                 \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                          \
                         "wgmma.mma_async.sync.aligned.m64n128" SHAPE_TYPES " " MAXSIM_WGMMA_D64_LIST           \
                         ", %64, %65, p" IMMEDIATES ";\n}\n"                                                    \
                         : MAXSIM_WGMMA_D64(C)                                                                  \
                         : "l"(a_desc), "l"(b_desc), "r"(accumulate));                                          \
        }                                                                                                       \
    };
MAXSIM_WGMMA_SS(fp16_t, float, "+f", "k16.f32.f16.f16", ", 1, 1, 0, 0")
MAXSIM_WGMMA_SS(fp32_split_t, float, "+f", "k16.f32.f16.f16", ", 1, 1, 0, 0")  // (its fp16 halves)
MAXSIM_WGMMA_SS(bf16_t, float, "+f", "k16.f32.bf16.bf16", ", 1, 1, 0, 0")
MAXSIM_WGMMA_SS(float, float, "+f", "k8.f32.tf32.tf32", ", 1, 1")
MAXSIM_WGMMA_SS(i8, int, "+r", "k32.s32.s8.s8", "")

// TF32_DOC_ROWS: D (64 document rows x 32 query rows) = or += A (registers: the document's
// fragments, a0..a3 at rows g, g + 8 and columns t, t + 4 of the warp's 16 x 8; g = lane / 4,
// t = lane % 4) * B (the split query's descriptor), one k-step of 8 elements.
__device__ __forceinline__ void wgmma_tf32_n32(float (&d)[16], const u32 (&a)[4], unsigned long long desc,
                                               int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
                 "%11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(accumulate));
}

// Running max (and argmax) of one accumulator row over the document's columns so far.
struct RowBest {
    float value;
    int index;
};

// The winner of two partial maxima (value, its document row; -1: none): the larger value, and
// on a tie the lower row (the first maximum; -1 as unsigned loses every tie).
__device__ __forceinline__ int first_winner(float value, int index, float other, int other_index) {
    return other > value || (other == value && (unsigned)other_index < (unsigned)index) ? other_index : index;
}

// One round of a reduce-scatter of running maxima across the lanes DISTANCE (a power of two)
// apart: the lane whose bit DISTANCE is set keeps the upper HALF of values[0, 2 HALF), the other
// the lower, each the max of its own and its partner's (which it receives for the one it sends)
// in values[0, HALF).
template <int HALF, int N, int DISTANCE = HALF>
__device__ __forceinline__ void keep_max_of_halves(float (&values)[N], int lane) {
    static_assert(2 * HALF <= N, "a round halves the values held");
    const bool upper = lane & DISTANCE;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        const float send = upper ? values[i] : values[i + HALF];
        const float keep = upper ? values[i + HALF] : values[i];
        values[i] = max_nan(keep, __shfl_xor_sync(0xffffffffu, send, DISTANCE));
    }
}

// The same with winners: values[2p], values[2p + 1] are the maxima of column pair p, and
// winners[p] their rows, 16 bits each (0xffff: none); a round keeps HALF pairs of 2 HALF.
template <int HALF, int N, int DISTANCE = 2 * HALF>
__device__ __forceinline__ void keep_best_of_halves(float (&values)[N], u32 (&winners)[N / 2], int lane) {
    static_assert(4 * HALF <= N, "a round halves the pairs held");
    const int offset = DISTANCE;  // (by default lanes 16, 8, 4 apart for 8, 4, 2 pairs kept)
    const bool upper = lane & offset;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        // Selected by value, never by a run-time index: the arrays stay in registers.
        float v[2], o[2];
        u32 w = 0, ow;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const float sent = upper ? values[2 * i + c] : values[2 * (i + HALF) + c];
            v[c] = upper ? values[2 * (i + HALF) + c] : values[2 * i + c];
            o[c] = __shfl_xor_sync(0xffffffffu, sent, offset);
        }
        {
            const u32 sent = upper ? winners[i] : winners[i + HALF];
            w = upper ? winners[i + HALF] : winners[i];
            ow = __shfl_xor_sync(0xffffffffu, sent, offset);
        }
        u32 won = 0;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            const int mine = (short)(w >> (16 * c)), theirs = (short)(ow >> (16 * c));
            won |= ((u32)first_winner(v[c], mine, o[c], theirs) & 0xffffu) << (16 * c);
            values[2 * i + c] = max_nan(v[c], o[c]);
        }
        winners[i] = won;
    }
}

// A finished document's per-row buffers as the epilogue asks them (epilogue.cuh's Tokens) for
// one query: its token i is group row `first + i`, at query_row_of() of it in the warpgroup.
struct FinishedRows {
    const float* sRowMax;
    const float* sRowScale;
    const int *sRowQuery, *sRowBad, *sRowArg;
    int first;       // the query's first group row (j * Lq)
    int query_base;  // the warpgroup's first row in the query block (0 when splitting documents)
    int row_base;    // the warpgroup's first accumulator row among this parity's maxima
    int slot_base;   // DOCS_ON_M: this parity's first column slot of the warpgroup's warps
    __device__ __forceinline__ int local(int i) const { return wg::query_row_of(first + i); }
    __device__ __forceinline__ bool real(int i) const { return sRowQuery[query_base + local(i)] >= 0; }
    __device__ __forceinline__ float max(int i, int& winner) const {
        using namespace wg;
        if constexpr (!COLUMN_MAXIMA) return sRowMax[row_base + local(i)];
        // The max over the warpgroup's 4 warps of its column.
        const int slot = slot_base + local(i);
        float m = sRowMax[slot];
        if constexpr (ARGMAX) winner = sRowArg[slot];
#pragma unroll
        for (int w = 1; w < 4; ++w) {
            const float other = sRowMax[slot + w * COLUMN_SLOTS];
            if constexpr (ARGMAX) winner = first_winner(m, winner, other, sRowArg[slot + w * COLUMN_SLOTS]);
            m = max_nan(m, other);
        }
        return m;
    }
    __device__ __forceinline__ int winner(int i, int found) const {
        return wg::COLUMN_MAXIMA ? found : sRowArg[row_base + local(i)];
    }
    __device__ __forceinline__ float scale(int i) const { return sRowScale[query_base + local(i)]; }
    __device__ __forceinline__ bool bad(int i) const { return sRowBad[query_base + local(i)] != 0; }
};

__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
}
// Arrive on `bar` once every cp.async this thread issued so far has landed (counted in the
// barrier's initial count).
__device__ __forceinline__ void cp_async_mbarrier_arrive(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_address(bar)) : "memory");
}
// Wait until the barrier's phase `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, u32 parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_address(bar)),
        "r"(parity)
        : "memory");
}
// The document tiles' TMA descriptor (a CUtensorMap, built by _gpu/tma.doc_tile_map with
// cuTensorMapEncodeTiled): 3-d (dim, rows, documents), box (128 bytes of k, 64 rows, 1), the
// 128-byte swizzle; packed corpora are (dim, tokens, 1). use_tma = 0: no map (a document mask,
// or operands outside TMA's rules); the producer copies with cp.async instead.
// int8: the document scales' map beside it (2-d (rows, documents) of float32, or packed
// (tokens, 1), box (TILE_N, 1), no swizzle), so that one TMA copies a tile's scales with the
// tile; use_scale_tma = 0: the producer warp's lanes copy them with cp.async (4 bytes each).
// STREAM_QUERY: q's map (3-d: elements, tokens, queries; box 128 bytes x Lq x a warpgroup's
// queries, or splitting documents the group's, the 128-byte swizzle), use_query_tma set.
struct alignas(64) DocTileMap {
    unsigned long long map[16];
    unsigned long long scale_map[16];
    unsigned long long query_map[16];
    int use_tma, packed, use_scale_tma, use_query_tma, reserved[12];
};
static_assert(sizeof(DocTileMap) == 448, "DocTileMap mirrors _gpu/tma.DOC_TILE_MAP_BYTES");

// The producer's arrival on `bar`, announcing `bytes` of TMA writes that complete the phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(unsigned long long* bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_address(bar)), "r"(bytes)
                 : "memory");
}
// One box of the document scales' map (2-d) into shared memory; counts towards `bar` as above.
__device__ __forceinline__ void tma_load_scales(void* dst, const DocTileMap& tile_map, int row, int doc,
                                                unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(smem_address(dst)), "l"((const void*)tile_map.scale_map), "r"(row), "r"(doc), "r"(smem_address(bar))
        : "memory");
}
// One box of a 3-d tensor map (the documents', or q's) into shared memory (swizzled as the map
// says); its bytes count towards `bar`'s transaction. Out-of-range elements arrive as zeros.
__device__ __forceinline__ void tma_load_3d(void* dst, const unsigned long long (&map)[16], int x, int y, int z,
                                            unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(smem_address(dst)), "l"((const void*)map), "r"(x), "r"(y), "r"(z), "r"(smem_address(bar))
        : "memory");
}

// Named barrier for the 128 threads of the calling warpgroup (id 0 is __syncthreads). The id
// is derived here from the thread index: cheaper to recompute than to keep in a register.
__device__ __forceinline__ void warpgroup_sync() {
    asm volatile("bar.sync %0, 128;\n" ::"r"((threadIdx.x >> 7) + 1) : "memory");
}

// Named barrier for the consumer warpgroups (ids 1..4 belong to warpgroup_sync).
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(15), "n"(wg::CONSUMER_THREADS) : "memory");
}

// TURNS: consumer warpgroup w's turn is named barrier 8 + w, completed by its own 128 threads
// (waiting) and the previous warpgroup's 128 (passing the turn on).
__device__ __forceinline__ void wait_turn(int warpgroup) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(8 + warpgroup) : "memory");
}
__device__ __forceinline__ void pass_turn(int warpgroup) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(8 + (warpgroup + 1) % wg::WARPGROUPS) : "memory");
}

namespace wg {
// Byte offsets of the shared-memory regions from the block's 1024-aligned base (the formula in
// the header comment; SHARED_BYTES adds the alignment slack). Pieces address them from the one
// base pointer, so that the compiler rematerialises each as base + constant instead of keeping
// a register pair per region live across the consumer loops.
constexpr int OFF_SMALL = STAGES * TILE_BYTES;                  // TF32: [WARPGROUPS][2][ATOM_BYTES]; FP32_SPLIT: stages
constexpr int OFF_Q = OFF_SMALL + SMALL_BYTES;                  // [QUERY_BYTES]
constexpr int OFF_SCALE = OFF_Q + QUERY_BYTES;                  // int8: [STAGES][TILE_N] document scales
constexpr int OFF_ROW_SCALE = OFF_SCALE + 4 * STAGES * TILE_N;  // int8: per query row, its scale
constexpr int OFF_ROW_MAX = OFF_ROW_SCALE + 4 * QUERY_ROWS;     // [MAX_SLOTS]: a document's maxima
constexpr int OFF_ROW_QUERY = OFF_ROW_MAX + 4 * MAX_SLOTS;      // query of each query row, -1 if none
constexpr int OFF_ROW_BAD = OFF_ROW_QUERY + 4 * QUERY_ROWS;     // query token holds NaN or inf
constexpr int OFF_HAS_ROW = OFF_ROW_BAD + 4 * QUERY_ROWS;       // [2 parities][WARPS]
constexpr int OFF_DOC_BAD = OFF_HAS_ROW + 8 * WARPS;            // [2 parities][WARPS]
constexpr int OFF_ROW_ARG = OFF_DOC_BAD + 8 * WARPS;            // [MAX_SLOTS] as the maxima, ARGMAX only
constexpr int OFF_FULL = OFF_ROW_ARG + (ARGMAX ? 4 * MAX_SLOTS : 0);  // [STAGES] mbarriers: a tile landed
constexpr int OFF_EMPTY = OFF_FULL + 8 * STAGES;                // [STAGES] mbarriers: a slot is free
// Splitting documents: the block position of the document each slot's tile comes from (-1: the
// ring's end) and its length (the consumers read no offsets from global memory: a packed corpus
// of short documents would stall them on one load per document), and the block's next
// unclaimed position (32 bits: a 64-bit shared atomicAdd compiles to a compare-and-swap loop,
// a 32-bit one to a single ATOMS.ADD; a block's range of documents is far below 2^32).
constexpr int OFF_SLOT_DOC = OFF_EMPTY + 8 * STAGES;
constexpr int OFF_SLOT_LENGTH = OFF_SLOT_DOC + 8 * STAGES;
constexpr int OFF_NEXT_DOC = OFF_SLOT_LENGTH + 8 * STAGES;
static_assert(OFF_NEXT_DOC + 8 + 1024 == SHARED_BYTES, "the regions fill SHARED_BYTES");

// A walk over a ring's documents in the block's order, a tile at a time: its producer and each
// of its consumer warpgroups keep one (their ring slots follow the same sequence of tiles).
struct DocCursor {
    i64 position, doc, base, length, first_token;  // base: element offset of the document
    int tiles, tile;
};
__device__ __forceinline__ int doc_tiles(i64 length) { return max(1, (int)((length + TILE_N - 1) / TILE_N)); }
// Ring slots a tile takes: one, or streaming k one per atom (128 bytes) of the dim.
template <typename T> __device__ __forceinline__ int slots_per_tile(int dim) {
    if constexpr (FP32_SPLIT) return 3 * ((dim + 63) / 64);  // three atoms of halves per 64 fp32 elements
    return STREAM_K ? (dim * (Codec<T>::BITS / 8) + 127) / 128 : 1;
}

// What every warp of a block shares: the arguments, shared memory (as the header comment lays
// it out), the block's documents and queries. The producer and consumer pieces below are its
// members (and Consumer's), so that they read these by name.
struct Block {
    unsigned char* smem;  // the 1024-aligned base of the regions
    __device__ __forceinline__ unsigned char* sD() const { return (unsigned char*)(smem + 0); }
    __device__ __forceinline__ u16* sQ() const { return (u16*)(smem + OFF_Q); }
    __device__ __forceinline__ float* sScale() const { return (float*)(smem + OFF_SCALE); }
    __device__ __forceinline__ float* sRowScale() const { return (float*)(smem + OFF_ROW_SCALE); }
    __device__ __forceinline__ float* sRowMax() const { return (float*)(smem + OFF_ROW_MAX); }
    __device__ __forceinline__ int* sRowQuery() const { return (int*)(smem + OFF_ROW_QUERY); }
    __device__ __forceinline__ int* sRowBad() const { return (int*)(smem + OFF_ROW_BAD); }
    __device__ __forceinline__ int* sHasRow() const { return (int*)(smem + OFF_HAS_ROW); }
    __device__ __forceinline__ int* sDocBad() const { return (int*)(smem + OFF_DOC_BAD); }
    __device__ __forceinline__ int* sRowArg() const { return (int*)(smem + OFF_ROW_ARG); }
    __device__ __forceinline__ unsigned long long* full() const { return (unsigned long long*)(smem + OFF_FULL); }
    __device__ __forceinline__ unsigned long long* empty() const { return (unsigned long long*)(smem + OFF_EMPTY); }
    __device__ __forceinline__ long long* sSlotDoc() const { return (long long*)(smem + OFF_SLOT_DOC); }
    __device__ __forceinline__ long long* sSlotLength() const { return (long long*)(smem + OFF_SLOT_LENGTH); }
    __device__ __forceinline__ unsigned* sNextDoc() const { return (unsigned*)(smem + OFF_NEXT_DOC); }
    __device__ __forceinline__ unsigned char* sSmall() const { return smem + OFF_SMALL; }
    int tid, lane, warp, quad;
    bool scales_by_tma, scales_by_lanes;  // int8 with a TMA map: the tiles' scales by TMA too, or by lanes
    i64 doc_begin, doc_end, doc_count, rotation, first_query;
    int query_length, queries_per_warpgroup, group_size;
    DocLayout layout;
    // BOXES_WITHIN_Q: queries a box of q's map holds (queries_per_warpgroup, or the launch's
    // queries where fewer), the launch's last query at which a box may start, the boxes a slot
    // gets (one a warpgroup with queries) and the bytes they fall short of whole query atoms
    // (once here: a division in the producer's loop cost its lane every slot). SPLIT_STREAM_QUERY:
    // the shortfall of the group's one box (its queries' rows) from the slot's 32 rows.
    int box_queries, query_boxes;
    i64 last_box_first;
    bool own_ranges;  // the last query group's ranges of its own (ForwardArgs.last_group_docs_per_block)
    u32 box_shortfall;

    // (The arguments are not kept here: each piece takes them as parameters, so that they are
    // read from the kernel's parameter space, not through a pointer held in registers.)
    __device__ __forceinline__ Block(const ForwardArgs& args, const DocTileMap& tile_map, unsigned char* smem_raw,
                                     bool scaled) {
        // The swizzle atoms need 1024-byte alignment in the shared window (1024 bytes are budgeted).
        smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
        // A launch that disagrees with this build (_plan.configs.WgmmaConfig) stops here, not in
        // a corrupted ring.
        u32 dynamic_bytes;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
        if (blockDim.x != THREADS || dynamic_bytes < SHARED_BYTES || (STREAM_QUERY && !tile_map.use_query_tma) ||
            (FP32_SPLIT && tile_map.use_tma != !SPLIT_STAGED))  // (staged: the producer splits the documents itself)
            __trap();
        tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = lane & 3;
        scales_by_tma = scaled && tile_map.use_tma && tile_map.use_scale_tma;
        scales_by_lanes = scaled && tile_map.use_tma && !tile_map.use_scale_tma;
        // The launch's last query group may have ranges of its own (its idle warpgroups:
        // Consumer::idle_docs_on_m); its blocks past the documents return at once.
        // (Documents on M only: in the others' code the flag cost a register, and one query's
        // builds with the argmax spilled.)
        own_ranges = DOCS_ON_M && blockIdx.y + 1 == gridDim.y && args.last_group_docs_per_block > 0;
        const i64 docs_per_block = own_ranges ? args.last_group_docs_per_block : args.docs_per_block;
        // One query group's builds (SPLIT_DOCS) take ranges one document apart (block_doc_range);
        // the others, ranges of one size (the planner gives them no others): there the range
        // arithmetic made ptxas spill the queries-on-M winners builds at 128 registers.
        if constexpr (SPLIT_DOCS) {
            block_doc_range(args, blockIdx.x, docs_per_block, doc_begin, doc_end);
        } else {
            doc_begin = (i64)blockIdx.x * docs_per_block;
            doc_end = min(doc_begin + docs_per_block, args.num_docs);
        }
        query_length = args.query_length;
        queries_per_warpgroup = GROUP_ROWS / query_length;
        first_query = (i64)blockIdx.y * args.queries_per_group;
        group_size = (int)min((i64)args.queries_per_group, args.num_queries - first_query);
        if constexpr (SPLIT_STREAM_QUERY) box_shortfall = (u32)(32 - group_size * query_length) * 128;
        if constexpr (BOXES_WITHIN_Q) {
            box_queries = (int)min((i64)queries_per_warpgroup, (i64)args.num_queries);
            last_box_first = args.num_queries - box_queries;
            query_boxes = min(WARPGROUPS, (group_size + queries_per_warpgroup - 1) / queries_per_warpgroup);
            box_shortfall = (u32)(WARPGROUPS * QUERY_COLS - query_boxes * box_queries * query_length) * 128;
        }
        layout = make_doc_layout(args.d_doc_stride, args.d_row_stride, args.doc_length, args.offsets,
                                 args.offsets_are_64bit);
        // The block's documents, in an order rotated by query group (args.doc_rotation): groups
        // sharing a document range do not all read the same document at the same time.
        doc_count = doc_end - doc_begin;
        rotation = SPLIT_DOCS || doc_count <= 0 ? 0 : ((i64)blockIdx.y * args.doc_rotation) % doc_count;
    }
    // STREAM_QUERY: the first query of warpgroup w's box, and how many queries before the
    // warpgroup's own it holds. A box never reaches past q's end: TMA's zero fill of the rows
    // past it ran at a fraction of the copy rate (fp16 dim 2560, 2 GB: 2x32 queries 1.31 ms,
    // whose box was half past the end, against 4x32's 0.82). So the last group's last box,
    // partly filled, starts back over the queries before it (their columns no score reads),
    // and a launch of fewer queries than a box holds maps boxes of as many (the map's box:
    // _forward.query_map_shape).
    __device__ __forceinline__ i64 query_box_first(int w) const {
        return min(first_query + (i64)(w * queries_per_warpgroup), last_box_first);
    }
    __device__ __forceinline__ int query_box_shift(int w) const {
        return BOXES_WITHIN_Q ? (int)(first_query + w * queries_per_warpgroup - query_box_first(w)) : 0;
    }
    __device__ __forceinline__ i64 doc_at(i64 position) const {
        const i64 p = position + rotation;
        return doc_begin + (p >= doc_count ? p - doc_count : p);
    }
    // SPLIT_DOCS (one query group: no rotation, no ranges of the last group's own): the document
    // at a slot's position, its range's start recomputed from the parameters, so that no consumer
    // register holds doc_begin through the loop (held, one query's winners builds spilled at 128
    // registers once block_doc_range's long ranges came in).
    __device__ __forceinline__ i64 split_doc_at(const ForwardArgs& args, i64 position) const {
        i64 begin, end;
        block_doc_range(args, blockIdx.x, args.docs_per_block, begin, end);
        return begin + position;
    }
    __device__ __forceinline__ void open_doc(DocCursor& c, i64 position) const {
        c.position = position, c.tile = 0;
        if (position >= doc_count) return;
        c.doc = doc_at(position);
        doc_extent(layout, c.doc, c.base, c.length, c.first_token);
        c.tiles = doc_tiles(c.length);
    }
    // Moves to the next tile (of the next document after the last).
    __device__ __forceinline__ void next_tile(DocCursor& c) const {
        if (++c.tile == c.tiles) open_doc(c, c.position + 1);
    }
    // Where chunk `chunk` of query row `row` is staged: rows of LDS elements (read into
    // registers by ldmatrix), or (DOCS_ON_M) each warpgroup's block in the 128-byte swizzle
    // layout (read by the tensor cores): the row's line in the first atom, and the chunk's place
    // from there.
    __device__ __forceinline__ unsigned char* query_line(int row) const {
        return (unsigned char*)sQ() + (row / QUERY_COLS) * QUERY_BLOCK_BYTES + (row % QUERY_COLS) * 128;
    }
    // A query row's storage (STREAM_K: the real rows only, by group row; a padding row has none).
    __device__ __forceinline__ u16* query_row(int row) const {
        return sQ() + (STREAM_K ? group_row_of(row) : row) * LDS;
    }
    __device__ __forceinline__ u16* query_chunk(int row, int chunk) const {
        if constexpr (!DOCS_ON_M) return query_row(row) + chunk * 8;
        return (u16*)(query_line(row) + (chunk / 8) * QUERY_ATOM_BYTES + (((chunk % 8) ^ (row % 8)) << 4));
    }
    // Whether row r of a tile that starts at token `first` of document `doc`, with `count` of
    // the document's tokens in it, is a real token (in the document, not masked).
    __device__ __forceinline__ bool token_real(const ForwardArgs& args, i64 doc, int first, int count, int r) const {
        return r < count &&
               (args.d_mask == nullptr || args.d_mask[doc * args.d_mask_doc_stride + (first + r) * args.d_mask_row_stride]);
    }

    // The rings' barriers first, so that the producers start copying documents at once; the
    // consumers load the query meanwhile (after the L2 is cold, both wait on HBM: ~1-2 us).

    __device__ __forceinline__ void init_barriers(const DocTileMap& tile_map) {
    // The rings' barriers first, so that the producers start copying documents at once; the
    // consumers load the query meanwhile (after the L2 is cold, both wait on HBM: ~1-2 us).
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            // cp.async: every thread of the warps copying the ring's tiles; TMA: the issuing
            // lane, and (int8 whose scales TMA cannot read) its warp's lanes that copy them.
            // Splitting, with cp.async, the first lane also arrives plainly: that arrival
            // publishes the slot's document position (a release, as the TMA lane's is).
            // STREAM_QUERY with cp.async documents: the lane issuing the query atoms arrives too.
            // FP32_SPLIT: a producer warp's lanes fence their stores, and its first lane arrives.
            mbarrier_init(full() + s, tile_map.use_tma ? 1 + (scales_by_lanes ? 32 : 0)
                                                       : (SPLIT_STAGED ? 1 : 32) * COPY_WARPS + SPLIT_DOCS + STREAM_QUERY);
            mbarrier_init(empty() + s, SPLIT_DOCS ? 4 : CONSUMER_WARPS);  // the warps that read the tile
        }
        *sNextDoc() = 0;
    } else if (tid == CONSUMER_THREADS && tile_map.use_tma) {
        // The producer's first lane fetches the tile maps while the barriers are set up.
        asm volatile("prefetch.tensormap [%0];\n" ::"l"((const void*)tile_map.map) : "memory");
        if (scales_by_tma) asm volatile("prefetch.tensormap [%0];\n" ::"l"((const void*)tile_map.scale_map) : "memory");
        if (STREAM_QUERY) asm volatile("prefetch.tensormap [%0];\n" ::"l"((const void*)tile_map.query_map) : "memory");
    }
    __syncthreads();  // the last block-wide barrier
    }

    // Query block -> shared memory, once, by the consumers. Warpgroup w holds queries
    // w * (GROUP_ROWS / Lq) + j at rows GROUP_ROWS * w + query_row_of(j * Lq + i).
    template <typename T> __device__ __forceinline__ void stage_queries(const ForwardArgs& args) {
        constexpr bool SCALED = Codec<T>::SCALED;
        if constexpr (TF32_DOC_ROWS) {
            stage_split_query(args);
            return;
        }
        if constexpr (SPLIT_STREAM_QUERY) {  // what each row is, and which real tokens are not finite
            note_group_rows<T, 16>(args);
            return;
        } else if constexpr (STREAM_QUERY) {  // the rows stream with the documents: what each row is, only
            for (int row = tid; row < QUERY_ROWS; row += CONSUMER_THREADS) {
                const int j = row % GROUP_ROWS / query_length, token = row % GROUP_ROWS % query_length;
                // BOXES_WITHIN_Q: box row j * Lq holds query j - query_box_shift of the warpgroup
                const int shift = BOXES_WITHIN_Q ? query_box_shift(row / GROUP_ROWS) : 0;
                const int g = (row / GROUP_ROWS) * queries_per_warpgroup + j - shift;
                const bool real = query_token_real(args, first_query + g, token, j < queries_per_warpgroup && g < group_size
                                                                                     && (!BOXES_WITHIN_Q || j >= shift));
                sRowQuery()[row] = real ? g : -1;
                if constexpr (SCALED) sRowScale()[row] = real ? query_scale(args, first_query + g, token) : 0.f;
                sRowBad()[row] = false;  // (a non-finite token: its similarities, NaN in the fold)
            }
            consumers_sync();
            return;
        }
        for (int c = tid; c < QUERY_ROWS * CHUNKS; c += CONSUMER_THREADS) {
            const int row = c / CHUNKS, chunk = c % CHUNKS;
            const int f = group_row_of(row % GROUP_ROWS);  // -1: a padding row (no query)
            const int j = f < 0 ? queries_per_warpgroup : f / query_length, token = f < 0 ? 0 : f % query_length;
            const int g = (row / GROUP_ROWS) * queries_per_warpgroup + j;
            const i64 query = first_query + g;
            if (STREAM_K && f < 0) {  // a padding row: no storage, its fragments are zero registers
                if (chunk == 0) sRowQuery()[row] = -1;
                if (SCALED && chunk == 0) sRowScale()[row] = 0.f;
                continue;
            }
            const bool real = stage_query_chunk<T>(args, query_chunk(row, chunk), query, token, chunk,
                                                   j < queries_per_warpgroup && g < group_size);
            if (chunk == 0) {
                sRowQuery()[row] = real ? g : -1;
                if constexpr (SCALED) sRowScale()[row] = real ? query_scale(args, query, token) : 0.f;
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        consumers_sync();
        // Non-finite query tokens are flagged once and zeroed (int8 tokens cannot be; their scales
        // are checked with the max). The row pitch keeps rows 16-byte aligned.
        for (int row = tid; row < QUERY_ROWS; row += CONSUMER_THREADS) {
            bool bad = false;
            if constexpr (!SCALED)
                if (!STREAM_K || group_row_of(row) >= 0)
                    bad = DOCS_ON_M ? zero_if_non_finite<T>((u16*)query_line(row), CHUNKS, row, QUERY_ATOM_BYTES)
                                    : zero_if_non_finite<T>(query_row(row), CHUNKS);
            sRowBad()[row] = bad;
        }
        consumers_sync();
    }

    // Splitting documents, the query not staged as it is (SPLIT_STREAM_QUERY: read from the
    // slots; TF32_DOC_ROWS: staged split): what each of the group's half rows is, and which real
    // tokens hold NaN or inf (read from q, whose rows start on ALIGN bytes).
    template <typename T, int ALIGN> __device__ __forceinline__ void note_group_rows(const ForwardArgs& args) {
        constexpr bool SCALED = Codec<T>::SCALED;
        for (int row = tid; row < QUERY_ROWS; row += CONSUMER_THREADS) {
            const int f = group_row_of(row);  // -1: a padding row
            const int j = f < 0 ? 0 : f / query_length, token = f < 0 ? 0 : f % query_length;
            const bool real = query_token_real(args, first_query + j, token, f >= 0 && j < queries_per_warpgroup
                                                                             && j < group_size);
            sRowQuery()[row] = real ? j : -1;
            if constexpr (SCALED) sRowScale()[row] = real ? query_scale(args, first_query + j, token) : 0.f;
            sRowBad()[row] = 0;
        }
        consumers_sync();
        if constexpr (!SCALED) {  // every consumer thread a share of the real rows' chunks, from q
            const int chunks = (args.dim + Codec<T>::CHUNK_ELEMS - 1) / Codec<T>::CHUNK_ELEMS;
            for (int c = tid; c < 32 * chunks; c += CONSUMER_THREADS) {
                const int f = c / chunks, row = query_row_of(f);
                if (sRowQuery()[row] >= 0 &&
                    query_chunk_non_finite<T, ALIGN>(args, first_query + f / query_length, f % query_length, c % chunks))
                    sRowBad()[row] = 1;  // (every writer writes 1)
            }
            consumers_sync();
        }
    }

    // TF32_DOC_ROWS: the group's rows split into TF32 halves, B of the consumers' MMAs (see
    // there): row f's big half at row f of each atom, its small half at row 32 + f, in the
    // 128-byte swizzle (chunk c of a row at (c ^ row % 8), and 32 + f sits where f does); zeros
    // for rows that are not real tokens, past the dim, and for tokens holding NaN or inf
    // (flagged). Plain loads of q's elements (any alignment), once a block.
    __device__ __forceinline__ void stage_split_query(const ForwardArgs& args) {
        auto element = [&](int f, int e) {  // q's element e of group row f
            return ((const u32*)args.q)[(first_query + f / query_length) * args.q_query_stride +
                                        (i64)(f % query_length) * args.q_row_stride + e];
        };
        note_group_rows<float, LOAD_BYTES>(args);
        constexpr int CHUNKS_A_ROW = ATOMS * 8;
        for (int c = tid; c < 32 * CHUNKS_A_ROW; c += CONSUMER_THREADS) {
            const int f = c / CHUNKS_A_ROW, chunk = c % CHUNKS_A_ROW, row = query_row_of(f);
            const bool kept = sRowQuery()[row] >= 0 && !sRowBad()[row];
            u32 big[4], small[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
                split_tf32_bits(kept && 4 * chunk + e < args.dim ? element(f, 4 * chunk + e) : 0u, big[e], small[e]);
            unsigned char* line = (unsigned char*)sQ() + (chunk / 8) * SPLIT_QUERY_ATOM_BYTES + (((chunk % 8) ^ (f % 8)) << 4);
            *(uint4*)(line + f * 128) = make_uint4(big[0], big[1], big[2], big[3]);
            *(uint4*)(line + (32 + f) * 128) = make_uint4(small[0], small[1], small[2], small[3]);
        }
        fence_proxy_async();  // the tensor cores read the block through the async proxy
        consumers_sync();
    }

    // ---- Producer warpgroup ------------------------------------------------------------
    // STREAM_QUERY: every warpgroup's query atom for k atom k_atom into the slot at `tile`, after
    // the documents' (one box of its queries' rows each), counted on the slot's full barrier;
    // and the bytes its boxes fall short of whole atoms (a box holds whole queries: 108 rows of
    // 128 when Lq is 27). Members, so that the builds without them carry none of their code
    // (as lambdas in produce, unused, they moved ptxas's allocation: 4-byte spills in three
    // warpgroups' int8 and 128-row bf16 builds).
    template <typename T>
    __device__ __forceinline__ void load_query_atoms(const DocTileMap& tile_map, unsigned char* tile, int k_atom, int stage) const {
        if constexpr (SPLIT_DOCS) {  // every warpgroup reads the group's one box
            tma_load_3d(tile + SLOT_ATOMS * ATOM_BYTES, tile_map.query_map, k_atom * 8 * Codec<T>::CHUNK_ELEMS, 0,
                        (int)first_query, full() + stage);
            return;
        }
        for (int w = 0; w < WARPGROUPS; ++w)
            if (!BOXES_WITHIN_Q || w < query_boxes)  // (a warpgroup without queries: no box)
                tma_load_3d(tile + SLOT_ATOMS * ATOM_BYTES + w * QUERY_ATOM_BYTES, tile_map.query_map,
                            k_atom * 8 * Codec<T>::CHUNK_ELEMS, 0,
                            BOXES_WITHIN_Q ? (int)query_box_first(w) : (int)first_query + w * queries_per_warpgroup,
                            full() + stage);
    }
    __device__ __forceinline__ u32 query_box_shortfall() const {
        return BOXES_WITHIN_Q || SPLIT_STREAM_QUERY ? box_shortfall
                                                    : WARPGROUPS * (QUERY_COLS - queries_per_warpgroup * query_length) * 128;
    }
    // ---- FP32_SPLIT: the producer's conversion (see FP32_SPLIT) ----------------------------
    // Lanes 8k..8k+7 of a copy warp take rows my_row + 4p of a tile (p < SPLIT_PASSES), each
    // lane the 8 elements at 8 my_chunk of every 64 (the 16-byte chunk of halves it writes).
    // A row's exponent k (2^k brings its largest magnitude into [2^14, 2^15): codecs.cuh
    // split_exponent) comes with the launch, where the tiles' int8 scales come from (args.d_scale
    // read as int: launch.split_exponents, SPLIT_ZERO for a masked row, SPLIT_BAD for one
    // holding NaN or inf).
    __device__ __forceinline__ unsigned char* split_stage(int buf) const { return sSmall() + buf * SPLIT_STAGE_BYTES; }
    // Where producer lane `ptid` stages half `half` (4 elements) of its row pass p.
    __device__ __forceinline__ static int split_piece(int p, int half, int ptid) { return ((2 * p + half) * 128 + ptid) * 16; }
    // Chunk c of the tile at `at` into stage `buf` by cp.async: this lane's pieces of its rows
    // (zeros past the dim; nothing for rows past the document, which are written as zeros), and
    // with the tile's first chunk its rows' exponents (by each row's first lane). Then a commit,
    // also past the block's documents (an empty group): the waits count a group a chunk.
    __device__ __forceinline__ void stage_split_chunk(const ForwardArgs& args, const DocCursor& at, int c, int buf,
                                                      int my_row, int my_chunk, int ptid) const {
        if (at.position < doc_count) {
            const int first_row = at.tile * TILE_N, rows_left = (int)min(at.length - first_row, (i64)TILE_N);
            unsigned char* stage = split_stage(buf);
            const float* row0 = (const float*)args.d + at.base + (first_row + my_row) * args.d_row_stride;
            const i64 scale_base = args.offsets == nullptr ? at.doc * args.d_scale_doc_stride
                                                           : at.first_token * args.d_scale_row_stride;
            const int e = 64 * c + 8 * my_chunk;
#pragma unroll
            for (int p = 0; p < SPLIT_PASSES; ++p) {
                const int r = my_row + 4 * p;
                if (r >= rows_left) continue;
                const float* row = row0 + 4 * p * args.d_row_stride;
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int bytes = min(max(4 * (args.dim - e - 4 * half), 0), 16);
                    copy_chunk<LOAD_BYTES>(stage + split_piece(p, half, ptid),
                                           bytes ? (const void*)(row + e + 4 * half) : (const void*)row, bytes);
                }
                if (c == 0 && my_chunk == 0)
                    cp_async_4(stage + TILE_N * 256 + 4 * r,
                               args.d_scale + scale_base + (first_row + r) * args.d_scale_row_stride, 4);
            }
        }
        cp_async_commit();
    }
    // The exponents of this lane's rows, from the stage of their tile's first chunk (SPLIT_ZERO
    // past the document).
    __device__ __forceinline__ void split_exponents(int buf, int rows_left, int my_row,
                                                    int (&exponents)[SPLIT_PASSES]) const {
        const int* staged = (const int*)(split_stage(buf) + TILE_N * 256);
#pragma unroll
        for (int p = 0; p < SPLIT_PASSES; ++p) exponents[p] = my_row + 4 * p < rows_left ? staged[my_row + 4 * p] : SPLIT_ZERO;
    }
    // A staged chunk as its halves: big into the slot at `big` (part 0), small into the next
    // slot's (part 1), in the 128-byte swizzle as TMA would write them (the chunk's third part,
    // big again, is copied from the first's slot: copy_split_big).
    __device__ __forceinline__ void convert_split_chunk(int buf, unsigned char* big, unsigned char* small, int my_row,
                                                        int my_chunk, int ptid,
                                                        const int (&exponents)[SPLIT_PASSES]) const {
        const unsigned char* stage = split_stage(buf);
#pragma unroll
        for (int p = 0; p < SPLIT_PASSES; ++p) {
            const int r = my_row + 4 * p, k = exponents[p];
            uint4 bigs = make_uint4(0u, 0u, 0u, 0u), smalls = bigs;
            if (k != SPLIT_ZERO && k != SPLIT_BAD) {
                const float4 a = *(const float4*)(stage + split_piece(p, 0, ptid));
                const float4 b = *(const float4*)(stage + split_piece(p, 1, ptid));
                const float scale = power_of_two(k);
                split_halves(a.x * scale, a.y * scale, bigs.x, smalls.x);
                split_halves(a.z * scale, a.w * scale, bigs.y, smalls.y);
                split_halves(b.x * scale, b.y * scale, bigs.z, smalls.z);
                split_halves(b.z * scale, b.w * scale, bigs.w, smalls.w);
            }
            const int at = r * 128 + ((my_chunk ^ (r & 7)) << 4);
            *(uint4*)(big + at) = bigs;
            *(uint4*)(small + at) = smalls;
        }
    }
    // A chunk's third part: this lane's 16-byte chunks of the big halves, from the chunk's first
    // slot (`from`: this producer wrote it two slots ago, and it alone writes slots, not again
    // before it wraps the ring) into `to`.
    __device__ __forceinline__ static void copy_split_big(const unsigned char* from, unsigned char* to, int my_row,
                                                          int my_chunk) {
#pragma unroll
        for (int p = 0; p < SPLIT_PASSES; ++p) {
            const int r = my_row + 4 * p, at = r * 128 + ((my_chunk ^ (r & 7)) << 4);
            *(uint4*)(to + at) = *(const uint4*)(from + at);
        }
    }
    // The tile's last slot carries each of this lane's rows' 2^-k into the slot's scales (the
    // fold's, as int8's): NaN for a row holding NaN or inf, 1 for one written as zeros.
    __device__ __forceinline__ void publish_split_scales(int stage, int my_row, const int (&exponents)[SPLIT_PASSES]) const {
#pragma unroll
        for (int p = 0; p < SPLIT_PASSES; ++p) {
            const int k = exponents[p];
            sScale()[stage * TILE_N + my_row + 4 * p] = k == SPLIT_BAD ? __int_as_float(0x7fc00000)
                                                        : k == SPLIT_ZERO ? 1.f : power_of_two(-k);
        }
    }
    // With a TMA map, one lane of its first warp issues each tile (ATOMS boxes; for int8 a box
    // of the tile's document scales, or that warp's lanes copy them with cp.async). Without, its 4
    // warps (one per scheduler: one warp cannot issue cp.async fast enough) copy a quarter
    // of each tile's rows. Splitting documents, warp r does either for ring r alone.
    template <typename T> __device__ __forceinline__ void produce(const ForwardArgs& args, const DocTileMap& tile_map) {
        constexpr bool SCALED = Codec<T>::SCALED;
        constexpr int ELEMS = Codec<T>::CHUNK_ELEMS;  // elements per 16-byte chunk
        const T* __restrict__ d = (const T*)args.d;
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(producer_registers<T>()));
        // Splitting documents, warp r feeds ring r (a fourth warp idles); otherwise TMA needs
        // only the first warp.
        const int producer_warp = warp - CONSUMER_WARPS;
        if (SPLIT_DOCS ? producer_warp >= RINGS : tile_map.use_tma && producer_warp != 0) return;
        const int ring_first = (SPLIT_DOCS ? producer_warp : 0) * RING, ring_end = ring_first + RING;
        constexpr int ROWS_PER_WARP = TILE_N / COPY_WARPS;
        // Lanes 8k..8k+7 copy the 8 chunks (one 128-byte line of global memory) of one row's
        // atom; in shared memory they land on 8 distinct bank groups of that row's swizzled line.
        const int my_chunk = lane & 7, my_row = (SPLIT_DOCS ? 0 : producer_warp) * ROWS_PER_WARP + (lane >> 3);
        // Splitting documents: the block's next unclaimed document position (warpgroups with
        // shorter documents take more of them, and none is left with a tail of its own).
        auto claim = [&]() -> i64 {
            unsigned position = 0;
            if (lane == 0) position = atomicAdd(sNextDoc(), 1u);
            return (i64)__shfl_sync(0xffffffffu, position, 0);
        };
        // Splitting, the producer claims a document ahead of the one it copies, so that the
        // next document's extent (packed: two offsets from global memory) has arrived when its
        // first tile is issued, instead of stalling the ring once per document.
        // (Only its raw bounds are kept until then: anything computed from them at once would
        // wait for the loads there.)
        DocCursor load;
        open_doc(load, SPLIT_DOCS ? claim() : 0);
        i64 ahead = 0, ahead_begin = 0, ahead_end = 0;
        auto claim_ahead = [&]() {
            ahead = claim();
            if (ahead < doc_count) doc_bounds(layout, doc_at(ahead), ahead_begin, ahead_end);
        };
        if constexpr (SPLIT_DOCS) claim_ahead();
        int stage = ring_first;  // the ring slot
        u32 phase = 0;
        // The loop, specialised for each way of copying (called with a constant).
        const int tile_slots = slots_per_tile<T>(args.dim);
        // FP32_SPLIT: this lane's rows' exponents (split_exponents), the next chunk to stage
        // (`staged`'s tile, chunk staged_chunk) and the stage of the next to convert.
        int exponents[SPLIT_PASSES];
        DocCursor staged = load;
        int staged_chunk = 0, split_buf = 0;
        const int split_chunks = (args.dim + 63) / 64, ptid = 32 * producer_warp + lane;
        auto stage_next = [&](int buf) {
            stage_split_chunk(args, staged, staged_chunk, buf, my_row, my_chunk, ptid);
            if (++staged_chunk == split_chunks) staged_chunk = 0, next_tile(staged);
        };
        if constexpr (SPLIT_STAGED)
            for (int buf = 0; buf < SPLIT_STAGES; ++buf) stage_next(buf);
        auto produce = [&](const bool tma) {
        int t = 0;  // slots filled
        for (; load.position < doc_count;) {
            for (int k_atom = 0; k_atom < tile_slots; ++k_atom, ++t) {
                // The tile's last slot carries its int8 scales (the fold reads them there).
                const bool tile_end = k_atom + 1 == tile_slots;
                if (t >= RING) mbarrier_wait(empty() + stage, phase ^ 1);
                if (SPLIT_DOCS && lane == 0)  // published by lane 0's arrival
                    sSlotDoc()[stage] = load.position, sSlotLength()[stage] = load.length;
                const int first_row = load.tile * TILE_N;
                const int rows_left = (int)min(load.length - first_row, (i64)TILE_N);
                unsigned char* tile = sD() + stage * TILE_BYTES;
                const i64 scale_base = args.offsets == nullptr ? load.doc * args.d_scale_doc_stride
                                                               : load.first_token * args.d_scale_row_stride;
                // int8: the document scale of tile row r (0 past the document's end).
                auto copy_scale = [&](int r, bool real) {
                    if constexpr (SCALED)
                        cp_async_4(sScale() + stage * TILE_N + r,
                                   real ? (const void*)(args.d_scale + scale_base + (first_row + r) * args.d_scale_row_stride)
                                        : (const void*)args.d_scale,
                                   real ? 4 : 0);
                };
                if (tma) {
                    if (lane == 0) {
                        mbarrier_arrive_expect_tx(full() + stage,
                                                  TILE_BYTES + (scales_by_tma && tile_end ? TILE_N * 4 : 0) -
                                                      (STREAM_QUERY ? query_box_shortfall() : 0));
                        const int y = (int)(tile_map.packed ? load.first_token + first_row : first_row);
                        const int z = tile_map.packed ? 0 : (int)load.doc;
#pragma unroll
                        for (int atom = 0; atom < SLOT_ATOMS; ++atom)  // (FP32_SPLIT: one atom a slot)
                            tma_load_3d(tile + atom * ATOM_BYTES, tile_map.map,
                                        (SPLIT_BEFORE ? split_document_atom(k_atom) : k_atom + atom) * 8 * ELEMS, y, z,
                                        full() + stage);
                        // Rows past the document hold the next document's scales, or zeros past the
                        // tensor: their columns are not real, whatever they hold.
                        if (scales_by_tma && tile_end)
                            tma_load_scales(sScale() + stage * TILE_N, tile_map, y, z, full() + stage);
                        if constexpr (STREAM_QUERY) load_query_atoms<T>(tile_map, tile, k_atom, stage);
                    }
                    if (scales_by_lanes) {  // (their arrivals are counted in every slot)
                        if (tile_end)
                            for (int r = lane; r < TILE_N; r += 32) copy_scale(r, r < rows_left);
                        cp_async_mbarrier_arrive(full() + stage);
                    }
                } else {
                    if constexpr (STREAM_QUERY) {
                        if ((SPLIT_DOCS || producer_warp == 0) && lane == 0) {  // (splitting: each ring's)
                            mbarrier_arrive_expect_tx(full() + stage, SLOT_QUERY_BYTES - query_box_shortfall());
                            load_query_atoms<T>(tile_map, tile, k_atom, stage);
                        }
                    }
                    if constexpr (SPLIT_STAGED) {
                        // A chunk's three slots: part 0 (big) and part 1 (small) written at part 0
                        // from one read of the chunk's elements (the next slot waited for early),
                        // part 2 (big again) copied from part 0's slot.
                        const int part = k_atom % 3, next = stage + 1 == ring_end ? ring_first : stage + 1;
                        if (part == 0) {
                            if (t + 1 >= RING) mbarrier_wait(empty() + next, next == ring_first ? phase : phase ^ 1);
                            cp_async_wait<SPLIT_STAGES - 1>();  // this lane's pieces of the chunk landed,
                            __syncwarp();  // and (seen once its rows' first lanes have waited) their exponents
                            if (k_atom == 0) split_exponents(split_buf, rows_left, my_row, exponents);
                            convert_split_chunk(split_buf, tile, sD() + next * TILE_BYTES, my_row, my_chunk, ptid, exponents);
                            __syncwarp();  // (every lane has read the exponents before the stage is refilled)
                            stage_next(split_buf);
                            if (++split_buf == SPLIT_STAGES) split_buf = 0;
                        } else if (part == 2) {
                            const int first = stage - 2 >= ring_first ? stage - 2 : stage - 2 + RING;
                            copy_split_big(sD() + first * TILE_BYTES, tile, my_row, my_chunk);
                        }
                        if (tile_end && my_chunk == 0) publish_split_scales(stage, my_row, exponents);
                        // The consumers' wgmma reads the halves (the async proxy): each lane fences
                        // its stores, then one arrival a warp, not 128 on one barrier.
                        fence_proxy_async();
                        __syncwarp();
                        if (lane == 0) mbarrier_arrive(full() + stage);
                        if (++stage == ring_end) stage = ring_first, phase ^= 1;
                        continue;
                    }
                    const T* src = d + load.base + (first_row + my_row) * args.d_row_stride + (k_atom * 8 + my_chunk) * ELEMS;
#pragma unroll 4
                    for (int pass = 0; pass < ROWS_PER_WARP / 4; ++pass) {
                        const int r = my_row + 4 * pass;
                        bool real = r < rows_left;
                        if (real && args.d_mask != nullptr)
                            real = args.d_mask[load.doc * args.d_mask_doc_stride + (first_row + r) * args.d_mask_row_stride] != 0;
                        unsigned char* line = tile + r * 128 + ((my_chunk ^ (r & 7)) << 4);
#pragma unroll
                        for (int atom = 0; atom < SLOT_ATOMS; ++atom) {
                            const int chunk = (k_atom + atom) * 8 + my_chunk;
                            // A dim's last chunk may be partial (dim 100 in 16-bit: 8 bytes), rows
                            // 4- or 8-byte aligned come in pieces (LOAD_BYTES); the rest is zeros.
                            const int bytes = real && chunk < CHUNKS ? chunk_bytes<T>(args.dim, chunk * ELEMS) : 0;
                            copy_chunk<LOAD_BYTES>(line + atom * ATOM_BYTES,
                                                   bytes ? (const void*)(src + atom * 8 * ELEMS) : (const void*)d, bytes);
                        }
                        if (my_chunk == 0 && tile_end) copy_scale(r, real);
                        src += 4 * args.d_row_stride;
                    }
                    // Each lane's arrival on the tile's barrier fires once its copies have landed.
                    cp_async_mbarrier_arrive(full() + stage);
                    if (SPLIT_DOCS && lane == 0) mbarrier_arrive(full() + stage);
                }
                if (++stage == ring_end) stage = ring_first, phase ^= 1;
            }
            if constexpr (SPLIT_DOCS) {
                if (++load.tile == load.tiles) {
                    load.position = ahead, load.tile = 0;
                    if (ahead < doc_count) {
                        load.doc = doc_at(ahead);
                        extent_of_bounds(layout, load.doc, ahead_begin, ahead_end, load.base, load.length,
                                         load.first_token);
                        load.tiles = doc_tiles(load.length);
                    }
                    claim_ahead();
                }
            } else {
                next_tile(load);
            }
        }
        if constexpr (SPLIT_DOCS) {
            // The ring's end: a slot with no tile, every arrival its barrier counts.
            if (t >= RING) mbarrier_wait(empty() + stage, phase ^ 1);
            if (lane == 0) {
                sSlotDoc()[stage] = -1;
                mbarrier_arrive(full() + stage);
            }
            if (!tma || scales_by_lanes) mbarrier_arrive(full() + stage);
        }
        };
        if (tile_map.use_tma)
            produce(true);
        else
            produce(false);
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }
};

// What the fold of a tile needs to know, recorded when its MMAs are issued.
struct TileInfo {
    i64 doc;
    int stage, first_column, columns;  // columns: real-or-masked tokens of the tile (<= 64)
    bool biased, last;
    bool tile_end;  // streaming k: the tile's last atom (its accumulators are whole); else true
};


// A consumer warpgroup's thread: its place in the block, and the per-document state of both
// consumer loops (whether a real token was seen, the witness of non-finite document elements,
// what it sums differing by loop, and the parity of the per-document buffers).
struct Consumer : Block {
    int warpgroup, warp_in_group, row0, query_row0, group_first, group_count;
    bool has_row;
    float witness;
    int parity;

    __device__ __forceinline__ Consumer(const ForwardArgs& args, const DocTileMap& tile_map, unsigned char* smem_raw,
                                        bool scaled)
        : Block(args, tile_map, smem_raw, scaled) {
        warpgroup = warp / 4, warp_in_group = warp % 4;
        row0 = warp * 16;  // this warp's first accumulator row
        query_row0 = SPLIT_DOCS ? warp_in_group * 16 : row0;  // ... and its query row
        // The queries whose scores this warpgroup sums (it owns them).
        group_first = SPLIT_DOCS ? 0 : warpgroup * queries_per_warpgroup;
        group_count = max(0, min(queries_per_warpgroup, group_size - group_first));
        has_row = false, witness = 0.f, parity = 0;
    }

    // Scores of a finished document, by the warpgroup that owns the queries: one warp per
    // query, its lanes over the query's tokens (epilogue.cuh).
    template <typename T> __device__ __forceinline__ void finish_document(const ForwardArgs& args, i64 finished_doc, int parity) {
        constexpr bool SCALED = Codec<T>::SCALED;
        bool doc_has_row = false, doc_bad = false;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            doc_has_row |= sHasRow()[parity * WARPS + warpgroup * 4 + w] != 0;
            doc_bad |= sDocBad()[parity * WARPS + warpgroup * 4 + w] != 0;
        }
        for (int j = warp_in_group; j < group_count; j += 4) {
            const FinishedRows rows{sRowMax(), sRowScale(), sRowQuery(), sRowBad(), sRowArg(),
                                    (BOXES_WITHIN_Q ? j + query_box_shift(warpgroup) : j) * query_length,
                                    SPLIT_DOCS ? 0 : warpgroup * GROUP_ROWS, parity * BLOCK_ROWS + warpgroup * GROUP_ROWS,
                                    (parity * CONSUMER_WARPS + warpgroup * 4) * COLUMN_SLOTS};
            if constexpr (PART_MAXIMA)  // (the "document" is a part: its record, epilogue.cuh)
                warp_emit_part<SCALED>(args, first_query + group_first + j, finished_doc, lane, doc_has_row, doc_bad, rows);
            else
                warp_finish_document<ARGMAX, SCALED>(args, first_query + group_first + j, finished_doc, lane, doc_has_row,
                                                     doc_bad, rows);
        }
    }

    // A document's maxima are published (by the caller): its warps' flags follow, then the
    // warpgroup sums its queries' scores.
    template <typename T> __device__ __forceinline__ void close_document(const ForwardArgs& args, i64 doc) {
        const bool warp_has_row = __any_sync(0xffffffffu, has_row);
        const bool warp_bad = __any_sync(0xffffffffu, !(fabsf(witness) < MAXSIM_INF));
        if (lane == 0) sHasRow()[parity * WARPS + warp] = warp_has_row, sDocBad()[parity * WARPS + warp] = warp_bad;
        has_row = false;
        witness = 0.f;
        // Per-document buffers alternate by parity: a warp reaches this barrier for the next
        // document only after it finished reading this one.
        warpgroup_sync();
        finish_document<T>(args, doc, parity);
        parity ^= 1;
    }

    // ---- Documents on M: one loop, one accumulator set (64 registers) ------------------
    // A document's maxima, the max over each warp's 16 rows, published per warp: the 8 lanes of
    // a quad hold the same columns, and reduce them by halves (reduce-scatter: each round a lane
    // sends the half of its columns its partner keeps: 28 shuffles instead of 96; with the
    // argmax, its winners beside them, 42 instead of 192), so that lane l ends with column pairs
    // 8 b4 + 4 b3 + 2 b2 + {0, 1} (b: the bits of l).
    template <int N> __device__ __forceinline__ void publish_column_maxima(float (&best)[N], u32 (&winners)[N / 2]) {
        const int slots = (parity * CONSUMER_WARPS + warp) * QUERY_COLS;
        float2* published = (float2*)(sRowMax() + slots);
        const int pair = 8 * ((lane >> 4) & 1) + 4 * ((lane >> 3) & 1) + 2 * ((lane >> 2) & 1);
        if constexpr (!ARGMAX) {
            keep_max_of_halves<16>(best, lane);  // the lanes 16 apart: pairs 8 b4 + 0..7
            keep_max_of_halves<8>(best, lane);   // 8 apart: 8 b4 + 4 b3 + 0..3
            keep_max_of_halves<4>(best, lane);   // 4 apart: 8 b4 + 4 b3 + 2 b2 + 0..1
        } else {
            keep_best_of_halves<8>(best, winners, lane);
            keep_best_of_halves<4>(best, winners, lane);
            keep_best_of_halves<2>(best, winners, lane);
            int2* published_rows = (int2*)(sRowArg() + slots);
            published_rows[4 * pair + quad] = make_int2((short)(winners[0] & 0xffffu), (short)(winners[0] >> 16));
            published_rows[4 * (pair + 1) + quad] = make_int2((short)(winners[1] & 0xffffu), (short)(winners[1] >> 16));
        }
        published[4 * pair + quad] = make_float2(best[0], best[1]);
        published[4 * (pair + 1) + quad] = make_float2(best[2], best[3]);
    }

    // DOCS_ON_M: tile t multiplies, then folds into the running column maxima; the block's
    // other warpgroups keep the tensor cores busy meanwhile. Every warpgroup reads every tile
    // of the block's single ring. A document's first tile is folded apart (peeled), so that
    // its maxima are dead between documents: nothing resets them.
    // A warpgroup whose queries all lie past the last (the last query group's, e.g. the third
    // of 32 queries of 32 tokens in blocks of three warpgroups of four) multiplies nothing where
    // its group has ranges of its own: it frees each slot once filled, as the others take the
    // same tiles, so that the tensor cores do only the real warpgroups' MMAs (the planner gives
    // that group longer ranges: _plan/forward.idle_group_ranges). With the others' ranges it
    // multiplies as they do: run ahead, the group's blocks would read from DRAM what the other
    // groups' blocks read a moment later from L2 (5% slower on the H100). Not in turns (a turn
    // would wait for it).
    // (Chosen before the consumers take their registers: a branch to it inside consume_docs_on_m
    // made ptxas spill in 21 of the 80 documents-on-M builds and copy the fold, 28 FMNMX and 54
    // FSEL more at fp16 dim 128.)
    __device__ __forceinline__ void idle_docs_on_m(int tile_slots) {
        DocCursor cursor;
        open_doc(cursor, 0);
        int stage = 0;
        u32 phase = 0;
#pragma unroll 1
        while (cursor.position < doc_count) {
#pragma unroll 1
            for (int s = 0; s < tile_slots; ++s) {
                mbarrier_wait(full() + stage, phase);
                __syncwarp();
                if (lane == 0) mbarrier_arrive(empty() + stage);
                if (++stage == STAGES) stage = 0, phase ^= 1;
            }
            next_tile(cursor);
        }
    }

    template <typename T> __device__ __forceinline__ void consume_docs_on_m(const ForwardArgs& args, const DocTileMap& tile_map) {
        typedef typename WgmmaTile<T>::acc_t Acc;
        constexpr bool SCALED = Codec<T>::SCALED;
        DocCursor cursor;
        open_doc(cursor, 0);
        int stage = 0;
        u32 phase = 0;
        const unsigned long long query_desc = tile_descriptor((unsigned char*)sQ() + warpgroup * QUERY_BLOCK_BYTES);
        const int r0 = warp_in_group * 16 + (lane >> 2);  // this thread's tile rows: r0 and r0 + 8
        // best[2j + c]: query column 8j + 2 quad + c, max over the thread's rows of the document so far.
        float best[ACC / 2];
        // ARGMAX: the document rows of best[2j] and best[2j + 1], 16 bits each in winners[j]
        // (0xffff: none). Rows fit: documents on M saves int16 winners only (every document
        // shorter than 32768 tokens); packed, they leave registers for three warpgroups.
        u32 winners[ACC / 4];  // (unused without the argmax: no registers)
        // The witness: every real row of the document against query column 2 quad, summed.
        Acc acc[M_HALVES][ACC];  // (M_HALVES 2: the tile's rows 64 to 127 in acc[1])
        // Rows that are not real (padding, masked, past the document: a TMA tile holds whatever
        // memory is there) become -FLT_MAX, never added to (called with a constant, as above).
        // FIRST (a document's first tile): the maxima start from this tile, so that they are
        // dead between documents (no reset; registers free for the close).
        auto fold_rows = [&](const int h, bool real0, bool real1, float s0, float s1, int first_row, const bool BIASED,
                             const bool FIRST) {
#pragma unroll
            for (int i = 0; i < ACC / 2; ++i) {
                const int j = i / 2, c = i % 2;
                float v0 = accumulator_to_float<KSTEPS * 32>(acc[h][4 * j + c]);
                float v1 = accumulator_to_float<KSTEPS * 32>(acc[h][4 * j + 2 + c]);
                if constexpr (SCALED) v0 *= s0, v1 *= s1;
                if constexpr (STREAM_QUERY && !SCALED) v0 = nan_if_infinite(v0), v1 = nan_if_infinite(v1);
                if (BIASED) v0 = real0 ? v0 : -MAXSIM_FLT_MAX, v1 = real1 ? v1 : -MAXSIM_FLT_MAX;
                const float v = max_nan(v0, v1);
                // Tiles come in increasing order, and strict >: the first maximum wins (a tie
                // within the pair keeps the lower row). From a first tile: as if from -inf.
                if constexpr (ARGMAX) {
                    const u32 row = first_row + (v1 > v0 ? r0 + 8 : r0);
                    if (FIRST) {
                        const u32 won = v > MAXSIM_NEG_INF ? row : 0xffffu;
                        winners[i / 2] = i % 2 ? (winners[i / 2] & 0xffffu) | (won << 16) : 0xffff0000u | won;
                    } else if (v > best[i]) {
                        winners[i / 2] = i % 2 ? (winners[i / 2] & 0xffffu) | (row << 16) : (winners[i / 2] & 0xffff0000u) | row;
                    }
                }
                best[i] = FIRST ? v : max_nan(best[i], v);
            }
        };
        // A tile in the tensor cores' hands, and what its fold needs (read while they work).
        struct TileFold {
            i64 doc;
            int first_row, slot;
            bool biased, last;
            bool real[2 * M_HALVES];  // rows r0, r0 + 8 (and r0 + 64, r0 + 72)
            float s[2 * M_HALVES];
        };
        // Hand the current slot (the cursor's tile's atom k_atom; without STREAM_K all of its k)
        // to the tensor cores.
        // STREAM_QUERY: the warpgroup's query atom follows the documents' in the slot.
        // `fresh`: the atom starts the accumulators afresh (FP32_SPLIT's flushes), as a tile's first.
        auto issue_slot = [&](int k_atom, bool fresh = false) {
            mbarrier_wait(full() + stage, phase);
            // cp.async tiles: generic -> async proxy (the split build's producer fences its own stores).
            if (!tile_map.use_tma && !FP32_SPLIT) fence_proxy_async();
            const unsigned char* slot = sD() + stage * TILE_BYTES;
            const unsigned char* slot_query = slot + SLOT_ATOMS * ATOM_BYTES + warpgroup * QUERY_ATOM_BYTES;
            const unsigned long long doc_desc = tile_descriptor(slot);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < (STREAM_K ? 4 : KSTEPS); ++ks) {
                WgmmaDocsOnM<T>::run(acc[0], doc_desc + kstep_offset(ks),
                                     STREAM_QUERY ? tile_descriptor(slot_query) + query_kstep_offset(ks)
                                                  : query_desc + query_kstep_offset(4 * k_atom + ks),
                                     (fresh ? 0 : k_atom) + ks);
                if constexpr (M_HALVES == 2)  // rows 64 on: 8 KB on in the atom, whole swizzle periods
                    WgmmaDocsOnM<T>::run(acc[M_HALVES - 1], doc_desc + ((64 * 128) >> 4) + kstep_offset(ks),
                                         STREAM_QUERY ? tile_descriptor(slot_query) + query_kstep_offset(ks)
                                                      : query_desc + query_kstep_offset(4 * k_atom + ks),
                                         (fresh ? 0 : k_atom) + ks);
            }
            wgmma_commit();
        };
        // FP32_SPLIT: the tile's sums of flushed accumulators (SPLIT_FLUSH_ATOMS), added back at its take.
        float sums[FP32_SPLIT ? ACC : 1];
#pragma unroll
        for (int i = 0; i < (FP32_SPLIT ? ACC : 1); ++i) sums[i] = 0.f;
        auto next_slot = [&]() {
            if (++stage == STAGES) stage = 0, phase ^= 1;
        };
        // STREAM_K: a tile is tile_slots slots, an atom each, multiplied into the same
        // accumulators against the same atom of the query block; an atom's slot is freed once
        // the next atom's MMAs are issued and its own are done (the tile's last slot by take).
        const int tile_slots = slots_per_tile<T>(args.dim);
        // Hand the cursor's tile to the tensor cores and move the cursor on.
        auto issue = [&]() -> TileFold {
            TileFold tile;
            tile.doc = cursor.doc, tile.first_row = cursor.tile * TILE_N;
            const int rows = (int)min(cursor.length - tile.first_row, (i64)TILE_N);
            tile.biased = args.d_mask != nullptr || rows < TILE_N, tile.last = cursor.tile + 1 == cursor.tiles;
            if constexpr (TURNS) wait_turn(warpgroup);
            issue_slot(0);
            if constexpr (TURNS) pass_turn(warpgroup);
            if constexpr (STREAM_K) {
#pragma unroll 1
                for (int k_atom = 1; k_atom < tile_slots; ++k_atom) {
                    const int previous = stage;
                    next_slot();
                    bool fresh = false;
                    if constexpr (FP32_SPLIT) {
                        if (k_atom % SPLIT_FLUSH_ATOMS == 0) {  // (uniform: every warpgroup the same atoms)
                            wgmma_wait<0>();
                            pin(acc[0]);
#pragma unroll
                            for (int i = 0; i < ACC; ++i) sums[i] += acc[0][i];
                            fresh = true;
                        }
                    }
                    issue_slot(k_atom, fresh);
                    wgmma_wait<1>();
                    __syncwarp();
                    if (lane == 0) mbarrier_arrive(empty() + previous);
                }
            }
            tile.slot = stage;
            next_slot();
            next_tile(cursor);
            tile.real[0] = !tile.biased || token_real(args, tile.doc, tile.first_row, rows, r0);
            tile.real[1] = !tile.biased || token_real(args, tile.doc, tile.first_row, rows, r0 + 8);
            tile.s[0] = tile.s[1] = 1.f;
            if constexpr (SCALED) tile.s[0] = sScale()[tile.slot * TILE_N + r0], tile.s[1] = sScale()[tile.slot * TILE_N + r0 + 8];
            if constexpr (M_HALVES == 2) {  // (16-bit: no scales)
                tile.real[M_HALVES] = !tile.biased || token_real(args, tile.doc, tile.first_row, rows, r0 + 64);
                tile.real[M_HALVES + 1] = !tile.biased || token_real(args, tile.doc, tile.first_row, rows, r0 + 72);
                tile.s[M_HALVES] = tile.s[M_HALVES + 1] = 1.f;
            }
            return tile;
        };
        // The tile's MMAs are done: free its slot and fold it (FIRST: a constant, as BIASED).
        auto take = [&](const TileFold& tile, const bool FIRST) {
            wgmma_wait<0>();
            pin(acc[0]);
            if constexpr (M_HALVES == 2) pin(acc[M_HALVES - 1]);
            if constexpr (FP32_SPLIT) {
                if (tile_slots > SPLIT_FLUSH_ATOMS) {  // (the tile had flushes: its sums join its last stretch)
#pragma unroll
                    for (int i = 0; i < ACC; ++i) acc[0][i] += sums[i], sums[i] = 0.f;
                }
            }
            __syncwarp();
            if (lane == 0) mbarrier_arrive(empty() + tile.slot);  // the slot is free (scales already read)
            const bool real0 = tile.real[0], real1 = tile.real[1];
            has_row |= real0 | real1;
            // The witness: a non-finite document element makes its row's similarities non-finite
            // (int8: only a non-finite scale can; 0 * x is 0 unless x is inf or NaN).
            if constexpr (SCALED)
                witness += (real0 ? 0.f * tile.s[0] : 0.f) + (real1 ? 0.f * tile.s[1] : 0.f);
            else if constexpr (!STREAM_QUERY)  // (streaming queries: through every similarity, fold_rows)
                witness += (real0 ? (float)acc[0][0] : 0.f) + (real1 ? (float)acc[0][2] : 0.f);
            if (tile.biased)
                fold_rows(0, real0, real1, tile.s[0], tile.s[1], tile.first_row, true, FIRST);
            else
                fold_rows(0, real0, real1, tile.s[0], tile.s[1], tile.first_row, false, FIRST);
            if constexpr (M_HALVES == 2) {  // rows 64 to 127, into the maxima the first half left
                const bool real2 = tile.real[M_HALVES], real3 = tile.real[M_HALVES + 1];
                has_row |= real2 | real3;
                if constexpr (!STREAM_QUERY)
                    witness += (real2 ? acc[M_HALVES - 1][0] : 0.f) + (real3 ? acc[M_HALVES - 1][2] : 0.f);
                if (tile.biased)
                    fold_rows(M_HALVES - 1, real2, real3, 1.f, 1.f, tile.first_row + 64, true, false);
                else
                    fold_rows(M_HALVES - 1, real2, real3, 1.f, 1.f, tile.first_row + 64, false, false);
            }
        };
        // TURNS: warpgroup 0 has the first turn (the last one passes it), and takes one more at
        // the end, so that every turn passed is taken (the barriers end complete).
        if (TURNS && warpgroup == WARPGROUPS - 1) pass_turn(warpgroup);
        TileFold tile = issue();  // every block has at least one tile
#pragma unroll 1
        for (;;) {  // a document: its first tile, the others, then its maxima published
            take(tile, true);
#pragma unroll 1
            while (!tile.last) {
                tile = issue();
                take(tile, false);
            }
            publish_column_maxima(best, winners);
            close_document<T>(args, tile.doc);
            if (cursor.position >= doc_count) break;
            tile = issue();
        }
        if (TURNS && warpgroup == 0) wait_turn(warpgroup);
    }

    // Fold a finished tile's accumulators into the running row maxima. Columns that are not
    // real (padding, masked, past the document: a TMA tile holds whatever memory is there) are
    // replaced by -FLT_MAX, never added to, so that their contents cannot leak. Tiles with no
    // such column skip the test (called with a constant: each call inlines into its own
    // specialised copy, with no per-element branch).
    // Whether column `col` of a tile is a real token (in the document; MASKED: and not masked).
    // Without a mask, a document's last tile tests its length only: the mask's address
    // arithmetic, predicated off, would still issue for every column (about 300 integer
    // instructions per tile and warp, the most executed in one-query int8 profiles).
    template <bool MASKED> __device__ __forceinline__ bool column_real(const ForwardArgs& args, const TileInfo& info, int col) const {
        return MASKED ? token_real(args, info.doc, info.first_column, info.columns, col) : col < info.columns;
    }
    // A masked tile's columns as bits (bit 2j + e: column 8j + 2 quad + e), read two pairs at a
    // time: the fold's unrolled loop would hold every column's mask address and byte at once,
    // one 64-bit spill in three warpgroups streaming the query's TF32 halves (144 registers).
    __device__ __forceinline__ u32 masked_columns(const ForwardArgs& args, const TileInfo& info) const {
        static_assert(TILE_N <= 128, "a bit a column a thread: 32 bits");
        u32 bits = 0;
#pragma unroll 2
        for (int j = 0; j < TILE_N / 8; ++j) {
            const int col = 8 * j + 2 * quad;
            bits |= (u32)column_real<true>(args, info, col) << (2 * j) | (u32)column_real<true>(args, info, col + 1) << (2 * j + 1);
        }
        return bits;
    }
    template <typename T, bool BIASED, bool MASKED, typename Acc>
    __device__ __forceinline__ void fold_tile(const ForwardArgs& args, const Acc (&acc)[ACC], const TileInfo& info, RowBest (&best)[2]) {
        constexpr bool SCALED = Codec<T>::SCALED;
        constexpr bool MASK_BITS = MASKED && SPLIT_STREAM_QUERY && SPLIT_DOCUMENT && WARPGROUPS > 2;
        const float* scale = sScale() + info.stage * TILE_N;
        if (!BIASED) has_row = true;
        const u32 mask_bits = MASK_BITS ? masked_columns(args, info) : 0u;
        if constexpr (SCALED) {
            // int8 tokens are finite: a non-finite similarity can only come from a document
            // scale, so the witness checks the tile's scales of real columns (one per thread)
            // instead of summing every similarity (0 * x is 0 unless x is inf or NaN).
            const int c = threadIdx.x % 128;
            if (c < TILE_N && (BIASED ? column_real<MASKED>(args, info, c) : true)) witness += 0.f * scale[c];
        }
#pragma unroll
        for (int chunk = 0; chunk < TILE_N / 64; ++chunk) {  // 64 columns at a time: 16 temporaries
            float m[2][8];
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) {
                const int j = 8 * chunk + jj, col = 8 * j + 2 * quad;
                bool real0 = true, real1 = true;
                float2 sc = make_float2(1.f, 1.f);
                if (MASK_BITS) {
                    real0 = (mask_bits >> (2 * j)) & 1u, real1 = (mask_bits >> (2 * j + 1)) & 1u;
                    has_row |= real0 | real1;
                } else if (BIASED) {  // padding columns, and masked ones (read straight from the mask)
                    real0 = column_real<MASKED>(args, info, col), real1 = column_real<MASKED>(args, info, col + 1);
                    has_row |= real0 | real1;
                }
                if constexpr (SCALED) sc = *(const float2*)(scale + col);
#pragma unroll
                for (int h = 0; h < ROW_HALVES; ++h) {  // h = 0: row lane/4, h = 1: row lane/4 + 8
                    float v0 = accumulator_to_float<KSTEPS * 32>(acc[4 * j + 2 * h]);
                    float v1 = accumulator_to_float<KSTEPS * 32>(acc[4 * j + 2 * h + 1]);
                    if constexpr (SCALED) v0 *= sc.x, v1 *= sc.y;
                    // The witness (16-bit): row lane/4 against every real column of the document.
                    if (!SCALED && h == 0) witness += (real0 ? v0 : 0.f) + (real1 ? v1 : 0.f);
                    if (BIASED) v0 = real0 ? v0 : -MAXSIM_FLT_MAX, v1 = real1 ? v1 : -MAXSIM_FLT_MAX;
                    m[h][jj] = max_nan(v0, v1);
                    if constexpr (ARGMAX) {
                        // Columns in increasing order with strict >: the first maximum wins (ties
                        // within the pair keep the lower column).
                        if (m[h][jj] > best[h].value) best[h].index = info.first_column + (v1 > v0 ? col + 1 : col);
                        best[h].value = max_nan(best[h].value, m[h][jj]);
                    }
                }
            }
            if constexpr (!ARGMAX) {
#pragma unroll
                for (int h = 0; h < ROW_HALVES; ++h) {
                    const float m01 = max_nan(m[h][0], m[h][1]), m23 = max_nan(m[h][2], m[h][3]);
                    const float m45 = max_nan(m[h][4], m[h][5]), m67 = max_nan(m[h][6], m[h][7]);
                    best[h].value = max_nan(best[h].value, max_nan(max_nan(m01, m23), max_nan(m45, m67)));
                }
            }
        }
    }

    // ---- TF32_DOC_ROWS: one query's split rings, documents on M (see there) -----------------
    // An atom at a time: its fragments from the slot (ldmatrix: matrix m = lane / 8 holds rows
    // 8 (m & 1) + lane % 8 of the warp's 16, 16-byte chunk 2 ks + (m >> 1) of k-step ks), the
    // slot freed, the small halves split, three MMAs a k-step, their products added to the
    // tile's sums; a tile's last atom folds the sums into the running column maxima (best[2j +
    // c]: query column 8j + 2t + c, over the thread's rows r0 and r0 + 8), a document's last
    // tile publishes them. The other warpgroups' chains keep the tensor cores busy meanwhile.
    // One atom's k-steps 0 .. LIVE - 1 (the slot at row a_row): the fragments, the slot freed
    // (the MMAs read registers and the query only), the small halves split, three MMAs a k-step
    // into acc, waited for. The query's descriptors point at the atom's rows.
    template <int LIVE> __device__ __forceinline__ void multiply_doc_atom(float (&acc)[16], const unsigned char* slot, int a_row,
                                                                         int a_chunk, int stage, unsigned long long big_desc,
                                                                         unsigned long long small_desc) {
        u32 x[LIVE][4], xs[LIVE][4];
#pragma unroll
        for (int ks = 0; ks < LIVE; ++ks) ldmatrix_x4(x[ks], slot + (((2 * ks + a_chunk) ^ (a_row & 7)) << 4));
        __syncwarp();
        if (lane == 0) mbarrier_arrive(empty() + stage);
#pragma unroll
        for (int ks = 0; ks < LIVE; ++ks)
#pragma unroll
            for (int i = 0; i < 4; ++i) xs[ks][i] = truncate_tf32_bits(x[ks][i]);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < LIVE; ++ks) {
            const unsigned offset = (ks * 32) >> 4;
            wgmma_tf32_n32(acc, x[ks], big_desc + offset, ks > 0);
            wgmma_tf32_n32(acc, xs[ks], big_desc + offset, 1);
            wgmma_tf32_n32(acc, x[ks], small_desc + offset, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        pin(acc);
    }
    __device__ __forceinline__ void consume_doc_rows(const ForwardArgs& args) {
        const int ring_first = warpgroup * RING, ring_end = ring_first + RING;
        int stage = ring_first;
        u32 phase = 0;
        const int tile_slots = slots_per_tile<float>(args.dim);
        const unsigned long long big_desc = tile_descriptor(sQ()), small_desc = big_desc + ((32 * 128) >> 4);
        const int r0 = warp_in_group * 16 + (lane >> 2);
        const int a_row = warp_in_group * 16 + 8 * ((lane >> 3) & 1) + (lane & 7), a_chunk = lane >> 4;
        const int last_ksteps = min(4, (args.dim - 32 * (tile_slots - 1) + 7) / 8);
        float acc[16], sums[16], best[8];
        u32 winners[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};  // ARGMAX: the rows of best[2j], best[2j + 1], 16 bits each
        i64 doc = 0, length = 0;
        int tiles = 1, tile = 0, k_atom = 0;
#pragma unroll 1
        for (;;) {
            mbarrier_wait(full() + stage, phase);
            if (tile == 0 && k_atom == 0) {  // a document's first slot says which it is
                const i64 position = sSlotDoc()[stage];
                if (position < 0) break;  // the ring's end
                doc = split_doc_at(args, position), length = sSlotLength()[stage], tiles = doc_tiles(length);
            }
            const unsigned char* slot = sD() + stage * TILE_BYTES + a_row * 128;
            const unsigned query_offset = (k_atom * SPLIT_QUERY_ATOM_BYTES) >> 4;
            // (The k-steps of a tile's last atom past the dim are zero in both operands: skipped.)
            switch (k_atom + 1 < tile_slots ? 4 : last_ksteps) {
            case 1: multiply_doc_atom<1>(acc, slot, a_row, a_chunk, stage, big_desc + query_offset, small_desc + query_offset); break;
            case 2: multiply_doc_atom<2>(acc, slot, a_row, a_chunk, stage, big_desc + query_offset, small_desc + query_offset); break;
            case 3: multiply_doc_atom<3>(acc, slot, a_row, a_chunk, stage, big_desc + query_offset, small_desc + query_offset); break;
            default: multiply_doc_atom<4>(acc, slot, a_row, a_chunk, stage, big_desc + query_offset, small_desc + query_offset);
            }
            if (++stage == ring_end) stage = ring_first, phase ^= 1;
            if (k_atom == 0) {
#pragma unroll
                for (int i = 0; i < 16; ++i) sums[i] = acc[i];
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) sums[i] += acc[i];
            }
            if (++k_atom < tile_slots) continue;
            k_atom = 0;
            // The tile's rows that are not real (padding, masked, past the document) become
            // -FLT_MAX; the witness sums the real rows against query column 2t.
            const int first_row = tile * TILE_N, rows = (int)min(length - first_row, (i64)TILE_N);
            const bool biased = args.d_mask != nullptr || rows < TILE_N;
            const bool real0 = !biased || token_real(args, doc, first_row, rows, r0);
            const bool real1 = !biased || token_real(args, doc, first_row, rows, r0 + 8);
            has_row |= real0 | real1;
            witness += (real0 ? sums[0] : 0.f) + (real1 ? sums[2] : 0.f);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float v0 = real0 ? sums[4 * (i / 2) + i % 2] : -MAXSIM_FLT_MAX;
                const float v1 = real1 ? sums[4 * (i / 2) + 2 + i % 2] : -MAXSIM_FLT_MAX;
                const float v = max_nan(v0, v1);
                if constexpr (ARGMAX) {  // tiles in increasing order, strict >: the first maximum wins
                    const u32 row = first_row + (v1 > v0 ? r0 + 8 : r0);
                    const u32 won = tile == 0 ? (v > MAXSIM_NEG_INF ? row : 0xffffu) : row;
                    if (tile == 0 || v > best[i])
                        winners[i / 2] = i % 2 ? (winners[i / 2] & 0xffffu) | (won << 16) : (winners[i / 2] & 0xffff0000u) | won;
                }
                best[i] = tile == 0 ? v : max_nan(best[i], v);
            }
            if (++tile < tiles) continue;
            tile = 0;
            // Reduce-scatter over the 8 lanes of a column (lanes 16, 8, 4 apart): lane (g, t)
            // keeps best[g], query column 8 (g / 2) + 2t + g % 2, the max over the warp's rows.
            const int g = lane >> 2, column_slot = (parity * CONSUMER_WARPS + warp) * COLUMN_SLOTS + query_row_of(8 * (g / 2) + 2 * quad + g % 2);
            if constexpr (ARGMAX) {
                keep_best_of_halves<2, 8, 16>(best, winners, lane);
                keep_best_of_halves<1, 8, 8>(best, winners, lane);
                // The last round splits the pair left: lanes 4 apart keep one column each.
                const bool upper = lane & 4;
                const float mine = upper ? best[1] : best[0], sent = upper ? best[0] : best[1];
                const int my_row = (short)(upper ? winners[0] >> 16 : winners[0] & 0xffffu);
                const int sent_row = (short)(upper ? winners[0] & 0xffffu : winners[0] >> 16);
                const float other = __shfl_xor_sync(0xffffffffu, sent, 4);
                const int other_row = __shfl_xor_sync(0xffffffffu, sent_row, 4);
                sRowArg()[column_slot] = first_winner(mine, my_row, other, other_row);
                best[0] = max_nan(mine, other);
            } else {
                keep_max_of_halves<4, 8, 16>(best, lane);
                keep_max_of_halves<2, 8, 8>(best, lane);
                keep_max_of_halves<1, 8, 4>(best, lane);
            }
            sRowMax()[column_slot] = best[0];
            close_document<float>(args, doc);
        }
    }

    // ---- Queries on M: the accumulators' rows are query rows -----------------------------
    // TF32: the small halves of the atom in ring slot `stage` into the warpgroup's buffer
    // `buffer` (the wgmmas of the atom two before, which read it, are done: waited for before
    // this issue). The atom itself stays as it landed: the tensor cores read its big halves.
    __device__ __forceinline__ void split_atom(int stage, int buffer) {
        const uint4* atom = (const uint4*)(sD() + stage * TILE_BYTES);
        uint4* small = (uint4*)(sSmall() + (2 * warpgroup + buffer) * ATOM_BYTES);
        // Every load first, then the stores: written as one loop, ptxas kept each load after the
        // store before it (the two may alias, as far as it knows), so the thread's four shared
        // loads ran one round trip each (bench/results/ncu-fp32-one-query-2026-12-06-c8022da-h100.txt).
        constexpr int PIECES = ATOM_BYTES / 16 / 128;
        uint4 x[PIECES];
#pragma unroll
        for (int p = 0; p < PIECES; ++p) x[p] = atom[threadIdx.x % 128 + 128 * p];
#pragma unroll
        for (int p = 0; p < PIECES; ++p)
            small[threadIdx.x % 128 + 128 * p] = make_uint4(truncate_tf32_bits(x[p].x), truncate_tf32_bits(x[p].y),
                                                            truncate_tf32_bits(x[p].z), truncate_tf32_bits(x[p].w));
        fence_proxy_async();  // the tensor cores read them through the async proxy
        warpgroup_sync();
    }
    // TF32: an atom's products added to the tile's sums (rows lane/4: the query's big halves'
    // row plus its small halves' row lane/4 + 8), by rounding FADDs.
    __device__ __forceinline__ static void add_atom(float (&sums)[ACC], const float (&acc)[ACC]) {
#pragma unroll
        for (int i = 0; i < ACC; i += 4) {
            sums[i] += acc[i] + acc[i + 2];
            sums[i + 1] += acc[i + 1] + acc[i + 3];
        }
    }
    __device__ __forceinline__ static void clear(float (&sums)[ACC]) {
#pragma unroll
        for (int i = 0; i < ACC; ++i) sums[i] = 0.f;
    }
    // Streaming k, atom k_atom's query fragments: the warp's 8 real rows (its accumulator rows
    // 0-7; rows 8-15 are padding, zero registers, or TF32 the small halves), k-steps 4 k_atom to
    // 4 k_atom + 3. (N: the callers' fragment arrays, 4 when streaming; a template, since the
    // builds that do not stream still type-check the call with their KSTEPS.)
    // SPLIT_STREAM_QUERY: from the query atom of slot `stage` (swizzled as TMA lands it), zero
    // for this thread's row where `zero_row` (not real, or not finite: as staging zeroes it).
    template <int N> __device__ __forceinline__ void stream_query_frags(u32 (&frags)[N][4], int k_atom, int stage = 0,
                                                                        bool zero_row = false) const {
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            u32 half[2];
            if constexpr (SPLIT_STREAM_QUERY) {
                const int r = query_row0 / 2 + (lane & 7), chunk = 2 * ks + ((lane >> 3) & 1);
                ldmatrix_x2(half, sD() + stage * TILE_BYTES + SLOT_ATOMS * ATOM_BYTES + r * 128 + ((chunk ^ (r & 7)) << 4));
                if (zero_row) half[0] = half[1] = 0u;
            } else {
                ldmatrix_x2(half, sQ() + (query_row0 / 2 + (lane & 7)) * LDS + (4 * k_atom + ks) * 16 + ((lane >> 3) & 1) * 8);
            }
            if constexpr (TF32) {  // rows 8-15 take the small halves (see TF32)
                split_tf32_bits(half[0], frags[ks][0], frags[ks][1]);
                split_tf32_bits(half[1], frags[ks][2], frags[ks][3]);
            } else {
                frags[ks][0] = half[0], frags[ks][1] = 0u, frags[ks][2] = half[1], frags[ks][3] = 0u;
            }
        }
    }
    // TF32 (see TF32): two accumulator sets, fragment sets and small-half buffers; atom i+1 is
    // split and goes to the tensor cores (issue) while atom i's products are added (retire).
    template <typename Issue, typename Retire>
    __device__ __forceinline__ static void pipeline_atoms(Issue&& issue, Retire&& retire, const TileInfo& in_flight,
                                                          u32 (&frags0)[4][4]) {
        float acc0[ACC], acc1[ACC];
        u32 frags1[4][4];
        if (!issue(acc0, frags0, 0)) return;
        // The two halves are written out: the sets alternate by name (a register array indexed
        // at run time would go to local memory), and a step lambda changed ptxas's schedule.
#pragma unroll 1
        for (;;) {
            const TileInfo first = in_flight;
            if (!issue(acc1, frags1, 1)) {
                wgmma_wait<0>();
                retire(acc0, first);
                return;
            }
            wgmma_wait<1>();
            retire(acc0, first);
            const TileInfo second = in_flight;
            if (!issue(acc0, frags0, 0)) {
                wgmma_wait<0>();
                retire(acc1, second);
                return;
            }
            wgmma_wait<1>();
            retire(acc1, second);
        }
    }

    // TF32_STRETCH (see there): one accumulator set; the fragment sets and small-half buffers
    // still alternate (by name, as pipeline_atoms'), since an atom's MMAs read them while the
    // next atom's are loaded and split. `fresh` tells issue to start the accumulators afresh.
    template <typename Issue, typename Release, typename Fold>
    __device__ __forceinline__ static void stretch_atoms(Issue&& issue, Release&& release, Fold&& fold,
                                                         const TileInfo& in_flight, bool& fresh, u32 (&frags0)[4][4]) {
        float acc[ACC], sums[ACC];
        clear(sums);
        u32 frags1[4][4];
        int stretch = 0, pending_stage = -1;  // the slot whose MMAs were in flight at the last release
        auto step = [&](u32 (&frags)[4][4], int buffer) -> bool {
            fresh = stretch == 0;
            if (!issue(acc, frags, buffer)) return false;
            const TileInfo atom = in_flight;
            wgmma_wait<1>();  // the atom before is done: its slot (and its small halves) free
            if (pending_stage >= 0) release(pending_stage);
            pending_stage = atom.stage;
            if (++stretch < TF32_STRETCH && !atom.tile_end) return true;
            wgmma_wait<0>();
            pin(acc);
            add_atom(sums, acc);
            stretch = 0;
            release(atom.stage);
            pending_stage = -1;
            if (atom.tile_end) {
                fold(sums, atom);
                clear(sums);
            }
            return true;
        };
#pragma unroll 1
        for (;;) {
            if (!step(frags0, 0)) break;
            if (!step(frags1, 1)) break;
        }
        wgmma_wait<0>();  // (on every path: a wait on some paths only made ptxas serialize every wgmma, C7518)
        if (pending_stage >= 0) release(pending_stage);
    }

    template <typename T> __device__ __forceinline__ void consume_queries_on_m(const ForwardArgs& args, const DocTileMap& tile_map) {
        typedef typename WgmmaTile<T>::acc_t Acc;
        constexpr bool SCALED = Codec<T>::SCALED;
        // The warpgroup's query fragments, in registers for good (streaming k: an atom's a slot).
        u32 a_regs[STREAM_K ? 4 : KSTEPS][4];
        if constexpr (!STREAM_K) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks)
                ldmatrix_x4(a_regs[ks], sQ() + (query_row0 + (lane & 15)) * LDS + ks * 16 + (lane >> 4) * 8);
        }
        const int tile_slots = slots_per_tile<T>(args.dim);
        // SPLIT_STREAM_QUERY: whether this thread's fragment row (row lane/4 of its warp) is zeros.
        const bool zero_query_row = SPLIT_STREAM_QUERY && (sRowQuery()[query_row0 + (lane >> 2)] < 0 ||
                                                           sRowBad()[query_row0 + (lane >> 2)] != 0);
        // Consumer cursor: the tile the tensor cores get next, from this warpgroup's ring (splitting documents, each document's first slot says which it is).
        DocCursor cursor;
        open_doc(cursor, 0);
        const int ring_first = (SPLIT_DOCS ? warpgroup : 0) * RING, ring_end = ring_first + RING;
        int stage = ring_first;
        u32 phase = 0;
        TileInfo in_flight;

        RowBest best[2] = {{MAXSIM_NEG_INF, -1}, {MAXSIM_NEG_INF, -1}};  // rows lane/4 and lane/4 + 8
        // The witness here: row lane/4 against every real column of the document, summed.
        // ... and at a document's last tile, reduce over the 4 lanes of each row, publish the row
        // maxima to the warpgroup and sum its queries' scores.
        auto fold = [&](const Acc (&acc)[ACC], const TileInfo& info) {
            if (!info.biased)
                fold_tile<T, false, false>(args, acc, info, best);
            else if (args.d_mask == nullptr)
                fold_tile<T, true, false>(args, acc, info, best);
            else
                fold_tile<T, true, true>(args, acc, info, best);
            if (!info.last) return;
#pragma unroll
            for (int h = 0; h < ROW_HALVES; ++h) {
                float value = best[h].value;
                int index = best[h].index;
#pragma unroll
                for (int offset = 1; offset < 4; offset <<= 1) {
                    const float other = __shfl_xor_sync(0xffffffffu, value, offset);
                    if constexpr (ARGMAX) index = first_winner(value, index, other, __shfl_xor_sync(0xffffffffu, index, offset));
                    value = max_nan(value, other);
                }
                if (quad == 0) {
                    const int row = row0 + (lane >> 2) + 8 * h;
                    sRowMax()[parity * BLOCK_ROWS + row] = value;
                    if constexpr (ARGMAX) sRowArg()[parity * BLOCK_ROWS + row] = index;
                }
                best[h].value = MAXSIM_NEG_INF;
                best[h].index = -1;
            }
            close_document<T>(args, info.doc);
        };

        // This warp is done with a tile's slot: at once, or (int8) after the fold has read the
        // slot's document scales.
        auto release = [&](int slot) {
            __syncwarp();
            if (lane == 0) mbarrier_arrive(empty() + slot);
        };
        // Hand the next tile to the tensor cores (asynchronously) and move the cursor on; false at
        // the end of a split ring. Streaming k, a call hands one atom of the tile (its slot), into
        // the same accumulators as the tile's atoms before it. (One atom a call, not a loop over
        // them: a wgmma in a loop of run-time length makes ptxas serialize every wgmma, C7518.)
        // TF32: `frags` and `buffer` (the small halves') alternate with the accumulators: the
        // wgmmas of the atom before may still be reading the other ones.
        int k_atom = 0;
        bool stretch_fresh = true;  // TF32: the next atom starts the accumulators afresh (always, but TF32_STRETCH's)
        const unsigned long long small_desc = SPLIT_DOCUMENT ? tile_descriptor(sSmall() + 2 * warpgroup * ATOM_BYTES) : 0;
        auto issue_mma = [&](Acc (&acc)[ACC], u32 (&frags)[STREAM_K ? 4 : KSTEPS][4], int buffer) -> bool {
            // Streaming k, the atom's query fragments: splitting the document from a resident
            // query, before the slot's wait (they need only k_atom); otherwise (the query's atom in
            // the slot too) after its branches: registers of the wgmmas set before a branch made
            // ptxas fence them (C7519/C7520).
            constexpr bool FRAGS_BEFORE_WAIT = SPLIT_DOCUMENT && !SPLIT_STREAM_QUERY;
            if constexpr (FRAGS_BEFORE_WAIT) stream_query_frags(frags, k_atom);
            mbarrier_wait(full() + stage, phase);
            bool ring_over = false;
            if constexpr (SPLIT_DOCS) {
                if (cursor.tile == 0 && k_atom == 0) {
                    const i64 position = sSlotDoc()[stage];
                    ring_over = position < 0;
                    if (ring_over && !DOUBLE_BUFFERED) return false;
                    if (!ring_over) {
                        cursor.position = position, cursor.doc = split_doc_at(args, position);
                        cursor.length = sSlotLength()[stage], cursor.tiles = doc_tiles(cursor.length);
                    }
                }
            }
            // A cp.async tile came through the generic proxy, and wgmma reads via the async one (TMA
            // writes through the async proxy: no fence).
            if (!tile_map.use_tma) fence_proxy_async();
            if constexpr (STREAM_K && !FRAGS_BEFORE_WAIT) stream_query_frags(frags, k_atom, stage, zero_query_row);
            if constexpr (SPLIT_DOCUMENT) split_atom(stage, buffer);
            const unsigned long long desc = tile_descriptor(sD() + stage * TILE_BYTES);
            wgmma_fence();
            if constexpr (STREAM_K) {
#pragma unroll
                for (int ks = 0; ks < 4; ++ks) {
                    // TF32: fresh accumulators each atom (a stretch's first); the document's big halves, then its small.
                    WgmmaTile<T>::run(acc, frags[ks], desc + kstep_offset(ks), !TF32 ? 4 * k_atom + ks : ks > 0 || !stretch_fresh);
                    if constexpr (SPLIT_DOCUMENT)
                        WgmmaTile<T>::run(acc, frags[ks], small_desc + buffer * (ATOM_BYTES >> 4) + kstep_offset(ks), 1);
                }
            } else {
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks) WgmmaTile<T>::run(acc, frags[ks], desc + kstep_offset(ks), ks);
            }
            wgmma_commit();
            if (ring_over) return false;
            const int slot = stage;
            if (++stage == ring_end) stage = ring_first, phase ^= 1;
            in_flight.tile_end = ++k_atom == tile_slots;
            if (!in_flight.tile_end) {
                in_flight.stage = slot;
                return true;
            }
            k_atom = 0;
            in_flight.doc = cursor.doc;
            in_flight.stage = slot;
            in_flight.first_column = cursor.tile * TILE_N;
            in_flight.columns = (int)min(cursor.length - cursor.tile * TILE_N, (i64)TILE_N);
            in_flight.biased = args.d_mask != nullptr || (i64)(cursor.tile + 1) * TILE_N > cursor.length;
            in_flight.last = cursor.tile + 1 == cursor.tiles;
            if constexpr (SPLIT_DOCS) {
                if (++cursor.tile == cursor.tiles) cursor.tile = 0;  // the next document comes from its slot
            } else {
                next_tile(cursor);
            }
            return true;
        };
        if constexpr (DOUBLE_BUFFERED) {
            auto step = [&](Acc (&acc_new)[ACC], Acc (&acc_old)[ACC]) -> bool {
                if (!SPLIT_DOCS && cursor.position >= doc_count) return false;
                const TileInfo folding = in_flight;
                if (!issue_mma(acc_new, a_regs, 0)) return false;  // (splitting: the ring's end)
                wgmma_wait<1>();
                if constexpr (!SCALED) release(folding.stage);
                pin(acc_old);
                fold(acc_old, folding);
                if constexpr (SCALED) release(folding.stage);
                return true;
            };
            Acc acc0[ACC], acc1[ACC];
            // Every block has at least one tile; a split ring may have none.
            const bool any = issue_mma(acc0, a_regs, 0);
#pragma unroll 1
            for (; any;) {
                if (!step(acc1, acc0)) {
                    wgmma_wait<0>();
                    pin(acc0);
                    fold(acc0, in_flight);
                    break;
                }
                if (!step(acc0, acc1)) {
                    wgmma_wait<0>();
                    pin(acc1);
                    fold(acc1, in_flight);
                    break;
                }
            }
        } else if constexpr (SPLIT_DOCUMENT && TF32_STRETCH > 0) { stretch_atoms(issue_mma, release, fold, in_flight, stretch_fresh, a_regs);
        } else if constexpr (SPLIT_DOCUMENT) {
            // The tile's sums (rows lane/4 only: rows + 8 hold the query's small halves' products,
            // added in there), which a tile's end folds and clears.
            Acc sums[ACC];
            clear(sums);
            pipeline_atoms(issue_mma, [&](Acc (&acc)[ACC], const TileInfo& info) {
                pin(acc);
                add_atom(sums, acc);
                release(info.stage);
                if (!info.tile_end) return;
                fold(sums, info);
                clear(sums);
            }, in_flight, a_regs);
        } else {
            // One accumulator set: a tile multiplies, then folds, while the tensor cores work for
            // the block's other warpgroups (precision "high" too: it has no split to hide).
            Acc acc[ACC];
            Acc sums[ACC];  // TF32 (precision "high"): as above
            if constexpr (TF32) clear(sums);
#pragma unroll 1
            while (SPLIT_DOCS || cursor.position < doc_count) {
                if (!issue_mma(acc, a_regs, 0)) break;
                const TileInfo folding = in_flight;
                wgmma_wait<0>();
                pin(acc);
                if constexpr (TF32) add_atom(sums, acc);
                if (STREAM_K && !folding.tile_end) {  // the tile's next atom comes first
                    release(folding.stage);
                    continue;
                }
                if constexpr (!SCALED) release(folding.stage);
                fold(TF32 ? sums : acc, folding);
                if constexpr (SCALED) release(folding.stage);
                if constexpr (TF32) clear(sums);
            }
        }
    }
};
}  // namespace wg

template <typename T>
__device__ __forceinline__ void maxsim_fwd_wgmma(const ForwardArgs& args, const DocTileMap& tile_map) {
    using namespace wg;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    Consumer block(args, tile_map, smem_raw, Codec<T>::SCALED);  // the producer uses its Block part
    if (block.doc_begin >= block.doc_end) return;
    block.init_barriers(tile_map);
    if (block.warp < CONSUMER_WARPS) block.stage_queries<T>(args);
    if (block.warp >= CONSUMER_WARPS) {
        block.produce<T>(args, tile_map);
        return;
    }
    // ---- Consumer warpgroups ----------------------------------------------------------------
    if (DOCS_ON_M && !TURNS && block.own_ranges && block.group_count == 0) {  // (before it takes registers)
        block.idle_docs_on_m(slots_per_tile<T>(args.dim));
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(consumer_registers<T>()));
    if constexpr (DOCS_ON_M) {
        block.consume_docs_on_m<T>(args, tile_map);
    } else if constexpr (TF32_DOC_ROWS) {
        block.consume_doc_rows(args);
    } else {
        block.consume_queries_on_m<T>(args, tile_map);
    }
}

#define MAXSIM_FWD_WGMMA_ENTRY(NAME, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(wg::THREADS, 1) NAME(const __grid_constant__ ForwardArgs args, \
                                                                      const __grid_constant__ DocTileMap tile_map) { \
        maxsim_fwd_wgmma<T>(args, tile_map);                                                                  \
    }

#if MAXSIM_FP32_SPLIT
MAXSIM_FWD_WGMMA_ENTRY(maxsim_fwd_wgmma_fp32_split, fp32_split_t)
#elif MAXSIM_TF32
MAXSIM_FWD_WGMMA_ENTRY(maxsim_fwd_wgmma_fp32, float)
#else
MAXSIM_FWD_WGMMA_ENTRY(maxsim_fwd_wgmma_fp16, fp16_t)
MAXSIM_FWD_WGMMA_ENTRY(maxsim_fwd_wgmma_bf16, bf16_t)
// int8 takes 128-row tiles only splitting documents (one accumulator set) of dim <= 128: with
// two sets, or 8 k-steps of query fragments, its consumers would need more registers than they
// have (spills); with two sets it measured no faster either (tune-wgmma-2026-11-30-462151b.log).
// Documents on M with the argmax, or dim 256 (8 k-steps): int8 (its scales) spills in three
// warpgroups, takes two (_plan/configs.int8_docs_on_m_warpgroups).
#if (MAXSIM_TILE_N == 64 || (MAXSIM_SPLIT_DOCS && MAXSIM_KSTEPS <= 4)) && \
    !(MAXSIM_DOCS_ON_M && (MAXSIM_ARGMAX || MAXSIM_KSTEPS > 6) && MAXSIM_WARPGROUPS == 3)
MAXSIM_FWD_WGMMA_ENTRY(maxsim_fwd_wgmma_int8, i8)
#endif
#endif
