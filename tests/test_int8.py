"""INT8 x INT8 scoring: quantisation, the CPU backend and the kernels against float64.

The reference dequantises in float64 (values * scales); the kernels' integer dot products are
exact, so they must match it to float32 rounding of the scaling, not to an fp16-like bound.
"""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _arrays, reference
from support import assert_scores_match, holey_mask, to_numpy, unit_rows


def dequantized(values, scales):
    return to_numpy(values) * to_numpy(scales)[..., None]


# ---- CPU ------------------------------------------------------------------------------------


def test_quantize_int8_round_trip():
    rng = np.random.default_rng(0)
    x = unit_rows(rng, (5, 7, 64))
    x[1, 2] = 0.0
    values, scales = cm.quantize_int8(x)
    assert values.dtype == np.int8 and scales.dtype == np.float32 and scales.shape == (5, 7)
    assert np.abs(values.astype(int)).max() <= 127
    np.testing.assert_allclose(scales, np.abs(x).max(-1) / 127, rtol=1e-6)
    assert np.all(np.abs(dequantized(values, scales) - x) <= scales[..., None] / 2 + 1e-7)
    assert scales[1, 2] == 0 and not values[1, 2].any()


def test_quantize_int8_mask_and_non_finite():
    rng = np.random.default_rng(1)
    x = unit_rows(rng, (3, 4, 16))
    x[0, 1, 3] = np.nan
    mask = np.ones((3, 4), bool)
    mask[2, 0] = False
    values, scales = cm.quantize_int8(x, mask=mask)
    assert np.isnan(scales[0, 1])
    assert scales[2, 0] == 0 and not values[2, 0].any()


@pytest.mark.parametrize("nq,lq,nd,ld,dim", [(1, 1, 3, 1, 16), (2, 31, 5, 7, 64), (3, 33, 4, 13, 96)])
def test_score_int8_cpu(nq, lq, nd, ld, dim):
    rng = np.random.default_rng(lq + ld)
    q, d = unit_rows(rng, (nq, lq, dim)), unit_rows(rng, (nd, ld, dim))
    q_mask, d_mask = holey_mask(rng, (nq, lq)), holey_mask(rng, (nd, ld))
    qv, qs = cm.quantize_int8(q)
    dv, ds = cm.quantize_int8(d)
    expected = reference.maxsim_reference(dequantized(qv, qs), dequantized(dv, ds), q_mask, d_mask)
    got = cm.score(qv, dv, q_mask=q_mask, d_mask=d_mask, q_scale=qs, d_scale=ds)
    assert got.dtype == np.float32
    assert_scores_match(got, expected, atol=1e-5 * lq)
    # float queries against int8 documents: quantised on the fly, the same numbers
    on_the_fly = cm.score(q, dv, q_mask=q_mask, d_mask=d_mask, d_scale=ds)
    assert_scores_match(on_the_fly, got, atol=1e-6 * lq)
    pq, ps = qv[:1].repeat(nd, 0), qs[:1].repeat(nd, 0)
    pairs = cm.score_pairs(pq, dv, q_scale=ps, d_scale=ds, d_mask=d_mask)
    assert_scores_match(pairs, reference.maxsim_pairs_reference(dequantized(pq, ps), dequantized(dv, ds), None,
                                                                d_mask), atol=1e-5 * lq)
    tokens, offsets = cm.pack(d, d_mask)
    tv, ts = cm.quantize_int8(tokens)
    packed = cm.score_packed(qv, tv, offsets, q_mask=q_mask, q_scale=qs, d_scale=ts)
    assert_scores_match(packed, reference.maxsim_packed_reference(dequantized(qv, qs), dequantized(tv, ts),
                                                                  offsets, q_mask), atol=1e-5 * lq)


def test_int8_non_finite_token_gives_nan():
    rng = np.random.default_rng(2)
    q, d = unit_rows(rng, (1, 4, 16)), unit_rows(rng, (3, 5, 16))
    d[1, 2, 0] = np.inf
    dv, ds = cm.quantize_int8(d)
    got = cm.score(q, dv, d_scale=ds)
    assert np.isnan(got[0, 1]) and np.isfinite(got[0, [0, 2]]).all()


