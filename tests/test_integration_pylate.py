"""cupy_maxsim.integrations.pylate against PyLate itself (issue 26, item 2): its scorers'
results and gradients against PyLate's torch scorers, and its own losses (Contrastive,
CachedContrastive, Distillation) on a real, tiny ColBERT built offline, with skiplist masks that
have holes, through score_metric= and through patch(). float32 on the CPU, within 1e-5; on the
GPU, the embeddings scored in float16 and bfloat16 within the FlashAttention rule (our error
against PyLate's scorer in float64 at most twice its own scorer's in the same precision)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pylate = pytest.importorskip("pylate")

from pylate import losses, models  # noqa: E402
from pylate import scores as pylate_scores  # noqa: E402

from cupy_maxsim.integrations import pylate as ours  # noqa: E402
from support import WORDS, assert_flash_attention_rule, cast_scorer, features_on, save_tiny_bert, texts as _texts  # noqa: E402

BIAS = 0.0


@pytest.fixture(autouse=True)
def torch_backend(monkeypatch):
    """PyLate's own torch scorer as the comparison: its "auto" takes flash-maxsim or
    late-interaction-kernels for CUDA tensors where they are installed (Triton: no float64)."""
    monkeypatch.setenv("PYLATE_SCORES_BACKEND", "torch")


def _embeddings(rng, shape):
    """Unit rows around one shared direction: every similarity is positive, so PyLate's torch
    path (a masked token scores 0 and may win) and ours (a masked token never wins) agree."""
    x = rng.standard_normal(shape) * 0.3 + 1.0
    return torch.tensor(x / np.linalg.norm(x, axis=-1, keepdims=True), dtype=torch.float32)


def _holes(rng, shape, keep=0.7):
    mask = torch.tensor(rng.random(shape) < keep)
    mask[..., 0] = True  # at least one real token in each document
    return mask


def _assert_close(a, b):
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_colbert_scores_and_gradients_match_pylate_torch():
    rng = np.random.default_rng(0)
    q, d = _embeddings(rng, (4, 8, 16)), _embeddings(rng, (6, 12, 16))
    q_mask, d_mask = _holes(rng, (4, 8)), _holes(rng, (6, 12))
    for masks in ((None, None), (q_mask, d_mask), (q_mask.float(), d_mask.float())):
        results = []
        for scorer in (ours.colbert_scores, lambda *a: pylate_scores.colbert_scores(*a, backend="torch")):
            qq, dd = q.clone().requires_grad_(), d.clone().requires_grad_()
            scores = scorer(qq, dd, *masks)
            (scores.square().sum() + scores.logsumexp(-1).sum()).backward()
            results.append((scores.detach(), qq.grad, dd.grad))
        for got, want in zip(*results):
            _assert_close(got, want)


def test_colbert_scores_class_and_kd_and_pairwise_match():
    rng = np.random.default_rng(1)
    q = _embeddings(rng, (3, 8, 16))
    groups = _embeddings(rng, (3, 4, 10, 16))
    masks = _holes(rng, (3, 4, 10))
    _assert_close(ours.ColBERTScores()(q, groups, documents_mask=masks),
                  pylate_scores.ColBERTScores()(q, groups, documents_mask=masks, backend="torch"))
    _assert_close(ours.colbert_kd_scores(q, groups, documents_mask=masks),
                  pylate_scores.colbert_kd_scores(q, groups, documents_mask=masks, backend="torch"))
    d = _embeddings(rng, (3, 10, 16))
    _assert_close(ours.colbert_scores_pairwise(q, d), pylate_scores.colbert_scores_pairwise(q, d, backend="torch"))
    ragged_q = [_embeddings(rng, (n, 16)) for n in (3, 8, 5)]
    ragged_d = [_embeddings(rng, (n, 16)) for n in (9, 2, 12)]
    _assert_close(ours.colbert_scores_pairwise(ragged_q, ragged_d),
                  pylate_scores.colbert_scores_pairwise(ragged_q, ragged_d, backend="torch"))


def test_an_empty_document_scores_zero_as_in_pylate():
    rng = np.random.default_rng(2)
    q, d = _embeddings(rng, (2, 5, 16)), _embeddings(rng, (3, 7, 16))
    d_mask = _holes(rng, (3, 7))
    d_mask[1] = False
    got = ours.colbert_scores(q, d, documents_mask=d_mask)
    _assert_close(got, pylate_scores.colbert_scores(q, d, documents_mask=d_mask, backend="torch"))
    assert (got[:, 1] == 0).all()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A real BERT for PyLate's ColBERT: one layer of random weights and a word-level vocabulary,
    saved to disk (no download). Its last LayerNorm's bias is large, so its token embeddings
    share a direction (positive similarities: see _embeddings)."""
    pytest.importorskip("transformers")
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), WORDS, BIAS)


