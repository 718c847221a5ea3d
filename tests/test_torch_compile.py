"""cupy_maxsim.torch under torch.compile: the custom ops pass torch.library.opcheck, a compiled
step has no graph break (fullgraph=True) and gives eager's loss and gradients, and eager calls
never go through the dispatcher (issue 26, item 5). CPU tensors here (CI); the same on CUDA
tensors in the GPU test."""

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cupy_maxsim.torch as cmt  # noqa: E402
from cupy_maxsim import _torch_ops  # noqa: E402
from support import count_calls, holey_mask  # noqa: E402

pytestmark = pytest.mark.skipif(not _torch_ops.AVAILABLE, reason="torch.library.custom_op needs torch >= 2.4")


def _case(rng, mode, dtype=torch.float64, device="cpu", one_query=False):
    """(q, d, q_mask, d_mask, offsets) of one call in ``mode``, masks with holes, an empty
    document."""
    tensor = lambda x: torch.tensor(x, device=device)  # noqa: E731
    nq, lq, nd, ld, dim = 3, 5, 4, 7, 8
    q = rng.standard_normal((lq, dim) if one_query else (nq, lq, dim))
    q_mask = tensor(holey_mask(rng, q.shape[:-1], 0.8))
    offsets = None
    if mode == "packed":
        lengths = np.array([7, 0, 3, 5])
        offsets = tensor(np.concatenate([[0], np.cumsum(lengths)]))
        d, d_mask = rng.standard_normal((int(lengths.sum()), dim)), None
    else:
        d = rng.standard_normal((nq if mode == "pairs" else nd, ld, dim))
        d_mask = tensor(holey_mask(rng, d.shape[:-1], 0.6))
    q, d = (tensor(x).to(dtype).requires_grad_() for x in (q, d))
    return q, d, q_mask, d_mask, offsets


CASES = [("padded", False), ("padded", True), ("pairs", False), ("packed", False), ("packed", True)]


@pytest.mark.parametrize("mode,one_query", CASES)
def test_opcheck(mode, one_query):
    q, d, q_mask, d_mask, offsets = _case(np.random.default_rng(0), mode, one_query=one_query)
    torch.library.opcheck(torch.ops.cupy_maxsim.maxsim_fwd.default, (q, d, q_mask, d_mask, offsets, mode))
    scores, winners = torch.ops.cupy_maxsim.maxsim_fwd(q, d, q_mask, d_mask, offsets, mode)
    grad = torch.randn_like(scores)
    inputs = (grad, q.detach(), d.detach(), winners, offsets, mode)
    torch.library.opcheck(torch.ops.cupy_maxsim.maxsim_bwd.default, inputs)


def _loss(mode):
    def step(q, d, q_mask, d_mask, offsets):
        if mode == "packed":
            scores = cmt.maxsim_packed(q, d, offsets, q_mask=q_mask)
        else:
            scores = (cmt.maxsim_pairs if mode == "pairs" else cmt.maxsim)(q, d, q_mask=q_mask, d_mask=d_mask)
        finite = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))  # the empty document
        return (finite ** 2).sum() + finite.logsumexp(-1).sum()
    return step


#: Inductor compiles CPU graphs with a C++ compiler; without one, AOT autograd's eager backend
#: still traces the whole step through Dynamo (fullgraph) and the ops' registered autograd.
BACKEND = "inductor" if shutil.which("c++") or shutil.which("g++") else "aot_eager"


def _compiled_matches_eager(mode, one_query, dtype, device, atol):
    case = _case(np.random.default_rng(1), mode, dtype, device, one_query)
    q, d = case[:2]
    eager = _loss(mode)(*case)
    eager_grads = torch.autograd.grad(eager, (q, d))
    torch._dynamo.reset()
    compiled = torch.compile(_loss(mode), fullgraph=True, backend=BACKEND)(*case)  # a graph break raises
    compiled_grads = torch.autograd.grad(compiled, (q, d))
    torch.testing.assert_close(compiled, eager, atol=atol, rtol=0)
    for got, expected in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("mode,one_query", CASES)
def test_compiled_step_matches_eager(mode, one_query):
    _compiled_matches_eager(mode, one_query, torch.float64, "cpu", atol=1e-12)


def test_eager_calls_bypass_the_dispatcher(monkeypatch):
    calls = count_calls(monkeypatch, _torch_ops, "_forward")
    q, d, q_mask, d_mask, _ = _case(np.random.default_rng(2), "padded")
    cmt.maxsim(q, d, q_mask=q_mask, d_mask=d_mask).sum().backward()
    assert calls == [] and q.grad is not None


def test_fake_shapes_and_dtypes():
    """What the compiler is told before a call: the scores' and winners' shapes and dtypes are
    the real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for mode, one_query in CASES:
        q, d, q_mask, d_mask, offsets = _case(np.random.default_rng(3), mode, torch.float32, one_query=one_query)
        real = torch.ops.cupy_maxsim.maxsim_fwd(q, d, q_mask, d_mask, offsets, mode)
        with FakeTensorMode(allow_non_fake_inputs=True) as fake_mode:
            fake = torch.ops.cupy_maxsim.maxsim_fwd(*(fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                                      for x in (q, d, q_mask, d_mask, offsets)), mode)
        for r, f in zip(real, fake):
            assert (tuple(r.shape), r.dtype) == (tuple(f.shape), f.dtype), (mode, one_query)


def test_bad_mode_is_a_value_error():
    q, d, *_ = _case(np.random.default_rng(4), "padded")
    with pytest.raises(ValueError, match="mode"):
        torch.ops.cupy_maxsim.maxsim_fwd(q, d, None, None, None, "ragged")


@pytest.mark.gpu
@pytest.mark.parametrize("mode,one_query", CASES)
def test_compiled_step_matches_eager_on_gpu(mode, one_query):
    _compiled_matches_eager(mode, one_query, torch.float16, "cuda", atol=1e-2)
