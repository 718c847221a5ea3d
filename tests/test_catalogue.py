"""A catalogue of bad inputs to every public function: each raises the documented error
(TypeError for a type or dtype, ValueError for a shape, mask, offsets, scales or winners) with a
message naming the argument, before anything runs, and leaves every input as it was."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_maxsim as cm

RNG = np.random.default_rng(27)
Q = RNG.standard_normal((2, 4, 8)).astype(np.float32)  # two queries of 4 tokens, dim 8
D = RNG.standard_normal((3, 5, 8)).astype(np.float32)  # three documents of 5 tokens
T = D.reshape(15, 8)  # the same documents packed
OFFSETS = np.array([0, 5, 10, 15])
(Q8, QS), (D8, DS) = cm.quantize_int8(Q), cm.quantize_int8(D)
SCORES, ARGMAX = cm.score(Q, D, return_argmax=True)
GRAD = np.ones(SCORES.shape, np.float32)
NEGATIVE = DS.copy()
NEGATIVE[1, 2] = -1.0


def _replace(array, index, value):
    out = array.copy()
    out[index] = value
    return out


def _index(**kwargs):
    """A fresh float32 Index of the catalogue's three documents (ids 0, 1, 2)."""
    index = cm.Index(8, dtype="float32", **kwargs)
    index.add(D)
    return index


def index_new(*args, **kwargs):
    return cm.Index(*args, **kwargs)


def index_add(docs, **kwargs):
    return _index().add(docs, **kwargs)


def index_remove(ids):
    return _index().remove(ids)


def index_search(q, k, **kwargs):
    return _index().search(q, k, **kwargs)


def index_load(path):
    return cm.Index.load(path)


