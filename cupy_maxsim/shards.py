"""An index split into shards: over several devices in one process (:class:`ShardedIndex`),
or over Ray actors (``cupy_maxsim.ray``). Each shard is an :class:`~cupy_maxsim.Index` that
searches its own documents; their top-k lists are merged exactly (every shard's full k, ties to
the lower id), so the results are the ones one index of every document gives.

    index = cupy_maxsim.ShardedIndex(128, devices=["cuda:0", "cuda:1"])   # or shards=4 on one GPU
    index.add(documents)
    scores, ids = index.search(queries, k=10)

With ``store="host"`` the shards keep their documents in host memory and each streams its own
through its GPU (:mod:`cupy_maxsim.streaming`): a corpus larger than every GPU's memory together,
searched by all of them at once.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from . import _arrays, _documents, _files, _ids, streaming
from ._ids import id_array
from .index import Index
from ._gpu.device import on_device, on_stream
from ._topk import first_by_score_then_id
from .search import _check_k


MANIFEST = _files.SHARDED_MANIFEST
FORMAT_NAME = "cupy-maxsim-sharded-index"
VERSION = 1


class ShardedIndex:
    """Documents spread over ``shards`` indexes on ``devices`` (shard i on devices[i %
    len(devices)]; default one shard per visible GPU, else one on the CPU). Added documents are
    split into contiguous runs, one per shard; ids are the index's, as one Index would give them.

    ``store``: where a shard on a GPU keeps its documents: "device" (in the GPU's memory) or
    "host" (in host memory, streamed through that GPU at each search within
    ``gpu_budget_bytes``, as ``Index(device="host")``; each GPU streams its own shards, all at
    once). Shards on the CPU keep theirs in host memory either way."""

    def __init__(self, dim: int, *, dtype: str = "float16", devices=None, shards: int | None = None,
                 rescore: str | None = None, store: str = "device",
                 gpu_budget_bytes: int = streaming.DEFAULT_GPU_BUDGET):
        devices = _default_devices() if devices is None else [_device_name(d) for d in devices]
        if not devices:
            raise ValueError("devices must name at least one device")
        count = len(devices) if shards is None else shards
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"shards must be a positive int, got {shards!r}")
        if store not in ("device", "host"):
            raise ValueError(f"store must be 'device' or 'host', got {store!r}")
        self.dim, self.dtype, self.store = int(dim), dtype, store
        #: The device each shard searches on ("cpu" or "cuda:N"), in shard order.
        self.places = [devices[i % len(devices)] for i in range(count)]
        self.shards = [Index(dim, dtype=dtype, device="host" if store == "host" and place != "cpu" else place,
                             rescore=rescore, gpu_budget_bytes=gpu_budget_bytes) for place in self.places]
        self._next_id = 0

    def __len__(self) -> int:
        return sum(len(shard) for shard in self.shards)

    @property
    def ids(self) -> np.ndarray:
        return np.concatenate([shard.ids for shard in self.shards])

    @property
    def nbytes(self) -> int:
        return sum(shard.nbytes for shard in self.shards)

    def __repr__(self) -> str:
        places = ", ".join(sorted(set(self.places)))
        store = ", stored on the host" if any(shard.device == "host" for shard in self.shards) else ""
        return (f"ShardedIndex(dim={self.dim}, dtype={self.dtype}, shards={len(self.shards)} on {places}{store}, "
                f"documents={len(self):,}, {self.nbytes / 1e6:,.1f} MB)")

    def add(self, docs, *, ids=None, mask=None, progress: bool = False, batch_docs: int = 8192,
            copy: bool | None = True) -> np.ndarray:
        """As :meth:`Index.add`; the documents go to the shards in contiguous runs, ``batch_docs``
        at a time (a progress bar a shard with ``progress``; with ``copy=None``, empty
        host-stored shards keep their runs of a host ``(tokens, offsets)`` pair as they are: the
        corpus held once)."""
        _documents.check_copy(copy)
        new_ids = _ids.new_ids(ids, _documents.count(docs), self._next_id, np.concatenate([s.ids for s in self.shards]))
        parts = list(split_documents(docs, mask, new_ids, len(self.shards)))
        if copy is False:  # (every shard asked before any adds: none or all keep their run)
            for n, (shard, (part, part_mask, part_ids, _)) in enumerate(zip(self.shards, parts)):
                refused = shard._copy_needed(part, part_mask) if part_ids.size else None
                if refused is not None:
                    raise ValueError(f"add(copy=False) would have to copy shard {n}'s documents: {refused}")
        sizes = [shard._size() for shard in self.shards]
        try:
            for shard, (part, part_mask, part_ids, first) in zip(self.shards, parts):
                if part_ids.size:  # (each shard takes them from wherever they are, a batch at a time; ids checked above)
                    shard._store(part, part_ids, part_mask, progress, batch_docs, copy, first)
        except BaseException:  # (bad documents in a later run, memory, Ctrl-C: every shard as it was)
            for shard, size in zip(self.shards, sizes):
                shard._cut_to(size)
            raise
        self._next_id = max(self._next_id, int(new_ids.max()) + 1 if new_ids.size else 0)
        return new_ids

    def remove(self, ids) -> int:
        """As :meth:`Index.remove`: every id must be in one of the shards."""
        wanted = id_array(ids, "ids")
        held = [np.isin(wanted, shard.ids) for shard in self.shards]
        missing = ~np.logical_or.reduce(held) if held else np.ones(wanted.shape, bool)
        if missing.any():
            raise ValueError(f"ids not in the index: {wanted[missing][:5].tolist()}")
        return sum(shard.remove(wanted[mine]) for shard, mine in zip(self.shards, held) if mine.any())

    def search(self, q, k: int, *, q_mask=None, filter=None, return_argmax=False):
        """As :meth:`Index.search`, over every shard; results in the framework of ``q``, on its
        device. The shards of each device are searched by a thread of their own (the devices
        work at once), their top-k lists merged on the host; host-stored shards stream through
        their own GPU."""
        k = _check_k(k)
        like = _arrays.as_operand(q, "q")
        filter = None if filter is None else _host_filter(filter, self)
        devices = list(dict.fromkeys(self.places))  # in shard order
        # The queries go as they are to the shards on their own device, from one host copy to
        # the others.
        local = f"cuda:{like.device}" if like.on_gpu else "cpu"
        if any(device != local for device in devices):
            q_elsewhere = _arrays.host_values(q)
            mask_elsewhere = None if q_mask is None else _arrays.to_host(_arrays.as_operand(q_mask, "q_mask"))

        def search_on(device):
            shard_q, shard_mask = (q, q_mask) if device == local else (q_elsewhere, mask_elsewhere)
            shard_q = array_on(shard_q, device, "q")
            shard_mask = None if shard_mask is None else array_on(shard_mask, device, "q_mask")
            return [tuple(_host(x) for x in shard.search(shard_q, k, q_mask=shard_mask, filter=filter,
                                                         return_argmax=return_argmax))
                    for shard, place in zip(self.shards, self.places) if place == device]

        gpus = [device for device in devices if device != "cpu"]
        # (CPU shards in this thread: NumPy's BLAS threads itself, and its sums may round
        # otherwise when called from another thread, where shards must score as one index does)
        found = {"cpu": search_on("cpu")} if "cpu" in devices else {}
        if len(gpus) == 1:
            found[gpus[0]] = search_on(gpus[0])
        elif gpus:
            found.update(zip(gpus, self._threads(len(gpus)).map(search_on, gpus)))
        results = [found[place].pop(0) for place in self.places]  # back in shard order
        if like.on_gpu and results[0][0].size * len(results) >= GPU_MERGE_CANDIDATES:
            with on_device(like.device), on_stream(like.stream):
                import cupy

                return _arrays.answer(merge_top_k(results, k, cupy), like)
        return _arrays.answer(merge_top_k(results, k), like)

    def _threads(self, count: int) -> ThreadPoolExecutor:
        """The index's own threads, a GPU each, kept from search to search (starting them took
        part of a one-query search's time); they end with the index."""
        pool = getattr(self, "_pool", None)
        if pool is None or pool._max_workers < count:
            self._pool = pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="cupy_maxsim.shards")
        return pool

    def save(self, path, *, progress: bool = False) -> Path:
        """Write every shard as :meth:`Index.save` does (``shard-0000``, ... in ``path``), then
        ``sharded.json`` (last: a folder without it is no sharded index). RayIndex.save writes
        the same folder: either class loads what the other saved."""
        pending = []

        def discard():
            for written in pending:
                written.discard()

        def commit():
            for written in pending:
                written.commit()

        folder = saved_whole(path, lambda folder: pending.extend(
            shard._written(folder / shard_folder(n), progress) for n, shard in enumerate(self.shards)), commit, discard)
        return write_manifest(folder, self.dim, self.dtype, self.shards[0].rescore, len(self.shards), len(self),
                              self._next_id)

    @classmethod
    def load(cls, path, *, devices=None, store: str = "device", mmap: bool = True, progress: bool = False,
             gpu_budget_bytes: int = streaming.DEFAULT_GPU_BUDGET) -> "ShardedIndex":
        """A sharded index saved by :meth:`save`, its shards on ``devices`` and kept in ``store``
        as the constructor places them (the saved shards, whatever devices they were on).
        Host-stored shards (and shards on the CPU) with ``mmap`` are memory-mapped: a corpus
        larger than the host's memory is read from its files as it streams."""
        folder = Path(path)
        manifest = read_manifest(folder)
        index = cls(manifest["dim"], dtype=manifest["dtype"], devices=devices, shards=manifest["shards"],
                    rescore=manifest.get("rescore"), store=store, gpu_budget_bytes=gpu_budget_bytes)
        index.shards = [Index.load(folder / shard_folder(n), device=shard.device, mmap=mmap, progress=progress,
                                   gpu_budget_bytes=gpu_budget_bytes) for n, shard in enumerate(index.shards)]
        index._next_id = int(manifest["next_id"])
        check_loaded(folder, manifest, len(index))
        return index


