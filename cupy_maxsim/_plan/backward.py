"""The backward planner: one launch or two, the kernels' grids, the scratch and the arguments.

A pure function of the validated problem (its operands as the kernels will read them), the
device's properties and the tunables. One launch (``maxsim_bwd_fused_*``) where a document's
winners fit: dQ's blocks in the first grid columns, then a column of row groups per document,
each inverting its own rows' winners in shared memory; otherwise the inverse CSR with dQ, then
dD (with the sum of dQ's document chunks).
"""

from __future__ import annotations

import typing

from .._gpu.registry import FORMATS, kernel_name
from ..tuning import Tunables
from .configs import (BWD_DIM_CHUNK, BWD_THREADS, bwd_csr_layout, bwd_csr_shared_bytes,
                      bwd_fused_shared_bytes)

#: The scratch's parts (4-byte words, each 16-byte aligned), in allocation order; the tail of
#: gpu.args.BACKWARD_HEAD (tests/test_packaging.py checks it).
SCRATCH_PARTS = ("sources", "row_ranges", "csr_counts", "partial")


class Launch(typing.NamedTuple):
    name: str
    grid: tuple
    block: tuple
    shared: int


class BackwardLayout(typing.NamedTuple):
    launches: tuple  # of Launch, in order
    scratch_words: int  # 4-byte words of scratch (0: none)
    scratch_bytes: tuple  # byte offset of each SCRATCH_PARTS part in the scratch (None: unused)
    values: dict  # BackwardArgs fields, pointers of the arrays 0 (patched per call)


