"""Corner cases and bad inputs on the host path (issue 27): empty inputs answer with correctly
shaped results, bfloat16 stays bfloat16 through pack and the backward, host scales and winners
are checked. Each against the float64 reference or the documented error."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference


def _rows(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("case", ["padded", "packed", "pairs"])
def test_zero_queries_give_empty_results(case):
    rng = np.random.default_rng(1)
    q = np.zeros((0, 4, 8), np.float32)
    if case == "padded":
        scores, argmax = cm.score(q, _rows(rng, (3, 5, 8)), return_argmax=True)
        assert scores.shape == (0, 3) and argmax.shape == (0, 3, 4)
    elif case == "packed":
        scores, argmax = cm.score_packed(q, _rows(rng, (10, 8)), np.array([0, 4, 10]), return_argmax=True)
        assert scores.shape == (0, 2) and argmax.shape == (0, 2, 4)
    else:
        scores, argmax = cm.score_pairs(q, np.zeros((0, 5, 8), np.float32), return_argmax=True)
        assert scores.shape == (0,) and argmax.shape == (0, 4)


@pytest.mark.parametrize("case", ["no document tokens", "dim 0", "packed, no tokens", "no queries"])
def test_backward_of_empty_problems_is_zero(case):
    """Zero-length documents, dim 0, packed corpora of no token and zero queries: gradients
    shaped like q and d, all zero (no token wins anything)."""
    rng = np.random.default_rng(2)
    q, extra = _rows(rng, (2, 4, 8)), {}
    if case == "no document tokens":
        d = np.zeros((3, 0, 8), np.float32)
        scores, argmax = cm.score(q, d, return_argmax=True)
    elif case == "dim 0":
        q, d = np.zeros((2, 4, 0), np.float32), np.zeros((3, 5, 0), np.float32)
        scores, argmax = cm.score(q, d, return_argmax=True)
    elif case == "packed, no tokens":
        d, extra = np.zeros((0, 8), np.float32), dict(offsets=np.array([0, 0, 0]))
        scores, argmax = cm.score_packed(q, d, extra["offsets"], return_argmax=True)
    else:
        q, d = np.zeros((0, 4, 8), np.float32), _rows(rng, (3, 5, 8))
        scores, argmax = cm.score(q, d, return_argmax=True)
    grad_q, grad_d = cm.score_backward(np.ones(scores.shape, np.float32), q, d, argmax, **extra)
    assert grad_q.shape == q.shape and grad_d.shape == d.shape
    assert not grad_q.any() and not grad_d.any()


def test_quantize_dim_0():
    values, scales = cm.quantize_int8(np.zeros((3, 0), np.float32))
    assert values.shape == (3, 0) and values.dtype == np.int8
    np.testing.assert_array_equal(scales, np.zeros(3, np.float32))


def test_negative_host_scales_are_refused():
    """The query scale factors out of the max only when non-negative: a negative scale is an
    error naming the argument, not a silently wrong score."""
    rng = np.random.default_rng(3)
    (q8, q_scale), (d8, d_scale) = cm.quantize_int8(_rows(rng, (2, 4, 8))), cm.quantize_int8(_rows(rng, (3, 5, 8)))
    for name in ("q_scale", "d_scale"):
        scales = dict(q_scale=q_scale.copy(), d_scale=d_scale.copy())
        scales[name][0, 1] = -0.5
        before = scales[name].copy()
        with pytest.raises(ValueError, match=f"{name} must be non-negative"):
            cm.score(q8, d8, **scales)
        np.testing.assert_array_equal(scales[name], before)  # nothing a caller passed is changed
    q_nan = q_scale.copy()
    q_nan[0, 0] = np.nan  # a non-finite token's scale (quantize_int8 gives NaN): a NaN score, no error
    assert np.isnan(cm.score(q8, d8, q_scale=q_nan, d_scale=d_scale)[0]).all()


@pytest.mark.parametrize("case", ["past the document", "below -1", "packed, past its own document", "pairs"])
def test_host_winners_outside_their_documents_are_refused(case):
    rng = np.random.default_rng(4)
    q, d = _rows(rng, (2, 4, 8)), _rows(rng, (3, 5, 8))
    extra = {}
    if case == "packed, past its own document":
        d, extra = _rows(rng, (10, 8)), dict(offsets=np.array([0, 4, 10]))
        scores, argmax = cm.score_packed(q, d, extra["offsets"], return_argmax=True)
        argmax[1, 0, 2] = 4  # document 0 has 4 tokens: 0..3
    elif case == "pairs":
        d, extra = d[:2], dict(pairs=True)
        scores, argmax = cm.score_pairs(q, d, return_argmax=True)
        argmax[1, 3] = 5
    else:
        scores, argmax = cm.score(q, d, return_argmax=True)
        argmax[0, 2, 1] = 5 if case == "past the document" else -2
    with pytest.raises(ValueError, match="argmax must hold -1 or a token index within its document"):
        cm.score_backward(np.ones(scores.shape, np.float32), q, d, argmax, **extra)


def test_bfloat16_survives_pack_and_backward_on_the_host():
    """NumPy bfloat16 (ml_dtypes), torch CPU and JAX CPU: pack keeps bfloat16 tokens (bit for
    bit), score_packed then takes them with a bfloat16 query, and the backward answers in
    bfloat16, as the float64 reference of the same values says."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    docs = [_rows(rng, (n, 8)).astype(ml_dtypes.bfloat16) for n in (3, 5, 2)]
    tokens, offsets = cm.pack(docs)
    assert tokens.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(tokens.view(np.uint16), np.concatenate(docs).view(np.uint16))
    q = _rows(rng, (4, 8)).astype(ml_dtypes.bfloat16)
    expected = reference.maxsim_packed_reference(q.astype(np.float64), tokens.astype(np.float64), offsets)
    np.testing.assert_allclose(cm.score_packed(q, tokens, offsets), expected, rtol=1e-5, atol=1e-5)
    scores, argmax = cm.score(q[None], np.stack([docs[0], docs[0]]), return_argmax=True)
    grad_q, grad_d = cm.score_backward(np.ones(scores.shape, np.float32), q[None], np.stack([docs[0], docs[0]]),
                                       argmax)
    assert grad_q.dtype == ml_dtypes.bfloat16 and grad_d.dtype == ml_dtypes.bfloat16
    torch = pytest.importorskip("torch")
    torch_docs = [torch.from_numpy(doc.astype(np.float32)).bfloat16() for doc in docs]
    torch_tokens, _ = cm.pack(torch_docs)
    assert torch_tokens.dtype == torch.bfloat16 and torch.equal(torch_tokens, torch.cat(torch_docs))


