"""Training: the saved argmax, score_backward, and the torch / JAX adapters.

CPU tests run everywhere (the NumPy backend against the float64 loop reference, finite
differences through torch.autograd.gradcheck and jax's check_grads). GPU tests (marked gpu)
compare the kernels' gradients, given the kernel's own argmax, with the float64 reference under
the FlashAttention error rule, and check that two runs are bitwise identical.
"""

import contextlib

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _arrays, reference
from support import count_calls, holey_mask, off_alignment, replay_device, to_numpy, unit_rows


def _inputs(rng, nq, lq, nd, ld, dim, dtype=np.float64):
    return unit_rows(rng, (nq, lq, dim), dtype), unit_rows(rng, (nd, ld, dim), dtype)


# ---- CPU ------------------------------------------------------------------------------------


def test_cpu_argmax_matches_reference_with_masks():
    rng = np.random.default_rng(0)
    q, d = _inputs(rng, 4, 9, 6, 13, 16)
    q_mask, d_mask = holey_mask(rng, (4, 9), 0.8), holey_mask(rng, (6, 13), 0.6)
    scores, argmax = cm.score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
    assert argmax.dtype == np.int16 and argmax.shape == (4, 6, 9)
    np.testing.assert_array_equal(argmax, reference.maxsim_argmax_reference(q, d, q_mask, d_mask))
    assert np.all(argmax[:, 1] == -1)  # holey_mask empties document 1
    assert np.all(argmax.transpose(0, 2, 1)[~q_mask] == -1)
    np.testing.assert_allclose(scores, reference.maxsim_reference(q, d, q_mask, d_mask))


def test_ties_go_to_the_lowest_document_token():
    q = np.ones((1, 2, 4))
    d = np.zeros((2, 5, 4))
    d[0, [1, 3]] = 1.0  # rows 1 and 3 tie
    d[1, :] = 2.0       # every row ties
    _, argmax = cm.score(q, d, return_argmax=True)
    np.testing.assert_array_equal(argmax[0], [[1, 1], [0, 0]])


def _check_gradients(grad_q, grad_d, grad, q, d, argmax, atol=1e-12):
    expected_q, expected_d = reference.maxsim_backward_reference(grad, q, d, argmax)
    np.testing.assert_allclose(to_numpy(grad_q), expected_q, atol=atol)
    np.testing.assert_allclose(to_numpy(grad_d), expected_d, atol=atol)


def test_cpu_backward_matches_reference():
    rng = np.random.default_rng(1)
    q, d = _inputs(rng, 5, 7, 8, 11, 12)
    q_mask, d_mask = holey_mask(rng, (5, 7), 0.8), holey_mask(rng, (8, 11), 0.5)
    _, argmax = cm.score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
    grad = rng.standard_normal((5, 8))
    grad_q, grad_d = cm.score_backward(grad, q, d, argmax)
    assert grad_q.shape == q.shape and grad_d.shape == d.shape and grad_q.dtype == np.float64
    _check_gradients(grad_q, grad_d, grad, q, d, argmax)
    assert np.all(grad_q[~q_mask] == 0) and np.all(grad_d[~d_mask] == 0)


def test_cpu_backward_pairs_packed_and_single_query():
    rng = np.random.default_rng(2)
    q, d = _inputs(rng, 4, 6, 4, 9, 8)
    d_mask = holey_mask(rng, (4, 9), 0.6)
    grad = rng.standard_normal(4)
    # pairs: the reference is the all-pairs one restricted to the diagonal
    _, argmax = cm.score_pairs(q, d, d_mask=d_mask, return_argmax=True)
    grad_q, grad_d = cm.score_backward(grad, q, d, argmax, pairs=True)
    full = np.full((4, 4, 6), -1)
    full[np.arange(4), np.arange(4)] = argmax
    _check_gradients(grad_q, grad_d, np.diag(grad), q, d, full)
    # packed: the same documents without their masked tokens
    tokens, offsets = cm.pack(d, mask=d_mask)
    grad2 = rng.standard_normal((4, 4))
    _, packed_argmax = cm.score_packed(q, tokens, offsets, return_argmax=True)
    _, padded_argmax = cm.score(q, d, d_mask=d_mask, return_argmax=True)
    grad_q, grad_t = cm.score_backward(grad2, q, tokens, packed_argmax, offsets=offsets)
    expected_q, expected_d = reference.maxsim_backward_reference(grad2, q, d, padded_argmax)
    np.testing.assert_allclose(grad_q, expected_q, atol=1e-12)
    np.testing.assert_allclose(grad_t, expected_d[d_mask], atol=1e-12)
    # one query (Lq, D)
    _, argmax1 = cm.score(q[0], d, return_argmax=True)
    grad_q1, grad_d1 = cm.score_backward(grad, q[0], d, argmax1)
    assert grad_q1.shape == q[0].shape
    _check_gradients(grad_q1[None], grad_d1, grad[None], q[:1], d, argmax1[None])


