"""Validation: every argument checked before anything launches, and each call described once.

``TypeError`` for an unsupported type or dtype, ``ValueError`` for a shape, mask, offsets or
device mismatch, each naming the argument, what was expected and what came. A checked call
becomes one immutable :class:`ScoreProblem` or :class:`BackwardProblem`, which the backends,
the planners and the replay read; nothing after this module re-derives what it settled.
"""

from __future__ import annotations

import os
import sys
import typing
import warnings

import numpy as np

from ._gpu import launch as gpu_launch
from ._int8 import quantize_operand
from ._arrays import Operand, as_operand, repeated_rows, reshaped

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


class ScoreProblem(typing.NamedTuple):
    """A validated scoring call. Queries are always a batch (a single query is a batch of one,
    ``single``); ``d`` is padded documents (Nd, Ld, D) or packed tokens (T, D) with ``offsets``.
    A NamedTuple, not a frozen dataclass: built on every call, it costs 0.3 us, not 1.2."""

    like: Operand  # the q the caller passed: the framework, device and stream of the results
    q: Operand  # (Nq, Lq, D) as scored (int8 values where float queries meet int8 documents)
    d: Operand
    q_mask: Operand | None  # (Nq, Lq)
    d_mask: Operand | None  # (Nd, Ld)
    q_scale: Operand | None  # (Nq, Lq) float32, int8 only
    d_scale: Operand | None  # d.shape[:-1] float32, int8 only
    offsets: Operand | None  # (Nd + 1,), packed only
    pairs: bool  # query b meets document b only
    single: bool  # one query: results without the query axis
    num_docs: int
    argmax_dtype: str | None  # the winners' dtype where they are wanted

    # Derived once in _batched (a small call is host-bound: fields, not properties).
    shape: tuple  # the scores' shape
    doc_length: int  # padded documents' length; 0 for packed ones
    doc_stride: int  # elements between padded documents; 0 for packed ones
    result_dtype: str  # the scores' dtype
    ragged: bool  # packed documents of unequal lengths (the Hopper tile rows)


class BackwardProblem(typing.NamedTuple):
    """A validated backward: the forward's operands and winners."""

    like: Operand  # the q the caller passed
    q: Operand  # (Nq, Lq, D)
    d: Operand  # (Nd, Ld, D), or tokens (T, D) with offsets
    argmax: Operand
    offsets: Operand | None
    pairs: bool
    single: bool
    scores_shape: tuple
    longest: int  # the longest document's tokens
    cover: bool  # every token belongs to a document (packed offsets from 0 to T)


def result_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def argmax_dtype(longest_doc: int) -> str:
    """Saved winners fit int16 when every document is shorter than 32768 tokens."""
    return "int16" if longest_doc < 32768 else "int32"


# ---- the three scoring layouts --------------------------------------------------------------


def padded_problem(q, d, q_mask, d_mask, q_scale, d_scale, return_argmax) -> ScoreProblem:
    like, d_op = scored_operand(q, "q"), scored_operand(d, "d")
    check_ndim(like, (2, 3), "(Lq, D) or (Nq, Lq, D)")
    check_ndim(d_op, (3,), "(Nd, Ld, D)")
    q_op, q_scale_op, d_scale_op = resolve_int8(like, d_op, q_scale, d_scale)
    check_pair(q_op, d_op)
    q_mask_op = mask_operand(q_mask, "q_mask", q_op.shape[:-1], q_op)
    d_mask_op = mask_operand(d_mask, "d_mask", d_op.shape[:2], q_op)
    return _batched(like, q_op, d_op, q_mask_op, d_mask_op, q_scale_op, d_scale_op, None, False, d_op.shape[0],
                    argmax_dtype(d_op.shape[1]) if return_argmax else None)


def pairs_problem(q, d, q_mask, d_mask, q_scale, d_scale, return_argmax) -> ScoreProblem:
    like, d_op = scored_operand(q, "q"), scored_operand(d, "d")
    check_ndim(like, (3,), "(B, Lq, D)")
    check_ndim(d_op, (3,), "(B, Ld, D)")
    q_op, q_scale_op, d_scale_op = resolve_int8(like, d_op, q_scale, d_scale)
    check_pair(q_op, d_op)
    if q_op.shape[0] != d_op.shape[0]:
        raise ValueError(f"q and d must hold the same number of pairs, got {q_op.shape[0]} and {d_op.shape[0]}")
    q_mask_op = mask_operand(q_mask, "q_mask", q_op.shape[:2], q_op)
    d_mask_op = mask_operand(d_mask, "d_mask", d_op.shape[:2], q_op)
    return _batched(like, q_op, d_op, q_mask_op, d_mask_op, q_scale_op, d_scale_op, None, True, d_op.shape[0],
                    argmax_dtype(d_op.shape[1]) if return_argmax else None)


