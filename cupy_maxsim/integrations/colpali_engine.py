"""colpali-engine's MaxSim on cupy_maxsim: ``maxsim_inbatch``, ``maxsim_kd`` and
``score_multi_vector`` with its signatures, and ``patch()`` for every place it captured them
(its losses, its processors' scoring: Byaldi and LlamaIndex's ColPali reranker score through
``score_multi_vector``).

    from cupy_maxsim.integrations import colpali_engine as cm_colpali
    cm_colpali.patch()                      # ColbertLoss & co. and processor.score(...) now ours
    scores = cm_colpali.score_multi_vector(query_list, page_list)   # (Nq, Nd) float32, CPU

Semantics kept (``../shared/research/ecosystem.md`` 3): no masks, zero-padded inputs, the pad
rows taking part in the max as the einsum lets them (a zero row scores 0); scores float32.
``score_multi_vector`` scores the pages packed, once for all queries, instead of re-padding
them per block of 128 queries: pages shorter than their block are not padded, so where every
real similarity of a query token is negative it scores that max, not the 0 a padding row would
give in colpali-engine (whose answer depends on the block a page falls in). Results stay on the
CPU, as colpali-engine returns them.
"""

from __future__ import annotations

import torch

from .. import quantize
from .. import torch as cmt
from ._patching import Patches


def maxsim_inbatch(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """(B_q, L_q, d) x (B_d, L_d, d) -> (B_q, B_d), differentiable, zero rows included."""
    return cmt.maxsim(query, doc.to(query.dtype))


def maxsim_kd(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """(B, L_q, d) x (B, N, L_d, d) -> (B, N): each query against its own N documents."""
    return cmt.maxsim_candidates(query, doc.to(query.dtype))


def maxsim_pairs(query: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    """Query b against document b: (B, L_q, d) x (B, L_d, d) -> (B,) (the negative losses'
    positive pairs)."""
    return cmt.maxsim_pairs(query, doc.to(query.dtype))


def score_multi_vector(qs, ps, batch_size: int = 128, device=None) -> torch.Tensor:
    """colpali-engine's ``BaseVisualRetrieverProcessor.score_multi_vector``: queries and pages
    as lists of (L_i, d) tensors or padded tensors -> (Nq, Nd) float32 on the CPU. The pages are
    packed once and moved to ``device`` once; queries go in blocks of ``batch_size``."""
    if len(qs) == 0:
        raise ValueError("No queries provided")
    if len(ps) == 0:
        raise ValueError("No passages provided")
    device = torch.device(device) if device is not None else (qs[0].device if isinstance(qs, list) else qs.device)
    pages = [p for p in ps] if isinstance(ps, torch.Tensor) else list(ps)
    tokens, offsets = quantize.pack([p.to(device) for p in pages])
    blocks = []
    for start in range(0, len(qs), batch_size):
        block = torch.nn.utils.rnn.pad_sequence([q.to(device) for q in qs[start:start + batch_size]], batch_first=True,
                                                padding_value=0)
        with torch.no_grad():
            blocks.append(cmt.maxsim_packed(block.to(tokens.dtype), tokens, offsets).float().cpu())
    return torch.cat(blocks, dim=0)


#: (module, attribute) -> replacement: the names colpali-engine 0.3.18 imported by value.
_TARGETS = {
    ("colpali_engine.utils.maxsim", "maxsim_inbatch"): maxsim_inbatch,
    ("colpali_engine.utils.maxsim", "maxsim_kd"): maxsim_kd,
    ("colpali_engine.loss.late_interaction_losses", "maxsim_inbatch"): maxsim_inbatch,
    ("colpali_engine.loss.late_interaction_losses", "maxsim_kd"): maxsim_kd,
    ("colpali_engine.utils.processing_utils", "maxsim_inbatch"): maxsim_inbatch,
}
_patches = Patches()


def patch() -> list[str]:
    """Route colpali-engine's in-batch and per-query MaxSim (its losses) and its processors'
    ``score_multi_vector`` through cupy_maxsim; returns the names replaced. ``unpatch()`` undoes
    it. (The negative losses' positive pairs are an einsum inside their ``forward``: not
    patched; :func:`maxsim_pairs` is their equivalent.)"""
    replaced = _patches.replace_in_modules(_TARGETS)
    try:
        from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor
    except ImportError:
        return replaced
    _patches.replace(BaseVisualRetrieverProcessor, "score_multi_vector", staticmethod(score_multi_vector))
    return replaced + ["colpali_engine.utils.processing_utils.BaseVisualRetrieverProcessor.score_multi_vector"]


def unpatch() -> None:
    """Put back everything :func:`patch` replaced."""
    _patches.restore()
