"""Documents scored in parts (Tunables.document_parts_per_ring; _forward._launch_parts,
kernels_cu/maxsim_parts.cu): one query at fat dims over few documents, each document's tiles
split among the rings as parts, a record a part merged into its score. The scores are the whole
documents' bit for bit (a max is exact in any grouping; the merge sums a document's tokens as
the forward's epilogue does) and the float64 reference's within the naive error."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _forward, reference, tuning
from support import count_calls, to_numpy, unit_rows

pytestmark = pytest.mark.gpu

PARTS_ON = dict(document_parts_per_ring=16)


def _both_ways(monkeypatch, call):
    """(call() in parts, call() whole, the launches in parts): the same call under the tunable
    on and off."""
    launches = count_calls(monkeypatch, _forward, "_launch_parts")
    with tuning.override(**PARTS_ON):
        in_parts = call()
    with tuning.override(document_parts_per_ring=0):
        whole = call()
    return in_parts, whole, len(launches)


def _assert_same(a, b):
    a, b = to_numpy(a), to_numpy(b)
    np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))  # (bit for bit, NaN's too)


@pytest.mark.parametrize("dtype,dim", [("float32", 300), ("float32", 1000), ("float32", 2560), ("float16", 320),
                                       ("float16", 2560), ("bfloat16", 1536), ("int8", 640)])
@pytest.mark.parametrize("packed", [False, True])
def test_parts_score_as_whole_documents(monkeypatch, dtype, dim, packed):
    """Padded documents (200 tokens: four tiles, the last short) and packed ones of 0 to 300
    tokens (some shorter than a part), with masked query tokens and non-finite elements."""
    import cupy
    import torch

    rng = np.random.default_rng(dim)
    num_docs, length = 40, 200
    q64 = unit_rows(rng, (1, 32, dim), np.float64)
    d64 = unit_rows(rng, (num_docs, length, dim), np.float64)
    if dtype != "int8":  # (quantize_int8 takes finite values only)
        d64[3, 150, 7] = np.nan  # a NaN in the last tile of document 3
        d64[5, 10, 1] = np.inf  # an infinity in the first tile of document 5
    q_mask = np.ones((1, 32), bool)
    q_mask[0, 5::7] = False
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int8": torch.float32}
    q = torch.from_numpy(q64).to("cuda", torch_dtype[dtype])
    d = torch.from_numpy(d64).to("cuda", torch_dtype[dtype])
    extra = {}
    if dtype == "int8":
        (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
        extra = dict(q_scale=q_scale, d_scale=d_scale)
    mask = torch.from_numpy(q_mask).cuda()
    if packed:
        lengths = rng.integers(0, 301, num_docs)
        lengths[:3] = (0, 1, 64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        d_long = torch.cat([d, d], dim=1)  # documents of up to 400 tokens, packed from their first tokens
        tokens = torch.cat([d_long[n, :lengths[n]] for n in range(num_docs)])
        if dtype == "int8":
            scales = torch.cat([d_scale, d_scale], dim=1)
            extra = dict(q_scale=q_scale, d_scale=torch.cat([scales[n, :lengths[n]] for n in range(num_docs)]))

        def call():
            return cm.score_packed(q, tokens, cupy.asarray(offsets), q_mask=mask, **extra)
    else:
        def call():
            return cm.score(q, d, q_mask=mask, **extra)
    in_parts, whole, launches = _both_ways(monkeypatch, call)
    assert launches == 1
    _assert_same(in_parts, whole)
    if dtype in ("float32", "float16") and not packed:
        expected = reference.maxsim_reference(q64, d64, q_mask=q_mask)[0]
        got = to_numpy(in_parts)[0]
        finite = np.isfinite(expected)
        assert np.isnan(got[3]) and np.isnan(got[5]) and np.isnan(expected[3]) and np.isnan(expected[5])
        np.testing.assert_allclose(got[finite], expected[finite], atol=1e-4 if dtype == "float32" else 2e-2)


def test_parts_not_taken_with_masks_or_winners(monkeypatch):
    """Documents with a mask, and calls that return the winners, are scored whole."""
    import torch

    rng = np.random.default_rng(2)
    q = torch.from_numpy(unit_rows(rng, (1, 32, 2560), np.float32)).cuda().half()
    d = torch.from_numpy(unit_rows(rng, (30, 130, 2560), np.float32)).cuda().half()
    d_mask = torch.ones(30, 130, dtype=torch.bool, device="cuda")
    d_mask[:, 100:] = False
    launches = count_calls(monkeypatch, _forward, "_launch_parts")
    with tuning.override(**PARTS_ON):
        masked = cm.score(q, d, d_mask=d_mask)
        scores, winners = cm.score(q, d, return_argmax=True)
        plain = cm.score(q, d)
    assert len(launches) == 1  # (the last call only)
    _assert_same(scores, plain)
    expected = reference.maxsim_reference(q.float().cpu().numpy(), d[:, :100].float().cpu().numpy())
    np.testing.assert_allclose(to_numpy(masked), expected, atol=2e-2)


def test_search_over_parts(monkeypatch):
    """search's top-k over scores merged from parts is the whole documents' search."""
    import torch

    rng = np.random.default_rng(3)
    q = torch.from_numpy(unit_rows(rng, (1, 32, 2560), np.float32)).cuda()
    d = torch.from_numpy(unit_rows(rng, (50, 100, 2560), np.float32)).cuda()
    (in_parts, whole, launches) = _both_ways(monkeypatch, lambda: cm.search(q, d, 10))
    assert launches == 1
    for a, b in zip(in_parts, whole):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_repeated_calls_replay_the_parts(monkeypatch):
    """A repeated call in parts replays its recording (_replay.Replay with the parts' offsets
    kept, the parts' forward and the merge as prepared launches): no general path, and each call's
    own documents' scores, bit for bit the whole documents'."""
    import torch

    rng = np.random.default_rng(4)
    q = torch.from_numpy(unit_rows(rng, (1, 32, 2560), np.float32)).cuda()
    first, second = (torch.from_numpy(unit_rows(rng, (24, 260, 2560), np.float32)).cuda() for _ in range(2))
    launches = count_calls(monkeypatch, _forward, "_launch_parts")
    with tuning.override(**PARTS_ON):
        recorded = cm.score(q, first)
        assert len(launches) == 1
        runs = count_calls(monkeypatch, _forward, "run")
        replayed = [cm.score(q, d) for d in (second, first)]
    assert len(launches) == 1 and not runs
    with tuning.override(document_parts_per_ring=0):
        whole = [cm.score(q, d) for d in (second, first)]
    for a, b in zip(replayed + [recorded], whole + whole[1:]):
        _assert_same(a, b)


def test_index_search_replays_the_parts(monkeypatch):
    """An Index's repeated search in parts (its packed store: the parts' offsets of its
    offsets, kept for the store's version) answers as the whole documents' search. (CuPy
    queries: an Index replays searches of its own store's type.)"""
    import cupy

    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 400, 30)
    docs = [unit_rows(rng, (n, 2048), np.float32) for n in lengths]
    queries = [cupy.asarray(unit_rows(rng, (1, 32, 2048), np.float32)) for _ in range(3)]
    index = cm.Index(2048, dtype="float32", device="cuda")
    index.add(docs)
    launches = count_calls(monkeypatch, _forward, "_launch_parts")
    with tuning.override(**PARTS_ON):
        in_parts = [index.search(q, 7) for q in queries]
    assert len(launches) == 1  # (the first search; the others replayed)
    with tuning.override(document_parts_per_ring=0):
        whole = [index.search(q, 7) for q in queries]
    for a, b in zip(in_parts, whole):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(to_numpy(x), to_numpy(y))
