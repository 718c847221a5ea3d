"""CUDA kernels against the float64 reference (GPU only; skipped without one).

Error rule (FlashAttention's): the kernel's error against float64 is at most twice the error of
a naive implementation that keeps the similarity tensor in the input precision, plus rounding
noise. Results are poisoned with NaN before every launch, so an unwritten element fails.
"""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _arrays, reference
from support import (assert_scores_match, count_calls, holey_mask, off_alignment, replay_device, to_numpy,
                     unit_rows)

pytestmark = pytest.mark.gpu

# Rounding noise added to the naive error bound, per input dtype (unit-norm rows, |score| <= Lq).
NOISE = {"float16": 1e-4, "bfloat16": 1e-4, "float32": 2e-6, "float64": 1e-12}


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(_arrays, "POISON_OUTPUTS", True)


def _round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return bits.view(np.float32).astype(np.float64)
    if dtype == "float32":
        return x.astype(np.float32).astype(np.float64)
    return x


def naive_error(q, d, q_mask, d_mask, dtype, expected) -> float:
    """Error of the naive way (similarities stored in the input dtype) against float64."""
    sims = _round_to(np.einsum("qid,njd->qnij", q, d), dtype)
    sims = np.where(d_mask[None, :, None, :], sims, -np.inf)
    token_max = np.where(q_mask[:, None, :], sims.max(axis=-1), 0)
    naive = token_max.sum(axis=-1)
    finite = np.isfinite(expected)
    return float(np.abs(naive - expected)[finite].max()) if finite.any() else 0.0


def _inputs(rng, nq, lq, nd, ld, dim, dtype):
    """Host float64 values already rounded to dtype, and the same values as CuPy arrays."""
    import cupy

    q64 = _round_to(unit_rows(rng, (nq, lq, dim), np.float64), dtype)
    d64 = _round_to(unit_rows(rng, (nd, ld, dim), np.float64), dtype)
    return q64, d64, _to_device(q64, dtype), _to_device(d64, dtype)


def _to_device(x64, dtype):
    import cupy

    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(x64).to("cuda", torch.bfloat16)
    return cupy.asarray(x64.astype(dtype))


SHAPES = [
    pytest.param(1, 1, 5, 1, 64, id="Lq1-Ld1-dim64"),
    pytest.param(2, 31, 9, 7, 96, id="Lq31-Ld7-dim96"),
    pytest.param(3, 33, 6, 1023, 128, id="Lq33-Ld1023-dim128"),
    pytest.param(5, 31, 40, 130, 128, id="stacked-5x31-Ld130"),
    pytest.param(9, 32, 20, 64, 128, id="stacked-9x32-Ld64"),
    pytest.param(9, 27, 11, 70, 96, id="stacked-9x27-dim96"),  # Hopper: documents on M, 3 warpgroups
    pytest.param(6, 32, 5, 90, 96, id="stacked-6x32-dim96"),   # ... 2 warpgroups
    pytest.param(2, 100, 7, 50, 64, id="Lq100-dim64"),
    pytest.param(1, 300, 3, 40, 32, id="Lq300-simt"),
    pytest.param(2, 8, 5, 20, 100, id="dim100"),
]
DTYPES = ["float16", "bfloat16", "float32", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nq,lq,nd,ld,dim", SHAPES)
def test_score_padded_masked(dtype, nq, lq, nd, ld, dim):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(nq * 7 + lq + ld + dim)
    q64, d64, q, d = _inputs(rng, nq, lq, nd, ld, dim, dtype)
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (nd, ld), 0.6)
    got = cm.score(q, d, q_mask=_like(q, q_mask), d_mask=_like(q, d_mask))
    expected = reference.maxsim_reference(q64, d64, q_mask, d_mask)
    bound = 2 * naive_error(q64, d64, q_mask, d_mask, dtype, expected) + NOISE[dtype] * lq
    assert_scores_match(got, expected, atol=bound)
    if nd >= 3:
        assert np.all(to_numpy(got)[:, 1] == -np.inf)  # holey_mask empties document 1
    again = cm.score(q, d, q_mask=_like(q, q_mask), d_mask=_like(q, d_mask))
    np.testing.assert_array_equal(to_numpy(got), to_numpy(again))  # bitwise reproducible


