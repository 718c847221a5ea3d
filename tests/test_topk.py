"""Search's selection in rounds (cupy_maxsim._topk) against the order written out, on the CPU:
each round by a NumPy model of maxsim_topk.cu (its radix select over order keys, then the
compaction in index order), so that the rounds and the kernel's algorithm are checked without
a GPU; the GPU test (test_search.py) runs the kernel itself. Also: the kernel's constants
agree with Python's."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from cupy_maxsim import _topk

SOURCE = (Path(__file__).parent.parent / "kernels_cu" / "maxsim_topk.cu").read_text()


def _keys(values, classes):
    """maxsim_topk.cu's topk_key, elementwise."""
    bits = np.where(values == 0, np.float32(0), values).astype(np.float32).view(np.uint32)  # -0.0 as 0.0
    flipped = np.where(bits & 0x80000000, ~bits, bits | 0x80000000).astype(np.uint32)
    keys = np.where(np.isnan(values), np.uint32(2), flipped)
    return np.where(classes == _topk.LIVE, keys, classes.astype(np.uint32))


def model_select(scores, k, segment_length, allowed, positions, ranked=False):
    """A NumPy model of one launch of maxsim_topk_select (the kernel's steps, not a sort;
    ``ranked``: then topk_rank's order of (~key, position) pairs)."""
    rows, n = scores.shape
    width = n if positions is None else positions.shape[1]
    segments = -(-width // segment_length)
    chosen = np.full((rows, segments, k), -1, np.int32)
    for r in range(rows):
        at = np.arange(n) if positions is None else positions[r]  # each element's row position
        live = np.ones(n, bool) if allowed is None else allowed
        classes = np.where(at < 0, _topk.PADDING, np.where(live[np.maximum(at, 0)], _topk.LIVE, _topk.EXCLUDED))
        values = scores[r, np.maximum(at, 0)]
        for s in range(segments):
            first = s * segment_length
            length = min(segment_length, width - first)
            if length <= k:
                chosen[r, s, :length] = at[first:first + length]
                continue
            keys = _keys(values[first:first + length], classes[first:first + length])
            prefix, mask, remaining = 0, 0, k
            for shift in (24, 16, 8, 0):
                counted = (keys & mask) == prefix
                histogram = np.bincount((keys[counted] >> shift) & 0xFF, minlength=256)
                digit, above = 255, 0
                while digit > 0 and above + histogram[digit] < remaining:
                    above += histogram[digit]
                    digit -= 1
                prefix |= digit << shift
                remaining -= above
                mask |= 0xFF << shift
            above, equal = keys > prefix, keys == prefix
            place = np.cumsum(above) - above + np.minimum(np.cumsum(equal) - equal, remaining)  # the kernel's
            take = above | (equal & (np.cumsum(equal) - equal < remaining))
            assert take.sum() == k
            chosen[r, s, place[take]] = at[first:first + length][take]
        if ranked:
            assert segments == 1
            at_chosen = chosen[r, 0]
            keys = np.where(at_chosen < 0, np.uint32(_topk.PADDING),
                            _keys(scores[r, np.maximum(at_chosen, 0)],
                                  np.where(live[np.maximum(at_chosen, 0)], _topk.LIVE, _topk.EXCLUDED)))
            slots = (~keys.astype(np.uint64) & np.uint64(0xFFFFFFFF)) << np.uint64(32) | at_chosen.astype(np.uint32)
            chosen[r, 0] = (np.sort(slots) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    return chosen


def model_wide(scores, k, allowed, chunk, above_order=None):
    """A NumPy model of maxsim_topk.cu's wide selection (its steps, not a sort): each radix pass
    counted by blocks of ``chunk`` elements into the row's histogram, the prefix walked from the
    histograms so far; the k written (those above T in ``above_order``'s order of blocks, as the
    counter's atomics may hand out slots; those equal to T through the blocks' last-pass counts);
    then each ranked by counting the (~key, position) pairs before it. -> (rows, k) int32."""
    rows, n = scores.shape
    blocks = -(-n // chunk)
    live = np.ones(n, bool) if allowed is None else allowed
    chosen = np.full((rows, k), -1, np.int32)
    for r in range(rows):
        keys = _keys(scores[r], np.where(live, _topk.LIVE, _topk.EXCLUDED)).astype(np.uint32)
        histograms, block_counts = [], None

        def walk(passes):
            prefix, remaining = 0, k
            for p in range(passes):
                histogram, digit, above = histograms[p], 255, 0
                while digit > 0 and above + histogram[digit] < remaining:
                    above += histogram[digit]
                    digit -= 1
                prefix |= digit << (24 - 8 * p)
                remaining -= above
            return prefix, remaining

        for p in range(4):
            prefix, _ = walk(p)
            mask = 0 if p == 0 else (0xFFFFFFFF << (32 - 8 * p)) & 0xFFFFFFFF
            counts = [np.bincount((keys[b * chunk:(b + 1) * chunk][(keys[b * chunk:(b + 1) * chunk] & mask) == prefix]
                                   >> (24 - 8 * p)) & 0xFF, minlength=256) for b in range(blocks)]
            histograms.append(np.sum(counts, axis=0))
            block_counts = counts
        threshold, remaining = walk(4)
        candidates = np.full(k, -1, np.int64)
        slot = 0
        for b in (range(blocks) if above_order is None else above_order(blocks)):
            for i in np.flatnonzero(keys[b * chunk:(b + 1) * chunk] > threshold) + b * chunk:
                candidates[slot] = i
                slot += 1
        assert slot == k - remaining
        for b in range(blocks):
            equal_before = sum(int(block_counts[c][threshold & 0xFF]) for c in range(b))
            for i in np.flatnonzero(keys[b * chunk:(b + 1) * chunk] == threshold) + b * chunk:
                if equal_before < remaining:
                    candidates[k - remaining + equal_before] = i
                equal_before += 1
        assert (candidates >= 0).all() and np.unique(candidates).size == k
        pairs = (~keys[candidates].astype(np.uint64) & np.uint64(0xFFFFFFFF)) << np.uint64(32) | candidates.astype(np.uint64)
        for i in range(k):
            chosen[r, int((pairs < pairs[i]).sum())] = candidates[i]
    return chosen


def _expected(values, allowed, k, ranked=False):
    """Each row's k best positions by the order written out, increasing (``ranked``: in that
    order)."""
    out = []
    for row in values:
        def rank(i):
            if allowed is not None and not allowed[i]:
                return (2, 0.0, i)
            if np.isnan(row[i]):
                return (1, 0.0, i)
            return (0, -float(row[i]), i)
        best = sorted(range(row.shape[0]), key=rank)[:k]
        out.append(best if ranked else sorted(best))
    return np.array(out, np.int64)


@pytest.mark.parametrize("seed", range(12))
def test_rounds_of_the_model_give_each_rows_k_best(seed, monkeypatch):
    monkeypatch.setattr(_topk, "MIN_SEGMENT", 1)  # segments of 4k: many rounds
    rng = np.random.default_rng(seed)
    rows, n = int(rng.integers(1, 5)), int(rng.integers(50, 4000))
    k = int(rng.integers(1, n))
    values = np.round(rng.standard_normal((rows, n)), int(rng.integers(0, 3))).astype(np.float32)  # ties
    values[rng.random((rows, n)) < 0.02] = np.nan
    values[rng.random((rows, n)) < 0.02] = -np.inf
    values[rng.random((rows, n)) < 0.01] = np.inf
    allowed = None if seed % 3 == 0 else rng.random(n) < 0.8
    blocks = int(rng.integers(1, 300))
    ranked_max = (0, k - 1, k, n)[seed % 4]  # no room to rank the last round, one short, just, plenty
    got, ranked = _topk.top_k_positions(np, values, k, allowed, model_select, blocks, ranked_max)
    assert ranked == (k <= ranked_max)
    np.testing.assert_array_equal(got, _expected(values, allowed, k, ranked))


@pytest.mark.parametrize("seed", range(12))
def test_the_wide_model_gives_each_rows_k_best_in_rank_order(seed):
    """The wide selection's algorithm (model_wide) against the order written out: ties (values
    rounded), NaN, infinities, exclusions, k from 1 to n - 1, rows over many blocks, slots above
    T handed out in any order of blocks."""
    rng = np.random.default_rng(seed)
    rows, n = int(rng.integers(1, 4)), int(rng.integers(2, 3000))
    k = int(rng.integers(1, n))
    values = np.round(rng.standard_normal((rows, n)), int(rng.integers(0, 3))).astype(np.float32)
    values[rng.random((rows, n)) < 0.02] = np.nan
    values[rng.random((rows, n)) < 0.02] = -np.inf
    values[rng.random((rows, n)) < 0.01] = np.inf
    allowed = None if seed % 3 == 0 else rng.random(n) < (0.8, 0.01)[seed % 2]  # (few allowed: T among the excluded)
    chunk = int(rng.integers(1, 600))
    order = None if seed % 2 else (lambda blocks: range(blocks - 1, -1, -1))
    np.testing.assert_array_equal(model_wide(values, k, allowed, chunk, order), _expected(values, allowed, k, True))


def test_the_wide_selection_is_taken_for_long_rows_it_can_rank():
    """top_k_positions hands rows longer than wide_min to the wide selection where k <=
    ranked_max, and to the rounds otherwise or where the wide selection cannot take them."""
    values = np.random.default_rng(1).standard_normal((2, 500)).astype(np.float32)
    wide = lambda scores, k, allowed: model_wide(scores, k, allowed, 64)  # noqa: E731
    for wide_min, ranked_max, taken, fits in ((499, 10, True, True), (500, 10, False, True), (-1, 10, False, True),
                                              (0, 9, False, True), (0, 10, False, False)):
        calls = []

        def counted(*args):
            calls.append("wide")
            return wide(*args) if fits else None  # (None: the GPU cannot hold a block a row)

        got, ranked = _topk.top_k_positions(np, values, 10, None, model_select, 4, ranked_max, counted, wide_min)
        assert (calls == ["wide"]) == (taken or not fits) and ranked == (taken or 10 <= ranked_max)
        np.testing.assert_array_equal(got, _expected(values, None, 10, ranked))


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(8))
def test_the_wide_kernel_gives_each_rows_k_best_in_rank_order(seed, monkeypatch):
    """maxsim_topk.cu's wide selection on the GPU against the order written out: rows over
    several chunks (4k elements each), a chunk a block or (odd seeds: a GPU said to hold two
    blocks a row) several, ties, NaN, infinities, exclusions, k up to 8192."""
    import cupy

    from cupy_maxsim._gpu import launch

    rng = np.random.default_rng(200 + seed)
    rows, n = (1, 3, 1, 2, 5, 1, 2, 1)[seed], (4097, 20000, 50000, 9000, 12345, 100, 30000, 70000)[seed]
    if seed % 2:
        monkeypatch.setattr(launch, "resident_blocks", lambda *args: 2 * rows)
    values = np.round(rng.standard_normal((rows, n)), (0, 1, 2, 3, 1, 0, 2, 6)[seed]).astype(np.float32)
    values[rng.random((rows, n)) < 0.01] = np.nan
    values[rng.random((rows, n)) < 0.01] = -np.inf
    values[rng.random((rows, n)) < 0.005] = np.inf
    allowed = None if seed % 3 == 0 else rng.random(n) < (0.8, 0.02)[seed % 2]
    for k in sorted({1, 10, min(n - 1, 1000), min(n - 1, 2048), min(n - 1, launch.TOPK_RANKED_MAX)}):
        got = launch.top_k_wide(cupy.asarray(values), k, None if allowed is None else cupy.asarray(allowed))
        np.testing.assert_array_equal(cupy.asnumpy(got), _expected(values, allowed, k, True), err_msg=f"k={k}")


def test_negative_zero_and_zero_tie_to_the_lower_position():
    """-0.0 and 0.0 are equal scores with different bits: one key, so their tie goes to the
    lower position, as in a sort of the floats."""
    values = np.array([[1.0, -0.0, 0.0, -1.0]], np.float32)
    assert _topk.top_k_positions(np, values, 2, None, model_select, 1)[0].tolist() == [[0, 1]]
    assert _topk.top_k_positions(np, values, 2, None, model_select, 1, 2)[0].tolist() == [[0, 1]]
    assert "score == 0.f ? 0u" in SOURCE  # the kernel's key does the same


def model_merge(a_scores, a_ids, b_scores, b_ids, k):
    """A NumPy model of maxsim_topk_merge (its binary searches, not a sort): (order, scores, ids)."""
    rows, ka = a_scores.shape
    kb = b_scores.shape[1]
    k = min(k, ka + kb)
    key = lambda s, i: _keys(s, np.where(i >= 0, _topk.LIVE, _topk.EXCLUDED)).astype(np.int64)  # noqa: E731
    order = np.full((rows, k), -9, np.int64)
    for row in range(rows):
        a, b = key(a_scores[row], a_ids[row]), key(b_scores[row], b_ids[row])
        for i in range(ka + kb):
            in_a = i < ka
            mine, other = (a[i], b) if in_a else (b[i - ka], a)
            low, high = 0, other.shape[0]
            while low < high:
                middle = (low + high) // 2
                if (other[middle] > mine) if in_a else (other[middle] >= mine):
                    low = middle + 1
                else:
                    high = middle
            rank = (i if in_a else i - ka) + low
            if rank < k:
                order[row, rank] = i
    assert (order >= 0).all()  # every rank below k written once
    both = lambda x, y: np.concatenate([x, y], axis=1)  # noqa: E731
    return (order, np.take_along_axis(both(a_scores, b_scores), order, 1), np.take_along_axis(both(a_ids, b_ids), order, 1))


def _two_lists(rng, rows, ka, kb, excluding):
    """Two rows of search candidates as the blocks give them: each list in search's order
    (search._best_of), the second's ids above the first's; scores with ties, -0.0, -inf, NaN."""
    from cupy_maxsim.search import _best_of

    pool = np.array([1.5, 0.5, 0.0, -0.0, -1.0, -np.inf, np.nan], np.float32)
    lists = []
    for first, count in ((0, ka), (ka + 7, kb)):
        scores = np.where(rng.random((rows, count)) < 0.5, pool[rng.integers(0, pool.size, (rows, count))],
                          rng.standard_normal((rows, count)).astype(np.float32))
        ids = np.broadcast_to(np.arange(first, first + count, dtype=np.int64), (rows, count))
        if excluding:
            ids = np.where(rng.random((rows, count)) < 0.2, -1, ids)
        lists.append(_best_of(np, scores.astype(np.float32), ids, None, count, excluding)[:2])
    return lists


def _dropped(scores, ids):
    """Results as search answers them: excluded candidates (id -1) as -inf, -1."""
    return np.where(ids >= 0, scores, -np.inf), np.where(ids >= 0, ids, -1)


@pytest.mark.parametrize("seed", range(40))
def test_the_merge_model_is_searchs_sort_of_the_joined_lists(seed):
    from cupy_maxsim.search import _best_of, _joined

    rng = np.random.default_rng(seed)
    excluding = seed % 2 == 1
    ka, kb = int(rng.integers(1, 40)), int(rng.integers(1, 40))
    k = int(rng.integers(1, ka + kb + 5))
    (a_scores, a_ids), (b_scores, b_ids) = _two_lists(rng, 3, ka, kb, excluding)
    _, scores, ids = model_merge(a_scores, a_ids, b_scores, b_ids, k)
    want = _best_of(np, *_joined(np, (a_scores, a_ids, None), (b_scores, b_ids, None)), k, excluding)
    np.testing.assert_array_equal(_dropped(scores, ids)[1], _dropped(*want[:2])[1])
    np.testing.assert_array_equal(_dropped(scores, ids)[0], _dropped(*want[:2])[0])


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(6))
def test_the_merge_kernel_is_the_model(seed):
    import cupy

    from cupy_maxsim._gpu import launch

    rng = np.random.default_rng(100 + seed)
    ka, kb = (1, 300, 700, 5000, 64, 2)[seed], (1, 300, 1, 4000, 900, 9000)[seed]
    (a_scores, a_ids), (b_scores, b_ids) = _two_lists(rng, 4, ka, kb, seed % 2 == 1)
    for k in (1, min(ka, kb), ka + kb, ka + kb + 3):
        got = launch.top_k_merge(*(cupy.asarray(np.ascontiguousarray(x)) for x in (a_scores, a_ids, b_scores, b_ids)), k)
        want = model_merge(a_scores, a_ids, b_scores, b_ids, k)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(cupy.asnumpy(g), w)


def test_the_kernels_constants_agree_with_python():
    from cupy_maxsim._gpu import launch

    define = lambda name: int(re.search(rf"#define {name} (\d+)", SOURCE).group(1))  # noqa: E731
    assert (define("TOPK_PADDING"), define("TOPK_EXCLUDED"), define("TOPK_LIVE")) == (
        _topk.PADDING, _topk.EXCLUDED, _topk.LIVE)
    assert (define("TOPK_THREADS"), define("TOPK_CACHED_KEYS")) == (launch.TOPK_THREADS, launch.TOPK_CACHED_KEYS)
    assert (define("TOPK_FINISH_THREADS"), define("TOPK_MERGE_THREADS")) == (
        launch.TOPK_FINISH_THREADS, launch.TOPK_MERGE_THREADS)
    assert (define("TOPK_ITEMS"), define("TOPK_WIDE_PASSES")) == (launch.TOPK_ITEMS, launch.TOPK_WIDE_PASSES)
    assert re.search(r"#define TOPK_WIDE_CHUNK \(TOPK_THREADS \* TOPK_ITEMS\)", SOURCE)
    assert launch.TOPK_WIDE_CHUNK == launch.TOPK_THREADS * launch.TOPK_ITEMS
    assert re.search(r"#define TOPK_WIDE_HEAD \(TOPK_WIDE_PASSES \* 256 \+ 1\)", SOURCE)
    assert launch.TOPK_WIDE_HEAD == launch.TOPK_WIDE_PASSES * 256 + 1
    assert re.search(r"#define TOPK_RANKED_MAX \(TOPK_CACHED_KEYS / 2\)", SOURCE)
    assert launch.TOPK_RANKED_MAX == launch.TOPK_CACHED_KEYS // 2


def test_a_short_row_is_one_round():
    """Below MIN_SEGMENT a row is one segment: one launch, whatever the GPU's size (each round
    costs host time: profile-search-2026-12-01)."""
    launches = []

    def counted(*args):
        launches.append(args[2])
        return model_select(*args)

    values = np.random.default_rng(0).standard_normal((2, 10_000)).astype(np.float32)
    got, ranked = _topk.top_k_positions(np, values, 10, None, counted, 264)
    np.testing.assert_array_equal(got, _expected(values, None, 10))
    assert not ranked
    assert launches == [_topk.MIN_SEGMENT]