def test_backward_validation():
    rng = np.random.default_rng(3)
    q, d = _inputs(rng, 2, 3, 4, 5, 8, np.float32)
    scores, argmax = cm.score(q, d, return_argmax=True)
    grad = np.ones_like(scores)
    with pytest.raises(ValueError, match="grad_scores must have the scores' shape"):
        cm.score_backward(grad[:1], q, d, argmax)
    with pytest.raises(ValueError, match="argmax must have shape"):
        cm.score_backward(grad, q, d, argmax[:, :, :2])
    with pytest.raises(TypeError, match="argmax must be int16 or int32"):
        cm.score_backward(grad, q, d, argmax.astype(np.float32))
    with pytest.raises(TypeError, match="grad_scores must be a float array"):
        cm.score_backward(grad.astype(np.int32), q, d, argmax)
    with pytest.raises(TypeError, match="int8 scoring has no gradient"):
        cm.score_backward(grad, q.astype(np.int8), d, argmax)
    with pytest.raises(ValueError, match="pairs and offsets"):
        cm.score_backward(grad, q, d, argmax, pairs=True, offsets=np.array([0, 1]))
    with pytest.raises(TypeError, match="same dtype"):
        cm.score_backward(grad, q, d.astype(np.float64), argmax)


def test_backward_plan_serves_several_gradients():
    """backward_plan (what the autograd adapters build in the forward) gives score_backward's
    gradients, for as many gradients of the scores as asked (a retained graph), and checks each."""
    from cupy_maxsim import training

    rng = np.random.default_rng(5)
    q, d = _inputs(rng, 3, 4, 5, 6, 8)
    _, argmax = cm.score(q, d, return_argmax=True)
    plan = training.backward_plan(q, d, argmax)
    for _ in range(2):
        grad = rng.standard_normal((3, 5))
        for got, expected in zip(plan.gradients(grad), cm.score_backward(grad, q, d, argmax)):
            np.testing.assert_array_equal(to_numpy(got), to_numpy(expected))
    with pytest.raises(ValueError, match="grad_scores must have the scores' shape"):
        plan.gradients(grad[:1])


def test_backward_leaves_inputs_alone():
    rng = np.random.default_rng(4)
    q, d = _inputs(rng, 2, 3, 4, 5, 8)
    _, argmax = cm.score(q, d, return_argmax=True)
    grad = rng.standard_normal((2, 4))
    copies = [x.copy() for x in (q, d, argmax, grad)]
    cm.score_backward(grad, q, d, argmax)
    for before, after in zip(copies, (q, d, argmax, grad)):
        np.testing.assert_array_equal(before, after)


def test_torch_gradcheck_float64_cpu():
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    torch.manual_seed(0)
    q = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    d = torch.randn(4, 7, 8, dtype=torch.float64, requires_grad=True)
    q_mask, d_mask = torch.rand(3, 5) > 0.2, torch.rand(4, 7) > 0.3
    assert torch.autograd.gradcheck(lambda q, d: cmt.maxsim(q, d, q_mask, d_mask), (q, d))
    assert torch.autograd.gradcheck(lambda q, d: cmt.maxsim_pairs(q, d[:3], q_mask, d_mask[:3]), (q, d))
    tokens, offsets = cm.pack(d.detach(), mask=d_mask)
    tokens.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q, t: cmt.maxsim_packed(q, t, offsets, q_mask), (q, tokens))


def test_torch_packed_step_checks_its_offsets_once(monkeypatch):
    """The packed forward hands its offsets' checked bounds to the backward plan (on a GPU a
    second check would wait for the forward kernel), and the gradients equal the NumPy-level
    path's, which checks them twice."""
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt
    from cupy_maxsim import _problem

    torch.manual_seed(1)
    q = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    tokens = torch.randn(20, 8, dtype=torch.float64, requires_grad=True)
    offsets = torch.tensor([0, 4, 4, 13, 18])  # an empty document, tokens past the last one
    grad = torch.randn(2, 4, dtype=torch.float64)
    checks = count_calls(monkeypatch, _problem, "check_offsets")
    cmt.maxsim_packed(q, tokens, offsets).backward(grad)
    assert len(checks) == 1
    _, argmax = cm.score_packed(q.detach(), tokens.detach(), offsets, return_argmax=True)
    grad_q, grad_t = cm.score_backward(grad, q.detach(), tokens.detach(), argmax, offsets=offsets)
    assert len(checks) == 3
    torch.testing.assert_close(q.grad, grad_q, rtol=0, atol=0)
    torch.testing.assert_close(tokens.grad, grad_t, rtol=0, atol=0)
    assert (tokens.grad[18:] == 0).all()


