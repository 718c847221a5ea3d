"""cupy_maxsim.integrations.sentence_transformers against sentence-transformers 6 itself (issue 26,
item 3): maxsim, maxsim_pairwise and their mean forms, and the multi-vector losses' scorers,
results and gradients against its own, with masks that have holes, float masks, ragged lists,
empty documents; its four multi-vector loss classes on a real MultiVectorEncoder built offline
(a comma skiplist: masks with holes); patch() / unpatch(). float32 on the CPU, within 1e-5; the loss scorers and
the loss classes on the GPU in float16 and bfloat16 within the FlashAttention rule."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers.multi_vector_encoder")  # sentence-transformers 6

from sentence_transformers.multi_vector_encoder import scoring as st_scoring  # noqa: E402
from sentence_transformers.util import similarity as st_similarity  # noqa: E402

from cupy_maxsim.integrations import sentence_transformers as ours  # noqa: E402
from support import assert_flash_attention_rule, cast_scorer, features_on, save_tiny_bert, texts  # noqa: E402


def _rows(rng, shape):
    x = rng.standard_normal(shape)
    return torch.tensor(x / np.linalg.norm(x, axis=-1, keepdims=True), dtype=torch.float32)


def _holes(rng, shape, keep=0.7):
    return torch.tensor(rng.random(shape) < keep)


def _both(fn_ours, fn_theirs, *tensors, **kwargs):
    """Each function's result and gradients with respect to the embeddings (the first two of
    ``tensors``; the rest are masks)."""
    out = []
    for fn in (fn_ours, fn_theirs):
        inputs = [t.clone().requires_grad_() if i < 2 else t for i, t in enumerate(tensors)]
        result = fn(*inputs, **kwargs)
        (result.square().sum() + result.sum()).backward()
        out.append((result.detach(), [t.grad for t in inputs if t.requires_grad]))
    return out


def _close(a, b):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def _check(pair):
    (mine, my_grads), (theirs, their_grads) = pair
    _close(mine, theirs)
    for got, want in zip(my_grads, their_grads):
        _close(got, want)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_maxsim_and_pairwise_match(length_normalize):
    rng = np.random.default_rng(0)
    q, d = _rows(rng, (3, 7, 16)), _rows(rng, (5, 11, 16))
    q_mask, d_mask = _holes(rng, (3, 7)), _holes(rng, (5, 11))
    d_mask[2] = False  # an empty document: -1e9
    kwargs = dict(length_normalize=length_normalize)
    _check(_both(ours.maxsim, st_similarity.maxsim, q, d, q_mask, d_mask, **kwargs))
    _check(_both(ours.maxsim, st_similarity.maxsim, q, d, q_mask.float(), d_mask.float(), **kwargs))
    _check(_both(ours.maxsim, st_similarity.maxsim, q, d, **kwargs))
    assert (ours.maxsim(q, d, q_mask, d_mask)[:, 2] == -1e9).all()
    d3 = _rows(rng, (3, 11, 16))
    _check(_both(ours.maxsim_pairwise, st_similarity.maxsim_pairwise, q, d3, q_mask, d_mask[:3], **kwargs))
    _close(ours.mean_maxsim(q, d, q_mask, d_mask), st_similarity.mean_maxsim(q, d, q_mask, d_mask))


def test_ragged_lists_and_one_item():
    rng = np.random.default_rng(1)
    queries = [_rows(rng, (n, 16)) for n in (3, 8, 5)]
    documents = [_rows(rng, (n, 16)) for n in (9, 1, 14, 4)]
    _close(ours.maxsim(queries, documents), st_similarity.maxsim(queries, documents))
    _close(ours.maxsim(queries[0], documents), st_similarity.maxsim(queries[0], documents))
    _close(ours.maxsim_pairwise(queries, documents[:3]), st_similarity.maxsim_pairwise(queries, documents[:3]))
    _close(ours.maxsim(queries, documents, length_normalize=True),
           st_similarity.maxsim(queries, documents, length_normalize=True))


def test_loss_scorers_match():
    rng = np.random.default_rng(2)
    q, q_mask = _rows(rng, (4, 6, 16)), _holes(rng, (4, 6))
    stacked, stacked_mask = _rows(rng, (4, 3, 10, 16)), _holes(rng, (4, 3, 10))
    for name in ("colbert_scores", "colbert_kd_scores", "mean_colbert_scores", "mean_colbert_kd_scores"):
        _check(_both(getattr(ours, name), getattr(st_scoring, name), q, stacked, q_mask, stacked_mask))
    d, d_mask = _rows(rng, (4, 10, 16)), _holes(rng, (4, 10))
    for name in ("colbert_scores_pairwise", "mean_colbert_scores_pairwise"):
        _check(_both(getattr(ours, name), getattr(st_scoring, name), q, d, q_mask, d_mask))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_loss_scorers_on_the_gpu_within_the_flash_attention_rule(dtype):
    """On the GPU in float16 / bfloat16, with masks that have holes: our scores and gradients
    against sentence-transformers' own scorers in float64 on the same rounded inputs, at most
    twice the error of its own in the same precision (the FlashAttention rule)."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    rng = np.random.default_rng(3)
    low = getattr(torch, dtype)
    q, q_mask = _rows(rng, (8, 32, 128)).to("cuda", low), _holes(rng, (8, 32)).cuda()
    stacked, stacked_mask = _rows(rng, (8, 4, 180, 128)).to("cuda", low), _holes(rng, (8, 4, 180)).cuda()
    d, d_mask = stacked[:, 0], stacked_mask[:, 0]
    cases = [(name, (q, stacked, q_mask, stacked_mask)) for name in
             ("colbert_scores", "colbert_kd_scores", "mean_colbert_scores", "mean_colbert_kd_scores")]
    cases += [(name, (q, d, q_mask, d_mask)) for name in ("colbert_scores_pairwise", "mean_colbert_scores_pairwise")]
    for name, tensors in cases:
        (mine, my_grads), (theirs, their_grads) = _both(getattr(ours, name), getattr(st_scoring, name), *tensors)
        (exact, exact_grads), _ = _both(getattr(st_scoring, name), getattr(st_scoring, name),
                                        *(t.double() for t in tensors[:2]), *tensors[2:])
        assert_flash_attention_rule(mine, theirs, exact, what=name)
        for got, want, reference in zip(my_grads, their_grads, exact_grads):
            assert_flash_attention_rule(got, want, reference, what=f"{name} gradient")