C = pytest.param
CATALOGUE = [
    # search, search_packed (the scorers' own checks come first: one case each here)
    C(cm.search, (Q, D, 0), {}, ValueError, "k must be at least 1", id="search-k-0"),
    C(cm.search, (Q, D, 2.5), {}, TypeError, "k must be an int", id="search-k-float"),
    C(cm.search, (Q, D, True), {}, TypeError, "k must be an int", id="search-k-bool"),
    C(cm.search, (Q, D, "3"), {}, TypeError, "k must be an int", id="search-k-str"),
    C(cm.search, (Q, D, 3), dict(workspace_bytes=0), ValueError, "workspace_bytes", id="search-workspace"),
    C(cm.search, (Q, D[0], 3), {}, ValueError, "d must have shape", id="search-d-2d"),
    C(cm.search, (Q, D, 3), dict(d_mask=np.ones((3, 4), bool)), ValueError, "d_mask must have shape",
      id="search-d-mask"),
    C(cm.search_packed, (Q, T, OFFSETS, -1), {}, ValueError, "k must be at least 1", id="search-packed-k"),
    C(cm.search_packed, (Q, T, np.array([0, 9, 5, 15]), 2), {}, ValueError, "offsets", id="search-packed-offsets"),
    # score_candidates
    C(cm.score_candidates, (Q, D), {}, ValueError, "d must have 4 dimensions", id="candidates-d-3d"),
    C(cm.score_candidates, (Q[0], D[None]), {}, ValueError, "q must have 3 dimensions", id="candidates-q-2d"),
    C(cm.score_candidates, (Q, np.stack([D] * 3)), {}, ValueError, "candidates for each of the 2 queries",
      id="candidates-groups"),
    C(cm.score_candidates, (Q, np.stack([D] * 2)), dict(d_mask=np.ones((2, 3, 4), bool)), ValueError, "d_mask",
      id="candidates-d-mask"),
    C(cm.score_candidates, (Q, np.stack([D] * 2).astype(np.float64)), {}, TypeError, "same dtype",
      id="candidates-dtype"),
    # Index
    C(index_new, (0,), {}, ValueError, "dim must be a positive int", id="index-dim-0"),
    C(index_new, (8.0,), {}, ValueError, "dim must be a positive int", id="index-dim-float"),
    C(index_new, (8,), dict(dtype="float64"), ValueError, "dtype must be one of", id="index-dtype"),
    C(index_new, (8,), dict(device="gpu"), ValueError, "device must be", id="index-device"),
    C(index_new, (8,), dict(rescore="int8"), ValueError, "rescore must be", id="index-rescore"),
    C(index_add, (D[..., :4],), {}, ValueError, "width 8", id="index-add-width"),
    C(index_add, (D.astype(np.int32),), {}, TypeError, "docs must have dtype", id="index-add-int"),
    C(index_add, (D,), dict(ids=[0, 7, 8]), ValueError, "already in the index", id="index-add-taken-id"),
    C(index_add, (D,), dict(ids=[7, 7, 8]), ValueError, "unique", id="index-add-repeated-ids"),
    C(index_add, (D,), dict(ids=[7, 8]), ValueError, "one id per document", id="index-add-id-count"),
    C(index_add, (D,), dict(ids=np.array([7.0, 8.0, 9.0])), TypeError, "ids must be a 1-D array of integer",
      id="index-add-float-ids"),
    C(index_add, (D,), dict(ids=[0, -1, 8]), ValueError, "must not be negative", id="index-add-negative-id"),
    C(index_add, (D,), dict(ids=np.array([1, 2, 2**64 - 1], np.uint64)), ValueError, "must fit int64",
      id="index-add-uint64-id"),
    C(index_remove, ([5],), {}, ValueError, "not in the index", id="index-remove-unknown"),
    C(index_remove, (np.array([[0]]),), {}, TypeError, "ids must be a 1-D array", id="index-remove-2d"),
    C(index_search, (Q, 0), {}, ValueError, "k must be at least 1", id="index-search-k"),
    C(index_search, (Q[0, 0], 2), {}, ValueError, "q must have shape", id="index-search-q-1d"),
    C(index_search, (Q, 2), dict(filter=np.ones(2, bool)), ValueError, "filter as a boolean array",
      id="index-search-filter-shape"),
    C(index_search, (Q, 2), dict(filter=np.array([0.5])), TypeError, "filter must be a 1-D array of integer",
      id="index-search-filter-float"),
    C(index_search, (Q, 2), dict(filter=[0.5]), TypeError, "filter must be a 1-D array of integer",
      id="index-search-filter-float-list"),
    C(index_search, (Q[..., :4], 2), {}, ValueError, r"q must have shape \(Lq, 8\) or \(Nq, Lq, 8\) \(the index's dim\)",
      id="index-search-q-dim"),
    C(index_load, ("/nonexistent/cupy-maxsim-index",), {}, FileNotFoundError, "manifest", id="index-load-missing"),
    # score: types and dtypes
    C(cm.score, ([[1.0]], D), {}, TypeError, "q must be an array", id="score-q-list"),
    C(cm.score, (None, D), {}, TypeError, "q must be an array", id="score-q-none"),
    C(cm.score, (Q, "documents"), {}, TypeError, "d must be an array", id="score-d-str"),
    C(cm.score, (Q.astype(np.int32), D), {}, TypeError, "q must have dtype", id="score-q-int32"),
    C(cm.score, (Q > 0, D), {}, TypeError, "q must have dtype", id="score-q-bool"),
    C(cm.score, (Q.astype(np.complex64), D), {}, TypeError, "q must have dtype", id="score-q-complex"),
    C(cm.score, (Q, D.astype(np.int32)), {}, TypeError, "d must have dtype", id="score-d-int32"),
    C(cm.score, (Q.astype(np.float16), D), {}, TypeError, "q and d must have the same dtype", id="score-mixed"),
    C(cm.score, (Q, D.astype(np.float64)), {}, TypeError, "q and d must have the same dtype", id="score-mixed-64"),
    # score: shapes
    C(cm.score, (Q[0, 0], D), {}, ValueError, "q must have shape", id="score-q-1d"),
    C(cm.score, (Q[None], D), {}, ValueError, "q must have shape", id="score-q-4d"),
    C(cm.score, (Q, D[0]), {}, ValueError, "d must have shape", id="score-d-2d"),
    C(cm.score, (Q, D[None]), {}, ValueError, "d must have shape", id="score-d-4d"),
    C(cm.score, (Q, D[:, :, :4]), {}, ValueError, "same embedding dim", id="score-dim"),
    C(cm.score, (Q[..., :0], D), {}, ValueError, "same embedding dim", id="score-dim-0-vs-8"),
    # score: masks
    C(cm.score, (Q, D), dict(q_mask=np.ones((2, 3), bool)), ValueError, r"q_mask must have shape \(2, 4\)",
      id="score-q-mask-shape"),
    C(cm.score, (Q, D), dict(q_mask=np.ones((2, 4), np.float32)), TypeError, "q_mask must be a boolean",
      id="score-q-mask-float"),
    C(cm.score, (Q, D), dict(q_mask=[[True] * 4] * 2), TypeError, "q_mask must be an array", id="score-q-mask-list"),
    C(cm.score, (Q, D), dict(d_mask=np.ones((3, 4), bool)), ValueError, r"d_mask must have shape \(3, 5\)",
      id="score-d-mask-shape"),
    C(cm.score, (Q, D), dict(d_mask=np.ones((5, 3), bool)), ValueError, "d_mask must have shape",
      id="score-d-mask-transposed"),
    C(cm.score, (Q, D), dict(d_mask=np.ones((3, 5), np.int8)), TypeError, "d_mask must be a boolean",
      id="score-d-mask-int8"),
    C(cm.score, (Q[0], D), dict(q_mask=np.ones((2, 4), bool)), ValueError, r"q_mask must have shape \(4,\)",
      id="score-q-mask-single"),
    # score: int8 and scales
    C(cm.score, (Q8, D8), dict(d_scale=DS), TypeError, "q is int8: pass its per-token scales as q_scale",
      id="score-int8-no-q-scale"),
    C(cm.score, (Q8, D8), dict(q_scale=QS), TypeError, "d is int8: pass its per-token scales as d_scale",
      id="score-int8-no-d-scale"),
    C(cm.score, (Q8, D), dict(q_scale=QS), TypeError, "int8 queries need int8 documents", id="score-int8-q-only"),
    C(cm.score, (Q, D), dict(q_scale=QS), ValueError, "q_scale applies to int8 inputs only", id="score-float-q-scale"),
    C(cm.score, (Q, D), dict(d_scale=DS), ValueError, "d_scale applies to int8 inputs only", id="score-float-d-scale"),
    C(cm.score, (Q8, D8), dict(q_scale=QS, d_scale=DS[:, :4]), ValueError, r"d_scale must have shape \(3, 5\)",
      id="score-d-scale-shape"),
    C(cm.score, (Q8, D8), dict(q_scale=QS[:, :3], d_scale=DS), ValueError, r"q_scale must have shape \(2, 4\)",
      id="score-q-scale-shape"),
    C(cm.score, (Q8, D8), dict(q_scale=QS, d_scale=DS.astype(np.float16)), TypeError, "d_scale must be float32",
      id="score-d-scale-fp16"),
    C(cm.score, (Q8, D8), dict(q_scale=QS.astype(np.float64), d_scale=DS), TypeError, "q_scale must be float32",
      id="score-q-scale-fp64"),
    C(cm.score, (Q, D8), dict(q_scale=QS, d_scale=DS), ValueError, "q_scale applies to int8 queries",
      id="score-float-q-with-q-scale"),
    C(cm.score, (Q8, D8), dict(q_scale=QS, d_scale=NEGATIVE), ValueError, "d_scale must be non-negative",
      id="score-d-scale-negative"),
    C(cm.score, (Q8, D8), dict(q_scale=-QS, d_scale=DS), ValueError, "q_scale must be non-negative",
      id="score-q-scale-negative"),
    # score_pairs
    C(cm.score_pairs, (Q, D), {}, ValueError, "same number of pairs", id="pairs-count"),
    C(cm.score_pairs, (Q[0], D[:2]), {}, ValueError, r"q must have shape \(B, Lq, D\)", id="pairs-q-2d"),
    C(cm.score_pairs, (Q, D[0]), {}, ValueError, r"d must have shape \(B, Ld, D\)", id="pairs-d-2d"),
    C(cm.score_pairs, (Q, D[:2]), dict(q_mask=np.ones((2, 5), bool)), ValueError, "q_mask must have shape",
      id="pairs-q-mask"),
    C(cm.score_pairs, (Q, D[:2]), dict(d_mask=np.ones((3, 5), bool)), ValueError, "d_mask must have shape",
      id="pairs-d-mask"),
    C(cm.score_pairs, (Q.astype(np.float64), D[:2]), {}, TypeError, "same dtype", id="pairs-dtype"),
    C(cm.score_pairs, (Q, D[:2, :, :4]), {}, ValueError, "same embedding dim", id="pairs-dim"),
    C(cm.score_pairs, (Q8, D8[:2]), dict(q_scale=QS), TypeError, "d_scale", id="pairs-int8-no-d-scale"),
    C(cm.score_pairs, ("q", D[:2]), {}, TypeError, "q must be an array", id="pairs-q-str"),
    # score_packed
    C(cm.score_packed, (Q, T, OFFSETS.astype(np.float64)), {}, TypeError, "offsets must have dtype int32 or int64",
      id="packed-offsets-float"),
    C(cm.score_packed, (Q, T, OFFSETS > 0), {}, TypeError, "offsets must have dtype int32 or int64",
      id="packed-offsets-bool"),
    C(cm.score_packed, (Q, T, OFFSETS.astype(np.int16)), {}, TypeError, "offsets must have dtype int32 or int64",
      id="packed-offsets-int16"),
    C(cm.score_packed, (Q, T, [0, 5, 15]), {}, TypeError, "offsets must be an array", id="packed-offsets-list"),
    C(cm.score_packed, (Q, T, OFFSETS[None]), {}, ValueError, "offsets must have shape", id="packed-offsets-2d"),
    C(cm.score_packed, (Q, T, OFFSETS[:0]), {}, ValueError, "offsets must have shape", id="packed-offsets-empty"),
    C(cm.score_packed, (Q, T, np.array([0, 5, 16])), {}, ValueError, r"within \[0, 15\]", id="packed-past-end"),
    C(cm.score_packed, (Q, T, np.array([-1, 5, 15])), {}, ValueError, "within", id="packed-negative"),
    C(cm.score_packed, (Q, T, np.array([0, 10, 5, 15])), {}, ValueError, "decreasing", id="packed-decreasing"),
    C(cm.score_packed, (Q, D, OFFSETS), {}, ValueError, r"tokens must have shape \(T, D\)", id="packed-tokens-3d"),
    C(cm.score_packed, (Q, T.astype(np.float16), OFFSETS), {}, TypeError, "q and tokens must have the same dtype",
      id="packed-dtype"),
    C(cm.score_packed, (Q, T[:, :4], OFFSETS), {}, ValueError, "same embedding dim", id="packed-dim"),
    C(cm.score_packed, (Q, T, OFFSETS), dict(q_mask=np.ones(4, bool)), ValueError, r"q_mask must have shape \(2, 4\)",
      id="packed-q-mask"),
    C(cm.score_packed, (Q8, D8.reshape(15, 8), OFFSETS), dict(q_scale=QS, d_scale=DS), ValueError,
      r"d_scale must have shape \(15,\)", id="packed-d-scale-padded"),
    C(cm.score_packed, (Q, "tokens", OFFSETS), {}, TypeError, "tokens must be an array", id="packed-tokens-str"),
    # score_backward
    C(cm.score_backward, (GRAD, Q, D, ARGMAX.astype(np.float32)), {}, TypeError, "argmax must be int16 or int32",
      id="bwd-argmax-float"),
    C(cm.score_backward, (GRAD, Q, D, ARGMAX.astype(np.int64)), {}, TypeError, "argmax must be int16 or int32",
      id="bwd-argmax-int64"),
    C(cm.score_backward, (GRAD, Q, D, ARGMAX[:, :, :3]), {}, ValueError, r"argmax must have shape \(2, 3, 4\)",
      id="bwd-argmax-shape"),
    C(cm.score_backward, (GRAD[:, :2], Q, D, ARGMAX), {}, ValueError, "grad_scores must have the scores' shape",
      id="bwd-grad-shape"),
    C(cm.score_backward, (GRAD.astype(np.int32), Q, D, ARGMAX), {}, TypeError, "grad_scores must be a float array",
      id="bwd-grad-int"),
    C(cm.score_backward, ([[1.0]], Q, D, ARGMAX), {}, TypeError, "grad_scores must be an array", id="bwd-grad-list"),
    C(cm.score_backward, (GRAD, Q8, D8, ARGMAX), {}, TypeError, "int8 scoring has no gradient", id="bwd-int8"),
    C(cm.score_backward, (GRAD, Q, D.astype(np.int32), ARGMAX), {}, TypeError, "d must have dtype", id="bwd-d-int"),
    C(cm.score_backward, (GRAD, Q, D.astype(np.float64), ARGMAX), {}, TypeError, "same dtype", id="bwd-mixed"),
    C(cm.score_backward, (GRAD, Q, T, ARGMAX), dict(offsets=OFFSETS, pairs=True), ValueError, "cannot be combined",
      id="bwd-pairs-and-offsets"),
    C(cm.score_backward, (GRAD[0], Q, D, ARGMAX[0]), dict(pairs=True), ValueError, "same number of pairs",
      id="bwd-pairs-count"),
    C(cm.score_backward, (GRAD, Q, D, _replace(ARGMAX, (1, 2, 3), 5)), {}, ValueError,
      "argmax must hold -1 or a token index within its document", id="bwd-winner-past"),
    C(cm.score_backward, (GRAD, Q, D, _replace(ARGMAX, (0, 0, 0), -7)), {}, ValueError,
      "argmax must hold -1 or a token index", id="bwd-winner-negative"),
    C(cm.score_backward, (GRAD, Q, T, ARGMAX), dict(offsets=np.array([0, 10, 5, 15])), ValueError, "decreasing",
      id="bwd-offsets-decreasing"),
    C(cm.score_backward, (GRAD, Q, T, ARGMAX), dict(offsets=OFFSETS.astype(np.float32)), TypeError,
      "offsets must have dtype", id="bwd-offsets-float"),
    C(cm.score_backward, (GRAD, Q, D[0], ARGMAX), {}, ValueError, r"d must have shape \(Nd, Ld, D\)", id="bwd-d-2d"),
    C(cm.score_backward, (GRAD, Q, D[:, :, :4], ARGMAX), {}, ValueError, "same embedding dim", id="bwd-dim"),
    # pack
    C(cm.pack, ([],), {}, ValueError, "at least one document", id="pack-empty"),
    C(cm.pack, ([D[0], D[1]],), dict(mask=np.ones((2, 5), bool)), ValueError, "mask applies to a padded",
      id="pack-mask-with-list"),
    C(cm.pack, ([D[0], D[1, 0]],), {}, ValueError, r"docs\[1\] must have shape \(Ld_i, D\)", id="pack-doc-1d"),
    C(cm.pack, ([D[0], D[1].astype(np.float64)],), {}, TypeError, r"docs\[1\] must have the dtype of docs\[0\]",
      id="pack-dtype"),
    C(cm.pack, ([D[0], D[1, :, :4]],), {}, ValueError, r"docs\[1\] must have the embedding dim of docs\[0\]",
      id="pack-dim"),
    C(cm.pack, (D[0],), {}, ValueError, r"docs must have shape \(Nd, Ld, D\)", id="pack-padded-2d"),
    C(cm.pack, (D,), dict(mask=np.ones((3, 4), bool)), ValueError, r"mask must have shape \(3, 5\)",
      id="pack-mask-shape"),
    C(cm.pack, (D,), dict(mask=np.ones((3, 5), np.int32)), TypeError, "mask must be a boolean", id="pack-mask-int"),
    C(cm.pack, ([D[0].astype(np.int32)],), {}, TypeError, r"docs\[0\] must have dtype", id="pack-int-docs"),
    C(cm.pack, ("documents",), {}, TypeError, "docs must be an array", id="pack-str"),
    # quantize_int8
    C(cm.quantize_int8, (Q.astype(np.int32),), {}, TypeError, "x must have dtype", id="quantize-int"),
    C(cm.quantize_int8, (Q8,), {}, TypeError, "x must have dtype", id="quantize-int8-again"),
    C(cm.quantize_int8, (np.float32(1.0),), {}, ValueError, r"x must have shape \(\.\.\., D\)", id="quantize-0d"),
    C(cm.quantize_int8, (D,), dict(mask=np.ones((3, 4), bool)), ValueError, "mask must have shape",
      id="quantize-mask-shape"),
    C(cm.quantize_int8, (D,), dict(mask=np.ones((3, 5), np.float32)), TypeError, "mask must be a boolean",
      id="quantize-mask-float"),
    C(cm.quantize_int8, ([1.0, 2.0],), {}, TypeError, "x must be an array", id="quantize-list"),
]


