"""Exact top-k search: the k best documents of a corpus for each query, never the whole score
matrix.

The corpus is scored in blocks of documents whose (queries x block) scores fit a bounded
workspace, and each block's best are merged into a running top-k (issue 25's first layer; the
fused selection in the kernels' epilogue comes next, behind the same functions). Order: by
descending score, ties to the lower document id; documents scoring ``-inf`` (no real token)
after every real one, NaN after those; where the corpus has fewer than k documents the rest
are id -1 with score ``-inf``.
"""

from __future__ import annotations

import contextlib

import numpy as np

from . import _arrays, _replay, _topk, scoring, tuning
from ._problem import packed_problem, padded_problem
from ._topk import along_rows, stable_argsort

#: Bytes the per-block scores (and winners) may take: the workspace bound of a search.
WORKSPACE_BYTES = 64 * 2**20


def search(q, d, k, *, q_mask=None, d_mask=None, q_scale=None, d_scale=None, return_argmax=False,
           workspace_bytes=WORKSPACE_BYTES):
    """The ``k`` best documents of a padded corpus for each query.

    Parameters
    ----------
    q, d, q_mask, d_mask, q_scale, d_scale
        As in :func:`cupy_maxsim.score`: queries (Lq, D) or (Nq, Lq, D), documents (Nd, Ld, D).
    k : int
        Documents returned per query, at least 1; more than Nd pads with id -1.
    return_argmax : bool, optional
        Also return the winning document token of every query token for each hit (the
        token-level explanation), shape (k, Lq) or (Nq, k, Lq); -1 where there is none.
    workspace_bytes : int, optional
        The most bytes a block's scores (and winners) take; the corpus is scored in as many
        blocks as that needs.

    Returns
    -------
    scores : array, shape (k,) or (Nq, k)
        float32 (float64 for float64 inputs), sorted by descending score, ties to the lower id.
    ids : int64 array, same shape
        Document indices into ``d``; -1 past the corpus.
    """
    k = _check_k(k)
    # A repeated call of GPU arrays is replayed whole (_replay.SearchReplay: the forward, the
    # selection and the finish with new pointers) where its first call scored one block.
    forward_key, extras = _replay.score_key(q, d, False, q_mask, d_mask, q_scale, d_scale)
    key = None if forward_key is None or return_argmax else forward_key + (k, workspace_bytes)
    replay = _replay.search_replays.get(key)
    found = None if replay is None else replay(q, d, extras)
    if found is not None:
        return found
    recorder = _replay.SearchRecorder() if key is not None and key not in _replay.search_replays else None
    problem = padded_problem(q, d, q_mask, d_mask, q_scale, d_scale, return_argmax)

    def block(start, stop):
        return scoring.score(q, d[start:stop], q_mask=q_mask, d_mask=None if d_mask is None else d_mask[start:stop],
                             q_scale=q_scale, d_scale=None if d_scale is None else d_scale[start:stop],
                             return_argmax=return_argmax)

    result = _top_k(problem, block, k, workspace_bytes, tape=None if recorder is None else recorder.selection)
    if recorder is not None:
        _replay.search_replays.put(key, recorder.replay(problem, _replay.replays.get(forward_key)))
    return result


def search_packed(q, tokens, offsets, k, *, q_mask=None, q_scale=None, d_scale=None, return_argmax=False,
                  workspace_bytes=WORKSPACE_BYTES):
    """:func:`search` over packed documents, as :func:`cupy_maxsim.score_packed` takes them
    (tokens (T, D), offsets (Nd + 1,)); ids index the documents of ``offsets``."""
    k = _check_k(k)
    problem, _ = packed_problem(q, tokens, offsets, q_mask, q_scale, d_scale, return_argmax)

    def block(start, stop):  # a slice of the offsets is the same tokens' documents start..stop
        # One block of every document: the problem validated above, offsets and all (on a GPU
        # their check is a read back and a wait for the stream: once, not twice).
        if (start, stop) == (0, problem.num_docs):
            return scoring.score_problem(problem)
        return scoring.score_packed_with_bounds(q, tokens, offsets[start:stop + 1], q_mask, q_scale, d_scale,
                                                return_argmax)[0]

    return _top_k(problem, block, k, workspace_bytes)


def _check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    return int(k)