def shard_folder(n: int) -> str:
    """Shard n's folder in a saved sharded index."""
    return f"shard-{n:04d}"


def saved_whole(path, write, commit, discard) -> Path:
    """A sharded save's two halves (ShardedIndex's shards, RayIndex's actors) into folder
    ``path`` (created): ``write(folder)`` every shard's arrays to partial files, then the
    manifest removed and ``commit()`` puts them in place; a write that fails or stops is
    ``discard()``-ed and the old index stays whole (a stop among the commits: no index, never
    an old manifest over shards of two saves). The caller writes the new manifest."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        write(folder)
    except BaseException:
        discard()
        raise
    (folder / MANIFEST).unlink(missing_ok=True)
    commit()
    return folder


def write_manifest(folder: Path, dim: int, dtype: str, rescore, shards: int, documents: int, next_id: int) -> Path:
    """A saved sharded index's manifest, written after its shards (never half a file), then the
    folders of shards past ``shards`` (an earlier save of more) removed: ``folder``."""
    _files.write_json(folder / MANIFEST, {"format": FORMAT_NAME, "version": VERSION, "dim": dim, "dtype": dtype,
                                              "rescore": rescore, "shards": shards, "documents": documents,
                                              "next_id": next_id})
    while (folder / shard_folder(shards)).is_dir():
        shutil.rmtree(folder / shard_folder(shards))
        shards += 1
    return folder


def read_manifest(folder: Path) -> dict:
    """A saved sharded index's manifest; FileNotFoundError or ValueError naming what is wrong."""
    return _files.read_manifest(folder, MANIFEST, FORMAT_NAME, VERSION)


