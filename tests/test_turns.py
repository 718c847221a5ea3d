"""Documents on M with the warpgroups issuing each tile's MMAs in turns (maxsim_fwd_wgmma.cu,
TURNS; Tunables.wgmma_turns): the scores and winners equal those of the warpgroups issuing
together bit for bit (the same MMAs and folds, in another order across warpgroups) and
float64's within tolerance, over padded corpora with masks and lengths off the tile, packed
ragged corpora with empty documents, a non-finite element, int8, bf16, fp32 under precision
"high", two and three warpgroups, and winners. GPU only (sm_90)."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference, tuning
from support import assert_scores_match, masked_gpu_corpus, ragged_gpu_corpus, unit_rows

pytestmark = pytest.mark.gpu


@pytest.fixture
def both(tunable_ab, kernels_asked):
    """_both(call): (in turns, together), equal bit for bit, the turns' build asked for only
    under the tunable; the scores."""
    def check(turns, answer):
        assert any("-DMAXSIM_TURNS=1" in d for d in kernels_asked) == turns, kernels_asked

    return lambda call: tunable_ab(call, "wgmma_turns", (True, False), check)[0]


@pytest.mark.parametrize("dtype,dim,length,nq,winners", [
    ("float16", 128, 300, 12, False), ("float16", 64, 1030, 6, False), ("bfloat16", 96, 70, 12, True),
    ("int8", 128, 130, 12, False), ("int8", 64, 200, 40, True), ("float16", 128, 64, 40, True)])
def test_padded_masked_corpora(hopper_cupy, both, dtype, dim, length, nq, winners):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(dim + length + nq)
    q, d, mask, extra, q64, d64, d_mask = masked_gpu_corpus(rng, dtype, nq, 32, 90, length, dim)
    scores = both(lambda: cm.score(q, d, d_mask=mask, return_argmax=winners, **extra))
    expected = reference.maxsim_reference(q64, d64, None, d_mask)
    assert_scores_match(scores, expected, atol=3e-2 if dtype in ("int8", "bfloat16") else 5e-3)
    assert np.isnan(scores[:, 5]).all() and (scores[:, 7] == -np.inf).all()


def test_packed_ragged_corpus(hopper_cupy, both):
    q, tokens, offsets, q64, t64, host_offsets = ragged_gpu_corpus(np.random.default_rng(8), 40)
    scores = both(lambda: cm.score_packed(q, tokens, offsets, return_argmax=True))
    assert_scores_match(scores, reference.maxsim_packed_reference(q64, t64, host_offsets), atol=5e-3)


def test_fp32_precision_high(hopper_cupy, both):
    rng = np.random.default_rng(2)
    q64, d64 = unit_rows(rng, (10, 32, 64), np.float64), unit_rows(rng, (50, 200, 64), np.float64)
    q, d = hopper_cupy.asarray(q64.astype(np.float32)), hopper_cupy.asarray(d64.astype(np.float32))
    with tuning.float32_matmul_precision("high"):
        scores = both(lambda: cm.score(q, d))
    assert_scores_match(scores, reference.maxsim_reference(q64, d64), atol=32 * 2.0 ** -8)
