"""reference.py against the definition written as brute-force loops."""

import math

import numpy as np
import pytest

from cupy_maxsim import reference
from support import assert_scores_match, holey_mask


def brute_force(q, d, q_real, d_real) -> float:
    """The definition, one multiply at a time."""
    if not any(d_real):
        return -math.inf
    total, non_finite = 0.0, False
    for i in range(len(q)):
        if not q_real[i]:
            continue
        best = -math.inf
        for j in range(len(d)):
            if not d_real[j]:
                continue
            dot = 0.0
            for k in range(q.shape[1]):
                dot += float(q[i, k]) * float(d[j, k])
            non_finite |= not math.isfinite(dot)
            best = max(best, dot)
        total += best
    return math.nan if non_finite else total


@pytest.mark.parametrize("seed", range(3))
def test_padded_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 3, 5))
    d = rng.standard_normal((4, 6, 5))
    q_mask, d_mask = holey_mask(rng, (2, 3)), holey_mask(rng, (4, 6))
    expected = np.array([[brute_force(q[i], d[n], q_mask[i], d_mask[n]) for n in range(4)] for i in range(2)])
    assert_scores_match(reference.maxsim_reference(q, d, q_mask, d_mask), expected, atol=1e-12)


def test_packed_and_pairs_match_padded():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 4, 8))
    d = rng.standard_normal((3, 5, 8))
    lengths = np.array([5, 0, 2])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.concatenate([d[n, :lengths[n]] for n in range(3)])
    d_mask = np.arange(5)[None, :] < lengths[:, None]
    padded = reference.maxsim_reference(q, d, None, d_mask)
    assert_scores_match(reference.maxsim_packed_reference(q, tokens, offsets), padded, atol=1e-12)
    assert_scores_match(reference.maxsim_pairs_reference(q, d, None, d_mask), np.diag(padded), atol=1e-12)
    assert padded[0, 1] == -np.inf


def test_non_finite_policy():
    q = np.ones((1, 2, 2))
    d = np.ones((3, 2, 2))
    d[0, 1, 0] = np.nan       # NaN in a real token -> NaN
    d[1, 1, 0] = -np.inf      # -inf similarity would lose every max: still NaN, not a finite score
    d_mask = np.ones((3, 2), bool)
    d_mask[2, 1] = False
    d[2, 1, 0] = np.nan       # NaN in a masked token is ignored
    scores = reference.maxsim_reference(q, d, None, d_mask)[0]
    assert np.isnan(scores[0]) and np.isnan(scores[1]) and scores[2] == 4.0