def plan_backward(q, d, argmax, offsets, pairs: bool, num_docs: int, longest: int, properties: tuple,
                  tunables: Tunables) -> BackwardLayout:
    """The layout of a backward of ``q`` (Nq, Lq, D) against ``d`` (operands as the kernels
    read them: unit dim stride) with winners ``argmax``; ``longest``: the longest document."""
    num_queries, query_length, dim = q.shape
    sm_count, smem_limit, smem_per_sm = properties[:3]
    sources_per_doc = query_length if pairs else num_queries * query_length
    count_warps, csr_counts_stride = bwd_csr_layout(longest, smem_limit, smem_per_sm)
    # Vector loads of rows: 16 bytes of 16-bit rows (the _wide kernels: 8 dims a lane, two rows
    # a warp instruction, 32-bit offsets in 16-byte steps) where rows start on 16 bytes, else 4
    # dims a lane (8 bytes of 16-bit, 16 of float32) where they start on 4 elements, else
    # element by element.
    pointers_aligned = q.ptr % 16 == 0 and d.ptr % 16 == 0
    row_starts = q.strides[:-1] + d.strides[:-1] + (dim,)
    aligned = pointers_aligned and all(s % 4 == 0 for s in row_starts)
    furthest_row = max(sum((n - 1) * s for n, s in zip(x.shape[:-1], x.strides[:-1])) for x in (q, d))
    num_tokens = num_queries * query_length
    num_rows = d.shape[0] * (d.shape[1] if offsets is None else 1)  # destination rows
    # dD: rows per warp for about 64 sources per warp on average (dense ColBERT rows get a
    # handful), at most 32 (sparse ColPali rows: more blocks in flight; H200, dD 35.7 us with
    # 64 rows a warp, 27.6 with 32: bench/results/tune-dd-rows-2026-11-30-3572412.txt).
    rows_per_warp = max(1, min(32, 64 * longest // max(1, sources_per_doc)))
    # The _wide kernels walk dD's rows two at a time, one per half-warp: dense rows only.
    bits = FORMATS[q.dtype].bits
    wide = (pointers_aligned and bits == 16 and all(s % 8 == 0 for s in row_starts)
            and min(row_starts) >= 0 and furthest_row < 8 * 2**32
            and rows_per_warp <= tunables.bwd_wide_max_rows_per_warp)
    warps, threads = BWD_THREADS // 32, BWD_THREADS
    block_rows = warps * rows_per_warp
    groups = -(-longest // block_rows)
    name = lambda stage: kernel_name("maxsim_bwd", q.dtype, stage, wide)  # noqa: E731
    dim_chunks = -(-dim // BWD_DIM_CHUNK)
    fused_shared = bwd_fused_shared_bytes(warps, block_rows, sources_per_doc)
    fused = (csr_counts_stride == 0 and fused_shared <= tunables.bwd_fused_shared_limit
             and groups * sources_per_doc <= tunables.bwd_fused_max_winner_reads
             and (pairs or q.dtype == "float64" or num_docs <= tunables.bwd_fused_max_docs))
    if fused:
        dq_columns = -(-(-(-num_tokens // warps) * dim_chunks) // groups)
        docs_per_chunk, parts = num_docs, [0] * len(SCRATCH_PARTS)
        launches = (Launch(name("fused"), (dq_columns + num_docs, groups), (threads,), fused_shared),)
    else:
        # dQ: one warp per query token and document chunk; chunks of at least 32 documents,
        # enough of them for about 64 warps per SM (partial sums then add up in chunk order).
        if q.dtype == "float64" or pairs:
            docs_per_chunk = num_docs
        else:
            wanted = max(1, min(-(-64 * sm_count // num_tokens), -(-num_docs // 32)))
            docs_per_chunk = min(tunables.dq_docs_per_chunk, -(-num_docs // wanted))
        chunks = -(-num_docs // docs_per_chunk)
        # All scratch in one allocation: the inverse CSR, per-row list starts, global CSR counts
        # (very long documents), dQ partial sums.
        parts = [num_docs * sources_per_doc, 2 * (num_rows + num_docs), num_docs * csr_counts_stride,
                 chunks * num_tokens * dim if chunks > 1 else 0]
        shared = 0 if csr_counts_stride else bwd_csr_shared_bytes(count_warps, longest)
        # The CSR's blocks (one per document), then dQ's (query tokens, dim chunks, document
        # chunks), in one launch; then dD: a block per (document, row group); with several dQ
        # chunks, blocks past the documents sum the chunks' partials (about 16 blocks' worth
        # per SM).
        dq_blocks = -(-num_tokens // warps) * dim_chunks * chunks
        reduce_columns = -(-min(-(-num_tokens * dim // threads), sm_count * 16) // groups) if chunks > 1 else 0
        launches = (Launch(name("csr_dq"), (num_docs + dq_blocks,), (threads,), shared),
                    Launch(name("dd"), (num_docs + reduce_columns, groups), (threads,), 0))
    starts, total = [], 0
    for n in parts:
        starts.append(total if n else None)
        total += -(-n // 4) * 4
    argmax_strides = (argmax.strides[0], 0) if pairs else (
        (0, argmax.strides[0]) if argmax.ndim == 2 else tuple(argmax.strides[:2]))
    values = dict(
        q=0, d=0, argmax=0, grad_q=0, grad_d=0, sources=0, row_ranges=0, csr_counts=0, partial=0,
        grad=0, grad_query_stride=0, grad_doc_stride=0,
        q_query_stride=q.strides[0], q_row_stride=q.strides[1],
        d_doc_stride=d.strides[0] if offsets is None else 0, d_row_stride=d.strides[-2],
        doc_length=d.shape[1] if offsets is None else 0, offsets=0 if offsets is None else offsets.ptr,
        argmax_query_stride=argmax_strides[0], argmax_doc_stride=argmax_strides[1],
        csr_counts_stride=csr_counts_stride, num_docs=num_docs, sources_per_doc=sources_per_doc,
        docs_per_chunk=docs_per_chunk, num_queries=num_queries, query_length=query_length, dim=dim,
        offsets_are_64bit=int(offsets is not None and offsets.dtype == "int64"), pairs=int(pairs),
        argmax_is_32bit=int(argmax.dtype == "int32"), count_warps=count_warps,
        vector_loads=int(aligned and bits <= 32), rows_per_warp=rows_per_warp,
        reserved=0,
    )
    return BackwardLayout(launches, total, tuple(None if s is None else 4 * s for s in starts), values)
