"""JAX differentiation for MaxSim: ``maxsim``, ``maxsim_pairs``, ``maxsim_packed`` and
``maxsim_candidates`` with ``jax.custom_vjp``.

Both run under ``jax.jit`` and ``jax.grad``. The kernels are called through
``jax.experimental.buffer_callback``: XLA hands the callback its device buffers and its
stream, the kernels run on that stream and write the outputs in place, with no host round
trip and no copy of the inputs. On the CPU the same callback runs the NumPy backend. The
forward saves only the winners (int16 per query token and document; int32 for packed
documents, whose longest length is not known when tracing).

    import cupy_maxsim.jax as cmj
    scores = cmj.maxsim(q, d, q_mask, d_mask)                # (Nq, Nd), differentiable
    grads = jax.grad(lambda q, d: loss(cmj.maxsim(q, d)))(q, d)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
try:
    from jax.experimental.buffer_callback import buffer_callback
except ImportError as error:  # a JAX without buffer_callback
    raise ImportError(f"cupy_maxsim.jax needs jax.experimental.buffer_callback (tested with JAX 0.10 and 0.11); "
                      f"this JAX is {jax.__version__}") from error

from . import _problem, scoring, training
from ._arrays import device_buffer_operand

__all__ = ["maxsim", "maxsim_pairs", "maxsim_packed", "maxsim_candidates"]

#: Under jax.vmap the callbacks run once per element of the mapped axis, in order (buffer_callback
#: refuses vmap without a method): correct for any axis, as a Python loop over it would be.
VMAP = "sequential"


def _on_gpu(buffer) -> bool:
    """Whether a callback buffer lives in GPU memory (a CPU buffer raises on the interface)."""
    try:
        buffer.__cuda_array_interface__
    except Exception:  # noqa: BLE001 - JAX raises its own error type on the CPU
        return False
    return True


def _operand(buffer, dtype, name):
    """A callback buffer as something cupy_maxsim takes: NumPy on the host, else an operand."""
    if buffer is None:
        return None
    if _on_gpu(buffer):
        return device_buffer_operand(buffer, np.dtype(dtype).name, name)
    return np.asarray(buffer)


def _store(out_buffer, value) -> None:
    """Copy a result into an output buffer (on the current CuPy stream, XLA's, on a GPU).
    Same-size dtypes are reinterpreted (bfloat16 held as uint16 bits); others are converted
    (int16 winners into an int32 buffer)."""
    if _on_gpu(out_buffer):
        import cupy

        target = cupy.asarray(out_buffer)
        same_size = value.dtype != target.dtype and value.dtype.itemsize == target.dtype.itemsize
        target[...] = value.view(target.dtype) if same_size else value
    else:
        np.asarray(out_buffer)[...] = np.asarray(value)


def _operands(buffers, dtypes, names):
    """Callback buffers as cupy_maxsim operands (None stays None)."""
    return [_operand(b, t, n) for b, t, n in zip(buffers, dtypes, names)]


class _XlaStream:
    """XLA's stream handle through the CUDA stream protocol (version 0, the handle), as CuPy
    14's ``Stream.from_external`` takes a foreign stream."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


def _on_stream(ctx, buffer):
    """CuPy work inside the callback runs on XLA's stream (GPU buffers only: a CPU context
    has no stream). CuPy 14 wraps it through the stream protocol (its ExternalStream is
    deprecated there); CuPy 13 has only ExternalStream."""
    if not _on_gpu(buffer):
        import contextlib

        return contextlib.nullcontext()
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_XlaStream(ctx.stream))
    return cupy.cuda.ExternalStream(ctx.stream)


def _score_dtype(q):
    return jnp.float64 if q.dtype == jnp.float64 else jnp.float32


def _forward(q, d, offsets, q_mask, d_mask, pairs=False):
    """(scores, argmax) through a buffer callback."""
    single = q.ndim == 2
    num_docs = d.shape[0] if offsets is None else offsets.shape[0] - 1
    shape = (num_docs,) if single or pairs else (q.shape[0], num_docs)
    argmax_dtype = jnp.int32 if offsets is not None or d.shape[1] >= 32768 else jnp.int16
    result_types = (jax.ShapeDtypeStruct(shape, _score_dtype(q)),
                    jax.ShapeDtypeStruct(shape + (q.shape[-2],), argmax_dtype))
    dtypes = (q.dtype, d.dtype, None if offsets is None else offsets.dtype,
              None if q_mask is None else q_mask.dtype, None if d_mask is None else d_mask.dtype)

    def callback(ctx, out, *buffers):
        with _on_stream(ctx, buffers[0]):
            q_op, d_op, o_op, qm_op, dm_op = _operands(buffers, dtypes, ("q", "d", "offsets", "q_mask", "d_mask"))
            if o_op is not None:  # int16 or int32 by the longest document; stored as int32
                scores, argmax = scoring.score_packed(q_op, d_op, o_op, q_mask=qm_op, return_argmax=True)
            elif pairs:
                scores, argmax = scoring.score_pairs(q_op, d_op, q_mask=qm_op, d_mask=dm_op, return_argmax=True)
            else:
                scores, argmax = scoring.score(q_op, d_op, q_mask=qm_op, d_mask=dm_op, return_argmax=True)
            _store(out[0], scores)
            _store(out[1], argmax)

    return buffer_callback(callback, result_types, vmap_method=VMAP)(q, d, offsets, q_mask, d_mask)


