"""search / search_packed against score plus an independent stable top-k (issue 25): every k
(past the corpus too), empty documents, ties, NaN, block sizes, winners, packed, int8, every
framework; validation. CPU here; the GPU cases are marked gpu."""

import numpy as np
import pytest

import cupy_maxsim as cm
from support import holey_mask, to_numpy, unit_rows


def expected_top_k(scores: np.ndarray, k: int):
    """Each row's k best by (real before -inf before NaN, descending score, lower id), padded
    with (-inf, -1): written out, not sorted the way search sorts."""
    rows_scores, rows_ids = [], []
    for row in np.atleast_2d(scores):
        order = sorted(range(row.shape[0]), key=lambda n: (bool(np.isnan(row[n])), -row[n] if not np.isnan(row[n]) else 0.0, n))
        order = order[:k]
        ids = np.full(k, -1, np.int64)
        ids[:len(order)] = order
        values = np.full(k, -np.inf, row.dtype)
        values[:len(order)] = row[order]
        rows_scores.append(values)
        rows_ids.append(ids)
    return np.array(rows_scores), np.array(rows_ids)


def _corpus(rng, nq=3, lq=5, nd=40, ld=9, dim=16):
    q = unit_rows(rng, (nq, lq, dim), np.float32)
    d = unit_rows(rng, (nd, ld, dim), np.float32)
    mask = holey_mask(rng, (nd, ld), 0.7)  # document 1 is empty: -inf
    for twin in (7, 20):  # ties: document 3 must come first
        if twin < nd:
            d[twin], mask[twin] = d[3], mask[3]
    return q, d, mask


@pytest.mark.parametrize("k", [1, 10, 39, 40, 41, 100, 1000, 2048])
@pytest.mark.parametrize("workspace_bytes", [1, 200, 2**26])  # one document a block, a few, one block
def test_search_matches_score_and_a_stable_top_k(k, workspace_bytes):
    q, d, mask = _corpus(np.random.default_rng(k))
    got_scores, got_ids = cm.search(q, d, k, d_mask=mask, workspace_bytes=workspace_bytes)
    want_scores, want_ids = expected_top_k(cm.score(q, d, d_mask=mask), k)
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_array_equal(got_scores, want_scores)
    assert got_scores.dtype == np.float32 and got_ids.dtype == np.int64 and got_ids.shape == (3, k)
    if k >= 40:  # the whole corpus: the tied documents in id order, the empty one after every real one
        ranks = {int(n): r for r, n in enumerate(got_ids[0])}
        assert ranks[3] < ranks[7] < ranks[20]
        assert ranks[1] == 39 and got_scores[0, 39] == -np.inf


def test_empty_and_nan_documents_come_last():
    rng = np.random.default_rng(1)
    q, d, mask = _corpus(rng, nd=6)
    d[4, 0, 0] = np.nan  # a real token holding NaN: NaN scores
    mask[2] = False  # empty: -inf
    mask[4, 0] = True
    mask[[0, 1, 3, 5], 0] = True
    scores, ids = cm.search(q, d, 8, d_mask=mask)
    np.testing.assert_array_equal(ids[:, 4:], [[2, 4, -1, -1]] * 3)  # -inf, then NaN, then padding
    assert (scores[:, 4] == -np.inf).all() and np.isnan(scores[:, 5]).all() and (scores[:, 6:] == -np.inf).all()
    assert np.isfinite(scores[:, :4]).all()


def test_one_query_and_winners():
    rng = np.random.default_rng(2)
    q, d, mask = _corpus(rng)
    q_mask = holey_mask(rng, q.shape[:-1], 0.8)
    scores, ids, winners = cm.search(q[0], d, 12, q_mask=q_mask[0], d_mask=mask, return_argmax=True,
                                     workspace_bytes=500)
    all_scores, all_winners = cm.score(q[0], d, q_mask=q_mask[0], d_mask=mask, return_argmax=True)
    want_scores, want_ids = expected_top_k(all_scores, 12)
    assert scores.shape == (12,) and winners.shape == (12, q.shape[1]) and winners.dtype == all_winners.dtype
    np.testing.assert_array_equal(ids, want_ids[0])
    np.testing.assert_array_equal(winners, all_winners[ids])


