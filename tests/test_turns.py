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
    """_both(call): (in turns, together) planned afresh each, equal bit for bit, the turns'
    build asked for only under the tunable."""
    from cupy_maxsim import _forward, _replay

    asked = []
    get_kernel = _forward.gpu_compile.get_kernel
    monkeypatch.setattr(_forward.gpu_compile, "get_kernel",
                        lambda device, family, name, defines=(), *a: asked.append(defines) or
                        get_kernel(device, family, name, defines, *a))

    def _both(call):
        results = []
        for turns in (True, False):
            _forward._plans.clear()
            _replay.replays.clear()
            asked.clear()
            with tuning.override(wgmma_turns=turns):
                answer = call()
                results.append([to_numpy(x) for x in (answer if isinstance(answer, tuple) else (answer,))])
            assert any("-DMAXSIM_TURNS=1" in d for d in asked) == turns, asked
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)
        return results[0][0]

    return _both


@pytest.mark.parametrize("dtype,dim,length,nq,winners", [
    ("float16", 128, 300, 12, False), ("float16", 64, 1030, 6, False), ("bfloat16", 96, 70, 12, True),
    ("int8", 128, 130, 12, False), ("int8", 64, 200, 40, True), ("float16", 128, 64, 40, True)])
def test_padded_masked_corpora(cupy, both, dtype, dim, length, nq, winners):
    rng = np.random.default_rng(dim + length + nq)
    lq, nd = 32, 90
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
    scores = both(lambda: cm.score(q, d, d_mask=mask, return_argmax=winners, **extra))
    expected = reference.maxsim_reference(q64, d64, None, d_mask)
    assert_scores_match(scores, expected, atol=3e-2 if dtype in ("int8", "bfloat16") else 5e-3)
    assert np.isnan(scores[:, 5]).all() and (scores[:, 7] == -np.inf).all()


def test_packed_ragged_corpus(cupy, both):
    rng = np.random.default_rng(8)
    lengths = rng.integers(0, 150, 700)
    lengths[[3, 699]] = 0
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    q64 = unit_rows(rng, (40, 32, 128), np.float64).astype(np.float16).astype(np.float64)
    t64 = unit_rows(rng, (int(offsets[-1]), 128), np.float64).astype(np.float16).astype(np.float64)
    q, tokens = cupy.asarray(q64.astype(np.float16)), cupy.asarray(t64.astype(np.float16))
    scores = both(lambda: cm.score_packed(q, tokens, cupy.asarray(offsets), return_argmax=True))
    assert_scores_match(scores, reference.maxsim_packed_reference(q64, t64, offsets), atol=5e-3)


def test_fp32_precision_high(cupy, both):
    rng = np.random.default_rng(2)
    q64, d64 = unit_rows(rng, (10, 32, 64), np.float64), unit_rows(rng, (50, 200, 64), np.float64)
    q, d = cupy.asarray(q64.astype(np.float32)), cupy.asarray(d64.astype(np.float32))
    with tuning.float32_matmul_precision("high"):
        scores = both(lambda: cm.score(q, d))
    assert_scores_match(scores, reference.maxsim_reference(q64, d64), atol=32 * 2.0 ** -8)
