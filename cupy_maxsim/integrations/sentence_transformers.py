"""sentence-transformers 6's multi-vector MaxSim on cupy_maxsim: ``maxsim``,
``maxsim_pairwise`` (and their ``mean_`` forms) with the signatures of
``sentence_transformers.util.similarity``, the ``similarity_fct`` callables of its multi-vector
losses (``colbert_scores``, ``colbert_kd_scores``, ``colbert_scores_pairwise`` and ``mean_``
forms, as ``multi_vector_encoder.scoring`` has them) and ``patch()`` for the places that import
them by name.

    from cupy_maxsim.integrations import sentence_transformers as cm_st
    loss = MultiVectorMultipleNegativesRankingLoss(model, similarity_fct=cm_st.colbert_scores)
    evaluator = MultiVectorInformationRetrievalEvaluator(..., score_functions={"maxsim": cm_st.maxsim})

Semantics kept (``../shared/research/ecosystem.md`` 4): inputs padded with masks (bool or 0/1
float), lists of (L_i, dim) tensors of any lengths, or one (L, dim) item; a masked token never
wins a max; an empty document scores -1e9; scores float32 on the device of ``b`` (``device=``
scores elsewhere and brings them back); ``length_normalize`` divides by the real query tokens
(MeanMaxSim). ``chunk_elements`` is accepted and not needed: the kernels never hold the
similarity tensor.
"""

from __future__ import annotations

import torch

from .. import torch as cmt
from ._inputs import as_tensor as _tensor, bool_mask, padded
from ._patching import Patches

#: sentence-transformers' score for a document without a real token ("unlike the float32
#: minimum it survives a loss scaling and squaring it").
EMPTY_DOCUMENT_SCORE = -1e9


def maxsim(a, b, a_mask=None, b_mask=None, chunk_elements=None, length_normalize=False, device=None) -> torch.Tensor:
    """Every query of ``a`` against every document of ``b`` -> (Na, Nb) float32, differentiable."""
    q, q_mask = _batch(a, a_mask)
    d, d_mask = _batch(b, b_mask)
    home, where = d.device, torch.device(device) if device is not None else d.device
    scores = cmt.maxsim(q.to(where), d.to(where, q.dtype), q_mask=_to(q_mask, where), d_mask=_to(d_mask, where))
    return _finish(scores, q, q_mask, length_normalize, home)


def maxsim_pairwise(a, b, a_mask=None, b_mask=None, chunk_elements=None, length_normalize=False,
                    device=None) -> torch.Tensor:
    """Query i against document i -> (N,) float32, differentiable."""
    q, q_mask = _batch(a, a_mask)
    d, d_mask = _batch(b, b_mask)
    home, where = d.device, torch.device(device) if device is not None else d.device
    scores = cmt.maxsim_pairs(q.to(where), d.to(where, q.dtype), q_mask=_to(q_mask, where), d_mask=_to(d_mask, where))
    return _finish(scores, q, q_mask, length_normalize, home)


def mean_maxsim(a, b, a_mask=None, b_mask=None, chunk_elements=None, length_normalize=True, device=None):
    """:func:`maxsim` divided by each query's real token count (MeanMaxSim)."""
    return maxsim(a, b, a_mask, b_mask, chunk_elements, length_normalize, device)


def mean_maxsim_pairwise(a, b, a_mask=None, b_mask=None, chunk_elements=None, length_normalize=True, device=None):
    """:func:`maxsim_pairwise` divided by each query's real token count."""
    return maxsim_pairwise(a, b, a_mask, b_mask, chunk_elements, length_normalize, device)


def colbert_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                   chunk_elements=None, length_normalize=False) -> torch.Tensor:
    """The in-batch losses' scorer: (Q, q, dim) x (Q_d, N, d, dim) stacked documents, or
    (Nd, d, dim) -> (Q, Q_d * N) query-major (column j * N + k: group j's k-th slot), one call."""
    d = _tensor(documents_embeddings)
    mask = None if documents_mask is None else _tensor(documents_mask)
    if d.dim() == 4:
        groups, slots = d.shape[:2]
        d = d.reshape(groups * slots, *d.shape[2:])
        mask = None if mask is None else mask.reshape(groups * slots, -1)
    return maxsim(queries_embeddings, d, queries_mask, mask, chunk_elements, length_normalize)


