"""Host-resident indexes streamed through a device (cupy_maxsim.streaming), on the CPU: the
same results as the in-memory index for every budget (down to a buffer of one document),
format, filter, removal, winners and rescoring, and the segment plan and report. On a machine
without a GPU the stream runs through NumPy buffers (streaming.HostCopies): every step but the
transfer; the GPU test runs the transfers."""

from __future__ import annotations

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import streaming
from support import unit_rows

DIM = 16


def _pair(dtype, budget, rng, count=300, **kwargs):
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 40, count)]
    memory = cm.Index(DIM, dtype=dtype, **kwargs)
    streamed = cm.Index(DIM, dtype=dtype, device="host", gpu_budget_bytes=budget, **kwargs)
    for index in (memory, streamed):
        index.add(docs)
        index.remove([3, 50, 51, 299])
    return memory, streamed


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("budget", [2 * 40 * (DIM * 4 + 4), 20_000, 2**30])  # one 40-token document a buffer
def test_streamed_search_equals_the_in_memory_index(dtype, budget):
    rng = np.random.default_rng(len(dtype) + budget % 97)
    memory, streamed = _pair(dtype, budget, rng)
    q = unit_rows(rng, (5, 7, DIM), np.float32)
    for k in (1, 10, 400):
        _same(memory.search(q, k), streamed.search(q, k))
    _same(memory.search(q[0], 5, return_argmax=True), streamed.search(q[0], 5, return_argmax=True))
    _same(memory.search(q, 8, filter=list(range(0, 300, 3))), streamed.search(q, 8, filter=list(range(0, 300, 3))))
    report = streamed.last_search
    assert report.segments >= (2 if budget < 30_000 else 1)
    assert report.buffer_bytes <= budget
    assert streamed.device == "host" and "device=host" in repr(streamed)


def test_rescoring_streamed_index():
    rng = np.random.default_rng(3)
    memory, streamed = _pair("int8", 8_000, rng, rescore="float16")
    q = unit_rows(rng, (3, 6, DIM), np.float32)
    _same(memory.search(q, 7), streamed.search(q, 7))


def test_empty_and_saved_streamed_index(tmp_path):
    index = cm.Index(DIM, device="host")
    scores, ids = index.search(np.zeros((4, DIM), np.float16), 3)
    assert ids.tolist() == [-1, -1, -1] and np.isneginf(scores).all()
    rng = np.random.default_rng(4)
    memory, streamed = _pair("float16", 10_000, rng)
    memory.save(tmp_path / "index")
    loaded = cm.Index.load(tmp_path / "index", device="host", gpu_budget_bytes=10_000)
    assert loaded.gpu_budget_bytes == 10_000
    q = unit_rows(rng, (2, 5, DIM), np.float32)
    _same(memory.search(q, 6), loaded.search(q, 6))
    assert loaded.last_search.segments > 1
    with pytest.raises(ValueError, match="gpu_budget_bytes"):
        cm.Index.load(tmp_path / "index", device="host", gpu_budget_bytes=0)


def test_a_document_past_the_budget_is_refused():
    index = cm.Index(DIM, dtype="float32", device="host", gpu_budget_bytes=1_000)
    index.add([np.ones((40, DIM), np.float32)])
    with pytest.raises(ValueError, match="gpu_budget_bytes"):
        index.search(np.ones((2, DIM), np.float32), 1)
    with pytest.raises(ValueError, match="gpu_budget_bytes must be a positive int"):
        cm.Index(DIM, device="host", gpu_budget_bytes=0)


def test_segment_ranges():
    offsets = np.array([0, 5, 5, 9, 20, 21, 30])
    ranges = streaming.segment_ranges(offsets, 11, 10)
    assert ranges == [(0, 3), (3, 4), (4, 6)]  # 9 tokens, 11, then 10
    assert streaming.segment_ranges(offsets, 100, 2) == [(0, 2), (2, 4), (4, 6)]
    assert streaming.segment_ranges(np.array([0]), 10, 10) == []
    with pytest.raises(ValueError, match="gpu_budget_bytes"):
        streaming.segment_ranges(offsets, 10, 10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_streamed_through_the_gpu_equals_the_gpu_index(dtype):
    """The transfers themselves (pinned host memory, a copy stream, events): a host-resident
    index searched with CuPy queries and with host queries gives the GPU index's results."""
    import cupy

    rng = np.random.default_rng(9)
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(1, 60, 3000)]
    on_gpu = cm.Index(DIM, dtype=dtype, device="cuda")
    streamed = cm.Index(DIM, dtype=dtype, device="host", gpu_budget_bytes=200_000)
    on_gpu.add([cupy.asarray(x) for x in docs])  # a GPU index takes documents on its GPU
    streamed.add(docs)
    for index in (on_gpu, streamed):
        index.remove(list(range(0, 3000, 11)))
    q = unit_rows(rng, (6, 8, DIM), np.float32).astype(np.float16)
    want = [x.get() for x in on_gpu.search(cupy.asarray(q), 20, return_argmax=True)]
    got = [x.get() for x in streamed.search(cupy.asarray(q), 20, return_argmax=True)]
    _same(want, got)
    assert streamed.last_search.segments > 5 and streamed.last_search.buffer_bytes <= 200_000
    host = streamed.search(q, 20)  # host queries: scored on the GPU, answered on the host
    assert isinstance(host[0], np.ndarray)
    _same(want[:2], host)


