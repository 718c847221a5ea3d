"""Public functions: validate -> allocate -> call the backend (NumPy or CUDA kernels).

Every argument is checked here, before anything is launched: ``TypeError`` for an unsupported
type or dtype, ``ValueError`` for a shape, mask, offsets or device mismatch, each naming the
argument, what was expected and what came.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing

import numpy as np

from . import _cpu, _kernels
from ._arrays import ITEMSIZE, Operand, Output, as_operand, module_of

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
_MMA_DTYPES = ("float16", "bfloat16", "int8")
_DTYPE_SUFFIX = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64", "int8": "int8"}
_SUFFIX_DTYPE = {suffix: dtype for dtype, suffix in _DTYPE_SUFFIX.items()}


# ---- validation -----------------------------------------------------------------------------


def _float_operand(x, name: str) -> Operand:
    operand = as_operand(x, name)
    if operand.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32 or float64, got {operand.dtype}")
    return operand


def _scored_operand(x, name: str) -> Operand:
    operand = as_operand(x, name)
    if operand.dtype not in FLOAT_DTYPES + ("int8",):
        raise TypeError(f"{name} must have dtype float16, bfloat16, float32, float64 or int8, got {operand.dtype}")
    return operand


def _resolve_int8(q: Operand, d: Operand, q_scale, d_scale):
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
    d_scale_op = _scale_operand(d_scale, "d_scale", d.shape[:-1], q)
    if q.dtype == "int8":
        if q_scale is None:
            raise TypeError("q is int8: pass its per-token scales as q_scale (see quantize_int8)")
        return q, _scale_operand(q_scale, "q_scale", q.shape[:-1], q), d_scale_op
    if q_scale is not None:
        raise ValueError(f"q_scale applies to int8 queries, got q of dtype {q.dtype}")
    values, scales = _quantize(q, None)
    return (_cupy_or_host_operand(values, "q", q), _cupy_or_host_operand(scales, "q_scale", q), d_scale_op)


def _scale_operand(scale, name: str, shape: tuple, q: Operand) -> Operand:
    return _per_token_operand(scale, name, shape, q, "float32", "float32 (one scale per token)")


def _cupy_or_host_operand(array, name: str, like: Operand) -> Operand:
    """An internal NumPy / CuPy array as an operand that belongs to ``like``'s call."""
    operand = as_operand(array, name)
    operand.framework = like.framework
    return operand


def _check_ndim(operand: Operand, allowed: tuple, layout: str) -> None:
    if operand.ndim not in allowed:
        raise ValueError(f"{operand.name} must have shape {layout}, got shape {operand.shape}")


def _check_pair(q: Operand, d: Operand) -> None:
    if q.dtype != d.dtype:
        raise TypeError(f"q and {d.name} must have the same dtype, got {q.dtype} and {d.dtype}")
    if q.shape[-1] != d.shape[-1]:
        raise ValueError(f"q and {d.name} must have the same embedding dim, got {q.shape[-1]} and {d.shape[-1]}")
    _check_device(q, d)


def _check_device(q: Operand, other: Operand) -> None:
    if q.device != other.device:
        where = lambda o: "host memory" if o.device < 0 else f"CUDA device {o.device}"  # noqa: E731
        raise ValueError(f"{other.name} must be on the same device as q ({where(q)}), got {where(other)}")


def _mask_operand(mask, name: str, shape: tuple, q: Operand):
    if mask is None:
        return None
    return _per_token_operand(mask, name, shape, q, "bool", "a boolean array (True = real token)")


def _per_token_operand(x, name: str, shape: tuple, q: Operand, dtype: str, what: str) -> Operand:
    """A mask or scale array: one value per token, of ``dtype``, on q's device."""
    operand = as_operand(x, name)
    if operand.dtype != dtype:
        raise TypeError(f"{name} must be {what}, got dtype {operand.dtype}")
    if tuple(operand.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(operand.shape)}")
    _check_device(q, operand)
    return operand


def _as_query_batch(q: Operand, q_mask: Operand | None):
    """View a single query (Lq, D) as a batch of one (1, Lq, D)."""
    if q.ndim == 3:
        return q, q_mask
    q3 = _batch_view(q)
    mask3 = None if q_mask is None else _batch_view(q_mask)
    return q3, mask3


def _batch_view(operand: Operand) -> Operand:
    host = None if operand.host is None else operand.host[None]
    return operand.with_changes(shape=(1,) + tuple(operand.shape), strides=(0,) + tuple(operand.strides), host=host)


def _check_offsets(offsets: Operand, num_tokens: int) -> tuple[int, int, int]:
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
        first, last, decreasing, longest = _kernels.offsets_summary(
            offsets.ptr, offsets.shape[0], offsets.strides[0], offsets.dtype == "int64", offsets.device, offsets.stream)
    if first < 0 or last > num_tokens or decreasing:
        raise ValueError(
            f"offsets must be non-decreasing and within [0, {num_tokens}] (tokens has {num_tokens} rows), "
            f"got first {first}, last {last}" + (f", and {decreasing} decreasing steps" if decreasing else "")
        )
    return first, last, max(0, longest)


def _argmax_dtype(longest_doc: int) -> str:
    """Saved winners fit int16 when every document is shorter than 32768 tokens."""
    return "int16" if longest_doc < 32768 else "int32"


# ---- public functions -----------------------------------------------------------------------


def score(q, d, *, q_mask=None, d_mask=None, q_scale=None, d_scale=None, return_argmax=False):
    """MaxSim scores of queries against padded documents.

    Parameters
    ----------
    q : array, shape (Lq, D) or (Nq, Lq, D)
        One query or a batch of queries; float16, bfloat16, float32 or float64. Any DLPack
        producer (CuPy, NumPy, PyTorch, JAX), taken without copying.
    d : array, shape (Nd, Ld, D)
        Documents, same dtype and device as ``q``.
    q_mask : bool array, shape (Lq,) or (Nq, Lq), optional
        True marks a real query token; a masked token contributes 0.
    d_mask : bool array, shape (Nd, Ld), optional
        True marks a real document token; a masked token never wins a max. Holes are allowed.
    q_scale, d_scale : float32 arrays, shapes q.shape[:-1] and (Nd, Ld), optional
        Per-token scales of int8 inputs (from :func:`quantize_int8`; non-negative). int8
        documents need ``d_scale``; int8 queries need ``q_scale``; float queries against int8
        documents are quantised on the fly. The similarity is ``q_scale * d_scale * <q, d>``
        with the dot product exact in int32.
    return_argmax : bool, optional
        Also return the winning document token of every query token, for
        :func:`score_backward` (training).

    Returns
    -------
    scores : array, shape (Nd,) or (Nq, Nd)
        float32 (float64 for float64 inputs), in the framework and on the device of ``q``.
        ``scores[i, n] = sum_t max_j <q[i, t], d[n, j]>`` over real tokens; ``-inf`` for a
        document with no real token; NaN where a similarity between real tokens is not finite.
    argmax : int16 array (int32 when Ld >= 32768), shape (Nd, Lq) or (Nq, Nd, Lq)
        Only with ``return_argmax``: ``argmax[i, n, t]`` is the first ``j`` reaching the max
        for query token ``t``; -1 for a masked query token or a document with no real token.
    """
    plain = q_mask is None and d_mask is None and q_scale is None and d_scale is None
    replay_key = _replay_key(q, d, return_argmax) if plain else None
    result = _replayed(replay_key, q, d)
    if result is not None:
        return result
    like, d_op = _scored_operand(q, "q"), _scored_operand(d, "d")
    _check_ndim(like, (2, 3), "(Lq, D) or (Nq, Lq, D)")
    _check_ndim(d_op, (3,), "(Nd, Ld, D)")
    q_op, q_scale_op, d_scale_op = _resolve_int8(like, d_op, q_scale, d_scale)
    _check_pair(q_op, d_op)
    q_mask_op = _mask_operand(q_mask, "q_mask", q_op.shape[:-1], q_op)
    d_mask_op = _mask_operand(d_mask, "d_mask", d_op.shape[:2], q_op)
    single = q_op.ndim == 2
    q3, q_mask3 = _as_query_batch(q_op, q_mask_op)
    q_scale3 = _as_query_batch(q_scale_op, None)[0] if q_scale_op is not None and single else q_scale_op
    num_queries, num_docs = q3.shape[0], d_op.shape[0]
    shape = (num_docs,) if single else (num_queries, num_docs)
    argmax_dtype = _argmax_dtype(d_op.shape[1]) if return_argmax else None
    if not q_op.on_gpu:
        out = _cpu.score_padded(q3.host, d_op.host, _host(q_mask3), _host(d_mask_op), _host(q_scale3),
                                _host(d_scale_op), with_argmax=return_argmax)
        return _host_result(like, out, single, argmax_dtype)
    record = [] if replay_key is not None else None
    result = _gpu_score(like, q3, d_op, q_mask3, d_mask_op, q_scale3, d_scale_op, shape, pairs=False,
                        doc_length=d_op.shape[1], doc_stride=d_op.strides[0], offsets=None,
                        argmax_dtype=argmax_dtype, record=record)
    if record:
        _remember(_replays, replay_key, _Replay(like.with_changes(ptr=0, keepalive=None), shape,
                                                _result_dtype(q_op.dtype), argmax_dtype, *record[0]))
    return result


