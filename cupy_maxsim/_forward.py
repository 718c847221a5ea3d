"""The forward on a GPU: a validated problem's results allocated, planned and launched.

The plan comes from the pure planner (_plan/forward.py) and is cached under everything it was
made from (device, problem shape, tunables); the argument struct is filled from the problem;
the launch goes through the GPU layer on the caller's stream.
"""

from __future__ import annotations

import dataclasses
import typing

from . import _arrays
from ._cache import Cache
from ._gpu import compile as gpu_compile
from ._gpu import device as gpu_device
from ._gpu import launch as gpu_launch
from ._gpu import tma
from ._gpu.args import forward_args
from ._gpu.registry import DTYPE_SUFFIX
from ._plan import forward as planner
from ._problem import ScoreProblem
from .tuning import Tunables

ITEMSIZE = _arrays.ITEMSIZE
_plans = Cache("forward plans")


class ForwardPlan(typing.NamedTuple):
    """How the tensor-core forward runs one problem shape: the compiled kernel and its grid."""

    kernel: object
    threads: int
    shared: int
    group: int  # queries per block
    groups: int  # query groups (grid y)
    docs_per_block: int
    grid_x: int  # document ranges
    doc_rotation: int
    tile_rows: int  # Hopper kernel: document rows per TMA tile; 0 for mma.sync
    last_group_docs_per_block: int  # the last query group's own ranges (planner.idle_group_ranges), or 0
    long_ranges: int  # ranges of docs_per_block documents, the rest one fewer (planner.balanced_ranges)
    query_box: int = 0  # Hopper kernel: queries a box of q's TMA map holds where the query atoms stream; 0: none
    split_queries: bool = False  # Hopper kernel's fp32 split build: q is read as its fp16 halves (_split_queries)
    split_documents: bool = False  # ... presplit (MAXSIM_FP32_SPLIT 2): d too, by TMA (_split_documents)
    rings: int = 0  # one query group's split rings streaming k, no winners: every block's (document parts)
    part_maxima: bool = False  # the build writes a record a document (a part of one: _launch_parts)


def mma_plan(device: int, shape: planner.ForwardShape, tunables: Tunables) -> ForwardPlan | None:
    """The tensor-core plan of ``shape`` on ``device`` (None: the CUDA-core kernel), cached: a
    repeated call pays no configuration work (small calls are host-bound)."""
    return _plan_of((device,) + tuple(shape) + (tunables,))


def _plan_of(key: tuple) -> ForwardPlan | None:
    """mma_plan under its cache key (device, the ForwardShape's fields, tunables): a plain tuple,
    so that a call that finds its plan builds no ForwardShape."""
    plan = _plans.get(key, _MISSING)
    if plan is _MISSING:
        device, tunables, shape = key[0], key[-1], planner.ForwardShape(*key[1:-1])
        properties = gpu_device.device_properties(device)
        choice = planner.choose_kernel(shape, properties, tunables)
        plan = None
        if choice is not None:
            config = choice.config
            kernel = gpu_compile.get_kernel(device, choice.family, choice.name, config.defines(), config.shared_bytes)
            resident = gpu_device.resident_blocks(kernel, config.threads, config.shared_bytes, device)
            plan = ForwardPlan(kernel, config.threads, config.shared_bytes,
                               *planner.geometry(shape, choice, resident, properties, tunables),
                               query_box=config.query_box(shape.num_queries, shape.query_length)
                               if getattr(config, "stream_query", 0) else 0,
                               split_queries=bool(getattr(config, "fp32_split", 0)),
                               split_documents=getattr(config, "fp32_split", 0) == 2,
                               rings=properties[0] * resident * config.warpgroups
                               if choice.wgmma and config.split_docs and config.stream_k and not config.argmax else 0,
                               part_maxima=bool(getattr(config, "part_maxima", 0)))
        _plans.put(key, plan)
    return plan


_MISSING = object()


