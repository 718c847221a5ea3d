"""Kernel shapes and their shared-memory sizes: the tile configurations the planners choose from.

Each ``shared_bytes`` mirrors the formula at the top of its kernel's source; the GPU tests and
compute-sanitizer catch a mismatch (a kernel reading past its dynamic shared memory).
"""

from __future__ import annotations

import dataclasses

from ..tuning import DEFAULT, Tunables

#: A field with this metadata is left out of the defines at its default (the source's #ifndef
#: default is the same): fields added later do not change the defines, nor the compiled
#: binaries' cache keys, of the configurations that existed before them.
OPTIONAL = {"optional": True}


def compile_defines(config) -> tuple[str, ...]:
    """A tile configuration as the compile-time defines of its kernel's source: each field f as
    -DMAXSIM_F (the #ifndef defaults at the top of the .cu file), in field order."""
    return tuple(f"-DMAXSIM_{field.name.upper()}={int(getattr(config, field.name))}"
                 for field in dataclasses.fields(config)
                 if not (field.metadata.get("optional") and getattr(config, field.name) == field.default))


@dataclasses.dataclass(frozen=True)
class MmaConfig:
    """Tile shape of the tensor-core forward kernel (``maxsim_fwd.cu``)."""

    warps_m: int
    warps_n: int
    mt: int
    nt: int
    stages: int
    ksteps: int
    b_in_registers: int = 1  # keep query fragments in registers when they fit (see maxsim_fwd.cu)
    argmax: int = 0  # also save the argmax (training)
    #: Stream k: ksteps k-steps of query and document tiles a ring slot, any dim (fat embeddings).
    stream_k: int = dataclasses.field(default=0, metadata=OPTIONAL)
    min_blocks: int = dataclasses.field(default=1, metadata=OPTIONAL)  # __launch_bounds__' blocks per SM
    #: The alignment of every row start in bytes (forward.load_alignment): rows are copied in
    #: pieces of this size, below 4 by plain loads (maxsim_fwd.cu, "Any dim and alignment").
    load_bytes: int = dataclasses.field(default=16, metadata=OPTIONAL)
    #: Rows on 4 or 8 bytes copied as whole 16-byte lines from the line each starts in, shifted
    #: by a per-row offset (maxsim_fwd.cu, SHIFTED_ROWS; forward.choose_kernel: 16-bit on 4).
    shifted_rows: int = dataclasses.field(default=0, metadata=OPTIONAL)

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def block_rows(self) -> int:
        """BM: document tokens per pipeline tile."""
        return self.warps_m * 16 * self.mt

    @property
    def block_cols(self) -> int:
        """BN: stacked query tokens a block holds."""
        return self.warps_n * 8 * self.nt

    def queries_per_block(self, query_length: int) -> int:
        """Whole queries stacked on a block's columns."""
        return self.block_cols // query_length

    @property
    def shared_bytes(self) -> int:
        # maxsim_fwd.cu's SHARED_BYTES (the compile checks assert the two are equal).
        row = self.ksteps * 16 + 8
        bm, bn = self.block_rows, self.block_cols
        warps = self.warps_m * self.warps_n
        query_blocks = self.stages if self.stream_k else 1
        shifts = 4 * self.stages * bm if self.shifted_rows else 0  # SHIFTED_ROWS: each tile row's shift
        return 2 * row * (query_blocks * bn + self.stages * bm) + (8 * bn if self.stream_k else 0) + 4 * (
            2 * self.stages * bm + (2 + 2 * self.argmax) * self.warps_m * bn + 3 * bn + 4 * warps) + shifts

    def defines(self) -> tuple[str, ...]:
        return compile_defines(self)


