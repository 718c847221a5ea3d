"""Documents on M with warpgroups past the last query (maxsim_fwd_wgmma.cu, idle_docs_on_m): a
warpgroup whose queries all lie past the last only frees the slots the others multiply, and the
planner gives the last query group longer document ranges (Tunables.wgmma_idle_groups,
_plan/forward.idle_group_ranges). The scores and winners equal those of ranges alike, where every
warpgroup multiplies, bit for bit (each document and query by the same MMAs and folds) and
float64's within tolerance: 16-bit, int8 and fp32 (the split build) builds, resident and
streamed k, queries of 16 and 32 tokens, one query group with idle warpgroups and several,
masks, lengths off the tile, packed ragged corpora with empty documents, a non-finite element
and winners. GPU only (sm_90)."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference
from cupy_maxsim._gpu.args import FORWARD_ARGS, ArgTemplate, forward_args
from support import answer_arrays, assert_scores_match, masked_gpu_corpus, ragged_gpu_corpus, unit_rows

pytestmark = pytest.mark.gpu


@pytest.fixture
def both(tunable_ab, kernels_asked):
    """_both(call, num_queries, query_length): (idle warpgroups and their group's own ranges,
    ranges alike and every warpgroup multiplying), equal bit for bit; asserts that the call took
    documents on M with a warpgroup past the last query, and that a replayed call's launch
    carries the plan's ranges."""
    from cupy_maxsim import _replay

    def _both(call, num_queries, query_length):
        def check(balanced, answer):
            again = call()  # replayed where the call can be: the recorded launch's ranges are the plan's
            np.testing.assert_array_equal(answer[0], answer_arrays(again)[0])
            for replay in _replay.replays.values():
                sent = dict(zip((name for name, _ in FORWARD_ARGS), forward_args.layout.unpack_from(
                    bytes(replay.launch._args), ArgTemplate.HEADER)))
                assert sent["last_group_docs_per_block"] == replay.plan.last_group_docs_per_block
                own = replay.plan.last_group_docs_per_block
                assert own >= replay.plan.docs_per_block if balanced else own == 0
            docs_on_m = [d for d in kernels_asked if "-DMAXSIM_DOCS_ON_M=1" in d]
            assert docs_on_m, f"not documents on M: {kernels_asked}"
            defines = dict(d.lstrip("-D").split("=") for d in docs_on_m[-1])
            per_warpgroup, warpgroups = 128 // query_length, int(defines["MAXSIM_WARPGROUPS"])
            group = per_warpgroup * warpgroups
            last = num_queries - (-(-num_queries // group) - 1) * group
            assert -(-last // per_warpgroup) < warpgroups, "no warpgroup idles in this problem"

        return tunable_ab(call, "wgmma_idle_groups", (True, False), check)

    return _both


@pytest.mark.parametrize("dtype,dim,length,nq,lq,winners", [
    ("float16", 128, 300, 32, 32, False), ("float16", 64, 130, 16, 32, True), ("bfloat16", 96, 70, 30, 16, True),
    ("int8", 128, 130, 32, 32, False), ("int8", 64, 200, 12, 32, True), ("float16", 192, 100, 32, 32, True),
    ("float32", 100, 90, 12, 32, True), ("float32", 128, 64, 4, 32, False)])
def test_padded_masked_corpora(hopper_cupy, both, dtype, dim, length, nq, lq, winners):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(dim + length + nq)
    q, d, mask, extra, q64, d64, d_mask = masked_gpu_corpus(rng, dtype, nq, lq, 600, length, dim)
    answer = both(lambda: cm.score(q, d, d_mask=mask, return_argmax=winners, **extra), nq, lq)
    expected = reference.maxsim_reference(q64, d64, None, d_mask)
    finite = np.isfinite(expected)
    # fp32: the fp32 line (1e-5 of the largest score); 16-bit and int8 as the other GPU tests.
    atol = {"int8": 3e-2, "bfloat16": 3e-2, "float16": 5e-3, "float32": 1e-5 * np.abs(expected[finite]).max()}[dtype]
    assert_scores_match(answer[0], expected, atol=atol)
    assert np.isnan(answer[0][:, 5]).all() and (answer[0][:, 7] == -np.inf).all()
    if winners:  # each winner reaches its token's maximum (float64) within the scores' tolerance
        sims = np.einsum("qik,njk->qnij", q64, d64)
        sims = np.where(d_mask[None, :, None, :], sims, -np.inf)
        won = answer[1].astype(np.int64)
        assert (won[:, 7] == -1).all()
        rows = np.isfinite(sims).any(-1) & ~np.isnan(sims).any(-1)
        chosen = np.take_along_axis(sims, np.maximum(won, 0)[..., None], -1)[..., 0]
        assert (won[rows] >= 0).all() and (sims.max(-1)[rows] - chosen[rows]).max() <= atol / lq


def test_packed_ragged_corpus(hopper_cupy, both):
    q, tokens, offsets, q64, t64, host_offsets = ragged_gpu_corpus(np.random.default_rng(8), 32)
    answer = both(lambda: cm.score_packed(q, tokens, offsets, return_argmax=True), 32, 32)
    assert_scores_match(answer[0], reference.maxsim_packed_reference(q64, t64, host_offsets), atol=5e-3)


def test_many_groups_in_one_wave(hopper_cupy, both):
    """500 queries of 32 tokens (42 groups of 12) against 150 documents: one wave of blocks,
    whose rounding once gave the last group more blocks than the grid had (its documents past
    the grid unscored): every score equals the ranges-alike build's, and float64's for the first
    and last queries."""
    rng = np.random.default_rng(500)
    q64, d64 = unit_rows(rng, (500, 32, 64), np.float64), unit_rows(rng, (150, 40, 64), np.float64)
    q64, d64 = q64.astype(np.float16).astype(np.float64), d64.astype(np.float16).astype(np.float64)
    q, d = hopper_cupy.asarray(q64.astype(np.float16)), hopper_cupy.asarray(d64.astype(np.float16))
    scores = both(lambda: cm.score(q, d), 500, 32)[0]
    picked = np.r_[0:3, 497:500]
    assert_scores_match(scores[picked], reference.maxsim_reference(q64[picked], d64), atol=5e-3)
