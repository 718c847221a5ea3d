"""Documents on M streaming k with 128 document rows a slot (maxsim_fwd_wgmma.cu, M_HALVES;
Tunables.wgmma_docs_on_m_halves_ksteps: from fp16 dim 2048 on, here 1: every such build): each
warpgroup multiplies the slot's two 64-row halves into two accumulator sets against one query
atom. The scores and winners equal those of 64-row slots bit for bit (every similarity from the
same MMAs over k in the same order; the halves fold in row order) and float64's within
tolerance: fat 16-bit dims with resident query blocks (192, 256) and streamed query atoms
(2560), masks and lengths off the tile, a non-finite element, an empty document, packed ragged
corpora, winners, an idle warpgroup (12 queries). GPU only (sm_90)."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference
from support import assert_scores_match, masked_gpu_corpus, ragged_gpu_corpus

pytestmark = pytest.mark.gpu


@pytest.fixture
def both(tunable_ab, kernels_asked):
    """_both(call): (128 rows a slot, 64), equal bit for bit; asserts that the 128-row build ran
    (-DMAXSIM_TILE_N=128 with documents on M) only where asked."""
    def check(threshold, answer):
        halves = any("-DMAXSIM_DOCS_ON_M=1" in d and "-DMAXSIM_TILE_N=128" in d for d in kernels_asked)
        assert halves == (threshold == 1), kernels_asked

    return lambda call: tunable_ab(call, "wgmma_docs_on_m_halves_ksteps", (1, 0), check)


@pytest.mark.parametrize("dtype,dim,length,nq,winners", [
    ("float16", 192, 300, 32, False), ("bfloat16", 256, 130, 12, True), ("float16", 2560, 70, 32, True),
    ("float16", 256, 64, 8, False)])
def test_padded_masked_corpora(hopper_cupy, both, dtype, dim, length, nq, winners):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(dim + length + nq)
    q, d, mask, extra, q64, d64, d_mask = masked_gpu_corpus(rng, dtype, nq, 32, 90, length, dim)
    answer = both(lambda: cm.score(q, d, d_mask=mask, return_argmax=winners, **extra))
    expected = reference.maxsim_reference(q64, d64, None, d_mask)
    assert_scores_match(answer[0], expected, atol=3e-2 if dtype == "bfloat16" else 5e-3)
    assert np.isnan(answer[0][:, 5]).all() and (answer[0][:, 7] == -np.inf).all()


def test_packed_ragged_corpus(hopper_cupy, both):
    q, tokens, offsets, q64, t64, host_offsets = ragged_gpu_corpus(np.random.default_rng(9), 32, dim=256, docs=200,
                                                                   longest=300)
    answer = both(lambda: cm.score_packed(q, tokens, offsets, return_argmax=True))
    assert_scores_match(answer[0], reference.maxsim_packed_reference(q64, t64, host_offsets), atol=5e-3)