def test_torch_inputs_changed_in_place_before_backward_raise():
    """q, d (or the packed tokens and offsets) changed in place between the forward and the
    backward: the gradients would belong to other inputs, so the backward raises, as torch's
    own saved tensors do; unchanged inputs still train."""
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    torch.manual_seed(2)
    for change in ("q", "d", "offsets"):
        q = torch.randn(2, 3, 8, requires_grad=True)
        tokens = torch.randn(9, 8, requires_grad=True)
        offsets = torch.tensor([0, 4, 9])
        scores = cmt.maxsim_packed(q, tokens, offsets) if change == "offsets" else cmt.maxsim(q, tokens.view(3, 3, 8))
        with torch.no_grad():
            {"q": q, "d": tokens, "offsets": offsets}[change].mul_(1)  # a new version, same values
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            scores.sum().backward()
    q = torch.randn(2, 3, 8, requires_grad=True)
    cmt.maxsim(q, tokens.detach().view(3, 3, 8)).sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_torch_gradients_are_not_differentiable_again():
    """Under create_graph=True the gradients come back, and differentiating them again raises
    (no silent zero second derivative)."""
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    q = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    d = torch.randn(4, 5, 8, dtype=torch.float64, requires_grad=True)
    scores = cmt.maxsim(q, d)
    (grad_q,) = torch.autograd.grad((scores ** 2).sum(), q, create_graph=True)  # grad_scores has a graph
    _, argmax = cm.score(q.detach(), d.detach(), return_argmax=True)
    expected_q, _ = cm.score_backward(2 * scores.detach(), q.detach(), d.detach(), argmax)
    torch.testing.assert_close(grad_q.detach(), expected_q, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad_q.sum().backward()


def test_torch_no_grad_saves_nothing():
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    q, d = torch.randn(2, 3, 8), torch.randn(4, 5, 8)
    scores = cmt.maxsim(q, d)
    assert scores.shape == (2, 4) and not scores.requires_grad


def test_jax_grad_under_jit_cpu():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax.experimental.buffer_callback")
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import cupy_maxsim.jax as cmj

    rng = np.random.default_rng(5)
    q, d = (jnp.asarray(x) for x in _inputs(rng, 3, 5, 4, 7, 8, np.float32))
    q_mask, d_mask = jnp.asarray(holey_mask(rng, (3, 5), 0.8)), jnp.asarray(holey_mask(rng, (4, 7), 0.6))
    weights = jnp.asarray(rng.standard_normal((3, 4)), jnp.float32)
    loss = jax.jit(lambda q, d: (jnp.where(jnp.isfinite(s := cmj.maxsim(q, d, q_mask, d_mask)), s, 0) * weights).sum())
    grad_q, grad_d = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, d)
    _, argmax = cm.score(np.asarray(q), np.asarray(d), q_mask=np.asarray(q_mask), d_mask=np.asarray(d_mask),
                         return_argmax=True)
    w = np.where(np.isfinite(reference.maxsim_reference(q, d, q_mask, d_mask)), np.asarray(weights), 0)
    _check_gradients(grad_q, grad_d, w, np.asarray(q), np.asarray(d), argmax, atol=1e-5)
    with jax.enable_x64(True):
        q64, d64 = (jnp.asarray(x) for x in _inputs(rng, 2, 4, 3, 6, 8))
        check_grads(lambda q, d: cmj.maxsim(q, d), (q64, d64), order=1, modes=["rev"])
        tokens, offsets = cm.pack(np.asarray(d64))
        check_grads(lambda q, t: cmj.maxsim_packed(q, t, jnp.asarray(offsets)), (q64, jnp.asarray(tokens)),
                    order=1, modes=["rev"])


def test_jax_under_vmap_and_traced_values_cpu():
    """cupy_maxsim.jax under jax.vmap (the callbacks run once per element, in order) equals the
    batched call, forward and per-example gradients, inside jit too; the NumPy-level functions
    given traced values say to use the adapter (it was a ConcretizationTypeError from inside)."""
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax.experimental.buffer_callback")
    import jax.numpy as jnp

    import cupy_maxsim.jax as cmj

    rng = np.random.default_rng(6)
    q, d = (jnp.asarray(x) for x in _inputs(rng, 3, 5, 4, 7, 8, np.float32))
    mapped = jax.jit(jax.vmap(lambda one: cmj.maxsim(one, d)))(q)  # one (Lq, D) query at a time
    np.testing.assert_array_equal(np.asarray(mapped), np.asarray(cmj.maxsim(q, d)))
    per_example = jax.vmap(jax.grad(lambda one: cmj.maxsim(one, d).sum()))(q)
    whole = jax.grad(lambda all_q: cmj.maxsim(all_q, d).sum())(q)
    np.testing.assert_allclose(np.asarray(per_example), np.asarray(whole), rtol=1e-6, atol=1e-6)
    pairs = jax.vmap(lambda a, b: cmj.maxsim_pairs(a[None], b[None])[0])(q, d[:3])
    np.testing.assert_array_equal(np.asarray(pairs), np.asarray(cmj.maxsim_pairs(q, d[:3])))
    for traced in (jax.jit(lambda a: cm.score(a, d)), jax.grad(lambda a: cm.score(a, d).sum())):
        with pytest.raises(TypeError, match="traced JAX value.*cupy_maxsim.jax.maxsim"):
            traced(q)


# ---- GPU ------------------------------------------------------------------------------------

NOISE = {"float16": 2e-4, "bfloat16": 2e-4, "float32": 1e-6, "float64": 1e-12}


def _round_to(x, dtype):
    from test_gpu import _round_to as round_to

    return round_to(x, dtype)


def _device(x64, dtype):
    from test_gpu import _to_device

    return _to_device(x64, dtype)