def _shape_fields(problem: ScoreProblem) -> tuple:
    """ForwardShape's fields of ``problem``, in order."""
    num_queries, query_length, dim = problem.q.shape
    offsets, num_docs = problem.offsets, problem.num_docs
    # Tokens of one (average) document: the Hopper tile rows, the L2 working-set estimate.
    mean_doc_length = problem.d.shape[0] / max(1, num_docs) if offsets is not None else problem.doc_length
    winners = problem.argmax_dtype
    return (DTYPE_SUFFIX[problem.q.dtype], num_queries, query_length, dim, num_docs, problem.pairs,
            0 if winners is None else 32 if winners == "int32" else 16, mean_doc_length, offsets is not None)


def run(problem: ScoreProblem, tunables: Tunables, record: list | None = None):
    """Allocate the scores (and the winners, where wanted) in the caller's framework and run
    the forward on its stream. ``record``: a list that gets what a replay of this call needs
    (the plan, the argument values, the tile map's shape, a PartsRecord or None: see _replay.py)."""
    like = problem.like
    output = _arrays.Output(like)
    shape = problem.shape
    result, out_ptr = output.empty(shape, problem.result_dtype)
    num_queries, query_length, dim = problem.q.shape
    num_docs = problem.num_docs
    argmax = None
    if problem.argmax_dtype is not None:
        argmax, argmax_ptr = output.empty(shape + (query_length,), problem.argmax_dtype)
        # (query, doc, token) strides in elements; pairs: query b meets document b only.
        argmax_strides = (query_length, 0) if problem.pairs else (num_docs * query_length, query_length)
    if num_docs == 0 or num_queries == 0:
        return result if argmax is None else (result, argmax)
    if query_length == 0 or dim == 0 or (problem.offsets is None and problem.doc_length == 0):
        scores = _fill_trivial(output, problem, like.stream)
        if argmax is None:
            return scores
        output.fill(argmax, -1)  # no token can win
        return scores, output.wrap(argmax)
    winners = None if argmax is None else (argmax_ptr, argmax_strides, problem.argmax_dtype == "int32")
    _launch(problem, tunables, out_ptr, winners, like.stream, record)
    return output.wrap(result) if argmax is None else (output.wrap(result), output.wrap(argmax))


def _fill_trivial(output, problem: ScoreProblem, stream):
    """No query token, no dim or no document token: 0 for documents with a real token, else -inf."""
    import cupy

    with cupy.cuda.Device(problem.d.device), gpu_device.on_stream(stream):
        if problem.offsets is not None:
            values = problem.offsets.cupy()
            has_token = values[1:] > values[:-1]
        elif problem.d_mask is not None:
            has_token = problem.d_mask.cupy().any(axis=1)
        else:
            has_token = cupy.full(problem.num_docs, problem.doc_length > 0)
        scores = cupy.where(has_token, 0.0, -cupy.inf).astype(problem.result_dtype)
        return output.wrap(cupy.ascontiguousarray(cupy.broadcast_to(scores, problem.shape)))


def argument_values(problem: ScoreProblem, out_ptr: int, winners) -> dict:
    """The ForwardArgs fields of ``problem`` (a plan's fields at their neutral values);
    ``winners``: (pointer, (query, doc) strides, is 32-bit) or None."""
    q, d, q_mask, d_mask, q_scale, d_scale, offsets = (problem.q, problem.d, problem.q_mask, problem.d_mask,
                                                       problem.q_scale, problem.d_scale, problem.offsets)
    num_queries, query_length, dim = q.shape
    return dict(
        q=q.ptr, q_query_stride=q.strides[0], q_row_stride=q.strides[1], q_dim_stride=q.strides[2],
        q_mask=0 if q_mask is None else q_mask.ptr,
        q_mask_query_stride=0 if q_mask is None else q_mask.strides[0],
        q_mask_row_stride=0 if q_mask is None else q_mask.strides[1],
        d=d.ptr, d_doc_stride=problem.doc_stride, d_row_stride=d.strides[-2], d_dim_stride=d.strides[-1],
        doc_length=problem.doc_length, offsets=0 if offsets is None else offsets.ptr,
        d_mask=0 if d_mask is None else d_mask.ptr,
        d_mask_doc_stride=0 if d_mask is None else d_mask.strides[0],
        d_mask_row_stride=0 if d_mask is None else d_mask.strides[1],
        num_docs=problem.num_docs, docs_per_block=1, last_group_docs_per_block=0, long_ranges=2**31 - 1,
        out=out_ptr,
        out_query_stride=0 if problem.pairs else problem.num_docs,
        num_queries=num_queries, query_length=query_length, dim=dim,
        offsets_are_64bit=int(offsets is not None and offsets.dtype == "int64"),
        queries_per_group=1, pairs=int(problem.pairs), rows_per_chunk=0,
        argmax=0 if winners is None else winners[0],
        argmax_query_stride=0 if winners is None else winners[1][0],
        argmax_doc_stride=0 if winners is None else winners[1][1], doc_rotation=0,
        argmax_is_32bit=int(winners is not None and winners[2]),
        q_scale=0 if q_scale is None else q_scale.ptr,
        q_scale_query_stride=0 if q_scale is None else q_scale.strides[0],
        q_scale_row_stride=0 if q_scale is None else q_scale.strides[1],
        d_scale=0 if d_scale is None else d_scale.ptr,
        d_scale_doc_stride=0 if d_scale is None or d_scale.ndim < 2 else d_scale.strides[0],
        d_scale_row_stride=0 if d_scale is None else d_scale.strides[-1],
    )


