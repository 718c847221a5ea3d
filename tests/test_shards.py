"""ShardedIndex (shards in one process) and cupy_maxsim.ray.RayIndex (shards on Ray actors)
against one Index of every document (issue 28, items 2 and 3): the same top-k, scores, winners,
filters and removes; Ray's failures reported. CPU here: several shards on the CPU, a local Ray
cluster of CPU actors on the NumPy backend."""

import numpy as np
import pytest

import cupy_maxsim as cm
from support import holey_mask, to_numpy, unit_rows

DIM = 16


def _corpus(rng, count=41):
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 14, count)]
    for twin in (9, 30):  # ties across shards: the lower id first
        if twin < count:
            docs[twin] = docs[2]
    return docs


def _same(got, want):
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _host_search(index):
    """``index.search`` taking and giving host arrays: a GPU Index takes its queries (and their
    masks) on its device, where a ShardedIndex takes them from anywhere."""
    if not index.device.startswith("cuda"):
        return index.search
    import cupy

    def search(q, k, **options):
        options = {name: cupy.asarray(x) if name == "q_mask" else x for name, x in options.items()}
        return [to_numpy(x) for x in index.search(cupy.asarray(q), k, **options)]

    return search


def _compare(sharded, single, rng):
    search = _host_search(single)
    q = unit_rows(rng, (3, 5, DIM), np.float32)
    q_mask = holey_mask(rng, (3, 5), 0.8)
    for k in (1, 7, 45, 80):
        _same(sharded.search(q, k, q_mask=q_mask), search(q, k, q_mask=q_mask))
    _same(sharded.search(q[0], 6), search(q[0], 6))
    _same(sharded.search(q, 5, return_argmax=True), search(q, 5, return_argmax=True))
    allow = [2, 9, 30, 31, 40, 999]
    _same(sharded.search(q, 8, filter=allow), search(q, 8, filter=np.array(allow)))
    boolean = np.isin(single.ids, allow)
    order = np.argsort(single.ids)  # a boolean filter is over each index's own ids order
    _same(sharded.search(q, 8, filter=np.isin(sharded.ids, allow)), search(q, 8, filter=boolean[order][
        np.argsort(order)]))


@pytest.mark.parametrize("layout", ["list", "padded", "packed"])
def test_sharded_index_is_one_index(layout):
    rng = np.random.default_rng(0)
    docs = _corpus(rng)
    single, sharded = cm.Index(DIM, dtype="float32"), cm.ShardedIndex(DIM, dtype="float32", devices=["cpu"], shards=3)
    if layout == "list":
        args = (docs,), {}
    elif layout == "padded":
        padded = np.zeros((len(docs), 14, DIM), np.float32)
        mask = np.zeros((len(docs), 14), bool)
        for n, x in enumerate(docs):
            padded[n, :len(x)], mask[n, :len(x)] = x, True
        args = (padded,), dict(mask=mask)
    else:
        args = (cm.pack(docs),), {}
    single.add(*args[0], **args[1])
    sharded.add(*args[0], **args[1])
    assert len(sharded) == len(single) == 41 and sorted(sharded.ids) == list(range(41))
    assert [len(s) for s in sharded.shards] == [14, 13, 14]
    _compare(sharded, single, rng)
    for index in (single, sharded):
        index.remove([2, 5, 33])
        index.add(docs[:4], progress=True, batch_docs=3)  # (batches of 3, a bar a shard where tqdm is)
    _compare(sharded, single, rng)
    assert "shards=3" in repr(sharded)
    with pytest.raises(ValueError, match="not in the index"):
        sharded.remove([2])
    with pytest.raises(ValueError, match="already in the index"):
        sharded.add(docs[:1], ids=[40])


def test_host_store_on_the_cpu_is_one_index():
    """store="host" with CPU devices: shards on the CPU keep their documents in host memory
    anyway (plain CPU indexes), with the same results."""
    rng = np.random.default_rng(3)
    docs = _corpus(rng)
    single = cm.Index(DIM, dtype="float32")
    sharded = cm.ShardedIndex(DIM, dtype="float32", devices=["cpu"], shards=2, store="host")
    single.add(docs)
    sharded.add(docs)
    assert [s.device for s in sharded.shards] == ["cpu", "cpu"] and sharded.places == ["cpu", "cpu"]
    _compare(sharded, single, rng)
    # copy=None: each empty shard keeps its run of one (tokens, offsets) pair as it is
    tokens, offsets = cm.pack(docs)
    held = cm.ShardedIndex(DIM, dtype="float32", devices=["cpu"], shards=2, store="host")
    held.add((tokens, offsets), copy=None)
    assert all(np.shares_memory(shard._tokens, tokens) for shard in held.shards)
    _compare(held, single, rng)
    with pytest.raises(ValueError, match=r"copy=False\) would have to copy shard 0"):  # none added
        held.add((tokens, offsets), copy=False)
    assert len(held) == len(docs)