Q8 = np.zeros((2, 4, 16), np.int8)
D8 = np.zeros((3, 5, 16), np.int8)
QS, DS = np.ones((2, 4), np.float32), np.ones((3, 5), np.float32)


@pytest.mark.parametrize(
    "call,error,message",
    [
        pytest.param(lambda: cm.score(Q8, D8, q_scale=QS), TypeError, "pass its per-token scales as d_scale",
                     id="no-d-scale"),
        pytest.param(lambda: cm.score(Q8, D8, d_scale=DS), TypeError, "pass its per-token scales as q_scale",
                     id="no-q-scale"),
        pytest.param(lambda: cm.score(Q8, D8, q_scale=QS, d_scale=DS[:, :4]), ValueError,
                     r"d_scale must have shape \(3, 5\)", id="scale-shape"),
        pytest.param(lambda: cm.score(Q8, D8, q_scale=QS, d_scale=DS.astype(np.float64)), TypeError,
                     "d_scale must be float32", id="scale-dtype"),
        pytest.param(lambda: cm.score(Q8, D8.astype(np.float32), q_scale=QS), TypeError,
                     "int8 queries need int8 documents", id="int8-q-float-d"),
        pytest.param(lambda: cm.score(Q8.astype(np.float32), D8.astype(np.float32), d_scale=DS), ValueError,
                     "d_scale applies to int8 inputs only", id="scale-for-floats"),
        pytest.param(lambda: cm.quantize_int8(Q8), TypeError, "x must have dtype", id="quantize-int8"),
        pytest.param(lambda: cm.score(Q8.astype(np.int16), D8), TypeError, "q must have dtype", id="int16"),
    ],
)
def test_int8_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


# ---- GPU ------------------------------------------------------------------------------------


@pytest.fixture
def poison(monkeypatch):
    monkeypatch.setattr(_arrays, "POISON_OUTPUTS", True)


@pytest.mark.gpu
@pytest.mark.parametrize("nq,lq,nd,ld,dim", [
    pytest.param(1, 1, 5, 1, 64, id="Lq1-Ld1-dim64"),
    pytest.param(2, 31, 9, 7, 96, id="Lq31-Ld7-dim96"),
    pytest.param(3, 33, 6, 1023, 128, id="Lq33-Ld1023-dim128"),
    pytest.param(9, 32, 20, 64, 128, id="stacked-9x32"),
    pytest.param(9, 32, 20, 64, 256, id="stacked-9x32-dim256"),  # Hopper: documents on M, two warpgroups
    pytest.param(2, 8, 5, 20, 100, id="dim100"),
])
def test_score_int8_gpu(poison, nq, lq, nd, ld, dim):
    import cupy

    rng = np.random.default_rng(nq + lq + ld)
    q, d = unit_rows(rng, (nq, lq, dim)), unit_rows(rng, (nd, ld, dim))
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (nd, ld), 0.6)
    qv, qs = cm.quantize_int8(cupy.asarray(q))
    dv, ds = cm.quantize_int8(cupy.asarray(d))
    expected = reference.maxsim_reference(dequantized(qv, qs), dequantized(dv, ds), q_mask, d_mask)
    args = dict(q_mask=cupy.asarray(q_mask), d_mask=cupy.asarray(d_mask), q_scale=qs, d_scale=ds)
    got = cm.score(qv, dv, **args)
    assert_scores_match(got, expected, atol=2e-5 * lq)
    np.testing.assert_array_equal(to_numpy(got), to_numpy(cm.score(qv, dv, **args)))  # bitwise
    host = cm.score(qv.get(), dv.get(), q_mask=q_mask, d_mask=d_mask, q_scale=qs.get(), d_scale=ds.get())
    assert_scores_match(got, host, atol=2e-5 * lq)  # the CPU backend agrees
    assert np.all(to_numpy(got)[:, 1] == -np.inf)