def _device_mask(like, mask):
    from test_gpu import _like

    return _like(like, mask)


def _gradient_bound(expected, dtype, terms):
    """FlashAttention rule for a result stored in `dtype`: twice the error of rounding the exact
    gradient to the input precision, plus accumulation noise per summed term."""
    naive = np.abs(_round_to(expected, dtype) - expected).max()
    return 2 * naive + NOISE[dtype] * terms


def _assert_valid_winners(argmax, q64, d64, q_mask, d_mask, dtype):
    """The kernel's argmax reaches the max (up to fp32 accumulation), -1 exactly where no token
    can win."""
    expected = reference.maxsim_argmax_reference(q64, d64, q_mask, d_mask)
    argmax = to_numpy(argmax).astype(np.int64)
    np.testing.assert_array_equal(argmax < 0, expected < 0)
    sims = np.einsum("qtd,njd->qntj", q64, d64)
    sims = np.where(d_mask[None, :, None, :], sims, -np.inf)
    best = sims.max(axis=-1)
    chosen = np.take_along_axis(sims, np.maximum(argmax, 0)[..., None], axis=-1)[..., 0]
    real = expected >= 0
    assert np.all(best[real] - chosen[real] <= (1e-3 if dtype in ("float16", "bfloat16") else 1e-5))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("nq,lq,nd,ld,dim", [
    pytest.param(3, 32, 10, 300, 128, id="colbert"),
    pytest.param(2, 33, 5, 1023, 128, id="Lq33-Ld1023"),
    pytest.param(9, 31, 7, 7, 96, id="stacked-Ld7-dim96"),
    pytest.param(2, 5, 3, 20, 100, id="dim100"),
    pytest.param(40, 32, 3, 50, 64, id="many-queries"),
    pytest.param(4, 8, 300, 20, 64, id="many-documents"),  # dQ in document chunks, summed in the dD launch
    pytest.param(3, 32, 4, 70, 320, id="dim320"),  # fat dims: the forward streams k (issue 24)
    pytest.param(2, 32, 3, 40, 2560, id="dim2560"),
])
def test_gpu_backward_matches_reference(dtype, nq, lq, nd, ld, dim, monkeypatch):
    pytest.importorskip("torch") if dtype == "bfloat16" else None
    monkeypatch.setattr(_arrays, "POISON_OUTPUTS", True)
    rng = np.random.default_rng(nq + lq + ld + dim)
    q64 = _round_to(unit_rows(rng, (nq, lq, dim), np.float64), dtype)
    d64 = _round_to(unit_rows(rng, (nd, ld, dim), np.float64), dtype)
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (nd, ld), 0.6)
    q, d = _device(q64, dtype), _device(d64, dtype)
    masks = {"q_mask": _device_mask(q, q_mask), "d_mask": _device_mask(q, d_mask)}
    scores, argmax = cm.score(q, d, return_argmax=True, **masks)
    assert str(argmax.dtype).endswith("int16")
    _assert_valid_winners(argmax, q64, d64, q_mask, d_mask, dtype)
    grad64 = rng.standard_normal((nq, nd))
    grad = _device(grad64.astype(np.float32).astype(np.float64), "float32")
    grad_q, grad_d = cm.score_backward(grad, q, d, argmax)
    expected_q, expected_d = reference.maxsim_backward_reference(grad64.astype(np.float32), q64, d64,
                                                                 to_numpy(argmax))
    np.testing.assert_allclose(to_numpy(grad_q), expected_q, rtol=0,
                               atol=_gradient_bound(expected_q, dtype, nd))
    np.testing.assert_allclose(to_numpy(grad_d), expected_d, rtol=0,
                               atol=_gradient_bound(expected_d, dtype, nq * lq))
    again_q, again_d = cm.score_backward(grad, q, d, argmax)
    np.testing.assert_array_equal(to_numpy(grad_q), to_numpy(again_q))  # bitwise reproducible
    np.testing.assert_array_equal(to_numpy(grad_d), to_numpy(again_d))
    _, argmax_again = cm.score(q, d, return_argmax=True, **masks)
    np.testing.assert_array_equal(to_numpy(argmax), to_numpy(argmax_again))


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_backward_plan_serves_several_gradients(packed):
    """On the GPU the plan queues the inverse CSR when it is made; every gradient then reuses it
    and matches score_backward bitwise (which builds its own)."""
    import cupy

    from cupy_maxsim import training

    rng = np.random.default_rng(6)
    q64, d64 = _inputs(rng, 9, 32, 11, 70, 64)
    q, d = cupy.asarray(q64, cupy.float16), cupy.asarray(d64, cupy.float16)
    extra = {}
    if packed:
        lengths = np.array([0, 1, 70, 33, 64, 65, 2, 70, 9, 40, 70])
        offsets = cupy.asarray(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        d = cupy.concatenate([d[n, :lengths[n]] for n in range(11)])
        _, argmax = cm.score_packed(q, d, offsets, return_argmax=True)
        extra = dict(offsets=offsets)
    else:
        _, argmax = cm.score(q, d, return_argmax=True)
    plan = training.backward_plan(q, d, argmax, **extra)
    for _ in range(2):
        grad = cupy.asarray(rng.standard_normal((9, 11)), cupy.float32)
        for got, expected in zip(plan.gradients(grad), cm.score_backward(grad, q, d, argmax, **extra)):
            np.testing.assert_array_equal(to_numpy(got), to_numpy(expected))


@pytest.mark.gpu
@pytest.mark.parametrize("num_queries", [2, 8])  # Hopper: queries on the MMA's M; documents on M
def test_gpu_ties_go_to_the_lowest_document_token(num_queries):
    """Exact ties across lanes, warps and tiles: each query token is a row of document 0 that
    also appears 50, 100 and 150 rows later; the winner is the first copy."""
    import cupy

    rng = np.random.default_rng(14)
    d = unit_rows(rng, (3, 200, 64), np.float16)
    sources = np.arange(46)
    for shift in (50, 100, 150):
        d[0, sources + shift] = d[0, sources]
    picks = np.arange(32)[None, :] + 2 * np.arange(num_queries)[:, None]  # rows 0..45 of document 0
    q = d[0][picks]
    _, argmax = cm.score(cupy.asarray(q), cupy.asarray(d), return_argmax=True)
    np.testing.assert_array_equal(to_numpy(argmax)[:, 0], picks)


@pytest.mark.gpu
def test_gpu_int8_winners_with_many_queries():
    """int8 queries and documents, enough queries for documents on the MMA's M (the Hopper
    kernel), masked: the winners reach the max of the dequantised similarities."""
    import cupy

    rng = np.random.default_rng(15)
    q64, d64 = _inputs(rng, 8, 32, 5, 90, 128)
    d_mask = holey_mask(rng, (5, 90), 0.7)
    (qv, qs), (dv, ds) = cm.quantize_int8(cupy.asarray(q64)), cm.quantize_int8(cupy.asarray(d64))
    _, argmax = cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(d_mask), return_argmax=True)
    q_deq = to_numpy(qv).astype(np.float64) * to_numpy(qs)[..., None]
    d_deq = to_numpy(dv).astype(np.float64) * to_numpy(ds)[..., None]
    _assert_valid_winners(argmax, q_deq, d_deq, np.ones((8, 32), bool), d_mask, "float32")


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_gpu_repeated_steps_reuse_the_layouts(framework, monkeypatch):
    """A training step repeats one signature: the forward with winners is replayed and the
    backward plan starts from a template (_replay.py). New data under the same
    signature must give the general path's winners and gradients bitwise; documents off 16-byte
    alignment must go the general way (and leave a template of their own); the inputs stay as
    passed."""
    from cupy_maxsim import _backward, _replay, training

    device = replay_device(framework)
    rebound = count_calls(monkeypatch, _backward.BackwardPlan, "_rebound")
    _replay.replays.clear()
    _replay.backward_templates.clear()
    rng = np.random.default_rng(13)
    for step in range(4):
        q = unit_rows(rng, (6, 32, 64), np.float16)
        d = unit_rows(rng, (10, 70, 64), np.float16)
        q_dev, d_dev = device(q), device(d)
        if step == 3:  # the same signature with documents 2 bytes off 16-byte alignment
            d_dev = off_alignment(device, d)
        scores, argmax = cm.score(q_dev, d_dev, return_argmax=True)
        np.testing.assert_array_equal(to_numpy(argmax), reference.maxsim_argmax_reference(
            q.astype(np.float64), d.astype(np.float64)))  # unit rows, dim 64: no fp16 near-ties here
        plan = training.backward_plan(q_dev, d_dev, argmax)
        grad = device(rng.standard_normal((6, 10)).astype(np.float32))
        got = plan.gradients(grad)
        expected = cm.score_backward(grad, q_dev, d_dev, argmax)  # the general path, a plan of its own
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        assert np.array_equal(to_numpy(q_dev), q) and np.array_equal(to_numpy(d_dev), d)
    assert len(rebound) == 2  # steps 1 and 2; step 3's alignment is a signature of its own
    assert len(_replay.replays) == 1 and len(_replay.backward_templates) == 2


