"""The scoring functions: score, score_pairs, score_packed (validate, then a backend).

Each call is validated into one :class:`~cupy_maxsim._problem.ScoreProblem`; host inputs run on
the NumPy backend (_cpu.py), device inputs on the CUDA kernels (_forward.py). A ``score`` call
of torch CUDA tensors or CuPy arrays is replayed after its first call of the same signature
(_replay.py).
"""

from __future__ import annotations

from . import _arrays, _cpu, _forward, _replay
from ._problem import ScoreProblem, candidates_as_pairs, packed_problem, pairs_problem, padded_problem
from .tuning import current


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
    replay_key, extras = _replay.score_key(q, d, return_argmax, q_mask, d_mask, q_scale, d_scale)
    result = _replay.replayed(replay_key, q, d, extras)
    if result is not None:
        return result
    problem = padded_problem(q, d, q_mask, d_mask, q_scale, d_scale, return_argmax)
    if not problem.q.on_gpu:
        return _on_host(problem)
    tunables = current()
    # Float queries against int8 documents are quantised per call (a temporary the launch
    # reads): those calls are not replayed.
    replayable = replay_key is not None and (problem.q_scale is None or problem.like.dtype == "int8")
    record = [] if replayable else None
    result = _forward.run(problem, tunables, record)
    if record:
        _replay.replays.put(replay_key, _replay.Replay.recorded(problem, tunables, record[0]))
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
    problem = pairs_problem(q, d, q_mask, d_mask, q_scale, d_scale, return_argmax)
    if not problem.q.on_gpu:
        return _on_host(problem)
    return _forward.run(problem, current())


def score_candidates(q, d, *, q_mask=None, d_mask=None, q_scale=None, d_scale=None, return_argmax=False):
    """MaxSim scores of each query against its own K candidate documents (distillation, hard
    negatives: the layout of PyLate's ``colbert_kd_scores`` and colpali-engine's ``maxsim_kd``).

    Parameters
    ----------
    q : array, shape (Nq, Lq, D)
    d : array, shape (Nq, K, Ld, D)
        Query n's candidates ``d[n]``; same dtype and device as ``q``.
    q_mask : bool array, shape (Nq, Lq), optional
    d_mask : bool array, shape (Nq, K, Ld), optional
    q_scale, d_scale : float32 arrays, shapes (Nq, Lq) and (Nq, K, Ld), optional
        int8 scales, as in :func:`score`.
    return_argmax : bool, optional
        Also return the winners, shape (Nq, K, Lq).

    Returns
    -------
    scores : array, shape (Nq, K)
        Same rules as :func:`score`. (Scored as aligned pairs with the queries repeated K
        times, a copy of Nq * K * Lq * D elements; a kernel layout of its own is issue 26.)
    """
    q_pairs, d_pairs, (q_mask, q_scale), (d_mask, d_scale) = candidates_as_pairs(q, d, (q_mask, q_scale),
                                                                                (d_mask, d_scale))
    result = score_pairs(q_pairs, d_pairs, q_mask=q_mask, d_mask=d_mask, q_scale=q_scale, d_scale=d_scale,
                         return_argmax=return_argmax)
    num_queries, candidates = d.shape[:2]
    if not return_argmax:
        return _arrays.reshaped(result, (num_queries, candidates))
    return _arrays.reshaped(result[0], (num_queries, candidates)), _arrays.reshaped(result[1], (num_queries, candidates, -1))


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

    return score_packed_with_bounds(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax)[0]


def score_packed_with_bounds(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax, checked_offsets=None):
    """(:func:`score_packed`'s result, its offsets' checked bounds (first, last, longest)): an
    adapter hands the bounds on to :func:`~cupy_maxsim.training.backward_plan`, which then need
    not check (and, on a GPU, wait for the stream) again; an Index passes its store's bounds in
    (``checked_offsets``) for the same reason."""
    problem, bounds = packed_problem(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax, checked_offsets)
    return score_problem(problem), bounds


def score_problem(problem: ScoreProblem):
    """The scores (and winners) of a validated problem: the NumPy backend for host inputs, the
    kernels for device ones. search scores a problem it validated itself whole (one block of
    every document) through this, not validating it again."""
    if not problem.q.on_gpu:
        return _on_host(problem)
    return _forward.run(problem, current())


def _on_host(problem: ScoreProblem):
    """The NumPy backend's results in the caller's framework: scores, or (scores, argmax)."""
    host = lambda operand: None if operand is None else operand.host  # noqa: E731
    q, d, winners = problem.q.host, problem.d.host, problem.argmax_dtype is not None
    scales = host(problem.q_scale), host(problem.d_scale)
    if problem.offsets is not None:
        out = _cpu.score_packed(q, d, problem.offsets.host, host(problem.q_mask), *scales, with_argmax=winners)
    else:
        score_fn = _cpu.score_pairs if problem.pairs else _cpu.score_padded
        out = score_fn(q, d, host(problem.q_mask), host(problem.d_mask), *scales, with_argmax=winners)
    output = _arrays.Output(problem.like)
    single = problem.single
    if not winners:
        return output.wrap(out[0] if single else out)
    scores, argmax = out
    argmax = argmax.astype(problem.argmax_dtype)
    return output.wrap(scores[0] if single else scores), output.wrap(argmax[0] if single else argmax)