def tile_map_shape(problem: ScoreProblem, tile_rows: int, l2_promotion: int | None, itemsize: int | None = None,
                   width: int | None = None, strides: tuple | None = None) -> tuple:
    """The Hopper kernel's TMA descriptor's shape of the documents (tma.doc_tile_map's arguments
    after the pointer, to its L2 promotion: Tunables.tma_l2_promotion; packed: one long
    document); masked rows come too, and the kernel skips their columns. The fp32 split builds
    read 16-bit halves in d's place: ``itemsize`` 2, their ``width`` (elements a row) and,
    presplit, their (row, document) ``strides`` in bytes (else d's)."""
    d, packed = problem.d, problem.offsets is not None
    item = ITEMSIZE[d.dtype]
    if strides is None:
        strides = (d.strides[-2] * item, 0 if packed else problem.doc_stride * item)
    return (itemsize or item, width or d.shape[-1], d.shape[0] if packed else problem.doc_length,
            1 if packed else problem.num_docs, *strides, packed, tile_rows, l2_promotion)


def query_map_shape(problem: ScoreProblem, plan: ForwardPlan, first_query: int = 0, split=None) -> tuple:
    """The TMA descriptor's shape of q from query ``first_query`` on (tma.doc_tile_map's
    ``queries`` after the pointer: q's own row width, which the fp32 presplit build's documents
    do not share) for a plan whose build streams the query atoms: a box holds
    plan.query_box queries (one warpgroup's 128 rows, whole queries; splitting documents the
    group's), or all of them where fewer (the build that keeps every box within q:
    Block::query_box_first; whole groups and the split group never have fewer). ``split``: the
    fp32 split build's query halves (_split_queries), read in q's place."""
    q = problem.q
    num_queries, query_length, _ = q.shape
    count = num_queries - first_query
    per_box = min(plan.query_box, count)
    if split is not None:
        width = split[0].shape[-1]
        return (width, query_length, count, 2 * width, query_length * 2 * width, per_box)
    item = ITEMSIZE[q.dtype]
    return (q.shape[-1], query_length, count, q.strides[1] * item, q.strides[0] * item, per_box)


def _split_queries(problem: ScoreProblem, stream) -> tuple:
    """q as the fp32 split build reads it: (fp16 halves as uint16 [Nq * Lq, 192 * ceil(D / 64)],
    float32 scales [Nq * Lq]) on ``stream`` (launch.split_queries; q's tokens made contiguous
    first: a query is small)."""
    import cupy

    from ._gpu.launch import split_queries

    q, q_mask = problem.q, problem.q_mask
    num_queries, query_length, dim = q.shape
    with gpu_device.on_stream(stream):
        rows = q.cupy().reshape(num_queries * query_length, dim)
        mask = None if q_mask is None else q_mask.cupy().reshape(-1)
        return split_queries(cupy.ascontiguousarray(rows), None if mask is None else cupy.ascontiguousarray(mask))


