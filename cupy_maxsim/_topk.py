"""Exact top-k selection in rounds: the k best of each row of a block of search scores by a
selection over segments of the row, then over the segments' candidates, until one segment
holds them (search's selection on the GPU: maxsim_topk.cu does each round; the rounds are
here, over any array module, so that the CPU tests run them against a model of the kernel).

Order (the same as search's sort): live elements by score, NaN below every score, then
excluded elements (an Index's removed or filtered-out documents), then padding; ties to the
lower position.
"""

from __future__ import annotations

import numpy as np

#: Element classes (the kernel's TOPK_PADDING, TOPK_EXCLUDED, TOPK_LIVE).
PADDING, EXCLUDED, LIVE = 0, 1, 2
#: A segment is at least this many times k: a round keeps at most 1 / SEGMENT_OVER_K of what it reads.
SEGMENT_OVER_K = 4
#: ... and at least this long: each round costs about a dozen array calls of host time (~0.3 ms
#: in CuPy), and a block reads 16k scores in a few microseconds, so a row of 10k documents is
#: one round, not five (profile-search-2026-12-01: 5 rounds of 40-element segments, 3 ms).
MIN_SEGMENT = 16384


def top_k_positions(xp, scores, k: int, allowed, select, blocks_wanted: int, ranked_max: int = 0, wide=None,
                    wide_min: int = -1):
    """The positions of the ``k`` best of each row of ``scores`` ((rows, n) float32, k < n),
    (rows, k) int32, and whether they are in rank order (the order above; else increasing).
    ``allowed``: bool (n,) or None; ``select(scores, k, segment_length, allowed, positions,
    ranked)``: one round (_gpu.launch.top_k_select's contract: the first over the rows
    themselves, the next over the row positions the round before chose, -1 padded; ``ranked``
    asked of the last round, one segment a row, where k <= ``ranked_max``); ``blocks_wanted``:
    segments a round should have over all rows (the GPU's SMs, twice); ``wide(scores, k,
    allowed)``: the wide selection (_gpu.launch.top_k_wide: every row whole, ranked; None: it
    cannot), taken for rows longer than ``wide_min`` (-1: never) where k <= ``ranked_max``.
    MIN_SEGMENT is read at the call (the tests lower it for more rounds)."""
    rows, n = scores.shape
    if wide is not None and 0 <= wide_min < n and k <= ranked_max:
        chosen = wide(scores, k, allowed)
        if chosen is not None:  # (None: more rows than the GPU holds blocks at once)
            return chosen, True
    per_row = max(1, blocks_wanted // max(1, rows))
    positions = None  # this round's elements by their row positions (None: the rows themselves)
    while True:
        width = n if positions is None else positions.shape[1]
        length = max(-(-width // per_row), SEGMENT_OVER_K * k, MIN_SEGMENT)
        last = length >= width  # one segment: the row's k best
        ranked = last and k <= ranked_max
        chosen = select(scores, k, length, allowed, positions, ranked)
        if last:
            return chosen.reshape(rows, k), ranked
        positions = chosen.reshape(rows, -1)


def along_rows(xp, values, at):
    """``values[r, at[r, j]]`` for every row r of a 2-D array (take_along_axis on the last
    axis) by one flat take: CuPy's take_along_axis spends about 0.13 ms of host time a call
    (profile-search-2026-12-01), and a small search makes a dozen. C-contiguous, like ``at``."""
    rows, n = values.shape
    flat = at if rows == 1 else at + xp.arange(0, rows * n, n, dtype=xp.int64)[:, None]
    return xp.take(values.reshape(-1), flat)


def stable_argsort(xp, keys):
    """Along the last axis, equal keys in their order (CuPy's argsort is always stable and
    takes no ``kind``): search's sorts, the rescoring's and the shards' merge."""
    return xp.argsort(keys, axis=-1, kind="stable") if xp is np else xp.argsort(keys, axis=-1)


def first_by_score_then_id(xp, scores, ids, k: int):
    """The positions of each row's k first candidates (2-D scores and ids) by descending score,
    ties to the lower id, missing (-1) last: a ShardedIndex's merge, and an Index's ties where
    its ids are out of storage order. float32 scores and ids below 2**32 (nearly always): one
    sort of a 64-bit key a candidate (the score's order in the high half, the id in the low),
    stable: a merge of the shards' runs, each in this order already (256 queries x 8 shards of
    100: 2.9 ms against the three sorts' 23, and a quicksort's 5.7); else three stable sorts
    (ids, then scores, then missing), each kept by the next."""
    if scores.dtype == np.float32 and int(ids.max(initial=-1) if xp is np else ids.max()) < 2**32:
        return stable_argsort(xp, merge_keys(xp, scores, ids))[:, :k]
    order = stable_argsort(xp, xp.where(ids < 0, np.iinfo(np.int64).max, ids))  # ids ascending
    order = xp.take_along_axis(order, stable_argsort(xp, -xp.take_along_axis(scores, order, 1)), 1)
    missing = xp.take_along_axis(ids, order, 1) < 0
    return xp.take_along_axis(order, stable_argsort(xp, missing.astype(np.int8)), 1)[:, :k]


def score_keys(xp, scores):
    """uint32 keys whose ascending order is float32 ``scores``' descending order as the
    selection kernel ranks them (kernels_cu/maxsim_topk.cu's topk_key, inverted): -0.0 as 0.0,
    NaN just after -inf; equal keys are ties."""
    bits = scores.view(np.uint32)
    bits = xp.where(bits == np.uint32(0x80000000), np.uint32(0), bits)  # (-0.0: 0.0's bits)
    # Descending order: negatives as they are, positives with every bit but the sign flipped.
    descending = bits ^ ((~(bits.view(np.int32) >> 31)).view(np.uint32) & np.uint32(0x7FFFFFFF))
    return xp.where(xp.isnan(scores), np.uint32(0xFF800001), descending)  # (just after -inf's 0xFF800000)


def merge_keys(xp, scores, ids):
    """uint64 keys whose ascending order is merge_top_k's: the high half :func:`score_keys`, the
    low half the id (0 <= id < 2**32); a missing candidate (id -1) last."""
    keys = (score_keys(xp, scores).astype(np.uint64) << np.uint64(32)) | ids.astype(np.uint64)
    return xp.where(ids < 0, np.uint64(np.iinfo(np.uint64).max), keys)
