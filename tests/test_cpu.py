"""The NumPy backend (and the public API on host arrays) against the float64 reference."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _cpu, reference
from support import assert_scores_match, holey_mask, unit_rows

# Tolerance per input dtype: fp32 accumulation of unit-norm rows; float64 is exact-ish.
ATOL = {np.float16: 2e-5, np.float32: 2e-5, np.float64: 1e-12}

SHAPES = [
    pytest.param(1, 1, 3, 1, 8, id="Lq1-Ld1"),
    pytest.param(2, 31, 5, 7, 64, id="Lq31-Ld7-dim64"),
    pytest.param(3, 33, 4, 13, 96, id="Lq33-Ld13-dim96"),
    pytest.param(1, 32, 6, 300, 128, id="Lq32-Ld300-dim128"),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("nq,lq,nd,ld,dim", SHAPES)
def test_score_padded(dtype, nq, lq, nd, ld, dim):
    rng = np.random.default_rng(lq * 1000 + ld)
    q, d = unit_rows(rng, (nq, lq, dim), dtype), unit_rows(rng, (nd, ld, dim), dtype)
    q_mask, d_mask = holey_mask(rng, (nq, lq)), holey_mask(rng, (nd, ld))
    got = cm.score(q, d, q_mask=q_mask, d_mask=d_mask)
    assert got.dtype == (np.float64 if dtype == np.float64 else np.float32)
    assert_scores_match(got, reference.maxsim_reference(q, d, q_mask, d_mask), atol=ATOL[dtype])
    single = cm.score(q[0], d, q_mask=q_mask[0], d_mask=d_mask)
    assert single.shape == (nd,)
    assert_scores_match(single, got[0], atol=ATOL[dtype])


@pytest.mark.parametrize("nq,lq,nd,ld,dim", SHAPES)
def test_score_pairs_and_packed(nq, lq, nd, ld, dim):
    rng = np.random.default_rng(5)
    q, d = unit_rows(rng, (nd, lq, dim)), unit_rows(rng, (nd, ld, dim))
    q_mask, d_mask = holey_mask(rng, (nd, lq)), holey_mask(rng, (nd, ld))
    assert_scores_match(cm.score_pairs(q, d, q_mask=q_mask, d_mask=d_mask),
                        reference.maxsim_pairs_reference(q, d, q_mask, d_mask), atol=2e-5)
    tokens, offsets = cm.pack(d, d_mask)
    assert offsets.dtype == np.int64 and offsets[-1] == d_mask.sum()
    assert_scores_match(cm.score_packed(q, tokens, offsets, q_mask=q_mask),
                        reference.maxsim_reference(q, d, q_mask, d_mask), atol=2e-5)


def test_packed_with_empty_documents_and_int32_offsets():
    rng = np.random.default_rng(11)
    lengths = [3, 0, 1, 0, 5]
    docs = [unit_rows(rng, (n, 16)) for n in lengths]
    tokens, offsets = cm.pack(docs)
    q = unit_rows(rng, (2, 4, 16))
    got = cm.score_packed(q, tokens, offsets.astype(np.int32))
    assert_scores_match(got, reference.maxsim_packed_reference(q, tokens, offsets), atol=2e-5)
    assert np.all(got[:, [1, 3]] == -np.inf)


def test_blocking_bounds_memory_and_matches(monkeypatch):
    """A tiny block budget forces many blocks (queries and documents split): same answer."""
    monkeypatch.setattr(_cpu, "BLOCK_ELEMENTS", 50)
    rng = np.random.default_rng(3)
    q, d = unit_rows(rng, (5, 4, 8)), unit_rows(rng, (9, 6, 8))
    d_mask = holey_mask(rng, (9, 6))
    assert_scores_match(cm.score(q, d, d_mask=d_mask), reference.maxsim_reference(q, d, None, d_mask), atol=2e-5)
    tokens, offsets = cm.pack(d, d_mask)
    assert_scores_match(cm.score_packed(q, tokens, offsets), reference.maxsim_reference(q, d, None, d_mask),
                        atol=2e-5)
    assert_scores_match(cm.score_pairs(q[:5], d[:5]), reference.maxsim_pairs_reference(q[:5], d[:5]), atol=2e-5)


def test_masked_padding_never_wins():
    """All real similarities negative: zero padding must not win the max (ColBERT #62)."""
    q = np.ones((1, 2, 4), np.float32)
    d = np.concatenate([-np.ones((1, 3, 4)), np.zeros((1, 2, 4))], axis=1).astype(np.float32)
    d_mask = np.array([[True, True, True, False, False]])
    assert cm.score(q, d, d_mask=d_mask)[0, 0] == -8.0


def test_ties_and_degenerate_sizes():
    q = np.ones((1, 3, 4), np.float32)
    d = np.ones((2, 4, 4), np.float32)
    assert np.all(cm.score(q, d) == 12.0)
    assert cm.score(q[:, :0], d).tolist() == [[0.0, 0.0]]           # no query token
    assert cm.score(q, d[:, :0]).tolist() == [[-np.inf, -np.inf]]    # no document token
    assert cm.score(q, d[:0]).shape == (1, 0)
    assert cm.score(q[:, :, :0], d[:, :, :0]).tolist() == [[0.0, 0.0]]


def test_non_finite_policy():
    rng = np.random.default_rng(2)
    q, d = unit_rows(rng, (2, 3, 8)), unit_rows(rng, (4, 5, 8))
    d_mask = np.ones((4, 5), bool)
    d[0, 2, 1] = np.nan
    d[1, 4, 0] = -np.inf
    d[2, 1, 3] = np.nan
    d_mask[2, 1] = False  # NaN in padding is ignored
    q_mask = np.ones((2, 3), bool)
    got = cm.score(q, d, q_mask=q_mask, d_mask=d_mask)
    assert np.isnan(got[:, :2]).all() and np.isfinite(got[:, 2:]).all()
    assert_scores_match(got, reference.maxsim_reference(q, d, q_mask, d_mask), atol=2e-5)


def test_inputs_are_not_modified():
    rng = np.random.default_rng(4)
    q, d = unit_rows(rng, (2, 3, 8)), unit_rows(rng, (4, 5, 8))
    d_mask = holey_mask(rng, (4, 5))
    copies = q.copy(), d.copy(), d_mask.copy()
    cm.score(q, d, d_mask=d_mask)
    for before, after in zip(copies, (q, d, d_mask)):
        np.testing.assert_array_equal(before, after)


def test_non_contiguous_inputs():
    rng = np.random.default_rng(6)
    q = unit_rows(rng, (3, 8, 32))[:, ::2, ::2]
    d = unit_rows(rng, (5, 20, 32))[::2, ::3, ::2]
    assert_scores_match(cm.score(q, d), reference.maxsim_reference(q, d), atol=2e-5)


def test_torch_cpu_in_torch_out():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, d = unit_rows(rng, (2, 4, 16)), unit_rows(rng, (3, 5, 16))
    got = cm.score(torch.from_numpy(q), torch.from_numpy(d))
    assert isinstance(got, torch.Tensor)
    assert_scores_match(got, reference.maxsim_reference(q, d), atol=2e-5)
    got_bf16 = cm.score(torch.from_numpy(q).bfloat16(), torch.from_numpy(d).bfloat16())
    ref_bf16 = reference.maxsim_reference(torch.from_numpy(q).bfloat16().float().numpy(),
                                          torch.from_numpy(d).bfloat16().float().numpy())
    assert_scores_match(got_bf16, ref_bf16, atol=2e-5)


def test_host_calls_are_never_replayed():
    """Replayed launches and backward templates (_replay.py) are for GPU arrays: a
    host call records nothing, whatever its framework, and a repeated one still answers right."""
    from cupy_maxsim import _replay, training

    try:
        import torch
    except ImportError:  # the NumPy half still runs
        torch = None
    rng = np.random.default_rng(21)
    _replay.replays.clear()
    _replay.backward_templates.clear()
    for _ in range(2):
        q, d = unit_rows(rng, (2, 5, 16), np.float32), unit_rows(rng, (3, 7, 16), np.float32)
        expected = reference.maxsim_reference(q, d)
        assert_scores_match(cm.score(q, d), expected, atol=1e-5)
        if torch is not None:
            tq, td = torch.from_numpy(q), torch.from_numpy(d)
            assert_scores_match(cm.score(tq, td).numpy(), expected, atol=1e-5)
            _, argmax = cm.score(tq, td, return_argmax=True)
            grad_q, _ = training.backward_plan(tq, td, argmax).gradients(torch.ones(2, 3))
            expected_q, _ = reference.maxsim_backward_reference(np.ones((2, 3)), q, d, argmax.numpy())
            np.testing.assert_allclose(grad_q.numpy(), expected_q, atol=1e-5)
    assert _replay.replays == {} and _replay.backward_templates == {}


def test_jax_cpu_in_jax_out():
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(9)
    q, d = unit_rows(rng, (2, 4, 16)), unit_rows(rng, (3, 5, 16))
    got = cm.score(jax.numpy.asarray(q), jax.numpy.asarray(d))
    assert isinstance(got, jax.Array)
    assert_scores_match(got, reference.maxsim_reference(q, d), atol=2e-5)


class _Producer:
    """A bare __dlpack__ producer (no known framework)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def test_any_dlpack_producer():
    rng = np.random.default_rng(10)
    q, d = unit_rows(rng, (2, 4, 16)), unit_rows(rng, (3, 5, 16))
    got = cm.score(_Producer(q), _Producer(d))
    assert isinstance(got, np.ndarray)
    assert_scores_match(got, reference.maxsim_reference(q, d), atol=2e-5)


def test_on_device_sets_the_device_once_per_thread(monkeypatch):
    """The driver launches need a current context; a fresh thread has none though cudaGetDevice
    answers 0: gpu_device.on_device sets the device on a thread's first call, then stays a no-op,
    and switches (a context manager) when another device is current. A stand-in for CuPy's
    runtime records the calls (no GPU here)."""
    import contextlib
    import sys
    import threading
    import types

    from cupy_maxsim._gpu import device as gpu_device

    calls = []
    runtime = types.SimpleNamespace(getDevice=lambda: 0, setDevice=lambda device: calls.append(device))
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, Device=lambda device: ("switch", device)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(gpu_device, "_thread_devices", threading.local())
    assert isinstance(gpu_device.on_device(0), contextlib.nullcontext) and calls == [0]
    assert isinstance(gpu_device.on_device(0), contextlib.nullcontext) and calls == [0]  # once per thread
    assert gpu_device.on_device(1) == ("switch", 1)
    thread = threading.Thread(target=lambda: gpu_device.on_device(0))
    thread.start()
    thread.join()
    assert calls == [0, 0]  # the new thread set it too
