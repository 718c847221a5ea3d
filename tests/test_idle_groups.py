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
from cupy_maxsim import reference, tuning
from cupy_maxsim._gpu.args import FORWARD_ARGS, ArgTemplate, forward_args
from support import assert_scores_match, holey_mask, to_numpy, unit_rows

pytestmark = pytest.mark.gpu


@pytest.fixture
def cupy():
    cupy = pytest.importorskip("cupy")
    from cupy_maxsim._gpu.device import device_properties

    if device_properties(cupy.cuda.runtime.getDevice())[3] != 90:
        pytest.skip("the warpgroup-MMA kernel runs on sm_90 only")
    return cupy


@pytest.fixture
def both(monkeypatch):
    """_both(call, num_queries, query_length): (idle warpgroups and their group's own ranges,
    ranges alike and every warpgroup multiplying) planned afresh each, equal bit for bit;
    asserts that the call took documents on M with a warpgroup past the last query."""
    from cupy_maxsim import _forward, _replay

    asked = []
    get_kernel = _forward.gpu_compile.get_kernel
    monkeypatch.setattr(_forward.gpu_compile, "get_kernel",
                        lambda device, family, name, defines=(), *a: asked.append(defines) or
                        get_kernel(device, family, name, defines, *a))

    def _both(call, num_queries, query_length):
        results = []
        for balanced in (True, False):
            _forward._plans.clear()
            _replay.replays.clear()
            asked.clear()
            with tuning.override(wgmma_idle_groups=balanced):
                answer = call()
                results.append([to_numpy(x) for x in (answer if isinstance(answer, tuple) else (answer,))])
                again = call()  # replayed where the call can be: the recorded launch's ranges are the plan's
                np.testing.assert_array_equal(results[-1][0], to_numpy(again[0] if isinstance(again, tuple) else again))
            for replay in _replay.replays.values():
                sent = dict(zip((name for name, _ in FORWARD_ARGS), forward_args.layout.unpack_from(
                    bytes(replay.launch._args), ArgTemplate.HEADER)))
                assert sent["last_group_docs_per_block"] == replay.plan.last_group_docs_per_block
                own = replay.plan.last_group_docs_per_block
                assert (own > replay.plan.docs_per_block if replay.plan.groups > 1 else own == replay.plan.docs_per_block
                        ) if balanced else own == 0
            docs_on_m = [d for d in asked if "-DMAXSIM_DOCS_ON_M=1" in d]
            assert docs_on_m, f"not documents on M: {asked}"
            defines = dict(d.lstrip("-D").split("=") for d in docs_on_m[-1])
            per_warpgroup, warpgroups = 128 // query_length, int(defines["MAXSIM_WARPGROUPS"])
            group = per_warpgroup * warpgroups
            last = num_queries - (-(-num_queries // group) - 1) * group
            assert -(-last // per_warpgroup) < warpgroups, "no warpgroup idles in this problem"
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)
        return results[0]

    return _both


@pytest.mark.parametrize("dtype,dim,length,nq,lq,winners", [
    ("float16", 128, 300, 32, 32, False), ("float16", 64, 130, 16, 32, True), ("bfloat16", 96, 70, 30, 16, True),
    ("int8", 128, 130, 32, 32, False), ("int8", 64, 200, 12, 32, True), ("float16", 192, 100, 32, 32, True),
    ("float32", 100, 90, 12, 32, True), ("float32", 128, 64, 4, 32, False)])
def test_padded_masked_corpora(cupy, both, dtype, dim, length, nq, lq, winners):
    rng = np.random.default_rng(dim + length + nq)
    nd = 600
    q64, d64 = unit_rows(rng, (nq, lq, dim), np.float64), unit_rows(rng, (nd, length, dim), np.float64)
    d64[5, 3, 1] = np.nan
    d_mask = holey_mask(rng, (nd, length), 0.8)
    d_mask[5, 3] = True  # the NaN's token is real (a masked one is ignored)
    d_mask[7] = False  # an empty document
    source = "float16" if dtype == "int8" else dtype
    if source == "bfloat16":
        torch = pytest.importorskip("torch")
        q = torch.from_numpy(q64).to("cuda", torch.bfloat16)
        d = torch.from_numpy(d64).to("cuda", torch.bfloat16)
        q64, d64, mask = q.double().cpu().numpy(), d.double().cpu().numpy(), torch.from_numpy(d_mask).cuda()
    else:
        q, d = cupy.asarray(q64.astype(source)), cupy.asarray(d64.astype(source))
        q64, d64, mask = q64.astype(source).astype(np.float64), d64.astype(source).astype(np.float64), cupy.asarray(d_mask)
    extra = {}
    if dtype == "int8":
        (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
        q64, d64 = to_numpy(q) * to_numpy(q_scale)[..., None], to_numpy(d) * to_numpy(d_scale)[..., None]
        extra = dict(q_scale=q_scale, d_scale=d_scale)
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


def test_packed_ragged_corpus(cupy, both):
    rng = np.random.default_rng(8)
    lengths = rng.integers(0, 150, 700)
    lengths[[3, 699]] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    q64 = unit_rows(rng, (32, 32, 128), np.float64).astype(np.float16).astype(np.float64)
    t64 = unit_rows(rng, (int(offsets[-1]), 128), np.float64).astype(np.float16).astype(np.float64)
    q, tokens = cupy.asarray(q64.astype(np.float16)), cupy.asarray(t64.astype(np.float16))
    answer = both(lambda: cm.score_packed(q, tokens, cupy.asarray(offsets), return_argmax=True), 32, 32)
    assert_scores_match(answer[0], reference.maxsim_packed_reference(q64, t64, offsets), atol=5e-3)