def packed_problem(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax, checked_offsets=None):
    """(the problem, its offsets' checked bounds (first, last, longest document)).
    ``checked_offsets``: those bounds where the caller knows them (an Index, of its own store),
    so that offsets on a GPU are not read back, and the stream not waited for, again."""
    like, t_op = scored_operand(q, "q"), scored_operand(tokens, "tokens")
    o_op = as_operand(offsets, "offsets")
    check_ndim(like, (2, 3), "(Lq, D) or (Nq, Lq, D)")
    check_ndim(t_op, (2,), "(T, D)")
    q_op, q_scale_op, d_scale_op = resolve_int8(like, t_op, q_scale, d_scale)
    check_pair(q_op, t_op)
    check_device(q_op, o_op)
    bounds = check_offsets(o_op, t_op.shape[0]) if checked_offsets is None else checked_offsets
    q_mask_op = mask_operand(q_mask, "q_mask", q_op.shape[:-1], q_op)
    first, last, longest = bounds
    num_docs = o_op.shape[0] - 1
    problem = _batched(like, q_op, t_op, q_mask_op, None, q_scale_op, d_scale_op, o_op, False, num_docs,
                       argmax_dtype(longest) if return_argmax else None, ragged=longest * num_docs > last - first)
    return problem, bounds


def _batched(like, q, d, q_mask, d_mask, q_scale, d_scale, offsets, pairs, num_docs, winners,
             ragged: bool = False) -> ScoreProblem:
    """The problem with a single query (Lq, D) viewed as a batch of one (1, Lq, D)."""
    single = q.ndim == 2
    if single:
        q = batch_view(q)
        q_mask = None if q_mask is None else batch_view(q_mask)
        q_scale = None if q_scale is None else batch_view(q_scale)
    shape = (num_docs,) if single or pairs else (q.shape[0], num_docs)
    packed = offsets is not None
    return ScoreProblem(like, q, d, q_mask, d_mask, q_scale, d_scale, offsets, pairs, single, num_docs, winners,
                        shape, 0 if packed else d.shape[1], 0 if packed else d.strides[0], result_dtype(q.dtype), ragged)


def backward_problem(q, d, argmax, offsets, pairs, checked_offsets) -> BackwardProblem:
    """``checked_offsets``: the bounds packed_problem returned for these very offsets (they
    need not be checked, and waited for on a GPU, again)."""
    like = as_operand(q, "q")
    if like.dtype == "int8":
        raise TypeError("score_backward needs float q and d: int8 scoring has no gradient")
    if like.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must have dtype float16, bfloat16, float32 or float64, got {like.dtype}")
    d_op = float_operand(d, "tokens" if offsets is not None else "d")
    if pairs and offsets is not None:
        raise ValueError("pairs and offsets cannot be combined: score_pairs takes padded documents")
    if pairs:
        check_ndim(like, (3,), "(B, Lq, D)")
        check_ndim(d_op, (3,), "(B, Ld, D)")
        if like.shape[0] != d_op.shape[0]:
            raise ValueError(f"q and d must hold the same number of pairs, got {like.shape[0]} and {d_op.shape[0]}")
    else:
        check_ndim(like, (2, 3), "(Lq, D) or (Nq, Lq, D)")
        check_ndim(d_op, (2,) if offsets is not None else (3,), "(T, D)" if offsets is not None else "(Nd, Ld, D)")
    check_pair(like, d_op)
    longest, cover = (d_op.shape[1] if d_op.ndim == 3 else 0), True
    o_op = None
    if offsets is not None:
        o_op = as_operand(offsets, "offsets")
        check_device(like, o_op)
        first, last, longest = checked_offsets if checked_offsets is not None else check_offsets(o_op, d_op.shape[0])
        cover = first == 0 and last == d_op.shape[0]
    single = like.ndim == 2
    q3 = batch_view(like) if single else like
    num_queries, query_length, _ = q3.shape
    num_docs = d_op.shape[0] if offsets is None else o_op.shape[0] - 1
    scores_shape = (num_docs,) if pairs or single else (num_queries, num_docs)
    argmax_op = as_operand(argmax, "argmax")
    if argmax_op.dtype not in ("int16", "int32"):
        raise TypeError(f"argmax must be int16 or int32 (from return_argmax=True), got dtype {argmax_op.dtype}")
    if tuple(argmax_op.shape) != scores_shape + (query_length,):
        raise ValueError(f"argmax must have shape {scores_shape + (query_length,)}, got {tuple(argmax_op.shape)}")
    check_device(like, argmax_op)
    if argmax_op.host is not None:
        check_winners(argmax_op.host, o_op.host if o_op is not None else None, d_op.shape[1] if o_op is None else 0,
                      pairs)
    return BackwardProblem(like, q3, d_op, argmax_op, o_op, pairs, single, scores_shape, longest, cover)