def leaves(value, is_leaf=lambda x: isinstance(x, np.ndarray)):
    """The arrays in a call's arguments (nested lists, tuples, dicts): what must not change."""
    if is_leaf(value):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from leaves(item, is_leaf)
    elif isinstance(value, dict):
        for item in value.values():
            yield from leaves(item, is_leaf)


#: Every public function a catalogue must reach.
FUNCTIONS = {cm.score, cm.score_pairs, cm.score_packed, cm.score_backward, cm.pack, cm.quantize_int8, cm.search,
             cm.search_packed, cm.score_candidates, index_new, index_add, index_remove, index_search, index_load}


def assert_refused(function, args, kwargs, error, message):
    """``function(*args, **kwargs)`` raises ``error`` matching ``message`` and changes no input."""
    before = [(a, a.copy()) for a in leaves((args, kwargs))]
    with pytest.raises(error, match=message):
        function(*args, **kwargs)
    for array, copy in before:
        np.testing.assert_array_equal(array, copy)


@pytest.mark.parametrize("function,args,kwargs,error,message", CATALOGUE)
def test_bad_input_is_refused_and_nothing_changes(function, args, kwargs, error, message):
    assert_refused(function, args, kwargs, error, message)


def test_the_catalogue_is_large_enough():
    assert len(CATALOGUE) >= 80
    assert {case.values[0] for case in CATALOGUE} == FUNCTIONS