def check_loaded(folder: Path, manifest: dict, documents: int) -> None:
    """A ValueError where the loaded shards do not hold the documents the manifest counts."""
    if documents != manifest["documents"]:
        raise ValueError(f"{folder}: the shards hold {documents} documents, {MANIFEST} says {manifest['documents']}")


def split_documents(docs, mask, ids: np.ndarray, parts: int):
    """``parts`` contiguous runs of the documents: (docs, mask, ids, the position of the run's
    first document in ``docs``) each, in add()'s forms."""
    count = ids.shape[0]
    if isinstance(docs, tuple) and len(docs) == 2:
        docs = (docs[0], _arrays.to_host(_arrays.as_operand(docs[1], "offsets")).astype(np.int64))
        _documents.check_offsets(docs[1], _arrays.as_operand(docs[0], "docs").shape[0])  # (whole: shards see slices)
    bounds = np.linspace(0, count, parts + 1).round().astype(int)
    for start, stop in zip(bounds[:-1], bounds[1:]):
        yield (_documents.sliced(docs, int(start), int(stop)), None if mask is None else mask[start:stop],
               ids[start:stop], int(start))


def merge_top_k(results, k: int, xp=np):
    """Every shard's (scores, ids[, winners]) (host arrays, (Nq, k) or (k,)) as one top-k: by
    descending score, ties to the lower id, -inf then NaN last, missing (-1) after all. ``xp``:
    the module to merge with (CuPy: on the current GPU, the candidates uploaded at once; the
    results there)."""
    single = results[0][0].ndim == 1
    joined = [np.concatenate([np.atleast_2d(r[0]) for r in results], axis=1),
              np.concatenate([np.atleast_2d(r[1]) for r in results], axis=1)]
    if len(results[0]) >= 3:
        joined.append(np.concatenate([r[2][None] if single else r[2] for r in results], axis=1))
    joined = [xp.asarray(x) for x in joined]
    order = first_by_score_then_id(xp, joined[0], joined[1], k)
    out = [xp.take_along_axis(joined[0], order, 1), xp.take_along_axis(joined[1], order, 1)]
    if len(joined) == 3:
        out.append(xp.take_along_axis(joined[2], order[..., None], 1))
    return tuple(x[0] for x in out) if single else tuple(out)


