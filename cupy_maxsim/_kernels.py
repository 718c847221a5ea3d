"""Find, compile, cache and launch the CUDA kernels of ``kernels_cu/``.

No validation happens here: ``_api.py`` checks every argument before a launch reaches this
module. Kernels compile through ``cupy.RawModule`` on first use, one module per (device, source
family, tile configuration), and CuPy's disk cache keeps them across processes; the sm_90a
family (wgmma), which CuPy's own -arch choice cannot build, is compiled here to a cubin kept
under :func:`cache_dir`. Because that
cache hashes the source string only, ``common.cuh`` is concatenated into each source rather
than ``#include``-d, so an edited header can never serve a stale binary.

``compile_with_nvrtc`` compiles the same sources through NVRTC directly (``ctypes``), with no
GPU and no driver, for any architecture: the CI compile check and ``python -m cupy_maxsim
compile`` use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import glob
import hashlib
import os
import re
import struct
import sys
import tempfile
import threading
from pathlib import Path


#: Kernel names each source family defines; tests check that every one exists in the source.
FAMILIES = {
    "maxsim_fwd": ("maxsim_fwd.cu", ("maxsim_fwd_fp16", "maxsim_fwd_bf16", "maxsim_fwd_int8")),
    "maxsim_fwd_wgmma": (
        "maxsim_fwd_wgmma.cu", ("maxsim_fwd_wgmma_fp16", "maxsim_fwd_wgmma_bf16", "maxsim_fwd_wgmma_int8"),
    ),
    "maxsim_fwd_simt": (
        "maxsim_fwd_simt.cu",
        ("maxsim_fwd_simt_fp16", "maxsim_fwd_simt_bf16", "maxsim_fwd_simt_fp32", "maxsim_fwd_simt_fp64",
         "maxsim_fwd_simt_int8"),
    ),
    "maxsim_bwd": (
        "maxsim_bwd.cu",
        tuple(f"maxsim_bwd_{stage}_{suffix}" for suffix in ("fp16", "bf16", "fp32", "fp64", "fp16_wide", "bf16_wide")
              for stage in ("csr_dq", "dd", "fused")),
    ),
    "maxsim_offsets": ("maxsim_offsets.cu", ("maxsim_offsets_summary",)),
}

#: Field order of ``ForwardArgs`` and ``BackwardArgs`` in common.cuh (Q = pointer, q = int64,
#: i = int32); the packaging test checks both against the header. Each starts with the pointers
#: a repeated call changes (FORWARD_HEAD, BACKWARD_HEAD): they are patched into bytes packed once.
FORWARD_ARGS = (
    ("q", "Q"), ("d", "Q"), ("out", "Q"), ("argmax", "Q"),
    ("q_query_stride", "q"), ("q_row_stride", "q"), ("q_dim_stride", "q"),
    ("q_mask", "Q"), ("q_mask_query_stride", "q"), ("q_mask_row_stride", "q"),
    ("d_doc_stride", "q"), ("d_row_stride", "q"), ("d_dim_stride", "q"), ("doc_length", "q"),
    ("offsets", "Q"), ("d_mask", "Q"), ("d_mask_doc_stride", "q"), ("d_mask_row_stride", "q"),
    ("num_docs", "q"), ("docs_per_block", "q"), ("out_query_stride", "q"),
    ("q_scale", "Q"), ("q_scale_query_stride", "q"), ("q_scale_row_stride", "q"),
    ("d_scale", "Q"), ("d_scale_doc_stride", "q"), ("d_scale_row_stride", "q"),
    ("argmax_query_stride", "q"), ("argmax_doc_stride", "q"), ("doc_rotation", "q"),
    ("num_queries", "i"), ("query_length", "i"), ("dim", "i"), ("offsets_are_64bit", "i"),
    ("queries_per_group", "i"), ("pairs", "i"), ("rows_per_chunk", "i"), ("argmax_is_32bit", "i"),
)
FORWARD_HEAD = ("q", "d", "out", "argmax")
BACKWARD_ARGS = (
    ("q", "Q"), ("d", "Q"), ("argmax", "Q"), ("grad_q", "Q"), ("grad_d", "Q"),
    ("sources", "Q"), ("row_ranges", "Q"), ("csr_counts", "Q"), ("partial", "Q"),
    ("grad", "Q"), ("grad_query_stride", "q"), ("grad_doc_stride", "q"),
    ("q_query_stride", "q"), ("q_row_stride", "q"),
    ("d_doc_stride", "q"), ("d_row_stride", "q"), ("doc_length", "q"),
    ("offsets", "Q"), ("argmax_query_stride", "q"), ("argmax_doc_stride", "q"), ("csr_counts_stride", "q"),
    ("num_docs", "q"), ("sources_per_doc", "q"), ("docs_per_chunk", "q"),
    ("num_queries", "i"), ("query_length", "i"), ("dim", "i"), ("offsets_are_64bit", "i"),
    ("pairs", "i"), ("argmax_is_32bit", "i"), ("count_warps", "i"), ("vector_loads", "i"),
    ("rows_per_warp", "i"), ("reserved", "i"),
)
#: What a backward's arguments patch per call: its arrays' pointers, then grad_scores' pointer
#: and strides (patched apart in a staged backward).
BACKWARD_HEAD = ("q", "d", "argmax", "grad_q", "grad_d", "sources", "row_ranges", "csr_counts", "partial")
BACKWARD_GRAD = ("grad", "grad_query_stride", "grad_doc_stride")


class ArgStruct:
    """Packs one of the argument structs into the bytes the kernel receives by value: one
    struct.pack per launch instead of dozens of NumPy scalars."""

    def __init__(self, fields):
        self.fields = fields
        self.layout = struct.Struct("<" + "".join(code for _, code in fields))

    @property
    def size(self) -> int:
        return self.layout.size

    def __call__(self, **values) -> bytes:
        return self.pack([values[name] for name, _ in self.fields])

    def pack(self, values: list) -> bytes:
        """The struct of ``values`` given in field order."""
        return self.layout.pack(*values)

    def part(self, names: tuple) -> tuple[int, struct.Struct]:
        """(offset in the packed struct, packer) of the consecutive fields ``names``: what a
        call patches in place (little-endian, no padding)."""
        order = [name for name, _ in self.fields]
        first = order.index(names[0])
        assert tuple(order[first:first + len(names)]) == tuple(names), f"{names} are not consecutive fields"
        codes = [code for _, code in self.fields]
        return (struct.calcsize("<" + "".join(codes[:first])),
                struct.Struct("<" + "".join(codes[first:first + len(names)])))


class ArgTemplate:
    """An argument struct packed once (``values`` in field order), from which each call's
    arguments are built with only the leading fields ``head`` (the pointers a repeated call
    changes) patched in. A call's arguments are one ctypes buffer that starts with
    cuLaunchKernel's parameter array: two pointer slots, to the struct at byte 16 and to a
    second argument of ``extra_bytes`` after it (the Hopper kernel's tensor map), so a
    training step builds one ctypes object per launch's arguments, not three."""

    HEADER = 16

    def __init__(self, struct_: ArgStruct, values: list, head: tuple, extra_bytes: int = 0):
        head_at, self.head = struct_.part(head)
        assert head_at == 0, "the patched fields lead the struct"
        self.head_fields = len(head)
        body = struct_.pack(values)
        self.extra_at = ArgTemplate.HEADER + -(-len(body) // 16) * 16 if extra_bytes else 0
        size = self.extra_at + extra_bytes if extra_bytes else ArgTemplate.HEADER + len(body)
        self._bytes = (bytes(ArgTemplate.HEADER) + body).ljust(size, b"\0")
        self._type = ctypes.c_char * size
        self._params_and_head = struct.Struct("<QQ" + self.head.format.lstrip("<"))

    def __call__(self, *head_values):
        """A buffer of the arguments with ``head_values`` patched in (a launch copies it: the
        caller may patch it again afterwards, and keeps it as long as it may launch it)."""
        buffer = self._type.from_buffer_copy(self._bytes)
        address = ctypes.addressof(buffer)
        self._params_and_head.pack_into(buffer, 0, address + ArgTemplate.HEADER,
                                        address + self.extra_at if self.extra_at else 0, *head_values)
        return buffer

    @staticmethod
    def fields_at(struct_: ArgStruct, names: tuple) -> tuple[int, struct.Struct]:
        """(offset in a call's buffer, packer) of the consecutive fields ``names``: what is
        patched into a call's arguments later (``packer.pack_into(buffer, offset, ...)``)."""
        offset, layout = struct_.part(names)
        return ArgTemplate.HEADER + offset, layout

    @staticmethod
    def struct_bytes(buffer, size: int) -> bytes:
        """The struct's ``size`` bytes in ``buffer`` (what the kernel receives)."""
        return bytes(buffer)[ArgTemplate.HEADER:ArgTemplate.HEADER + size]


forward_args = ArgStruct(FORWARD_ARGS)
backward_args = ArgStruct(BACKWARD_ARGS)


SIMT_THREADS = 128
#: The SIMT kernel stages this many bytes of document rows in shared memory per chunk.
SIMT_CHUNK_BYTES = 32 * 1024
_NVRTC_OPTIONS = ("-std=c++17",)


def kernel_dir() -> Path:
    """The ``kernels_cu`` folder: inside the installed wheel, else the repository root."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "kernels_cu", here.parent / "kernels_cu"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(
        f"cannot find kernels_cu/ (looked in {here / 'kernels_cu'} and {here.parent / 'kernels_cu'})"
    )


def source(family: str) -> str:
    """Full source of a kernel family: common.cuh followed by the family's .cu file."""
    folder = kernel_dir()
    filename, _ = FAMILIES[family]
    return (folder / "common.cuh").read_text() + "\n" + (folder / filename).read_text()


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
        # Mirrors the formula at the top of maxsim_fwd.cu.
        row = self.ksteps * 16 + 8
        bm, bn = self.block_rows, self.block_cols
        warps = self.warps_m * self.warps_n
        return 2 * row * (bn + self.stages * bm) + 4 * (
            2 * self.stages * bm + (2 + 2 * self.argmax) * self.warps_m * bn + 3 * bn + 4 * warps)

    def defines(self) -> tuple[str, ...]:
        return (
            f"-DMAXSIM_WARPS_M={self.warps_m}",
            f"-DMAXSIM_WARPS_N={self.warps_n}",
            f"-DMAXSIM_MT={self.mt}",
            f"-DMAXSIM_NT={self.nt}",
            f"-DMAXSIM_STAGES={self.stages}",
            f"-DMAXSIM_KSTEPS={self.ksteps}",
            f"-DMAXSIM_B_IN_REGISTERS={self.b_in_registers}",
            f"-DMAXSIM_ARGMAX={self.argmax}",
        )


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

    @property
    def shared_bytes(self) -> int:
        # Mirrors the formula at the top of maxsim_fwd_wgmma.cu.
        rows, kpad, warps, n = self.block_cols, self.ksteps * 16, 4 * self.warpgroups + 4, self.tile_n
        query_rows = 64 if self.split_docs else rows
        max_slots = 2 * 4 * self.warpgroups * 128 if self.docs_on_m else 2 * rows
        atoms = -(-self.ksteps // 4)
        query_bytes = self.warpgroups * atoms * 128 * 128 if self.docs_on_m else query_rows * (kpad + 8) * 2
        return (1024 + self.stages * atoms * n * 128 + query_bytes
                + 4 * (self.stages * n + 3 * query_rows + (1 + self.argmax) * max_slots + 4 * warps)
                + 16 * self.stages + 16 * self.stages + 8)

    def defines(self) -> tuple[str, ...]:
        return (
            f"-DMAXSIM_WARPGROUPS={self.warpgroups}",
            f"-DMAXSIM_STAGES={self.stages}",
            f"-DMAXSIM_KSTEPS={self.ksteps}",
            f"-DMAXSIM_ARGMAX={self.argmax}",
            f"-DMAXSIM_TILE_N={self.tile_n}",
            f"-DMAXSIM_SPLIT_DOCS={self.split_docs}",
            f"-DMAXSIM_HALF_ROWS={self.half_rows}",
            f"-DMAXSIM_DOCS_ON_M={self.docs_on_m}",
        )


#: The Hopper kernel's shape where queries fill its warpgroups, chosen by bench/tune_wgmma.py on
#: the H200; at most 8 k-steps (dim 128 in 16-bit, 256 in int8; an even number), since the
#: query fragments live in registers.
WGMMA_SHAPE = dict(warpgroups=3, stages=6)
#: 128-row document tiles halve the Hopper kernel's per-tile cost (colpali-32q 7.48 -> 6.75 ms,
#: colbert-256q 72.3 -> 61.2 ms) but compute up to 127 padding rows per document (inbatch-128's
#: 300-token documents: 0.235 -> 0.250 ms), and int8 measured no gain
#: (tune-wgmma-2026-11-30-462151b.log): taken for 16-bit inputs whose documents they pad by at
#: most this much more than 64-row tiles do.
WGMMA_LONG_TILE_PADDING = 1.1
#: One query against a padded corpus of at least this many elements takes 128-row tiles
#: whatever the padding (the padding rows cost no bytes there): 16-bit, they stream faster
#: (4.45 vs 4.25 TB/s) but cost more per call (22 vs 17 us); measured crossover 5,000-10,000
#: documents of 300 tokens (bench/results/fixed-cost-2026-11-30-b028c19.txt, the e1f6f43 rows),
#: hence 512 MB of 16-bit. int8 counts the same elements (half the bytes): with the unmasked
#: last-tile fold its 128-row tiles won on corpus-10k, 0.120 vs 0.126 ms
#: (ablation-wgmma-2026-11-30-035e935-int8-n128.log).
WGMMA_LONG_TILE_STREAM_ELEMENTS = 256 * 2**20
#: 64 or 128 forces the tile rows for 16-bit inputs (tests, bench/tune_wgmma.py); None: per problem.
WGMMA_TILE_ROWS = None
#: int8 gets 128-row tiles only splitting documents with at most this many k-steps (dim 128):
#: more query fragments in registers spill (maxsim_fwd_wgmma.cu, the int8 entry).
INT8_LONG_TILE_KSTEPS = 4
#: Shared memory a Hopper block may use (H100 and H200: 227 KB); a ring that would not fit
#: gets fewer stages.
WGMMA_SHARED_LIMIT = 227 * 1024
WGMMA_MAX_KSTEPS = 8
#: With fewer query rows than three warpgroups hold, a block has only the warpgroups it can
#: fill. One query group (64 rows or fewer; memory-bound) gets three warpgroups that hold the
#: same queries and split the block's documents, each from a ring of its own as deep as fits:
#: colbert-1q-1M 10.2 -> 8.0 ms against mma.sync (bench/results/tune-wgmma-2026-11-30-b5ade09.log;
#: one warpgroup alone had measured slower than mma.sync: tune-wgmma-2026-11-30-a23dc04.log).
#: False keeps one query group on the mma.sync kernel.
WGMMA_SPLIT_DOCS = True
WGMMA_SPLIT_STAGES = 30  # cut to what fits, in whole rings
#: False folds both accumulator rows of each thread for every query (A/B measurements).
WGMMA_HALF_ROWS = True
#: Many queries on Hopper put the documents on the MMA's M (maxsim_fwd_wgmma.cu, DOCS_ON_M) unless
#: 32-bit winners are saved; CUPY_MAXSIM_DOCS_ON_M=0 keeps queries on M (for A/B measurements).
WGMMA_DOCS_ON_M = os.environ.get("CUPY_MAXSIM_DOCS_ON_M", "1") != "0"
#: Set CUPY_MAXSIM_WGMMA=0 to keep Hopper on the mma.sync kernel (for A/B measurements).
USE_WGMMA = os.environ.get("CUPY_MAXSIM_WGMMA", "1") != "0"


def wgmma_config(ksteps: int, argmax: bool = False, warpgroups_wanted: int = 3, tile_n: int = 64,
                 query_rows: int = 64, docs_on_m: bool = False, int8: bool = False) -> WgmmaConfig | None:
    """The Hopper kernel's shape for ``warpgroups_wanted`` warpgroups' worth of query rows
    (``query_rows`` of them in all) and ``tile_n``-row document tiles, or None (the mma.sync
    kernel); ``docs_on_m``: documents on the MMA's M (64-row tiles, at least two warpgroups of
    128 query rows wanted; int8 in at most int8_docs_on_m_warpgroups)."""
    if ksteps > WGMMA_MAX_KSTEPS or ksteps % 2 or (warpgroups_wanted < 2 and not WGMMA_SPLIT_DOCS):
        return None
    shape = dict(WGMMA_SHAPE)
    if docs_on_m:
        assert tile_n == 64 and warpgroups_wanted >= 2
        most = int8_docs_on_m_warpgroups(argmax, ksteps) if int8 else 3
        shape.update(docs_on_m=1, warpgroups=min(shape["warpgroups"], warpgroups_wanted, most))
    elif warpgroups_wanted < 2:
        # At most 32 query rows (one ColBERT or ColPali query): half of each thread's rows are
        # padding, and their fold is skipped (int8 corpus-10k spent 30% of its time folding:
        # bench/results/ablation-wgmma-2026-11-30-b91374a.log).
        shape.update(split_docs=1, stages=WGMMA_SPLIT_STAGES, half_rows=int(WGMMA_HALF_ROWS and query_rows <= 32))
    else:
        shape["warpgroups"] = min(shape["warpgroups"], warpgroups_wanted)
    config = WgmmaConfig(ksteps=ksteps, argmax=int(argmax), tile_n=tile_n, **shape)
    # Split documents: every warpgroup has a ring of its own, of at least two slots.
    step = config.warpgroups if config.split_docs else 1
    config = dataclasses.replace(config, stages=config.stages // step * step)
    while config.shared_bytes > WGMMA_SHARED_LIMIT and config.stages - step >= max(3, 2 * step):
        config = dataclasses.replace(config, stages=config.stages - step)
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


def wgmma_tile_rows(mean_doc_length: float, int8: bool, split_docs: bool = False, ksteps: int = 4,
                    padded_elements: int = 0) -> int:
    """Document rows per Hopper tile for documents of about ``mean_doc_length`` tokens;
    ``padded_elements``: the size of a padded corpus (0: packed), whose rows past a document's
    end a TMA tile does not read."""
    if int8 and not int8_long_tiles(split_docs, ksteps):
        return 64
    if WGMMA_TILE_ROWS is not None:
        return WGMMA_TILE_ROWS
    if mean_doc_length <= 0:
        return 64
    if split_docs and padded_elements >= WGMMA_LONG_TILE_STREAM_ELEMENTS:
        return 128
    padded = lambda n: -(-mean_doc_length // n) * n  # noqa: E731
    return 128 if padded(128) <= WGMMA_LONG_TILE_PADDING * padded(64) else 64


def simt_shared_bytes(rows_per_chunk: int, dim: int, accumulator_bytes: int) -> int:
    # Mirrors the formula at the top of maxsim_fwd_simt.cu.
    return (rows_per_chunk * dim + SIMT_THREADS + rows_per_chunk) * accumulator_bytes + rows_per_chunk + SIMT_THREADS


#: Threads per block of the backward kernels (launch bounds in maxsim_bwd.cu), and blocks per SM
#: (MAXSIM_BWD_MIN_BLOCKS there); the hot-row partials hold at most 16 warps.
BWD_THREADS = 256
BWD_BLOCKS_PER_SM = 4
BWD_DIM_CHUNK = 128
#: The backward's _wide kernels (16-byte rows) walk dD's rows a pair at a time, each row's sources
#: in a half-warp: where a warp owns at most this many rows (about 8 or more sources a row).
#: Sparser rows (ColPali's ~1 a patch) keep the 8-byte kernels' segment walk over 32 lanes.
BWD_WIDE_MAX_ROWS_PER_WARP = 8
#: Compile-time tunables of maxsim_bwd.cu (rows in flight, blocks per SM), chosen by
#: bench/tune_backward.py on the H200.
BWD_DEFINES: tuple[str, ...] = ()


def bwd_csr_shared_bytes(count_warps: int, longest_doc: int) -> int:
    # Mirrors the formula at the top of maxsim_bwd.cu.
    return 4 * (count_warps * longest_doc + 2 * longest_doc + 2)


def bwd_fused_shared_bytes(warps: int, block_rows: int, sources_per_doc: int) -> int:
    # Mirrors the formula above maxsim_bwd_fused in maxsim_bwd.cu.
    return 4 * (warps * block_rows + 4 * (block_rows + 1) + sources_per_doc)


#: The one-launch backward (maxsim_bwd_fused) where: its dD blocks' shared memory is at most
#: BWD_FUSED_SHARED_LIMIT (the row lists of a document's sources; with dD's own arrays, 3 blocks
#: per SM); dQ in one document chunk walks at most BWD_FUSED_MAX_DOCS documents (256 are 32
#: round trips of 8 rows, while dD's blocks run beside it); and each row group re-reads its
#: document's winners (groups x sources per document) at most BWD_FUSED_MAX_WINNER_READS times.
#: H200 (bench/results/tune-backward-2026-11-30-40a54a6.log): ColPali in-batch (5 groups x 1,024
#: sources) 51.0 us in one launch against 47.9 in two, and one launch less of host time on
#: torch's backward thread (13-16 us); ColBERT in-batch (10 x 4,096) 113-128 us against 82.
BWD_FUSED_SHARED_LIMIT = 32 * 1024
BWD_FUSED_MAX_DOCS = 256
BWD_FUSED_MAX_WINNER_READS = 16 * 1024


def bwd_csr_layout(longest_doc: int, smem_limit: int, smem_per_sm: int) -> tuple[int, int]:
    """(count warps, global counts stride in words (0: counts in shared memory)) of the CSR
    build for documents of up to ``longest_doc`` tokens. Its launch gives dQ's blocks the same
    shared memory, so it stays within a quarter of an SM (their occupancy) where it can."""
    for budget in (min(smem_limit, smem_per_sm // BWD_BLOCKS_PER_SM - 1024), smem_limit):
        warps = min(BWD_THREADS // 32, (budget - bwd_csr_shared_bytes(0, longest_doc)) // (4 * longest_doc))
        if warps >= 1:
            return warps, 0
    return 1, bwd_csr_shared_bytes(1, longest_doc) // 4


# ---- CuPy side ------------------------------------------------------------------------------

_modules: dict = {}
_streams: dict = {}


def get_kernel(device: int, family: str, name: str, defines: tuple[str, ...] = (), shared_bytes: int = 0):
    """The compiled ``RawKernel`` ``name`` of ``family`` for ``device`` (the current device),
    allowed ``shared_bytes`` of dynamic shared memory. Driver attributes are set once per
    (kernel, size), never on the per-call path."""
    key = (device, family, defines, name, shared_bytes)
    kernel = _kernel_cache.get(key)
    if kernel is None:
        module = _modules.get(key[:3])
        if module is None:
            module = _modules[key[:3]] = _load_module(family, defines)
        kernel = module.get_function(name)
        if shared_bytes > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < shared_bytes:
            kernel.max_dynamic_shared_size_bytes = shared_bytes
            # Ask for the largest shared-memory carve-out, so that several blocks fit on an SM
            # (the default may leave room for one).
            kernel.preferred_shared_memory_carveout = 100
        _kernel_cache[key] = kernel
    return kernel


_kernel_cache: dict = {}

#: Families written with architecture-specific instructions (wgmma exists on sm_90a only).
ARCH_SPECIFIC = {"maxsim_fwd_wgmma": "sm_90a"}


def cache_dir() -> Path:
    """Where compiled architecture-specific kernels are kept across processes."""
    return Path(os.environ.get("CUPY_MAXSIM_CACHE_DIR") or Path.home() / ".cache" / "cupy_maxsim")


def _load_module(family: str, defines: tuple[str, ...]):
    import cupy

    arch = ARCH_SPECIFIC.get(family)
    if arch is None:
        return cupy.RawModule(code=source(family), options=_NVRTC_OPTIONS + defines)
    # CuPy adds -arch=sm_90 itself, which has no wgmma: compile the cubin here (CuPy's own
    # NVRTC), keep it on disk under a hash of everything that went into it, and load that.
    from cupy_backends.cuda.libs import nvrtc

    code = source(family)
    options = _NVRTC_OPTIONS + defines + (f"-arch={arch}",)
    key = hashlib.sha256(repr((code, options, nvrtc.getVersion())).encode()).hexdigest()[:32]
    path = cache_dir() / f"{family}-{key}.cubin"
    if not path.is_file():
        program = nvrtc.createProgram(code, f"{family}.cu", (), ())
        try:
            try:
                nvrtc.compileProgram(program, list(options))
            except nvrtc.NVRTCError as error:
                raise RuntimeError(f"NVRTC failed to compile {family} {options}:\n"
                                   f"{nvrtc.getProgramLog(program)}") from error
            cubin = nvrtc.getCUBIN(program)
        finally:
            nvrtc.destroyProgram(program)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(cubin)
            os.replace(partial, path)  # atomic: a concurrent process sees all of it or none
        except OSError:  # no writable cache: this process compiles for itself
            path = Path(tempfile.mkdtemp(prefix="cupy_maxsim-")) / path.name
            path.write_bytes(cubin)
    return cupy.RawModule(path=str(path))


def resident_blocks(kernel, threads: int, shared_bytes: int, device: int) -> int:
    """Blocks of ``kernel`` one SM holds at once, limited by registers, shared memory and
    threads (a persistent grid is sized from this)."""
    smem_per_sm = device_properties(device)[2]
    # Registers are allocated per warp in units of 256.
    per_warp = -(-kernel.num_regs * 32 // 256) * 256
    by_registers = 65536 // (per_warp * (threads // 32))
    return max(1, min(by_registers, smem_per_sm // (shared_bytes + 1024), 2048 // threads))


_thread_devices = threading.local()


def on_device(device: int):
    """Context in which ``device`` is this thread's current device, its primary context current:
    the launches go straight through the driver, which needs one. A switch only when another
    device is current (entering cupy.cuda.Device costs microseconds, and small calls are
    host-bound). A thread that never touched CUDA (torch runs backward on threads of its own)
    has no current context, though cudaGetDevice answers 0: its first call here sets the device
    (cudaSetDevice makes the primary context current)."""
    import cupy

    if cupy.cuda.runtime.getDevice() != device:
        return cupy.cuda.Device(device)
    ready = getattr(_thread_devices, "ready", None)
    if ready is None:
        ready = _thread_devices.ready = set()
    if device not in ready:
        cupy.cuda.runtime.setDevice(device)
        ready.add(device)
    return contextlib.nullcontext()


def on_stream(stream_ptr: int | None):
    """Context in which CuPy work (kernels, array operations) runs on the caller's stream
    ``stream_ptr``; CuPy's current stream when None."""
    if stream_ptr is None:
        return contextlib.nullcontext()
    stream = _streams.get(stream_ptr)
    if stream is None:
        import cupy

        stream = _streams[stream_ptr] = cupy.cuda.Stream.from_external(_StreamHandle(stream_ptr))
    return stream


def launch(kernel, grid, block, args: bytes | tuple[bytes, ...], shared_bytes: int, stream_ptr: int | None) -> None:
    """Launch with by-value struct arguments (``args``: one from :class:`ArgStruct`, or a tuple
    of such bytes) on the caller's stream (``stream_ptr``), or CuPy's current stream when None.
    Straight through the driver (cuLaunchKernel): CuPy's generic argument handling cost several
    microseconds per launch, and small calls are host-bound."""
    from cupy_backends.cuda.api import driver

    entry = _function_pointers.get(id(kernel))
    if entry is None:
        entry = _function_pointers[id(kernel)] = (kernel, kernel.kernel.ptr)
    values = [ctypes.create_string_buffer(a, len(a)) for a in ((args,) if isinstance(args, bytes) else args)]
    params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    driver.launchKernel(entry[1], *_launch_geometry(grid, block, shared_bytes), _stream_or_current(stream_ptr),
                        ctypes.addressof(params), 0)


def _launch_geometry(grid, block, shared_bytes: int) -> tuple:
    """cuLaunchKernel's grid x, y, z, block x, y, z and shared bytes from 1-3 dimensional tuples."""
    return tuple(grid) + (1,) * (3 - len(grid)) + tuple(block) + (1,) * (3 - len(block)) + (shared_bytes,)


def _stream_or_current(stream_ptr: int | None) -> int:
    """``stream_ptr``, or CuPy's current stream where it is None."""
    if stream_ptr is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return stream_ptr


class PreparedLaunch:
    """A launch whose kernel and geometry are settled, so that only the arguments change from
    call to call (a replayed call, a training step). ``arguments``: an :class:`ArgTemplate` of
    the launch's own, whose pointers each call (``__call__``) patches into a buffer held here
    (cuLaunchKernel copies it at the launch, so a launch allocates nothing; a lock keeps two
    threads from filling it at once); without one, the caller's buffers
    (:meth:`launch_packed`)."""

    def __init__(self, kernel, grid, block, shared_bytes: int, arguments: ArgTemplate | None = None):
        self.kernel = kernel  # holds the module, so that the function pointer stays valid
        self._function = kernel.kernel.ptr
        self._geometry = _launch_geometry(grid, block, shared_bytes)
        if arguments is not None:
            self._args = arguments(*(0,) * arguments.head_fields)
            self._head_into = arguments.head.pack_into
            self._extra_address = ctypes.addressof(self._args) + arguments.extra_at
            self._extra = None  # the second argument's bytes in the buffer now
            self._lock = threading.Lock()
        from cupy_backends.cuda.api import driver

        self._launch_kernel = driver.launchKernel

    def __call__(self, head_values: tuple, stream_ptr: int | None, extra: bytes | None = None) -> None:
        """Launch with the template's arguments, ``head_values`` patched in (and ``extra``'s
        bytes as the second argument) on ``stream_ptr`` (None: CuPy's current stream)."""
        stream_ptr = _stream_or_current(stream_ptr)
        args = self._args
        with self._lock:
            self._head_into(args, ArgTemplate.HEADER, *head_values)
            if extra is not None and extra is not self._extra:  # tensor maps are cached: mostly the same one
                ctypes.memmove(self._extra_address, extra, len(extra))
                self._extra = extra
            self._launch_kernel(self._function, *self._geometry, stream_ptr, ctypes.addressof(args), 0)

    def launch_packed(self, args, stream_ptr: int | None) -> None:
        """Launch with the caller's arguments (a buffer from an :class:`ArgTemplate`), no lock."""
        self._launch_kernel(self._function, *self._geometry, _stream_or_current(stream_ptr), ctypes.addressof(args), 0)


#: id(RawKernel) -> (the kernel, its CUfunction). The entry holds the kernel, so that its id is
#: never recycled: a tool that empties _kernel_cache (bench/ablate_wgmma.py) would otherwise find
#: a freed kernel's function under a new kernel's id, and launch it.
_function_pointers: dict = {}

#: Bytes of the Hopper kernel's second argument (DocTileMap in maxsim_fwd_wgmma.cu): the
#: documents' CUtensorMap (128), the int8 document scales' (128), use_tma, packed,
#: use_scale_tma, padding to the struct's 64-byte alignment.
DOC_TILE_MAP_BYTES = 320
NO_DOC_TILE_MAP = bytes(DOC_TILE_MAP_BYTES)
_doc_tile_maps: dict = {}
#: Set CUPY_MAXSIM_TMA=0 to have the Hopper kernel copy tiles with cp.async (for A/B measurements).
USE_TMA = os.environ.get("CUPY_MAXSIM_TMA", "1") != "0"


@functools.lru_cache(maxsize=None)
def _cuda_driver() -> ctypes.CDLL | None:
    """The CUDA driver library (for cuTensorMapEncodeTiled, which CuPy does not wrap), or None."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def doc_tile_map(pointer: int, itemsize: int, dim: int, rows: int, docs: int, row_stride: int,
                 doc_stride: int, packed: bool, tile_rows: int = 64, scales: tuple | None = None) -> bytes:
    """The Hopper kernel's TMA descriptor of a document tensor (``rows`` tokens of ``dim``
    elements per document, strides in bytes; packed corpora: all tokens as one document): boxes
    of 128 bytes of k x ``tile_rows`` rows, the 128-byte swizzle, zeros past the tensor. Cached by all it
    encodes. :data:`NO_DOC_TILE_MAP` (cp.async copies) where TMA's rules are not met: 16-byte
    strides and address, 32-bit coordinates, a CUDA driver at hand. ``scales`` (int8): the
    document scales' (pointer, row stride, document stride), bytes, laid out as the documents'
    rows; their own map where TMA can read them (rows of contiguous float32), else the kernel's
    lanes copy them."""
    if not USE_TMA:
        return NO_DOC_TILE_MAP
    key = (pointer, itemsize, dim, rows, docs, row_stride, doc_stride, packed, tile_rows, scales)
    found = _doc_tile_maps.get(key)
    if found is not None:
        return found
    result = NO_DOC_TILE_MAP
    if (pointer % 16 == 0 and row_stride % 16 == 0 and doc_stride % 16 == 0 and row_stride > 0
            and (doc_stride > 0 or docs == 1) and rows + tile_rows < 2**31 and docs < 2**31
            and max(row_stride * rows, doc_stride * docs) < 2**40 and itemsize in (1, 2)):
        driver = _cuda_driver()
        if driver is not None:
            encoded = (ctypes.c_uint64 * 16)()
            u64s, u32s = ctypes.c_uint64 * 3, ctypes.c_uint32 * 3
            status = driver.cuTensorMapEncodeTiled(
                encoded, ctypes.c_int(0 if itemsize == 1 else 1),  # CU_TENSOR_MAP_DATA_TYPE_UINT8 / UINT16
                ctypes.c_uint32(3), ctypes.c_void_p(pointer), u64s(dim, rows, docs),
                (ctypes.c_uint64 * 2)(row_stride, max(doc_stride, row_stride * rows)), u32s(128 // itemsize, tile_rows, 1),
                u32s(1, 1, 1),
                ctypes.c_int(0),  # no interleave
                ctypes.c_int(3),  # CU_TENSOR_MAP_SWIZZLE_128B
                ctypes.c_int(3),  # CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                ctypes.c_int(0))  # out-of-range elements read as zeros
            if status == 0:
                scale_map = _scale_tile_map(driver, scales, rows, docs, tile_rows)
                result = (bytes(encoded) + (scale_map or bytes(128))
                          + struct.pack("<iii", 1, int(packed), int(scale_map is not None)))
                result += bytes(DOC_TILE_MAP_BYTES - len(result))
    if len(_doc_tile_maps) >= 256:
        _doc_tile_maps.clear()
    _doc_tile_maps[key] = result
    return result


def _scale_tile_map(driver, scales: tuple | None, rows: int, docs: int, tile_rows: int) -> bytes | None:
    """The TMA descriptor of int8 document scales laid out as the documents' rows (2-d: rows,
    documents; float32, boxes of ``tile_rows`` x 1, zeros past the tensor), or None where TMA
    cannot read them: rows not contiguous, a document stride or address off 16 bytes."""
    if scales is None:
        return None
    pointer, row_stride, doc_stride = scales
    doc_stride = doc_stride if docs > 1 else -(-rows * 4 // 16) * 16  # one document: any stride
    if pointer % 16 or row_stride != 4 or doc_stride % 16 or doc_stride <= 0 or doc_stride * docs >= 2**40:
        return None
    encoded = (ctypes.c_uint64 * 16)()
    status = driver.cuTensorMapEncodeTiled(
        encoded, ctypes.c_int(7),  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        ctypes.c_uint32(2), ctypes.c_void_p(pointer), (ctypes.c_uint64 * 2)(rows, docs),
        (ctypes.c_uint64 * 1)(doc_stride), (ctypes.c_uint32 * 2)(tile_rows, 1), (ctypes.c_uint32 * 2)(1, 1),
        ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0))  # no interleave, swizzle, promotion
    return bytes(encoded) if status == 0 else None


def offsets_summary(pointer: int, count: int, stride: int, is_64bit: bool, device: int,
                    stream_ptr: int | None) -> tuple[int, int, int, int]:
    """(first, last, number of decreasing steps, longest step) of ``count`` device-resident
    packed-document offsets (``stride`` in elements), on the caller's stream: one launch and one
    read back (maxsim_offsets.cu). The longest step means something only where no step
    decreases (callers reject the offsets otherwise)."""
    import cupy

    with on_device(device), on_stream(stream_ptr):
        summary = cupy.zeros(4, cupy.int64)
        blocks = max(1, min(2 * device_properties(device)[0], -(-(count - 1) // 256)))
        launch(get_kernel(device, "maxsim_offsets", "maxsim_offsets_summary"), (blocks,), (256,),
               (struct.pack("<Q", pointer), struct.pack("<q", count), struct.pack("<q", stride),
                struct.pack("<i", int(is_64bit)), struct.pack("<Q", summary.data.ptr)), 0, stream_ptr)
        return tuple(int(v) for v in summary.get())


def device_properties(device: int) -> tuple[int, int, int, int, int]:
    """(multiprocessor count, opt-in shared memory per block, shared memory per SM, compute
    capability as 10 * major + minor, L2 cache bytes) of a CUDA device, cached."""
    props = _device_props.get(device)
    if props is None:
        import cupy

        handle = cupy.cuda.Device(device)
        attributes = handle.attributes
        props = (attributes["MultiProcessorCount"], attributes["MaxSharedMemoryPerBlockOptin"],
                 attributes["MaxSharedMemoryPerMultiprocessor"], int(handle.compute_capability),
                 attributes["L2CacheSize"])
        _device_props[device] = props
    return props


_device_props: dict = {}


class _StreamHandle:
    """A raw CUDA stream pointer speaking the CUDA stream protocol (for Stream.from_external)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


# ---- NVRTC without a GPU --------------------------------------------------------------------


def _find_nvrtc() -> ctypes.CDLL:
    candidates = []
    for entry in sys.path:
        candidates += glob.glob(os.path.join(entry, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
        candidates += glob.glob(os.path.join(entry, "nvidia", "cu13", "lib", "libnvrtc.so*"))
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates += glob.glob(os.path.join(root, "lib64", "libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    candidates = [c for c in candidates if "builtins" not in c and ".alt." not in c]
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise RuntimeError(
        "NVRTC not found: pip install nvidia-cuda-nvrtc-cu12 (or set CUDA_PATH to a CUDA toolkit)"
    )


@dataclasses.dataclass
class CompileReport:
    kernel: str
    arch: str
    defines: tuple[str, ...]
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_shared_bytes: int = 0
    stack_frame_bytes: int = 0  # local memory: an array indexed at run time, or a call's frame
    serialized_wgmma: bool = False  # ptxas serialized the asynchronous MMAs (its C7518 advice)


def compile_with_nvrtc(family: str, arch: str, defines: tuple[str, ...] = ()) -> list[CompileReport]:
    """Compile a family to a cubin for ``arch`` (e.g. ``"sm_90"``) and return the ptxas report
    of each kernel. Raises ``RuntimeError`` with the compiler log on failure."""
    nvrtc = _find_nvrtc()
    program = ctypes.c_void_p()
    code = source(family).encode()
    _check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), code, f"{family}.cu".encode(), 0, None, None))
    try:
        options = list(_NVRTC_OPTIONS) + list(defines) + [f"-arch={arch}", "--ptxas-options=-v"]
        array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = nvrtc.nvrtcCompileProgram(program, len(options), array)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.value.decode(errors="replace")
        if status != 0:
            raise RuntimeError(f"NVRTC failed to compile {family} for {arch} {defines}:\n{text}")
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return _parse_ptxas(text, arch, defines)


def _parse_ptxas(log: str, arch: str, defines: tuple[str, ...]) -> list[CompileReport]:
    reports: dict[str, CompileReport] = {}
    current = None
    for line in log.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)'|Function properties for (\w+)", line)
        if entry:
            name = entry.group(1) or entry.group(2)
            current = reports.setdefault(name, CompileReport(name, arch, defines))
            continue
        serialized = re.search(r"C7518.*in the function '(\w+)'", line)  # ahead of its function's report
        if serialized:
            reports.setdefault(serialized.group(1), CompileReport(serialized.group(1), arch, defines)).serialized_wgmma = True
            continue
        if current is None:
            continue
        stack = re.search(r"(\d+) bytes stack frame", line)
        if stack:
            current.stack_frame_bytes = int(stack.group(1))
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill:
            current.spill_store_bytes = int(spill.group(1))
            current.spill_load_bytes = int(spill.group(2))
        used = re.search(r"Used (\d+) registers", line)
        if used:
            current.registers = int(used.group(1))
            shared = re.search(r"(\d+) bytes smem", line)
            current.static_shared_bytes = int(shared.group(1)) if shared else 0
    return [r for r in reports.values() if r.kernel.startswith("maxsim")]


def _check(nvrtc, status: int) -> None:
    if status != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC error {status}: {nvrtc.nvrtcGetErrorString(status).decode()}")


#: Tile configurations the dispatcher uses (see _api._choose_mma_config), by stacked width BN;
#: max_ksteps is the deepest dim (in 16-wide k-steps) each takes without register spills.
#: Chosen by bench/tune_forward.py on the H200 (bench/results/tune-forward-*.log).
MMA_CONFIGS = {
    32: dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=3, max_ksteps=16),
    64: dict(warps_m=4, warps_n=2, mt=1, nt=4, stages=4, max_ksteps=16),
    128: dict(warps_m=2, warps_n=4, mt=2, nt=4, stages=3, max_ksteps=16),
    256: dict(warps_m=2, warps_n=4, mt=2, nt=8, stages=2, max_ksteps=8),
}


def mma_config(width: int, ksteps: int, argmax: bool = False) -> MmaConfig | None:
    """The tile configuration of stacked width ``width`` at ``ksteps`` (saving the argmax or
    not), or None past its limit."""
    shape = dict(MMA_CONFIGS[width])
    if ksteps > shape.pop("max_ksteps"):
        return None
    return MmaConfig(ksteps=ksteps, argmax=int(argmax), **shape)


def family_kernels(family: str, defines=()) -> tuple[str, ...]:
    """The kernels a family's source defines under ``defines`` (the Hopper kernel's int8 entry:
    see int8_long_tiles)."""
    names = FAMILIES[family][1]
    if family == "maxsim_fwd_wgmma":
        value = dict(d[len("-D"):].split("=", 1) for d in defines)
        if (value.get("MAXSIM_TILE_N") == "128" and not int8_long_tiles(
                value.get("MAXSIM_SPLIT_DOCS") == "1", int(value["MAXSIM_KSTEPS"]))) or (
                value.get("MAXSIM_DOCS_ON_M") == "1" and int(value["MAXSIM_WARPGROUPS"]) > int8_docs_on_m_warpgroups(
                    value.get("MAXSIM_ARGMAX") == "1", int(value["MAXSIM_KSTEPS"]))):
            names = tuple(name for name in names if not name.endswith("_int8"))
    return names


def compile_variants() -> list[tuple[str, tuple[str, ...]]]:
    """Every (family, defines) variant the dispatcher can ask for at dim 64, 96, 128 and 256,
    with and without the argmax."""
    variants = [("maxsim_fwd_simt", ()), ("maxsim_bwd", BWD_DEFINES), ("maxsim_offsets", ())]
    for width in MMA_CONFIGS:
        for ksteps in (4, 6, 8, 16):
            config = mma_config(width, ksteps)
            if config is not None:
                variants.append(("maxsim_fwd", config.defines()))
                variants.append(("maxsim_fwd", mma_config(width, ksteps, argmax=True).defines()))
    for ksteps in (4, 6, 8):
        for argmax in (False, True):
            for warpgroups in (1, 2, 3):  # 1: one query group, documents split
                for tile_n in (64, 128):
                    for query_rows in (32, 64) if warpgroups == 1 else (64,):  # 32: half rows
                        config = wgmma_config(ksteps, argmax, warpgroups, tile_n, query_rows)
                        variants.append(("maxsim_fwd_wgmma", config.defines()))
        for warpgroups in (2, 3):  # documents on M (int8: see int8_docs_on_m_warpgroups)
            for argmax in (False, True):
                for int8 in (False, True):
                    config = wgmma_config(ksteps, argmax, warpgroups, docs_on_m=True, int8=int8)
                    if ("maxsim_fwd_wgmma", config.defines()) not in variants:
                        variants.append(("maxsim_fwd_wgmma", config.defines()))
    return variants


def compile_targets(family: str, archs) -> tuple[str, ...]:
    """The architectures among ``archs`` that ``family`` is built for (sm_90a stands for sm_90)."""
    arch = ARCH_SPECIFIC.get(family)
    if arch is None:
        return tuple(archs)
    return (arch,) if arch.rstrip("a") in archs else ()


def compile_all(archs=("sm_80", "sm_86", "sm_89", "sm_90")) -> list[CompileReport]:
    """Compile every kernel variant for every architecture through NVRTC (no GPU needed)."""
    reports = []
    for family, defines in compile_variants():
        for arch in compile_targets(family, archs):
            reports += compile_with_nvrtc(family, arch, defines)
    return reports