def _document_rows(problem: ScoreProblem) -> tuple:
    """d's float32 rows as the split launches take them (launch.split_exponents,
    split_documents): pointer, device, documents, rows a document (packed: one document of every
    token), (doc, row) strides, dim, the mask's pointer (0: none) and its (doc, row) strides."""
    d, d_mask = problem.d, problem.d_mask
    docs, doc_length = (1, d.shape[0]) if problem.offsets is not None else (problem.num_docs, problem.doc_length)
    return (d.ptr, d.device, docs, doc_length, (problem.doc_stride, d.strides[-2]), d.shape[-1],
            0 if d_mask is None else d_mask.ptr, (0, 0) if d_mask is None else (d_mask.strides[0], d_mask.strides[1]))


def _split_exponents(problem: ScoreProblem, stream):
    """The documents' exponents as the fp32 split build reads them in the int8 scales' place
    (launch.split_exponents: int32, one a row of d, SPLIT_ZERO where d_mask drops it), on
    ``stream``, with their (doc, row) strides: (exponents, doc_stride, row_stride)."""
    from ._gpu.launch import split_exponents

    rows = _document_rows(problem)
    with gpu_device.on_stream(stream):
        exponents = split_exponents(*rows)
    return exponents, 0 if problem.offsets is not None else rows[3], 1


def _split_documents(problem: ScoreProblem, stream):
    """d as the fp32 split's presplit build reads it (launch.split_documents: fp16 halves [rows,
    128 * ceil(D / 64)] and the rows' float32 scales, contiguous, rows as d's: padded documents
    of doc_length rows, or packed tokens), on ``stream``."""
    from ._gpu.launch import split_documents

    with gpu_device.on_stream(stream):
        return split_documents(*_document_rows(problem))


def _document_parts(problem: ScoreProblem, plan: ForwardPlan, tunables: Tunables, winners, mean_length: float) -> int:
    """Parts each document of ``problem`` (``mean_length`` tokens on average) is scored in
    (planner.document_parts; 1: whole): one query group's split rings streaming k, without
    winners, over documents without a mask that read as packed tokens in place (padded ones
    back to back; int8 scales likewise)."""
    if not (plan.rings and tunables.document_parts_per_ring and winners is None and problem.d_mask is None
            and plan.groups == 1 and not problem.pairs):
        return 1
    d, d_scale, offsets = problem.d, problem.d_scale, problem.offsets
    if offsets is not None:
        in_place = offsets.strides[0] == 1
    else:
        in_place = problem.doc_stride == problem.doc_length * d.strides[1] and (
            d_scale is None or d_scale.strides[0] == problem.doc_length * d_scale.strides[1])
    return planner.document_parts(problem.num_docs, mean_length, plan.tile_rows, plan.rings,
                                  tunables.document_parts_per_ring) if in_place else 1


class PartsRecord(typing.NamedTuple):
    """What a replay of a call scored in parts (_launch_parts) needs beside the parts' forward:
    the parts' offsets (fixed for a replay's key: padded documents' shape, or an Index's stored
    offsets), the merge's argument values (the problem's: its scores' pointer and strides) and
    the parts a document."""

    starts: object
    merge_values: dict
    parts: int

    @property
    def record_floats(self) -> int:
        """The records' floats: Lq + 1 for each (query, part)."""
        values = self.merge_values
        return values["num_queries"] * values["num_docs"] * self.parts * (values["query_length"] + 1)


