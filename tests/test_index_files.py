"""An index's files (cupy_maxsim/_files.py): an index memory-mapped from a folder saved back into
it, changed or not (it once truncated the files under its own maps and lost the index); a save
stopped midway leaves the old index whole, or no index, never a mix; arrays written and loaded a
chunk at a time; arrays of an earlier save the new one does not have removed; sharded folders
the same. CPU (the GPU's chunked load is in test_index's GPU case)."""

import os

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _files
from support import unit_rows

DIM = 16


def _index(rng, count, dtype="float16", **kwargs):
    index = cm.Index(DIM, dtype=dtype, **kwargs)
    index.add([unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 12, count)])
    return index


def _answers(index, q, k=7):
    return tuple(np.asarray(x) for x in index.search(q, k))


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_a_loaded_index_saves_back_into_its_folder(tmp_path, dtype):
    rng = np.random.default_rng(0)
    index = _index(rng, 60, dtype)
    q = unit_rows(rng, (3, 5, DIM), np.float32)
    folder = index.save(tmp_path / "idx")
    loaded = cm.Index.load(folder)  # memory-mapped
    assert isinstance(loaded._tokens, np.memmap)
    loaded.save(folder)  # unchanged: every array written from the maps of the files it replaces
    for answer, expected in zip(_answers(cm.Index.load(folder), q), _answers(index, q)):
        np.testing.assert_array_equal(answer, expected)
    np.testing.assert_array_equal(_answers(loaded, q)[1], _answers(index, q)[1])  # its maps still read
    loaded = cm.Index.load(folder)
    loaded.remove([3, 4, 50])
    more = [unit_rows(rng, (5, DIM), np.float32) for _ in range(4)]
    loaded.add(more, ids=[100, 101, 102, 103])
    loaded.save(folder)  # changed: compacted, grown
    again = cm.Index.load(folder)
    index.remove([3, 4, 50])
    index.add(more, ids=[100, 101, 102, 103])
    for answer, expected in zip(_answers(again, q), _answers(index, q)):
        np.testing.assert_array_equal(answer, expected)
    assert sorted(os.listdir(folder)) == sorted(["manifest.json", "tokens.npy", "offsets.npy", "ids.npy"]
                                                + (["scales.npy"] if dtype == "int8" else []))