@pytest.mark.parametrize("store", ["device", "host"])
def test_save_then_load(tmp_path, store):
    """A sharded index saved and loaded (memory-mapped, onto other devices and stores) answers
    as before, ids and removals kept; a folder that is not one is refused."""
    rng = np.random.default_rng(4)
    docs = _corpus(rng)
    single = cm.Index(DIM, dtype="float32")
    sharded = cm.ShardedIndex(DIM, dtype="float32", devices=["cpu"], shards=3)
    for index in (single, sharded):
        index.add(docs)
        index.remove([1, 20, 33])
    sharded.save(tmp_path / "sharded")
    loaded = cm.ShardedIndex.load(tmp_path / "sharded", devices=["cpu"], store=store)
    assert len(loaded.shards) == 3 and len(loaded) == 38 and sorted(loaded.ids) == sorted(sharded.ids)
    assert all(isinstance(shard._tokens, np.memmap) for shard in loaded.shards)
    _compare(loaded, single, rng)
    for index in (single, loaded):  # the next ids continue where they were
        np.testing.assert_array_equal(index.add(docs[:2]), [41, 42])
    _compare(loaded, single, rng)
    with pytest.raises(FileNotFoundError, match="sharded.json"):
        cm.ShardedIndex.load(tmp_path / "sharded" / "shard-0000")
    manifest = tmp_path / "sharded" / "sharded.json"
    manifest.write_text(manifest.read_text().replace('"documents": 38', '"documents": 39'))
    with pytest.raises(ValueError, match="38 documents"):
        cm.ShardedIndex.load(tmp_path / "sharded", devices=["cpu"])


@pytest.mark.parametrize("k", [1, 5, 12, 40])
def test_merge_top_k_is_a_sort_of_the_candidates(k):
    """merge_top_k (one 64-bit key a candidate for float32 scores; three stable sorts for
    float64 ones or ids past 2**32) against Python's sort of every candidate by (score
    descending, -0.0 as 0.0, -inf then NaN last, ties to the lower id), missing ids last."""
    from cupy_maxsim.shards import merge_top_k

    rng = np.random.default_rng(k)
    shards, rows, each = 3, 6, 8
    pool = np.array([2.5, 1.0, 0.0, -0.0, -1.0, np.inf, -np.inf, np.nan], np.float32)
    results = []
    ids = rng.permutation(1000)[:shards * rows * each].reshape(shards, rows, each)
    for n in range(shards):
        scores = pool[rng.integers(0, pool.size, (rows, each))]
        shard_ids = ids[n].copy()
        shard_ids[rng.random((rows, each)) < 0.2] = -1
        scores[shard_ids < 0] = -np.inf
        results.append((scores, shard_ids, rng.integers(0, 9, (rows, each, 2)).astype(np.int16)))

    def rank(score, id_):
        return (id_ < 0, np.isnan(score), -float(score) if not np.isnan(score) else 0.0, id_)

    for offset, dtype in ((0, np.float32), (0, np.float64), (2**33, np.float32)):
        given = [(r[0].astype(dtype), np.where(r[1] < 0, -1, r[1] + offset), r[2]) for r in results]
        got = merge_top_k(given, k)
        for row in range(rows):
            every = [(float(s), int(i), tuple(w)) for r in given for s, i, w in zip(r[0][row], r[1][row], r[2][row])]
            want = sorted(every, key=lambda c: rank(c[0], c[1]))[:k]
            real = [c for c in want if c[1] >= 0]  # (missing candidates: any of them, alike but winners)
            np.testing.assert_array_equal(got[1][row][:len(real)], [c[1] for c in real])
            np.testing.assert_array_equal(got[0][row][:len(real)], np.array([c[0] for c in real], dtype))
            np.testing.assert_array_equal(got[2][row][:len(real)], [c[2] for c in real])
            assert (got[1][row][len(real):] == -1).all()
    single = merge_top_k([(r[0][0], r[1][0]) for r in results], k)  # one query: (k,) arrays
    assert single[0].shape == (min(k, shards * each),)