def _launch_parts(problem: ScoreProblem, tunables: Tunables, parts: int, tile_rows: int, values: dict, stream,
                  record: list | None) -> None:
    """``problem`` scored as ``parts`` parts of whole tiles a document (_document_parts): the
    parts' offsets (launch.part_offsets), the forward over them as packed documents writing a
    record a part (maxsim_fwd_wgmma.cu, PART_MAXIMA), and the records merged into the scores
    where ``values`` (the problem's argument_values, no winners) says (launch.merge_parts), on
    ``stream``. ``record``: as _launch's; it gets the parts' forward's entry with a PartsRecord."""
    from ._gpu.launch import merge_parts, part_offsets

    q, d, d_scale, offsets = problem.q, problem.d, problem.d_scale, problem.offsets
    num_queries, query_length, dim = q.shape
    tokens = d.shape[0] if offsets is not None else problem.num_docs * problem.doc_length
    count = problem.num_docs * parts
    starts = part_offsets(0 if offsets is None else offsets.ptr, offsets is not None and offsets.dtype == "int64",
                          problem.doc_length, problem.num_docs, parts, tile_rows, d.device, stream)
    part_problem = problem._replace(
        d=d.with_changes(shape=(tokens, dim), strides=d.strides[-2:]), offsets=_arrays.as_operand(starts, "offsets"),
        d_scale=None if d_scale is None else d_scale.with_changes(shape=(tokens,), strides=d_scale.strides[-1:]),
        num_docs=count, shape=(num_queries, count), doc_length=0, doc_stride=0, ragged=True)
    kept = PartsRecord(starts, dict(values), parts)
    # (in the caller's framework, as the scores: its allocator keeps them to the merge's end)
    records, records_ptr = _arrays.Output(problem.like).empty((kept.record_floats,), "float32")
    parts_record = None if record is None else []
    _launch(part_problem, tunables, records_ptr, None, stream, parts_record, part_maxima=True)
    merge_parts(forward_args(**values), records_ptr, parts, num_queries * problem.num_docs, d.device, stream)
    if parts_record:
        record.append(parts_record[0][:-1] + (kept,))