def _colbert(folder, device):
    return models.ColBERT(model_name_or_path=str(folder), embedding_size=16, device=device, query_length=8,
                          document_length=16)


@pytest.fixture(scope="module")
def colbert(tiny_bert):
    """The tiny ColBERT on the CPU."""
    return _colbert(tiny_bert, "cpu")


@pytest.fixture(scope="module")
def colbert_cuda(tiny_bert):
    """The same ColBERT on the GPU (float32 weights: the scorers see the embeddings cast to
    float16 / bfloat16, as a mixed-precision step hands them over)."""
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return _colbert(tiny_bert, "cuda")


def _loss_and_gradients(model, loss, features, labels=None):
    model.zero_grad()
    value = loss(features, labels)
    value.backward()
    return value.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _features(model, rng, batch, slots):
    queries = model.tokenize(_texts(rng, batch, 5), is_query=True)
    documents = [model.tokenize(_texts(rng, batch, 12), is_query=False) for _ in range(slots)]
    return features_on(model.device, [queries] + documents)


@pytest.mark.parametrize("make", [
    lambda model, metric: losses.Contrastive(model, score_metric=metric),
    lambda model, metric: losses.CachedContrastive(model, score_metric=metric, mini_batch_size=2),
], ids=["Contrastive", "CachedContrastive"])
def test_contrastive_losses_match(colbert, make):
    rng = np.random.default_rng(3)
    features = _features(colbert, rng, batch=4, slots=2)  # a positive and a hard negative
    theirs = _loss_and_gradients(colbert, make(colbert, pylate_scores.ColBERTScores()), features)
    mine = _loss_and_gradients(colbert, make(colbert, ours.ColBERTScores()), features)
    _assert_close(mine[0], theirs[0])
    for got, want in zip(mine[1], theirs[1]):
        _assert_close(got, want)


def test_distillation_matches(colbert):
    rng = np.random.default_rng(4)
    batch, candidates = 3, 4
    queries = colbert.tokenize(_texts(rng, batch, 5), is_query=True)
    documents = colbert.tokenize(_texts(rng, batch * candidates, 12), is_query=False)
    teacher = torch.tensor(rng.standard_normal((batch, candidates)), dtype=torch.float32)
    theirs = _loss_and_gradients(colbert, losses.Distillation(colbert), [queries, documents], teacher)
    mine = _loss_and_gradients(colbert, losses.Distillation(colbert, score_metric=ours.colbert_kd_scores),
                               [queries, documents], teacher)
    _assert_close(mine[0], theirs[0])
    for got, want in zip(mine[1], theirs[1]):
        _assert_close(got, want)


def _three_ways(model, make, dtype, features, labels, ours_metric, their_metric):
    """(loss, gradients) with our scorer and theirs in ``dtype``, and theirs in float64."""
    return [_loss_and_gradients(model, make(model, cast_scorer(metric, dtype, compute)), features, labels)
            for metric, compute in ((ours_metric, None), (their_metric, None), (their_metric, torch.float64))]


def _assert_rule(mine, theirs, exact):
    assert_flash_attention_rule(mine[0], theirs[0], exact[0], what="loss")
    assert len(mine[1]) == len(exact[1]) > 0
    for i, (got, want, reference) in enumerate(zip(mine[1], theirs[1], exact[1])):
        assert_flash_attention_rule(got, want, reference, what=f"gradient {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("make", [
    lambda model, metric: losses.Contrastive(model, score_metric=metric),
    lambda model, metric: losses.CachedContrastive(model, score_metric=metric, mini_batch_size=2),
], ids=["Contrastive", "CachedContrastive"])
def test_contrastive_losses_on_the_gpu_within_the_flash_attention_rule(colbert_cuda, make, dtype):
    rng = np.random.default_rng(6)
    features = _features(colbert_cuda, rng, batch=8, slots=2)
    _assert_rule(*_three_ways(colbert_cuda, make, dtype, features, None, ours.ColBERTScores(),
                              pylate_scores.ColBERTScores()))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_distillation_on_the_gpu_within_the_flash_attention_rule(colbert_cuda, dtype):
    rng = np.random.default_rng(7)
    batch, candidates = 4, 5
    queries, documents = features_on("cuda", [colbert_cuda.tokenize(_texts(rng, batch, 5), is_query=True),
                                      colbert_cuda.tokenize(_texts(rng, batch * candidates, 12), is_query=False)])
    teacher = torch.tensor(rng.standard_normal((batch, candidates)), dtype=torch.float32, device="cuda")
    make = lambda model, metric: losses.Distillation(model, score_metric=metric)  # noqa: E731
    _assert_rule(*_three_ways(colbert_cuda, make, dtype, [queries, documents], teacher, ours.colbert_kd_scores,
                              pylate_scores.colbert_kd_scores))