@pytest.mark.gpu
def test_gpu_torch_steps_replay_and_capture():
    """Repeated torch training steps (score_with_plan replayed: the forward and the backward's
    layout under one lookup, the first gradients staged) give the general path's scores and
    gradients bitwise, each step on new data, and a second backward of one forward adds; a
    warmed-up step captured in a CUDA graph and replayed on new data copied into
    its inputs gives them too."""
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt
    from cupy_maxsim import _replay

    _replay.replays.clear()
    _replay.backward_templates.clear()
    generator = torch.Generator(device="cuda").manual_seed(5)

    def data():
        unit = lambda shape: torch.nn.functional.normalize(  # noqa: E731
            torch.randn(shape, device="cuda", generator=generator), dim=-1).half()
        return unit((6, 32, 64)), unit((10, 70, 64)), torch.randn(6, 10, device="cuda", generator=generator)

    def assert_general_path(q, d, grad, scores, grad_q, grad_d):
        expected_scores, argmax = cm.score(q, d, return_argmax=True)
        expected_q, expected_d = cm.score_backward(grad, q, d, argmax)
        assert torch.equal(scores, expected_scores)
        assert torch.equal(grad_q, expected_q) and torch.equal(grad_d, expected_d)

    for _ in range(3):
        q, d, grad = data()
        q_leaf, d_leaf = q.clone().requires_grad_(True), d.clone().requires_grad_(True)
        scores = cmt.maxsim(q_leaf, d_leaf)
        scores.backward(grad)
        assert_general_path(q, d, grad, scores.detach(), q_leaf.grad, d_leaf.grad)
    assert _replay.replay_key(q_leaf, d_leaf, "plan") in _replay.replays
    # A second backward of one replayed forward (retain_graph): the first gradients (staged in
    # the forward, then held by autograd as q.grad and d.grad) stay, the second get outputs of
    # their own and add to them.
    q, d, grad = data()
    q_leaf, d_leaf = q.clone().requires_grad_(True), d.clone().requires_grad_(True)
    scores = cmt.maxsim(q_leaf, d_leaf)
    scores.backward(grad, retain_graph=True)
    first_q, first_d = q_leaf.grad.clone(), d_leaf.grad.clone()
    scores.backward(grad)
    assert_general_path(q, d, grad, scores.detach(), first_q, first_d)
    assert torch.equal(q_leaf.grad, 2 * first_q) and torch.equal(d_leaf.grad, 2 * first_d)

    q_static, d_static, grad_static = data()
    q_static.requires_grad_(True)
    d_static.requires_grad_(True)

    def step():
        q_static.grad = d_static.grad = None
        scores = cmt.maxsim(q_static, d_static)
        scores.backward(grad_static)
        return scores

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_scores = step()
    for _ in range(2):
        q, d, grad = data()
        with torch.no_grad():
            q_static.copy_(q), d_static.copy_(d), grad_static.copy_(grad)
        graph.replay()
        torch.cuda.synchronize()
        assert_general_path(q, d, grad, static_scores.detach(), q_static.grad, d_static.grad)