def test_search_packed_matches_padded():
    rng = np.random.default_rng(3)
    q, d, mask = _corpus(rng)
    lengths = mask.sum(1)
    tokens, offsets = cm.pack([d[n][mask[n]] for n in range(d.shape[0])])
    assert np.array_equal(np.diff(offsets), lengths)
    for k in (1, 17, 64):
        padded = cm.search(q, d, k, d_mask=mask)
        packed = cm.search_packed(q, tokens, offsets, k, workspace_bytes=300)
        np.testing.assert_array_equal(packed[1], padded[1])
        np.testing.assert_allclose(packed[0], padded[0], rtol=1e-6)
    _, _, winners = cm.search_packed(q, tokens, offsets, 5, return_argmax=True)
    _, all_winners = cm.score_packed(q, tokens, offsets, return_argmax=True)
    ids = cm.search_packed(q, tokens, offsets, 5)[1]
    np.testing.assert_array_equal(winners, np.take_along_axis(all_winners, ids[..., None], axis=1))


def test_int8_search():
    rng = np.random.default_rng(4)
    q, d, _ = _corpus(rng)
    (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
    scores, ids = cm.search(q8, d8, 9, q_scale=qs, d_scale=ds, workspace_bytes=300)
    want = expected_top_k(cm.score(q8, d8, q_scale=qs, d_scale=ds), 9)
    np.testing.assert_array_equal(ids, want[1])


def test_empty_corpus_and_no_queries():
    rng = np.random.default_rng(5)
    q, d, _ = _corpus(rng)
    scores, ids = cm.search(q, d[:0], 4)
    assert (ids == -1).all() and (scores == -np.inf).all() and ids.shape == (3, 4)
    scores, ids = cm.search(q[:0], d, 4)
    assert ids.shape == (0, 4) and scores.shape == (0, 4)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_every_framework_in_and_out(framework):
    module = pytest.importorskip(framework)
    rng = np.random.default_rng(6)
    q, d, mask = _corpus(rng)
    convert = (lambda x: module.from_numpy(x)) if framework == "torch" else (lambda x: module.numpy.asarray(x))
    scores, ids = cm.search(convert(q), convert(d), 7, d_mask=convert(mask))
    assert type(scores).__module__.split(".")[0] in (framework, "jaxlib")
    want = cm.search(q, d, 7, d_mask=mask)  # (NumPy's arrays: the CPU backend)
    np.testing.assert_array_equal(to_numpy(ids), want[1])
    # JAX puts arrays on its default device, a GPU where there is one: its float32 sums are the
    # GPU backend's, which differ from the CPU's in the last bits (within the fp32 line).
    np.testing.assert_allclose(to_numpy(scores), want[0], rtol=0, atol=1e-5 * np.abs(want[0]).max())


@pytest.mark.parametrize("k,error", [(0, ValueError), (-3, ValueError), (1.5, TypeError), (True, TypeError),
                                     ("3", TypeError), (None, TypeError)])
def test_bad_k(k, error):
    q, d, _ = _corpus(np.random.default_rng(7))
    with pytest.raises(error, match="k must"):
        cm.search(q, d, k)
    tokens, offsets = cm.pack(list(d))
    with pytest.raises(error, match="k must"):
        cm.search_packed(q, tokens, offsets, k)


def test_bad_inputs_are_the_scorers_errors():
    q, d, _ = _corpus(np.random.default_rng(8))
    with pytest.raises(ValueError, match="d_mask"):
        cm.search(q, d, 3, d_mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="workspace_bytes"):
        cm.search(q, d, 3, workspace_bytes=0)
    before = d.copy()
    cm.search(q, d, 3)
    np.testing.assert_array_equal(d, before)  # nothing passed in is modified


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_search_on_gpu(framework):
    from support import replay_device

    device = replay_device(framework)
    rng = np.random.default_rng(9)
    q, d, mask = _corpus(rng, nd=300, ld=33, dim=128)
    q, d = q.astype(np.float16), d.astype(np.float16)
    for k, workspace in ((1, 2**26), (10, 2000), (500, 2**26)):
        scores, ids = cm.search(device(q), device(d), k, d_mask=device(mask), workspace_bytes=workspace)
        want_scores, want_ids = expected_top_k(to_numpy(cm.score(device(q), device(d), d_mask=device(mask))), k)
        np.testing.assert_array_equal(to_numpy(ids), want_ids)
        np.testing.assert_array_equal(to_numpy(scores), want_scores)


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["cupy", "torch"])
@pytest.mark.parametrize("corpus", [300, 20000])  # (one selection round; the wide selection)
def test_a_repeated_gpu_search_is_replayed_whole(framework, corpus, monkeypatch):
    """The second and later calls of a GPU search's signature run no general path (the forward,
    the selection and the finish replayed with new pointers, search_replays) and answer as score
    plus a stable top-k does, for new arrays each time: one query or several, masks or not, k
    small and large; where k passes the corpus nothing is recorded (no selection), and winners
    are never replayed."""
    from support import replay_device

    import importlib

    search_module = importlib.import_module("cupy_maxsim.search")  # (cupy_maxsim.search is the function)

    device = replay_device(framework)
    general_calls = []
    general = search_module._top_k
    monkeypatch.setattr(search_module, "_top_k", lambda *a, **kw: general_calls.append(1) or general(*a, **kw))
    rng = np.random.default_rng(31)
    for k in (7, 900):
        for nq, masked in ((None, False), (3, True)):
            for repeat in range(3):
                q, d, mask = _corpus(rng, nq=nq or 1, nd=corpus, ld=9, dim=64)
                q, d = device((q[0] if nq is None else q).astype(np.float16)), device(d.astype(np.float16))
                d_mask = device(mask) if masked else None
                before = len(general_calls)
                scores, ids = cm.search(q, d, k, d_mask=d_mask)
                replayed = repeat > 0 and k < corpus
                assert len(general_calls) - before == (0 if replayed else 1), (k, nq, masked, repeat)
                want_scores, want_ids = expected_top_k(to_numpy(cm.score(q, d, d_mask=d_mask)), k)
                np.testing.assert_array_equal(np.atleast_2d(to_numpy(ids)), want_ids)
                np.testing.assert_array_equal(np.atleast_2d(to_numpy(scores)), want_scores)
                assert type(scores) is type(q) and tuple(scores.shape) == ((k,) if nq is None else (nq, k))
    before = len(general_calls)
    for _ in range(2):
        cm.search(q, d, 7, d_mask=d_mask, return_argmax=True)
    assert len(general_calls) - before == 2


