"""The dispatch tunables: one frozen object, the only knobs the planners read.

Every choice a measurement settled (tile shapes, crossovers, the one-launch backward's limits)
is a field here with the measurement beside it (``docs/decisions.md`` indexes them). The
planners are pure functions of (problem, device properties, tunables); the public functions
pass :func:`current`. A benchmark or a test that wants other values says so explicitly::

    with cupy_maxsim.tuning.override(use_wgmma=False):   # A/B against mma.sync on Hopper
        cm.score(q, d)

Three environment variables seed the defaults once, at import (A/B measurements from a shell):
``CUPY_MAXSIM_WGMMA=0``, ``CUPY_MAXSIM_DOCS_ON_M=0``, ``CUPY_MAXSIM_TMA=0``. Nothing reads the
environment or a mutable module global at call time. Caches of plans are keyed by the
tunables they were planned under, so an override never meets a plan made without it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os

#: The float32 precisions :func:`float32_matmul_precision` takes (torch's names).
FLOAT32_PRECISIONS = ("highest", "high")


@dataclasses.dataclass(frozen=True)
class Tunables:
    #: Hopper (sm_90) forward on warpgroup MMA; False keeps it on the mma.sync kernel.
    use_wgmma: bool = True
    #: Many queries on Hopper put the documents on the MMA's M (unless 32-bit winners are
    #: saved); False keeps queries on M.
    wgmma_docs_on_m: bool = True
    #: Documents on M with k resident: the warpgroups issue each tile's MMAs in turns, so that
    #: one folds while the others multiply (WgmmaConfig.turns). Off until measured against
    #: issuing together (bench/ab_tunables.py).
    wgmma_turns: bool = False
    #: Documents on M: the last query group's warpgroups past the last query idle (maxsim_fwd_
    #: wgmma.cu, idle_docs_on_m) and its blocks take longer document ranges, so that one wave's
    #: blocks finish together (_plan/forward.idle_group_ranges); off: every group's ranges alike,
    #: every warpgroup multiplying.
    wgmma_idle_groups: bool = True
    #: One query group: a block an SM, ranges differing by at most one document
    #: (_plan/forward.balanced_ranges); off: ranges of one size, ceil(documents / ranges), as
    #: persistent_chunks fills the wave (813 documents: 117 blocks of 7, 15 SMs idle). Off:
    #: measured slower (H100, fp32 one query against 4 GB: dim 4096 1.558 -> 1.702 ms, 2560
    #: 1.430 -> 1.445; bench/results/ab-tunables-2026-12-07-025004b-parts-h100.txt). What the
    #: 15 idle SMs cost is less than the tail it makes: 21 blocks of 7 whose seventh document one
    #: ring reads alone while the other 111 blocks are done, where 117 blocks of 7 all end so.
    balanced_ranges: bool = False
    #: One query group at fat dims (the split rings streaming k) over a corpus of so few
    #: documents that a ring reads fewer than this many: each document is scored in parts of
    #: whole tiles, enough for about this many a ring (_plan/forward.document_parts; the forward
    #: writes a record a part and maxsim_parts.cu merges them into the scores), so that no ring
    #: reads a whole fat document alone at the end (fp32 dim 2560, one query against 4 GB: 1,302
    #: documents over 396 rings, 0.92 of the floor on an H100). 0: whole documents. Measured at 16
    #: (H100, fp32 one query against 4 GB): GPU time 1.430 -> 1.378 ms at dim 2560, 1.558 -> 1.401
    #: at 4096 (flash-maxsim 1.319 / 1.500; bench/results/ab-tunables-2026-12-07-025004b-parts-h100.txt),
    #: the scores the whole documents' bit for bit. Replayed (session 54), a call costs 83-97 us
    #: of host time against 69-80 whole (235-483 before); off until a rule keeps thin documents
    #: whole: they lose in parts (dim 768 1.321 -> 1.377 ms, fp16 dim 2560 1.294 -> 1.367;
    #: bench/results/ab-tunables-2026-12-07-409c237-parts-replay-h100.txt).
    document_parts_per_ring: int = 0
    #: Documents on M: at most this many consumer warpgroups (2 or 3; 0: as many as the queries
    #: fill, up to three): 32 queries of 32 tokens in two are four groups of eight, no padding.
    wgmma_docs_on_m_warpgroups: int = 0
    #: Documents on M streaming k (many queries at fat dims, 16-bit): from this many k-steps of
    #: 32 bytes on (fp16 dim 2048), a warpgroup multiplies 128 document rows a slot against one
    #: query atom (two halves, two accumulator sets: maxsim_fwd_wgmma.cu, M_HALVES), not 64; 0:
    #: never. H100, 32x32 queries vs 4 GB fp16: dim 2560 8.607 -> 7.582 ms (1.135x), 1024 1.004x,
    #: 256 0.990x (bench/results/ab-docs-rows-2026-12-06-94b6602-h100.txt).
    wgmma_docs_on_m_halves_ksteps: int = 128
    #: The Hopper kernel's document tiles by TMA; False copies them with cp.async.
    use_tma: bool = True
    #: The L2 promotion of the Hopper kernel's TMA maps, in bytes (0, 64, 128 or 256: how much a
    #: miss of a box's line fetches into L2); None: by the rows' width (_gpu/tma.l2_promotion_of_rows:
    #: none for 256-byte rows of 8- or 16-bit elements, else 256 as CUTLASS's examples take it).
    tma_l2_promotion: int | None = None
    #: 64 or 128 forces the Hopper tile rows for 16-bit inputs; None chooses per problem.
    #: Documents on M (many queries) always take 64: 128-row tiles streaming the query atoms
    #: were built and measured no faster (fp16 32x32 queries at dims 768 / 2560: 0.70 / 0.72
    #: of the matrix rate against 64 rows' 0.76 / 0.73, bench/results/cliffs-2026-12-03-scan-ab.txt).
    wgmma_tile_rows: int | None = None
    #: One query group (<= 64 rows, memory-bound) gets three warpgroups that hold the same
    #: queries and split the block's documents, each from a ring of its own: colbert-1q-1M
    #: 10.2 -> 8.0 ms against mma.sync (bench/results/tune-wgmma-2026-11-30-b5ade09.log).
    #: False keeps one query group on the mma.sync kernel.
    wgmma_split_docs: bool = True
    #: Ring slots when splitting documents, cut to what fits in whole rings.
    wgmma_split_stages: int = 30
    #: Splitting with at most 32 query rows, each thread folds one accumulator row, not two
    #: (int8 corpus-10k spent 30% of its time folding: ablation-wgmma-2026-11-30-b91374a.log).
    wgmma_half_rows: bool = True
    #: Dims past the Hopper kernel's 8 resident k-steps: one query of at most 32 tokens (fp16
    #: dims 136 to 2560, int8 to 5120) has its documents' atoms streamed slot by slot through the
    #: split rings (maxsim_fwd_wgmma.cu, STREAM_K); many queries (documents on M) past resident
    #: query blocks to fp16 dim 320, past that beside the query atoms (STREAM_QUERY, to 8192):
    #: training at dims 320 / 2560 4.05x / 2.61x flash-maxsim's step
    #: (bench/results/train-fat-2026-12-03-62039cd.txt). False: the mma.sync kernel streaming k.
    wgmma_stream_k: bool = True
    #: fp32, one query of at most 32 tokens: the Hopper kernel's TF32 builds (big and small
    #: TF32 halves of both operands, streaming k). False: the mma.sync kernel's 3xTF32.
    wgmma_tf32: bool = True
    #: float32 products: "highest" (fp32 accuracy, the contract) or "high" (opt-in, as
    #: torch.set_float32_matmul_precision names it: elements may be read as TF32, at most 2^-9
    #: sum |q||d| off a similarity; on Hopper only: one query reads the documents as TF32, several
    #: queries with rows on 16 bytes both operands (documents on M); elsewhere still "highest").
    #: Set with :func:`float32_matmul_precision`.
    float32_precision: str = "highest"
    #: fp32 at fp32 accuracy for several queries on Hopper (documents on M, "highest"): three
    #: fp16 products of per-token power-of-two-scaled halves (maxsim_fwd_wgmma.cu, FP32_SPLIT;
    #: 1.5x a bf16 cell's MMA work against 3xTF32's 3, errors 0.8-6.2e-7 of the largest score on
    #: the CPU: bench/results/split-study-2026-12-05.txt). On: 19.3-22.6 ms on the H200's 4 GB
    #: 32-query cells (bench/results/cliffs-2026-12-05-759234f-split-peers-h200.txt), where the
    #: mma.sync kernel's 3xTF32, which False keeps, took 48-61 (1.7-2.5x the split on an H100 in
    #: one run: cliffs-2026-12-05-split-staged-h100.txt).
    wgmma_fp32_split: bool = True
    #: The split's documents split before the forward, by one launch (launch.split_documents:
    #: fp16 halves and their rows' scales, the float32 bytes again), and copied by TMA as 16-bit
    #: tiles are, instead of split by the forward's producer from float32 it stages: for corpora
    #: of rows on 16 bytes whose halves take at most ``fp32_presplit_max_bytes`` (else, or where
    #: the halves cannot be allocated, the staged build, which False keeps). On: 1.18-1.48x the staged build on an H100's 32-query
    #: 4 GB cells, its 1.5x-bytes form (bench/results/ab-presplit-2026-12-06-5be13b7-h100.txt);
    #: the staged build's consumers wait on its slots (ab-split-producer-2026-12-05-h100-h200.txt).
    wgmma_fp32_presplit: bool = True
    fp32_presplit_max_bytes: int = 8 << 30
    #: Streaming k, consumer warpgroups (each with a ring of its own): 0 chooses (three, or two
    #: where three rings would hold fewer than configs.STREAM_MIN_RING slots); 2 or 3 forces
    #: (fp32 at fp32 accuracy: the two-set builds always two, three spill; one set a warpgroup
    #: chooses three without winners, 24-28 bytes spilled with them: configs.wgmma_stream_config).
    wgmma_stream_warpgroups: int = 0
    #: fp32 one query at fp32 accuracy (the TF32 split-documents builds): atoms a stretch of one
    #: accumulator set takes (maxsim_fwd_wgmma.cu, TF32_STRETCH), in three warpgroups without
    #: winners (the query streamed past dim 768; two with winners, or wgmma_stream_warpgroups);
    #: 0: two warpgroups of two sets. One atom a stretch adds as the two sets do (bit for bit) and
    #: is the fastest: fp32 1x32 vs 4 GB on an H100, 1.347 / 1.352 / 1.391 / 1.491 / 1.599 ms at
    #: dims 128 / 768 / 1024 / 2560 / 4096, against 1.649-1.808 for two sets and 1.419-1.652 for
    #: stretches of four, whose truncating additions in the tensor cores doubled the error (a
    #: near-tied packed score 1.48e-5 off float64, past the 1e-5 line):
    #: bench/results/tf32-stretches-2026-12-06-6086357-h100.txt.
    wgmma_tf32_stretch: int = 1
    #: fp32 one query at fp32 accuracy, the query resident (dims to 512): the
    #: documents on M, their atoms the MMA's A from registers split there, three TF32 products a
    #: k-step (maxsim_fwd_wgmma.cu, TF32_DOC_ROWS; configs.wgmma_stream_config), instead of the
    #: split documents' stretches: fp32 1x32 vs 4 GB on an H100 at 0.95-1.01 of the floor at dims
    #: 48-320 (dim 100 1.398 ms against the split documents' 1.590-1.700:
    #: bench/results/cliffs-2026-12-07-9e8fde0-fp32-1q-doc-rows-h100.txt). It has winners of its own
    #: (rows in 16 bits; 32-bit winners keep the split documents), so a call's scores are bit for
    #: bit the same with and without them (tests/test_tf32_doc_rows.py::test_winners).
    wgmma_tf32_doc_rows: bool = True
    #: Streaming k for one query, past this many k-steps of 32 bytes (fp16 dim 2048, fp32 1024, int8 4096;
    #: 0: never) the query's atoms stream through the ring's slots beside the documents' instead
    #: of the whole query staying resident in shared memory (where q's rows are readable by TMA):
    #: the ring gets deeper and the fp16 dim limit goes from 2560 to 8192 (configs.
    #: wgmma_stream_config). fp16, one query against 4 GB: dim 2560 0.92 -> 0.96 of the floor;
    #: at 2048 the resident query's ring was deep enough (0.98 against 0.96), and at 1536 (1.01 /
    #: 1.00): bench/results/cliffs-2026-12-04-fb1b370-stream-query-ab.txt.
    wgmma_split_stream_query_ksteps: int = 128
    #: 128-row tiles where they pad documents by at most this much more than 64-row tiles
    #: (colpali-32q 7.48 -> 6.75 ms, inbatch-128 0.235 -> 0.250: tune-wgmma-2026-11-30-462151b.log).
    wgmma_long_tile_padding: float = 1.1
    #: One query against a padded corpus of at least this many elements takes 128-row tiles
    #: whatever the padding: crossover 5,000-10,000 documents of 300 tokens
    #: (fixed-cost-2026-11-30-b028c19.txt), hence 512 MB of 16-bit.
    wgmma_long_tile_stream_elements: int = 256 * 2**20
    #: Compile-time defines of maxsim_bwd.cu (rows in flight, blocks per SM): bench/lab/tune_backward.py.
    bwd_defines: tuple[str, ...] = ()
    #: The one-launch backward where its dD blocks' shared memory is at most this (3 blocks/SM),
    #: dQ walks at most bwd_fused_max_docs documents in one chunk, and each row group re-reads
    #: its document's winners at most bwd_fused_max_winner_reads times in all. ColPali in-batch
    #: 51.0 us in one launch vs 47.9 in two plus a launch less of host time; ColBERT in-batch
    #: 113-128 vs 82 us (tune-backward-2026-11-30-40a54a6.log). 0 turns the one launch off.
    bwd_fused_shared_limit: int = 32 * 1024
    bwd_fused_max_docs: int = 256
    bwd_fused_max_winner_reads: int = 16 * 1024
    #: The _wide backward kernels (16-byte rows, dD's rows a pair at a time) where a warp owns
    #: at most this many rows (dense rows: ~8+ sources a row); 0 turns them off.
    bwd_wide_max_rows_per_warp: int = 8
    #: Most documents per dQ chunk (a warp walks a chunk's documents in order).
    dq_docs_per_chunk: int = 4096
    #: The mma.sync forward keeps the query block resident in shared memory up to this many
    #: k-steps of 32 bytes (16: dim 256 in 16-bit, 128 in fp32); past it, it streams k.
    mma_resident_max_ksteps: int = 16
    fp32_resident_max_ksteps: int = 16
    #: Streaming k, k-steps a ring slot holds (4 or 8: configs.STREAM_KSTEPS_CHOICES): 8 took
    #: fp16 dim 2560 from 1.113 to 0.892 ms for one query and 14.2 to 12.2 ms for 32, fp32 dim
    #: 2560 from 35.4 to 30.8 ms for 32 (bench/results/cliffs-2026-12-01-95f1431*.json).
    stream_ksteps: int = 8
    #: search merges each block's candidates into the best so far with maxsim_topk_merge (one
    #: launch, no wait) instead of CuPy's argsort of their concatenation (a sort that waits for
    #: the stream): 1,000 queries against 1M x 128 x 128, k=100, 0.966 -> 0.955 of scoring alone
    #: (bench/results/ab-search-merge-2026-12-03-9bc7498.txt).
    search_merge_kernel: bool = True
    #: Rows of a search block longer than this take the wide selection (every block of the GPU
    #: on the row at once, a 4k-element chunk each, in one cooperative launch: maxsim_topk.cu)
    #: where k <= 8192; shorter rows take the selection in rounds (a block a segment). -1: never.
    #: 1 x 1M fp16 against scoring alone, rounds -> wide: k=1000 1.027 -> 1.012x, k=2048 1.033 ->
    #: 1.013x; 32 x 10k x 1030, k=100, every row wide: no faster (ab-search-wide-2026-12-04-70042d4).
    search_wide_select_min: int = 16384


    def __post_init__(self):
        # The one field a planner reads by value (its other values would plan as "highest"
        # without a word).
        if self.float32_precision not in FLOAT32_PRECISIONS:
            raise ValueError(f"float32_precision must be one of {FLOAT32_PRECISIONS}, got {self.float32_precision!r}")
        # ... and one that would reach the kernel's source as a tile shape it does not build.
        if self.wgmma_tile_rows not in (None, 64, 128):
            raise ValueError(f"wgmma_tile_rows must be None, 64 or 128, got {self.wgmma_tile_rows!r}")
        # ... and one the driver's tensor maps take by name only.
        if self.tma_l2_promotion not in (None, 0, 64, 128, 256):
            raise ValueError(f"tma_l2_promotion must be None, 0, 64, 128 or 256 bytes, got {self.tma_l2_promotion!r}")
        # ... and one that reaches the kernel's source as a count of atoms.
        if type(self.wgmma_tf32_stretch) is not int or self.wgmma_tf32_stretch < 0:
            raise ValueError(f"wgmma_tf32_stretch must be an int >= 0 (atoms; 0: off), got {self.wgmma_tf32_stretch!r}")
        # Every cache of plans is keyed by the tunables: their hash is computed once, not per
        # call (a frozen dataclass's own __hash__ hashes all fields each time).
        object.__setattr__(self, "_hash", hash(dataclasses.astuple(self)))

    def __hash__(self) -> int:
        return self._hash


def _from_environment() -> Tunables:
    flag = lambda name: os.environ.get(name, "1") != "0"  # noqa: E731
    return Tunables(use_wgmma=flag("CUPY_MAXSIM_WGMMA"), wgmma_docs_on_m=flag("CUPY_MAXSIM_DOCS_ON_M"),
                    use_tma=flag("CUPY_MAXSIM_TMA"))


DEFAULT = _from_environment()
_current: contextvars.ContextVar[Tunables] = contextvars.ContextVar("cupy_maxsim_tunables", default=DEFAULT)


def current() -> Tunables:
    """The tunables calls made now plan under (DEFAULT unless an :func:`override` is active)."""
    return _current.get()


@contextlib.contextmanager
def float32_matmul_precision(precision: str):
    """Score float32 inputs inside the ``with`` block at ``precision``: "highest" (the default:
    fp32 accuracy, relative error at most 1e-5 against float64) or "high" (elements may be read
    as TF32, a similarity at most 2^-9 sum |q||d| off, about 1e-3 relative, where that is faster:
    on Hopper, one query (the documents as TF32) or several with rows on 16 bytes (both operands);
    elsewhere the scores stay at "highest"). Other dtypes are not affected.

    >>> with cupy_maxsim.tuning.float32_matmul_precision("high"):
    ...     scores = cupy_maxsim.score(q, d)  # doctest: +SKIP
    """
    if precision not in FLOAT32_PRECISIONS:
        raise ValueError(f"precision must be one of {FLOAT32_PRECISIONS}, got {precision!r}")
    with override(float32_precision=precision) as tunables:
        yield tunables


@contextlib.contextmanager
def override(**changes):
    """Plan the calls made inside the ``with`` block under the current tunables with
    ``changes`` (field names of :class:`Tunables`); yields the tunables in force."""
    tunables = dataclasses.replace(_current.get(), **changes)
    token = _current.set(tunables)
    try:
        yield tunables
    finally:
        _current.reset(token)


def changes_from_text(items) -> dict:
    """``override``'s keyword arguments from ``KEY=VALUE`` strings (the benchmarks' command
    lines: ``--tunables use_wgmma=0,stream_ksteps=8``); integer values become ints."""
    changes = {}
    for item in items:
        key, _, value = item.partition("=")
        changes[key] = int(value) if value.lstrip("-").isdigit() else value
    return changes