def score_pairs(q, d, *, q_mask=None, d_mask=None, q_scale=None, d_scale=None, return_argmax=False):
    """MaxSim scores of aligned (query, document) pairs.

    Parameters
    ----------
    q : array, shape (B, Lq, D)
    d : array, shape (B, Ld, D)
        Same dtype and device as ``q``.
    q_mask : bool array, shape (B, Lq), optional
    d_mask : bool array, shape (B, Ld), optional
    q_scale, d_scale : float32 arrays, shapes (B, Lq) and (B, Ld), optional
        int8 scales, as in :func:`score`.
    return_argmax : bool, optional
        Also return the winners, shape (B, Lq), as in :func:`score`.

    Returns
    -------
    scores : array, shape (B,)
        ``scores[b]`` is the MaxSim score of ``q[b]`` against ``d[b]``; same rules as
        :func:`score`.
    """
    like, d_op = _scored_operand(q, "q"), _scored_operand(d, "d")
    _check_ndim(like, (3,), "(B, Lq, D)")
    _check_ndim(d_op, (3,), "(B, Ld, D)")
    q_op, q_scale_op, d_scale_op = _resolve_int8(like, d_op, q_scale, d_scale)
    _check_pair(q_op, d_op)
    if q_op.shape[0] != d_op.shape[0]:
        raise ValueError(f"q and d must hold the same number of pairs, got {q_op.shape[0]} and {d_op.shape[0]}")
    q_mask_op = _mask_operand(q_mask, "q_mask", q_op.shape[:2], q_op)
    d_mask_op = _mask_operand(d_mask, "d_mask", d_op.shape[:2], q_op)
    argmax_dtype = _argmax_dtype(d_op.shape[1]) if return_argmax else None
    if not q_op.on_gpu:
        out = _cpu.score_pairs(q_op.host, d_op.host, _host(q_mask_op), _host(d_mask_op), _host(q_scale_op),
                               _host(d_scale_op), with_argmax=return_argmax)
        return _host_result(like, out, False, argmax_dtype)
    return _gpu_score(like, q_op, d_op, q_mask_op, d_mask_op, q_scale_op, d_scale_op, (d_op.shape[0],),
                      pairs=True, doc_length=d_op.shape[1], doc_stride=d_op.strides[0], offsets=None,
                      argmax_dtype=argmax_dtype)


def score_packed(q, tokens, offsets, *, q_mask=None, q_scale=None, d_scale=None, return_argmax=False):
    """MaxSim scores against packed variable-length documents (no padding read or computed).

    Parameters
    ----------
    q : array, shape (Lq, D) or (Nq, Lq, D)
    tokens : array, shape (T, D)
        All documents' tokens, back to back; same dtype and device as ``q``.
    offsets : int32 or int64 array, shape (Nd + 1,)
        Document n is ``tokens[offsets[n]:offsets[n + 1]]`` (FlashAttention's ``cu_seqlens``).
        Must be non-decreasing and within ``[0, T]``; checked before launch (one small
        device-to-host read when the offsets live on a GPU).
    q_mask : bool array, shape (Lq,) or (Nq, Lq), optional
    q_scale, d_scale : float32 arrays, shapes q.shape[:-1] and (T,), optional
        int8 scales, as in :func:`score`.
    return_argmax : bool, optional
        Also return the winners as in :func:`score`, each an index within its document (int16
        when every document is shorter than 32768 tokens, else int32).

    Returns
    -------
    scores : array, shape (Nd,) or (Nq, Nd)
        Same rules as :func:`score`; an empty document scores ``-inf``.
    """
    return _score_packed(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax)[0]


def _score_packed(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax):
    """(:func:`score_packed`'s result, its offsets' checked bounds (first, last, longest)): an
    adapter hands the bounds on to :func:`backward_plan`, which then need not check (and, on a
    GPU, wait for the stream) again."""
    like, t_op = _scored_operand(q, "q"), _scored_operand(tokens, "tokens")
    o_op = as_operand(offsets, "offsets")
    _check_ndim(like, (2, 3), "(Lq, D) or (Nq, Lq, D)")
    _check_ndim(t_op, (2,), "(T, D)")
    q_op, q_scale_op, d_scale_op = _resolve_int8(like, t_op, q_scale, d_scale)
    _check_pair(q_op, t_op)
    _check_device(q_op, o_op)
    bounds = _check_offsets(o_op, t_op.shape[0])
    longest = bounds[2]
    q_mask_op = _mask_operand(q_mask, "q_mask", q_op.shape[:-1], q_op)
    single = q_op.ndim == 2
    q3, q_mask3 = _as_query_batch(q_op, q_mask_op)
    q_scale3 = _as_query_batch(q_scale_op, None)[0] if q_scale_op is not None and single else q_scale_op
    num_docs = o_op.shape[0] - 1
    shape = (num_docs,) if single else (q3.shape[0], num_docs)
    argmax_dtype = _argmax_dtype(longest) if return_argmax else None
    if not q_op.on_gpu:
        out = _cpu.score_packed(q3.host, t_op.host, o_op.host, _host(q_mask3), _host(q_scale3), _host(d_scale_op),
                                with_argmax=return_argmax)
        return _host_result(like, out, single, argmax_dtype), bounds
    return _gpu_score(like, q3, t_op, q_mask3, None, q_scale3, d_scale_op, shape, pairs=False, doc_length=0,
                      doc_stride=0, offsets=o_op, argmax_dtype=argmax_dtype), bounds


def score_backward(grad_scores, q, d, argmax, *, offsets=None, pairs=False):
    """Gradients of MaxSim scores with respect to the queries and the documents.

    Uses the winners saved by the forward (``return_argmax=True``): each query token's
    gradient gathers its winning document rows; each document token's gradient adds the query
    tokens it won, found by inverting the argmax into CSR on the GPU. No float atomics: the
    same inputs give bitwise the same gradients. Accumulation is in float32 (float64 for
    float64 inputs).

    Parameters
    ----------
    grad_scores : float array, shaped like the scores
        The loss's gradient with respect to the scores: (Nd,) or (Nq, Nd) (pairs: (B,)).
    q, d : arrays
        The forward's inputs: as given to :func:`score`, or to :func:`score_pairs` with
        ``pairs=True``; with ``offsets``, ``d`` is the ``tokens`` (T, D) of
        :func:`score_packed`. float16, bfloat16, float32 or float64 (int8 has no gradient).
    argmax : int16 or int32 array
        The forward's winners, shaped like the scores plus (Lq,). Masks need not be passed
        again: a masked token has no winner (-1) and gets a zero gradient.
    offsets : int32 or int64 array, shape (Nd + 1,), optional
        Packed documents, as in :func:`score_packed`.
    pairs : bool, optional
        The scores came from :func:`score_pairs`.

    Returns
    -------
    grad_q, grad_d : arrays shaped and typed like ``q`` and ``d``
        In the framework and on the device of ``q``; contiguous.
    """
    # Every input is checked before anything is launched.
    return backward_plan(q, d, argmax, offsets=offsets, pairs=pairs, prepare=False).gradients(grad_scores)