@pytest.mark.gpu
def test_search_packed_reads_device_offsets_back_once(monkeypatch):
    """search_packed over device offsets checks them once (one launch, one read back, one wait
    for the stream) where one block holds every document, and answers as score_packed + a
    stable top-k; several blocks check each block's slice."""
    import cupy

    from cupy_maxsim._gpu import launch as gpu_launch

    calls = []
    summary = gpu_launch.offsets_summary
    monkeypatch.setattr(gpu_launch, "offsets_summary", lambda *args: calls.append(args) or summary(*args))
    rng = np.random.default_rng(4)
    q = cupy.asarray(unit_rows(rng, (2, 8, 64))).astype(cupy.float16)
    offsets = cupy.asarray(np.concatenate([[0], np.cumsum(rng.integers(0, 20, 50))]), dtype=cupy.int64)
    tokens = cupy.asarray(unit_rows(rng, (int(offsets[-1]), 64))).astype(cupy.float16)
    want_scores, want_ids = expected_top_k(to_numpy(cm.score_packed(q, tokens, offsets)), 7)
    for workspace, checks in ((2**26, 1), (2 * 8 * 20, 1 + 3)):  # one block; 20 documents a block: 3 blocks
        calls.clear()
        scores, ids = cm.search_packed(q, tokens, offsets, 7, workspace_bytes=workspace)
        assert len(calls) == checks, (workspace, len(calls))
        np.testing.assert_array_equal(to_numpy(ids), want_ids)
        np.testing.assert_array_equal(to_numpy(scores), want_scores)