# Its multi-vector loss classes on a real MultiVectorEncoder: (loss, the scorer it takes by
# default, our scorer of that name, document columns, teacher labels (batch, columns) or None).
LOSS_CLASSES = {
    "MultiVectorMultipleNegativesRankingLoss": ("colbert_scores", 2, False, {}),
    "CachedMultiVectorMultipleNegativesRankingLoss": ("colbert_scores", 2, False, {"mini_batch_size": 2}),
    "MultiVectorDistillKLDivLoss": ("colbert_kd_scores", 3, True, {}),
    "MultiVectorMarginMSELoss": ("colbert_scores_pairwise", 2, True, {}),
}


def _encoder(folder, device):
    """sentence-transformers 6's MultiVectorEncoder on a bare BERT folder (its default modules:
    the transformer, a 128-wide projection, the scoring mask and a normalisation), with a comma
    skiplist: the documents' masks get holes."""
    from sentence_transformers.multi_vector_encoder import MultiVectorEncoder

    torch.manual_seed(0)
    model = MultiVectorEncoder(str(folder), device=device, local_files_only=True)
    next(m for m in model if type(m).__name__ == "MultiVectorMask").skiplist_words = [","]
    return model


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def _loss_features(model, name, rng, batch=6):
    _, columns, teacher, _ = LOSS_CLASSES[name]
    features = [dict(model.preprocess(texts(rng, batch, 5)), task="query")]
    features += [dict(model.preprocess(texts(rng, batch, 12)), task="document") for _ in range(columns)]
    features = features_on(model.device, features)
    labels = None
    if teacher:
        shape = (batch, columns) if "KLDiv" in name else (batch,)
        labels = torch.tensor(rng.standard_normal(shape), dtype=torch.float32, device=model.device)
    return features, labels


def _loss_class_run(model, name, scorer, features, labels):
    from sentence_transformers.multi_vector_encoder import losses as mv_losses

    model.zero_grad()
    loss = getattr(mv_losses, name)(model, similarity_fct=scorer, **LOSS_CLASSES[name][3])
    value = loss(features, labels)
    value.backward()
    return value.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("name", list(LOSS_CLASSES))
def test_loss_classes_match(bert_folder, name):
    model = _encoder(bert_folder, "cpu")
    features, labels = _loss_features(model, name, np.random.default_rng(4))
    scorer = LOSS_CLASSES[name][0]
    mine = _loss_class_run(model, name, getattr(ours, scorer), features, labels)
    theirs = _loss_class_run(model, name, getattr(st_scoring, scorer), features, labels)
    _close(mine[0], theirs[0])
    assert len(mine[1]) == len(theirs[1]) > 0
    for got, want in zip(mine[1], theirs[1]):
        _close(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(LOSS_CLASSES))
def test_loss_classes_on_the_gpu_within_the_flash_attention_rule(bert_folder, name, dtype):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    model = _encoder(bert_folder, "cuda")
    features, labels = _loss_features(model, name, np.random.default_rng(5), batch=16)
    scorer, low = LOSS_CLASSES[name][0], getattr(torch, dtype)
    mine, theirs, exact = (_loss_class_run(model, name, cast_scorer(fn, low, compute), features, labels)
                           for fn, compute in ((getattr(ours, scorer), None), (getattr(st_scoring, scorer), None),
                                               (getattr(st_scoring, scorer), torch.float64)))
    assert_flash_attention_rule(mine[0], theirs[0], exact[0], what="loss")
    assert len(mine[1]) == len(exact[1]) > 0
    for i, (got, want, reference) in enumerate(zip(mine[1], theirs[1], exact[1])):
        assert_flash_attention_rule(got, want, reference, what=f"gradient {i}")


def test_patch_and_unpatch():
    import sentence_transformers.multi_vector_encoder.scoring.colbert as st_colbert

    original = st_similarity.maxsim
    replaced = ours.patch()
    try:
        assert st_similarity.maxsim is ours.maxsim and st_colbert.maxsim is ours.maxsim
        assert "sentence_transformers.multi_vector_encoder.scoring.colbert.colbert_scores" in replaced
    finally:
        ours.unpatch()
    assert st_similarity.maxsim is original and st_colbert.maxsim is original
