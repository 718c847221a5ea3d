"""The held-out catalogue (issue 27): bad inputs of the same classes as test_catalogue.py, written
apart from it and after the validation it tests, so that they check the rules rather than the
cases the rules were written against. Each raises the documented error with a message naming
the argument, before anything runs, and leaves every input as it was."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_maxsim as cm
from test_catalogue import ARGMAX, D, D8, DS, FUNCTIONS, GRAD, OFFSETS, Q, Q8, QS, T, assert_refused, index_add, \
    index_load, index_new, index_remove, index_search

C = pytest.param
HELD_OUT = [
    # score
    C(cm.score, (np.float32(1.0), D), {}, ValueError, "q must have shape", id="score-q-0d"),
    C(cm.score, (Q, D[0, 0]), {}, ValueError, "d must have shape", id="score-d-1d"),
    C(cm.score, (Q.astype(np.uint8), D), {}, TypeError, "q must have dtype", id="score-q-uint8"),
    C(cm.score, (Q, D > 0), {}, TypeError, "d must have dtype", id="score-d-bool"),
    C(cm.score, (Q, D.astype(np.complex128)), {}, TypeError, "d must have dtype", id="score-d-complex"),
    C(cm.score, (Q, D), dict(q_mask=np.ones((2, 4, 1), bool)), ValueError, "q_mask must have shape",
      id="score-q-mask-3d"),
    C(cm.score, (Q, D), dict(q_mask=np.ones((2, 4), np.uint8)), TypeError, "q_mask must be a boolean",
      id="score-q-mask-uint8"),
    C(cm.score, (Q, D), dict(d_mask=np.ones(3, bool)), ValueError, "d_mask must have shape", id="score-d-mask-1d"),
    C(cm.score, (Q, D), dict(d_mask="all"), TypeError, "d_mask must be an array", id="score-d-mask-str"),
    C(cm.score, (Q8, D8), dict(q_scale=QS.astype(np.int32), d_scale=DS), TypeError, "q_scale must be float32",
      id="score-q-scale-int"),
    C(cm.score, (Q8, D8), dict(q_scale=QS, d_scale=DS[None]), ValueError, "d_scale must have shape",
      id="score-d-scale-3d"),
    C(cm.score, (Q8, D.astype(np.float16)), dict(q_scale=QS), TypeError, "int8 queries need int8 documents",
      id="score-int8-q-fp16-d"),
    C(cm.score, (Q8, D8), dict(q_scale=list(QS), d_scale=DS), TypeError, "q_scale must be an array",
      id="score-q-scale-list"),
    # score_pairs
    C(cm.score_pairs, (Q, D[:2]), dict(q_mask=np.ones((2, 4), np.float64)), TypeError, "q_mask must be a boolean",
      id="pairs-q-mask-float"),
    C(cm.score_pairs, (Q8, D8[:2]), dict(d_scale=DS[:2]), TypeError, "q_scale", id="pairs-int8-no-q-scale"),
    C(cm.score_pairs, (Q, D[None, :2]), {}, ValueError, "d must have shape", id="pairs-d-4d"),
    C(cm.score_pairs, (Q.astype(np.int64), D[:2]), {}, TypeError, "q must have dtype", id="pairs-q-int64"),
    # score_packed
    C(cm.score_packed, (Q, T, np.array([0, 5, 10, 16])), {}, ValueError, "within", id="packed-last-past-end"),
    C(cm.score_packed, (Q, T, OFFSETS.astype(np.int8)), {}, TypeError, "offsets must have dtype",
      id="packed-offsets-int8"),
    C(cm.score_packed, (Q, T, np.array(15)), {}, ValueError, "offsets must have shape", id="packed-offsets-0d"),
    C(cm.score_packed, (Q, T[0], OFFSETS), {}, ValueError, "tokens must have shape", id="packed-tokens-1d"),
    C(cm.score_packed, (Q8, D8.reshape(15, 8), OFFSETS), dict(q_scale=QS, d_scale=DS.reshape(15)[:14]), ValueError,
      r"d_scale must have shape \(15,\)", id="packed-d-scale-short"),
    C(cm.score_packed, (Q, T, OFFSETS), dict(q_mask=np.ones((2, 4), np.int32)), TypeError,
      "q_mask must be a boolean", id="packed-q-mask-int"),
    # score_backward
    C(cm.score_backward, (GRAD, Q, D, ARGMAX.astype(np.uint16)), {}, TypeError, "argmax must be int16 or int32",
      id="bwd-argmax-uint16"),
    C(cm.score_backward, (GRAD, Q, D, np.full(ARGMAX.shape, 5, np.int16)), {}, ValueError,
      "argmax must hold -1 or a token index", id="bwd-winner-past-document"),
    C(cm.score_backward, (GRAD[None], Q, D, ARGMAX), {}, ValueError, "grad_scores must have the scores' shape",
      id="bwd-grad-3d"),
    C(cm.score_backward, (GRAD, Q.astype(np.int32), D, ARGMAX), {}, TypeError, "q must have dtype", id="bwd-q-int"),
    C(cm.score_backward, (GRAD, Q, T, ARGMAX), dict(offsets=OFFSETS[None]), ValueError, "offsets must have shape",
      id="bwd-offsets-2d"),
    C(cm.score_backward, (GRAD, Q, "d", ARGMAX), {}, TypeError, "d must be an array", id="bwd-d-str"),
    # pack
    C(cm.pack, ([D[0], "doc"],), {}, TypeError, r"docs\[1\] must be an array", id="pack-str-doc"),
    C(cm.pack, ([D[0], D[1][None]],), {}, ValueError, r"docs\[1\] must have shape \(Ld_i, D\)", id="pack-doc-3d"),
    C(cm.pack, (D,), dict(mask=[[True] * 5] * 3), TypeError, "mask must be an array", id="pack-mask-list"),
    # quantize_int8
    C(cm.quantize_int8, (Q > 0,), {}, TypeError, "x must have dtype", id="quantize-bool"),
    C(cm.quantize_int8, (D,), dict(mask=np.ones((3, 5, 1), bool)), ValueError, "mask must have shape",
      id="quantize-mask-3d"),
    C(cm.quantize_int8, ("x",), {}, TypeError, "x must be an array", id="quantize-str"),
    # search, search_packed
    C(cm.search, (Q, D, np.float32(3)), {}, TypeError, "k must be an int", id="search-k-numpy-float"),
    C(cm.search, (Q, D, None), {}, TypeError, "k must be an int", id="search-k-none"),
    C(cm.search, (Q, D, -2), {}, ValueError, "k must be at least 1", id="search-k-negative"),
    C(cm.search, (Q, D, 2), dict(workspace_bytes=-5), ValueError, "workspace_bytes", id="search-workspace-negative"),
    C(cm.search, (Q, D, 2), dict(workspace_bytes="64MB"), ValueError, "workspace_bytes", id="search-workspace-str"),
    C(cm.search, (Q.astype(np.int32), D, 2), {}, TypeError, "q must have dtype", id="search-q-int"),
    C(cm.search_packed, (Q, T, OFFSETS.astype(np.float32), 2), {}, TypeError, "offsets must have dtype",
      id="search-packed-offsets-float"),
    C(cm.search_packed, (Q, T, OFFSETS, 0), {}, ValueError, "k must be at least 1", id="search-packed-k-0"),
    # score_candidates
    C(cm.score_candidates, (Q, np.stack([D] * 2)[None]), {}, ValueError, "d must have 4 dimensions",
      id="candidates-d-5d"),
    C(cm.score_candidates, (Q[None], np.stack([D] * 2)), {}, ValueError, "q must have 3 dimensions",
      id="candidates-q-4d"),
    # Index
    C(index_new, (-3,), {}, ValueError, "dim must be a positive int", id="index-dim-negative"),
    C(index_new, ("8",), {}, ValueError, "dim must be a positive int", id="index-dim-str"),
    C(index_new, (8,), dict(dtype="int4"), ValueError, "dtype must be one of", id="index-dtype-int4"),
    C(index_add, (D,), dict(ids=np.array([[7, 8, 9]])), TypeError, "ids must be a 1-D array", id="index-add-ids-2d"),
    C(index_remove, (np.array([0.0]),), {}, TypeError, "ids must be a 1-D array", id="index-remove-float"),
    C(index_search, (Q, True), {}, TypeError, "k must be an int", id="index-search-k-bool"),
    C(index_search, (Q.astype(np.int32), 2), {}, TypeError, "q must have dtype", id="index-search-q-int"),
    C(index_load, (__file__,), {}, FileNotFoundError, "manifest", id="index-load-a-file"),
]


@pytest.mark.parametrize("function,args,kwargs,error,message", HELD_OUT)
def test_held_out_bad_input_is_refused_and_nothing_changes(function, args, kwargs, error, message):
    assert_refused(function, args, kwargs, error, message)


def test_the_held_out_catalogue_covers_every_function():
    assert len(HELD_OUT) >= 50
    assert {case.values[0] for case in HELD_OUT} == FUNCTIONS