@pytest.mark.gpu
@pytest.mark.parametrize("min_segment", [None, 1])  # rows in one segment; in segments of 4k, in rounds
@pytest.mark.parametrize("ranked", [True, False])  # the last round ranks in the kernel; or search sorts
@pytest.mark.parametrize("merge_kernel", [False, True])  # blocks merged by CuPy's argsort; by maxsim_topk_merge
@pytest.mark.parametrize("wide", [False, True])  # every row by the wide selection where it ranks; never
def test_gpu_selection_ties_nan_inf_and_exclusions(min_segment, ranked, merge_kernel, wide, monkeypatch):
    """The GPU's selection kernels (maxsim_topk.cu) against the order written out: a corpus of
    40 documents repeated 75 times (every score tied 75 ways), NaN and empty (-inf) documents,
    k from 1 past the corpus, one block and several; and an Index's removed documents."""
    import cupy

    from cupy_maxsim import tuning

    with tuning.override(search_merge_kernel=merge_kernel, search_wide_select_min=0 if wide else -1):
        _selection_ties_nan_inf_and_exclusions(min_segment, ranked, monkeypatch, cupy)


def _selection_ties_nan_inf_and_exclusions(min_segment, ranked, monkeypatch, cupy):
    from cupy_maxsim import _topk
    from cupy_maxsim._gpu import launch

    if min_segment is not None:
        monkeypatch.setattr(_topk, "MIN_SEGMENT", min_segment)
    if not ranked:
        monkeypatch.setattr(launch, "TOPK_RANKED_MAX", 0)

    rng = np.random.default_rng(12)
    q, d, mask = _corpus(rng, nq=4, lq=6, nd=40, ld=9, dim=32)
    d, mask = np.tile(d, (75, 1, 1)), np.tile(mask, (75, 1))
    d[[5, 600, 2999], 0, 0] = np.nan  # NaN scores (a real token holding NaN)
    mask[[17, 18, 1500]] = False  # empty documents: -inf
    q, d = cupy.asarray(q.astype(np.float16)), cupy.asarray(d.astype(np.float16))
    mask = cupy.asarray(mask)
    all_scores = to_numpy(cm.score(q, d, d_mask=mask))
    for k in (1, 37, 300, 1000, 2999, 3000, 3001):  # (300: segments of 1,200, then their candidates)
        for workspace in (2**26, 4 * 8 * 700):  # one block; blocks of 700 documents
            scores, ids = cm.search(q, d, k, d_mask=mask, workspace_bytes=workspace)
            want_scores, want_ids = expected_top_k(all_scores, k)
            np.testing.assert_array_equal(to_numpy(ids), want_ids)
            np.testing.assert_array_equal(to_numpy(scores), want_scores)
    index = cm.Index(32, dtype="float16", device="cuda")
    index.add(d, mask=mask)  # a GPU index takes documents on its GPU
    removed = list(range(0, 3000, 7))
    index.remove(removed)
    # Every live document, ranked by the sort (k past the corpus: no selection), against which
    # the selection's k best must be the first k.
    full_scores, full_ids = (to_numpy(x) for x in index.search(q, 3000))
    assert (full_ids[:, :3000 - len(removed)] >= 0).all() and (full_ids[:, 3000 - len(removed):] == -1).all()
    assert not np.isin(full_ids, removed).any()
    for k in (5, 1000):
        got_scores, got_ids = index.search(q, k)
        np.testing.assert_array_equal(to_numpy(got_ids), full_ids[:, :k])
        np.testing.assert_array_equal(to_numpy(got_scores), full_scores[:, :k])