def colbert_kd_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                      chunk_elements=None, length_normalize=False) -> torch.Tensor:
    """Distillation's scorer: (B, q, dim) x (B, n_ways, d, dim) -> (B, n_ways)."""
    q, q_mask = _batch(queries_embeddings, queries_mask)
    d = _tensor(documents_embeddings)
    d_mask = None if documents_mask is None else bool_mask(documents_mask)
    scores = cmt.maxsim_candidates(q, d.to(q.dtype), q_mask=q_mask, d_mask=d_mask)
    return _finish(scores, q, q_mask, length_normalize, d.device)


def colbert_scores_pairwise(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                            chunk_elements=None, length_normalize=False) -> torch.Tensor:
    """MarginMSE's scorer: (B, q, dim) x (B, d, dim) -> (B,)."""
    return maxsim_pairwise(queries_embeddings, documents_embeddings, queries_mask, documents_mask, chunk_elements,
                           length_normalize)


def mean_colbert_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                        chunk_elements=None, length_normalize=True):
    return colbert_scores(queries_embeddings, documents_embeddings, queries_mask, documents_mask, chunk_elements,
                          length_normalize)


def mean_colbert_kd_scores(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                           chunk_elements=None, length_normalize=True):
    return colbert_kd_scores(queries_embeddings, documents_embeddings, queries_mask, documents_mask, chunk_elements,
                             length_normalize)


def mean_colbert_scores_pairwise(queries_embeddings, documents_embeddings, queries_mask=None, documents_mask=None,
                                 chunk_elements=None, length_normalize=True):
    return colbert_scores_pairwise(queries_embeddings, documents_embeddings, queries_mask, documents_mask,
                                   chunk_elements, length_normalize)


_SIMILARITY = {"maxsim": maxsim, "maxsim_pairwise": maxsim_pairwise, "mean_maxsim": mean_maxsim,
               "mean_maxsim_pairwise": mean_maxsim_pairwise}
_SCORING = {"colbert_scores": colbert_scores, "colbert_kd_scores": colbert_kd_scores,
            "colbert_scores_pairwise": colbert_scores_pairwise, "mean_colbert_scores": mean_colbert_scores,
            "mean_colbert_kd_scores": mean_colbert_kd_scores, "mean_colbert_scores_pairwise": mean_colbert_scores_pairwise}
#: Where sentence-transformers 6.2 holds them: util.similarity (model.similarity resolves
#: ``maxsim`` there at call time), the scoring module that imported them by name, and the
#: losses that imported its scorers as defaults.
_TARGETS = {
    **{("sentence_transformers.util.similarity", name): fn for name, fn in _SIMILARITY.items()},
    **{("sentence_transformers.util", name): fn for name, fn in _SIMILARITY.items()},
    **{("sentence_transformers.multi_vector_encoder.scoring.colbert", name): fn
       for name, fn in {**_SIMILARITY, **_SCORING}.items()},
    **{("sentence_transformers.multi_vector_encoder.scoring", name): fn for name, fn in _SCORING.items()},
}
_patches = Patches()


def patch() -> list[str]:
    """Route sentence-transformers' multi-vector MaxSim through cupy_maxsim (similarity
    functions, scorers, ``model.similarity``); returns the names replaced. ``unpatch()`` undoes
    it. Losses built before patch() keep the scorer they were given."""
    return _patches.replace_in_modules(_TARGETS)


def unpatch() -> None:
    """Put back everything :func:`patch` replaced."""
    _patches.restore()


# ---- inputs ------------------------------------------------------------------------------------


def _batch(x, mask):
    """(N, L, dim) tensor and a bool mask (or None): a padded tensor (its mask as given), one
    (L, dim) item, or a list of (L_i, dim) items (padded here, the padding masked; a list of
    1-D masks with it)."""
    if isinstance(x, (list, tuple)):
        return padded(x, mask)
    x = _tensor(x)
    mask = None if mask is None else bool_mask(mask)
    if x.dim() == 2:
        return x[None], None if mask is None else mask.reshape(1, -1)
    return x, mask


def _to(mask, device):
    return None if mask is None else mask.to(device)


def _finish(scores, q, q_mask, length_normalize, home):
    """float32, empty documents at -1e9, MeanMaxSim's division, on ``home``."""
    scores = scores.float().masked_fill(scores == float("-inf"), EMPTY_DOCUMENT_SCORE)
    if length_normalize:
        real = q_mask if q_mask is not None else q.abs().sum(-1) != 0  # sentence-transformers counts non-zero rows
        counts = real.sum(-1).clamp(min=1).to(scores.device, scores.dtype)
        scores = scores / (counts[:, None] if scores.dim() == 2 else counts)
    return scores.to(home)