@pytest.mark.gpu
def test_merge_top_k_on_the_gpu_is_the_host_merge():
    """merge_top_k with CuPy (a ShardedIndex's many-candidate merge for GPU queries) gives the
    host merge's results, ties, +-0, +-inf, NaN and missing ids included, on both paths."""
    import cupy

    from cupy_maxsim.shards import merge_top_k

    rng = np.random.default_rng(8)
    pool = np.array([2.5, 1.0, 0.0, -0.0, -1.0, np.inf, -np.inf, np.nan], np.float32)
    results = []
    ids = rng.permutation(100_000)[:4 * 64 * 50].reshape(4, 64, 50)
    for n in range(4):
        scores = np.where(rng.random((64, 50)) < 0.5, pool[rng.integers(0, pool.size, (64, 50))],
                          rng.standard_normal((64, 50)).astype(np.float32))
        shard_ids = np.where(rng.random((64, 50)) < 0.1, -1, ids[n])
        scores[shard_ids < 0] = -np.inf
        results.append((scores, shard_ids, rng.integers(0, 9, (64, 50, 3)).astype(np.int16)))
    for offset, dtype in ((0, np.float32), (2**33, np.float32), (0, np.float64)):
        given = [(r[0].astype(dtype), np.where(r[1] < 0, -1, r[1] + offset), r[2]) for r in results]
        host = merge_top_k(given, 70)
        device = merge_top_k(given, 70, cupy)
        real = host[1] >= 0
        for a, b in zip(host, device):
            b = b.get()
            np.testing.assert_array_equal(a[real] if a.ndim == 2 else a[real], b[real] if b.ndim == 2 else b[real])
        assert (device[1].get()[~real] == -1).all()