def test_cpu_backend_memory_is_bounded():
    """The NumPy backend's extra memory (tracemalloc's peak over the call, NumPy's allocations
    included) stays within 256 MB plus the output for a 1.5 GB fp16 corpus, whatever the query
    length (1 to 128 tokens), with several queries and the winners, and packed."""
    import tracemalloc

    rng = np.random.default_rng(6)
    num_docs, doc_length, dim = 20_000, 300, 128  # 1.43 GiB of float16
    docs = np.empty((num_docs, doc_length, dim), np.float16)
    for n0 in range(0, num_docs, 1000):  # made in slices: no float32 copy of the whole corpus
        docs[n0:n0 + 1000] = rng.random((min(1000, num_docs - n0), doc_length, dim), np.float32) - 0.5
    offsets = np.arange(0, num_docs * doc_length + 1, doc_length)

    def extra_mb(call):
        tracemalloc.start()
        try:
            result = call()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        output = sum(np.asarray(r).nbytes for r in (result if isinstance(result, tuple) else (result,)))
        return (peak - output) / 2**20

    for query_length in (1, 2, 32, 128):
        q = (rng.random((query_length, dim), np.float32) - 0.5).astype(np.float16)
        assert extra_mb(lambda: cm.score(q, docs)) <= 256, query_length
    queries = (rng.random((8, 32, dim), np.float32) - 0.5).astype(np.float16)
    assert extra_mb(lambda: cm.score(queries, docs, return_argmax=True)) <= 256
    assert extra_mb(lambda: cm.score_packed(queries, docs.reshape(-1, dim), offsets)) <= 256


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_adapters_take_empty_problems(framework):
    """Zero queries and documents of no token through the autograd adapters (CPU): the scores'
    shape, -inf for an empty document, zero gradients shaped like the inputs."""
    rng = np.random.default_rng(7)
    cases = [(np.zeros((0, 4, 8), np.float32), _rows(rng, (3, 5, 8))),
             (_rows(rng, (2, 4, 8)), np.zeros((3, 0, 8), np.float32))]
    if framework == "torch":
        torch = pytest.importorskip("torch")
        import cupy_maxsim.torch as cmt

        for q_np, d_np in cases:
            q, d = torch.from_numpy(q_np).requires_grad_(True), torch.from_numpy(d_np).requires_grad_(True)
            scores = cmt.maxsim(q, d)
            assert scores.shape == (q_np.shape[0], d_np.shape[0])
            assert bool(torch.isneginf(scores).all())  # no score, or every document empty: -inf
            torch.where(torch.isfinite(scores), scores, 0).sum().backward()
            assert q.grad.shape == q.shape and d.grad.shape == d.shape
            assert not q.grad.any() and not d.grad.any()
    else:
        jax = pytest.importorskip("jax")
        import cupy_maxsim.jax as cmj

        for q_np, d_np in cases:
            q, d = jax.numpy.asarray(q_np), jax.numpy.asarray(d_np)
            loss = lambda q, d: jax.numpy.where(jax.numpy.isfinite(s := cmj.maxsim(q, d)), s, 0).sum()  # noqa: E731
            grad_q, grad_d = jax.jit(jax.grad(loss, argnums=(0, 1)))(q, d)
            assert grad_q.shape == q.shape and grad_d.shape == d.shape
            assert not np.asarray(grad_q).any() and not np.asarray(grad_d).any()


