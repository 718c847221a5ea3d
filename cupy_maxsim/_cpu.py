"""The NumPy backend: MaxSim on the CPU, blocked so that its extra memory stays bounded.

Similarities are formed one block at a time with a BLAS matrix product (float32, or float64
for float64 inputs), reduced to per-token maxima at once, and dropped. A block holds at most
``BLOCK_ELEMENTS`` similarities (64 MB of float32); with its masks and temporaries the backend
stays near 256 MB of extra memory whatever the corpus size. Same semantics as the kernels:
see ``reference.py``.
"""

from __future__ import annotations

import numpy as np

BLOCK_ELEMENTS = 16 * 1024 * 1024


def _compute_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _block(x, scale, ctype):
    """A block of tokens in the compute dtype; int8 tokens dequantised with their scales."""
    block = x.astype(ctype, copy=False)
    return block if scale is None else block * scale[..., None].astype(ctype)


def _token_reduce(sims: np.ndarray, d_real: np.ndarray | None):
    """Max over the last axis (document tokens) and whether any real similarity is non-finite."""
    non_finite = ~np.isfinite(sims)
    if d_real is not None:
        non_finite &= d_real
        sims = np.where(d_real, sims, -np.inf)
    return sims.max(axis=-1), non_finite.any(axis=-1)


def _query_reduce(token_max, token_bad, q_real, doc_has_token):
    """Sum per-token maxima over real query tokens (axis 1) and apply the -inf / NaN rules.

    token_max, token_bad: (nq, Lq, nb); q_real: (nq, Lq); doc_has_token: (nb,) or (nq, nb).
    """
    real = q_real[:, :, None]
    scores = np.where(real, token_max, 0).sum(axis=1)
    scores[(token_bad & real).any(axis=1)] = np.nan
    scores[np.broadcast_to(~doc_has_token, scores.shape)] = -np.inf
    return scores


def _real_mask(mask, shape):
    return np.ones(shape, bool) if mask is None else mask