# ---- operands -------------------------------------------------------------------------------


def float_operand(x, name: str) -> Operand:
    operand = as_operand(x, name)
    if operand.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64, got {operand.dtype}")
    return operand


def scored_operand(x, name: str) -> Operand:
    operand = as_operand(x, name)
    if operand.dtype not in FLOAT_DTYPES + ("int8",):
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32, float64 or int8, got {operand.dtype}")
    if operand.framework == "torch" and x.requires_grad:
        warn_untracked(name)
    return operand


def warn_untracked(name: str) -> None:
    """A UserWarning where a torch tensor that requires grad is scored with autograd on: the
    NumPy-level functions answer detached tensors, so a loss built on them would train nothing,
    silently. (The adapters' forwards run with autograd off: no warning from them.)"""
    import torch

    if torch.is_grad_enabled():
        warnings.warn(f"{name} requires grad, but cupy_maxsim's NumPy-level functions do not track gradients "
                      "(the result is detached): use cupy_maxsim.torch.maxsim (maxsim_pairs, maxsim_packed, "
                      "maxsim_candidates) for autograd, or torch.no_grad() to score without it", UserWarning,
                      stacklevel=_caller_level())


def _caller_level() -> int:
    """warnings.warn's stacklevel of the first frame outside this package (the caller's line,
    whichever public function it called)."""
    package, frame, level = os.path.dirname(os.path.abspath(__file__)), sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def resolve_int8(q: Operand, d: Operand, q_scale, d_scale):
    """The queries as scored and the scale operands: int8 documents need ``d_scale``; int8
    queries need ``q_scale``; float queries against int8 documents are quantised here, on the
    caller's stream, exactly as :func:`quantize_int8` would."""
    if d.dtype != "int8":
        if q.dtype == "int8":
            raise TypeError(f"int8 queries need int8 documents; got {d.name} of dtype {d.dtype} "
                            "(quantize the documents with quantize_int8)")
        for scale, name in ((q_scale, "q_scale"), (d_scale, "d_scale")):
            if scale is not None:
                raise ValueError(f"{name} applies to int8 inputs only, got {q.dtype} and {d.dtype}")
        return q, None, None
    if d_scale is None:
        raise TypeError(f"{d.name} is int8: pass its per-token scales as d_scale (see quantize_int8)")
    d_scale_op = scale_operand(d_scale, "d_scale", d.shape[:-1], q)
    if q.dtype == "int8":
        if q_scale is None:
            raise TypeError("q is int8: pass its per-token scales as q_scale (see quantize_int8)")
        return q, scale_operand(q_scale, "q_scale", q.shape[:-1], q), d_scale_op
    if q_scale is not None:
        raise ValueError(f"q_scale applies to int8 queries, got q of dtype {q.dtype}")
    values, scales = quantize_operand(q, None)
    return internal_operand(values, "q", q), internal_operand(scales, "q_scale", q), d_scale_op


def scale_operand(scale, name: str, shape: tuple, q: Operand) -> Operand:
    """int8 scales: float32, one per token, non-negative (the query scale factors out of the
    max only then). Host scales are checked; device scales are trusted (a check would read the
    device back on every call)."""
    operand = per_token_operand(scale, name, shape, q, "float32", "float32 (one scale per token)")
    if operand.host is not None and operand.host.size and (operand.host < 0).any():
        raise ValueError(f"{name} must be non-negative (as quantize_int8 makes them), got a minimum of "
                         f"{float(operand.host.min())}")
    return operand


def internal_operand(array, name: str, like: Operand) -> Operand:
    """An internal NumPy / CuPy array as an operand that belongs to ``like``'s call."""
    operand = as_operand(array, name)
    operand.framework = like.framework
    return operand


def check_ndim(operand: Operand, allowed: tuple, layout: str) -> None:
    if operand.ndim not in allowed:
        raise ValueError(f"{operand.name} must have shape {layout}, got shape {operand.shape}")


def check_pair(q: Operand, d: Operand) -> None:
    if q.dtype != d.dtype:
        raise TypeError(f"q and {d.name} must have the same dtype, got {q.dtype} and {d.dtype}")
    if q.shape[-1] != d.shape[-1]:
        raise ValueError(f"q and {d.name} must have the same embedding dim, got {q.shape[-1]} and {d.shape[-1]}")
    check_device(q, d)


def check_device(q: Operand, other: Operand) -> None:
    """``other`` on the device of ``q`` (the operand the error names as the reference)."""
    if q.device != other.device:
        where = lambda o: "host memory" if o.device < 0 else f"CUDA device {o.device}"  # noqa: E731
        raise ValueError(f"{other.name} must be on the same device as {q.name} ({where(q)}), got {where(other)}")