def backward_plan(q, d, argmax, *, offsets=None, pairs=False, prepare=True, _checked_offsets=None) -> "BackwardPlan":
    """The part of :func:`score_backward` that needs no gradient: validation and, on a GPU (with
    ``prepare``), the launches' layout and arguments. Autograd adapters call this in the
    forward, so that their backward only launches the kernels
    (``plan.gradients(grad_scores)``). A training step repeats one signature of operands: after a
    GPU plan of padded documents, a later one of the same signature reuses its layout (see
    "repeated calls" below) and reads only the pointers. ``_checked_offsets``: the bounds
    ``_score_packed`` returned for these very offsets, in the same adapter call."""
    key, pointers = _backward_key(q, d, argmax, pairs) if prepare and offsets is None else (None, None)
    if key is not None:
        template = _backward_templates.get(key)
        if template is not None:
            return template._rebound(pointers, (q, d, argmax), template.like.stream)
    like = as_operand(q, "q")
    if like.dtype == "int8":
        raise TypeError("score_backward needs float q and d: int8 scoring has no gradient")
    if like.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must have dtype float16, bfloat16, float32 or float64, got {like.dtype}")
    d_op = _float_operand(d, "tokens" if offsets is not None else "d")
    if pairs and offsets is not None:
        raise ValueError("pairs and offsets cannot be combined: score_pairs takes padded documents")
    if pairs:
        _check_ndim(like, (3,), "(B, Lq, D)")
        _check_ndim(d_op, (3,), "(B, Ld, D)")
        if like.shape[0] != d_op.shape[0]:
            raise ValueError(f"q and d must hold the same number of pairs, got {like.shape[0]} and {d_op.shape[0]}")
    else:
        _check_ndim(like, (2, 3), "(Lq, D) or (Nq, Lq, D)")
        _check_ndim(d_op, (2,) if offsets is not None else (3,), "(T, D)" if offsets is not None else "(Nd, Ld, D)")
    _check_pair(like, d_op)
    longest, cover = (d_op.shape[1] if d_op.ndim == 3 else 0), True
    o_op = None
    if offsets is not None:
        o_op = as_operand(offsets, "offsets")
        _check_device(like, o_op)
        first, last, longest = (_checked_offsets if _checked_offsets is not None
                                else _check_offsets(o_op, d_op.shape[0]))
        cover = first == 0 and last == d_op.shape[0]
    single = like.ndim == 2
    q3 = _as_query_batch(like, None)[0]
    num_queries, query_length, dim = q3.shape
    num_docs = d_op.shape[0] if offsets is None else o_op.shape[0] - 1
    scores_shape = (num_docs,) if pairs or single else (num_queries, num_docs)
    argmax_op = as_operand(argmax, "argmax")
    if argmax_op.dtype not in ("int16", "int32"):
        raise TypeError(f"argmax must be int16 or int32 (from return_argmax=True), got dtype {argmax_op.dtype}")
    if tuple(argmax_op.shape) != scores_shape + (query_length,):
        raise ValueError(f"argmax must have shape {scores_shape + (query_length,)}, got {tuple(argmax_op.shape)}")
    _check_device(like, argmax_op)
    plan = BackwardPlan(like, q3, d_op, argmax_op, o_op, pairs, single, scores_shape, longest, cover)
    if prepare and like.on_gpu:
        plan._prepare_gpu()
        if key is not None and plan._reusable:
            _remember(_backward_templates, key, plan._template())
    return plan