def score_padded(q, d, q_mask, d_mask, q_scale=None, d_scale=None) -> np.ndarray:
    """q (Nq, Lq, D), d (Nd, Ld, D), masks (Nq, Lq) / (Nd, Ld) or None -> (Nq, Nd).
    int8 inputs come with per-token scales shaped like their masks."""
    num_queries, query_length, dim = q.shape
    num_docs, doc_length, _ = d.shape
    ctype = _compute_dtype(q.dtype)
    out = np.empty((num_queries, num_docs), ctype)
    q_real = _real_mask(q_mask, q.shape[:2])
    has_token = np.full(num_docs, doc_length > 0) if d_mask is None else d_mask.any(axis=1)
    if doc_length == 0 or query_length == 0:
        out[:] = np.where(has_token, 0.0, -np.inf)
        return out
    pairs_per_block = max(1, BLOCK_ELEMENTS // (query_length * doc_length))
    q_step = min(num_queries, pairs_per_block)
    d_step = max(1, pairs_per_block // q_step)
    for i0 in range(0, num_queries, q_step):
        qb = _block(q[i0:i0 + q_step], None if q_scale is None else q_scale[i0:i0 + q_step], ctype)
        nq = qb.shape[0]
        for n0 in range(0, num_docs, d_step):
            db = _block(d[n0:n0 + d_step], None if d_scale is None else d_scale[n0:n0 + d_step], ctype)
            nb = db.shape[0]
            sims = (qb.reshape(nq * query_length, dim) @ db.reshape(nb * doc_length, dim).T)
            sims = sims.reshape(nq, query_length, nb, doc_length)
            real = None if d_mask is None else d_mask[n0:n0 + nb]
            token_max, token_bad = _token_reduce(sims, real)
            out[i0:i0 + nq, n0:n0 + nb] = _query_reduce(
                token_max, token_bad, q_real[i0:i0 + nq], has_token[n0:n0 + nb])
    return out


def score_pairs(q, d, q_mask, d_mask, q_scale=None, d_scale=None) -> np.ndarray:
    """Aligned pairs: q (B, Lq, D), d (B, Ld, D) -> (B,)."""
    batch, query_length, _ = q.shape
    doc_length = d.shape[1]
    ctype = _compute_dtype(q.dtype)
    out = np.empty(batch, ctype)
    q_real = _real_mask(q_mask, q.shape[:2])
    has_token = np.full(batch, doc_length > 0) if d_mask is None else d_mask.any(axis=1)
    if doc_length == 0 or query_length == 0:
        out[:] = np.where(has_token, 0.0, -np.inf)
        return out
    step = max(1, BLOCK_ELEMENTS // (query_length * doc_length))
    for b0 in range(0, batch, step):
        qb = _block(q[b0:b0 + step], None if q_scale is None else q_scale[b0:b0 + step], ctype)
        db = _block(d[b0:b0 + step], None if d_scale is None else d_scale[b0:b0 + step], ctype)
        sims = np.matmul(qb, db.transpose(0, 2, 1))  # (b, Lq, Ld)
        real = None if d_mask is None else d_mask[b0:b0 + step][:, None, :]
        token_max, token_bad = _token_reduce(sims, real)  # (b, Lq)
        scores = _query_reduce(token_max[:, :, None], token_bad[:, :, None], q_real[b0:b0 + step],
                               has_token[b0:b0 + step, None])
        out[b0:b0 + step] = scores[:, 0]
    return out


def score_packed(q, tokens, offsets, q_mask, q_scale=None, d_scale=None) -> np.ndarray:
    """q (Nq, Lq, D), tokens (T, D), offsets (Nd + 1,) -> (Nq, Nd); d_scale is (T,)."""
    num_queries, query_length, dim = q.shape
    offsets = offsets.astype(np.int64, copy=False)
    num_docs = len(offsets) - 1
    lengths = np.diff(offsets)
    ctype = _compute_dtype(q.dtype)
    out = np.empty((num_queries, num_docs), ctype)
    q_real = _real_mask(q_mask, q.shape[:2])
    if query_length == 0 or num_docs == 0:
        out[:] = np.where(lengths > 0, 0.0, -np.inf)
        return out
    q_step = min(num_queries, max(1, BLOCK_ELEMENTS // (query_length * max(1, int(lengths.max())))))
    token_budget = max(1, BLOCK_ELEMENTS // (q_step * query_length))
    for i0 in range(0, num_queries, q_step):
        qb = _block(q[i0:i0 + q_step], None if q_scale is None else q_scale[i0:i0 + q_step], ctype)
        nq = qb.shape[0]
        q2 = qb.reshape(nq * query_length, dim)
        n0 = 0
        while n0 < num_docs:
            # Whole documents up to the token budget, at least one document per block.
            n1 = int(np.searchsorted(offsets, offsets[n0] + token_budget, side="right")) - 1
            n1 = min(num_docs, max(n0 + 1, n1))
            block_lengths = lengths[n0:n1]
            scores = np.full((nq, n1 - n0), -np.inf, ctype)
            nonempty = np.flatnonzero(block_lengths > 0)
            if len(nonempty):
                begin, end = offsets[n0], offsets[n1]
                block = _block(tokens[begin:end], None if d_scale is None else d_scale[begin:end], ctype)
                sims = q2 @ block.T  # (nq*Lq, tokens)
                starts = offsets[n0:n1][nonempty] - begin
                token_max = np.maximum.reduceat(sims, starts, axis=1)
                token_bad = np.logical_or.reduceat(~np.isfinite(sims), starts, axis=1)
                shape = (nq, query_length, len(nonempty))
                scores[:, nonempty] = _query_reduce(token_max.reshape(shape), token_bad.reshape(shape),
                                                    q_real[i0:i0 + nq], np.ones(len(nonempty), bool))
            out[i0:i0 + nq, n0:n1] = scores
            n0 = n1
    return out