@dataclasses.dataclass(frozen=True)
class WgmmaConfig:
    """Shape of the Hopper forward kernel (``maxsim_fwd_wgmma.cu``): consumer warpgroups of 64
    stacked query rows each, one producer warpgroup, a ring of 64- or 128-row document tiles."""

    warpgroups: int
    ksteps: int
    stages: int = 6
    argmax: int = 0
    tile_n: int = 64  # document rows per tile (the wgmma N): 64 or 128
    split_docs: int = 0  # one query group: the warpgroups share it and split the documents
    half_rows: int = 0  # splitting, at most 32 query rows: each thread folds one row, not two
    docs_on_m: int = 0  # many queries: document tiles are the MMA's A, 128 query rows its B
    #: The alignment of every row start in bytes, 4 to 16 (forward.load_alignment): below 16
    #: the producer copies rows in cp.async pieces of this size (no TMA).
    load_bytes: int = dataclasses.field(default=16, metadata=OPTIONAL)
    #: One query, fat dims: a ring slot per atom (128 bytes of k) of a tile; ksteps is then the
    #: query block's capacity (WGMMA_STREAM_CAPACITIES).
    stream_k: int = dataclasses.field(default=0, metadata=OPTIONAL)
    #: fp32 (streaming k; maxsim_fwd_wgmma.cu, TF32): 1 at fp32 accuracy, each warpgroup
    #: splitting its atoms into TF32 halves (the small ones in two buffers of its own); 2 precision
    #: "high", the document as TF32; 3 at fp32 accuracy with the documents on M (TF32_DOC_ROWS).
    tf32: int = dataclasses.field(default=0, metadata=OPTIONAL)
    #: Documents on M streaming k at dims whose query blocks do not fit: each warpgroup's query
    #: atom streams through the ring slot beside the documents' (TMA from q as it is); ksteps is
    #: then the largest dim's (WGMMA_STREAM_QUERY_CAPACITY). 2: no box of q's map reaches past q
    #: (query counts that leave a group's last box short: the kernel's BOXES_WITHIN_Q).
    #: Splitting documents (one query at fat dims, streaming k): the group's query atom streams
    #: through each slot instead of the whole query staying resident (SPLIT_STREAM_QUERY).
    stream_query: int = dataclasses.field(default=0, metadata=OPTIONAL)
    #: Documents on M, k resident: the warpgroups issue each tile's MMAs in turns, so that one
    #: folds while the others multiply (maxsim_fwd_wgmma.cu, TURNS).
    turns: int = dataclasses.field(default=0, metadata=OPTIONAL)
    #: fp32 at fp32 accuracy as three fp16 products (maxsim_fwd_wgmma.cu, FP32_SPLIT): documents
    #: on M streaming k and the query atoms, the producer splitting the documents' rows itself.
    fp32_split: int = dataclasses.field(default=0, metadata=OPTIONAL)
    #: fp32 one query (tf32 1): atoms a stretch of one accumulator set takes (TF32_STRETCH); 0: two sets.
    tf32_stretch: int = dataclasses.field(default=0, metadata=OPTIONAL)
    part_maxima: int = dataclasses.field(default=0, metadata=OPTIONAL)  # split streaming: a record a part (PART_MAXIMA)

    @property
    def threads(self) -> int:
        return 128 * (self.warpgroups + 1)

    @property
    def group_rows(self) -> int:
        """Query rows a consumer warpgroup holds: the wgmma M (64), or its N with documents on M."""
        return 128 if self.docs_on_m else 64

    @property
    def block_cols(self) -> int:
        """Stacked query rows a block holds (those of all its warpgroups)."""
        return self.group_rows * self.warpgroups

    def queries_per_block(self, query_length: int) -> int:
        """Each warpgroup owns whole queries (or, splitting documents, all share one group)."""
        return (1 if self.split_docs else self.warpgroups) * (self.group_rows // query_length)

    def query_box(self, num_queries: int, query_length: int) -> int:
        """Queries one box of q's TMA map holds where the query atoms stream: a warpgroup's
        (documents on M), or splitting documents the launch's one group (at most 32 rows)."""
        if self.split_docs:
            return min(num_queries, self.queries_per_block(query_length))
        return self.group_rows // query_length

    def tile_ksteps(self, dim: int, itemsize: int) -> int:
        """The MMA k-steps (32 bytes of each row) a warpgroup issues over one document tile at
        embedding ``dim``: the build's, or streaming k four an atom of the tile's slots
        (maxsim_fwd_wgmma.cu, slots_per_tile: the fp32 split three 16-bit atoms a 64 of the dim)."""
        if self.fp32_split:
            return 12 * -(-dim // 64)
        if self.stream_k:
            return 4 * -(-dim * itemsize // 128)
        return self.ksteps

    @property
    def shared_bytes(self) -> int:
        # maxsim_fwd_wgmma.cu's SHARED_BYTES (the compile checks assert the two are equal).
        rows, kpad, warps, n = self.block_cols, self.ksteps * 16, 4 * self.warpgroups + 4, self.tile_n
        query_rows = 64 if self.split_docs else rows
        column_slots = 128 if self.docs_on_m else 64 if self.tf32 == 3 else 0  # a warp's column maxima
        max_slots = 2 * 4 * self.warpgroups * column_slots if column_slots else 2 * rows
        atoms = -(-self.ksteps // 4)
        slot_atoms = 1 if self.stream_k else atoms
        stored_rows = 32 if self.stream_k else query_rows  # streaming k: the real rows of half rows
        query_bytes = (self.warpgroups * atoms * 128 * 128 if self.docs_on_m else atoms * 64 * 128 if self.tf32 == 3
                       else stored_rows * (kpad + 8) * 2)
        slot_bytes = slot_atoms * n * 128
        if self.stream_query:  # every warpgroup's query atom in each slot (splitting: the group's), none resident
            slot_bytes, query_bytes = slot_bytes + (32 if self.split_docs else self.warpgroups * 128) * 128, 0
        # TF32 split documents: two buffers of small halves a warpgroup; fp32 split: the producer's
        # SPLIT_STAGES stages of a float32 chunk (n rows x 64) and the tile's n exponents.
        small_bytes = 2 * self.warpgroups * n * 128 if self.tf32 == 1 else 3 * (n * 256 + n * 4) if self.fp32_split == 1 else 0
        return (1024 + self.stages * slot_bytes + small_bytes + query_bytes
                + 4 * (self.stages * n + 3 * query_rows + (1 + self.argmax) * max_slots + 4 * warps)
                + 16 * self.stages + 16 * self.stages + 8)

    def defines(self) -> tuple[str, ...]:
        return compile_defines(self)


#: The Hopper kernel's shape where queries fill its warpgroups, chosen by bench/lab/tune_wgmma.py on
#: the H200; at most 8 k-steps (dim 128 in 16-bit, 256 in int8; an even number), since the
#: query fragments live in registers.
WGMMA_SHAPE = dict(warpgroups=3, stages=6)

#: int8 gets 128-row tiles only splitting documents with at most this many k-steps (dim 128):
#: more query fragments in registers spill (maxsim_fwd_wgmma.cu, the int8 entry).
INT8_LONG_TILE_KSTEPS = 4
#: Shared memory a Hopper block may use (H100 and H200: 227 KB); a ring that would not fit
#: gets fewer stages.
WGMMA_SHARED_LIMIT = 227 * 1024
WGMMA_MAX_KSTEPS = 8


def wgmma_config(ksteps: int, argmax: bool = False, warpgroups_wanted: int = 3, tile_n: int = 64,
                 query_rows: int = 64, docs_on_m: bool = False, int8: bool = False,
                 tunables: Tunables = DEFAULT, tf32: int = 0) -> WgmmaConfig | None:
    """The Hopper kernel's shape for ``warpgroups_wanted`` warpgroups' worth of query rows
    (``query_rows`` of them in all) and ``tile_n``-row document tiles, or None (the mma.sync
    kernel); ``docs_on_m``: documents on the MMA's M (64-row tiles, at least two warpgroups of
    128 query rows wanted; int8 in at most int8_docs_on_m_warpgroups); ``tf32`` 2: fp32 under
    precision "high" (documents on M only: both operands as TF32). Documents on M issue in
    turns under ``tunables.wgmma_turns``."""
    assert tf32 in (0, 2) and (not tf32 or docs_on_m), "TF32 builds with queries on M stream k (wgmma_stream_config)"
    if ksteps > WGMMA_MAX_KSTEPS or ksteps % 2 or (warpgroups_wanted < 2 and not tunables.wgmma_split_docs):
        return None
    shape = dict(WGMMA_SHAPE)
    if docs_on_m:
        assert tile_n == 64 and warpgroups_wanted >= 2
        most = int8_docs_on_m_warpgroups(argmax, ksteps) if int8 else 3
        shape.update(docs_on_m=1, warpgroups=min(shape["warpgroups"], warpgroups_wanted, most),
                     turns=int(tunables.wgmma_turns))
    elif warpgroups_wanted < 2:
        # At most 32 query rows (one ColBERT or ColPali query): half of each thread's rows are
        # padding, and their fold is skipped (int8 corpus-10k spent 30% of its time folding:
        # bench/results/ablation-wgmma-2026-11-30-b91374a.log).
        shape.update(split_docs=1, stages=tunables.wgmma_split_stages,
                     half_rows=int(tunables.wgmma_half_rows and query_rows <= 32))
    else:
        shape["warpgroups"] = min(shape["warpgroups"], warpgroups_wanted)
    return _fitted(WgmmaConfig(ksteps=ksteps, argmax=int(argmax), tile_n=tile_n, tf32=tf32, **shape))


def _fitted(config: WgmmaConfig) -> WgmmaConfig:
    """``config`` with its ring cut to whole rings (splitting documents: a ring a warpgroup, of
    at least two slots) and then a ring's worth at a time while it exceeds WGMMA_SHARED_LIMIT."""
    step = config.warpgroups if config.split_docs else 1
    config = dataclasses.replace(config, stages=config.stages // step * step)
    while config.shared_bytes > WGMMA_SHARED_LIMIT and config.stages - step >= max(3, 2 * step):
        config = dataclasses.replace(config, stages=config.stages - step)
    return config


#: Query block capacities of the Hopper kernel streaming k, in k-steps of 32 bytes (fp16 dims
#: 256, 512, 768, 1024, 1536, 2048, 2560; int8 twice that): one build serves every dim up to it.
WGMMA_STREAM_CAPACITIES = (16, 32, 48, 64, 96, 128, 160)
#: Streaming k, the fewest slots a ring of three warpgroups' rings may have before two
#: warpgroups (longer rings) take the capacity.
STREAM_MIN_RING = 3
#: The most k-steps a build streaming the query atoms takes (WgmmaConfig.stream_query: one query
#: past Tunables.wgmma_split_stream_query_ksteps, documents on M past their resident capacities):
#: fp16 dims 8192, int8 16384 (the int8 accumulators are exact far beyond).
WGMMA_STREAM_QUERY_CAPACITY = 512


def wgmma_stream_config(ksteps: int, argmax: int = 0, tunables: Tunables = DEFAULT,
                        tf32: int = 0, stream_queries: bool = False) -> WgmmaConfig | None:
    """The Hopper kernel streaming k for one query of at most 32 tokens at ``ksteps`` past
    WGMMA_MAX_KSTEPS (three warpgroups splitting documents, half rows, 64-row tiles, a slot per
    atom), or None past the largest capacity or where two slots per ring do not fit; ``tf32``:
    fp32 (its TF32 builds: 1 at fp32 accuracy, 2 precision "high"; 3 is 1's documents on M, whose
    winners are 16-bit rows: not for ``argmax`` 32, the winners' bits). With
    ``stream_queries`` (rows TMA reads), past tunables.wgmma_split_stream_query_ksteps (to
    WGMMA_STREAM_QUERY_CAPACITY) the query's atoms stream through the slots too, so that the
    ring, not a resident query, takes the shared memory (fp32 past dim 1280 was at 0.25-0.33 of
    the floor on mma.sync: bench/results/cliffs-2026-12-04-112bace-fp32-int8.json)."""
    threshold = tunables.wgmma_split_stream_query_ksteps
    streamed = bool(stream_queries and threshold and threshold < ksteps <= WGMMA_STREAM_QUERY_CAPACITY)
    capacity = WGMMA_STREAM_QUERY_CAPACITY if streamed else next((c for c in WGMMA_STREAM_CAPACITIES if c >= ksteps), None)
    if capacity is None:
        return None
    def fitted(warpgroups, stretch=0, streamed=streamed, tf32=tf32):
        return _fitted(WgmmaConfig(warpgroups=warpgroups, ksteps=WGMMA_STREAM_QUERY_CAPACITY if streamed else capacity,
                                   stages=tunables.wgmma_split_stages, argmax=int(bool(argmax)), tile_n=64, split_docs=1, half_rows=1,
                                   stream_k=1, tf32=int(tf32), stream_query=int(streamed), tf32_stretch=stretch))
    if tf32 == 1 and tunables.wgmma_tf32_doc_rows and argmax != 32 and not streamed:  # TF32_DOC_ROWS
        config = fitted(3, tf32=3)  # (three warpgroups, where the split query leaves rings of three)
        if config.shared_bytes <= WGMMA_SHARED_LIMIT and config.stages // 3 >= STREAM_MIN_RING:
            return config
    if tf32 == 1 and tunables.wgmma_tf32_stretch:
        # One accumulator set a warpgroup (TF32_STRETCH): the registers of three without winners (ptxas
        # spilled 24-28 bytes with them), the query's atoms streamed where three rings do not fit beside it
        # (fp32 dims past 768): 1.18x two warpgroups keeping it at dim 1024, three streaming 1.15x / 1.19x
        # two at 2560 / 4096 (H100, bench/results/ab-tf32-three-streaming-2026-12-06-e9bead5-h100.txt).
        config = fitted(tunables.wgmma_stream_warpgroups or (2 if argmax else 3), tunables.wgmma_tf32_stretch)
        if config.shared_bytes > WGMMA_SHARED_LIMIT and config.warpgroups == 3 and stream_queries and threshold:
            config = fitted(3, tunables.wgmma_tf32_stretch, streamed=True)
        return config if config.shared_bytes <= WGMMA_SHARED_LIMIT else fitted(2, tunables.wgmma_tf32_stretch)
    if tf32 == 1:
        # Two sets (wgmma_tf32_stretch=0): two warpgroups; in three's 128 registers they spill (1.58 ms
        # against 0.79 at dim 128: bench/results/cliffs-2026-12-03-6e1727b-fp32-wgmma_stream_warpgroups3.txt).
        return fitted(2)
    config = fitted(tunables.wgmma_stream_warpgroups or WGMMA_SHAPE["warpgroups"])
    if not tunables.wgmma_stream_warpgroups and config.stages // config.warpgroups < STREAM_MIN_RING:
        # Rings of two slots hold one loading while one multiplies: two longer rings keep more bytes in
        # flight (fp16 dim 2560, capacity 160: 0.827 -> 0.897 of the floor; at 1536 and 2048, rings of 5
        # and 3, three stayed faster: 0.96 against 0.92: bench/results/cliffs-2026-12-03-9bc7498-stream-wg-fp32.txt).
        config = fitted(2)
    return config if config.shared_bytes <= WGMMA_SHARED_LIMIT else None


#: Query block capacities (k-steps) of the Hopper kernel with documents on M streaming k (many
#: queries at fat dims: fp16 dims 192, 256, 320; int8 twice that): the warpgroups' query blocks
#: stay resident, so their bytes cap the dim (two blocks of 320 fp16 dims take 160 KB).
WGMMA_DOCS_ON_M_STREAM_CAPACITIES = (12, 16, 20)
#: Past them the query atoms stream too (WgmmaConfig.stream_query; in two warpgroups, a slot is
#: then 8 KB of documents and 16 KB of each warpgroup's queries), up to WGMMA_STREAM_QUERY_CAPACITY.


def wgmma_docs_on_m_stream_config(ksteps: int, argmax: bool = False, warpgroups_wanted: int = 3,
                                  int8: bool = False, stream_queries: bool = True, tf32: int = 0,
                                  tile_n: int = 64) -> WgmmaConfig | None:
    """The Hopper kernel with documents on M streaming the documents' atoms (a slot each) at
    ``ksteps`` past WGMMA_MAX_KSTEPS, in the most warpgroups (at most ``warpgroups_wanted``)
    whose query blocks fit with a ring of at least four slots; past the largest capacity, with
    ``stream_queries`` (q's rows readable by TMA), the query atoms streamed too (stream_query 1:
    whole groups' build; within_q_boxes gives the other); else None. ``tf32`` 2: fp32 under
    precision "high" (both operands as TF32; a k-step of 32 bytes is 8 elements, so the
    capacities are fp32 dims 96 / 128 / 160, and 4096 streaming the query atoms). ``tile_n`` 128
    (16-bit only; maxsim_fwd_wgmma.cu, M_HALVES): each warpgroup multiplies 128 document rows a
    slot as two halves against one query atom; 64 where that does not fit."""
    if tile_n != 64 and (int8 or tf32):
        tile_n = 64  # (int8's entry takes 64-row tiles with documents on M; TF32 builds likewise)
    if warpgroups_wanted < 2:
        return None
    capacity = next((c for c in WGMMA_DOCS_ON_M_STREAM_CAPACITIES if c >= ksteps), None)
    if capacity is None:
        if not stream_queries or ksteps > WGMMA_STREAM_QUERY_CAPACITY:
            return None
        config = _fitted(WgmmaConfig(warpgroups=2, ksteps=WGMMA_STREAM_QUERY_CAPACITY, stages=WGMMA_SHAPE["stages"],
                                     argmax=int(argmax), tile_n=tile_n, docs_on_m=1, stream_k=1, stream_query=1,
                                     tf32=tf32))
        if config.shared_bytes <= WGMMA_SHARED_LIMIT and config.stages >= 4:
            return config
        return wgmma_docs_on_m_stream_config(ksteps, argmax, warpgroups_wanted, int8, stream_queries, tf32) \
            if tile_n != 64 else config if config.shared_bytes <= WGMMA_SHARED_LIMIT else None
    most = min(warpgroups_wanted, int8_docs_on_m_warpgroups(argmax, capacity) if int8 else 3)
    for warpgroups in range(most, 1, -1):
        config = _fitted(WgmmaConfig(warpgroups=warpgroups, ksteps=capacity, stages=WGMMA_SHAPE["stages"],
                                     argmax=int(argmax), tile_n=tile_n, docs_on_m=1, stream_k=1, tf32=tf32))
        if config.shared_bytes <= WGMMA_SHARED_LIMIT and config.stages >= 4:
            return config
    return wgmma_docs_on_m_stream_config(ksteps, argmax, warpgroups_wanted, int8, stream_queries, tf32) \
        if tile_n != 64 else None


def wgmma_fp32_split_config(argmax: bool = False, presplit: bool = False) -> WgmmaConfig | None:
    """The Hopper kernel's fp32 split build (fp32 at fp32 accuracy for several queries, any
    dim: three fp16 atoms per 64 elements of it, counted at run time): the 16-bit build that
    streams the query atoms too, in two warpgroups; ksteps is the stream-query capacity's (the
    build reads no query block, so it bounds nothing). ``presplit``: the documents come split
    (fp32_split 2: copied by TMA, no staging, so a slot more), else its producer splits them."""
    config = _fitted(WgmmaConfig(warpgroups=2, ksteps=WGMMA_STREAM_QUERY_CAPACITY, stages=WGMMA_SHAPE["stages"],
                                 argmax=int(argmax), tile_n=64, docs_on_m=1, stream_k=1, stream_query=1,
                                 fp32_split=2 if presplit else 1))
    return config if config.shared_bytes <= WGMMA_SHARED_LIMIT else None


def within_q_boxes(config: WgmmaConfig, num_queries: int, query_length: int) -> WgmmaConfig:
    """``config``, or where it streams the query atoms and ``num_queries`` is no multiple of a
    block's queries (a group's last box of q's map would reach past q: slow zero fill), its
    build that keeps every box within q (stream_query 2); whole groups keep the plain build."""
    if config.stream_query and num_queries % config.queries_per_block(query_length):
        return dataclasses.replace(config, stream_query=2)
    return config


def int8_docs_on_m_warpgroups(argmax: bool, ksteps: int) -> int:
    """Warpgroups the Hopper kernel's int8 entry has with documents on M: two where three would
    spill (its packed winners with the argmax; dim 256's k-steps), else three (the #if before its
    entry in maxsim_fwd_wgmma.cu)."""
    return 2 if argmax or ksteps > 6 else 3


def int8_long_tiles(split_docs: bool, ksteps: int) -> bool:
    """Whether the Hopper kernel's int8 entry exists with 128-row tiles: only splitting
    documents (one accumulator set) with at most INT8_LONG_TILE_KSTEPS k-steps (the #if before
    its entry in maxsim_fwd_wgmma.cu)."""
    return bool(split_docs) and ksteps <= INT8_LONG_TILE_KSTEPS


def long_tiles_spill(split_docs: bool, ksteps: int, argmax: bool, half_rows: bool) -> bool:
    """Whether ptxas spills the Hopper kernel's fp16/bf16 entries with 128-row tiles: split
    documents at 2 k-steps (fp16 dim 32, int8 dim 64: one module) with the argmax and full query
    rows (8 bytes stored and 36 loaded a thread; NVRTC 12.9, sm_90a). 64-row tiles there do not."""
    return bool(split_docs) and ksteps <= 2 and bool(argmax) and not half_rows


def wgmma_tile_rows(mean_doc_length: float, int8: bool, split_docs: bool = False, ksteps: int = 4,
                    padded_elements: int = 0, tunables: Tunables = DEFAULT, argmax: bool = False,
                    half_rows: bool = False, ragged: bool = False) -> int:
    """Document rows per Hopper tile for documents of about ``mean_doc_length`` tokens;
    ``padded_elements``: the size of a padded corpus (0: packed), whose rows past a document's
    end a TMA tile does not read; ``ragged``: packed documents of unequal lengths, whose last
    tiles pad half a tile each on average (not the mean's padding): one query against 200k
    packed documents of 16-128 tokens, 64-row tiles against 128: fp16 1.325 -> 1.185 ms, int8
    1.179 -> 1.085 (bench/results/ab-tunables-2026-12-04-ae33c04.json)."""
    if (int8 and not int8_long_tiles(split_docs, ksteps)) or long_tiles_spill(split_docs, ksteps, argmax, half_rows):
        return 64
    if tunables.wgmma_tile_rows is not None:
        return tunables.wgmma_tile_rows
    if mean_doc_length <= 0:
        return 64
    if split_docs and padded_elements >= tunables.wgmma_long_tile_stream_elements:
        return 128
    padded = lambda n: mean_doc_length + n / 2 if ragged else -(-mean_doc_length // n) * n  # noqa: E731
    return 128 if padded(128) <= tunables.wgmma_long_tile_padding * padded(64) else 64


SIMT_THREADS = 128
#: The SIMT kernel stages this many bytes of document rows in shared memory per chunk.
SIMT_CHUNK_BYTES = 32 * 1024


def simt_shared_bytes(rows_per_chunk: int, dim: int, accumulator_bytes: int) -> int:
    # Mirrors the formula at the top of maxsim_fwd_simt.cu.
    return (rows_per_chunk * dim + SIMT_THREADS + rows_per_chunk) * accumulator_bytes + rows_per_chunk + SIMT_THREADS


#: Threads per block of the backward kernels (launch bounds in maxsim_bwd.cu), and blocks per SM
#: (MAXSIM_BWD_MIN_BLOCKS there); the hot-row partials hold at most 16 warps.
BWD_THREADS = 256
BWD_BLOCKS_PER_SM = 4
BWD_DIM_CHUNK = 128


def bwd_csr_shared_bytes(count_warps: int, longest_doc: int) -> int:
    # Mirrors the formula at the top of maxsim_bwd.cu.
    return 4 * (count_warps * longest_doc + 2 * longest_doc + 2)


def bwd_fused_shared_bytes(warps: int, block_rows: int, sources_per_doc: int) -> int:
    # Mirrors the formula above maxsim_bwd_fused in maxsim_bwd.cu.
    return 4 * (warps * block_rows + 4 * (block_rows + 1) + sources_per_doc)


def bwd_csr_layout(longest_doc: int, smem_limit: int, smem_per_sm: int) -> tuple[int, int]:
    """(count warps, global counts stride in words (0: counts in shared memory)) of the CSR
    build for documents of up to ``longest_doc`` tokens. Its launch gives dQ's blocks the same
    shared memory, so it stays within a quarter of an SM (their occupancy) where it can."""
    for budget in (min(smem_limit, smem_per_sm // BWD_BLOCKS_PER_SM - 1024), smem_limit):
        warps = min(BWD_THREADS // 32, (budget - bwd_csr_shared_bytes(0, longest_doc)) // (4 * longest_doc))
        if warps >= 1:
            return warps, 0
    return 1, bwd_csr_shared_bytes(1, longest_doc) // 4



#: Tile configurations the forward planner uses (see forward.choose_mma_config), by stacked width BN;
#: max_ksteps is the deepest dim (in 16-wide k-steps) each takes without register spills.
#: Chosen by bench/lab/tune_forward.py on the H200 (bench/results/tune-forward-*.log).
MMA_CONFIGS = {
    32: dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=3, max_ksteps=16),
    64: dict(warps_m=4, warps_n=2, mt=1, nt=4, stages=4, max_ksteps=16),
    128: dict(warps_m=2, warps_n=4, mt=2, nt=4, stages=3, max_ksteps=16),
    256: dict(warps_m=2, warps_n=4, mt=2, nt=8, stages=2, max_ksteps=8),
}


#: Row-start alignments in bytes the mma.sync kernel copies rows at (MmaConfig.load_bytes).
LOAD_ALIGNMENTS = (1, 2, 4, 8, 16)


#: Streaming k (dims past a width's max_ksteps): tiles by stacked width, STREAM_KSTEPS k-steps
#: (128 bytes of each row) a ring slot, or another of STREAM_KSTEPS_CHOICES (Tunables.stream_ksteps).
#: First shapes, not yet tuned (issue 24).
STREAM_KSTEPS = 4
STREAM_KSTEPS_CHOICES = (4, 8)
STREAM_CONFIGS = {
    32: dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=4, min_blocks=2),
    64: dict(warps_m=4, warps_n=2, mt=1, nt=4, stages=4, min_blocks=2),
    128: dict(warps_m=2, warps_n=4, mt=2, nt=4, stages=4),
    256: dict(warps_m=2, warps_n=4, mt=2, nt=8, stages=3),
}


def mma_config(width: int, ksteps: int, argmax: bool = False, fp32: bool = False,
               stream: bool = False, stream_ksteps: int = STREAM_KSTEPS) -> MmaConfig | None:
    """The tile configuration of stacked width ``width`` at ``ksteps`` (saving the argmax or
    not): the query block resident, or None past the width's max_ksteps or where the fp32 entry
    does not exist (see fp32_entry); with ``stream``, streaming k (any ksteps)."""
    if stream:
        config = MmaConfig(ksteps=stream_ksteps, argmax=int(argmax), stream_k=1, **STREAM_CONFIGS[width])
    else:
        shape = dict(MMA_CONFIGS[width])
        if ksteps > shape.pop("max_ksteps"):
            return None
        config = MmaConfig(ksteps=ksteps, argmax=int(argmax), **shape)
    return None if fp32 and not fp32_entry(config.mt, config.nt, config.ksteps, config.stream_k) else config


#: fp32 (3xTF32: each fragment also held as two TF32 halves) at 16 accumulator tiles per warp
#: (MT x NT) spills registers past this many k-steps, or streaming k (its chunk sums), in the
#: compile report (sm_90); the #if before maxsim_fwd.cu's fp32 entry holds the same rule.
FP32_WIDE_TILE_KSTEPS = 6


def fp32_entry(mt: int, nt: int, ksteps: int, stream_k: int = 0) -> bool:
    """Whether maxsim_fwd.cu's fp32 entry exists in the variant of these tiles and k-steps."""
    return mt * nt < 16 or (ksteps <= FP32_WIDE_TILE_KSTEPS and not stream_k)


def choose_stages(config: MmaConfig, smem_limit: int = WGMMA_SHARED_LIMIT) -> MmaConfig | None:
    """``config`` with fewer ring stages (at least two) until its shared memory fits
    ``smem_limit``, or None where even two do not."""
    while config.shared_bytes > smem_limit and config.stages > 2:
        config = dataclasses.replace(config, stages=config.stages - 1)
    return config if config.shared_bytes <= smem_limit else None