def _like(reference_array, mask):
    import cupy

    if type(reference_array).__module__.startswith("torch"):
        import torch

        return torch.from_numpy(mask).cuda()
    return cupy.asarray(mask)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_fp32_accuracy_and_unmasked(dtype):
    rng = np.random.default_rng(1)
    q64, d64, q, d = _inputs(rng, 4, 32, 50, 77, 128, dtype)
    got = to_numpy(cm.score(q, d))
    expected = reference.maxsim_reference(q64, d64)
    if dtype == "float32":
        assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5
    assert_scores_match(got, expected, atol=1e-3 * 32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_pairs_and_packed(dtype):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    import cupy

    rng = np.random.default_rng(2)
    q64, d64, q, d = _inputs(rng, 6, 32, 6, 90, 128, dtype)
    q_mask, d_mask = holey_mask(rng, (6, 32)), holey_mask(rng, (6, 90))
    got = cm.score_pairs(q, d, q_mask=_like(q, q_mask), d_mask=_like(q, d_mask))
    assert_scores_match(got, reference.maxsim_pairs_reference(q64, d64, q_mask, d_mask), atol=2e-2)
    lengths = np.array([90, 0, 1, 17, 64, 33])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens64 = np.concatenate([d64[n, :lengths[n]] for n in range(6)])
    tokens = _to_device(tokens64, dtype)
    for offset_dtype in (np.int32, np.int64):
        device_offsets = _like(q, offsets.astype(offset_dtype))
        got = cm.score_packed(q, tokens, device_offsets, q_mask=_like(q, q_mask))
        expected = reference.maxsim_packed_reference(q64, tokens64, offsets, q_mask)
        assert_scores_match(got, expected, atol=2e-2)
        assert np.all(to_numpy(got)[:, 1] == -np.inf)


def test_non_finite_policy_on_gpu():
    import cupy

    rng = np.random.default_rng(3)
    q = unit_rows(rng, (2, 32, 64), np.float16)
    d = unit_rows(rng, (4, 40, 64), np.float16)
    d_mask = np.ones((4, 40), bool)
    d[0, 5, 3] = np.nan
    d[1, 39, 0] = -np.inf
    d[2, 7, 1] = np.nan
    d_mask[2, 7] = False
    for dtype in (np.float16, np.float32):
        got = cm.score(cupy.asarray(q.astype(dtype)), cupy.asarray(d.astype(dtype)), d_mask=cupy.asarray(d_mask))
        expected = reference.maxsim_reference(q, d, None, d_mask)
        assert_scores_match(got, expected, atol=1e-2)
        assert np.isnan(to_numpy(got)[:, :2]).all()
    # A non-finite query token poisons its own query's scores only, also against documents
    # whose masked and padding rows would otherwise hide a -inf similarity (-FLT_MAX bias).
    q_bad = unit_rows(rng, (3, 32, 64), np.float16)
    q_bad[1, 4, :] = -np.inf
    q_bad[2, 9, 0] = np.inf
    d_ok = unit_rows(rng, (5, 70, 64), np.float16)
    holes = rng.random((5, 70)) < 0.8
    for dtype in ("float16", "bfloat16"):
        if dtype == "bfloat16":
            torch = pytest.importorskip("torch")
            args = [torch.from_numpy(x.astype(np.float32)).to("cuda", torch.bfloat16) for x in (q_bad, d_ok)]
            mask = torch.from_numpy(holes).cuda()
        else:
            args, mask = [cupy.asarray(x) for x in (q_bad, d_ok)], cupy.asarray(holes)
        got = to_numpy(cm.score(*args, d_mask=mask))
        assert np.isnan(got[1:]).all() and np.isfinite(got[0]).all()
        assert_scores_match(got, reference.maxsim_reference(q_bad, d_ok, None, holes), atol=1e-2)


def test_non_contiguous_and_misaligned():
    import cupy

    rng = np.random.default_rng(4)
    base = unit_rows(rng, (6, 50, 136), np.float16)
    q = cupy.asarray(unit_rows(rng, (2, 16, 128), np.float16))
    d = cupy.asarray(base)[:, :, :128]       # row stride 136: aligned, tensor-core path
    d_odd = cupy.asarray(base)[:, 1:, 3:131]  # misaligned rows: CUDA-core path
    for view in (d, d_odd, d[::2]):
        expected = reference.maxsim_reference(q.get(), view.get())
        assert_scores_match(cm.score(q, view), expected, atol=1e-2)


def test_every_framework_in_and_out():
    torch = pytest.importorskip("torch")
    import cupy

    rng = np.random.default_rng(5)
    q64 = unit_rows(rng, (3, 32, 128), np.float64)
    d64 = unit_rows(rng, (20, 60, 128), np.float64)
    expected = reference.maxsim_reference(q64.astype(np.float16), d64.astype(np.float16))
    q, d = q64.astype(np.float16), d64.astype(np.float16)

    got = cm.score(cupy.asarray(q), cupy.asarray(d))
    assert isinstance(got, cupy.ndarray)
    assert_scores_match(got, expected, atol=1e-2)

    got = cm.score(torch.from_numpy(q).cuda(), torch.from_numpy(d).cuda())
    assert isinstance(got, torch.Tensor) and got.is_cuda
    assert_scores_match(got, expected, atol=1e-2)

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tq, td = torch.from_numpy(q).cuda(), torch.from_numpy(d).cuda()
        got = cm.score(tq, td)
    stream.synchronize()
    assert_scores_match(got, expected, atol=1e-2)

    got = cm.score(q, d)  # NumPy in: CPU backend, NumPy out
    assert isinstance(got, np.ndarray)
    assert_scores_match(got, expected, atol=1e-3)

    jax = pytest.importorskip("jax")
    gpu = [device for device in jax.devices() if device.platform == "gpu"]
    if gpu:
        jq = jax.device_put(jax.numpy.asarray(q), gpu[0])
        jd = jax.device_put(jax.numpy.asarray(d), gpu[0])
        got = cm.score(jq, jd)
        assert isinstance(got, jax.Array) and next(iter(got.devices())).platform == "gpu"
        assert_scores_match(np.asarray(got), expected, atol=1e-2)
        got = cm.score(jq.astype(jax.numpy.bfloat16), jd.astype(jax.numpy.bfloat16))
        assert isinstance(got, jax.Array)


def _replay_watch(framework, monkeypatch):
    """(a function putting NumPy arrays on the GPU in ``framework``, the list that grows by one
    each time a recorded launch is asked to replay), no launch recorded yet."""
    from cupy_maxsim import _replay

    replayed = count_calls(monkeypatch, _replay.Replay, "__call__")
    _replay.replays.clear()
    return replay_device(framework), replayed


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_repeated_calls_replay_the_launch(framework, monkeypatch):
    """After a plain call, later calls with the same signature replay its launch (_replay.py):
    new data must give new scores; emptied caches and a pointer the kernel cannot take, under
    the same signature, must go the general way; inputs stay as passed."""
    from cupy_maxsim import _cache, _replay

    device, replayed = _replay_watch(framework, monkeypatch)
    rng = np.random.default_rng(12)
    for step in range(4):
        q = unit_rows(rng, (2, 32, 128), np.float16)
        d = unit_rows(rng, (40, 70, 128), np.float16)
        q_dev, d_dev = device(q), device(d)
        if step == 2:  # the same signature with every cache emptied (no replay left to ask)
            _cache.clear_all()
        if step == 3:  # ... and with documents 2 bytes off 16-byte alignment
            d_dev = off_alignment(device, d)
        got = cm.score(q_dev, d_dev)
        assert_scores_match(got, reference.maxsim_reference(q, d), atol=1e-2)
        assert np.array_equal(to_numpy(q_dev), q) and np.array_equal(to_numpy(d_dev), d)
        single = cm.score(q_dev[1], d_dev)  # one 2-D query: a signature of its own
        assert_scores_match(single, reference.maxsim_reference(q[1:], d)[0], atol=1e-2)
    assert len(replayed) == 4  # every call but the first of each signature after an emptying
    assert len(_replay.replays) == 2


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_masked_and_int8_calls_replay_the_launch(framework, monkeypatch):
    """Calls with masks (holes, a query mask, an empty document) and int8 calls with their
    scales are replayed after their first call of a signature, patching the masks' and scales'
    pointers: new data under the same signature must give the reference's scores and winners;
    float queries against int8 documents (quantised per call) are never recorded."""
    from cupy_maxsim import _replay

    device, replayed = _replay_watch(framework, monkeypatch)
    rng = np.random.default_rng(13)
    for step in range(3):
        q = unit_rows(rng, (3, 32, 128), np.float16)
        d = unit_rows(rng, (40, 90, 128), np.float16)
        q_mask, d_mask = holey_mask(rng, (3, 32), 0.9), holey_mask(rng, (40, 90), 0.7)
        expected = reference.maxsim_reference(q, d, q_mask, d_mask)
        got, argmax = cm.score(device(q), device(d), q_mask=device(q_mask), d_mask=device(d_mask), return_argmax=True)
        assert_scores_match(got, expected, atol=1e-2)
        ref_argmax = reference.maxsim_argmax_reference(q, d, q_mask, d_mask)
        winners = to_numpy(argmax)
        np.testing.assert_array_equal(winners[ref_argmax == -1], -1)  # masked tokens, the empty document
        assert (winners == ref_argmax).mean() > 0.99  # fp32 accumulation may break a near-tie otherwise
        (q8, qs), (d8, ds) = cm.quantize_int8(device(q)), cm.quantize_int8(device(d))
        expected8 = reference.maxsim_reference(to_numpy(q8) * to_numpy(qs)[..., None], to_numpy(d8) * to_numpy(ds)[..., None])
        assert_scores_match(cm.score(q8, d8, q_scale=qs, d_scale=ds), expected8, atol=1e-3, rtol=1e-5)
        single = cm.score(q8[0], d8, q_scale=qs[0], d_scale=ds)  # one query: a signature of its own
        assert_scores_match(single, expected8[0], atol=1e-3, rtol=1e-5)
        on_the_fly = cm.score(device(q), d8, d_scale=ds)  # float queries quantised per call
        assert_scores_match(on_the_fly, expected8, atol=2e-2)
    assert len(replayed) == 6  # steps 1 and 2 of the three recorded signatures
    assert len(_replay.replays) == 3


def test_pack_on_gpu_round_trips():
    import cupy

    rng = np.random.default_rng(6)
    d = cupy.asarray(unit_rows(rng, (5, 30, 64), np.float16))
    mask = cupy.asarray(holey_mask(rng, (5, 30)))
    tokens, offsets = cm.pack(d, mask)
    q = cupy.asarray(unit_rows(rng, (2, 8, 64), np.float16))
    assert_scores_match(cm.score_packed(q, tokens, offsets), cm.score(q, d, d_mask=mask), atol=1e-5)


def test_a_thread_that_never_touched_cuda():
    """Forward, backward plan and gradients from a fresh thread (torch runs backward on threads
    of its own): such a thread has no current CUDA context, and the driver launches need one.
    Same results as on the main thread."""
    import threading

    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    rng = np.random.default_rng(5)
    q = torch.as_tensor(unit_rows(rng, (3, 16, 64)), device="cuda").half().requires_grad_(True)
    d = torch.as_tensor(unit_rows(rng, (5, 40, 64)), device="cuda").half().requires_grad_(True)

    def step():
        scores = cmt.maxsim(q, d)
        grads = torch.autograd.grad(scores.sum(), (q, d))
        torch.cuda.current_stream().synchronize()
        return [scores.detach(), *grads]

    expected, got = step(), {}

    def work():
        try:
            got["results"] = step()
        except Exception as error:  # noqa: BLE001 - reported below
            got["error"] = error

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert "error" not in got, got.get("error")
    for a, b in zip(got["results"], expected):
        assert torch.equal(a, b)


def test_torch_backward_first_thing_in_a_process():
    """torch runs backward on a device thread of its own; when our backward is the first thing
    that thread does, it has no current CUDA context (bench/profile_step.py failed so:
    CUDA_ERROR_INVALID_CONTEXT)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch")
    code = ("import torch, cupy_maxsim.torch as cmt\n"
            "q = torch.randn(2, 8, 64, device='cuda', dtype=torch.half, requires_grad=True)\n"
            "d = torch.randn(3, 20, 64, device='cuda', dtype=torch.half, requires_grad=True)\n"
            "cmt.maxsim(q, d).backward(torch.ones(2, 3, device='cuda'))\n"
            "torch.cuda.synchronize()\n"
            "assert torch.isfinite(q.grad).all() and torch.isfinite(d.grad).all()\n")
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_errors_come_before_any_launch():
    import cupy

    q = cupy.zeros((2, 8, 64), cupy.float16)
    with pytest.raises(ValueError, match="offsets must be non-decreasing"):
        cm.score_packed(q, cupy.zeros((10, 64), cupy.float16), cupy.asarray([0, 4, 11]))
    with pytest.raises(ValueError, match="same device"):
        cm.score(q, np.zeros((3, 4, 64), np.float16))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_device_offsets_summary_matches_numpy(dtype):
    """The one-launch check of device-resident offsets (first, last, decreasing steps, longest)
    against NumPy: one offset, a ragged corpus of a million documents, strided and reversed
    views, exact counts of decreasing steps; and score_packed's error from it."""
    import cupy

    from cupy_maxsim._gpu import launch as gpu_launch

    rng = np.random.default_rng(5)
    ragged = np.concatenate([[3], 3 + np.cumsum(rng.integers(0, 300, 1_000_000))])
    bumpy = rng.integers(-50, 1000, 5001)
    wrapping = np.array([0, 2**62 + 1, -2**62, 5])  # a step of -2^63 - 1 wraps to +2^63 - 1
    for host in (np.array([7]), ragged, bumpy) + ((wrapping,) if dtype == np.int64 else ()):
        device = cupy.asarray(host.astype(dtype))
        for view in (device, device[::3], device[::-1]):
            values = cupy.asnumpy(view).astype(np.int64)
            steps = np.diff(values)
            decreasing = int((values[1:] < values[:-1]).sum())
            operand = _arrays.as_operand(view, "offsets")
            got = gpu_launch.offsets_summary(operand.ptr, operand.shape[0], operand.strides[0], dtype == np.int64,
                                           operand.device, operand.stream)
            assert got[:3] == (values[0], values[-1], decreasing)
            if decreasing == 0:  # the longest step is defined for valid (non-decreasing) offsets only
                assert got[3] == (int(steps.max()) if steps.size else 0)
    q = cupy.zeros((1, 8, 64), cupy.float16)
    with pytest.raises(ValueError, match="and 2 decreasing steps"):
        cm.score_packed(q, cupy.zeros((20, 64), cupy.float16), cupy.asarray([0, 4, 3, 9, 8, 20], dtype=dtype))


@pytest.mark.parametrize("tile_n", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_hopper_kernel_against_reference_and_mma_sync(dtype, tile_n, monkeypatch):
    """The warpgroup-MMA kernel (sm_90) against float64 and against the mma.sync kernel: one,
    three and thirteen queries (one to three warpgroups), queries straddling warpgroups (Lq 27),
    documents of 1..300 tokens with holes, packed documents, non-finite document elements, and the saved argmax."""
    import cupy

    from cupy_maxsim import tuning
    from cupy_maxsim._gpu.device import device_properties

    if device_properties(cupy.cuda.runtime.getDevice())[3] != 90:
        pytest.skip("the warpgroup-MMA kernel runs on sm_90 only")
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    nq, lq, nd, ld, dim = 13, 27, 37, 300, 128
    source_dtype = "float16" if dtype == "int8" else dtype
    q64, d64, q, d = _inputs(rng, nq, lq, nd, ld, dim, source_dtype)
    d64[4, 17, 5] = np.nan
    d64[6, 250, 0] = -np.inf
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.9), holey_mask(rng, (nd, ld), 0.7)
    d_mask[7, 1:] = False  # a one-token document
    d_mask[8, 64:] = False  # exactly one full tile
    d64[9, 20, 3], d_mask[9, 20] = np.nan, False  # NaN in a masked token: no effect
    d = _to_device(d64, source_dtype)
    masks = dict(q_mask=_like(q, q_mask), d_mask=_like(q, d_mask))
    extra = {}
    if dtype == "int8":
        (q8, q_scale), (d8, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
        q64 = to_numpy(q8) * to_numpy(q_scale)[..., None]
        d64 = to_numpy(d8) * to_numpy(d_scale)[..., None]
        q, d, extra = q8, d8, dict(q_scale=q_scale, d_scale=d_scale)

    def both_kernels(call):
        """(Hopper kernel with TMA copies, mma.sync kernel); the Hopper kernel with cp.async
        copies is checked here to give the same scores (and argmax) as with TMA."""
        results = []
        for use_wgmma, use_tma in ((True, True), (True, False), (False, True)):
            # int8 with 128 forced: 128-row tiles where one query's warpgroups split the
            # documents, 64 elsewhere (its only 128-row build).
            with tuning.override(use_wgmma=use_wgmma, use_tma=use_tma, wgmma_tile_rows=tile_n):
                results.append(call())
        tma, copies, classic = results
        for a, b in zip(tma if isinstance(tma, tuple) else (tma,), copies if isinstance(copies, tuple) else (copies,)):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        return tma, classic

    expected = reference.maxsim_reference(q64, d64, q_mask, d_mask)
    tolerance = 2 * naive_error(q64, d64, q_mask, d_mask, source_dtype, expected) + NOISE[source_dtype] * lq
    hopper, classic = both_kernels(lambda: cm.score(q, d, **masks, **extra))
    assert_scores_match(hopper, expected, atol=tolerance)
    assert_scores_match(hopper, classic, atol=tolerance)
    real = q_mask.any(axis=1)  # a query with no real token scores 0, NaN documents or not
    assert np.isnan(to_numpy(hopper)[real][:, [4, 6]]).all() and (to_numpy(hopper)[:, 1] == -np.inf).all()
    assert np.isfinite(to_numpy(hopper)[:, 9]).all()
    # Fewer queries than three warpgroups hold: one query (three warpgroups holding it and
    # splitting the documents) and three (two warpgroups of two queries each).
    for count in (1, 3):
        few = dict(q_mask=masks["q_mask"][:count], d_mask=masks["d_mask"])
        if dtype == "int8":
            few.update(q_scale=extra["q_scale"][:count], d_scale=extra["d_scale"])
        hopper, classic = both_kernels(lambda: cm.score(q[:count], d, **few))
        assert_scores_match(hopper, expected[:count], atol=tolerance)
        assert_scores_match(hopper, classic, atol=tolerance)
    # One query against long documents, several per block and no mask (TMA): each warpgroup's
    # next document lies more than its share of a ring ahead.
    long64 = _round_to(unit_rows(rng, (400, 700, dim), np.float64), source_dtype)
    long_docs, long_extra = _to_device(long64, source_dtype), {}
    if dtype == "int8":
        long_docs, long_scale = cm.quantize_int8(long_docs)
        long64 = to_numpy(long_docs) * to_numpy(long_scale)[..., None]
        long_extra = dict(q_scale=extra["q_scale"][:1], d_scale=long_scale)
    everywhere = np.ones(long64.shape[:2], bool)
    expected_long = reference.maxsim_reference(q64[:1], long64, q_mask[:1], everywhere)
    long_tolerance = 2 * naive_error(q64[:1], long64, q_mask[:1], everywhere, source_dtype, expected_long) + NOISE[
        source_dtype] * lq
    hopper, classic = both_kernels(lambda: cm.score(q[:1], long_docs, q_mask=masks["q_mask"][:1], **long_extra))
    assert_scores_match(hopper, expected_long, atol=long_tolerance)
    assert_scores_match(hopper, classic, atol=long_tolerance)
    del long64  # the float64 copy (287 MB); the device copy goes with the test

    # Many short documents: each block walks a range of them, query groups starting at
    # different documents (the rotation applies when the corpus fits in L2).
    many64 = _round_to(unit_rows(rng, (600, 40, dim), np.float64), source_dtype)
    many_mask = holey_mask(rng, (600, 40), 0.8)
    many = _to_device(many64, source_dtype)
    if dtype == "int8":
        many, many_scale = cm.quantize_int8(many)
        many64 = to_numpy(many) * to_numpy(many_scale)[..., None]
        many_extra = dict(q_scale=extra["q_scale"], d_scale=many_scale)
    else:
        many_extra = {}
    hopper, classic = both_kernels(lambda: cm.score(q, many, q_mask=masks["q_mask"], d_mask=_like(q, many_mask),
                                                    **many_extra))
    expected_many = reference.maxsim_reference(q64, many64, q_mask, many_mask)
    assert_scores_match(hopper, expected_many, atol=tolerance)
    assert_scores_match(hopper, classic, atol=tolerance)

    lengths = rng.integers(0, 300, nd)
    lengths[:3] = [0, 1, 64]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens64 = np.concatenate([d64[n, :lengths[n]] for n in range(nd)])
    tokens = _to_device(tokens64, source_dtype) if dtype != "int8" else cupy.asarray(
        np.concatenate([to_numpy(d8)[n, :lengths[n]] for n in range(nd)]).astype(np.int8))
    packed_extra = dict(extra)
    if dtype == "int8":
        packed_extra["d_scale"] = cupy.asarray(np.concatenate(
            [to_numpy(d_scale)[n, :lengths[n]] for n in range(nd)]).astype(np.float32))
    hopper, classic = both_kernels(lambda: cm.score_packed(q, tokens, _like(q, offsets), q_mask=masks["q_mask"],
                                                           **packed_extra))
    expected = reference.maxsim_packed_reference(q64, tokens64, offsets, q_mask)
    assert_scores_match(hopper, expected, atol=tolerance)
    assert_scores_match(hopper, classic, atol=tolerance)
    # ... and one query (its warpgroups splitting the packed documents).
    one_extra = dict(packed_extra, q_scale=packed_extra["q_scale"][:1]) if dtype == "int8" else packed_extra
    hopper, classic = both_kernels(lambda: cm.score_packed(q[:1], tokens, _like(q, offsets), q_mask=masks["q_mask"][:1],
                                                           **one_extra))
    assert_scores_match(hopper, expected[:1], atol=tolerance)
    assert_scores_match(hopper, classic, atol=tolerance)

    if dtype != "int8":
        finite = np.isfinite(d64).all(axis=-1)
        masks = dict(q_mask=_like(q, q_mask), d_mask=_like(q, d_mask & finite))
        (_, hopper_argmax), (_, classic_argmax) = both_kernels(lambda: cm.score(q, d, return_argmax=True, **masks))
        sims = np.einsum("qtd,njd->qntj", q64, np.nan_to_num(d64))
        sims = np.where((d_mask & finite)[None, :, None, :], sims, -np.inf)
        top2 = np.sort(sims, axis=-1)[..., -2:]
        clear = (top2[..., 1] - top2[..., 0] > 1e-2) & q_mask[:, None, :] & (d_mask & finite).any(-1)[None, :, None]
        np.testing.assert_array_equal(to_numpy(hopper_argmax)[clear], to_numpy(classic_argmax)[clear])
        np.testing.assert_array_equal(to_numpy(hopper_argmax)[clear], sims.argmax(-1)[clear])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("num_docs", [131, 133, 813])
def test_one_query_ranges_of_unequal_length(dtype, num_docs):
    """One query group takes a block an SM whose ranges differ by one document
    (planner.balanced_ranges, common.cuh block_doc_range): every document scored once, on both
    tensor-core kernels, packed or padded."""
    import cupy

    from cupy_maxsim import tuning
    from cupy_maxsim._gpu.device import device_properties
    from cupy_maxsim._plan.forward import balanced_ranges

    sm_count = device_properties(cupy.cuda.runtime.getDevice())[0]
    per, ranges, long_ranges = balanced_ranges(num_docs, sm_count)
    assert per * long_ranges + (per - 1) * (ranges - long_ranges) == num_docs
    rng = np.random.default_rng(num_docs)
    q64, d64, q, d = _inputs(rng, 1, 32, num_docs, 9, 64, dtype)
    lengths = rng.integers(0, 10, num_docs)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens64 = np.concatenate([d64[n, :lengths[n]] for n in range(num_docs)])
    tokens = _to_device(tokens64, dtype)
    expected = reference.maxsim_reference(q64, d64)
    expected_packed = reference.maxsim_packed_reference(q64, tokens64, offsets)
    tolerance = 2 * naive_error(q64, d64, np.ones((1, 32), bool), np.ones((num_docs, 9), bool), dtype, expected) + \
        NOISE[dtype] * 32
    for use_wgmma in (True, False):
        with tuning.override(use_wgmma=use_wgmma, balanced_ranges=True):
            assert_scores_match(cm.score(q, d), expected, atol=tolerance)
            assert_scores_match(cm.score_packed(q, tokens, cupy.asarray(offsets)), expected_packed,
                                atol=tolerance)


@pytest.mark.slow
def test_past_two_to_the_31_elements():
    """140,000 x 128 x 128 fp16 = 2.29e9 elements: 64-bit index arithmetic throughout."""
    import cupy

    num_docs, doc_length, dim = 140_000, 128, 128
    assert num_docs * doc_length * dim > 2**31
    d = cupy.random.default_rng(7).standard_normal((num_docs, doc_length, dim), dtype=cupy.float32)
    d = d.astype(cupy.float16)
    q = cupy.random.default_rng(8).standard_normal((32, dim), dtype=cupy.float32).astype(cupy.float16)
    got = cm.score(q, d)
    sample = np.r_[0:3, num_docs // 2, num_docs - 3:num_docs]
    expected = reference.maxsim_reference(q.get(), d[sample].get())
    assert_scores_match(got[sample], expected, atol=2e-2, rtol=1e-3)
    assert bool(cupy.isfinite(got).all())