@pytest.mark.gpu
def test_gpu_hot_rows_pairs_packed_and_long_documents():
    import cupy

    rng = np.random.default_rng(7)
    # Every query token picks token 3 of each document: one hot row per document (split path).
    common = unit_rows(rng, (64,), np.float64)
    q64 = common + 0.3 * unit_rows(rng, (64, 32, 64), np.float64)
    q64 /= np.linalg.norm(q64, axis=-1, keepdims=True)
    d64 = 0.01 * unit_rows(rng, (5, 40, 64), np.float64)
    d64[:, 3] = common * 50
    q64, d64 = _round_to(q64, "float32"), _round_to(d64, "float32")
    q, d = cupy.asarray(q64.astype(np.float32)), cupy.asarray(d64.astype(np.float32))
    _, argmax = cm.score(q, d, return_argmax=True)
    assert (to_numpy(argmax) == 3).all()
    grad64 = rng.standard_normal((64, 5)).astype(np.float32)
    grad_q, grad_d = cm.score_backward(cupy.asarray(grad64), q, d, argmax)
    expected_q, expected_d = reference.maxsim_backward_reference(grad64, q64, d64, to_numpy(argmax))
    np.testing.assert_allclose(to_numpy(grad_d), expected_d, atol=1e-6 * 64 * 32 * np.abs(expected_d).max())
    np.testing.assert_allclose(to_numpy(grad_q), expected_q, atol=1e-5)
    # pairs
    _, pair_argmax = cm.score_pairs(q[:5], d, return_argmax=True)
    gq, gd = cm.score_backward(cupy.asarray(grad64[:5, 0]), q[:5], d, pair_argmax, pairs=True)
    full = np.full((5, 5, 32), -1)
    full[np.arange(5), np.arange(5)] = to_numpy(pair_argmax)
    eq, ed = reference.maxsim_backward_reference(np.diag(grad64[:5, 0]), q64[:5], d64, full)
    np.testing.assert_allclose(to_numpy(gq), eq, atol=1e-5)
    np.testing.assert_allclose(to_numpy(gd), ed, atol=1e-5)
    # packed with an empty document, offsets leaving tokens outside every document
    d_mask = holey_mask(rng, (5, 40), 0.5)
    tokens, offsets = cm.pack(d, mask=cupy.asarray(d_mask))
    tokens = cupy.concatenate([tokens, cupy.ones((3, 64), cupy.float32)])
    _, packed_argmax = cm.score_packed(q, tokens, offsets, return_argmax=True)
    gq, gt = cm.score_backward(cupy.asarray(grad64), q, tokens, packed_argmax, offsets=offsets)
    _, padded_argmax = cm.score(q, d, d_mask=cupy.asarray(d_mask), return_argmax=True)
    eq, ed = reference.maxsim_backward_reference(grad64, q64, d64, to_numpy(padded_argmax))
    np.testing.assert_allclose(to_numpy(gq), eq, atol=1e-4)
    np.testing.assert_allclose(to_numpy(gt)[:-3], ed[d_mask], atol=1e-4 * max(1, np.abs(ed).max()))
    assert np.all(to_numpy(gt)[-3:] == 0)
    # a document longer than 32767 tokens: int32 winners
    long_doc = cupy.asarray(unit_rows(rng, (1, 33000, 64), np.float32))
    _, long_argmax = cm.score(q[:2], long_doc, return_argmax=True)
    assert long_argmax.dtype == cupy.int32
    gq, gd = cm.score_backward(cupy.ones((2, 1), cupy.float32), q[:2], long_doc, long_argmax)
    eq, ed = reference.maxsim_backward_reference(np.ones((2, 1)), q64[:2], long_doc.get().astype(np.float64),
                                                 to_numpy(long_argmax))
    np.testing.assert_allclose(to_numpy(gd), ed, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["masked", "hot-rows", "packed", "pairs", "bfloat16", "many-documents",
                                  "many-documents-dense"])
