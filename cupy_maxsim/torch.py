"""PyTorch autograd for MaxSim: ``maxsim``, ``maxsim_pairs`` and ``maxsim_packed``.

The forward saves only the winners (int16 per query token and document) instead of the
similarity tensor; the backward gathers and scatters from them with cupy_maxsim's kernels
(deterministic, no float atomics) on torch's current stream, without a device sync. CPU
tensors run the NumPy backend, so ``torch.autograd.gradcheck`` works in float64 on any
machine. Gradients are not differentiable again (no double backward). Under ``torch.compile``
(and ``torch.export``) the same functions are the custom ops ``cupy_maxsim::maxsim_fwd`` and
``maxsim_bwd`` (``_torch_ops``): no graph break; eager calls keep the direct path.

    import cupy_maxsim.torch as cmt
    scores = cmt.maxsim(q, d, q_mask=q_mask, d_mask=d_mask)   # (Nq, Nd), differentiable
    loss = torch.nn.functional.cross_entropy(scores / tau, labels)
    loss.backward()
"""

from __future__ import annotations

import torch

from . import _torch_ops, scoring, training
from ._problem import candidates_as_pairs

__all__ = ["maxsim", "maxsim_pairs", "maxsim_packed", "maxsim_candidates"]


class _MaxSim(torch.autograd.Function):
    """Scores with the winners saved. ``call``: (mode, offsets, q_mask, d_mask), mode "padded",
    "pairs" or "packed": the extras travel in one argument, as they take no gradient and each
    argument of apply costs host time on a training step's critical path."""

    @staticmethod
    def forward(ctx, q, d, call):
        mode, offsets, q_mask, d_mask = call
        if not (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]):
            if mode == "packed":
                return scoring.score_packed(q, d, offsets, q_mask=q_mask)
            score = scoring.score_pairs if mode == "pairs" else scoring.score
            return score(q, d, q_mask=q_mask, d_mask=d_mask)
        # The plan holds q, d and the offsets; their version counters tell whether one changed in
        # place before the backward (what save_for_backward checks, at a fraction of its host
        # cost, and torch runs the backward on a thread where host time counts double). Read
        # before the forward's launch: after it, the host races the forward's GPU time to the
        # backward's launch.
        ctx.inputs = q, d, offsets
        ctx.versions = _versions(q, d, offsets)
        # The backward's checks, launch layout, outputs and arguments are settled here, where
        # they overlap the GPU; the backward only patches in grad_scores and launches.
        scores, ctx.plan = training.score_with_plan(q, d, q_mask=q_mask, d_mask=d_mask, offsets=offsets,
                                                pairs=mode == "pairs")
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        # Grad mode is on in a backward only under create_graph=True: there once_differentiable's
        # wrapper makes differentiating the gradients again raise. The usual backward goes
        # without the wrapper's no_grad context (host time on torch's backward thread).
        if torch.is_grad_enabled():
            return _backward_once_differentiable(ctx, grad_scores)
        return _backward(ctx, grad_scores)


def _backward(ctx, grad_scores):
    if _versions(*ctx.inputs) != ctx.versions:
        raise RuntimeError("one of the variables needed for gradient computation has been modified by an "
                           "inplace operation: q, d (tokens) or offsets of cupy_maxsim.torch changed in place "
                           "between the forward and the backward")
    # The engine has matched grad_scores to the scores' shape, dtype and device, so the
    # gradients staged in the forward need only its pointer and strides (float32 scores; those
    # of float64 inputs are float64, converted by gradients()).
    staged = grad_scores.is_cuda and grad_scores.dtype is torch.float32
    grads = ctx.plan.staged_gradients(grad_scores.data_ptr(), grad_scores.stride()) if staged else None
    grad_q, grad_d = grads if grads is not None else ctx.plan.gradients(grad_scores)
    return grad_q if ctx.needs_input_grad[0] else None, grad_d if ctx.needs_input_grad[1] else None, None


_backward_once_differentiable = torch.autograd.function.once_differentiable(_backward)


def _versions(q, d, offsets) -> tuple:
    """The in-place version counters of q, d and the offsets (None: no offsets)."""
    return q._version, d._version, None if offsets is None else offsets._version


def _compiling() -> bool:
    return _torch_ops.AVAILABLE and torch.compiler.is_compiling()


def maxsim(q: torch.Tensor, d: torch.Tensor, q_mask=None, d_mask=None) -> torch.Tensor:
    """Differentiable :func:`cupy_maxsim.score`: q (Lq, D) or (Nq, Lq, D), d (Nd, Ld, D),
    boolean masks (True = real token) -> scores (Nd,) or (Nq, Nd), float32."""
    if _compiling():
        return _torch_ops.compiled_scores(q, d, q_mask, d_mask, None, "padded")
    return _MaxSim.apply(q, d, ("padded", None, q_mask, d_mask))


def maxsim_pairs(q: torch.Tensor, d: torch.Tensor, q_mask=None, d_mask=None) -> torch.Tensor:
    """Differentiable :func:`cupy_maxsim.score_pairs`: (B, Lq, D) x (B, Ld, D) -> (B,)."""
    if _compiling():
        return _torch_ops.compiled_scores(q, d, q_mask, d_mask, None, "pairs")
    return _MaxSim.apply(q, d, ("pairs", None, q_mask, d_mask))


def maxsim_packed(q: torch.Tensor, tokens: torch.Tensor, offsets: torch.Tensor, q_mask=None) -> torch.Tensor:
    """Differentiable :func:`cupy_maxsim.score_packed`: documents packed as tokens (T, D) with
    offsets (Nd + 1,); the gradient of ``tokens`` is (T, D)."""
    if _compiling():
        return _torch_ops.compiled_scores(q, tokens, q_mask, None, offsets, "packed")
    return _MaxSim.apply(q, tokens, ("packed", offsets, q_mask, None))


def maxsim_candidates(q: torch.Tensor, d: torch.Tensor, q_mask=None, d_mask=None) -> torch.Tensor:
    """Differentiable :func:`cupy_maxsim.score_candidates`: (Nq, Lq, D) x (Nq, K, Ld, D) -> (Nq, K),
    the queries' gradient summed over their K candidates."""
    q_pairs, d_pairs, (q_mask,), (d_mask,) = candidates_as_pairs(q, d, (q_mask,), (d_mask,))
    return maxsim_pairs(q_pairs, d_pairs, q_mask=q_mask, d_mask=d_mask).reshape(d.shape[:2])
