"""Float64 MaxSim reference: the truth for tests and benchmarks.

Deliberately plain (one document at a time, float64 throughout) so that it can be checked by
eye against the definition; it is not fast. Inputs may be any array NumPy can read (host
arrays, or anything with ``__array__``); float16 and bfloat16 values convert to float64
exactly.

Semantics, shared by every backend:

* A masked query token contributes 0; a masked document token never wins a max.
* A document with no real token scores ``-inf`` (whatever the query).
* If any similarity between a real query token and a real document token is NaN or +-inf,
  the score is NaN.
"""

from __future__ import annotations

import numpy as np


def _float64(x) -> np.ndarray:
    array = np.asarray(x)
    return array.astype(np.float64)


def _bool(mask, shape) -> np.ndarray:
    return np.ones(shape, bool) if mask is None else np.asarray(mask).astype(bool)


def maxsim_one(q: np.ndarray, q_real: np.ndarray, d: np.ndarray, d_real: np.ndarray) -> float:
    """Score of one query (Lq, D) against one document (Ld, D), both float64."""
    if not d_real.any():
        return -np.inf
    sims = q[q_real] @ d[d_real].T
    if not np.isfinite(sims).all():
        return np.nan
    return float(sims.max(axis=1).sum()) if sims.shape[0] else 0.0


def maxsim_reference(q, d, q_mask=None, d_mask=None) -> np.ndarray:
    """Scores of queries q ``(Nq, Lq, D)`` (or one query ``(Lq, D)``) against padded documents
    d ``(Nd, Ld, D)``: float64 ``(Nq, Nd)`` (or ``(Nd,)``)."""
    q, d = _float64(q), _float64(d)
    single = q.ndim == 2
    if single:
        q = q[None]
        q_mask = None if q_mask is None else np.asarray(q_mask)[None]
    q_real = _bool(q_mask, q.shape[:2])
    d_real = _bool(d_mask, d.shape[:2])
    out = np.empty((q.shape[0], d.shape[0]))
    for i in range(q.shape[0]):
        for n in range(d.shape[0]):
            out[i, n] = maxsim_one(q[i], q_real[i], d[n], d_real[n])
    return out[0] if single else out


def maxsim_pairs_reference(q, d, q_mask=None, d_mask=None) -> np.ndarray:
    """Scores of aligned pairs: q ``(B, Lq, D)`` with d ``(B, Ld, D)`` -> float64 ``(B,)``."""
    q, d = _float64(q), _float64(d)
    q_real = _bool(q_mask, q.shape[:2])
    d_real = _bool(d_mask, d.shape[:2])
    return np.array([maxsim_one(q[b], q_real[b], d[b], d_real[b]) for b in range(q.shape[0])])


def maxsim_packed_reference(q, tokens, offsets, q_mask=None) -> np.ndarray:
    """Scores against packed documents: tokens ``(T, D)``, document n is
    ``tokens[offsets[n]:offsets[n+1]]``. Returns float64 ``(Nq, Nd)`` (or ``(Nd,)``)."""
    q, tokens = _float64(q), _float64(tokens)
    offsets = np.asarray(offsets).astype(np.int64)
    single = q.ndim == 2
    if single:
        q = q[None]
        q_mask = None if q_mask is None else np.asarray(q_mask)[None]
    q_real = _bool(q_mask, q.shape[:2])
    num_docs = len(offsets) - 1
    out = np.empty((q.shape[0], num_docs))
    for n in range(num_docs):
        doc = tokens[offsets[n]:offsets[n + 1]]
        real = np.ones(len(doc), bool)
        for i in range(q.shape[0]):
            out[i, n] = maxsim_one(q[i], q_real[i], doc, real)
    return out[0] if single else out


def maxsim_argmax_reference(q, d, q_mask=None, d_mask=None) -> np.ndarray:
    """Winners ``(Nq, Nd, Lq)`` int64 of queries against padded documents, in float64: the
    first document token reaching each max; -1 for a masked query token or a document with no
    real token."""
    q, d = _float64(q), _float64(d)
    q_real = _bool(q_mask, q.shape[:2])
    d_real = _bool(d_mask, d.shape[:2])
    out = np.full((q.shape[0], d.shape[0], q.shape[1]), -1, np.int64)
    for i in range(q.shape[0]):
        for n in range(d.shape[0]):
            if not d_real[n].any():
                continue
            sims = np.where(d_real[n][None, :], q[i] @ d[n].T, -np.inf)
            out[i, n] = np.where(q_real[i], sims.argmax(axis=1), -1)
    return out


def maxsim_backward_reference(grad, q, d, argmax):
    """Float64 gradients (dq, dd) of scores ``(Nq, Nd)`` with respect to q ``(Nq, Lq, D)`` and
    padded d ``(Nd, Ld, D)``, given the winners ``argmax (Nq, Nd, Lq)`` (-1: none), loop by loop:
    dq[i, t] += g[i, n] d[n, a]; dd[n, a] += g[i, n] q[i, t] for every a = argmax[i, n, t] >= 0."""
    grad, q, d = _float64(grad), _float64(q), _float64(d)
    argmax = np.asarray(argmax).astype(np.int64)
    dq, dd = np.zeros_like(q), np.zeros_like(d)
    for i in range(q.shape[0]):
        for n in range(d.shape[0]):
            for t in range(q.shape[1]):
                a = argmax[i, n, t]
                if a >= 0:
                    dq[i, t] += grad[i, n] * d[n, a]
                    dd[n, a] += grad[i, n] * q[i, t]
    return dq, dd
