"""The bad-input catalogue through the framework adapters (issue 27): torch's and JAX's maxsim
functions refuse what the core functions refuse, with the same errors naming the argument,
before anything runs, and leave every input as it was (CPU tensors and arrays; phase 2 of CI)."""

from __future__ import annotations

import numpy as np
import pytest

from test_catalogue import leaves

RNG = np.random.default_rng(26)
Q = RNG.standard_normal((2, 4, 8)).astype(np.float32)
D = RNG.standard_normal((3, 5, 8)).astype(np.float32)
T = D.reshape(15, 8)
OFFSETS = np.array([0, 5, 10, 15])
C = pytest.param
#: (function name, args, kwargs, error, message); arrays become the framework's.
CASES = [
    C("maxsim", (Q[0, 0], D), {}, ValueError, "q must have shape", id="maxsim-q-1d"),
    C("maxsim", (Q, D[0]), {}, ValueError, "d must have shape", id="maxsim-d-2d"),
    C("maxsim", (Q, D[:, :, :4]), {}, ValueError, "same embedding dim", id="maxsim-dim"),
    C("maxsim", (Q.astype(np.float16), D), {}, TypeError, "same dtype", id="maxsim-mixed-dtypes"),
    C("maxsim", (Q.astype(np.int32), D.astype(np.int32)), {}, TypeError, "q must have dtype", id="maxsim-int32"),
    C("maxsim", (Q, D), dict(q_mask=np.ones((2, 3), bool)), ValueError, "q_mask must have shape", id="maxsim-q-mask"),
    C("maxsim", (Q, D), dict(d_mask=np.ones((3, 5), np.float32)), TypeError, "d_mask must be a boolean",
      id="maxsim-d-mask-float"),
    C("maxsim_pairs", (Q, D), {}, ValueError, "same number of pairs", id="pairs-count"),
    C("maxsim_pairs", (Q, D[:2]), dict(d_mask=np.ones((2, 4), bool)), ValueError, "d_mask must have shape",
      id="pairs-d-mask"),
    C("maxsim_packed", (Q, T, OFFSETS.astype(np.float32)), {}, TypeError, "offsets must have dtype",
      id="packed-offsets-float"),
    C("maxsim_packed", (Q, T, np.array([0, 9, 5, 15])), {}, ValueError, "decreasing", id="packed-decreasing"),
    C("maxsim_packed", (Q, T, np.array([0, 5, 16])), {}, ValueError, "within", id="packed-past-end"),
    C("maxsim_packed", (Q, T[:, :4], OFFSETS), {}, ValueError, "same embedding dim", id="packed-dim"),
    C("maxsim_candidates", (Q, D), {}, ValueError, "d must have 4 dimensions", id="candidates-d-3d"),
    C("maxsim_candidates", (Q, np.stack([D] * 3)), {}, ValueError, "candidates for each of the 2 queries",
      id="candidates-groups"),
]


def _framework(name):
    if name == "torch":
        torch = pytest.importorskip("torch")
        import cupy_maxsim.torch as adapter

        return adapter, lambda x: torch.from_numpy(np.ascontiguousarray(x)), lambda x: x.numpy().copy()
    jnp = pytest.importorskip("jax.numpy")
    import cupy_maxsim.jax as adapter

    return adapter, jnp.asarray, lambda x: np.asarray(x).copy()


def _convert(value, to):
    if isinstance(value, np.ndarray):
        return to(value)
    if isinstance(value, tuple):
        return tuple(_convert(v, to) for v in value)
    if isinstance(value, dict):
        return {k: _convert(v, to) for k, v in value.items()}
    return value




@pytest.mark.parametrize("framework", ["torch", "jax"])
@pytest.mark.parametrize("function,args,kwargs,error,message", CASES)
def test_adapters_refuse_bad_inputs_and_change_nothing(framework, function, args, kwargs, error, message):
    adapter, to, back = _framework(framework)
    args, kwargs = _convert(args, to), _convert(kwargs, to)
    before = [(x, back(x)) for x in leaves((args, kwargs), lambda v: hasattr(v, "shape"))]
    with pytest.raises(error, match=message):
        getattr(adapter, function)(*args, **kwargs)
    for x, copy in before:
        np.testing.assert_array_equal(back(x), copy)
