"""Training: the gradients of MaxSim scores from the forward's winners, and the adapters' entry.

:func:`score_backward` is the NumPy-level backward; :func:`backward_plan` and
:func:`score_with_plan` are what the autograd adapters (cupy_maxsim.torch, cupy_maxsim.jax)
call, so that the backward's checks, layout and outputs are settled in the forward.
"""

from __future__ import annotations

from . import _replay
from ._backward import BackwardPlan
from ._problem import backward_problem
from .scoring import score, score_packed_with_bounds, score_pairs
from .tuning import current


def score_backward(grad_scores, q, d, argmax, *, offsets=None, pairs=False):
    """Gradients of MaxSim scores with respect to the queries and the documents.

    Uses the winners saved by the forward (``return_argmax=True``): each query token's
    gradient gathers its winning document rows; each document token's gradient adds the query
    tokens it won, found by inverting the argmax into CSR on the GPU. No float atomics: the
    same inputs give bitwise the same gradients. Accumulation is in float32 (float64 for
    float64 inputs).

    Parameters
    ----------
    grad_scores : float array, shaped like the scores
        The loss's gradient with respect to the scores: (Nd,) or (Nq, Nd) (pairs: (B,)).
    q, d : arrays
        The forward's inputs: as given to :func:`score`, or to :func:`score_pairs` with
        ``pairs=True``; with ``offsets``, ``d`` is the ``tokens`` (T, D) of
        :func:`score_packed`. float16, bfloat16, float32 or float64 (int8 has no gradient).
    argmax : int16 or int32 array
        The forward's winners, shaped like the scores plus (Lq,). Masks need not be passed
        again: a masked token has no winner (-1) and gets a zero gradient.
    offsets : int32 or int64 array, shape (Nd + 1,), optional
        Packed documents, as in :func:`score_packed`.
    pairs : bool, optional
        The scores came from :func:`score_pairs`.

    Returns
    -------
    grad_q, grad_d : arrays shaped and typed like ``q`` and ``d``
        In the framework and on the device of ``q``; contiguous.
    """
    # Every input is checked before anything is launched.
    return backward_plan(q, d, argmax, offsets=offsets, pairs=pairs, prepare=False).gradients(grad_scores)



def backward_plan(q, d, argmax, *, offsets=None, pairs=False, prepare=True, _checked_offsets=None) -> BackwardPlan:
    """The part of :func:`score_backward` that needs no gradient: validation and, on a GPU (with
    ``prepare``), the launches' layout and arguments. Autograd adapters call this in the
    forward, so that their backward only launches the kernels
    (``plan.gradients(grad_scores)``). A training step repeats one signature of operands: after a
    GPU plan of padded documents, a later one of the same signature reuses its layout
    (_replay.py) and reads only the pointers. ``_checked_offsets``: the bounds
    score_packed_with_bounds returned for these very offsets, in the same adapter call."""
    key, pointers = _replay.backward_key(q, d, argmax, pairs) if prepare and offsets is None else (None, None)
    if key is not None:
        template = _replay.backward_templates.get(key)
        if template is not None:
            return template._rebound(pointers, (q, d, argmax), template.like.stream)
    plan = BackwardPlan(backward_problem(q, d, argmax, offsets, pairs, _checked_offsets), current())
    if prepare and plan.like.on_gpu:
        plan._prepare_gpu()
        if key is not None and plan._reusable:
            _replay.backward_templates.put(key, plan._template())
    return plan


def score_with_plan(q, d, *, q_mask=None, d_mask=None, offsets=None, pairs=False):
    """(scores, plan): the scores with winners and :func:`backward_plan` of them, an autograd
    adapter's forward (``offsets``: packed documents as in :func:`score_packed`; ``pairs``: as
    :func:`score_pairs`). A training step repeats one signature: after a GPU call of padded
    documents without masks, both launches are replayed under a single lookup (_replay.py),
    the step's host path being on its critical path."""
    if offsets is not None:
        (scores, argmax), bounds = score_packed_with_bounds(q, d, offsets, q_mask, None, None, True)
        plan = backward_plan(q, d, argmax, offsets=offsets, _checked_offsets=bounds)
    elif pairs:
        scores, argmax = score_pairs(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
        plan = backward_plan(q, d, argmax, pairs=True)
    else:
        key = _replay.replay_key(q, d, "plan") if q_mask is None and d_mask is None else None
        result = _replay.replayed(key, q, d)
        if result is not None:
            return result  # staged by the replay
        scores, argmax = score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
        plan = backward_plan(q, d, argmax)
        if key is not None:
            forward = _replay.replays.get(_replay.replay_key(q, d, True))
            template = _replay.backward_templates.get(_replay.backward_key(q, d, argmax, False)[0])
            if forward is not None and template is not None:
                _replay.replays.put(key, forward.with_backward(template))
    plan._stage()
    return scores, plan
