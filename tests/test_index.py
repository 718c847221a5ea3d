"""cupy_maxsim.Index against search_packed over the same documents (issue 25, item 2): every way
of adding, given ids, removes then adds against a build from scratch, filters, compaction, save
then load (memory-mapped), int8 and float32 stores, validation. CPU here; the GPU case is
marked gpu."""

import json
import re

import numpy as np
import pytest

import cupy_maxsim as cm
from support import gpu_available, holey_mask, to_numpy, unit_rows

DIM = 16


def _documents(rng, count, longest=12):
    return [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, longest, count)]


def _expected(q, docs, ids, k, dtype="float32", **kwargs):
    """search_packed over ``docs`` (stored as ``dtype``), its rows mapped to ``ids``."""
    tokens, offsets = cm.pack([x.astype(dtype) for x in docs] if docs else [np.zeros((0, DIM), dtype)])
    scores, rows = cm.search_packed(q.astype(dtype), tokens, offsets if docs else offsets[:1], k, **kwargs)[:2]
    return scores, np.where(rows >= 0, np.asarray(ids, np.int64)[np.maximum(rows, 0)], -1)


def test_add_every_layout_and_search():
    rng = np.random.default_rng(0)
    docs = _documents(rng, 30)
    index = cm.Index(DIM, dtype="float32")
    assert list(index.add(docs[:10])) == list(range(10))  # a list of arrays
    padded = np.zeros((10, 12, DIM), np.float32)
    mask = np.zeros((10, 12), bool)
    for n, x in enumerate(docs[10:20]):
        padded[n, :len(x)], mask[n, :len(x)] = x, True
    index.add(padded, mask=mask)  # padded with a mask
    index.add(cm.pack(docs[20:]))  # tokens and offsets
    assert len(index) == 30 and list(index.ids) == list(range(30))
    q = unit_rows(rng, (3, 5, DIM), np.float32)
    for k in (1, 7, 30, 50):
        scores, ids = index.search(q, k, workspace_bytes=100)
        want_scores, want_ids = _expected(q, docs, range(30), k)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_array_equal(scores, want_scores)
    single = index.search(q[0], 4)
    assert single[0].shape == (4,) and single[1].shape == (4,)


def test_given_ids_removes_then_adds_match_a_fresh_build():
    rng = np.random.default_rng(1)
    docs = _documents(rng, 40)
    ids = rng.permutation(np.arange(1000, 1040) * 7)  # (not increasing: the ids' sorted view)
    index = cm.Index(DIM, dtype="float16")
    index.add(docs[:25], ids=ids[:25])
    index.remove(ids[[2, 5, 6, 20]])
    index.add(docs[25:], ids=ids[25:])
    index.remove([ids[30]])
    live = [n for n in range(40) if n not in (2, 5, 6, 20, 30)]
    fresh = cm.Index(DIM, dtype="float16")
    fresh.add([docs[n] for n in live], ids=ids[live])
    q = unit_rows(rng, (4, 6, DIM), np.float32).astype(np.float16)
    q_mask = holey_mask(rng, (4, 6), 0.8)
    for k in (1, 10, 35, 60):
        got = index.search(q, k, q_mask=q_mask, workspace_bytes=64)
        want = fresh.search(q, k, q_mask=q_mask)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)  # BLAS blocks by batch shape: last bits
        assert not np.isin(got[1], ids[[2, 5, 6, 20, 30]]).any()
    allow = ids[[0, 2, 7, 31, 39, 12]]  # (2 is removed)
    np.testing.assert_array_equal(index.search(q, 6, filter=allow)[1], fresh.search(q, 6, filter=allow)[1])
    assert sorted(index.ids) == sorted(ids[live]) and len(index) == 35


def test_filters_and_winners():
    rng = np.random.default_rng(2)
    docs = _documents(rng, 20)
    index = cm.Index(DIM, dtype="float32")
    index.add(docs, ids=np.arange(20) + 100)
    q = unit_rows(rng, (2, 5, DIM), np.float32)
    allow = [103, 107, 111, 999]  # an id not in the index allows nothing
    scores, ids = index.search(q, 6, filter=np.array(allow))
    want = _expected(q, [docs[3], docs[7], docs[11]], [103, 107, 111], 6)
    np.testing.assert_array_equal(ids, want[1])
    np.testing.assert_array_equal(scores, want[0])
    assert (ids[:, 3:] == -1).all() and (scores[:, 3:] == -np.inf).all()
    boolean = np.zeros(20, bool)
    boolean[[3, 7, 11]] = True
    np.testing.assert_array_equal(index.search(q, 6, filter=boolean)[1], ids)
    # A list of bools is a mask too (it once became ids 0 and 1), a list of ids ids.
    np.testing.assert_array_equal(index.search(q, 6, filter=boolean.tolist())[1], ids)
    np.testing.assert_array_equal(index.search(q, 6, filter=allow)[1], ids)
    sharded = cm.ShardedIndex(DIM, dtype="float32", devices=["cpu"], shards=3)
    sharded.add(docs, ids=np.arange(20) + 100)
    for kind in (boolean, boolean.tolist(), allow):
        np.testing.assert_array_equal(sharded.search(q, 6, filter=kind)[1], ids)
    _, hits, winners = index.search(q, 5, return_argmax=True)
    _, all_winners = cm.score_packed(q, *cm.pack(docs), return_argmax=True)
    rows = hits - 100
    np.testing.assert_array_equal(winners, np.take_along_axis(all_winners, rows[..., None], axis=1))