#: Candidates (queries x shards' k) from which a ShardedIndex with GPU queries merges on their GPU:
#: 256 queries x 8 shards of 100 took 7.5 ms on a host's CPU (merge-top-k-2026-12-05-0ff8281),
#: a sort of a few microseconds on a GPU after one upload; one query's 0.04 ms stays on the host.
GPU_MERGE_CANDIDATES = 2**16


def _host(x) -> np.ndarray:
    return _arrays.to_host(_arrays.as_operand(x, "result"))


def _host_filter(filter, index):
    """A filter as an allow-list of ids (a boolean filter is over index.ids, which the shards
    split)."""
    if isinstance(filter, (list, tuple, range)):
        filter = np.asarray(filter)  # (a list of bools is a mask, not ids 0 and 1)
    operand = _arrays.as_operand(filter, "filter")
    values = _arrays.to_host(operand)
    if operand.dtype == "bool":
        if values.shape != (len(index),):
            raise ValueError(f"filter as a boolean array must be shaped like index.ids ({len(index)},), got {values.shape}")
        return index.ids[values]
    return id_array(values, "filter")


def array_on(x, device: str, name: str):
    """``x`` itself where it is on ``device`` already, else a copy there through the host
    (bfloat16 widened to float32 exactly: every stored format takes it)."""
    operand = _arrays.as_operand(x, name)
    gpu = _arrays.parse_device(device)
    if operand.on_gpu == (gpu is not None) and (gpu is None or operand.device == gpu):
        return x
    values = operand.host if not operand.on_gpu else operand.cupy().get()
    values = _arrays.widened_bfloat16(values) if operand.dtype == "bfloat16" else values
    if gpu is None:
        return values
    import cupy

    with cupy.cuda.Device(gpu):
        return cupy.asarray(values)


def _device_name(device) -> str:
    """A device as the shards' Index takes it: "cpu" or "cuda:N" (GPU numbers too)."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return f"cuda:{int(device)}"
    try:
        number = _arrays.parse_device(device)
    except ValueError:
        raise ValueError(f"devices must be 'cpu', 'cuda:N' or GPU numbers, got {device!r}") from None
    return "cpu" if number is None else f"cuda:{number}"


def _default_devices() -> list[str]:
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: the CPU
        count = 0
    return [f"cuda:{n}" for n in range(count)] or ["cpu"]
