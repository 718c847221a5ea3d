"""The forward planner: which kernel scores a problem, and how its grid covers the documents.

Pure functions of (problem shape, device properties, tunables); the one input that needs a
compiled kernel, how many of its blocks an SM holds, is passed in (``resident``) by the caller
(_forward.py), which caches the finished plan under everything it was made from.
"""

from __future__ import annotations

import dataclasses
import typing

from .._gpu.registry import SUFFIX_FORMAT
from ..tuning import Tunables
from .configs import (MMA_CONFIGS, SIMT_CHUNK_BYTES, SIMT_THREADS, STREAM_KSTEPS, choose_stages, mma_config,
                      simt_shared_bytes, wgmma_config, wgmma_docs_on_m_stream_config, wgmma_fp32_split_config,
                      wgmma_stream_config, wgmma_tile_rows, within_q_boxes)

#: Bytes per element by kernel suffix (registry.FORMATS).
ITEMSIZE = {suffix: f.bits // 8 for suffix, f in SUFFIX_FORMAT.items()}
#: The widest stacked query tile: longer queries take the CUDA-core kernel.
MAX_QUERY_ROWS = max(MMA_CONFIGS)
#: Formats the tensor-core kernels take (all of them the mma.sync kernel; some the Hopper one).
TENSOR_CORE_SUFFIXES = tuple(suffix for suffix, f in SUFFIX_FORMAT.items() if f.tensor_cores)
HOPPER_SUFFIXES = tuple(suffix for suffix, f in SUFFIX_FORMAT.items() if f.hopper)


class ForwardShape(typing.NamedTuple):
    """What the forward planner reads of a problem (no pointers): the cache key of its plan."""

    suffix: str  # the dtype's kernel suffix (registry.DTYPE_SUFFIX)
    num_queries: int
    query_length: int
    dim: int
    num_docs: int
    pairs: bool
    argmax_bits: int  # 16 or 32: the winners saved; 0: none
    mean_doc_length: float  # tokens of an average document (packed: total / documents)
    packed: bool
    load_bytes: int = 16  # every row start's alignment (load_alignment)
    ragged: bool = False  # packed documents of unequal lengths
    part_maxima: bool = False  # the documents are parts of documents: a record each (document_parts)


class KernelChoice(typing.NamedTuple):
    """The tensor-core kernel a shape takes and its tile configuration."""

    family: str
    name: str
    config: object  # configs.MmaConfig or configs.WgmmaConfig

    @property
    def wgmma(self) -> bool:
        return self.family == "maxsim_fwd_wgmma"


class ForwardGeometry(typing.NamedTuple):
    """How a tensor-core forward's grid covers the queries and the documents."""

    group: int  # queries per block
    groups: int  # query groups (grid y)
    docs_per_block: int
    grid_x: int  # document ranges
    doc_rotation: int  # query groups of one range start this many documents apart (L2 reuse)
    tile_rows: int  # Hopper kernel: document rows per TMA tile; 0 for mma.sync
    last_group_docs_per_block: int  # the last query group's own ranges (idle_group_ranges), or 0: the others'
    long_ranges: int  # ranges of docs_per_block documents; those after hold one fewer (balanced_ranges)


def load_alignment(suffix: str, dim: int, query_length: int, strides: tuple, pointers: tuple,
                   capability: int) -> int:
    """The alignment in bytes (1 to 16, a power of two) of every row start of q and d, at which
    the tensor-core kernels copy rows, or 0 where they cannot take the operands (float64, a
    strided embedding dim, a query wider than a tile, before sm_80). Below 4 bytes (plain loads,
    not cp.async) the dim's bytes count too, so that no load reaches past a row. ``strides``: q's
    and d's strides in elements (the dim's last); ``pointers``: q's and d's."""
    item = ITEMSIZE[suffix]
    q_strides, d_strides = strides
    if suffix not in TENSOR_CORE_SUFFIXES or query_length > MAX_QUERY_ROWS or capability < 80 or dim < 1:
        return 0
    if q_strides[-1] != 1 or d_strides[-1] != 1:
        return 0
    starts = pointers[0] | pointers[1] | 16
    for stride in q_strides[:-1] + d_strides[:-1]:
        starts |= stride * item
    alignment = starts & -starts
    return alignment if alignment >= 4 else min(alignment, (dim * item) & -(dim * item))


def choose_mma_config(num_queries: int, query_length: int, ksteps: int, pairs: bool, smem_limit: int,
                      argmax: bool = False, fp32: bool = False, stream: bool = False,
                      stream_ksteps: int = STREAM_KSTEPS):
    """The mma.sync tile configuration for a problem, or None (CUDA-core path)."""
    widths = [w for w in sorted(MMA_CONFIGS) if w >= query_length]
    if not pairs and num_queries > 1:
        # Stack several queries on the MMA N dimension: one document tile then serves them all.
        # 256 columns (8 queries of 32) measured fastest for 32+ queries on the H200
        # (bench/results/tune-forward-*.log).
        stacked = min(num_queries * query_length, 256)
        widths = [w for w in widths if w >= stacked] + [w for w in reversed(widths) if w < stacked]
    for width in widths:  # preferred first; narrower ones where a wide tile cannot take this dim
        config = mma_config(width, ksteps, argmax, fp32, stream, stream_ksteps)
        config = config and choose_stages(config, smem_limit)
        if config is not None:
            return config
    return None


def choose_kernel(shape: ForwardShape, properties: tuple, tunables: Tunables) -> KernelChoice | None:
    """The tensor-core kernel and tile configuration of ``shape`` on a device of
    ``properties`` (gpu.device.device_properties), or None (the CUDA-core kernel)."""
    sm_count, smem_limit, smem_per_sm, capability, l2_bytes = properties
    suffix, num_queries, query_length, dim, num_docs, pairs, argmax, mean_doc_length, packed, load_bytes, ragged = shape[:11]
    ksteps = -(-dim * ITEMSIZE[suffix] // 32)  # k-steps are 32 bytes
    corpus_elements = num_docs * mean_doc_length * dim
    scaled = SUFFIX_FORMAT[suffix].scaled  # int8: the Hopper kernel's int8 entry rules (configs)
    # The Hopper kernel copies rows by TMA where they start on 16 bytes, else in cp.async pieces
    # of 4 or 8 bytes (dim 100 in 16-bit), but only with queries for two warpgroups or more (its
    # four copy warps): one query's split rings have a copy warp each, and there the pieces
    # measured slower than the mma.sync kernel (fp16 dim 100: 0.38 of the floor against 0.50;
    # 32 queries 0.54 against 0.21: bench/results/cliffs-2026-12-03-b8ce1b9-odd.txt). Below 4
    # bytes, plain loads: the mma.sync kernel.
    hopper = load_bytes == 16 or (load_bytes >= 4 and num_queries > 64 // query_length)
    # fp32 takes the Hopper kernel for one query (its TF32 builds, streaming k: the document as
    # TF32 under precision "high"), and under precision "high" for several queries too (documents
    # on M, both operands as TF32, rows on 16 bytes); many queries at fp32 accuracy take its split
    # build (fp32_split_choice), so do rows off 16 bytes under "high".
    tf32 = (2 if tunables.float32_precision == "high" else 1) if suffix == "fp32" and tunables.wgmma_tf32 else 0
    docs_tf32 = tf32 == 2 and load_bytes == 16
    split = fp32_split_choice(shape, capability, smem_limit, tunables)
    if split is not None:
        return split
    if (tunables.use_wgmma and hopper and capability == 90 and (suffix in HOPPER_SUFFIXES or tf32) and not pairs
            and query_length <= 64):
        # Hopper: warpgroup MMA, as many consumer warpgroups as the queries fill, each owning
        # 64 // Lq whole queries on the MMA's M, or, with queries enough for two warpgroups of
        # 128 rows, 128 // Lq on its N (documents on M, 64-row tiles; its winners are 16-bit).
        # An odd number of k-steps (fp16 dim 112, int8 dim 96) is padded to even: the TMA tiles
        # and the cp.async chunks past the dim are zero-filled, which adds nothing to a dot.
        even_ksteps = ksteps + ksteps % 2
        docs_on_m = tunables.wgmma_docs_on_m and num_queries > 128 // query_length and argmax != 32
        warpgroups = -(-num_queries // ((128 if docs_on_m else 64) // query_length))
        if docs_on_m and tunables.wgmma_docs_on_m_warpgroups:
            warpgroups = min(warpgroups, tunables.wgmma_docs_on_m_warpgroups)
        tile_rows = 64 if docs_on_m else wgmma_tile_rows(
            mean_doc_length, scaled, warpgroups < 2, even_ksteps, 0 if packed else corpus_elements,
            tunables=tunables, argmax=bool(argmax),
            half_rows=bool(tunables.wgmma_half_rows) and num_queries * query_length <= 32, ragged=ragged)
        config = None if tf32 and not (docs_on_m and docs_tf32) else wgmma_config(
            even_ksteps, bool(argmax), warpgroups, tile_rows, num_queries * query_length, docs_on_m, scaled,
            tunables=tunables, tf32=tf32)
        if (config is None and warpgroups < 2 and num_queries * query_length <= 32 and tunables.wgmma_stream_k
                and tunables.wgmma_split_docs and tunables.wgmma_half_rows):
            # One query at a fat dim (or fp32): the documents' atoms streamed through the split rings.
            config = wgmma_stream_config(ksteps, argmax, tunables, tf32,
                                         stream_queries=load_bytes == 16 and tunables.use_tma)
            if config is not None and shape.part_maxima:
                config = dataclasses.replace(config, part_maxima=1)
        # Queries of more rows than one query's half rows but too few for documents on M (two
        # to four of 32 tokens) at a fat dim: documents on M all the same, in two warpgroups
        # though the queries fill one (the other's MMAs run on rows no score reads), not
        # mma.sync: fp16 4x32 queries against 2 GB at dims 384-2560 took 2.06-2.09 ms there,
        # 8x32 0.86-0.92 ms on documents on M (bench/results/cliffs-2026-12-03-aa99d32-few-queries.json).
        few_rows = (not docs_on_m and num_queries * query_length > 32 and tunables.wgmma_docs_on_m
                    and argmax != 32)
        if config is None and (docs_on_m or few_rows) and (not tf32 or docs_tf32) and tunables.wgmma_stream_k:
            # Many queries at a fat dim: the documents' atoms streamed past resident query blocks,
            # or at fatter dims beside the query atoms (by TMA from q: 16-byte rows).
            config = wgmma_docs_on_m_stream_config(even_ksteps, bool(argmax), max(warpgroups, 2), scaled,
                                                   stream_queries=load_bytes == 16 and tunables.use_tma, tf32=tf32,
                                                   tile_n=128 if 0 < tunables.wgmma_docs_on_m_halves_ksteps <= ksteps
                                                   else 64)
            if config is not None:
                config = within_q_boxes(config, num_queries, query_length)
        if config is not None and config.shared_bytes <= smem_limit:
            if load_bytes != 16:
                config = dataclasses.replace(config, load_bytes=load_bytes)
            return KernelChoice("maxsim_fwd_wgmma", f"maxsim_fwd_wgmma_{suffix}", config)
    resident_max = tunables.fp32_resident_max_ksteps if suffix == "fp32" else tunables.mma_resident_max_ksteps
    stream = ksteps > resident_max
    config = choose_mma_config(num_queries, query_length, ksteps, pairs, smem_limit, bool(argmax), suffix == "fp32",
                               stream, tunables.stream_ksteps)
    if config is not None and load_bytes != 16:
        # 16-bit rows on 4 bytes come as shifted 16-byte lines (a shift a tile row: fewer stages
        # may fit); on 8 bytes, or fp32 and int8, in pieces (shifted lines measured no faster at
        # fp16 dim 100 and slower at fp32 dim 130: bench/results/cliffs-2026-12-04-f2e636a-shifted-ab.txt).
        shifted = int(load_bytes == 4 and ITEMSIZE[suffix] == 2)
        config = choose_stages(dataclasses.replace(config, load_bytes=load_bytes, shifted_rows=shifted), smem_limit)
    if config is None:
        return None
    return KernelChoice("maxsim_fwd", f"maxsim_fwd_{suffix}", config)


def fp32_split_choice(shape: ForwardShape, capability: int, smem_limit: int, tunables: Tunables) -> KernelChoice | None:
    """fp32 at fp32 accuracy for several queries on Hopper as three fp16 products
    (Tunables.wgmma_fp32_split; configs.wgmma_fp32_split_config) for more query rows than one
    query's half rows (32; two to four queries of 32 as the 16-bit few-queries rule, whose
    alternative here is mma.sync's 3xTF32), or None. Any dim; rows on 4 bytes or more (the
    producer's plain loads: 16-byte vectors where the rows allow); the queries come split into
    a tensor of their own, whose TMA map the build reads (tunables.use_tma). Under precision
    "high" too where its TF32 documents on M cannot run (rows off 16 bytes): "high" allows less
    accuracy, and the alternative is mma.sync's 3xTF32, slower."""
    if not (shape.suffix == "fp32" and tunables.wgmma_fp32_split
            and (tunables.float32_precision == "highest" or shape.load_bytes != 16)
            and tunables.use_wgmma and tunables.use_tma and tunables.wgmma_docs_on_m and capability == 90
            and not shape.pairs and shape.query_length <= 64 and shape.load_bytes >= 4
            and shape.num_queries * shape.query_length > 32 and shape.argmax_bits != 32):
        return None
    # Presplit (Tunables.wgmma_fp32_presplit): the documents split by a launch before, into
    # halves of 4 bytes an element (128 halves a 64 of the dim) that TMA copies: rows on 16 bytes.
    halves_bytes = shape.num_docs * shape.mean_doc_length * 256 * -(-shape.dim // 64)
    presplit = (tunables.wgmma_fp32_presplit and shape.load_bytes == 16
                and halves_bytes <= tunables.fp32_presplit_max_bytes)
    config = wgmma_fp32_split_config(bool(shape.argmax_bits), presplit)
    if config is None:
        return None
    config = within_q_boxes(config, shape.num_queries, shape.query_length)
    if shape.load_bytes != 16:
        config = dataclasses.replace(config, load_bytes=shape.load_bytes)
    return KernelChoice("maxsim_fwd_wgmma", "maxsim_fwd_wgmma_fp32_split", config) if config.shared_bytes <= smem_limit else None


def persistent_chunks(num_docs: int, groups: int, resident: int) -> int:
    """Document ranges per query group such that the groups x ranges blocks fill whole waves
    of resident blocks: a wave with a few blocks left over doubles the time (measured: 136
    blocks on 132 SMs ran 2.5x slower than 132). Fewest ranges among the best fills."""
    best, best_fill = 1, 0.0
    for chunks in range(1, max(1, min(num_docs, 4 * resident // groups)) + 1):
        blocks = groups * -(-num_docs // -(-num_docs // chunks))  # ranges actually made
        fill = blocks / (-(-blocks // resident) * resident)
        if fill > best_fill + 1e-9:
            best, best_fill = chunks, fill
    return best


def balanced_ranges(num_docs: int, blocks: int) -> tuple[int, int, int]:
    """(documents of a long range, ranges, long ranges) for one query group: a block an SM (of
    ``blocks`` resident) whose ranges differ by at most one document, the long ones first. Where
    ranges of ceil(num_docs / blocks) left SMs without work, the fattest corpora lost most: fp32
    dim 4096, 813 documents, took 117 blocks of 7 (0.85 of the floor on an H100)."""
    ranges = max(1, min(num_docs, blocks))
    per = max(1, -(-num_docs // ranges))  # (no documents: one empty range)
    return per, ranges, num_docs - (per - 1) * ranges


#: The most parts a document is scored in (maxsim_parts.cu reads a document's parts' flags in
#: one warp's lanes).
MAX_DOCUMENT_PARTS = 32


def document_parts(num_docs: int, mean_doc_length: float, tile_rows: int, rings: int, per_ring: int) -> int:
    """Parts a document is scored in (Tunables.document_parts_per_ring) where one query group's
    ``rings`` split rings (every block's, one wave) would read fewer than ``per_ring`` documents
    each: enough parts for about ``per_ring`` a ring, at most one a tile of an average document
    (a part is whole ``tile_rows``-row tiles, so that every tile's rows are the whole
    document's), or 1: whole documents. A block's last document, read by one ring alone while
    the block's others idle, was the tail of fat-dim calls: fp32 dim 2560, 1,302 documents over
    396 rings, 0.92 of the floor on an H100 (bench/results/cliffs-2026-12-07-feb99fb-*)."""
    if per_ring <= 0 or num_docs <= 0 or num_docs >= per_ring * rings:
        return 1
    tiles = max(1, -(-int(mean_doc_length) // tile_rows))
    return max(1, min(-(-per_ring * rings // num_docs), tiles, MAX_DOCUMENT_PARTS))


def geometry(shape: ForwardShape, choice: KernelChoice, resident: int, properties: tuple,
             tunables: Tunables) -> ForwardGeometry:
    """The grid of ``choice`` for ``shape``, with ``resident`` of its blocks per SM."""
    sm_count, l2_bytes = properties[0], properties[4]
    config, pairs, num_queries, num_docs = choice.config, shape.pairs, shape.num_queries, shape.num_docs
    group = 1 if pairs else max(1, min(num_queries, config.queries_per_block(shape.query_length)))
    groups = 1 if pairs else -(-num_queries // group)
    # (the Hopper kernel's one-query-group builds only: its others read ranges of one size)
    if not pairs and groups == 1 and tunables.balanced_ranges and (not choice.wgmma or config.split_docs):
        docs_per_block, grid_x, long_ranges = balanced_ranges(num_docs, sm_count * resident)
    else:
        # One wave of resident blocks, each streaming an equal range of documents through its
        # pipeline (a persistent grid): no tail of half-empty waves.
        docs_per_block = 1 if pairs else -(-num_docs // persistent_chunks(num_docs, groups, sm_count * resident))
        grid_x = long_ranges = -(-num_docs // docs_per_block)
    # Query groups of one document range start at different documents (the Hopper kernel), so
    # that they do not all ask the same L2 lines at once; only when the corpus fits in half the
    # L2 cache, so that a later group still finds what an earlier one read.
    corpus_bytes = num_docs * shape.mean_doc_length * shape.dim * ITEMSIZE[shape.suffix]
    corpus_fits = corpus_bytes <= l2_bytes // 2
    doc_rotation = -(-docs_per_block // groups) if choice.wgmma and groups > 1 and corpus_fits else 0
    # Where the last group's warpgroups past the last query idle, it has ranges of its own (one
    # group: the same; one wave of several: longer, its blocks finishing with the others').
    last_docs_per_block = 0
    if grid_x * groups <= sm_count * resident:
        share = idle_group_share(shape, config, group, groups, tunables)
        if share < 1.0 and groups == 1:
            last_docs_per_block = docs_per_block
        elif share < 1.0:
            docs_per_block, last_docs_per_block = idle_group_ranges(num_docs, groups, share, sm_count * resident)
            grid_x = long_ranges = max(-(-num_docs // docs_per_block), -(-num_docs // last_docs_per_block))
    return ForwardGeometry(group, groups, docs_per_block, grid_x, doc_rotation, config.tile_n if choice.wgmma else 0,
                           last_docs_per_block, long_ranges)


#: A documents-on-M tile's fold and close, in one warpgroup's MMA k-steps (m64n128k16, 64 clocks
#: at the tensor rate): about 920 clocks an SM a tile past the MMAs at fp16 dim 64 (the
#: thirty-third session's profile), the cost model of idle_group_share.
FOLD_KSTEPS = 14


def idle_group_share(shape: ForwardShape, config, group: int, groups: int, tunables: Tunables) -> float:
    """The last query group's cost a document against a whole group's, where its warpgroups past
    the last query idle (documents on M: maxsim_fwd_wgmma.cu, idle_docs_on_m; e.g. 32 queries of
    32 tokens in groups of 12, the last one's third warpgroup): (working k-steps + fold) /
    (all k-steps + fold) a tile; 1.0 where no warpgroup idles or the build issues in turns."""
    if not (getattr(config, "docs_on_m", 0) and tunables.wgmma_idle_groups) or config.turns:
        return 1.0
    per_warpgroup = config.group_rows // shape.query_length
    working = -(-(shape.num_queries - (groups - 1) * group) // per_warpgroup)
    if working >= config.warpgroups:
        return 1.0
    ksteps = config.tile_ksteps(shape.dim, ITEMSIZE[shape.suffix])
    return (working * ksteps + FOLD_KSTEPS) / (config.warpgroups * ksteps + FOLD_KSTEPS)


def idle_group_ranges(num_docs: int, groups: int, share: float, blocks: int) -> tuple[int, int]:
    """Documents a block of the whole groups and of the last one, such that ``blocks`` resident
    blocks (one wave) finish together: the last group's blocks, ``share`` of a whole group's
    work a document, take longer ranges in proportion."""
    # (whole rounded down, so that the groups' blocks stay within one wave; the last group never
    # more blocks than a whole one's, else its ranges would be the shorter and a grid sized by
    # the whole groups' would miss documents)
    whole = max(1, int(blocks / (groups - 1 + share)))
    last = min(whole, max(1, blocks - (groups - 1) * whole))
    return -(-num_docs // whole), -(-num_docs // last)


class SimtPlan(typing.NamedTuple):
    """The CUDA-core kernel's launch: fp32, fp64 and what the tensor-core kernels cannot take."""

    name: str
    rows_per_chunk: int
    shared: int
    grid: int
    threads: int


def simt_plan(suffix: str, num_queries: int, dim: int, num_docs: int, pairs: bool, properties: tuple) -> SimtPlan:
    """Rows staged per chunk, shared memory and grid of the CUDA-core kernel; ValueError where
    even one row does not fit in shared memory."""
    sm_count, smem_limit = properties[:2]
    accumulator = 8 if suffix == "fp64" else 4
    rows = max(1, SIMT_CHUNK_BYTES // (dim * accumulator))
    shared = simt_shared_bytes(rows, dim, accumulator)
    if shared > smem_limit:
        raise ValueError(f"dim {dim} is too large for the GPU kernels (at most {smem_limit // accumulator - 160})")
    total = num_docs if pairs else num_queries * num_docs
    return SimtPlan(f"maxsim_fwd_simt_{suffix}", rows, shared, min(total, sm_count * 64), SIMT_THREADS)