def test_a_save_stopped_midway_leaves_the_old_index_or_none(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    old, new = _index(rng, 40), _index(rng, 70)
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    folder = old.save(tmp_path / "idx")
    monkeypatch.setattr(_files, "CHUNK_BYTES", 256)  # many chunks: stopped after a few (Ctrl-C)
    progress = _files.progress

    def interrupted(iterable, *args):
        for n, item in enumerate(progress(iterable, *args)):
            if n == 4:
                raise KeyboardInterrupt
            yield item

    monkeypatch.setattr(_files, "progress", interrupted)
    with pytest.raises(KeyboardInterrupt):
        new.save(folder)
    assert not [name for name in os.listdir(folder) if name.endswith(".partial")]
    for answer, expected in zip(_answers(cm.Index.load(folder), q), _answers(old, q)):
        np.testing.assert_array_equal(answer, expected)  # the old index, whole
    monkeypatch.setattr(_files, "progress", progress)
    replaced = []

    def failing_replace(source, target):
        replaced.append(target)
        if len(replaced) == 2:
            raise OSError("stopped")
        os.rename(source, target)

    monkeypatch.setattr(_files.os, "replace", failing_replace)
    with pytest.raises(OSError, match="stopped"):
        new.save(folder)
    with pytest.raises(FileNotFoundError, match="not a saved"):  # no index, never a mix
        cm.Index.load(folder)


def test_arrays_are_written_and_loaded_a_chunk_at_a_time(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    index = _index(rng, 50, "float32", rescore="float32")
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    monkeypatch.setattr(_files, "CHUNK_BYTES", 200)  # a few rows a chunk
    folder = index.save(tmp_path / "idx")
    for mmap in (True, False):
        loaded = cm.Index.load(folder, mmap=mmap)
        assert isinstance(loaded._tokens, np.memmap) == mmap and isinstance(loaded._exact, np.memmap) == mmap
        for answer, expected in zip(_answers(loaded, q), _answers(index, q)):
            np.testing.assert_array_equal(answer, expected)
    empty = cm.Index(DIM, dtype="float16")
    loaded = cm.Index.load(empty.save(tmp_path / "empty"), mmap=False)
    assert len(loaded) == 0 and loaded._tokens.shape == (0, DIM)


def test_a_save_removes_arrays_the_new_index_does_not_have(tmp_path):
    rng = np.random.default_rng(3)
    folder = _index(rng, 20, "int8", rescore="float16").save(tmp_path / "idx")
    assert {"scales.npy", "exact.npy"} <= set(os.listdir(folder))
    plain = _index(rng, 20, "float16")
    plain.save(folder)
    assert not {"scales.npy", "exact.npy"} & set(os.listdir(folder))
    assert cm.Index.load(folder).dtype == "float16"


def test_a_loaded_sharded_index_saves_back_into_its_folder(tmp_path):
    # (Loaded onto the CPU, as saved: on a GPU box a load's default is the GPUs, whose sums may
    # differ from the CPU's in the last bit, and these answers are compared exactly.)
    rng = np.random.default_rng(4)
    sharded = cm.ShardedIndex(DIM, dtype="float16", devices=["cpu"], shards=3)
    sharded.add([unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(1, 12, 45)])
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    folder = sharded.save(tmp_path / "sharded")
    loaded = cm.ShardedIndex.load(folder, devices=["cpu"])
    loaded.remove([0, 20, 44])
    loaded.save(folder)
    sharded.remove([0, 20, 44])
    for answer, expected in zip(_answers(cm.ShardedIndex.load(folder, devices=["cpu"]), q), _answers(sharded, q)):
        np.testing.assert_array_equal(answer, expected)


def test_a_sharded_save_stopped_while_writing_keeps_the_old_index(tmp_path, monkeypatch):
    """Every shard's arrays are written before any shard's replace the old ones: a save
    stopped at shard 2's arrays leaves the old sharded index whole (and no partial files),
    where it used to leave shards of two saves behind no manifest."""
    rng = np.random.default_rng(7)
    sharded = cm.ShardedIndex(DIM, dtype="float16", devices=["cpu"], shards=3)
    sharded.add([unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(1, 12, 30)])
    q = unit_rows(rng, (2, 4, DIM), np.float32)
    folder = sharded.save(tmp_path / "sharded")
    before = _answers(sharded, q)
    sharded.remove([1, 2, 3])
    sharded.add([unit_rows(rng, (4, DIM), np.float32)])
    write, calls = _files.write_arrays, []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return write(*args, **kwargs)

    monkeypatch.setattr(_files, "write_arrays", stopping)
    with pytest.raises(KeyboardInterrupt):
        sharded.save(folder)
    monkeypatch.undo()
    assert not list(folder.rglob("*.partial"))
    for answer, expected in zip(_answers(cm.ShardedIndex.load(folder, devices=["cpu"]), q), before):
        np.testing.assert_array_equal(answer, expected)
    sharded.save(folder)
    for answer, expected in zip(_answers(cm.ShardedIndex.load(folder, devices=["cpu"]), q), _answers(sharded, q)):
        np.testing.assert_array_equal(answer, expected)
    fewer = cm.ShardedIndex(DIM, dtype="float16", devices=["cpu"], shards=2)  # (an earlier save's third shard goes)
    fewer.add([unit_rows(rng, (3, DIM), np.float32) for _ in range(5)])
    fewer.save(folder)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["shard-0000", "shard-0001"]
    for answer, expected in zip(_answers(cm.ShardedIndex.load(folder, devices=["cpu"]), q), _answers(fewer, q)):
        np.testing.assert_array_equal(answer, expected)


def test_loading_the_other_kind_of_index_says_which_it_is(tmp_path):
    rng = np.random.default_rng(6)
    one = _index(rng, 5).save(tmp_path / "one")
    sharded = cm.ShardedIndex(DIM, devices=["cpu"], shards=2)
    sharded.add([unit_rows(rng, (3, DIM), np.float32) for _ in range(4)])
    many = sharded.save(tmp_path / "many")
    with pytest.raises(FileNotFoundError, match=r"sharded index: cupy_maxsim.ShardedIndex.load"):
        cm.Index.load(many)
    with pytest.raises(FileNotFoundError, match=r"one Index: cupy_maxsim.Index.load"):
        cm.ShardedIndex.load(one)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_a_gpu_index_is_saved_and_loaded_a_chunk_at_a_time(tmp_path, monkeypatch, dtype):
    """A GPU store goes to its files and back a chunk at a time (a few rows each here), equal
    to the index it was; saved back into its folder from the GPU too."""
    import cupy

    rng = np.random.default_rng(5)
    index = _index(rng, 80, dtype, device="cuda")
    q = cupy.asarray(unit_rows(rng, (3, 5, DIM), np.float32))
    monkeypatch.setattr(_files, "CHUNK_BYTES", 300)
    folder = index.save(tmp_path / "gpu")
    for mmap in (True, False):
        loaded = cm.Index.load(folder, device="cuda", mmap=mmap)
        assert isinstance(loaded._tokens, cupy.ndarray)
        for answer, expected in zip(loaded.search(q, 9), index.search(q, 9)):
            np.testing.assert_array_equal(cupy.asnumpy(answer), cupy.asnumpy(expected))
    loaded.remove([1, 2])
    loaded.save(folder)
    index.remove([1, 2])
    for answer, expected in zip(cm.Index.load(folder, device="cuda").search(q, 9), index.search(q, 9)):
        np.testing.assert_array_equal(cupy.asnumpy(answer), cupy.asnumpy(expected))