def test_patch_reaches_every_captured_scorer_and_unpatch_restores(colbert):
    import pylate.losses.contrastive
    import pylate.rank.rank
    import pylate.scores.colbert

    original = pylate.scores.colbert.colbert_scores
    replaced = ours.patch()
    try:
        assert pylate.scores.colbert.colbert_scores is ours.colbert_scores
        assert pylate.rank.rank.colbert_scores is ours.colbert_scores
        assert isinstance(losses.Contrastive(colbert).score_metric, ours.ColBERTScores)
        assert losses.Distillation(colbert).score_metric is ours.colbert_kd_scores
        assert any("Distillation" in name for name in replaced)
        rng = np.random.default_rng(5)
        features = _features(colbert, rng, batch=3, slots=2)
        patched = _loss_and_gradients(colbert, losses.Contrastive(colbert), features)
    finally:
        ours.unpatch()
    assert pylate.scores.colbert.colbert_scores is original
    assert not isinstance(losses.Contrastive(colbert).score_metric, ours.ColBERTScores)
    assert losses.Distillation(colbert).score_metric is pylate_scores.colbert_kd_scores
    unpatched = _loss_and_gradients(colbert, losses.Contrastive(colbert), features)
    _assert_close(patched[0], unpatched[0])


def test_exact_index_behind_pylate_retrieve(tmp_path):
    """pylate.retrieve.ColBERT over the end-to-end ExactIndex returns exhaustive fp16 MaxSim's
    top-k (ids in order), with subsets and after removes, and as it was after a save and a
    load (and changes then saved back into the same folder)."""
    import cupy_maxsim as cm
    from pylate import retrieve

    from cupy_maxsim.integrations.pylate_index import ExactIndex

    rng = np.random.default_rng(6)
    documents = [rng.standard_normal((int(n), 16)).astype(np.float32) for n in rng.integers(1, 20, 60)]
    names = [f"doc-{n}" for n in range(60)]
    queries = [rng.standard_normal((int(n), 16)).astype(np.float32) for n in (5, 8, 3)]
    index = ExactIndex(dim=16, dtype="float16").add_documents(names, documents, batch_size=25)
    retriever = retrieve.ColBERT(index=index)

    def exhaustive(keep, k):
        tokens, offsets = cm.pack([documents[n].astype(np.float16) for n in keep])
        out = []
        for q in queries:
            scores, rows = cm.search_packed(q.astype(np.float16), tokens, offsets, k)
            out.append([(names[keep[r]], float(s)) for s, r in zip(scores, rows) if r >= 0])
        return out

    def as_pairs(results):
        return [[(hit["id"], hit["score"]) for hit in row] for row in results]

    for got_rows, want_rows in zip(as_pairs(retriever.retrieve(queries, k=7)), exhaustive(list(range(60)), 7)):
        assert [g[0] for g in got_rows] == [w[0] for w in want_rows]
        np.testing.assert_allclose([g[1] for g in got_rows], [w[1] for w in want_rows], rtol=1e-6)
    subset = [names[n] for n in range(0, 60, 3)]
    got = as_pairs(retriever.retrieve(queries, k=4, subset=subset))
    assert [[g[0] for g in row] for row in got] == [[w[0] for w in row] for row in exhaustive(list(range(0, 60, 3)), 4)]
    per_query = retriever.retrieve(queries, k=3, subset=[names[:5], names[5:9], ["doc-1"]])
    assert all(hit["id"] in allowed for row, allowed in zip(per_query, [names[:5], names[5:9], ["doc-1"]]) for hit in row)
    assert len(per_query[2]) == 1
    index.remove_documents(names[:30])
    got = as_pairs(retriever.retrieve(queries, k=5))
    assert [[g[0] for g in row] for row in got] == [[w[0] for w in row] for row in exhaustive(list(range(30, 60)), 5)]
    (embedding,), = index.get_documents_embeddings([["doc-40"]])
    np.testing.assert_array_equal(embedding, documents[40].astype(np.float16))
    pairs = index.get_documents_embeddings([["doc-59", "doc-31"], [], ["doc-45"]])
    for group, want in zip(pairs, [[59, 31], [], [45]]):
        assert len(group) == len(want)
        for got, n in zip(group, want):
            np.testing.assert_array_equal(got, documents[n].astype(np.float16))
    with pytest.raises(ValueError, match="must be in the index"):
        index.get_documents_embeddings([["doc-3"]])  # removed
    with pytest.raises(ValueError, match="must be in the index"):  # nothing removed: doc-3 is gone already
        index.remove_documents(["doc-50", "doc-3"])
    assert "doc-50" in [hit["id"] for hit in retriever.retrieve(queries, k=30)[0]]
    # Saved and loaded (memory-mapped), grown, shrunk and saved back into its folder.
    folder = index.save(tmp_path / "exact")
    loaded = ExactIndex.load(folder)
    assert as_pairs(retrieve.ColBERT(index=loaded).retrieve(queries, k=6)) == as_pairs(retriever.retrieve(queries, k=6))
    for changed in (index, loaded):
        changed.remove_documents(["doc-31", "doc-57"]).add_documents(["new-a", "new-b"], documents[:2])
    loaded.save(folder)
    again = ExactIndex.load(folder)
    assert as_pairs(retrieve.ColBERT(index=again).retrieve(queries, k=8)) == as_pairs(retriever.retrieve(queries, k=8))
    (embedding,), = again.get_documents_embeddings([["new-b"]])
    np.testing.assert_array_equal(embedding, documents[1].astype(np.float16))
    with pytest.raises(ValueError, match="string or integer"):
        ExactIndex(dim=16).add_documents([("a", 1)], documents[:1]).save(tmp_path / "tuple-ids")
    with pytest.raises(ValueError, match="new and unique"):
        index.add_documents(["doc-40"], [documents[0]])
    # A batch that fails (a document of another width in the second) adds none of them: the
    # names and the store stay together, and the same names go in once the documents are right.
    before = as_pairs(retriever.retrieve(queries, k=8))
    with pytest.raises(ValueError, match="width 16"):
        index.add_documents(["x-1", "x-2", "x-3"], documents[:2] + [np.zeros((2, 17), np.float32)], batch_size=2)
    assert as_pairs(retriever.retrieve(queries, k=8)) == before
    index.add_documents(["x-1", "x-2", "x-3"], documents[:3], batch_size=2)
    (embedding,), = index.get_documents_embeddings([["x-3"]])
    np.testing.assert_array_equal(embedding, documents[2].astype(np.float16))


