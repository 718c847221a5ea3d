"""vLLM's late-interaction scoring on cupy_maxsim: a ``vllm.general_plugins`` entry point
(``register``, declared in pyproject.toml) that replaces ``LateInteractionRunner._score``, the
worker-side scorer of ``score_doc`` requests (vLLM 0.33: ``vllm/v1/pool/late_interaction_runner.py``).

vLLM's own path scores one shared query with its vendored flash-maxsim kernel (CUDA only, cast
to fp16 in the kernel) and everything else (distinct queries, CPU tensors) with a reference that
pads every pair into float32 in a Python loop (``compute_maxsim_score_batched``; issue #38282
measured the padding at 84% of scoring time). Here: pairs that share a query tensor are one
packed call (no padding), distinct queries one call of aligned pairs, on CUDA or CPU tensors, in
the inputs' dtype with float32 scores. Semantics kept: a 0-d float32 score a pair, in order; a
query without tokens scores 0, a document without tokens -inf.

Off unless vLLM loads it (the entry point is read by vLLM alone) and unless CUPY_MAXSIM_VLLM=0.
vLLM loads plugins in every process, maybe more than once: ``register`` is idempotent. A failure
in a call is logged once and that call, and every later one in the process, goes to vLLM's own
scorer (as vLLM does for its flash kernel).
"""

from __future__ import annotations

import logging
import os

import torch

from .. import torch as cmt
from ._inputs import padded

logger = logging.getLogger(__name__)


def register() -> None:
    """Replace ``LateInteractionRunner._score`` with :func:`score_pairs` (vLLM's plugin hook)."""
    if os.environ.get("CUPY_MAXSIM_VLLM", "1") == "0":
        return
    try:
        from vllm.v1.pool.late_interaction_runner import LateInteractionRunner
    except ImportError:  # a vLLM without the late-interaction runner: nothing to replace
        return
    if getattr(LateInteractionRunner._score, "_cupy_maxsim", False):
        return
    original = LateInteractionRunner._score

    def _score(self, queries, docs):
        if not getattr(self, "_cupy_maxsim_failed", False):
            try:
                return score_pairs(queries, docs)
            except Exception as error:  # noqa: BLE001 - requests are served whatever fails here
                self._cupy_maxsim_failed = True
                logger.warning("cupy_maxsim scoring failed (%s); vLLM's own scorer serves this runner from now on", error)
        return original(self, queries, docs)

    _score._cupy_maxsim = True
    _score.__wrapped__ = original
    LateInteractionRunner._score = _score


def unregister() -> None:
    """Put vLLM's own ``_score`` back."""
    try:
        from vllm.v1.pool.late_interaction_runner import LateInteractionRunner
    except ImportError:
        return
    if getattr(LateInteractionRunner._score, "_cupy_maxsim", False):
        LateInteractionRunner._score = LateInteractionRunner._score.__wrapped__


@torch.no_grad()
def score_pairs(queries: list[torch.Tensor], docs: list[torch.Tensor]) -> list[torch.Tensor]:
    """MaxSim of each (queries[i], docs[i]) pair, (Lq_i, dim) and (Ld_i, dim) tensors on one
    device: a list of 0-d float32 tensors. Pairs that share a query tensor (vLLM's rerank: the
    same cached tensor) are scored as one packed call; the rest as aligned pairs."""
    if len(queries) != len(docs):
        raise ValueError(f"queries and docs must pair up, got {len(queries)} and {len(docs)}")
    if not docs:
        return []
    for q, d in zip(queries, docs):
        if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
            raise ValueError(f"each query and document must be (tokens, dim) of one dim, got {tuple(q.shape)} "
                             f"and {tuple(d.shape)}")
        if q.device != d.device:
            raise ValueError(f"a query and its document must be on one device, got {q.device} and {d.device}")
    groups: dict[int, list[int]] = {}
    for i, q in enumerate(queries):
        groups.setdefault(id(q), []).append(i)
    scores = torch.empty(len(docs), dtype=torch.float32, device=queries[0].device)
    if len(groups) == 1 or len(groups) * 4 <= len(docs):  # shared queries: packed, no padding
        for members in groups.values():
            q = queries[members[0]]
            scores[members] = _packed(q, [docs[i] for i in members])
    else:
        scores[:] = _aligned(queries, docs)
    return list(scores.unbind(0))


def _packed(q: torch.Tensor, docs: list[torch.Tensor]) -> torch.Tensor:
    lengths = torch.tensor([0] + [int(d.shape[0]) for d in docs], dtype=torch.int64)
    tokens = torch.cat([d.to(q.dtype) for d in docs]) if len(docs) > 1 else docs[0].to(q.dtype)
    return cmt.maxsim_packed(q, tokens, torch.cumsum(lengths, 0).to(q.device)).float()


def _aligned(queries: list[torch.Tensor], docs: list[torch.Tensor]) -> torch.Tensor:
    """Distinct queries: padded into (B, Lq, D) and (B, Ld, D) with masks (vLLM's batches are
    small), one call of aligned pairs."""
    q, q_mask = padded(queries)
    d, d_mask = padded(docs)
    return cmt.maxsim_pairs(q, d.to(q.dtype), q_mask=q_mask, d_mask=d_mask).float()
