"""The torch adapter as ``torch.library`` custom ops, for ``torch.compile`` and ``torch.export``.

Two opaque ops, on CPU and CUDA tensors alike (the CPU ones run the NumPy backend):

- ``cupy_maxsim::maxsim_fwd(q, d, q_mask, d_mask, offsets, mode) -> (scores, winners)``
- ``cupy_maxsim::maxsim_bwd(grad_scores, q, d, winners, offsets, mode) -> (grad_q, grad_d)``

with fake (meta) implementations, so that the compiler plans shapes and dtypes without running
them, and the forward's autograd registered through the backward op. ``mode`` is "padded",
"pairs" or "packed". Eager calls never go through the dispatcher: ``cupy_maxsim.torch`` calls
its ``autograd.Function`` directly (its ~17 us host path), and takes these ops only while
``torch.compiler.is_compiling()`` (QuACK's "eager bypass", ``../shared/research/ecosystem.md``
8.5). The winners' dtype must be known before the call: int16 where every padded document is
shorter than 32768 tokens, else int32; packed documents' lengths are data, so there the op
always answers int32.
"""

from __future__ import annotations

import typing

import torch

from . import scoring, training
from ._problem import argmax_dtype

MODES = ("padded", "pairs", "packed")
AVAILABLE = hasattr(torch, "library") and hasattr(torch.library, "custom_op")


def _scores_shape(q, d, offsets, mode) -> tuple:
    if mode == "pairs":
        return (q.shape[0],)
    num_docs = offsets.shape[0] - 1 if mode == "packed" else d.shape[0]
    return (num_docs,) if q.dim() == 2 else (q.shape[0], num_docs)


def _winners_dtype(d, mode):
    return torch.int32 if mode == "packed" else getattr(torch, argmax_dtype(d.shape[1]))


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def _forward(q, d, q_mask, d_mask, offsets, mode):
    _check_mode(mode)
    if mode == "packed":
        scores, winners = scoring.score_packed(q, d, offsets, q_mask=q_mask, return_argmax=True)
        return scores, winners.to(torch.int32)  # packed lengths are data: the fake says int32
    score = scoring.score_pairs if mode == "pairs" else scoring.score
    return score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)


def _forward_fake(q, d, q_mask, d_mask, offsets, mode):
    _check_mode(mode)
    shape = _scores_shape(q, d, offsets, mode)
    scores = q.new_empty(shape, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    return scores, q.new_empty(shape + (q.shape[-2],), dtype=_winners_dtype(d, mode))


def _backward(grad_scores, q, d, winners, offsets, mode):
    _check_mode(mode)
    grad_q, grad_d = training.score_backward(grad_scores, q, d, winners, offsets=offsets, pairs=mode == "pairs")
    return grad_q, grad_d


def _backward_fake(grad_scores, q, d, winners, offsets, mode):
    return torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(
        d, memory_format=torch.contiguous_format)


def _setup_context(ctx, inputs, output):
    q, d, _, _, offsets, mode = inputs
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(q, d, output[1], offsets)
    ctx.mode = mode


def _autograd_backward(ctx, grad_scores, _grad_winners):
    q, d, winners, offsets = ctx.saved_tensors
    grad_q, grad_d = torch.ops.cupy_maxsim.maxsim_bwd(grad_scores.contiguous(), q, d, winners, offsets, ctx.mode)
    return (grad_q if ctx.needs_input_grad[0] else None, grad_d if ctx.needs_input_grad[1] else None,
            None, None, None, None)


if AVAILABLE:
    Tensor, OptionalTensor = torch.Tensor, typing.Optional[torch.Tensor]

    @torch.library.custom_op("cupy_maxsim::maxsim_fwd", mutates_args=())
    def maxsim_fwd(q: Tensor, d: Tensor, q_mask: OptionalTensor, d_mask: OptionalTensor,
                   offsets: OptionalTensor, mode: str) -> tuple[Tensor, Tensor]:
        return _forward(q, d, q_mask, d_mask, offsets, mode)

    @torch.library.custom_op("cupy_maxsim::maxsim_bwd", mutates_args=())
    def maxsim_bwd(grad_scores: Tensor, q: Tensor, d: Tensor, winners: Tensor, offsets: OptionalTensor,
                   mode: str) -> tuple[Tensor, Tensor]:
        return _backward(grad_scores, q, d, winners, offsets, mode)

    maxsim_fwd.register_fake(_forward_fake)
    maxsim_bwd.register_fake(_backward_fake)
    maxsim_fwd.register_autograd(_autograd_backward, setup_context=_setup_context)


def compiled_scores(q, d, q_mask, d_mask, offsets, mode):
    """The scores through the custom op (what ``cupy_maxsim.torch`` calls while compiling)."""
    return torch.ops.cupy_maxsim.maxsim_fwd(q, d, q_mask, d_mask, offsets, mode)[0]