@pytest.mark.gpu
def test_memory_mapped_store_streams_through_the_gpu(tmp_path):
    """An index saved and loaded memory-mapped on the host (read-only pages: registered as
    such, or copied into pinned memory where the driver refuses) searches as the GPU index."""
    import cupy

    rng = np.random.default_rng(10)
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(1, 60, 1500)]
    on_gpu = cm.Index(DIM, dtype="int8", device="cuda")
    on_gpu.add([cupy.asarray(x) for x in docs])
    saved = cm.Index(DIM, dtype="int8")
    saved.add(docs)
    saved.save(tmp_path / "index")
    loaded = cm.Index.load(tmp_path / "index", device="host", mmap=True, gpu_budget_bytes=100_000)
    assert not loaded._tokens.flags.writeable  # memory-mapped read-only
    q = cupy.asarray(unit_rows(rng, (4, 8, DIM), np.float32).astype(np.float16))
    _same([x.get() for x in on_gpu.search(q, 15)], [x.get() for x in loaded.search(q, 15)])
    assert loaded.last_search.segments > 3


@pytest.mark.gpu
def test_pinned_memory_is_unregistered_before_it_can_be_freed():
    """CudaCopies.pinned registers a host store in place; the registration ends when the array
    it returned goes, while the memory still exists. (Left registered, freed memory stayed
    pinned in the driver's view, and later copies from allocations at those addresses read
    stale pages: test_gpu failed after the streaming tests on the H200, 2026-12-02.)"""
    import gc

    import cupy

    from cupy_maxsim import streaming

    owner = bytearray(1 << 22)  # the memory, alive for the whole test
    array = np.frombuffer(owner, np.float32)
    pointer, size = array.ctypes.data, array.nbytes
    copies = streaming.CudaCopies(cupy.cuda.runtime.getDevice())
    pinned = copies.pinned(array)
    assert pinned.ctypes.data == pointer  # in place, not a copy
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.cuda.runtime.hostRegister(pointer, size, 0)  # registered already
    del pinned, array, copies
    gc.collect()
    cupy.cuda.runtime.hostRegister(pointer, size, 0)  # free to register again: it was unregistered
    cupy.cuda.runtime.hostUnregister(pointer)


@pytest.mark.gpu
def test_a_store_the_host_cannot_pin_streams_unpinned(monkeypatch):
    """Where registration and a pinned copy are both refused (a memory-mapped store larger than
    the host's memory), the store streams from pageable memory: the same results."""
    import cupy

    rng = np.random.default_rng(11)
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(1, 60, 800)]
    on_gpu = cm.Index(DIM, dtype="float16", device="cuda")
    on_gpu.add([cupy.asarray(x) for x in docs])
    streamed = cm.Index(DIM, dtype="float16", device="host", gpu_budget_bytes=60_000)
    streamed.add(docs)

    def refused(*args, **kwargs):
        raise cupy.cuda.runtime.CUDARuntimeError(2)  # cudaErrorMemoryAllocation

    monkeypatch.setattr(cupy.cuda.runtime, "hostRegister", refused)
    monkeypatch.setattr(cupy.cuda, "alloc_pinned_memory", refused)
    q = cupy.asarray(unit_rows(rng, (3, 8, DIM), np.float32).astype(np.float16))
    _same([x.get() for x in on_gpu.search(q, 12)], [x.get() for x in streamed.search(q, 12)])
    assert streamed._streamed_store[2] is streamed._tokens  # not copied: the store itself
    assert streamed.last_search.segments > 3


@pytest.mark.gpu
def test_neighbouring_views_are_both_pinned_in_place():
    """Two stores that are views of one array (shards adopting one corpus) share a page at
    their boundary: the second registers the whole pages inside it, and is still not copied."""
    import cupy

    from cupy_maxsim import streaming

    corpus = np.ones((3 * streaming.PAGE + 100,), np.float32)
    split = streaming.PAGE + 7  # (elements: a boundary inside a page)
    copies = streaming.CudaCopies(cupy.cuda.runtime.getDevice())
    first, second = copies.pinned(corpus[:split]), copies.pinned(corpus[split:])
    assert np.shares_memory(first, corpus) and np.shares_memory(second, corpus)
    device = cupy.empty(second.shape, second.dtype)
    device.set(second)
    assert float(device.sum()) == second.size