def test_packed_rerank_matches_pylates_rerank():
    """Ragged candidates per query (lists of arrays of any lengths): the same order and scores
    as pylate.rank.rerank where every similarity is positive (its zero padding then never wins)."""
    from pylate import rank

    rng = np.random.default_rng(7)
    queries = _embeddings(rng, (3, 8, 16))
    candidates = [[_embeddings(rng, (int(n), 16)) for n in rng.integers(1, 20, count)] for count in (5, 1, 9)]
    ids = [[f"d{i}-{j}" for j in range(len(c))] for i, c in enumerate(candidates)]
    got = ours.rerank(ids, queries, candidates)
    want = rank.rerank(documents_ids=ids, queries_embeddings=queries, documents_embeddings=candidates)
    for g, w in zip(got, want):
        assert [r["id"] for r in g] == [r["id"] for r in w]
        np.testing.assert_allclose([r["score"] for r in g], [r["score"] for r in w], rtol=1e-5, atol=1e-5)
    numpy_inputs = ours.rerank(ids, queries.numpy(), [[x.numpy() for x in c] for c in candidates])
    assert [[r["id"] for r in g] for g in numpy_inputs] == [[r["id"] for r in g] for g in got]
    assert ours.rerank([[]], queries[:1], [[]]) == [[]]
    as_list = ours.rerank(ids, list(queries), candidates)  # queries as a list, one query alone
    assert [[r["id"] for r in g] for g in as_list] == [[r["id"] for r in g] for g in got]
    assert [r["id"] for r in ours.rerank(ids[:1], queries[0], candidates[:1])[0]] == [r["id"] for r in got[0]]