def test_compaction_keeps_ids_and_results():
    rng = np.random.default_rng(3)
    docs = _documents(rng, 30, longest=8)
    index = cm.Index(DIM, dtype="float32")
    index.add(docs)
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    index.remove(range(0, 24))  # most tokens removed: compacted
    assert index._ids.shape[0] == 6 and len(index) == 6
    want = _expected(q, docs[24:], range(24, 30), 10)
    np.testing.assert_array_equal(index.search(q, 10)[1], want[1])
    assert list(index.add(docs[:1])) == [30]  # ids are never reused


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_save_then_load(tmp_path, dtype):
    rng = np.random.default_rng(4)
    docs = _documents(rng, 25)
    index = cm.Index(DIM, dtype=dtype)
    index.add(docs, ids=np.arange(25) * 3)
    index.remove([6, 9])
    q = unit_rows(rng, (3, 5, DIM), np.float32)
    before = index.search(q, 8)
    index.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["documents"] == 23 and manifest["dtype"] == dtype and manifest["dim"] == DIM
    loaded = cm.Index.load(tmp_path / "idx")
    assert isinstance(loaded._tokens, np.memmap)  # memory-mapped, not read into Python
    after = loaded.search(q, 8)
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[0], before[0])
    assert sorted(loaded.ids) == sorted(index.ids)
    loaded.add(docs[:2])  # a loaded index grows (its memory maps are read-only: add copies)
    assert len(loaded) == 25 and {73, 74} <= set(loaded.ids.tolist())  # the next ids after the largest
    assert "documents=25" in repr(loaded) and loaded.nbytes > 0


def test_int8_index_matches_quantised_scoring():
    rng = np.random.default_rng(5)
    docs = _documents(rng, 20)
    index = cm.Index(DIM, dtype="int8")
    index.add(docs)
    q = unit_rows(rng, (2, 5, DIM), np.float32)
    tokens, offsets = cm.pack(docs)
    d8, ds = cm.quantize_int8(tokens)
    q8, qs = cm.quantize_int8(q)
    want = cm.search_packed(q8, d8, offsets, 7, q_scale=qs, d_scale=ds)
    got = index.search(q, 7)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(index.search(q8, 7, q_scale=qs)[1], want[1])


@pytest.mark.parametrize("one_call", [False, True])
@pytest.mark.parametrize("store", ["int8", "float16"])
def test_rescoring_ranks_as_the_exact_copy(store, one_call, tmp_path, monkeypatch):
    """An index rescoring from a float32 copy returns what float32 exhaustive search returns,
    when the shortlist holds it (here: the whole corpus), and keeps doing so through save/load,
    removes and filters."""
    monkeypatch.setattr("cupy_maxsim._rescore.in_one_call", lambda xp: one_call)  # (the GPU's way on the CPU)
    rng = np.random.default_rng(9)
    docs = _documents(rng, 30)
    index = cm.Index(DIM, dtype=store, rescore="float32")
    index.add(docs)
    index.remove([4])
    live = [n for n in range(30) if n != 4]
    q = unit_rows(rng, (3, 5, DIM), np.float32)
    want_scores, want_ids = _expected(q, [docs[n] for n in live], live, 10)
    for searched in (index, cm.Index.load(index.save(tmp_path / "r"))):
        scores, ids, winners = searched.search(q, 10, shortlist=40, return_argmax=True)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-6)
        assert winners.shape == (3, 10, 5) and winners.dtype == np.int16  # (as an index without rescoring)
    allowed = index.search(q, 5, shortlist=40, filter=[0, 1, 2])[1]
    assert set(allowed.ravel()) <= {0, 1, 2, -1}
    for allow in ([4, 999], []):  # none of them stored (4 removed): no shortlist holds a document
        scores, ids, winners = index.search(q, 5, filter=allow, return_argmax=True)
        assert (ids == -1).all() and (scores == -np.inf).all() and (winners == -1).all()
    with pytest.raises(ValueError, match="shortlist"):
        index.search(q, 10, shortlist=5)


