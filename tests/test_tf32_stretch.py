"""fp32 one query at fp32 accuracy with one accumulator set a warpgroup (maxsim_fwd_wgmma.cu,
TF32_STRETCH; Tunables.wgmma_tf32_stretch): a tile's atoms accumulate in the tensor cores by
stretches, three warpgroups where the registers hold them. Against float64 within the fp32
line (1e-5 of the largest score) and within it of the two-set build's scores (not bit for bit:
the stretches add in the tensor cores, the sets by rounding FADDs): dims whose tiles end inside
a stretch (96: three atoms; 100: rows on 16 bytes with a part-zero atom), one tile of atoms
(128), many stretches (1024: three warpgroups, the query's atoms streamed), the query's atoms
streamed in two warpgroups (2560, winners) and three (4096), masks, lengths off the tile,
an empty document, a non-finite element, packed tokens, winners (two warpgroups). GPU only (sm_90)."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference
from support import assert_scores_match, ragged_gpu_corpus, unit_rows

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def split_documents():
    """The stretches are the split-document builds': documents on M (wgmma_tf32_doc_rows) off."""
    from cupy_maxsim import tuning

    with tuning.override(wgmma_tf32_doc_rows=False):
        yield


def _four_and_two_sets(call, tunable_ab, kernels_asked):
    """(stretches of four, two sets): each answer as float64 arrays (not bit for bit: see above),
    after asserting which build ran, and that the default, one atom a stretch, answers as the two
    sets do bit for bit (the same fresh accumulators an atom, the same rounding adds)."""
    def check(stretch, answer):
        asked = {d for defines in kernels_asked for d in defines if d.startswith("-DMAXSIM_TF32_STRETCH=")}
        assert asked == ({f"-DMAXSIM_TF32_STRETCH={stretch}"} if stretch else set()), kernels_asked

    one, four, sets = tunable_ab(call, "wgmma_tf32_stretch", (1, 4, 0), check, bitwise=False)
    for a, b in zip(one, sets):
        np.testing.assert_array_equal(a, b)
    return four, sets


@pytest.mark.parametrize("dim,length,winners", [(96, 130, False), (100, 70, True), (128, 300, False),
                                                 (1024, 90, False), (2560, 40, True), (4096, 33, False)])
def test_padded_masked_corpus(hopper_cupy, tunable_ab, kernels_asked, dim, length, winners):
    rng = np.random.default_rng(dim)
    q64 = unit_rows(rng, (1, 32, dim), np.float64).astype(np.float32).astype(np.float64)
    d64 = unit_rows(rng, (40, length, dim), np.float64).astype(np.float32).astype(np.float64)
    d64[5, 3, 7] = np.nan
    mask = rng.random((40, length)) < 0.8
    mask[7] = False
    mask[9, length // 2:] = False
    q, d = hopper_cupy.asarray(q64.astype(np.float32)), hopper_cupy.asarray(d64.astype(np.float32))
    call = lambda: cm.score(q, d, d_mask=hopper_cupy.asarray(mask), return_argmax=winners)  # noqa: E731
    stretched, sets = _four_and_two_sets(call, tunable_ab, kernels_asked)
    expected = reference.maxsim_reference(q64, d64, None, mask)
    line = 1e-5 * np.abs(expected[np.isfinite(expected)]).max()
    assert_scores_match(stretched[0], expected, atol=line)
    assert_scores_match(stretched[0], sets[0], atol=line)
    assert np.isnan(stretched[0][:, 5]).all() and (stretched[0][:, 7] == -np.inf).all()
    if winners:  # each winner reaches its token's maximum (float64) within the line
        sims = np.einsum("qik,njk->qnij", q64, d64)
        sims = np.where(mask[None, :, None, :], sims, -np.inf)
        won = stretched[1].astype(np.int64)
        rows = np.isfinite(sims).any(-1) & ~np.isnan(sims).any(-1)
        chosen = np.take_along_axis(sims, np.maximum(won, 0)[..., None], -1)[..., 0]
        assert (won[rows] >= 0).all() and (sims.max(-1)[rows] - chosen[rows]).max() <= line / 32


def test_packed_tokens(hopper_cupy, tunable_ab, kernels_asked):
    q, t, offsets, q64, t64, host_offsets = ragged_gpu_corpus(np.random.default_rng(7), 1, lq=30, dtype=np.float32,
                                                              docs=60, longest=200)
    stretched, sets = _four_and_two_sets(lambda: cm.score_packed(q, t, offsets), tunable_ab, kernels_asked)
    expected = reference.maxsim_packed_reference(q64, t64, host_offsets)
    line = 1e-5 * np.abs(expected[np.isfinite(expected)]).max()
    assert_scores_match(stretched[0], expected, atol=line)
    assert_scores_match(stretched[0], sets[0], atol=line)