def mask_operand(mask, name: str, shape: tuple, q: Operand):
    if mask is None:
        return None
    return per_token_operand(mask, name, shape, q, "bool", "a boolean array (True = real token; an attention mask "
                             "of 0/1 integers: mask.bool() in torch, mask.astype(bool) in NumPy)")


def per_token_operand(x, name: str, shape: tuple, q: Operand, dtype: str, what: str) -> Operand:
    """A mask or scale array: one value per token, of ``dtype``, on q's device."""
    operand = as_operand(x, name)
    if operand.dtype != dtype:
        raise TypeError(f"{name} must be {what}, got dtype {operand.dtype}")
    if tuple(operand.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(operand.shape)}")
    check_device(q, operand)
    return operand


def batch_view(operand: Operand) -> Operand:
    """(Lq, ...) viewed as a batch of one (1, Lq, ...)."""
    host = None if operand.host is None else operand.host[None]
    return operand.with_changes(shape=(1,) + tuple(operand.shape), strides=(0,) + tuple(operand.strides), host=host)


def check_offsets(offsets: Operand, num_tokens: int) -> tuple[int, int, int]:
    """Checks packed-document offsets; returns (first, last, longest document length)."""
    if offsets.dtype not in ("int32", "int64"):
        raise TypeError(f"offsets must have dtype int32 or int64, got {offsets.dtype}")
    if offsets.ndim != 1 or offsets.shape[0] < 1:
        raise ValueError(f"offsets must have shape (num_docs + 1,), got {offsets.shape}")
    # Decreases are found by comparing neighbours, not by the sign of their difference (which
    # wraps past int64); non-decreasing offsets in [0, num_tokens] give steps that cannot wrap.
    if offsets.host is not None:
        values = offsets.host.astype(np.int64)
        first, last = int(values[0]), int(values[-1])
        decreasing = int((values[1:] < values[:-1]).sum())
        longest = int((values[1:] - values[:-1]).max()) if values.shape[0] > 1 else 0
    else:
        first, last, decreasing, longest = gpu_launch.offsets_summary(
            offsets.ptr, offsets.shape[0], offsets.strides[0], offsets.dtype == "int64", offsets.device, offsets.stream)
    if first < 0 or last > num_tokens or decreasing:
        raise ValueError(
            f"offsets must be non-decreasing and within [0, {num_tokens}] (tokens has {num_tokens} rows), "
            f"got first {first}, last {last}" + (f", and {decreasing} decreasing steps" if decreasing else "")
        )
    return first, last, max(0, longest)


def check_winners(argmax: np.ndarray, offsets: np.ndarray | None, doc_length: int, pairs: bool) -> None:
    """Host winners within their documents: -1 (no winner) or an index below the document's
    length (packed: each document's own, from ``offsets``). Device winners are not read back."""
    if argmax.size == 0:
        return
    if offsets is None:
        limit = doc_length
    else:
        lengths = np.diff(offsets.astype(np.int64))
        limit = lengths[:, None]  # (Nd, 1) against (..., Nd, Lq)
    bad = (argmax < -1) | (argmax >= limit)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"argmax must hold -1 or a token index within its document (from return_argmax=True "
                         f"for these very q and d), got {int(argmax[where])} at {where}")


def check_candidates(q, d) -> None:
    """score_candidates' layout, by shapes alone (any array, tensor or tracer): q (Nq, Lq, D),
    d (Nq, K, Ld, D)."""
    for value, name, ndim in ((q, "q", 3), (d, "d", 4)):
        shape = getattr(value, "shape", None)
        if shape is None or len(shape) != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions ({'(Nq, Lq, D)' if ndim == 3 else '(Nq, K, Ld, D)'}), "
                             f"got shape {None if shape is None else tuple(shape)}")
    if d.shape[0] != q.shape[0]:
        raise ValueError(f"d must hold candidates for each of the {q.shape[0]} queries, got {d.shape[0]} groups")


def candidates_as_pairs(q, d, query_side=(), document_side=()):
    """score_candidates' layout (checked) as aligned pairs, in the arrays' own framework: q's
    rows and ``query_side``'s (masks, scales: (Nq, Lq) or None) repeated K times, d's and
    ``document_side``'s (Nq, K, ...) flattened to (Nq * K, ...). The one place the core and
    both adapters make it (a kernel layout of its own is issue 26)."""
    check_candidates(q, d)
    num_queries, candidates = d.shape[:2]
    flat = lambda x: None if x is None else reshaped(x, (num_queries * candidates,) + tuple(x.shape[2:]))  # noqa: E731
    repeat = lambda x: None if x is None else repeated_rows(x, candidates)  # noqa: E731
    return repeat(q), flat(d), [repeat(x) for x in query_side], [flat(x) for x in document_side]
