"""The NumPy backend: MaxSim on the CPU, blocked so that its extra memory stays bounded.

Similarities are formed one block at a time with a BLAS matrix product (float32, or float64
for float64 inputs), reduced to per-token maxima at once, and dropped. A block holds at most
``BLOCK_ELEMENTS`` similarities (64 MB of float32); with its masks and temporaries the backend
stays near 256 MB of extra memory whatever the corpus size. Same semantics as the kernels:
see ``reference.py``. With ``with_argmax`` the forward also returns each token's winning
document token (first maximum; -1 for a masked query token or a document with no real token),
and :func:`score_backward` turns it into gradients.
"""

from __future__ import annotations

import functools

import numpy as np

from ._arrays import widened_bfloat16

BLOCK_ELEMENTS = 8 * 1024 * 1024


def _quiet(function):
    """``function`` under np.errstate(all="ignore"): a non-finite input, or a similarity past
    float32, is scored as the contract says (NaN), without NumPy's RuntimeWarnings from inside
    the backend ("invalid value encountered in matmul", "overflow encountered in cast")."""
    @functools.wraps(function)
    def quiet(*args, **kwargs):
        with np.errstate(all="ignore"):
            return function(*args, **kwargs)

    return quiet


def _compute_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


class _Scratch:
    """Arrays reused from block to block of one call. A new array of a block's size each time
    costs its page faults: float32 tokens copied into a reused float64 array took 15 ms, into a
    new one 35 (262k x 128, this machine, 2026-12-05). A view it hands out lasts until the next
    request of its name."""

    def __init__(self):
        self._arrays = {}

    def get(self, name: str, shape: tuple, dtype) -> np.ndarray:
        size = int(np.prod(shape, dtype=np.int64))
        array = self._arrays.get(name)
        if array is None or array.size < size or array.dtype != dtype:
            array = self._arrays[name] = np.empty(max(size, 1), dtype)
        return array[:size].reshape(shape)


def _products(a, b, ctype, scratch: _Scratch):
    """``a @ b.T`` (blocks from _block, float64) in ``ctype``, each similarity the same whatever
    the shape of the block it is in. BLAS's float32 GEMM rounds a dot product by where it falls
    in its tiles (OpenBLAS 0.3.31's Haswell and Zen kernels, 2026-12-02: hundreds of 1-ulp
    differences between a block's products and its slices'), so a document's score would hang on
    its neighbours, and a search's on its blocks. A sum of float32 products in float64 rounds
    back to float32 the same in any order (barring a tie within 1e-16, about 1e-9 a similarity).
    float64 inputs keep float64's own rounding."""
    shape = a.shape[:-1] + b.shape[-2:-1]
    products = np.matmul(a, np.swapaxes(b, -1, -2), out=scratch.get("products", shape, np.float64))
    if ctype == np.float64:
        return products
    rounded = scratch.get("rounded", shape, ctype)
    np.copyto(rounded, products, casting="same_kind")
    return rounded


def _block(x, scale, ctype, scratch: _Scratch, name: str):
    """A block of tokens in the compute dtype, in ``scratch``'s array ``name`` (tokens of it
    already: themselves); int8 tokens dequantised with their scales; uint16 ones are bfloat16
    bits (a bfloat16 Index's store, a query cast to it: bfloat16_view)."""
    if x.dtype == np.uint16:
        x = widened_bfloat16(x)
    if scale is None and x.dtype == ctype:
        return x
    block = scratch.get(name, x.shape, ctype)
    if scale is None:
        np.copyto(block, x, casting="same_kind")
    else:  # (0 * inf of a non-finite scale: NaN, as documented)
        np.multiply(x, scale[..., None].astype(ctype), out=block, casting="same_kind")
    return block


def _token_reduce(sims: np.ndarray, d_real: np.ndarray | None, with_argmax: bool = False):
    """Max over the last axis (document tokens), whether any real similarity is non-finite,
    and (with_argmax) the first index of the max."""
    non_finite = ~np.isfinite(sims)
    if d_real is not None:
        non_finite &= d_real
        sims = np.where(d_real, sims, -np.inf)
    argmax = sims.argmax(axis=-1) if with_argmax else None
    return sims.max(axis=-1), non_finite.any(axis=-1), argmax


def _winners(argmax, q_real, doc_has_token):
    """argmax (nq, Lq, nb) -> (nq, nb, Lq) int32 with -1 where no token wins."""
    winners = np.where(q_real[:, :, None] & np.broadcast_to(doc_has_token, argmax.shape[::2])[:, None, :],
                       argmax, -1)
    return winners.transpose(0, 2, 1).astype(np.int32)


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


