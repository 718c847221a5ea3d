"""An index's files: arrays written whole or not at all, a chunk at a time; manifests last.

A saved index is a folder of ``.npy`` arrays and a JSON manifest that names them; a folder
without its manifest is no index. Saving writes each array to ``NAME.npy.partial`` a chunk at a
time (a GPU store: at most ``CHUNK_BYTES`` of it on the host at once; a progress bar of
chunks), then takes the old manifest away, renames the new arrays over the old ones and writes
the new manifest (through a file of its own, renamed): whatever stops a save midway leaves the
old index or no index, never old arrays under a new manifest or the reverse. Renaming, not
rewriting in place, is also what lets an index memory-mapped from a folder be saved back into
it: its maps keep reading the old files (rewritten in place, they were truncated under it:
``Index.load(p).save(p)`` lost the index). Loading onto a GPU, or without ``mmap``, copies a
chunk at a time from the maps (``cupy.asarray`` of a whole array staged all of it in pinned host
memory). A sharded save writes every shard's partial files before it commits any
(:class:`Pending`): stopped while writing, the old sharded index stays whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from . import _arrays

#: Bytes of an array written or copied at once.
CHUNK_BYTES = 256 * 2**20
#: The manifest of a saved Index, and of a saved sharded index (its shards' folders hold the first).
INDEX_MANIFEST, SHARDED_MANIFEST = "manifest.json", "sharded.json"
#: What a folder with each manifest holds (said where a folder of the other kind is loaded).
_HOLDS = {INDEX_MANIFEST: ("a saved cupy_maxsim.Index", "one Index: cupy_maxsim.Index.load"),
          SHARDED_MANIFEST: ("a saved sharded index", "a sharded index: cupy_maxsim.ShardedIndex.load")}


def read_manifest(folder: Path, name: str, format_name: str, version: int) -> dict:
    """The manifest ``name`` of ``folder``, of ``format_name`` at ``version``; a
    FileNotFoundError (naming the other load where the folder holds the other kind of index)
    or a ValueError naming what is wrong."""
    try:
        manifest = json.loads((folder / name).read_text())
    except (FileNotFoundError, NotADirectoryError):  # (a file's path: NotADirectoryError)
        other = SHARDED_MANIFEST if name == INDEX_MANIFEST else INDEX_MANIFEST
        elsewhere = f" (it holds {_HOLDS[other][1]})" if (folder / other).is_file() else ""
        raise FileNotFoundError(f"{folder} holds no {name}: not {_HOLDS[name][0]}{elsewhere}") from None
    if manifest.get("format") != format_name or manifest.get("version") != version:
        raise ValueError(f"{folder / name} is not a version-{version} {format_name} manifest")
    return manifest


def progress(iterable, total: int, what: str, enabled: bool):
    """``iterable`` behind a tqdm bar where asked for and tqdm is installed."""
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=f"cupy_maxsim.Index: {what}")


def _chunks(arrays: dict) -> list[tuple[str, int, int]]:
    """(name, first row, row past the last) of each chunk of each array: at least one an array."""
    jobs = []
    for name, array in arrays.items():
        rows = array.shape[0]
        step = max(1, CHUNK_BYTES // max(1, array.nbytes // max(1, rows)))
        jobs += [(name, start, min(rows, start + step)) for start in range(0, rows, step)] or [(name, 0, 0)]
    return jobs


def write_arrays(folder: Path, arrays: dict, show_progress: bool) -> dict:
    """Each of ``arrays`` (host or GPU, C-contiguous rows) written to ``folder/NAME.npy.partial``
    a chunk at a time; returns {name: the partial file}, for :func:`commit`. Partial files of a
    write that fails are removed."""
    partial = {name: folder / f"{name}.npy.partial" for name in arrays}
    files, jobs = {}, _chunks(arrays)
    try:
        for name, start, stop in progress(jobs, len(jobs), "saving", show_progress):
            array = arrays[name]
            if name not in files:
                files[name] = open(partial[name], "wb")
                header = {"descr": np.lib.format.dtype_to_descr(np.dtype(array.dtype)), "fortran_order": False,
                          "shape": tuple(int(n) for n in array.shape)}
                np.lib.format.write_array_header_1_0(files[name], header)
            if stop > start:
                np.ascontiguousarray(_arrays.to_host(array[start:stop])).tofile(files[name])
        for file in files.values():  # (on disk before the renames make them the index)
            file.flush()
            os.fsync(file.fileno())
            file.close()
    except BaseException:
        for file in files.values():
            file.close()
        for path in partial.values():
            path.unlink(missing_ok=True)
        raise
    return partial


class Pending:
    """A save whose arrays :func:`write_arrays` wrote to their partial files: :meth:`commit`
    puts them in place of the old ones and writes ``manifest`` (the old manifest removed
    first, arrays of ``stale`` names the new index does not have removed, the new manifest
    written last through a file of its own); :meth:`discard` removes them (a sharded save
    stopped before its commits)."""

    def __init__(self, folder: Path, manifest_name: str, partial: dict, stale: tuple, manifest: dict):
        self.folder, self.manifest_name, self.partial, self.stale, self.manifest = (
            folder, manifest_name, partial, stale, manifest)

    def commit(self) -> Path:
        folder = self.folder
        (folder / self.manifest_name).unlink(missing_ok=True)  # (from here until the end: no index)
        for name, path in self.partial.items():
            os.replace(path, folder / f"{name}.npy")
        for name in self.stale:
            if name not in self.partial:
                (folder / f"{name}.npy").unlink(missing_ok=True)
        write_json(folder / self.manifest_name, self.manifest)
        return folder

    def discard(self) -> None:
        for path in self.partial.values():
            path.unlink(missing_ok=True)


def write_json(path: Path, value) -> None:
    """``value`` as JSON at ``path`` (a manifest), through ``path.partial`` renamed: never half a
    file."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as file:
        file.write(json.dumps(value, indent=1) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def copied(xp, arrays: dict, show_progress: bool) -> dict:
    """Host (memory-mapped) ``arrays`` copied into new arrays of ``xp`` (CuPy: on the current
    device) a chunk at a time."""
    out, jobs = {name: xp.empty(array.shape, dtype=array.dtype) for name, array in arrays.items()}, _chunks(arrays)
    for name, start, stop in progress(jobs, len(jobs), "loading", show_progress):
        if stop > start:  # (CuPy: each chunk staged on its own, not the whole array in pinned memory)
            chunk = np.ascontiguousarray(arrays[name][start:stop])
            if xp is np:
                out[name][start:stop] = chunk
            else:  # straight into the rows (a leading-axis slice: contiguous), not via a device copy
                out[name][start:stop].set(chunk)
    return out