def test_adding_in_batches_with_progress_is_adding_at_once():
    rng = np.random.default_rng(10)
    docs = _documents(rng, 23)
    padded = np.zeros((23, 12, DIM), np.float32)
    mask = np.zeros((23, 12), bool)
    for n, x in enumerate(docs):
        padded[n, :len(x)], mask[n, :len(x)] = x, True
    q = unit_rows(rng, (2, 5, DIM), np.float32)
    whole = cm.Index(DIM, dtype="int8")
    whole.add(docs)
    want = whole.search(q, 9)
    for layout in (dict(docs=docs), dict(docs=padded, mask=mask), dict(docs=cm.pack(docs))):
        index = cm.Index(DIM, dtype="int8")
        docs_in = layout.pop("docs")
        index.add(docs_in, batch_docs=4, progress=True, **layout)
        got = index.search(q, 9)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[0], want[0])
        assert len(index) == 23
    index = cm.Index(DIM, dtype="float32")
    with pytest.raises(ValueError, match="width"):  # the fifth batch is wrong: nothing is added
        index.add(docs[:16] + [np.zeros((2, DIM + 1), np.float32)], batch_docs=4)
    assert len(index) == 0 and index._tokens.shape[0] == 0


@pytest.mark.parametrize("dtype,rescore", [("float32", None), ("int8", "float32")])
def test_add_holds_the_documents_once_beside_the_source(dtype, rescore):
    """add() writes each converted batch into the new store: its peak memory is the store and a
    batch (not the converted documents twice); a second add copies the old store once. Counted
    by tracemalloc, which sees NumPy's allocations."""
    import tracemalloc

    rng = np.random.default_rng(12)
    lengths = rng.integers(1, 40, 10000)
    tokens = unit_rows(rng, (int(lengths.sum()), DIM), np.float32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    index = cm.Index(DIM, dtype=dtype, rescore=rescore)
    for _ in range(2):
        before = index.nbytes
        tracemalloc.start()
        index.add((tokens, offsets), batch_docs=64)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        grown = index.nbytes - before
        # The new store (old and new documents), plus batches' temporaries: under 1.25x of it
        # (joining converted parts took twice the new documents).
        assert peak < 1.25 * (before + grown) + 2**20, (peak, before, grown)
    assert len(index) == 2 * lengths.shape[0] and index._tokens.shape[0] == 2 * tokens.shape[0]

def test_offsets_are_checked_whole():
    """add() converts a (tokens, offsets) pair in batches, each a rebased slice: the offsets are
    checked whole first (leading or trailing tokens outside them, a decrease), nothing added."""
    rng = np.random.default_rng(16)
    tokens, offsets = cm.pack(_documents(rng, 30))
    for bad in (offsets + 1, offsets[:-1], np.concatenate([offsets[:3], offsets[2:]])[::-1]):
        for index in (cm.Index(DIM, dtype="float32"), cm.ShardedIndex(DIM, dtype="float32", devices=["cpu"], shards=2)):
            with pytest.raises(ValueError, match="offsets must start at 0"):
                index.add((tokens, bad), batch_docs=4) if isinstance(index, cm.Index) else index.add((tokens, bad))
            assert len(index) == 0


def test_torch_queries_answer_in_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    docs = _documents(rng, 10)
    index = cm.Index(DIM, dtype="float32")
    index.add([torch.from_numpy(x) for x in docs])
    q = unit_rows(rng, (2, 5, DIM), np.float32)
    scores, ids = index.search(torch.from_numpy(q), 3)
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
    np.testing.assert_array_equal(ids.numpy(), _expected(q, docs, range(10), 3)[1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype, rescore", [("float32", None), ("float16", None), ("int8", None), ("int8", "float32")])
def test_ties_go_to_the_lower_id_whatever_the_order_of_adds(dtype, rescore, device):
    """Documents added with ids out of order (and an id removed and added again, an update)
    rank as the same documents added in id order: ties to the lower id, never to the row (the
    selection's order), through duplicates deeper than k, empty documents (-inf), NaN scores,
    filters, winners, k past the corpus; sharded as one index, whatever the shard count."""
    rng = np.random.default_rng(21)
    docs = _documents(rng, 24, longest=6)
    docs[1] = unit_rows(rng, (3, DIM), np.float32)
    for twin in (3, 5, 8, 13, 17, 20, 22):  # 8 copies of one document (query 2's best), 3 of another
        docs[twin] = docs[1]
    docs[9] = docs[14] = docs[2]
    docs[10] = docs[11] = np.zeros((0, DIM), np.float32)
    docs[12] = docs[15] = np.full((2, DIM), np.nan, np.float32)
    ids = rng.permutation(100)[:24]
    order = rng.permutation(24)
    shuffled = cm.Index(DIM, dtype=dtype, rescore=rescore, device=device)
    shuffled.add([docs[n] for n in order[:20]], ids=ids[order[:20]])
    shuffled.remove([ids[order[0]]])  # (and added again below, before any compaction: an update)
    shuffled.add([docs[n] for n in order[20:]] + [docs[order[0]]], ids=np.append(ids[order[20:]], ids[order[0]]))
    sorted_ids = np.sort(ids)
    by_id = {int(i): docs[n] for n, i in enumerate(ids)}
    in_order = cm.Index(DIM, dtype=dtype, rescore=rescore, device=device)
    in_order.add([by_id[int(i)] for i in sorted_ids], ids=sorted_ids)
    sharded = [cm.ShardedIndex(DIM, dtype=dtype, rescore=rescore, devices=[device], shards=n) for n in (1, 3)]
    for index in sharded:
        index.add([docs[n] for n in order], ids=ids[order])
    q = unit_rows(rng, (3, 4, DIM), np.float32)
    q = q if device == "cpu" else __import__("cupy").asarray(q)
    q[1] = q[0]
    q[2] = docs[1][0] if device == "cpu" else __import__("cupy").asarray(docs[1][0])  # (ties deeper than k)
    allow = [int(i) for i in ids[::2]]
    for k in (1, 2, 3, 7, 9, 24, 30):
        for kwargs in ({}, {"filter": allow}, {"return_argmax": True}):
            want = [to_numpy(x) for x in in_order.search(q, k, **kwargs)]
            for index in [shuffled] + sharded:
                got = [to_numpy(x) for x in index.search(q, k, **kwargs)]
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b)
            tied = (want[0][:, 1:] == want[0][:, :-1]) | (np.isnan(want[0][:, 1:]) & np.isnan(want[0][:, :-1]))
            assert (k < 24 or tied.any()) and (want[1][:, 1:][tied & (want[1][:, 1:] >= 0)] > want[1][:, :-1][
                tied & (want[1][:, 1:] >= 0)]).all()  # (each run of ties by increasing id)
    single = [to_numpy(x) for x in shuffled.search(q[0], 2)]
    np.testing.assert_array_equal(single[1], to_numpy(in_order.search(q[0], 2)[1]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_removed_id_may_come_again(tmp_path, device):
    """An update: remove an id and add it again with a new document, no compaction between
    (the old row stays as a tombstone). Searches, filters, removes and saves see the new one,
    as an index built with the new document does; sharded alike (over Ray: tests/test_shards.py)."""
    rng = np.random.default_rng(23)
    docs = _documents(rng, 12)
    new = unit_rows(rng, (4, DIM), np.float32)
    updated = [cm.Index(DIM, dtype="float32", device=device),
               cm.ShardedIndex(DIM, dtype="float32", devices=[device], shards=2)]
    fresh = cm.Index(DIM, dtype="float32", device=device)
    fresh.add(docs[:5] + docs[6:] + [new], ids=list(range(5)) + list(range(6, 12)) + [5])
    q = unit_rows(rng, (3, 4, DIM), np.float32)
    q[0] = new  # (the new document is query 0's best)
    q = q if device == "cpu" else __import__("cupy").asarray(q)
    for index in updated:
        index.add(docs)
        index.remove([5, 5])  # (an id given twice is removed once)
        assert index.add([new], ids=[5]).tolist() == [5] and len(index) == 12
        with pytest.raises(ValueError, match="already in the index"):
            index.add([new], ids=[5])
        assert sorted(index.ids.tolist()) == list(range(12))
        for k, kwargs in ((3, {}), (12, {}), (2, {"filter": [5, 7]}), (4, {"return_argmax": True})):
            for a, b in zip(index.search(q, k, **kwargs), fresh.search(q, k, **kwargs)):
                np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
        assert to_numpy(index.search(q, 1)[1])[0, 0] == 5
    single = updated[0]
    assert single.remove([5]) == 1 and 5 not in single.ids.tolist()
    single.add([new], ids=[5])
    loaded = cm.Index.load(single.save(tmp_path / "updated"), device=device)
    for a, b in zip(loaded.search(q, 12), fresh.search(q, 12)):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_host_bfloat16_documents_and_queries_go_into_any_index():
    """NumPy (ml_dtypes) bfloat16 documents and queries: as their float32 values, in every
    stored format, sharded and rescored (host bfloat16 operands hold float32 values, which were
    widened again: read as bits, twice the dim)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(31)
    docs = [x.astype(ml_dtypes.bfloat16) for x in _documents(rng, 30, longest=9)]
    q = unit_rows(rng, (3, 5, DIM), np.float32).astype(ml_dtypes.bfloat16)
    for make in (lambda: cm.Index(DIM, dtype="float32"), lambda: cm.Index(DIM, dtype="int8"),
                 lambda: cm.Index(DIM, dtype="int8", rescore="float32"),
                 lambda: cm.ShardedIndex(DIM, dtype="float16", devices=["cpu"], shards=2)):
        widened, given = make(), make()
        widened.add([x.astype(np.float32) for x in docs])
        given.add(docs)
        for a, b in zip(given.search(q, 9), widened.search(q.astype(np.float32), 9)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("device", ["cpu", "host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_bfloat16_index_is_a_float32_index_of_bfloat16_values(tmp_path, device):
    """Index(dtype="bfloat16") stores the documents rounded to bfloat16 (as their bits) and
    casts queries to it: the answers of a float32 index of the same rounded values (bitwise on
    the CPU; on a GPU the same ids and winners, scores to float32's rounding), for float32 and
    bfloat16 queries of NumPy (ml_dtypes) and torch, saved and loaded, sharded and rescored."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(31)
    docs = _documents(rng, 40, longest=9)
    q = unit_rows(rng, (3, 5, DIM), np.float32)
    rounded = [x.astype(ml_dtypes.bfloat16).astype(np.float32) for x in docs]
    where = "cuda" if device == "cuda" else "cpu"
    exact = cm.Index(DIM, dtype="float32", device=where)
    exact.add(rounded)
    index = cm.Index(DIM, dtype="bfloat16", device=device)
    index.add(docs[:20])
    index.add([x.astype(ml_dtypes.bfloat16) for x in docs[20:]])  # host bfloat16 documents
    assert index.nbytes < exact.nbytes and "dtype=bfloat16" in repr(index)
    device_of = (lambda x: x) if device != "cuda" else __import__("cupy").asarray
    # (a GPU index takes its queries on its device: bfloat16 ones there come from torch, CuPy
    # having no bfloat16)
    queries = [device_of(q)] + ([q.astype(ml_dtypes.bfloat16)] if device != "cuda" else [])
    try:
        import torch

        queries += [torch.from_numpy(q).to(where), torch.from_numpy(q).to(where).bfloat16()]
    except ImportError:
        pass
    want = [to_numpy(x) for x in exact.search(device_of(q.astype(ml_dtypes.bfloat16).astype(np.float32)), 9,
                                              return_argmax=True)]
    loaded = cm.Index.load(index.save(tmp_path / "bf16"), device=device)
    sharded = cm.ShardedIndex(DIM, dtype="bfloat16", devices=[where], shards=3)
    sharded.add(docs)
    # (a host index searches through a GPU where there is one, against the CPU's exact answers)
    searched_on_a_gpu = device == "cuda" or (device == "host" and gpu_available())
    for searched in (index, loaded, sharded):
        for queries_of_a_kind in queries:
            scores, ids, winners = (to_numpy(x) for x in searched.search(queries_of_a_kind, 9, return_argmax=True))
            if searched_on_a_gpu:  # (the bfloat16 and float32 kernels sum their products in other orders)
                np.testing.assert_allclose(scores, want[0], rtol=1e-6, atol=1e-6)
            else:
                np.testing.assert_array_equal(scores, want[0])
            np.testing.assert_array_equal(ids, want[1])
            np.testing.assert_array_equal(winners.astype(want[2].dtype), want[2])
    rescored = cm.Index(DIM, dtype="bfloat16", device=device, rescore="float32")
    rescored.add(docs)
    np.testing.assert_array_equal(to_numpy(rescored.search(device_of(q), 5, shortlist=40)[1]),
                                  _float32_index(docs).search(q, 5)[1])  # (the float32 copy ranks)
    tokens, offsets = cm.pack([x.astype(ml_dtypes.bfloat16) for x in docs])
    with pytest.raises(ValueError, match="host bfloat16 tokens are widened"):
        cm.Index(DIM, dtype="bfloat16").add((tokens, offsets), copy=False)


def _float32_index(docs):
    index = cm.Index(DIM, dtype="float32")
    index.add(docs)
    return index


def test_a_compaction_without_memory_leaves_a_remove_done():
    """remove() compacts once removed tokens outnumber live ones; where that copy finds no
    memory, the documents are removed all the same (a warning, tombstones until compact()),
    and a compaction that fails midway changes nothing."""
    rng = np.random.default_rng(24)
    docs = _documents(rng, 20)
    index, fresh = cm.Index(DIM, dtype="int8", rescore="float32"), cm.Index(DIM, dtype="int8", rescore="float32")
    index.add(docs)
    fresh.add(docs[15:], ids=range(15, 20))
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    exact, tokens = index._exact, index._tokens
    index._exact = exact.view(_Starved)  # (its gather, the last of the compaction's, runs out of memory)
    with pytest.warns(RuntimeWarning, match="no memory to compact"):
        assert index.remove(range(15)) == 15
    assert len(index) == 5 and index._ids.shape[0] == 20 and index._tokens is tokens  # (tombstones)
    index._exact = exact
    for a, b in zip(index.search(q, 7), fresh.search(q, 7)):
        np.testing.assert_array_equal(a, b)
    index.compact()
    assert index._ids.shape[0] == 5
    for a, b in zip(index.search(q, 7), fresh.search(q, 7)):
        np.testing.assert_array_equal(a, b)


class _Starved(np.ndarray):
    """An array whose gathers (an index array) run out of memory."""

    def __getitem__(self, key):
        if isinstance(key, np.ndarray):
            raise MemoryError("test: no memory")
        return super().__getitem__(key)


def test_validation():
    rng = np.random.default_rng(7)
    docs = _documents(rng, 5)
    with pytest.raises(ValueError, match="dim"):
        cm.Index(0)
    with pytest.raises(ValueError, match="dtype"):
        cm.Index(DIM, dtype="bfloat16x")
    with pytest.raises(ValueError, match="device"):
        cm.Index(DIM, device="tpu")
    index = cm.Index(DIM, dtype="float32")
    with pytest.raises(ValueError, match="width"):
        index.add([np.zeros((3, DIM + 1), np.float32)])
    with pytest.raises(ValueError, match=r"docs\[6\] must have the embedding dim of docs\[4\]"):  # (batch 2's)
        index.add(docs + docs[:1] + [np.zeros((3, DIM + 1), np.float32)], batch_docs=4)
    index.add(docs, ids=[1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="already"):
        index.add(docs[:1], ids=[3])
    with pytest.raises(ValueError, match="unique"):
        index.add(docs[:2], ids=[8, 8])
    with pytest.raises(ValueError, match="one id per document"):
        index.add(docs[:2], ids=[9])
    with pytest.raises(ValueError, match="not in the index"):
        index.remove([42])
    with pytest.raises(ValueError, match="filter"):
        index.search(unit_rows(rng, (1, 3, DIM), np.float32), 2, filter=np.ones(3, bool))
    with pytest.raises(ValueError, match="k must"):
        index.search(unit_rows(rng, (1, 3, DIM), np.float32), 0)
    with pytest.raises(TypeError, match="ids"):
        index.remove(np.array([1.5]))
    assert len(index) == 5  # nothing half-done by a refused call


def test_load_refuses_what_is_not_an_index(tmp_path):
    with pytest.raises(FileNotFoundError, match="manifest"):
        cm.Index.load(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="manifest"):
        cm.Index.load(tmp_path)


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_index_on_gpu(framework, tmp_path):
    from support import replay_device

    device = replay_device(framework)
    rng = np.random.default_rng(8)
    docs = _documents(rng, 200, longest=40)
    index = cm.Index(DIM, dtype="float16", device="cuda")
    index.add([device(x.astype(np.float16)) for x in docs])
    index.remove([3, 4])
    q = unit_rows(rng, (3, 5, DIM), np.float32).astype(np.float16)
    live = [n for n in range(200) if n not in (3, 4)]
    want = _expected(q.astype(np.float32), [docs[n] for n in live], live, 20, dtype="float16")
    got = index.search(device(q), 20)
    np.testing.assert_array_equal(to_numpy(got[1]), want[1])
    index.save(tmp_path / "gpu")
    again = cm.Index.load(tmp_path / "gpu", device="cuda").search(device(q), 20)
    np.testing.assert_array_equal(to_numpy(again[1]), want[1])


@pytest.mark.parametrize("device", ["cpu", "host"])
def test_add_without_a_copy(device):
    """copy=None: an empty float store keeps a (tokens, offsets) pair's tokens as they are (the
    same results as a copy); where it cannot, it copies (None) or says why (False)."""
    rng = np.random.default_rng(14)
    docs = _documents(rng, 50)
    tokens, offsets = cm.pack([x.astype(np.float16) for x in docs])
    kept = cm.Index(DIM, dtype="float16", device=device)
    kept.add((tokens, offsets), copy=None)
    assert np.shares_memory(kept._tokens, tokens)
    copied = cm.Index(DIM, dtype="float16", device=device)
    copied.add((tokens, offsets))
    assert not np.shares_memory(copied._tokens, tokens)
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    for a, b in zip(kept.search(q, 7), copied.search(q, 7)):
        np.testing.assert_array_equal(a, b)
    kept.add((tokens, offsets), copy=None)  # not empty any more: copied
    assert len(kept) == 100 and not np.shares_memory(kept._tokens, tokens)
    refusals = {"holds documents already": (kept, (tokens, offsets)),
                "only a (tokens, offsets) pair": (cm.Index(DIM, dtype="float16", device=device), docs),
                "int8 index": (cm.Index(DIM, dtype="int8", device=device), (tokens, offsets)),
                "tokens are float16, the index stores float32": (cm.Index(DIM, dtype="float32"), (tokens, offsets)),
                "C-contiguous": (cm.Index(DIM, dtype="float16"), (np.asfortranarray(tokens), offsets))}
    for reason, (index, given) in refusals.items():
        before = len(index)
        with pytest.raises(ValueError, match=f"copy=False.*{re.escape(reason)}"):
            index.add(given, copy=False)
        assert len(index) == before
    with pytest.raises(ValueError, match="copy must be"):
        cm.Index(DIM).add((tokens, offsets), copy="no")


@pytest.mark.gpu
def test_gpu_add_without_a_copy():
    """copy=None on a GPU store: CuPy tokens in its format on its GPU are kept as they are."""
    import cupy

    rng = np.random.default_rng(15)
    tokens, offsets = cm.pack([cupy.asarray(x.astype(np.float16)) for x in _documents(rng, 80)])
    kept, copied = (cm.Index(DIM, dtype="float16", device="cuda") for _ in range(2))
    kept.add((tokens, offsets), copy=None)
    copied.add((tokens, offsets))
    assert kept._tokens.data.ptr == tokens.data.ptr and copied._tokens.data.ptr != tokens.data.ptr
    q = cupy.asarray(unit_rows(rng, (3, 4, DIM), np.float32).astype(np.float16))
    for a, b in zip(kept.search(q, 9), copied.search(q, 9)):
        np.testing.assert_array_equal(a.get(), b.get())
    with pytest.raises(ValueError, match="the tokens are on GPU 0, the index on host"):
        cm.Index(DIM, dtype="float16", device="host").add((tokens, offsets), copy=False)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rescore", [("float16", None), ("int8", "float32")])
def test_documents_from_another_device_are_moved_batch_by_batch(dtype, rescore):
    """A GPU index takes host documents (each batch uploaded, then converted on the GPU) and a
    host store takes GPU documents (converted on their GPU, then copied back): the stores are
    those of documents given on the index's own device, bitwise."""
    import cupy

    rng = np.random.default_rng(13)
    docs = _documents(rng, 300, longest=30)
    padded = np.zeros((300, 30, DIM), np.float32)
    mask = np.zeros((300, 30), bool)
    for n, x in enumerate(docs):
        padded[n, :len(x)], mask[n, :len(x)] = x, True
    on_gpu = cm.Index(DIM, dtype=dtype, device="cuda", rescore=rescore)
    on_gpu.add([cupy.asarray(x) for x in docs])
    on_host = cm.Index(DIM, dtype=dtype, rescore=rescore)
    on_host.add(docs)
    layouts = {"host list": (docs, None), "host padded": (padded, mask), "host packed": (cm.pack(docs), None)}
    for name, (given, given_mask) in layouts.items():
        index = cm.Index(DIM, dtype=dtype, device="cuda", rescore=rescore)
        index.add(given, mask=given_mask, batch_docs=64)
        for mine, want in ((index._tokens, on_gpu._tokens), (index._scales, on_gpu._scales),
                           (index._offsets, on_gpu._offsets), (index._exact, on_gpu._exact)):
            if want is not None:
                np.testing.assert_array_equal(to_numpy(mine), to_numpy(want), err_msg=name)
    for device in ("cpu", "host"):
        index = cm.Index(DIM, dtype=dtype, device=device, rescore=rescore)
        index.add(cm.pack([cupy.asarray(x) for x in docs]), batch_docs=64)
        assert isinstance(index._tokens, np.ndarray)
        # int8 scales from the GPU's quantisation may differ from NumPy's in the last bit: the
        # GPU index's (converted the same way) are the reference
        reference = on_gpu if dtype == "int8" else on_host
        for mine, want in ((index._tokens, reference._tokens), (index._scales, reference._scales),
                           (index._exact, on_host._exact)):
            if want is not None:
                np.testing.assert_array_equal(to_numpy(mine), to_numpy(want), err_msg=device)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_gpu_index_search_replays_its_forward(dtype):
    """A GPU Index's forward is recorded on a search and replayed on the next of the same
    signature (new query arrays, winners or not), per version of its store: the answers are the
    general path's (search_packed over the store), before and after documents are added."""
    import cupy

    rng, dim = np.random.default_rng(17), 64  # (a dim the tensor-core builds take, whose launches are recorded)

    def documents(count):
        return [cupy.asarray(unit_rows(rng, (int(n), dim), np.float32)) for n in rng.integers(0, 40, count)]

    index = cm.Index(dim, dtype=dtype, device="cuda")
    index.add(documents(300))
    for round_ in range(3):
        if round_ == 2:
            index.add(documents(50))  # a new store version
        for argmax in (False, True):
            q = cupy.asarray(unit_rows(rng, (4, 6, dim), np.float32).astype(np.float16))
            got = index.search(q, 12, return_argmax=argmax)
            extra = {} if dtype != "int8" else dict(zip(("q_scale",), cm.quantize_int8(q)[1:])) | {"d_scale": index._scales}
            query = q if dtype != "int8" else cm.quantize_int8(q)[0]
            want = cm.search_packed(query, index._tokens, index._offsets, 12, return_argmax=argmax, **extra)
            np.testing.assert_array_equal(got[0].get(), want[0].get())
            np.testing.assert_array_equal(got[1].get(), want[1].get())  # (ids are positions: nothing removed)
            if argmax:
                np.testing.assert_array_equal(got[2].get(), want[2].get())
        assert len(index._replays.forwards) == 2 and index._replays._version[0] is index._tokens


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
@pytest.mark.parametrize("corpus", [300, 20000])  # (one selection round; the wide selection)
def test_gpu_index_search_replays_the_whole_search(dtype, corpus, monkeypatch):
    """A repeated GPU Index search (CuPy queries, no filter) is replayed whole: an int8 index's
    query quantisation, the forward, the selection and the finish, from tapes recorded by the
    first call of each signature (one query or several, masked or not, k small or large); the
    answers are the general path's (the same search with a filter of every live id, which is
    never replayed), with new query arrays each time and across store versions (documents
    removed, then added)."""
    import cupy

    import importlib

    search_module = importlib.import_module("cupy_maxsim.search")  # (cupy_maxsim.search is the function)

    rng, dim = np.random.default_rng(23), 64
    general_calls = []
    general = search_module._top_k
    monkeypatch.setattr(search_module, "_top_k", lambda *a, **kw: general_calls.append(1) or general(*a, **kw))

    def documents(count):
        lengths = rng.integers(1, 24, count)
        tokens = unit_rows(rng, (int(lengths.sum()), dim), np.float32)
        return cupy.asarray(tokens), cupy.asarray(np.concatenate([[0], np.cumsum(lengths)]))

    index = cm.Index(dim, dtype=dtype, device="cuda")
    index.add(documents(corpus))
    shapes = [((6, dim), None), ((4, 6, dim), (4, 6))]
    for version in range(3):
        if version == 1:
            index.remove(rng.choice(index.ids, corpus // 7, replace=False))
        if version == 2:
            index.add(documents(40))
        for k in (12, 900):
            for shape, mask_shape in shapes:
                for repeat in range(3):
                    q = cupy.asarray(unit_rows(rng, shape, np.float32).astype(np.float16))
                    q_mask = None if mask_shape is None else cupy.asarray(rng.random(mask_shape) < 0.8)
                    before = len(general_calls)
                    got = index.search(q, k, q_mask=q_mask)
                    replayed = repeat > 0 and k < corpus  # (k past the stored documents: no selection to record)
                    assert len(general_calls) - before == (0 if replayed else 1), (version, k, shape, repeat)
                    want = index.search(q, k, q_mask=q_mask, filter=index.ids)
                    np.testing.assert_array_equal(got[0].get(), want[0].get())
                    np.testing.assert_array_equal(got[1].get(), want[1].get())
                    assert type(got[0]) is cupy.ndarray and got[0].shape == got[1].shape == shape[:-2] + (k,)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_an_empty_index_answers_nothing_found(dtype):
    """A valid corner: no documents yet (or all removed), id -1 and -inf for every place."""
    index = cm.Index(DIM, dtype=dtype)
    q = np.ones((2, 3, DIM), np.float32)
    scores, ids = index.search(q, 4)
    assert ids.shape == (2, 4) and (ids == -1).all() and np.isneginf(scores).all()
    index.add([np.ones((2, DIM), np.float32)])
    index.remove([0])
    scores, ids = index.search(q[0], 2)
    assert ids.tolist() == [-1, -1] and np.isneginf(scores).all()


@pytest.mark.gpu
@pytest.mark.parametrize("framework", ["cupy", "torch"])
def test_rescoring_on_the_gpu_ranks_as_the_exact_index(framework):
    """An int8 GPU index rescoring from its float32 host copy (the shortlists' union scored on
    the GPU in one call) returns what a float32 GPU index returns when the shortlist holds it,
    winners too."""
    from support import replay_device

    device = replay_device(framework)
    rng = np.random.default_rng(12)
    docs = _documents(rng, 300, longest=40)
    docs[7] = docs[5]  # a tie: the document added first
    exact = cm.Index(DIM, dtype="float32", device="cuda")
    rescored = cm.Index(DIM, dtype="int8", device="cuda", rescore="float32")
    for index in (exact, rescored):
        index.add([device(x) for x in docs])
        index.remove([3, 250])
    q = unit_rows(rng, (4, 6, DIM), np.float32)
    q_mask = holey_mask(rng, (4, 6), 0.8)
    for queries, mask, k in ((q, q_mask, 10), (q[1], None, 3), (q, None, 64)):
        want = [to_numpy(x) for x in exact.search(device(queries), k, q_mask=None if mask is None else device(mask),
                                                  return_argmax=True)]
        got = rescored.search(device(queries), k, q_mask=None if mask is None else device(mask), return_argmax=True,
                              shortlist=300)
        assert type(got[0]) is type(device(queries))
        got = [to_numpy(x) for x in got]
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        np.testing.assert_array_equal(got[2], want[2])
    few = rescored.search(device(q), 10, shortlist=12, filter=[5, 7, 9])  # shortlists shorter than k
    assert (to_numpy(few[1])[:, 3:] == -1).all() and set(to_numpy(few[1])[:, :3].ravel()) == {5, 7, 9}
    none = rescored.search(device(q), 10, filter=[3, 999], return_argmax=True)  # no document allowed
    assert (to_numpy(none[1]) == -1).all() and (to_numpy(none[0]) == -np.inf).all() and (to_numpy(none[2]) == -1).all()