def score_with_plan(q, d, *, q_mask=None, d_mask=None, offsets=None, pairs=False):
    """(scores, plan): the scores with winners and :func:`backward_plan` of them, an autograd
    adapter's forward (``offsets``: packed documents as in :func:`score_packed`; ``pairs``: as
    :func:`score_pairs`). A training step repeats one signature: after a GPU call of padded
    documents without masks, both launches are replayed under a single lookup (see "repeated
    calls" below), the step's host path being on its critical path."""
    if offsets is not None:
        (scores, argmax), bounds = _score_packed(q, d, offsets, q_mask, None, None, True)
        plan = backward_plan(q, d, argmax, offsets=offsets, _checked_offsets=bounds)
    elif pairs:
        scores, argmax = score_pairs(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
        plan = backward_plan(q, d, argmax, pairs=True)
    else:
        key = _replay_key(q, d, "plan") if q_mask is None and d_mask is None else None
        result = _replayed(key, q, d)
        if result is not None:
            return result  # staged by the replay
        scores, argmax = score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
        plan = backward_plan(q, d, argmax)
        if key is not None:
            forward = _replays.get(_replay_key(q, d, True))
            template = _backward_templates.get(_backward_key(q, d, argmax, False)[0])
            if forward is not None and template is not None:
                _remember(_replays, key, forward.with_backward(template))
    plan._stage()
    return scores, plan


def _host_gradient(output: Output, array: np.ndarray, dtype: str):
    """A CPU-backend gradient (compute dtype) in the caller's dtype and framework."""
    if dtype != "bfloat16":
        return output.wrap(array.astype(dtype, copy=False))
    bits = array.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    rounded = np.where(np.isnan(array), np.uint16(0x7FC0), rounded)
    return output.wrap(rounded, dtype="bfloat16")


#: Most documents per dQ chunk (a warp walks a chunk's documents in order).
DQ_DOCS_PER_CHUNK = 4096
#: The scratch's parts (4-byte words, each 16-byte aligned), in allocation order.
_BWD_SCRATCH = ("sources", "row_ranges", "csr_counts", "partial")
assert _kernels.BACKWARD_HEAD[-len(_BWD_SCRATCH):] == _BWD_SCRATCH
#: grad_scores' pointer and strides (where they sit in a call's argument buffer, and their
#: packer): what a staged backward patches.
_GRAD_AT, _GRAD_FIELDS = _kernels.ArgTemplate.fields_at(_kernels.backward_args, _kernels.BACKWARD_GRAD)


def _unit_dim_stride(operand: Operand) -> Operand:
    """The backward kernels read rows with unit dim stride: copy a strided operand once."""
    if operand.strides[-1] == 1 or operand.shape[-1] <= 1:
        return operand
    import cupy

    with _kernels.on_stream(operand.stream):
        copy = cupy.ascontiguousarray(operand.cupy())
    return _cupy_or_host_operand(copy, operand.name, operand)


class BackwardPlan:
    """:func:`score_backward` for one forward's operands and winners (from
    :func:`backward_plan`): on a GPU the checks and the launches' layout are settled, and
    :meth:`gradients` launches the backward for a gradient of the scores: one launch where a
    document's winners fit (dD blocks invert their own rows'), else the inverse CSR with dQ,
    then dD. Holds the scratch (CSR, row lists, dQ partial sums) of its last gradients until
    it is dropped."""

    def __init__(self, like, q, d, argmax, offsets, pairs, single, scores_shape, longest, cover):
        self.like, self.q, self.d, self.argmax, self.offsets = like, q, d, argmax, offsets
        self.pairs, self.single, self.scores_shape, self.longest, self.cover = pairs, single, scores_shape, longest, cover
        # GPU: the kernels' arguments packed once (_args: all but the pointers of the arrays,
        # the gradients, the scratch and grad_scores; None: an empty problem), the arrays'
        # pointers, and what gradients() launches (one launch, or the CSR with dQ, then dD with
        # the sum of dQ's chunks), all settled in the forward: a training step's backward host
        # path is on its critical path.
        self._args = None
        self._pointers = ()
        self._launches = None
        self._scratch_words, self._scratch_bytes = 0, ()
        self._prepared = self._reusable = False
        self._staged = None  # the first gradients, staged in the forward: (grad_q, grad_d, argument buffer)

    def gradients(self, grad_scores):
        """(grad_q, grad_d), shaped and typed like ``q`` and ``d``, in ``q``'s framework."""
        like = self.like
        grad = as_operand(grad_scores, "grad_scores")
        if grad.dtype not in FLOAT_DTYPES:
            raise TypeError(f"grad_scores must be a float array, got dtype {grad.dtype}")
        if tuple(grad.shape) != self.scores_shape:
            raise ValueError(f"grad_scores must have the scores' shape {self.scores_shape}, got {tuple(grad.shape)}")
        _check_device(like, grad)
        output = Output(like)
        if not like.on_gpu:
            grad_host = grad.host[None] if self.single else grad.host  # one query: a batch of one
            argmax_host = self.argmax.host[None] if self.single else self.argmax.host
            grad_q, grad_d = _cpu.score_backward(grad_host, self.q.host, self.d.host, argmax_host,
                                                 None if self.offsets is None else self.offsets.host, self.pairs)
            return (_host_gradient(output, grad_q.reshape(like.shape), like.dtype),
                    _host_gradient(output, grad_d, self.d.dtype))
        if not self._prepared:
            self._prepare_gpu()
        return self._gpu_gradients(grad, output)

    def _prepare_gpu(self) -> None:
        """Launch geometry, scratch and the inverse CSR (it needs only the winners)."""
        like, q, d, argmax, offsets, pairs, longest = (self.like, self.q, self.d, self.argmax, self.offsets,
                                                       self.pairs, self.longest)
        num_queries, query_length, dim = q.shape
        num_docs = self.scores_shape[-1] if not pairs else self.scores_shape[0]
        self._stream, self._prepared = like.stream, True
        if num_queries == 0 or query_length == 0 or dim == 0 or num_docs == 0 or longest == 0:
            return  # gradients are zeros
        sources_per_doc = query_length if pairs else num_queries * query_length
        if sources_per_doc >= 2**31:
            raise ValueError(f"at most 2^31 - 1 query tokens per backward, got {sources_per_doc}")
        with _kernels.on_device(like.device), _kernels.on_stream(self._stream):
            sm_count, smem_limit, smem_per_sm = _kernels.device_properties(like.device)[:3]
            count_warps, csr_counts_stride = _kernels.bwd_csr_layout(longest, smem_limit, smem_per_sm)
            self.q, self.d = q, d = _unit_dim_stride(q), _unit_dim_stride(d)
            # A later plan of the same signature may reuse this one's layout unless operands were
            # copied here (their pointers would not be the caller's).
            self._reusable = q is self.q and d is self.d and offsets is None
            # Vector loads of rows: 16 bytes of 16-bit rows (the _wide kernels: 8 dims a lane,
            # two rows a warp instruction, 32-bit offsets in 16-byte steps) where rows start on
            # 16 bytes, else 4 dims a lane (8 bytes of 16-bit, 16 of float32) where they start
            # on 4 elements, else element by element.
            pointers_aligned = q.ptr % 16 == 0 and d.ptr % 16 == 0
            row_starts = q.strides[:-1] + d.strides[:-1] + (dim,)
            aligned = pointers_aligned and all(s % 4 == 0 for s in row_starts)
            furthest_row = max(sum((n - 1) * s for n, s in zip(x.shape[:-1], x.strides[:-1])) for x in (q, d))
            num_tokens = num_queries * query_length
            num_rows = d.shape[0] * (d.shape[1] if offsets is None else 1)  # destination rows
            # dD: rows per warp for about 64 sources per warp on average (dense ColBERT rows get a
            # handful), at most 32 (sparse ColPali rows: more blocks in flight; H200, dD 35.7 us
            # with 64 rows a warp, 27.6 with 32: bench/results/tune-dd-rows-2026-11-30-3572412.txt).
            rows_per_warp = max(1, min(32, 64 * longest // max(1, sources_per_doc)))
            # The _wide kernels walk dD's rows two at a time, one per half-warp: dense rows only.
            wide = (pointers_aligned and ITEMSIZE[like.dtype] == 2 and all(s % 8 == 0 for s in row_starts)
                    and min(row_starts) >= 0 and furthest_row < 8 * 2**32
                    and rows_per_warp <= _kernels.BWD_WIDE_MAX_ROWS_PER_WARP)
            warps, threads = _kernels.BWD_THREADS // 32, _kernels.BWD_THREADS
            block_rows = warps * rows_per_warp
            groups = -(-longest // block_rows)
            suffix = _DTYPE_SUFFIX[like.dtype] + ("_wide" if wide else "")
            kernel = functools.partial(_kernels.get_kernel, like.device, "maxsim_bwd", defines=_kernels.BWD_DEFINES)
            dim_chunks = -(-dim // _kernels.BWD_DIM_CHUNK)
            fused_shared = _kernels.bwd_fused_shared_bytes(warps, block_rows, sources_per_doc)
            fused = (csr_counts_stride == 0 and fused_shared <= _kernels.BWD_FUSED_SHARED_LIMIT
                     and groups * sources_per_doc <= _kernels.BWD_FUSED_MAX_WINNER_READS
                     and (pairs or like.dtype == "float64" or num_docs <= _kernels.BWD_FUSED_MAX_DOCS))
            if fused:
                # One launch: dQ's blocks (query tokens, dim chunks) in the first columns, then a
                # column of row groups per document, each building its rows' lists in shared
                # memory; no scratch.
                dq_columns = -(-(-(-num_tokens // warps) * dim_chunks) // groups)
                docs_per_chunk, parts = num_docs, [0] * len(_BWD_SCRATCH)
                self._launches = (_kernels.PreparedLaunch(kernel(f"maxsim_bwd_fused_{suffix}", shared_bytes=fused_shared),
                                                          (dq_columns + num_docs, groups), (threads,), fused_shared),)
            else:
                # dQ: one warp per query token and document chunk; chunks of at least 32 documents,
                # enough of them for about 64 warps per SM (partial sums then add up in chunk order).
                if like.dtype == "float64" or pairs:
                    docs_per_chunk = num_docs
                else:
                    wanted = max(1, min(-(-64 * sm_count // num_tokens), -(-num_docs // 32)))
                    docs_per_chunk = min(DQ_DOCS_PER_CHUNK, -(-num_docs // wanted))
                chunks = -(-num_docs // docs_per_chunk)
                # All scratch in one allocation (4-byte words, each part 16-byte aligned): the inverse
                # CSR, per-row list starts, global CSR counts (very long documents), dQ partial sums.
                parts = [num_docs * sources_per_doc, 2 * (num_rows + num_docs), num_docs * csr_counts_stride,
                         chunks * num_tokens * dim if chunks > 1 else 0]
                shared = 0 if csr_counts_stride else _kernels.bwd_csr_shared_bytes(count_warps, longest)
                # The CSR's blocks (one per document), then dQ's (query tokens, dim chunks, document
                # chunks), in one launch; then dD: a block per (document, row group); with several dQ
                # chunks, blocks past the documents sum the chunks' partials (about 16 blocks' worth
                # per SM).
                dq_blocks = -(-num_tokens // warps) * dim_chunks * chunks
                reduce_columns = -(-min(-(-num_tokens * dim // threads), sm_count * 16) // groups) if chunks > 1 else 0
                self._launches = (_kernels.PreparedLaunch(kernel(f"maxsim_bwd_csr_dq_{suffix}", shared_bytes=shared),
                                                          (num_docs + dq_blocks,), (threads,), shared),
                                  _kernels.PreparedLaunch(kernel(f"maxsim_bwd_dd_{suffix}"),
                                                          (num_docs + reduce_columns, groups), (threads,), 0))
            starts, total = [], 0
            for n in parts:
                starts.append(total if n else None)
                total += -(-n // 4) * 4
            # Byte offsets of the scratch's parts (None: a part not used).
            self._scratch_words = total
            self._scratch_bytes = tuple(None if start is None else 4 * start for start in starts)
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
                vector_loads=int(aligned and ITEMSIZE[like.dtype] <= 4), rows_per_warp=rows_per_warp,
                reserved=0,
            )
            # A reusable plan's template holds no pointer of its arrays (offsets: not reusable).
            self._args = _kernels.ArgTemplate(_kernels.backward_args, [values[name] for name, _ in _kernels.BACKWARD_ARGS],
                                              _kernels.BACKWARD_HEAD)
        self._pointers = q.ptr, d.ptr, argmax.ptr

    def _template(self) -> "BackwardPlan":
        """This plan without its arrays: what a later plan of the same signature starts from."""
        template = object.__new__(BackwardPlan)
        template.__dict__.update(self.__dict__)
        template.like = self.like.with_changes(ptr=0, keepalive=None)
        template.q = self.q.with_changes(ptr=0, keepalive=None)
        template.d = self.d.with_changes(ptr=0, keepalive=None)
        template.argmax = self.argmax.with_changes(ptr=0, keepalive=None)
        template._scratch = template._stream = template._staged = None
        template._pointers = ()
        return template

    def _rebound(self, pointers: tuple, arrays: tuple, stream: int | None) -> "BackwardPlan":
        """A prepared plan of this template's signature for the arrays (q, d, argmax) at
        ``pointers``, launching on ``stream`` (the caller's, read once per call)."""
        plan = object.__new__(BackwardPlan)
        plan.__dict__.update(self.__dict__)
        plan._keepalive = arrays
        plan._stream = stream
        plan._pointers = pointers
        return plan

    def _stage(self, output: Output | None = None, scratch_ptr: int | None = None, arrays: tuple | None = None) -> None:
        """The first gradients' outputs and arguments, all but grad_scores', settled now (GPU
        plans; nothing for host ones), with scratch the caller allocated (a replayed step: with
        the winners) or its own. An autograd adapter's forward stages them on its own thread
        (gradients() does, for a plan nothing staged, just before launching). Torch runs the
        backward on a thread of its own, where each host step took about twice as long as on
        the forward's (H200 host, bench/results/host-timeline-2026-11-30-d330621.txt): there,
        only grad_scores is read and the kernels launched. ``arrays``: the caller's q and d
        (default: the operands')."""
        if self._args is None:
            return
        output = output if output is not None else Output(self.like)
        if scratch_ptr is None:
            self._scratch, scratch_ptr = output.empty((self._scratch_words,), "int32")
        q_array, d_array = arrays if arrays is not None else (self.like.keepalive, self.d.keepalive)
        grad_q, grad_q_ptr = output.empty_like(self.like, q_array)
        grad_d, grad_d_ptr = output.empty_like(self.d, d_array)
        self._staged = grad_q, grad_d, self._arguments(scratch_ptr, grad_q_ptr, grad_d_ptr)

    def _arguments(self, scratch_ptr: int, grad_q_ptr: int, grad_d_ptr: int):
        """The kernels' argument buffer with this forward's, the gradients' and the scratch's
        pointers; grad_scores' patched in later (_GRAD_FIELDS)."""
        sources, row_ranges, csr_counts, partial = self._scratch_bytes
        q_ptr, d_ptr, argmax_ptr = self._pointers
        return self._args(q_ptr, d_ptr, argmax_ptr, grad_q_ptr, grad_d_ptr,
                          0 if sources is None else scratch_ptr + sources,
                          0 if row_ranges is None else scratch_ptr + row_ranges,
                          0 if csr_counts is None else scratch_ptr + csr_counts,
                          0 if partial is None else scratch_ptr + partial)

    def staged_gradients(self, grad_ptr: int, grad_strides: tuple):
        """The staged first gradients (grad_q, grad_d) in ``q``'s framework for a float32
        gradient of the scores at ``grad_ptr`` with ``grad_strides`` (elements, the scores'
        dims), or None where nothing is staged (a host plan, an empty problem, or a second
        backward of the same forward: :meth:`gradients` answers). For an autograd adapter
        whose engine has already checked the gradient (torch: the scores' shape, dtype and
        device): torch runs the backward on a thread where host time counts double."""
        staged, self._staged = self._staged, None
        if staged is None:
            return None
        grad_q, grad_d, args = staged
        _GRAD_FIELDS.pack_into(args, _GRAD_AT, grad_ptr, *self._grad_strides(grad_strides))
        stream = self._stream
        with _kernels.on_device(self.like.device):
            if self.offsets is not None and not self.cover:
                Output(self.like).fill(grad_d, 0)  # tokens outside every document get no gradient
            for launch in self._launches:
                launch.launch_packed(args, stream)
        return grad_q, grad_d

    def _grad_strides(self, strides) -> tuple:
        """The kernels' (query, document) strides of grad_scores from its own: a 1-D gradient is
        per pair (pairs) or per document (one query)."""
        if len(strides) == 1:
            return (strides[0], 0) if self.pairs else (0, strides[0])
        return tuple(strides)

    def _gpu_gradients(self, grad: Operand, output: Output):
        like = self.like
        if self._args is None:  # an empty problem: zero gradients
            grad_q, _ = output.empty(like.shape, like.dtype)
            grad_d, _ = output.empty(self.d.shape, self.d.dtype)
            output.fill(grad_q, 0)
            output.fill(grad_d, 0)
            return output.wrap(grad_q, like.dtype), output.wrap(grad_d, self.d.dtype)
        if grad.dtype != "float32":  # the kernels read float32
            with _kernels.on_device(like.device), _kernels.on_stream(self._stream):
                grad = _cupy_or_host_operand(grad.cupy().astype(np.float32), "grad_scores", grad)
        # An autograd adapter's forward staged the first gradients (_stage); otherwise, or for a
        # second backward of the same forward (retain_graph: autograd may hold the first
        # gradients), outputs and scratch of their own, staged now: one launch path.
        if self._staged is None:
            self._stage(output)
        grad_q, grad_d = self.staged_gradients(grad.ptr, tuple(grad.strides))
        return output.wrap(grad_q, like.dtype), output.wrap(grad_d, self.d.dtype)


def quantize_int8(x, *, mask=None):
    """Per-token symmetric int8 quantisation for int8 MaxSim scoring.

    Parameters
    ----------
    x : array, shape (..., D)
        Token embeddings (float16, bfloat16, float32 or float64): padded ``(Nd, Ld, D)``,
        packed ``(T, D)`` or queries.
    mask : bool array, shape x.shape[:-1], optional
        True marks real tokens; masked tokens get values 0 and scale 0.

    Returns
    -------
    values : int8 array, shape x.shape
        ``round(x / scale)`` in [-127, 127].
    scales : float32 array, shape x.shape[:-1]
        ``max |x| / 127`` per token (0 for an all-zero or masked token). A token holding NaN or
        inf gets a NaN or inf scale, so every score it takes part in is NaN, as with floats.
        In the framework and on the device of ``x``.
    """
    operand = _float_operand(x, "x")
    if operand.ndim < 1:
        raise ValueError(f"x must have shape (..., D), got shape {operand.shape}")
    mask_op = _mask_operand(mask, "mask", operand.shape[:-1], operand)
    values, scales = _quantize(operand, mask_op)
    output = Output(operand)
    return output.wrap(values), output.wrap(scales)


def _quantize(operand: Operand, mask: Operand | None):
    """(int8 values, float32 scales) as NumPy or CuPy arrays, on the operand's stream."""
    xp = module_of(operand)
    if not operand.on_gpu:
        return _quantize_array(xp, operand.host, operand.dtype, None if mask is None else mask.host)
    with xp.cuda.Device(operand.device), _kernels.on_stream(operand.stream):
        return _quantize_array(xp, operand.cupy(), operand.dtype, None if mask is None else mask.cupy())


#: Tokens quantised per block: keeps the float32 temporaries near 64 MB whatever the corpus.
QUANTIZE_BLOCK_ELEMENTS = 16 * 1024 * 1024


def _quantize_array(xp, x, dtype: str, mask):
    dim = x.shape[-1]
    rows = x.reshape(-1, dim)
    mask_rows = None if mask is None else mask.reshape(-1)
    values = xp.empty(rows.shape, np.int8)
    scales = xp.empty(rows.shape[0], np.float32)
    step = max(1, QUANTIZE_BLOCK_ELEMENTS // max(1, dim))
    for start in range(0, rows.shape[0], step):
        block = rows[start:start + step]
        if dtype == "bfloat16" and block.dtype == np.uint16:  # raw bfloat16 bits (CuPy without ml_dtypes)
            block = (block.astype(np.uint32) << 16).view(np.float32)
        block = block.astype(np.float32)
        scale = (xp.abs(block).max(axis=-1) / 127).astype(np.float32) if dim else \
            xp.zeros(block.shape[0], np.float32)
        safe = xp.where(scale > 0, scale, np.float32(1))
        scaled = xp.nan_to_num(block / safe[:, None], nan=0.0, posinf=0.0, neginf=0.0)
        values[start:start + step] = xp.clip(xp.rint(scaled), -127, 127).astype(np.int8)
        if mask_rows is not None:
            values[start:start + step] *= mask_rows[start:start + step, None]
            scale = xp.where(mask_rows[start:start + step], scale, np.float32(0))
        scales[start:start + step] = scale
    return values.reshape(x.shape), scales.reshape(x.shape[:-1])


def pack(docs, mask=None):
    """Pack documents into ``(tokens, offsets)`` for :func:`score_packed`.

    Parameters
    ----------
    docs : sequence of arrays of shape (Ld_i, D), or one padded array of shape (Nd, Ld, D)
        Documents in one framework and on one device.
    mask : bool array, shape (Nd, Ld), optional
        With a padded ``docs``: True marks the real tokens kept (holes allowed).

    Returns
    -------
    tokens : array, shape (T, D)
    offsets : int64 array, shape (Nd + 1,)
        In the framework and on the device of the documents.
    """
    if isinstance(docs, (list, tuple)):
        if mask is not None:
            raise ValueError("mask applies to a padded (Nd, Ld, D) array, got a sequence of documents")
        if len(docs) == 0:
            raise ValueError("docs must hold at least one document, got an empty sequence")
        operands = [_float_operand(doc, f"docs[{i}]") for i, doc in enumerate(docs)]
        first = operands[0]
        for op in operands:
            _check_ndim(op, (2,), "(Ld_i, D)")
            _check_pair(first, op)
        xp = module_of(first)
        arrays = [_backend_array(op) for op in operands]
        tokens = xp.concatenate(arrays, axis=0)
        lengths = xp.asarray([a.shape[0] for a in arrays], dtype=np.int64)
    else:
        padded = _float_operand(docs, "docs")
        _check_ndim(padded, (3,), "(Nd, Ld, D)")
        first = padded
        xp = module_of(padded)
        array = _backend_array(padded)
        if mask is None:
            tokens = array.reshape(-1, array.shape[-1])
            lengths = xp.full(array.shape[0], array.shape[1], dtype=np.int64)
        else:
            mask_op = _mask_operand(mask, "mask", padded.shape[:2], padded)
            keep = _backend_array(mask_op)
            tokens = array[keep]
            lengths = keep.sum(axis=1).astype(np.int64)
    offsets = xp.zeros(lengths.shape[0] + 1, dtype=np.int64)
    xp.cumsum(lengths, out=offsets[1:])
    output = Output(first)
    return output.wrap(tokens, dtype=first.dtype), output.wrap(offsets)


# ---- helpers --------------------------------------------------------------------------------


def _host(operand: Operand | None):
    return None if operand is None else operand.host


def _backend_array(operand: Operand):
    return operand.host if operand.host is not None else operand.cupy()


def _result_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def _host_result(like: Operand, out, single: bool, argmax_dtype):
    """CPU backend results in the caller's framework: scores, or (scores, argmax)."""
    output = Output(like)
    if argmax_dtype is None:
        return output.wrap(out[0] if single else out)
    scores, argmax = out
    argmax = argmax.astype(argmax_dtype)
    return output.wrap(scores[0] if single else scores), output.wrap(argmax[0] if single else argmax)


def _gpu_score(like: Operand, q: Operand, d: Operand, q_mask, d_mask, q_scale, d_scale, shape, *, pairs,
               doc_length, doc_stride, offsets, argmax_dtype=None, record=None):
    """Allocate the result (and the argmax, when ``argmax_dtype`` is set) in the caller's
    framework (``like``, the q it passed) and run the forward kernel on its stream. ``record``:
    a list that gets what a :class:`_Replay` of this call needs (see _kernels_forward)."""
    output = Output(like)
    result, out_ptr = output.empty(shape, _result_dtype(q.dtype))
    num_queries, query_length, dim = q.shape
    num_docs = shape[-1]
    argmax = None
    if argmax_dtype is not None:
        argmax, argmax_ptr = output.empty(shape + (query_length,), argmax_dtype)
        # (query, doc, token) strides in elements; pairs: query b meets document b only.
        argmax_strides = (query_length, 0) if pairs else (num_docs * query_length, query_length)
    if num_docs == 0 or num_queries == 0:
        return result if argmax is None else (result, argmax)
    if query_length == 0 or dim == 0 or (offsets is None and doc_length == 0):
        scores = _fill_trivial(output, d, d_mask, offsets, shape, num_docs, doc_length, like.stream)
        if argmax is None:
            return scores
        return scores, _fill_argmax(output, argmax, like)
    argmax_args = None if argmax is None else (argmax_ptr, argmax_strides, argmax_dtype == "int32")
    _kernels_forward(q, d, q_mask, d_mask, q_scale, d_scale, offsets, num_docs, doc_length, doc_stride, pairs,
                     out_ptr, 0 if pairs else num_docs, like.stream, argmax_args, record)
    return output.wrap(result) if argmax is None else (output.wrap(result), output.wrap(argmax))


def _fill_argmax(output, argmax, like: Operand):
    """No token can win (no query token, dim 0 or no document token): every winner is -1."""
    output.fill(argmax, -1)
    return output.wrap(argmax)


def _fill_trivial(output, d, d_mask, offsets, shape, num_docs, doc_length, stream):
    """No query token, no dim or no document token: 0 for documents with a real token, else -inf."""
    import cupy

    with cupy.cuda.Device(d.device), _kernels.on_stream(stream):
        if offsets is not None:
            values = offsets.cupy()
            has_token = values[1:] > values[:-1]
        elif d_mask is not None:
            has_token = d_mask.cupy().any(axis=1)
        else:
            has_token = cupy.full(num_docs, doc_length > 0)
        scores = cupy.where(has_token, 0.0, -cupy.inf).astype(_result_dtype(d.dtype))
        return output.wrap(cupy.ascontiguousarray(cupy.broadcast_to(scores, shape)))


# ---- repeated calls -------------------------------------------------------------------------
# A retrieval service calls score() with the same shapes over and over, and a training step
# repeats its forward and backward; a small call is host-bound (rerank-1k: the kernel takes
# ~25 us, the general path 40-60 us of Python). After a call without masks or scales, of torch
# CUDA tensors or CuPy arrays, the general path leaves what its launch needed under the call's
# signature (types, shapes, strides, dtypes and devices of q and d, and whether the winners are
# wanted: everything its checks and its plan read, but the pointers); a later call with the same
# signature reads only the pointers and the stream, allocates the results and launches the same
# kernel. backward_plan does the same for the backward's layout (_backward_key), and
# score_with_plan (an autograd adapter's forward) replays both under one key.


def _replay_key(q, d, argmax: bool = False):
    """The signature of a score(q, d) call without masks or scales, or None where the general
    path is as cheap."""
    kind = type(q)
    if type(d) is not kind:
        return None
    module = kind.__module__
    if module == "torch":  # get_device(): the device's index (-1: CPU) without a torch.device
        return kind, q.shape, q.stride(), q.dtype, q.get_device(), d.shape, d.stride(), d.dtype, d.get_device(), argmax
    if module == "cupy":
        return kind, q.shape, q.strides, q.dtype, q.device.id, d.shape, d.strides, d.dtype, d.device.id, argmax
    return None


def _backward_key(q, d, argmax, pairs: bool):
    """(signature, pointers of q, d and argmax) of a backward_plan(q, d, argmax) call of padded
    documents, or (None, None). Whether q and d sit on 16 bytes is part of the signature (the
    layout's vector loads need it)."""
    key = _replay_key(q, d)
    if key is None or type(argmax) is not key[0]:
        return None, None
    if key[0].__module__ == "torch":
        pointers = q.data_ptr(), d.data_ptr(), argmax.data_ptr()
        key += (argmax.shape, argmax.stride(), argmax.dtype, argmax.get_device())
    else:
        pointers = q.data.ptr, d.data.ptr, argmax.data.ptr
        key += (argmax.shape, argmax.strides, argmax.dtype, argmax.device.id)
    return key + (pairs, (pointers[0] | pointers[1]) % 16 == 0), pointers


class _Replay:
    """A recorded forward launch, replayed with new pointers (see "repeated calls" above)."""

    def __init__(self, like: Operand, shape: tuple, dtype: str, argmax_dtype: str | None, plan_args: tuple,
                 plan: _ForwardPlan, values: dict, tile_map_shape: tuple | None):
        self.like, self.shape, self.dtype = like, shape, dtype
        self.argmax_dtype, self.argmax_shape = argmax_dtype, shape + (like.shape[-2],)
        self.plan_args, self.plan, self.tile_map_shape = plan_args, plan, tile_map_shape
        self.grid = (plan.grid_x, plan.groups)
        self.torch = like.framework == "torch"
        self.backward = None  # a BackwardPlan template: calls answer (scores, plan) (with_backward)
        # The recorded arguments packed once; a call patches in q, d, out and argmax.
        arguments = _kernels.ArgTemplate(_kernels.forward_args, [values[name] for name, _ in _kernels.FORWARD_ARGS],
                                         _kernels.FORWARD_HEAD,
                                         0 if tile_map_shape is None else _kernels.DOC_TILE_MAP_BYTES)
        self.launch = _kernels.PreparedLaunch(plan.kernel, self.grid, (plan.threads,), plan.shared, arguments)

    def with_backward(self, template: "BackwardPlan") -> "_Replay":
        """This replay of a forward with winners, answering (scores, the backward plan of the
        winners from ``template``): score_with_plan replayed. The winners and the backward's
        scratch share one allocation of 4-byte words (the scratch 16-byte aligned after them)."""
        replay = object.__new__(_Replay)
        replay.__dict__.update(self.__dict__)
        replay.backward = template
        argmax_bytes = math.prod(self.argmax_shape) * ITEMSIZE[self.argmax_dtype]
        replay.argmax_words = -(-argmax_bytes // 16) * 4
        replay.work_words = replay.argmax_words + template._scratch_words
        return replay

    def __call__(self, q, d):
        """The scores (and winners, or their backward plan), or None where the general path must
        answer: a pointer not aligned as the kernel needs, or a plan the planner no longer gives
        (its cache was emptied)."""
        if self.torch:
            q_ptr, d_ptr = q.data_ptr(), d.data_ptr()
        else:
            q_ptr, d_ptr = q.data.ptr, d.data.ptr
        if (q_ptr | d_ptr) % 16 or _mma_plan(*self.plan_args) is not self.plan:
            return None
        output = Output(self.like, q if self.torch else None)
        result, out_ptr = output.empty(self.shape, self.dtype)
        argmax_ptr, plan = 0, None
        stream = self.like.stream
        if self.backward is not None:  # the winners with the backward's scratch (with_backward)
            argmax, argmax_ptr = output.empty((self.work_words,), "int32")
            # The backward staged before the forward's launch: in a step the host's path from
            # this launch to the backward's has to keep up with the forward's GPU time (ColBERT
            # in-batch: ~0.1 ms), while the path up to this launch overlaps the GPU's earlier
            # work (the encoder's, or do_bench's L2 flush).
            plan = self.backward._rebound((q_ptr, d_ptr, argmax_ptr), (q, d, argmax), stream)
            plan._stage(output, argmax_ptr + 4 * self.argmax_words, (q, d))
        elif self.argmax_dtype is not None:
            argmax, argmax_ptr = output.empty(self.argmax_shape, self.argmax_dtype)
        with _kernels.on_device(self.like.device):
            tile_map = None if self.tile_map_shape is None else _kernels.doc_tile_map(d_ptr, *self.tile_map_shape)
            self.launch((q_ptr, d_ptr, out_ptr, argmax_ptr), stream, tile_map)
        if self.argmax_dtype is None:
            return output.wrap(result)
        return output.wrap(result), plan if plan is not None else output.wrap(argmax)


def _replayed(key, q, d):
    """The call recorded under ``key`` (from _replay_key) replayed for q and d, or None: no key,
    none recorded, or the general path must answer."""
    replay = _replays.get(key) if key is not None else None
    return None if replay is None else replay(q, d)


_replays: dict = {}
_backward_templates: dict = {}
REPLAY_LIMIT = 256


def _remember(table: dict, key, entry) -> None:
    """Keep ``entry`` under ``key`` in one of the tables above (emptied when full)."""
    if len(table) >= REPLAY_LIMIT:
        table.clear()
    table[key] = entry


def _mma_eligible(q: Operand, d: Operand, dim: int, query_length: int) -> bool:
    """Whether the tensor-core kernel takes these operands: whole 16-byte chunks per row, at
    most 16 k-steps of 32 bytes, rows aligned to 16 bytes, a query no wider than a tile."""
    item = ITEMSIZE[q.dtype]
    if q.dtype not in _MMA_DTYPES or (dim * item) % 16 or dim * item > 512:
        return False
    if query_length > max(_kernels.MMA_CONFIGS) or q.strides[-1] != 1 or d.strides[-1] != 1:
        return False
    if any(s * item % 16 for s in q.strides[:-1] + d.strides[:-1]) or q.ptr % 16 or d.ptr % 16:
        return False
    return _kernels.device_properties(q.device)[3] >= 80


def _choose_mma_config(num_queries: int, query_length: int, ksteps: int, pairs: bool, smem_limit: int,
                       argmax: bool = False):
    """The tensor-core tile configuration for a problem, or None (CUDA-core path)."""
    widths = [w for w in sorted(_kernels.MMA_CONFIGS) if w >= query_length]
    if not pairs and num_queries > 1:
        # Stack several queries on the MMA N dimension: one document tile then serves them all.
        # 256 columns (8 queries of 32) measured fastest for 32+ queries on the H200
        # (bench/results/tune-forward-*.log).
        stacked = min(num_queries * query_length, 256)
        widths = [w for w in widths if w >= stacked] + [w for w in reversed(widths) if w < stacked]
    for width in widths:  # preferred first; narrower ones where a wide tile cannot take this dim
        config = _kernels.mma_config(width, ksteps, argmax)
        if config is None:
            continue
        while config.shared_bytes > smem_limit and config.stages > 2:
            config = dataclasses.replace(config, stages=config.stages - 1)
        if config.shared_bytes <= smem_limit:
            return config
    return None


def _persistent_chunks(num_docs: int, groups: int, resident: int) -> int:
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


class _ForwardPlan(typing.NamedTuple):
    """How the tensor-core forward runs one problem shape (_mma_plan)."""

    kernel: object
    threads: int
    shared: int
    group: int  # queries per block
    groups: int  # query groups (grid y)
    docs_per_block: int
    grid_x: int  # document ranges
    doc_rotation: int
    tile_rows: int  # Hopper kernel: document rows per TMA tile; 0 for mma.sync


@functools.lru_cache(maxsize=256)
def _mma_plan(device, suffix, num_queries, query_length, dim, num_docs, pairs, argmax=0, mean_doc_length=0,
              packed=False):
    """Kernel and launch geometry of the tensor-core forward for one problem shape, cached:
    a repeated call pays no configuration work (small calls are host-bound). ``argmax``: the
    bits of the winners saved (16 or 32), 0 for none."""
    sm_count, smem_limit, smem_per_sm, capability, l2_bytes = _kernels.device_properties(device)
    ksteps = -(-dim * ITEMSIZE[_SUFFIX_DTYPE[suffix]] // 32)  # k-steps are 32 bytes
    corpus_elements = num_docs * mean_doc_length * dim
    corpus_bytes = corpus_elements * ITEMSIZE[_SUFFIX_DTYPE[suffix]]
    config = None
    if _kernels.USE_WGMMA and capability == 90 and not pairs and query_length <= 64:
        # Hopper: warpgroup MMA, as many consumer warpgroups as the queries fill, each owning
        # 64 // Lq whole queries on the MMA's M, or, with queries enough for two warpgroups of
        # 128 rows, 128 // Lq on its N (documents on M, 64-row tiles; its winners are 16-bit).
        docs_on_m = _kernels.WGMMA_DOCS_ON_M and num_queries > 128 // query_length and argmax != 32
        warpgroups = -(-num_queries // ((128 if docs_on_m else 64) // query_length))
        tile_rows = 64 if docs_on_m else _kernels.wgmma_tile_rows(
            mean_doc_length, suffix == "int8", warpgroups < 2, ksteps, 0 if packed else corpus_elements)
        config = _kernels.wgmma_config(ksteps, bool(argmax), warpgroups, tile_rows, num_queries * query_length,
                                       docs_on_m, suffix == "int8")
        if config is not None and config.shared_bytes > smem_limit:
            config = None
    wgmma = config is not None
    if wgmma:
        kernel = _kernels.get_kernel(device, "maxsim_fwd_wgmma", f"maxsim_fwd_wgmma_{suffix}", config.defines(),
                                     config.shared_bytes)
    else:
        config = _choose_mma_config(num_queries, query_length, ksteps, pairs, smem_limit, bool(argmax))
        if config is None:
            return None
        kernel = _kernels.get_kernel(device, "maxsim_fwd", f"maxsim_fwd_{suffix}", config.defines(),
                                     config.shared_bytes)
    group = 1 if pairs else max(1, min(num_queries, config.queries_per_block(query_length)))
    groups = 1 if pairs else -(-num_queries // group)
    if pairs:
        docs_per_block = 1
    else:
        # One wave of resident blocks, each streaming an equal range of documents through its
        # pipeline (a persistent grid): no tail of half-empty waves.
        resident = sm_count * _kernels.resident_blocks(kernel, config.threads, config.shared_bytes, device)
        docs_per_block = -(-num_docs // _persistent_chunks(num_docs, groups, resident))
    grid_x = -(-num_docs // docs_per_block)
    # Query groups of one document range start at different documents (the Hopper kernel), so
    # that they do not all ask the same L2 lines at once; only when the corpus fits in half the
    # L2 cache, so that a later group still finds what an earlier one read.
    corpus_fits = corpus_bytes <= l2_bytes // 2
    doc_rotation = -(-docs_per_block // groups) if wgmma and groups > 1 and corpus_fits else 0
    tile_rows = config.tile_n if wgmma else 0
    return _ForwardPlan(kernel, config.threads, config.shared_bytes, group, groups, docs_per_block, grid_x,
                        doc_rotation, tile_rows)


def _kernels_forward(q, d, q_mask, d_mask, q_scale, d_scale, offsets, num_docs, doc_length, doc_stride, pairs,
                     out_ptr, out_query_stride, stream, argmax=None, record=None):
    """Launch the forward; ``argmax`` = (pointer, (query, doc) strides, is 32-bit) or None.
    ``record``: a list that gets, for a tensor-core forward of one launch, the arguments of
    :class:`_Replay` after its first three."""
    num_queries, query_length, dim = q.shape
    suffix = _DTYPE_SUFFIX[q.dtype]
    values = dict(
        q=q.ptr, q_query_stride=q.strides[0], q_row_stride=q.strides[1], q_dim_stride=q.strides[2],
        q_mask=0 if q_mask is None else q_mask.ptr,
        q_mask_query_stride=0 if q_mask is None else q_mask.strides[0],
        q_mask_row_stride=0 if q_mask is None else q_mask.strides[1],
        d=d.ptr, d_doc_stride=doc_stride, d_row_stride=d.strides[-2], d_dim_stride=d.strides[-1],
        doc_length=doc_length, offsets=0 if offsets is None else offsets.ptr,
        d_mask=0 if d_mask is None else d_mask.ptr,
        d_mask_doc_stride=0 if d_mask is None else d_mask.strides[0],
        d_mask_row_stride=0 if d_mask is None else d_mask.strides[1],
        num_docs=num_docs, docs_per_block=1, out=out_ptr, out_query_stride=out_query_stride,
        num_queries=num_queries, query_length=query_length, dim=dim,
        offsets_are_64bit=int(offsets is not None and offsets.dtype == "int64"),
        queries_per_group=1, pairs=int(pairs), rows_per_chunk=0,
        argmax=0 if argmax is None else argmax[0],
        argmax_query_stride=0 if argmax is None else argmax[1][0],
        argmax_doc_stride=0 if argmax is None else argmax[1][1], doc_rotation=0,
        argmax_is_32bit=int(argmax is not None and argmax[2]),
        q_scale=0 if q_scale is None else q_scale.ptr,
        q_scale_query_stride=0 if q_scale is None else q_scale.strides[0],
        q_scale_row_stride=0 if q_scale is None else q_scale.strides[1],
        d_scale=0 if d_scale is None else d_scale.ptr,
        d_scale_doc_stride=0 if d_scale is None or d_scale.ndim < 2 else d_scale.strides[0],
        d_scale_row_stride=0 if d_scale is None else d_scale.strides[-1],
    )
    with _kernels.on_device(q.device):
        # Tokens of one (average) document: the Hopper tile rows, the L2 working-set estimate.
        mean_doc_length = d.shape[0] / max(1, num_docs) if offsets is not None else doc_length
        plan_args = (q.device, suffix, num_queries, query_length, dim, num_docs, pairs,
                     0 if argmax is None else 32 if argmax[2] else 16, mean_doc_length, offsets is not None)
        plan = _mma_plan(*plan_args) if _mma_eligible(q, d, dim, query_length) else None
        if plan is not None:
            kernel, threads, shared, group, groups, docs_per_block, grid_x, doc_rotation, tile_rows = plan
            values.update(docs_per_block=docs_per_block, queries_per_group=group, doc_rotation=doc_rotation)
            tile_map = tile_map_shape = None
            if tile_rows:
                # The Hopper kernel's TMA descriptor of the documents (packed: one long
                # document); masked rows come too, and the kernel skips their columns.
                item = ITEMSIZE[d.dtype]
                tile_map_shape = (item, dim, d.shape[0] if offsets is not None else doc_length,
                                  1 if offsets is not None else num_docs, d.strides[-2] * item,
                                  0 if offsets is not None else doc_stride * item, offsets is not None, tile_rows)
                # int8 scales by TMA only for padded corpora: a packed tile starts at any token,
                # and a box whose first float is off 16 bytes is an illegal instruction.
                scales = None if d_scale is None or offsets is not None else (
                    d_scale.ptr, d_scale.strides[-1] * 4, d_scale.strides[0] * 4 if d_scale.ndim > 1 else 0)
                tile_map = _kernels.doc_tile_map(d.ptr, *tile_map_shape, scales=scales)
            if record is not None and groups <= 65535:
                record.append((plan_args, plan, dict(values), tile_map_shape))
            out_item = 8 if q.dtype == "float64" else 4
            for first in range(0, groups, 65535):  # grid.y is limited to 65535 query groups
                first_query = first * group
                values.update(
                    q=q.ptr + first_query * q.strides[0] * ITEMSIZE[q.dtype],
                    q_mask=0 if q_mask is None else q_mask.ptr + first_query * q_mask.strides[0],
                    q_scale=0 if q_scale is None else q_scale.ptr + first_query * q_scale.strides[0] * 4,
                    num_queries=num_queries - first_query,
                    out=out_ptr + first_query * out_query_stride * out_item,
                )
                if argmax is not None:
                    values["argmax"] = argmax[0] + first_query * argmax[1][0] * (4 if argmax[2] else 2)
                args = _kernels.forward_args(**values)
                _kernels.launch(kernel, (grid_x, min(65535, groups - first)), (threads,),
                                args if tile_map is None else (args, tile_map), shared, stream)
            return
        sm_count, smem_limit = _kernels.device_properties(q.device)[:2]
        accumulator = 8 if q.dtype == "float64" else 4
        rows = max(1, _kernels.SIMT_CHUNK_BYTES // (dim * accumulator))
        shared = _kernels.simt_shared_bytes(rows, dim, accumulator)
        if shared > smem_limit:
            raise ValueError(f"dim {dim} is too large for the GPU kernels (at most {smem_limit // accumulator - 160})")
        kernel = _kernels.get_kernel(q.device, "maxsim_fwd_simt", f"maxsim_fwd_simt_{suffix}", (), shared)
        values.update(rows_per_chunk=rows)
        total = num_docs if pairs else num_queries * num_docs
        _kernels.launch(kernel, (min(total, sm_count * 64),), (_kernels.SIMT_THREADS,),
                        _kernels.forward_args(**values), shared, stream)