def test_gpu_one_launch_backward_matches_two(case, monkeypatch):
    """The one-launch backward (dD blocks inverting their own rows' winners in shared memory,
    dQ in one document chunk) against the two-launch one (a global inverse CSR, dQ in chunks):
    every dD row sums the same sources in the same order, so dD is bitwise equal; dQ's sums
    associate differently, and both match the float64 reference."""
    from cupy_maxsim import _replay, training, tuning

    rng = np.random.default_rng(11)
    dtype = "bfloat16" if case == "bfloat16" else "float16"
    pytest.importorskip("torch") if dtype == "bfloat16" else None
    # many-documents: 130 documents (a query token's dQ walks them all in one launch, in chunks in
    # two), with the 8-byte kernels (sparse rows) and the _wide ones (dense rows)
    nq, nd, ld, dim = {"hot-rows": (64, 6, 40, 64), "many-documents": (4, 130, 60, 128),
                       "many-documents-dense": (32, 130, 40, 128)}.get(case, (6, 20, 300, 128))
    q64 = unit_rows(rng, (nq, 32, dim), np.float64)
    d64 = unit_rows(rng, (nd, ld, dim), np.float64)
    if case == "hot-rows":  # every query token picks token 3 of each document (split rows)
        common = unit_rows(rng, (dim,), np.float64)
        q64 = common + 0.3 * q64
        q64 /= np.linalg.norm(q64, axis=-1, keepdims=True)
        d64 = 0.01 * d64
        d64[:, 3] = common
    q64, d64 = _round_to(q64, dtype), _round_to(d64, dtype)
    q, d = _device(q64, dtype), _device(d64, dtype)
    d_mask = holey_mask(rng, (nd, ld), 0.6)
    kwargs, grad_shape = {}, (nq, nd)
    if case == "pairs":  # query i with document i
        d, d64, nd = d[:nq], d64[:nq], nq
        _, argmax = cm.score_pairs(q, d, return_argmax=True)
        kwargs, grad_shape = {"pairs": True}, (nq,)
        operand = d
    elif case == "packed":
        operand, offsets = cm.pack(d, mask=_device_mask(q, d_mask))
        _, argmax = cm.score_packed(q, operand, offsets, return_argmax=True)
        kwargs = {"offsets": offsets}
    else:
        _, argmax = cm.score(q, d, d_mask=_device_mask(q, d_mask) if case != "hot-rows" else None,
                             return_argmax=True)
        operand = d
    grad64 = rng.standard_normal(grad_shape).astype(np.float32).astype(np.float64)
    grad = _device(grad64, "float32")

    def gradients():
        _replay.backward_templates.clear()
        plan = training.backward_plan(q, operand, argmax, **kwargs)
        grad_q, grad_d = plan.gradients(grad)
        return len(plan._launches), to_numpy(grad_q), to_numpy(grad_d)

    launches_one, q_one, d_one = gradients()
    with tuning.override(bwd_fused_shared_limit=0):
        launches_two, q_two, d_two = gradients()
    assert (launches_one, launches_two) == (1, 2)
    np.testing.assert_array_equal(d_one, d_two)
    if case == "pairs":
        full = np.full((nd, nd, 32), -1)
        full[np.arange(nd), np.arange(nd)] = to_numpy(argmax)
        expected_q, _ = reference.maxsim_backward_reference(np.diag(grad64), q64, d64, full)
    elif case == "packed":
        _, padded = cm.score(q, d, d_mask=_device_mask(q, d_mask), return_argmax=True)
        expected_q, _ = reference.maxsim_backward_reference(grad64, q64, d64, to_numpy(padded))
    else:
        expected_q, _ = reference.maxsim_backward_reference(grad64, q64, d64, to_numpy(argmax))
    for grad_q in (q_one, q_two):
        np.testing.assert_allclose(grad_q.astype(np.float64), expected_q, rtol=0,
                                   atol=_gradient_bound(expected_q, dtype, nd))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dim,packed", [(128, False), (136, False), (64, True)])