def _launch(problem: ScoreProblem, tunables: Tunables, out_ptr: int, winners, stream, record,
            part_maxima: bool = False) -> None:
    q, d, q_mask = problem.q, problem.d, problem.q_mask
    num_queries, query_length, dim = q.shape
    values = argument_values(problem, out_ptr, winners)
    with gpu_device.on_device(q.device):
        properties = gpu_device.device_properties(q.device)
        fields = _shape_fields(problem)
        suffix = fields[0]
        alignment = planner.load_alignment(suffix, dim, query_length, (q.strides, d.strides), (q.ptr, d.ptr),
                                           properties[3])
        plan = _plan_of((q.device,) + fields + (alignment, problem.ragged, part_maxima, tunables)) if alignment else None
        if part_maxima and (plan is None or not plan.part_maxima):  # (_launch_parts asks only where it can)
            raise RuntimeError("document parts planned without a build that writes their records")
        parts = 1 if plan is None or part_maxima else _document_parts(problem, plan, tunables, winners, fields[7])
        if parts > 1:
            return _launch_parts(problem, tunables, parts, plan.tile_rows, values, stream, record)
        if plan is None:
            simt = planner.simt_plan(suffix, num_queries, dim, problem.num_docs, problem.pairs, properties)
            kernel = gpu_compile.get_kernel(q.device, "maxsim_fwd_simt", simt.name, (), simt.shared)
            values.update(rows_per_chunk=simt.rows_per_chunk)
            gpu_launch.launch(kernel, (simt.grid,), (simt.threads,), forward_args(**values), simt.shared, stream)
            return
        # (a replay records these: one launch, whose last group is the problem's)
        values.update(docs_per_block=plan.docs_per_block, queries_per_group=plan.group, doc_rotation=plan.doc_rotation,
                      last_group_docs_per_block=plan.last_group_docs_per_block, long_ranges=plan.long_ranges)
        # The fp32 split build reads q as its fp16 halves and their scales (kept alive here to
        # the launch; the memory pool reuses them only in this stream's order).
        split = _split_queries(problem, stream) if plan.split_queries else None
        if split is not None:
            halves, split_scales = split
            width = halves.shape[-1]
            values.update(q=halves.data.ptr, q_query_stride=query_length * width, q_row_stride=width, q_dim_stride=1,
                          q_scale=split_scales.data.ptr, q_scale_query_stride=query_length, q_scale_row_stride=1)
            packed = problem.offsets is not None
            if plan.split_documents:  # (its halves read by TMA, its scales as int8's)
                try:
                    d_halves, d_scales = _split_documents(problem, stream)
                except MemoryError:  # (CuPy's OutOfMemoryError) no room for the halves: the staged build needs none
                    staged = dataclasses.replace(tunables, wgmma_fp32_presplit=False)
                    return _launch(problem, staged, out_ptr, winners, stream, record)
                split += (d_halves, d_scales)
                doc_rows = 0 if packed else problem.doc_length
                values.update(d=d_halves.data.ptr, d_doc_stride=doc_rows * d_halves.shape[-1],
                              d_row_stride=d_halves.shape[-1], d_dim_stride=1, d_scale=d_scales.data.ptr,
                              d_scale_doc_stride=doc_rows, d_scale_row_stride=1)
            else:  # (its producer splits d, by the rows' exponents)
                exponents, doc_stride, row_stride = _split_exponents(problem, stream)
                split += (exponents,)
                values.update(d_scale=exponents.data.ptr, d_scale_doc_stride=doc_stride, d_scale_row_stride=row_stride)
        q_base, q_query_bytes = values["q"], values["q_query_stride"] * (2 if split is not None else ITEMSIZE[q.dtype])
        scale_base, scale_query_bytes = values["q_scale"], values["q_scale_query_stride"] * 4
        tile_map = map_shape = scales = query_shape = None
        # (the staged split build's producer splits the documents itself: no map of d)
        use_tma = tunables.use_tma and (split is None or plan.split_documents)
        d_ptr = values["d"]
        if plan.tile_rows:
            if split is None:
                map_shape = tile_map_shape(problem, plan.tile_rows, tunables.tma_l2_promotion)
            else:  # (16-bit halves: presplit, the documents' halves; staged, d's rows, split by the producer)
                width = split[2].shape[-1] if plan.split_documents else split[0].shape[-1]
                strides = (2 * width, 2 * values["d_doc_stride"]) if plan.split_documents else None
                map_shape = tile_map_shape(problem, plan.tile_rows, tunables.tma_l2_promotion, 2, width, strides)
            d_scale = problem.d_scale
            # int8 scales by TMA only for padded corpora: a packed tile starts at any token,
            # and a box whose first float is off 16 bytes is an illegal instruction.
            scales = None if d_scale is None or problem.offsets is not None else (
                d_scale.ptr, d_scale.strides[-1] * 4, d_scale.strides[0] * 4 if d_scale.ndim > 1 else 0)
            if plan.split_documents and problem.offsets is None:  # (the presplit documents' scales)
                scales = (values["d_scale"], 4, 4 * values["d_scale_doc_stride"])
            query_shape = query_map_shape(problem, plan, split=split) if plan.query_box else None
            tile_map = tma.doc_tile_map(d_ptr, *map_shape, scales=scales, use_tma=use_tma,
                                        queries=None if query_shape is None else (q_base,) + query_shape)
        # Replays run only where q and d sit on 16 bytes (_replay.Replay): a plan whose rows were
        # cut to smaller pieces by these pointers (not by the strides, which the key holds) is
        # not the plan of those calls, and is not recorded.
        if record is not None and plan.groups <= 65535 and (q.ptr | d.ptr) % 16 == 0 and split is None:
            record.append((plan, dict(values), map_shape, None if tile_map is None or scales is None else scales[1:],
                           query_shape, None))
        out_item = 8 if q.dtype == "float64" else 4
        out_query_stride = values["out_query_stride"]
        for first in range(0, plan.groups, 65535):  # grid.y is limited to 65535 query groups
            first_query = first * plan.group
            values.update(
                q=q_base + first_query * q_query_bytes,
                q_mask=0 if q_mask is None else q_mask.ptr + first_query * q_mask.strides[0],
                q_scale=0 if not scale_base else scale_base + first_query * scale_query_bytes,
                num_queries=num_queries - first_query,
                out=out_ptr + first_query * out_query_stride * out_item,
                # (the launch's last group is the problem's only in the last launch; before it a whole one)
                last_group_docs_per_block=plan.last_group_docs_per_block if first + 65535 >= plan.groups else 0,
            )
            if winners is not None:
                values["argmax"] = winners[0] + first_query * winners[1][0] * (4 if winners[2] else 2)
            if plan.query_box and first:  # q's map from this launch's first query
                tile_map = tma.doc_tile_map(d_ptr, *map_shape, scales=scales, use_tma=use_tma,
                                            queries=(values["q"],) + query_map_shape(problem, plan, first_query, split))
            args = forward_args(**values)
            gpu_launch.launch(plan.kernel, (plan.grid_x, min(65535, plan.groups - first)), (plan.threads,),
                              args if tile_map is None else (args, tile_map), plan.shared, stream)