def test_search_threads_are_kept():
    """The threads that search several GPUs at once are started once, not every search."""
    sharded = cm.ShardedIndex(DIM, devices=["cpu"], shards=2)
    first = sharded._threads(2)
    assert sharded._threads(2) is first and sharded._threads(1) is first
    assert sharded._threads(3) is not first and sharded._threads(3)._max_workers == 3


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype, rescore", [("float32", None), ("int8", "float16")])
def test_a_failed_sharded_add_changes_no_shard(monkeypatch, dtype, rescore, device):
    """An add that fails in a later shard's run (a document of another width there; an
    interrupt) leaves every shard as it was: the same answers, and the next add's ids those it
    would have had (a partial add used to keep the first runs and reassign their ids)."""
    rng = np.random.default_rng(8)
    sharded = cm.ShardedIndex(DIM, dtype=dtype, rescore=rescore, devices=[device], shards=3)
    single = cm.Index(DIM, dtype=dtype, rescore=rescore, device=device)
    docs = _corpus(rng, 20)
    for index in (sharded, single):
        index.add(docs)
        index.remove([3])
    before = [shard.nbytes for shard in sharded.shards]
    bad = _corpus(rng, 9) + [np.zeros((2, DIM + 1), np.float32)]
    with pytest.raises(ValueError, match=r"docs\[9\] must have the embedding dim of docs\[7\] \(16\)"):
        sharded.add(bad)  # (named where they are in bad, not in the last shard's run)
    monkeypatch.setattr(sharded.shards[2], "_store", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        sharded.add(_corpus(rng, 9))
    monkeypatch.undo()
    assert [shard.nbytes for shard in sharded.shards] == before and len(sharded) == 19
    _compare(sharded, single, rng)
    more = _corpus(rng, 6)
    np.testing.assert_array_equal(sharded.add(more), single.add(more))
    _compare(sharded, single, rng)


def test_sharded_index_validation():
    with pytest.raises(ValueError, match="store must be"):
        cm.ShardedIndex(DIM, devices=["cpu"], store="disk")
    with pytest.raises(ValueError, match="gpu_budget_bytes"):
        cm.ShardedIndex(DIM, devices=["cpu"], gpu_budget_bytes=0)
    with pytest.raises(ValueError, match="shards must be"):
        cm.ShardedIndex(DIM, devices=["cpu"], shards=0)
    with pytest.raises(ValueError, match="devices must"):
        cm.ShardedIndex(DIM, devices=["tpu"])
    with pytest.raises(ValueError, match="at least one device"):
        cm.ShardedIndex(DIM, devices=[])


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_index_is_one_index(ray_cluster):
    import cupy_maxsim.ray as cmr

    rng = np.random.default_rng(1)
    docs = _corpus(rng)
    single, remote = cm.Index(DIM, dtype="float32"), cmr.RayIndex(DIM, dtype="float32", actors=2)
    single.add(docs)
    remote.add(docs)
    assert len(remote) == 41 and remote.nbytes > 0
    _compare(remote, single, rng)
    for index in (single, remote):
        index.remove([2, 5])
    _compare(remote, single, rng)
    with pytest.raises(ValueError, match="width"):  # a shard's own error comes back as itself
        remote.add([np.zeros((3, DIM + 1), np.float32)] * 2)
    # a failure in the last actor's run undoes the others' (their ids are assigned again next)
    size = remote.nbytes
    with pytest.raises(ValueError, match=r"docs\[5\] must have the embedding dim of docs\[3\]"):
        remote.add(_corpus(rng, 5) + [np.zeros((3, DIM + 1), np.float32)])
    assert len(remote) == 39 and remote.nbytes == size
    more = _corpus(rng, 4)
    np.testing.assert_array_equal(remote.add(more), single.add(more))
    _compare(remote, single, rng)
    for index in (single, remote):  # an update: an id removed and added again, no compaction between
        index.remove([7])
        index.add([docs[0]], ids=[7])
    _compare(remote, single, rng)


def test_ray_index_stored_on_the_host(ray_cluster, tmp_path):
    """store="host": CPU actors keep their documents in their host's memory anyway (GPU actors
    stream theirs: the GPU test below); the same results."""
    import cupy_maxsim.ray as cmr

    rng = np.random.default_rng(3)
    docs = _corpus(rng)
    single, hosted = cm.Index(DIM, dtype="float32"), cmr.RayIndex(DIM, dtype="float32", actors=2, store="host")
    single.add(docs)
    hosted.add(docs)
    _compare(hosted, single, rng)
    # saved by Ray, loaded by a ShardedIndex and by Ray again (one folder layout), ids kept
    hosted.remove([4, 30])
    single.remove([4, 30])
    hosted.save(tmp_path / "ray")
    del hosted  # (its actors' CPUs for the loaded ones: the test cluster has two)
    again = cmr.RayIndex.load(tmp_path / "ray")
    assert len(again.actors) == 2 and sorted(again.ids) == sorted(single.ids)
    _compare(again, single, rng)
    _compare(cm.ShardedIndex.load(tmp_path / "ray", devices=["cpu"]), single, rng)
    with pytest.raises(FileNotFoundError, match="sharded.json"):
        cmr.RayIndex.load(tmp_path)
    with pytest.raises(ValueError, match="store must be"):
        cmr.RayIndex(DIM, actors=1, store="disk")
    with pytest.raises(ValueError, match="gpu_budget_bytes"):
        cmr.RayIndex(DIM, actors=1, gpu_budget_bytes=0)


def _wait_until_dead(ray, actor, seconds=60.0):
    """ray.kill returns before the actor is gone: a call made at once may still be answered
    (CI once saw the search below succeed). Waits until a call reports the death."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.nbytes.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the killed actor still answers after {seconds} s")


def test_a_dead_actor_is_reported(ray_cluster):
    import cupy_maxsim.ray as cmr

    rng = np.random.default_rng(2)
    remote = cmr.RayIndex(DIM, dtype="float32", actors=2, timeout=60)
    remote.add(_corpus(rng, 10))
    ray_cluster.kill(remote.actors[1])
    _wait_until_dead(ray_cluster, remote.actors[1])
    with pytest.raises(RuntimeError, match="shard 1's Ray actor died"):
        remote.search(unit_rows(rng, (1, 3, DIM), np.float32), 3)


@pytest.mark.gpu
def test_ray_host_stored_gpu_actors_are_one_gpu_index(ray_cluster):
    """RayIndex(store="host") with GPU actors (two of half a GPU each): each streams its host
    store through its GPU; the results of one GPU index, bitwise."""
    import cupy

    import cupy_maxsim.ray as cmr

    rng = np.random.default_rng(7)
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 60, 1500)]
    single = cm.Index(DIM, dtype="int8", device="cuda")
    single.add([cupy.asarray(x) for x in docs])
    remote = cmr.RayIndex(DIM, dtype="int8", actors=2, num_gpus=0.5, store="host", gpu_budget_bytes=8 * 1024 * DIM)
    remote.add(docs)
    q = unit_rows(rng, (4, 8, DIM), np.float32).astype(np.float16)
    _same(remote.search(q, 30, return_argmax=True), [x.get() for x in single.search(cupy.asarray(q), 30,
                                                                                   return_argmax=True)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_gpu_shards_are_one_gpu_index(dtype):
    """Several shards on one GPU (the multi-GPU code path: a device each would be the same
    calls) against one GPU index: host, CuPy and torch documents go to each shard's device;
    the same top-k, scores and winners, bitwise, after removes and adds."""
    import cupy

    rng = np.random.default_rng(5)
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 60, 2000)]
    single = cm.Index(DIM, dtype=dtype, device="cuda")
    sharded = cm.ShardedIndex(DIM, dtype=dtype, devices=["cuda:0"], shards=3)
    single.add([cupy.asarray(x) for x in docs])
    sharded.add(docs[:1000])  # host documents
    sharded.add(cm.pack([cupy.asarray(x) for x in docs[1000:]]))  # tokens and offsets on the GPU
    assert [s.device for s in sharded.shards] == ["cuda:0"] * 3 and len(sharded) == 2000
    for index in (single, sharded):
        index.remove(list(range(0, 2000, 7)))
        index.add([cupy.asarray(x) for x in docs[:50]])
    q = unit_rows(rng, (5, 8, DIM), np.float32).astype(np.float16)
    for queries in (cupy.asarray(q), q, cupy.asarray(q[0])):
        want = single.search(cupy.asarray(queries), 40, return_argmax=True)
        got = sharded.search(queries, 40, return_argmax=True)
        assert type(got[0]) is type(queries)
        _same([_arrays_host(x) for x in got], [x.get() for x in want])
    allow = list(range(0, 2050, 3))
    _same([_arrays_host(x) for x in sharded.search(cupy.asarray(q), 10, filter=allow)],
          [x.get() for x in single.search(cupy.asarray(q), 10, filter=allow)])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_gpu_host_stored_shards_are_one_gpu_index(dtype, tmp_path):
    """store="host": each shard keeps its documents in host memory and streams them through its
    GPU (here three shards through the one GPU, the multi-GPU code path), in several segments
    each; the same top-k, scores and winners as one GPU index, bitwise."""
    import cupy

    rng = np.random.default_rng(6)
    docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 60, 2000)]
    single = cm.Index(DIM, dtype=dtype, device="cuda")
    sharded = cm.ShardedIndex(DIM, dtype=dtype, devices=["cuda:0"], shards=3, store="host",
                              gpu_budget_bytes=8 * 1024 * DIM)
    single.add([cupy.asarray(x) for x in docs])
    sharded.add(docs[:1000])  # host documents
    sharded.add(cm.pack([cupy.asarray(x) for x in docs[1000:]]))  # tokens and offsets on the GPU
    assert [s.device for s in sharded.shards] == ["host"] * 3 and sharded.places == ["cuda:0"] * 3
    assert "stored on the host" in repr(sharded)
    for index in (single, sharded):
        index.remove(list(range(0, 2000, 7)))
    q = unit_rows(rng, (5, 8, DIM), np.float32).astype(np.float16)
    for queries in (cupy.asarray(q), q):
        want = single.search(cupy.asarray(queries), 40, return_argmax=True)
        got = sharded.search(queries, 40, return_argmax=True)
        assert type(got[0]) is type(queries)
        _same([_arrays_host(x) for x in got], [x.get() for x in want])
    assert all(shard.last_search.segments > 1 for shard in sharded.shards)
    # saved, and loaded memory-mapped (read-only pages, registered as such or copied once)
    sharded.save(tmp_path / "sharded")
    loaded = cm.ShardedIndex.load(tmp_path / "sharded", devices=["cuda:0"], store="host",
                                  gpu_budget_bytes=8 * 1024 * DIM)
    want = single.search(cupy.asarray(q), 40, return_argmax=True)
    _same([_arrays_host(x) for x in loaded.search(cupy.asarray(q), 40, return_argmax=True)], [x.get() for x in want])


def _arrays_host(x):
    return x.get() if hasattr(x, "get") else np.asarray(x)