def _backward(grad, q, d, offsets, argmax, pairs=False):
    result_types = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(d.shape, d.dtype))
    dtypes = (grad.dtype, q.dtype, d.dtype, None if offsets is None else offsets.dtype, argmax.dtype)

    def callback(ctx, out, *buffers):
        with _on_stream(ctx, buffers[1]):
            g_op, q_op, d_op, o_op, a_op = _operands(buffers, dtypes, ("grad_scores", "q", "d", "offsets", "argmax"))
            grad_q, grad_d = training.score_backward(g_op, q_op, d_op, a_op, offsets=o_op, pairs=pairs)
            _store(out[0], grad_q)
            _store(out[1], grad_d)

    return buffer_callback(callback, result_types, vmap_method=VMAP)(grad, q, d, offsets, argmax)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _maxsim(q, d, offsets, q_mask, d_mask, pairs=False):
    return _forward(q, d, offsets, q_mask, d_mask, pairs)[0]


def _maxsim_fwd(q, d, offsets, q_mask, d_mask, pairs=False):
    scores, argmax = _forward(q, d, offsets, q_mask, d_mask, pairs)
    return scores, (q, d, offsets, argmax)


def _maxsim_bwd(pairs, residuals, grad):
    q, d, offsets, argmax = residuals
    grad_q, grad_d = _backward(grad, q, d, offsets, argmax, pairs)
    return grad_q, grad_d, None, None, None


_maxsim.defvjp(_maxsim_fwd, _maxsim_bwd)


def _stand_in(x):
    """A NumPy array of ``x``'s shape and dtype that holds no memory (zero strides), for the
    core's validation at trace time; concrete offsets keep their values (their checks read them)."""
    if x is None:
        return None
    if np.dtype(x.dtype).kind in "iu":  # offsets: their values where they are on the host
        try:  # (on a GPU the call checks them, as it would anyway: no extra copy here)
            if all(device.platform == "cpu" for device in x.devices()):
                return np.asarray(x)
        except Exception:  # noqa: BLE001 - a tracer (jit): no values at trace time
            pass
    return np.broadcast_to(np.zeros((), np.dtype(x.dtype)), tuple(x.shape))


def _validated(builder, q, d, *rest):
    """The core's checks of a call (``builder``: a _problem builder), before any tracing of the
    kernels: bad inputs raise its TypeError or ValueError naming the argument, not an error
    from inside XLA. Offsets' values are checked here where they are concrete, else in the call."""
    builder(*(_stand_in(x) for x in (q, d) + rest))


def maxsim(q, d, q_mask=None, d_mask=None):
    """Differentiable :func:`cupy_maxsim.score` for JAX arrays: q (Lq, D) or (Nq, Lq, D),
    d (Nd, Ld, D), boolean masks (True = real token) -> scores (Nd,) or (Nq, Nd)."""
    _validated(lambda *a: _problem.padded_problem(*a, None, None, True), q, d, q_mask, d_mask)
    return _maxsim(q, d, None, q_mask, d_mask, False)


def maxsim_pairs(q, d, q_mask=None, d_mask=None):
    """Differentiable :func:`cupy_maxsim.score_pairs`: (B, Lq, D) x (B, Ld, D) -> (B,)."""
    _validated(lambda *a: _problem.pairs_problem(*a, None, None, True), q, d, q_mask, d_mask)
    return _maxsim(q, d, None, q_mask, d_mask, True)


def maxsim_packed(q, tokens, offsets, q_mask=None):
    """Differentiable :func:`cupy_maxsim.score_packed`: tokens (T, D), offsets (Nd + 1,)."""
    _validated(lambda q_, t_, o_, m_: _problem.packed_problem(q_, t_, o_, m_, None, None, True), q, tokens, offsets,
               q_mask)
    return _maxsim(q, tokens, offsets, q_mask, None, False)


def maxsim_candidates(q, d, q_mask=None, d_mask=None):
    """Differentiable :func:`cupy_maxsim.score_candidates`: (Nq, Lq, D) x (Nq, K, Ld, D) -> (Nq, K),
    the queries' gradient summed over their K candidates."""
    q_pairs, d_pairs, (q_mask,), (d_mask,) = _problem.candidates_as_pairs(q, d, (q_mask,), (d_mask,))
    return maxsim_pairs(q_pairs, d_pairs, q_mask, d_mask).reshape(d.shape[:2])