def test_scoring_a_tensor_that_requires_grad_warns_once_where_it_is_called():
    """The NumPy-level functions answer detached tensors: scoring a torch tensor that requires
    grad with autograd on warns (naming the argument and the adapters) at the caller's line, so
    that a loss built on them does not silently train nothing; under torch.no_grad(), through
    the autograd adapters, and for tensors that do not require grad, no warning."""
    import warnings

    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    q = torch.randn(2, 4, 8, requires_grad=True)
    d = torch.randn(3, 5, 8)
    with pytest.warns(UserWarning, match="q requires grad.*cupy_maxsim.torch.maxsim") as caught:
        scores = cm.score(q, d)
    assert not scores.requires_grad and caught[0].filename == __file__
    with pytest.warns(UserWarning, match="d requires grad"):
        cm.score(q.detach(), d.clone().requires_grad_())
    with pytest.warns(UserWarning, match="q requires grad") as caught:
        cm.search(q, d, 2)
    assert {w.filename for w in caught} == {__file__}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            cm.score(q, d)
        cm.score(q.detach(), d)
        cmt.maxsim(q, d).sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_non_finite_inputs_score_nan_without_numpy_warnings():
    """Non-finite elements and similarities past float32 are scored as documented (NaN) by the
    CPU backend without NumPy's RuntimeWarnings from inside it (it once warned "invalid value
    encountered in matmul" and "overflow encountered in cast" for what the contract allows)."""
    import warnings

    rng = np.random.default_rng(3)
    q, d = _rows(rng, (2, 4, 8)), _rows(rng, (3, 5, 8))
    d[0, 1, 2], d[1, 2, 3], q[1, 0, 0] = np.nan, np.inf, -np.inf
    big = np.full((1, 2, 8), 1e30, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores, argmax = cm.score(q, d, return_argmax=True)
        tokens, offsets = cm.pack(list(d))
        packed = cm.score_packed(q, tokens, offsets)
        pairs = cm.score_pairs(q, d[:2])
        cm.score_backward(np.ones_like(scores), q, d, argmax)
        huge = cm.score(big, big)
        index = cm.Index(8, dtype="int8", rescore="float16")
        index.add(list(d))
        index.search(q, 2)
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(scores), np.isnan(expected))
    np.testing.assert_array_equal(np.isnan(packed), np.isnan(expected))
    assert np.isnan(scores[:, :2]).all() and np.isnan(scores[1]).all() and np.isfinite(scores[0, 2])
    assert np.isnan(pairs).all() and np.isnan(huge).all()


def test_a_gpu_index_without_cupy_says_what_to_install(monkeypatch):
    """Without CuPy, asking for a GPU store is an ImportError naming the package to install
    (it was a bare "No module named 'cupy'"); the CPU keeps working."""
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # (an import of it fails, as where it is missing)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ImportError, match=r'pip install "cupy-maxsim\[cuda12\]"'):
            cm.Index(8, device=device)
    with pytest.raises(ImportError, match="needs the GPU backend"):
        cm.ShardedIndex(8, devices=["cuda:0"])
    index = cm.Index(8)
    index.add([np.ones((2, 8), np.float32)])
    assert index.search(np.ones((1, 2, 8), np.float32), 1)[1].tolist() == [[0]]