def _top_k(problem, block, k, workspace_bytes, allowed=None, ranges=None, ids=None, tape=None):
    """Score ``problem``'s documents block by block (``block(start, stop)`` -> the scoring
    function's result for documents start..stop) and keep each query's k best; ``tape``: a
    _gpu.tape.Tape that records the selection and the finish of a one-block GPU search (the
    block's scores its input), replayable where that path answered; ``allowed``: a
    boolean array over the documents (on their device), False never returned (an Index's
    removed and filtered-out documents); ``ranges``: the blocks' (start, stop), where the
    caller cuts them (a streamed corpus: by its buffers), else by ``workspace_bytes``; ``ids``:
    what to answer for each document (an Index's own ids, int64 on the results' device), else
    its position."""
    if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, (int, np.integer)) or workspace_bytes < 1:
        raise ValueError(f"workspace_bytes must be a positive int, got {workspace_bytes!r}")
    like, num_docs = problem.like, problem.num_docs
    num_queries, query_length = problem.q.shape[0], problem.q.shape[1]
    winners = problem.argmax_dtype is not None
    per_block = docs_per_block(num_queries, query_length, winners, workspace_bytes)
    xp = _arrays.module_of(like)
    stream = _gpu_stream(like)
    best = None  # (scores, ids, winners or None), each query's best so far, sorted
    last_stop = 0  # (blocks in document order: each block's ids above the best's)
    with stream:
        if ranges is None:
            ranges = [(start, min(num_docs, start + per_block)) for start in range(0, num_docs, per_block)]
        for start, stop in ranges:
            result = block(start, stop)
            scores, argmax = (result if winners else (result, None))
            scores = _as_xp(scores, problem.single)
            argmax = None if argmax is None else _as_xp(argmax, problem.single).astype(problem.argmax_dtype)
            live = None if allowed is None else allowed[start:stop]
            one_block = len(ranges) == 1 and not winners
            with (tape.recording((scores,), (live, ids)) if tape is not None and one_block and xp is not np
                  else contextlib.nullcontext()):
                local, ranked = _selected(xp, scores, k, live)  # (rows, k) int32 indices into the block, or None: all
                if ranked and one_block:
                    # The whole answer in one launch: nothing compiles on a first search, nothing waits.
                    from ._gpu.launch import top_k_finish

                    out = top_k_finish(xp.ascontiguousarray(scores), local, start, live, ids) + (None,)
                    if tape is not None:
                        tape.answered(out[0], out[1])
                    break
            if local is None:
                found = xp.broadcast_to(xp.arange(start, stop, dtype=xp.int64), scores.shape)
            else:
                local = local.astype(xp.int64)
                scores, found = along_rows(xp, scores, local), local + start
                argmax = None if argmax is None else xp.take_along_axis(argmax, local[..., None], axis=1)
            if live is not None:  # an excluded document's id becomes -1: it sorts last, then is dropped
                found = xp.where(live if local is None else live[local], found, -1)
            # (the selection's last round ranked them: no sort, which would wait for the stream)
            candidate = (scores, found, argmax) if ranked else _best_of(xp, scores, found, argmax, k, allowed is not None)
            del result, scores, found, argmax  # (this block's workspace free before the next block's is taken)
            best = candidate if best is None else _merged(xp, best, candidate, k, allowed is not None, start >= last_stop)
            last_stop = stop
        else:
            out = _padded(xp, best, k, num_queries, query_length, problem, winners)
            if ids is not None:
                out = (out[0], mapped_ids(xp, out[1], ids), out[2])
    output = _arrays.Output(like)
    results = [output.wrap(x[0] if problem.single else x) for x in out if x is not None]
    return tuple(results)


def mapped_ids(xp, positions, ids):
    """``ids[positions]``, -1 where a position is -1 (nothing there): search's answer in an
    Index's own ids (the finishing kernel does the same on the GPU's one-block path)."""
    return xp.where(positions >= 0, ids[xp.maximum(positions, 0)], -1)


