"""PyLate's scorers on cupy_maxsim: the same signatures as ``pylate.scores``, one launch each.

    from cupy_maxsim.integrations import pylate as cm_pylate
    loss = pylate.losses.Contrastive(model, score_metric=cm_pylate.ColBERTScores())
    loss = pylate.losses.Distillation(model, score_metric=cm_pylate.colbert_kd_scores)
    cm_pylate.patch()      # or: every place PyLate captured its scorers, until unpatch()
    cm_pylate.rerank(documents_ids, queries_embeddings, documents_embeddings)  # packed

Semantics kept from PyLate (``../shared/research/ecosystem.md`` 1.6):

- masks are bool or 0/1 floats, with holes (skiplists); a float mask is ``mask != 0``;
- an empty document (no real token) scores 0, as PyLate's own torch scorer scores it: the
  -inf of ``cupy_maxsim.score`` would turn Distillation's min-max normalisation into NaN;
- scores are float32 (PyLate's flash and LIK backends' dtype; its torch path answers in the
  input dtype);
- ``ColBERTScores`` scores all ``Q_doc x N`` document slots in one call (PyLate's loops over
  the N slots), in its query-major layout: ``scores[i, j * N + k]``.

One difference, on purpose: a masked document token never wins a max here (PyLate's torch path
multiplies similarities by the mask, so a masked token scores 0 and wins where every real
similarity is negative; its flash and LIK backends do as we do). ``backend=`` is accepted and
ignored, so that PyLate's call sites need no change.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import torch as cmt
from ._inputs import as_tensor as _tensor, bool_mask as _mask, padded
from ._patching import Patches

#: What a document with no real token scores (PyLate's torch path: a sum of masked zeros).
EMPTY_DOCUMENT_SCORE = 0.0


def colbert_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                   backend=None) -> torch.Tensor:
    """(Nq, Lq, H) queries x (B, Ld, H) documents -> (Nq, B) scores, differentiable."""
    q, d = _tensor(queries_embeddings), _tensor(documents_embeddings)
    return _finite(cmt.maxsim(q, d.to(q.dtype), q_mask=_mask(queries_mask), d_mask=_mask(documents_mask)))


def colbert_scores_pairwise(queries_embeddings, documents_embeddings, backend=None) -> torch.Tensor:
    """Query b against document b -> (B,): tensors (B, L, H), or lists of (L_b, H) of any lengths
    (padded here, the padding masked)."""
    q, q_mask = _padded(queries_embeddings)
    d, d_mask = _padded(documents_embeddings)
    return _finite(cmt.maxsim_pairs(q, d.to(q.dtype), q_mask=q_mask, d_mask=d_mask))


def colbert_kd_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                      backend=None) -> torch.Tensor:
    """Each query against its own K candidates: (B, Lq, H) x (B, K, Ld, H) -> (B, K)."""
    q, d = _tensor(queries_embeddings), _tensor(documents_embeddings)
    return _finite(cmt.maxsim_candidates(q, d.to(q.dtype), q_mask=_mask(queries_mask), d_mask=_mask(documents_mask)))


class ColBERTScores:
    """PyLate's contrastive scorer: (Q_query, Qt, H) queries x (Q_doc, N, Dt, H) stacked document
    groups -> (Q_query, Q_doc * N), query-major, in one call."""

    def __call__(self, queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                 backend=None) -> torch.Tensor:
        d = _tensor(documents_embeddings)
        groups, slots = d.shape[:2]
        mask = _mask(documents_mask)
        return colbert_scores(queries_embeddings, d.reshape(groups * slots, *d.shape[2:]), queries_mask,
                              None if mask is None else mask.reshape(groups * slots, -1))


def rerank(documents_ids, queries_embeddings, documents_embeddings, device=None) -> list[list[dict]]:
    """``pylate.rank.rerank``'s signature and results (per query, its candidates as
    ``{"id", "score"}`` by descending score), each query's candidates scored packed: their real
    tokens only, one call a query, no padded copy. Ties keep the candidates' order. One
    difference, on purpose: PyLate pads candidates with zero rows and scores them unmasked, so a
    candidate whose every similarity is negative scores 0 there; here it scores its own best."""
    import cupy_maxsim as cm

    results = []
    queries = queries_embeddings  # a list of (Lq, H), or one (Nq, Lq, H) / (Lq, H) array
    if not isinstance(queries, (list, tuple)):
        queries = [queries] if _tensor(queries).ndim == 2 else list(_tensor(queries))
    for query, ids, candidates in zip(queries, documents_ids, documents_embeddings):
        q = _tensor(query)
        if device is not None:
            q = q.to(device)
        docs = [_tensor(x).to(q.device, q.dtype) for x in candidates]
        if not docs:
            results.append([])
            continue
        lengths = torch.tensor([0] + [x.shape[0] for x in docs], device=q.device)
        with torch.no_grad():  # (reranking: scores, not a loss)
            scores = cm.score_packed(q, torch.cat(docs), torch.cumsum(lengths, 0))
        order = torch.sort(scores, descending=True, stable=True)
        results.append([{"id": ids[i], "score": float(v)} for v, i in zip(order.values.tolist(),
                                                                         order.indices.tolist())])
    return results


# ---- patching: every place PyLate 1.6 captured a scorer --------------------------------------

#: (module, attribute) -> what replaces it. ``from ..scores import colbert_scores`` copies the
#: function into each importing module, so each copy is replaced; the losses build
#: ``ColBERTScores()`` by their own module's name.
_TARGETS = {
    ("pylate.scores.colbert", "colbert_scores"): colbert_scores,
    ("pylate.scores.colbert", "colbert_scores_pairwise"): colbert_scores_pairwise,
    ("pylate.scores.colbert", "colbert_kd_scores"): colbert_kd_scores,
    ("pylate.scores.colbert", "ColBERTScores"): ColBERTScores,
    ("pylate.scores", "colbert_scores"): colbert_scores,
    ("pylate.scores", "colbert_scores_pairwise"): colbert_scores_pairwise,
    ("pylate.scores", "colbert_kd_scores"): colbert_kd_scores,
    ("pylate.scores", "ColBERTScores"): ColBERTScores,
    ("pylate.scores.similarity_functions", "colbert_scores"): colbert_scores,
    ("pylate.scores.similarity_functions", "colbert_scores_pairwise"): colbert_scores_pairwise,
    ("pylate.rank.rank", "colbert_scores"): colbert_scores,
    ("pylate.losses.contrastive", "ColBERTScores"): ColBERTScores,
    ("pylate.losses.cached_contrastive", "ColBERTScores"): ColBERTScores,
    ("pylate.losses.distillation", "colbert_kd_scores"): colbert_kd_scores,
    ("pylate.evaluation.colbert_triplet", "colbert_scores_pairwise"): colbert_scores_pairwise,
    ("pylate.evaluation.colbert_distillation", "colbert_kd_scores"): colbert_kd_scores,
}
_patches = Patches()


def patch() -> list[str]:
    """Route PyLate's scoring through cupy_maxsim everywhere it captured a scorer (scores,
    losses, rank.rerank, similarity functions, evaluators), including ``Distillation``'s
    default ``score_metric``; returns the names replaced. ``unpatch()`` undoes it."""
    replaced = _patches.replace_in_modules(_TARGETS)
    try:
        from pylate.losses.distillation import Distillation
    except ImportError:
        return replaced
    # score_metric=colbert_kd_scores was bound when PyLate defined Distillation.__init__.
    defaults = list(Distillation.__init__.__defaults__)
    defaults[0] = colbert_kd_scores
    _patches.replace(Distillation.__init__, "__defaults__", tuple(defaults))
    return replaced + ["pylate.losses.distillation.Distillation.__init__ (score_metric default)"]


def unpatch() -> None:
    """Put back everything :func:`patch` replaced."""
    _patches.restore()


# ---- inputs ------------------------------------------------------------------------------------


def _padded(x):
    """A (B, L, H) tensor and no mask, or a list of (L_b, H) padded to the longest and masked."""
    if isinstance(x, torch.Tensor) or (isinstance(x, np.ndarray) and x.ndim == 3):
        return _tensor(x), None
    return padded(x)


def _finite(scores: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(scores == float("-inf"), EMPTY_DOCUMENT_SCORE)