def test_gpu_wide_backward_matches_the_8_byte_layout(dtype, dim, packed, monkeypatch):
    """Dense rows in 16 bits take the _wide kernels (16-byte rows, dD's rows a pair at a time):
    each dD row sums the same sources in the same order as the 8-byte kernels' segment walk, so
    dD is bitwise equal; dQ's halves associate differently, and both match the float64
    reference. dim 136: a second dim chunk with one lane of each half in it."""
    from cupy_maxsim import _replay, training, tuning

    pytest.importorskip("torch") if dtype == "bfloat16" else None
    rng = np.random.default_rng(dim)
    nq, nd, ld = 24, 9, 70  # 768 sources a document over 70 rows: about 11 a row
    q64 = _round_to(unit_rows(rng, (nq, 32, dim), np.float64), dtype)
    d64 = _round_to(unit_rows(rng, (nd, ld, dim), np.float64), dtype)
    q, d = _device(q64, dtype), _device(d64, dtype)
    d_mask = holey_mask(rng, (nd, ld), 0.7)
    if packed:
        operand, offsets = cm.pack(d, mask=_device_mask(q, d_mask))
        _, argmax = cm.score_packed(q, operand, offsets, return_argmax=True)
        kwargs = {"offsets": offsets}
        _, padded_argmax = cm.score(q, d, d_mask=_device_mask(q, d_mask), return_argmax=True)
    else:
        operand, kwargs = d, {}
        _, argmax = cm.score(q, d, d_mask=_device_mask(q, d_mask), return_argmax=True)
        padded_argmax = argmax
    grad64 = rng.standard_normal((nq, nd)).astype(np.float32).astype(np.float64)
    grad = _device(grad64, "float32")

    def gradients():
        _replay.backward_templates.clear()
        plan = training.backward_plan(q, operand, argmax, **kwargs)
        grad_q, grad_d = plan.gradients(grad)
        return [launch.kernel.name for launch in plan._launches], to_numpy(grad_q), to_numpy(grad_d)

    kernels_wide, q_wide, d_wide = gradients()
    with tuning.override(bwd_wide_max_rows_per_warp=0):
        kernels_narrow, q_narrow, d_narrow = gradients()
    assert all(name.endswith("_wide") for name in kernels_wide) and kernels_wide, kernels_wide
    assert not any(name.endswith("_wide") for name in kernels_narrow)
    np.testing.assert_array_equal(d_wide, d_narrow)
    expected_q, expected_d = reference.maxsim_backward_reference(grad64, q64, d64, to_numpy(padded_argmax))
    for grad_q in (q_wide, q_narrow):
        np.testing.assert_allclose(grad_q.astype(np.float64), expected_q, rtol=0,
                                   atol=_gradient_bound(expected_q, dtype, nd))
    got_d = d_wide.astype(np.float64)
    np.testing.assert_allclose(got_d, expected_d[d_mask] if packed else expected_d, rtol=0,
                               atol=_gradient_bound(expected_d, dtype, nq * 32))


@pytest.mark.gpu
def test_gpu_torch_autograd_matches_cpu_and_runs_on_torch_stream():
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    torch.manual_seed(0)
    q = torch.randn(6, 32, 128, dtype=torch.float64)
    d = torch.randn(9, 77, 128, dtype=torch.float64)
    q_mask, d_mask = torch.rand(6, 32) > 0.2, torch.rand(9, 77) > 0.3
    grads = []
    for device in ("cpu", "cuda"):
        qq = q.detach().to(device).clone().requires_grad_(True)
        dd = d.detach().to(device).clone().requires_grad_(True)
        stream = torch.cuda.Stream() if device == "cuda" else None
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            scores = cmt.maxsim(qq, dd, q_mask.to(device), d_mask.to(device))
            (scores * torch.arange(9, device=device)).sum().backward()
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        grads.append((qq.grad.cpu(), dd.grad.cpu()))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=1e-10)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=1e-10)


@pytest.mark.gpu
def test_gpu_jax_grad_under_jit():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import cupy_maxsim.jax as cmj

    rng = np.random.default_rng(9)
    q64, d64 = unit_rows(rng, (8, 32, 128), np.float32), unit_rows(rng, (16, 60, 128), np.float32)
    gpu = jax.devices("gpu")[0]
    q, d = jax.device_put(q64, gpu), jax.device_put(d64, gpu)
    loss = lambda q, d: jax.nn.log_softmax(cmj.maxsim(q, d)[:, :8], axis=1).trace()  # noqa: E731
    grad_q, grad_d = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, d)
    cpu_q, cpu_d = jax.grad(loss, argnums=(0, 1))(jax.device_put(q64, jax.devices("cpu")[0]),
                                                  jax.device_put(d64, jax.devices("cpu")[0]))
    np.testing.assert_allclose(np.asarray(grad_q), np.asarray(cpu_q), atol=2e-5)
    np.testing.assert_allclose(np.asarray(grad_d), np.asarray(cpu_d), atol=2e-5)
    tokens, offsets = cm.pack(d64[:, :50])
    packed = lambda q, t: cmj.maxsim_packed(q, t, jax.device_put(offsets, gpu)).sum()  # noqa: E731
    gq, gt = jax.jit(jax.grad(packed, argnums=(0, 1)))(q, jax.device_put(tokens, gpu))
    assert gt.shape == tokens.shape and np.isfinite(np.asarray(gq)).all()
    assert jnp.asarray(gq).dtype == jnp.float32
