"""An index split into shards: over several devices in one process (:class:`ShardedIndex`),
or over Ray actors (``cupy_maxsim.ray``). Each shard is an :class:`~cupy_maxsim.Index` that
searches its own documents; their top-k lists are merged exactly (every shard's full k, ties to
the lower id), so the results are the ones one index of every document gives.

    index = cupy_maxsim.ShardedIndex(128, devices=["cuda:0", "cuda:1"])   # or shards=4 on one GPU
    index.add(documents)
    scores, ids = index.search(queries, k=10)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import _arrays, _documents
from .index import Index, _id_array, _parse_device
from .search import _check_k


class ShardedIndex:
    """Documents spread over ``shards`` indexes on ``devices`` (shard i on devices[i %
    len(devices)]; default one shard per visible GPU, else one on the CPU). Added documents are
    split into contiguous runs, one per shard; ids are the index's, as one Index would give them."""

    def __init__(self, dim: int, *, dtype: str = "float16", devices=None, shards: int | None = None,
                 rescore: str | None = None):
        devices = _default_devices() if devices is None else [_device_name(d) for d in devices]
        if not devices:
            raise ValueError("devices must name at least one device")
        count = len(devices) if shards is None else shards
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"shards must be a positive int, got {shards!r}")
        self.dim, self.dtype = int(dim), dtype
        self.shards = [Index(dim, dtype=dtype, device=devices[i % len(devices)], rescore=rescore) for i in range(count)]
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
        places = ", ".join(sorted({shard.device for shard in self.shards}))
        return (f"ShardedIndex(dim={self.dim}, dtype={self.dtype}, shards={len(self.shards)} on {places}, "
                f"documents={len(self):,}, {self.nbytes / 1e6:,.1f} MB)")

    def add(self, docs, *, ids=None, mask=None) -> np.ndarray:
        """As :meth:`Index.add`; the documents go to the shards in contiguous runs."""
        new_ids = assign_ids(docs, ids, self._next_id, np.concatenate([s._ids for s in self.shards]))
        for shard, (part, part_mask, part_ids) in zip(self.shards, split_documents(docs, mask, new_ids,
                                                                                   len(self.shards))):
            if part_ids.size:
                shard.add(docs_on(part, shard.device), ids=part_ids,
                          mask=None if part_mask is None else array_on(part_mask, shard.device, "mask"))
        self._next_id = max(self._next_id, int(new_ids.max()) + 1 if new_ids.size else 0)
        return new_ids

    def remove(self, ids) -> int:
        """As :meth:`Index.remove`: every id must be in one of the shards."""
        wanted = _id_array(ids, "ids")
        held = [np.isin(wanted, shard.ids) for shard in self.shards]
        missing = ~np.logical_or.reduce(held) if held else np.ones(wanted.shape, bool)
        if missing.any():
            raise ValueError(f"ids not in the index: {wanted[missing][:5].tolist()}")
        return sum(shard.remove(wanted[mine]) for shard, mine in zip(self.shards, held) if mine.any())

    def search(self, q, k: int, *, q_mask=None, filter=None, return_argmax=False):
        """As :meth:`Index.search`, over every shard; results in the framework of ``q``, on its
        device. The shards of each device are searched by a thread of their own (the devices
        work at once), their top-k lists merged on the host."""
        k = _check_k(k)
        like = _arrays.as_operand(q, "q")
        filter = None if filter is None else _host_filter(filter, self)
        devices = list(dict.fromkeys(shard.device for shard in self.shards))  # in shard order
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
                    for shard in self.shards if shard.device == device]

        gpus = [device for device in devices if device != "cpu"]
        # (CPU shards in this thread: NumPy's BLAS threads itself, and its sums may round
        # otherwise when called from another thread, where shards must score as one index does)
        found = {"cpu": search_on("cpu")} if "cpu" in devices else {}
        if len(gpus) == 1:
            found[gpus[0]] = search_on(gpus[0])
        elif gpus:
            with ThreadPoolExecutor(max_workers=len(gpus)) as pool:
                found.update(zip(gpus, pool.map(search_on, gpus)))
        results = [found[shard.device].pop(0) for shard in self.shards]  # back in shard order
        return _arrays.answer(merge_top_k(results, k), like)


def assign_ids(docs, ids, next_id: int, taken: np.ndarray) -> np.ndarray:
    """The ids of documents being added: given (one each, unique, none taken) or the next free."""
    count = _documents.count(docs)
    if ids is None:
        return np.arange(next_id, next_id + count, dtype=np.int64)
    new = _id_array(ids, "ids")
    if new.shape[0] != count:
        raise ValueError(f"ids must give one id per document: {count} documents, {new.shape[0]} ids")
    if np.unique(new).shape[0] != count:
        raise ValueError("ids must be unique")
    if np.isin(new, taken).any():
        raise ValueError(f"ids already in the index: {new[np.isin(new, taken)][:5].tolist()}")
    return new


