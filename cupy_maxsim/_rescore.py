"""An Index's exact rescoring: each query's shortlist (storage rows from the Index's own
search) scored again from its host copy in a higher precision, its k best kept (ties to the
lower storage row; Index.search makes them the lower id's where ids are out of storage order). Queries on a GPU: the shortlists' union gathered from the copy once,
copied once, and scored for every query in one packed call; on the host: the NumPy backend, a
query against its own shortlist at a time."""

from __future__ import annotations

import numpy as np

from . import _arrays, _documents, _topk, scoring, search as _search
from ._ids import sorted_unique
from ._problem import argmax_dtype


def in_one_call(xp) -> bool:
    """Whether a rescoring scores every query against the union of the shortlists in one call
    (on a GPU: one launch, where a loop costs launches) or each query against its own (on the
    CPU: no work on other queries' candidates). The tests set it for the CPU."""
    return xp is not np


def _cupy():
    import cupy

    return cupy


def shortlist_depth(k: int, shortlist, stored: int) -> int:
    """The rows a rescoring search takes from its store: ``shortlist`` (at least k), by default
    max(4k, k + 16), no deeper than the documents ``stored`` nor than k (a k past the corpus
    asks no more)."""
    depth = max(k, min(max(4 * k, k + 16), stored)) if shortlist is None else _search._check_k(shortlist)
    if depth < k:
        raise ValueError(f"shortlist must be at least k ({k}), got {depth}")
    return depth


def rescored(index, q, q_mask, rows, k, return_argmax, like):
    """Each query's shortlist (storage rows, -1: none) scored exactly from the host copy,
    its k best kept (ties to the lower storage row); results on the device of ``like``.
    GPU queries: the shortlists' union gathered from the copy once, one copy to the GPU
    and one packed call for every query (a host scoring loop took milliseconds a query);
    host queries: the NumPy backend, a query at a time."""
    single = like.ndim == 2
    rows = rows.reshape(1 if single else like.shape[0], -1)
    none = np.iinfo(np.int64).max
    rows = np.sort(np.where(rows < 0, none, rows), axis=1)  # ascending: ties to the earlier document
    missing = rows == none
    rows[missing] = -1
    offsets = index._host_offsets()[0]
    union = sorted_unique(rows[~missing])
    lengths = offsets[union + 1] - offsets[union]
    union_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = index._exact[_documents.token_rows(offsets, union)]  # (the copy may be memory-mapped: one gather)
    columns = np.where(missing, 0, np.searchsorted(union, rows))
    with _search._gpu_stream(like):
        xp = _cupy() if like.on_gpu else np
        exact, winners = exact_scores(index, q, q_mask, tokens, union_offsets, columns, single, return_argmax, xp)
        absent = xp.asarray(missing)
        exact = xp.where(absent, -np.inf, exact)
        order = _topk.stable_argsort(xp, -exact)  # descending, NaN last; then the absent last
        order = _topk.along_rows(xp, order, _topk.stable_argsort(xp, _topk.along_rows(
            xp, absent, order).astype(xp.int8)))[:, :k]
        order = xp.ascontiguousarray(order)
        found = _topk.along_rows(xp, xp.asarray(rows), order)
        real = found >= 0
        store_ids = index._ids_on_device() if xp is index._xp else xp.asarray(index._ids if index._ids.size else np.full(1, -1))
        out = [xp.where(real, _topk.along_rows(xp, exact, order), -np.inf).astype(np.float32),
               _search.mapped_ids(xp, found, store_ids)]
        if return_argmax:  # (in the dtype the store's own search gives them: int16 below 32768 tokens)
            out.append(xp.where(real[..., None], xp.take_along_axis(winners, order[..., None], axis=1), -1).astype(
                argmax_dtype(index._host_offsets()[1])))
        width = out[0].shape[1]
        if width < k:  # a shortlist shorter than k: the rest is none
            fill = [(-np.inf, np.float32), (-1, np.int64), (-1, np.int32)]
            out = [xp.concatenate([x, xp.full((x.shape[0], k - width) + x.shape[2:], v, dtype=x.dtype)], axis=1)
                   for x, (v, _) in zip(out, fill)]
        out = [x[0] if single else x for x in out]
    if xp is np:
        return _arrays.answer(out, like)
    output = _arrays.Output(like)
    return tuple(output.wrap(x) for x in out)

def exact_scores(index, q, q_mask, tokens, offsets, columns, single, return_argmax, xp):
    """Every query's exact scores of its shortlist, ``columns`` (queries, depth) into the
    union's documents (``tokens``, ``offsets``, host): (scores, winners or None), arrays of
    ``xp``, (queries, depth) and (queries, depth, Lq)."""
    if offsets.shape[0] == 1:  # no shortlist holds a document (a filter allowing none stored): all absent
        query_length = _arrays.as_operand(q, "q").shape[-2]
        return (xp.full(columns.shape, -np.inf, np.float32),
                xp.full(columns.shape + (query_length,), -1, np.int32) if return_argmax else None)
    if in_one_call(xp):  # every query against the union in one call, then each query's columns
        operand = _arrays.as_operand(q, "q")
        q_exact = operand.host if xp is np else operand.cupy()
        q_exact = (_arrays.widened_bfloat16(q_exact) if operand.dtype == "bfloat16" else q_exact).astype(index.rescore)
        mask = None if q_mask is None else _arrays.as_operand(q_mask, "q_mask")
        mask = None if mask is None else mask.host if xp is np else mask.cupy()
        result = scoring.score_packed(q_exact if not single else q_exact[None], xp.asarray(tokens),
                                      xp.asarray(offsets), q_mask=None if mask is None else mask.reshape(
                                          q_exact.shape[:-1] if not single else (1, -1)),
                                      return_argmax=return_argmax)
        scores, argmax = result if return_argmax else (result, None)
        at = xp.asarray(columns)
        winners = None if argmax is None else xp.take_along_axis(argmax.astype(np.int32), at[..., None], axis=1)
        return xp.take_along_axis(scores.astype(np.float32), at, axis=1), winners
    q_host = _arrays.host_values(q).astype(index.rescore)
    q_host = q_host[None] if single else q_host
    mask = None if q_mask is None else _arrays.to_host(_arrays.as_operand(q_mask, "q_mask")).reshape(q_host.shape[:2])
    scores = np.full(columns.shape, -np.inf, np.float32)
    winners = np.full(columns.shape + (q_host.shape[1],), -1, np.int32) if return_argmax else None
    for i in range(q_host.shape[0]):  # each query against its own shortlist only
        mine = sorted_unique(columns[i])
        if not offsets[-1] and not mine.size:
            continue
        sub = np.concatenate([[0], np.cumsum(offsets[mine + 1] - offsets[mine])]).astype(np.int64)
        result = scoring.score_packed(q_host[i], tokens[_documents.token_rows(offsets, mine)], sub,
                                      q_mask=None if mask is None else mask[i], return_argmax=return_argmax)
        where = np.searchsorted(mine, columns[i])
        scores[i] = (result[0] if return_argmax else result)[where]
        if return_argmax:
            winners[i] = result[1][where]
    return scores, winners