def docs_per_block(num_queries: int, query_length: int, winners: bool, workspace_bytes: int) -> int:
    """Documents a block of the search may hold: their scores and ids (and winners) within
    ``workspace_bytes``, at least one."""
    per_doc = num_queries * (8 + (4 * query_length if winners else 0))
    return max(1, workspace_bytes // max(1, per_doc))


def _selected(xp, scores, k, live):
    """On the GPU, the indices (rows, k) of each row's k best by the selection kernel (_topk: the
    same order as _best_of, excluded documents of ``live`` last), and whether they are in that
    order (else increasing), so that _best_of sorts k candidates a row, or nothing, rather than
    the whole block; (None, False) where the block is no longer than k, on the CPU, and for
    float64 scores."""
    rows, n = scores.shape
    if xp is np or scores.dtype != np.float32 or n <= k or n >= 2**31 or rows > 65535:
        return None, False
    from ._gpu.device import device_properties
    from ._gpu.launch import TOPK_RANKED_MAX, top_k_select, top_k_wide

    sms = device_properties(scores.device.id)[0]
    return _topk.top_k_positions(xp, xp.ascontiguousarray(scores), k, live, top_k_select, 2 * sms, TOPK_RANKED_MAX,
                                 top_k_wide, tuning.current().search_wide_select_min)


def _gpu_stream(like) -> contextlib.ExitStack:
    """CuPy's work on the caller's device and stream (torch's current one for torch tensors)."""
    stack = contextlib.ExitStack()
    if like.on_gpu:
        from ._gpu.device import on_device, on_stream

        stack.enter_context(on_device(like.device))  # (no switch where it is current already)
        stack.enter_context(on_stream(like.stream))
    return stack


def _as_xp(array, single: bool):
    """A scoring result as a NumPy or CuPy array (zero-copy), with the query axis."""
    operand = _arrays.as_operand(array, "scores")
    x = operand.host if not operand.on_gpu else operand.cupy()
    return x[None] if single else x


def _best_of(xp, scores, ids, argmax, k, excluding=False):
    """The k best candidates of each row, in order: descending score, ties to the lower id (the
    candidates come in ascending id order within each row), ``-inf`` then NaN last, excluded
    candidates (id -1) after all. A stable sort of -score does all but the last: -(-inf) sorts
    after finite keys, NaN after everything; a stable sort on exclusion then keeps that order."""
    order = stable_argsort(xp, -scores)
    if excluding:  # (a third sort only where an Index excludes documents)
        excluded = along_rows(xp, ids, order) < 0
        order = along_rows(xp, order, stable_argsort(xp, excluded.astype(xp.int8)))
    order = xp.ascontiguousarray(order[:, :k])
    take = lambda x: along_rows(xp, x, order)  # noqa: E731
    chosen_argmax = None if argmax is None else xp.take_along_axis(argmax, order[..., None], axis=1)
    return take(scores), take(ids), chosen_argmax


def _merged(xp, best, candidate, k, excluding, in_order):
    """_best_of the two lists joined. On the GPU (float32 scores; ``in_order``: every id of
    ``candidate`` above every id of ``best``), one launch merges the two sorted lists: no sort,
    which would wait for the stream. Excluded candidates may come in another order among
    themselves (after every live one): they are dropped (_padded)."""
    if (xp is np or best[0].dtype != np.float32 or candidate[0].dtype != np.float32 or not in_order
            or not tuning.current().search_merge_kernel):
        return _best_of(xp, *_joined(xp, best, candidate), k, excluding)
    from ._gpu.launch import top_k_merge

    contiguous = [xp.ascontiguousarray(x) for x in (best[0], best[1], candidate[0], candidate[1])]
    order, scores, ids = top_k_merge(*contiguous, k)
    argmax = None
    if best[2] is not None:
        argmax = xp.take_along_axis(xp.concatenate([best[2], candidate[2]], axis=1), order[..., None], axis=1)
    return scores, ids, argmax


def _joined(xp, best, candidate):
    """Two rows' candidate lists as one, in ascending id order (what _best_of's ties need)."""
    scores = xp.concatenate([best[0], candidate[0]], axis=-1)
    ids = xp.concatenate([best[1], candidate[1]], axis=-1)
    order = stable_argsort(xp, ids)
    argmax = None
    if best[2] is not None:
        argmax = xp.take_along_axis(xp.concatenate([best[2], candidate[2]], axis=1), order[..., None], axis=1)
    return along_rows(xp, scores, order), along_rows(xp, ids, order), argmax


def _padded(xp, best, k, num_queries, query_length, problem, winners):
    """(scores, ids, winners) of shape (Nq, k): past the corpus, -inf and id -1 (winners -1)."""
    dtype = problem.result_dtype
    scores = xp.full((num_queries, k), -np.inf, dtype=dtype)
    ids = xp.full((num_queries, k), -1, dtype=xp.int64)
    argmax = xp.full((num_queries, k, query_length), -1, dtype=problem.argmax_dtype) if winners else None
    if best is not None:
        found = best[0].shape[1]
        real = best[1] >= 0  # excluded candidates are not results
        scores[:, :found] = xp.where(real, best[0], -np.inf)
        ids[:, :found] = best[1]
        if winners:
            argmax[:, :found] = xp.where(real[..., None], best[2], -1)
    return scores, ids, argmax


def ties_to_lower_ids(ranked, k: int, stored: int, like) -> tuple:
    """An Index's search with ties to the lower id where its ids are out of storage order (given
    ids, an id added again after its remove): the selection ties to the lower storage row, so
    ``ranked(depth)`` (the search ``depth`` deep, results in the framework of ``like``) is taken
    deep enough that every document tied with a k-th hit is in (one more than k; deeper while
    the last still ties with the k-th), then each query's hits ordered by score and id and cut
    to k, on the results' device. ``stored``: the documents stored (nothing lies deeper)."""
    depth = k + 1 if k < stored else k
    while True:
        results = ranked(depth)
        operands = [_arrays.as_operand(x, "result") for x in results]
        with _gpu_stream(like):
            xp = _arrays.module_of(operands[0])
            arrays = [x.host if not x.on_gpu else x.cupy() for x in operands]
            single = arrays[0].ndim == 1
            scores, ids = (x[None] if single else x for x in arrays[:2])
            if not k < depth < stored:  # (every stored document is in: none deeper)
                break
            level = _topk.score_keys(xp, scores)
            if not bool(((ids[:, -1] >= 0) & (level[:, -1] == level[:, k - 1])).any()):  # (a GPU's one wait)
                break
        depth = min(2 * depth, stored)
    with _gpu_stream(like):
        order = _topk.first_by_score_then_id(xp, scores, ids, k)
        out = [xp.take_along_axis(scores, order, 1), xp.take_along_axis(ids, order, 1)]
        if len(arrays) == 3:  # the winners
            out.append(xp.take_along_axis(arrays[2][None] if single else arrays[2], order[..., None], 1))
        output = _arrays.Output(like)
        return tuple(output.wrap(xp.ascontiguousarray(x[0] if single else x)) for x in out)