def split_documents(docs, mask, ids: np.ndarray, parts: int):
    """``parts`` contiguous runs of the documents: (docs, mask, ids) each, in add()'s forms."""
    count = ids.shape[0]
    if isinstance(docs, tuple) and len(docs) == 2:
        docs = (docs[0], _arrays.to_host(_arrays.as_operand(docs[1], "offsets")).astype(np.int64))
        _documents.check_offsets(docs[1], _arrays.as_operand(docs[0], "docs").shape[0])  # (whole: shards see slices)
    bounds = np.linspace(0, count, parts + 1).round().astype(int)
    for start, stop in zip(bounds[:-1], bounds[1:]):
        yield (_documents.sliced(docs, int(start), int(stop)), None if mask is None else mask[start:stop],
               ids[start:stop])


def merge_top_k(results, k: int):
    """Every shard's (scores, ids[, winners]) (host arrays, (Nq, k) or (k,)) as one top-k: by
    descending score, ties to the lower id, -inf then NaN last, missing (-1) after all."""
    single = results[0][0].ndim == 1
    scores = np.concatenate([np.atleast_2d(r[0]) for r in results], axis=1)
    ids = np.concatenate([np.atleast_2d(r[1]) for r in results], axis=1)
    winners = None if len(results[0]) < 3 else np.concatenate(
        [r[2][None] if single else r[2] for r in results], axis=1)
    order = _merge_order(scores, ids, k)
    out = [np.take_along_axis(scores, order, 1), np.take_along_axis(ids, order, 1)]
    if winners is not None:
        out.append(np.take_along_axis(winners, order[..., None], 1))
    return tuple(x[0] for x in out) if single else tuple(out)


def _merge_order(scores, ids, k: int) -> np.ndarray:
    """The positions of each row's k first candidates in merge_top_k's order. float32 scores and
    ids below 2**32 (nearly always): one sort of a 64-bit key a candidate (the score's order in
    the high half as the selection kernel keys it, the id in the low), stable: a merge of the
    shards' runs, each in this order already (256 queries x 8 shards of 100: 2.9 ms against
    the three sorts' 23, and a quicksort's 5.7); else three stable sorts (ids, then scores,
    then missing), each kept by the next."""
    if scores.dtype == np.float32 and ids.max(initial=-1) < 2**32:
        return np.argsort(merge_keys(scores, ids), axis=1, kind="stable")[:, :k]
    order = np.argsort(np.where(ids < 0, np.iinfo(np.int64).max, ids), axis=1, kind="stable")  # ids ascending
    order = np.take_along_axis(order, np.argsort(-np.take_along_axis(scores, order, 1), axis=1, kind="stable"), 1)
    missing = np.take_along_axis(ids, order, 1) < 0
    return np.take_along_axis(order, np.argsort(missing, axis=1, kind="stable"), 1)[:, :k]


def merge_keys(scores: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """uint64 keys whose ascending order is merge_top_k's: the high half a float32 score's
    descending order (kernels_cu/maxsim_topk.cu's topk_key, inverted: -0.0 as 0.0, NaN just
    after -inf), the low half the id (0 <= id < 2**32); a missing candidate (id -1) last."""
    bits = scores.view(np.uint32)
    bits = np.where(bits == np.uint32(0x80000000), np.uint32(0), bits)  # (-0.0: 0.0's bits)
    # Descending order: negatives as they are, positives with every bit but the sign flipped.
    descending = bits ^ ((~(bits.view(np.int32) >> 31)).view(np.uint32) & np.uint32(0x7FFFFFFF))
    descending[np.isnan(scores)] = 0xFF800001  # (just after -inf's 0xFF800000)
    keys = (descending.astype(np.uint64) << np.uint64(32)) | ids.astype(np.uint64)
    keys[ids < 0] = np.iinfo(np.uint64).max
    return keys


def _host(x) -> np.ndarray:
    return _arrays.to_host(_arrays.as_operand(x, "result"))


def _host_filter(filter, index):
    """A filter as an allow-list of ids (a boolean filter is over index.ids, which the shards
    split)."""
    if isinstance(filter, (list, tuple, range)):
        return np.asarray(filter, dtype=np.int64)
    operand = _arrays.as_operand(filter, "filter")
    values = _arrays.to_host(operand)
    if operand.dtype == "bool":
        if values.shape != (len(index),):
            raise ValueError(f"filter as a boolean array must be shaped like index.ids ({len(index)},), got {values.shape}")
        return index.ids[values]
    return _id_array(values, "filter")


def docs_on(docs, device: str):
    """What add() was given (a list, a padded array, or tokens with host offsets), its arrays
    on ``device`` ("cpu" or "cuda:N"), as a shard's Index takes them (it refuses another
    device's documents)."""
    if isinstance(docs, tuple) and len(docs) == 2:
        return array_on(docs[0], device, "docs"), docs[1]
    if isinstance(docs, list):
        return [array_on(x, device, "docs") for x in docs]
    return array_on(docs, device, "docs")


def array_on(x, device: str, name: str):
    """``x`` itself where it is on ``device`` already, else a copy there through the host
    (bfloat16 widened to float32 exactly: every stored format takes it)."""
    operand = _arrays.as_operand(x, name)
    gpu = _parse_device(device)
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
        number = _parse_device(device)
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