@_quiet
def score_padded(q, d, q_mask, d_mask, q_scale=None, d_scale=None, with_argmax=False):
    """q (Nq, Lq, D), d (Nd, Ld, D), masks (Nq, Lq) / (Nd, Ld) or None -> (Nq, Nd), and with
    with_argmax the winners (Nq, Nd, Lq) int32. int8 inputs come with per-token scales shaped
    like their masks."""
    num_queries, query_length, dim = q.shape
    num_docs, doc_length, _ = d.shape
    ctype = _compute_dtype(q.dtype)
    scratch = _Scratch()
    out = np.empty((num_queries, num_docs), ctype)
    argmax = np.full((num_queries, num_docs, query_length), -1, np.int32) if with_argmax else None
    q_real = _real_mask(q_mask, q.shape[:2])
    has_token = np.full(num_docs, doc_length > 0) if d_mask is None else d_mask.any(axis=1)
    if doc_length == 0 or query_length == 0:
        out[:] = np.where(has_token, 0.0, -np.inf)
        return (out, argmax) if with_argmax else out
    if num_queries == 0 or num_docs == 0:
        return (out, argmax) if with_argmax else out
    pairs_per_block = max(1, BLOCK_ELEMENTS // (query_length * doc_length))
    # The blocks' float32 copies of queries and documents count too: each at most a block.
    q_step = min(num_queries, pairs_per_block, max(1, BLOCK_ELEMENTS // (query_length * max(1, dim))))
    d_step = min(max(1, pairs_per_block // q_step), max(1, BLOCK_ELEMENTS // (doc_length * max(1, dim))))
    for i0 in range(0, num_queries, q_step):
        qb = _block(q[i0:i0 + q_step], None if q_scale is None else q_scale[i0:i0 + q_step], np.float64, scratch, "q")
        nq = qb.shape[0]
        for n0 in range(0, num_docs, d_step):
            db = _block(d[n0:n0 + d_step], None if d_scale is None else d_scale[n0:n0 + d_step], np.float64, scratch,
                        "d")
            nb = db.shape[0]
            sims = _products(qb.reshape(nq * query_length, dim), db.reshape(nb * doc_length, dim), ctype, scratch)
            sims = sims.reshape(nq, query_length, nb, doc_length)
            real = None if d_mask is None else d_mask[n0:n0 + nb]
            token_max, token_bad, token_arg = _token_reduce(sims, real, with_argmax)
            out[i0:i0 + nq, n0:n0 + nb] = _query_reduce(
                token_max, token_bad, q_real[i0:i0 + nq], has_token[n0:n0 + nb])
            if with_argmax:
                argmax[i0:i0 + nq, n0:n0 + nb] = _winners(token_arg, q_real[i0:i0 + nq], has_token[n0:n0 + nb])
    return (out, argmax) if with_argmax else out


@_quiet
def score_pairs(q, d, q_mask, d_mask, q_scale=None, d_scale=None, with_argmax=False):
    """Aligned pairs: q (B, Lq, D), d (B, Ld, D) -> (B,), and the winners (B, Lq)."""
    batch, query_length, _ = q.shape
    doc_length = d.shape[1]
    ctype = _compute_dtype(q.dtype)
    scratch = _Scratch()
    out = np.empty(batch, ctype)
    argmax = np.full((batch, query_length), -1, np.int32) if with_argmax else None
    q_real = _real_mask(q_mask, q.shape[:2])
    has_token = np.full(batch, doc_length > 0) if d_mask is None else d_mask.any(axis=1)
    if doc_length == 0 or query_length == 0:
        out[:] = np.where(has_token, 0.0, -np.inf)
        return (out, argmax) if with_argmax else out
    dim = q.shape[2]
    step = max(1, min(BLOCK_ELEMENTS // (query_length * doc_length),
                      BLOCK_ELEMENTS // (max(query_length, doc_length) * max(1, dim))))
    for b0 in range(0, batch, step):
        qb = _block(q[b0:b0 + step], None if q_scale is None else q_scale[b0:b0 + step], np.float64, scratch, "q")
        db = _block(d[b0:b0 + step], None if d_scale is None else d_scale[b0:b0 + step], np.float64, scratch, "d")
        sims = _products(qb, db, ctype, scratch)  # (b, Lq, Ld)
        real = None if d_mask is None else d_mask[b0:b0 + step][:, None, :]
        token_max, token_bad, token_arg = _token_reduce(sims, real, with_argmax)  # (b, Lq)
        scores = _query_reduce(token_max[:, :, None], token_bad[:, :, None], q_real[b0:b0 + step],
                               has_token[b0:b0 + step, None])
        out[b0:b0 + step] = scores[:, 0]
        if with_argmax:
            real_token = q_real[b0:b0 + step] & has_token[b0:b0 + step, None]
            argmax[b0:b0 + step] = np.where(real_token, token_arg, -1)
    return (out, argmax) if with_argmax else out


@_quiet
def score_packed(q, tokens, offsets, q_mask, q_scale=None, d_scale=None, with_argmax=False):
    """q (Nq, Lq, D), tokens (T, D), offsets (Nd + 1,) -> (Nq, Nd), and the winners
    (Nq, Nd, Lq) as indices within each document; d_scale is (T,)."""
    num_queries, query_length, dim = q.shape
    offsets = offsets.astype(np.int64, copy=False)
    num_docs = len(offsets) - 1
    lengths = np.diff(offsets)
    ctype = _compute_dtype(q.dtype)
    scratch = _Scratch()
    out = np.empty((num_queries, num_docs), ctype)
    argmax = np.full((num_queries, num_docs, query_length), -1, np.int32) if with_argmax else None
    q_real = _real_mask(q_mask, q.shape[:2])
    if query_length == 0 or num_docs == 0 or num_queries == 0:
        out[:] = np.where(lengths > 0, 0.0, -np.inf)
        return (out, argmax) if with_argmax else out
    q_step = min(num_queries, max(1, BLOCK_ELEMENTS // (query_length * max(1, int(lengths.max())))),
                 max(1, BLOCK_ELEMENTS // (query_length * max(1, dim))))
    # Tokens a block: its similarities and its float32 copy of the tokens within a block each.
    token_budget = max(1, min(BLOCK_ELEMENTS // (q_step * query_length), BLOCK_ELEMENTS // max(1, dim)))
    for i0 in range(0, num_queries, q_step):
        qb = _block(q[i0:i0 + q_step], None if q_scale is None else q_scale[i0:i0 + q_step], np.float64, scratch, "q")
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
                block = _block(tokens[begin:end], None if d_scale is None else d_scale[begin:end], np.float64,
                               scratch, "d")
                sims = _products(q2, block, ctype, scratch)  # (nq*Lq, tokens)
                starts = offsets[n0:n1][nonempty] - begin
                token_max = np.maximum.reduceat(sims, starts, axis=1)
                token_bad = np.logical_or.reduceat(~np.isfinite(sims), starts, axis=1)
                shape = (nq, query_length, len(nonempty))
                scores[:, nonempty] = _query_reduce(token_max.reshape(shape), token_bad.reshape(shape),
                                                    q_real[i0:i0 + nq], np.ones(len(nonempty), bool))
                if with_argmax:
                    # First index of each segment's max: positions within the document where
                    # the similarity equals the max, the smallest one.
                    seg_lengths = block_lengths[nonempty]
                    local = np.arange(sims.shape[1]) - np.repeat(starts, seg_lengths)
                    hit = sims == np.repeat(token_max, seg_lengths, axis=1)
                    first = np.minimum.reduceat(np.where(hit, local, np.iinfo(np.int64).max), starts, axis=1)
                    first = np.where(first == np.iinfo(np.int64).max, 0, first)  # NaN segments
                    winners = _winners(first.reshape(shape), q_real[i0:i0 + nq], np.ones(len(nonempty), bool))
                    argmax[i0:i0 + nq, n0 + nonempty] = winners
            out[i0:i0 + nq, n0:n1] = scores
            n0 = n1
    return (out, argmax) if with_argmax else out


@_quiet
def score_backward(grad, q, d, argmax, offsets=None, pairs=False):
    """Gradients of the scores from the saved winners, in the compute dtype (float32, or
    float64 for float64 inputs).

    grad (Nq, Nd) (pairs: (B,)); q (Nq, Lq, D); d (Nd, Ld, D), or tokens (T, D) with offsets;
    argmax (Nq, Nd, Lq) (pairs: (B, Lq)). dq gathers the winning rows; dd adds each winner's
    weighted query row into its document row with one unbuffered np.add.at, in source order.
    """
    ctype = _compute_dtype(q.dtype)
    num_queries, query_length, dim = q.shape
    q = q.astype(ctype, copy=False)
    rows = (d if offsets is not None else d.reshape(d.shape[0] * d.shape[1], dim)).astype(ctype, copy=False)
    grad = grad.astype(ctype, copy=False)
    if pairs:
        grad = grad[:, None]  # (B, 1): pair b is query b with document b
        argmax = argmax[:, None, :]
    num_docs = grad.shape[1]
    starts = (offsets[:-1].astype(np.int64) if offsets is not None
              else np.arange(d.shape[0], dtype=np.int64) * d.shape[1])
    grad_q = np.zeros(q.shape, ctype)
    grad_d = np.zeros(rows.shape, ctype)
    if rows.shape[0] == 0 or grad.size == 0:  # no document token, or no score: no winner
        return grad_q, grad_d.reshape(d.shape)
    step = max(1, BLOCK_ELEMENTS // max(1, num_docs * max(1, query_length) * max(1, dim)))
    for i0 in range(0, num_queries, step):
        a = argmax[i0:i0 + step].astype(np.int64)  # (nq, nd, Lq)
        doc_index = np.arange(i0, i0 + a.shape[0])[:, None] if pairs else np.arange(num_docs)[None, :]
        winner = starts[doc_index][:, :, None] + a  # (nq, nd, Lq) rows of `rows`
        real = a >= 0
        weight = np.where(real, grad[i0:i0 + step][:, :, None], 0)
        gathered = rows[np.where(real, winner, 0)]  # (nq, nd, Lq, D)
        grad_q[i0:i0 + step] = (weight[..., None] * gathered).sum(axis=1)
        sources = weight[..., None] * q[i0:i0 + step][:, None, :, :]
        np.add.at(grad_d, winner[real], sources[real])
    return grad_q, grad_d.reshape(d.shape)
