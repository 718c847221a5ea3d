"""score_candidates and cupy_maxsim.torch.maxsim_candidates (issue 26, item 1): each query
against its own K candidates, against the float64 reference per query; winners, int8, every
framework, gradients (torch gradcheck), validation."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference
from support import holey_mask, unit_rows


def _case(rng, nq=4, k=3, lq=6, ld=9, dim=8):
    q, d = unit_rows(rng, (nq, lq, dim), np.float64), unit_rows(rng, (nq, k, ld, dim), np.float64)
    return q, d, holey_mask(rng, (nq, lq), 0.8), rng.random((nq, k, ld)) < 0.7


def _expected(q, d, q_mask, d_mask):
    return np.stack([reference.maxsim_reference(q[n:n + 1], d[n], q_mask[n:n + 1], d_mask[n])[0] for n in range(len(q))])


def test_candidates_match_the_reference_per_query():
    q, d, q_mask, d_mask = _case(np.random.default_rng(0))
    d_mask[1, 2] = False  # an empty candidate: -inf
    scores, winners = cm.score_candidates(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
    np.testing.assert_allclose(scores, _expected(q, d, q_mask, d_mask))
    assert scores.shape == (4, 3) and winners.shape == (4, 3, 6) and scores[1, 2] == -np.inf
    for n in range(4):
        np.testing.assert_array_equal(winners[n], reference.maxsim_argmax_reference(q[n:n + 1], d[n], q_mask[n:n + 1],
                                                                                    d_mask[n])[0])


def test_int8_candidates():
    q, d, _, _ = _case(np.random.default_rng(1))
    (q8, qs), (d8, ds) = cm.quantize_int8(q.astype(np.float32)), cm.quantize_int8(d.astype(np.float32))
    got = cm.score_candidates(q8, d8, q_scale=qs, d_scale=ds)
    want = _expected(q8 * qs[..., None].astype(np.float64), d8 * ds[..., None].astype(np.float64),
                     np.ones(qs.shape, bool), np.ones(ds.shape, bool))
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_frameworks(framework):
    module = pytest.importorskip(framework)
    q, d, q_mask, d_mask = _case(np.random.default_rng(2))
    convert = module.from_numpy if framework == "torch" else module.numpy.asarray
    got = cm.score_candidates(convert(q), convert(d), q_mask=convert(q_mask), d_mask=convert(d_mask))
    assert type(got).__module__.split(".")[0] in (framework, "jaxlib") and tuple(got.shape) == (4, 3)
    np.testing.assert_allclose(np.asarray(got), _expected(q, d, q_mask, d_mask), rtol=1e-5)  # JAX: float32


def test_torch_gradients():
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    q, d, q_mask, d_mask = _case(np.random.default_rng(3), nq=2, k=2, lq=3, ld=4, dim=5)
    d_mask[..., 0] = True  # no empty candidate: an -inf score has no finite differences
    q, d = torch.from_numpy(q).requires_grad_(), torch.from_numpy(d).requires_grad_()
    masks = torch.from_numpy(q_mask), torch.from_numpy(d_mask)
    assert torch.autograd.gradcheck(lambda a, b: cmt.maxsim_candidates(a, b, *masks), (q, d))
    np.testing.assert_allclose(cmt.maxsim_candidates(q, d, *masks).detach().numpy(), _expected(
        q.detach().numpy(), d.detach().numpy(), q_mask, d_mask))


def test_validation():
    q, d, _, _ = _case(np.random.default_rng(4))
    with pytest.raises(ValueError, match="d must have 4 dimensions"):
        cm.score_candidates(q, d[0])
    with pytest.raises(ValueError, match="q must have 3 dimensions"):
        cm.score_candidates(q[0], d)
    with pytest.raises(ValueError, match="candidates for each of the 4 queries"):
        cm.score_candidates(q, d[:2])
    with pytest.raises(ValueError, match="d_mask"):
        cm.score_candidates(q, d, d_mask=np.ones((4, 3, 2), bool))


def test_jax_pairs_and_candidates_gradients():
    jax = pytest.importorskip("jax")
    pytest.importorskip("jax.experimental.buffer_callback")
    import jax.numpy as jnp
    from jax.test_util import check_grads

    import cupy_maxsim.jax as cmj

    q, d, q_mask, d_mask = _case(np.random.default_rng(5), nq=2, k=3, lq=3, ld=4, dim=5)
    d_mask[..., 0] = True  # no empty candidate
    np.testing.assert_allclose(np.asarray(cmj.maxsim_candidates(jnp.asarray(q, jnp.float32), jnp.asarray(d, jnp.float32),
                                                                jnp.asarray(q_mask), jnp.asarray(d_mask))),
                               _expected(q, d, q_mask, d_mask), rtol=1e-5)
    with jax.enable_x64(True):
        masks = jnp.asarray(q_mask), jnp.asarray(d_mask)
        check_grads(lambda a, b: cmj.maxsim_candidates(a, b, *masks), (jnp.asarray(q), jnp.asarray(d)), order=1,
                    modes=["rev"])
        pairs = jnp.asarray(d[:, 0])
        check_grads(lambda a, b: jax.jit(cmj.maxsim_pairs)(a, b), (jnp.asarray(q), pairs), order=1, modes=["rev"])