@pytest.mark.gpu
def test_int8_packed_pairs_frameworks_on_gpu(poison):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q = torch.from_numpy(unit_rows(rng, (3, 32, 128))).cuda().half()
    lengths = np.array([90, 0, 1, 17, 64, 33])
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).cuda()
    tokens = torch.from_numpy(unit_rows(rng, (int(lengths.sum()), 128))).cuda().half()
    tv, ts = cm.quantize_int8(tokens)
    assert isinstance(tv, torch.Tensor) and tv.dtype == torch.int8 and ts.dtype == torch.float32
    qv, qs = cm.quantize_int8(q)
    for offset_dtype in (torch.int32, torch.int64):
        got = cm.score_packed(q, tv, offsets.to(offset_dtype), d_scale=ts)  # fp16 q quantised on the fly
        assert isinstance(got, torch.Tensor) and got.is_cuda
        expected = reference.maxsim_packed_reference(dequantized(qv, qs), dequantized(tv, ts), offsets.cpu())
        assert_scores_match(got, expected, atol=1e-3)
        assert torch.all(got[:, 1] == -float("inf"))
    d = torch.from_numpy(unit_rows(rng, (3, 50, 128))).cuda()
    dv, ds = cm.quantize_int8(d)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        got = cm.score_pairs(qv, dv, q_scale=qs, d_scale=ds)
    stream.synchronize()
    expected = reference.maxsim_pairs_reference(dequantized(qv, qs), dequantized(dv, ds))
    assert_scores_match(got, expected, atol=1e-3)


def test_quantize_int8_blocked_matches_whole(monkeypatch):
    """Quantisation runs in blocks of tokens (bounded temporaries): same values and scales."""
    from cupy_maxsim import _int8

    rng = np.random.default_rng(9)
    x = unit_rows(rng, (4, 9, 32))
    mask = holey_mask(rng, (4, 9))
    whole = cm.quantize_int8(x, mask=mask)
    monkeypatch.setattr(_int8, "QUANTIZE_BLOCK_ELEMENTS", 50)
    blocked = cm.quantize_int8(x, mask=mask)
    for a, b in zip(whole, blocked):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_quantize_int8_gpu_kernel_is_the_numpy_path_bit_for_bit(dtype):
    """maxsim_quantize.cu against the NumPy path on the same values: dims around a warp, zero,
    NaN, inf, huge and masked tokens, halves that round to even, a strided view."""
    import cupy
    import torch

    rng = np.random.default_rng(11)
    for dim in (1, 7, 32, 33, 128, 300):
        x = (rng.standard_normal((6, 9, dim)) * rng.choice([1e-3, 1.0, 300.0], (6, 9, 1))).astype(np.float32)
        x[0, 0] = 0.0
        x[0, 1, 0] = np.nan
        x[0, 2, -1] = np.inf
        x[0, 3, 0], x[0, 3, -1] = -np.inf, np.nan
        x[0, 4] = 127.0 * np.arange(dim) / 2  # quotients at .5: rounding to even
        x[0, 4, 0] = 127.0 * (dim + 1)
        mask = holey_mask(rng, (6, 9))
        mask[0, 5] = False
        device = torch.from_numpy(x).to(getattr(torch, dtype)).cuda()
        host = device.cpu().float().numpy() if dtype == "bfloat16" else device.cpu().numpy()
        for view, host_view in ((device, host), (device[:, ::2], host[:, ::2])):
            for m in (None, mask[:, : view.shape[1]] if view.shape[1] == 9 else mask[:, ::2]):
                got = cm.quantize_int8(view, mask=None if m is None else torch.from_numpy(np.ascontiguousarray(m)).cuda())
                want = cm.quantize_int8(host_view, mask=m)
                np.testing.assert_array_equal(to_numpy(got[0]), want[0])
                np.testing.assert_array_equal(to_numpy(got[1]), want[1])  # (NaN where NaN)
    cupy.cuda.Device().synchronize()
