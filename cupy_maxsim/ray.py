"""An index sharded over Ray actors (``pip install "cupy-maxsim[ray]"``): one actor per shard,
each owning a :class:`~cupy_maxsim.Index` on its GPU (or the NumPy backend on CPU actors),
searched in parallel and merged exactly on the driver (every shard's full k, ties to the lower
id): the results one index of every document gives.

    import ray, cupy_maxsim.ray as cmr
    ray.init()
    index = cmr.RayIndex(128, actors=4, num_gpus=1)      # 4 actors of one GPU each
    index.add(documents)
    scores, ids = index.search(queries, k=10)

An actor that dies or raises is reported (``RuntimeError`` naming the shard, within ``timeout``
seconds), never waited on forever.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import ray

from . import _arrays, _documents, _ids, streaming
from ._ids import id_array
from .index import Index
from .search import _check_k
from .shards import (_host_filter, array_on, check_loaded, merge_top_k, read_manifest, saved_whole, shard_folder,
                     split_documents, write_manifest)


class _Shard:
    """One actor's shard: an Index on the actor's GPU (Ray sets its visible devices; with
    ``store="host"`` kept in the actor's host memory and streamed through that GPU) or CPU."""

    def __init__(self, dim, dtype, on_gpu, rescore, store="device", gpu_budget_bytes=streaming.DEFAULT_GPU_BUDGET):
        self.place = "cuda" if on_gpu else "cpu"  # (where it searches)
        self.home = "host" if store == "host" and on_gpu else self.place  # (where its documents live)
        self.budget = gpu_budget_bytes
        self.index = Index(dim, dtype=dtype, device=self.home, rescore=rescore, gpu_budget_bytes=gpu_budget_bytes)

    def write(self, folder):
        """A save's first half: the shard's arrays in their partial files (_files.Pending)."""
        self.pending = self.index._written(folder, False)
        return len(self.index)

    def commit(self, keep: bool):
        """The written save put in place (``keep``), or its partial files removed."""
        pending, self.pending = getattr(self, "pending", None), None
        if pending is not None:
            pending.commit() if keep else pending.discard()

    def load(self, folder, mmap):
        self.index = Index.load(folder, device=self.home, mmap=mmap, gpu_budget_bytes=self.budget)
        return self.index.ids

    def add(self, docs, ids, mask, number, first):
        self.before_add = (number, self.index._size())
        if ids.size:  # (host arrays from the driver, which checked the ids: the Index takes them to the actor's GPU)
            self.index._store(docs, ids, mask, first=first)
        return len(self.index)

    def undo_add(self, number):
        """The driver's add ``number`` undone (another actor's part failed), if this actor
        began it (an actor runs its calls in order: after that add)."""
        if getattr(self, "before_add", (None,))[0] == number:
            self.index._cut_to(self.before_add[1])

    def remove(self, ids):
        return self.index.remove(ids) if ids.size else 0

    def ids(self):
        return self.index.ids

    def nbytes(self):
        return self.index.nbytes

    def search(self, q, k, q_mask, filter, return_argmax):
        q, q_mask = array_on(q, self.place, "q"), None if q_mask is None else array_on(q_mask, self.place, "q_mask")
        results = self.index.search(q, k, q_mask=q_mask, filter=filter, return_argmax=return_argmax)
        return tuple(x.get() if hasattr(x, "get") else np.asarray(x) for x in results)


class RayIndex:
    """:class:`~cupy_maxsim.ShardedIndex`'s interface over ``actors`` Ray actors of ``num_gpus``
    GPUs each (0: CPU actors on the NumPy backend). ``store="host"``: a GPU actor keeps its
    documents in its host's memory and streams them through its GPU within
    ``gpu_budget_bytes`` (as ``Index(device="host")``): a corpus larger than the cluster's GPU
    memory. ``ray.init()`` first (or Ray starts a local cluster on first use)."""

    def __init__(self, dim: int, *, dtype: str = "float16", actors: int = 2, num_gpus: float = 0,
                 rescore: str | None = None, timeout: float | None = 600.0, store: str = "device",
                 gpu_budget_bytes: int = streaming.DEFAULT_GPU_BUDGET):
        if isinstance(actors, bool) or not isinstance(actors, (int, np.integer)) or actors < 1:
            raise ValueError(f"actors must be a positive int, got {actors!r}")
        if store not in ("device", "host"):
            raise ValueError(f"store must be 'device' or 'host', got {store!r}")
        streaming.checked_budget(gpu_budget_bytes)
        remote = ray.remote(num_gpus=num_gpus)(_Shard)
        self.dim, self.dtype, self.timeout, self.rescore = int(dim), dtype, timeout, rescore
        self.actors = [remote.remote(dim, dtype, num_gpus > 0, rescore, store, gpu_budget_bytes) for _ in range(actors)]
        self._next_id = 0
        self._adds = 0  # (adds sent: an actor undoes only the one that failed elsewhere)
        self._held = [np.zeros(0, np.int64) for _ in range(actors)]  # each actor's ids (driver's copy)

    def __len__(self) -> int:
        return int(sum(ids.shape[0] for ids in self._held))

    @property
    def ids(self) -> np.ndarray:
        return np.concatenate(self._held)

    @property
    def nbytes(self) -> int:
        return int(sum(self._gather([actor.nbytes.remote() for actor in self.actors])))

    def __repr__(self) -> str:
        return f"RayIndex(dim={self.dim}, dtype={self.dtype}, actors={len(self.actors)}, documents={len(self):,})"

    def add(self, docs, *, ids=None, mask=None) -> np.ndarray:
        new_ids = _ids.new_ids(ids, _documents.count(docs), self._next_id, self.ids)
        parts = list(split_documents(docs, mask, new_ids, len(self.actors)))
        self._adds += 1
        added = [actor.add.remote(_host_docs(part), part_ids, None if part_mask is None else np.asarray(part_mask),
                                  self._adds, first) for actor, (part, part_mask, part_ids, first) in zip(self.actors, parts)]
        try:
            self._gather(added)
        except BaseException:  # (every live actor back to where it was)
            undone = [actor.undo_add.remote(self._adds) for actor in self.actors]
            ray.wait(undone, num_returns=len(undone), timeout=self.timeout)
            for future in added:  # (the other actors' errors read, not logged as unhandled)
                try:
                    ray.get(future, timeout=0)
                except Exception:
                    pass
            raise
        self._held = [np.concatenate([held, part_ids]) for held, (_, _, part_ids, _) in zip(self._held, parts)]
        self._next_id = max(self._next_id, int(new_ids.max()) + 1 if new_ids.size else 0)
        return new_ids

    def remove(self, ids) -> int:
        wanted = id_array(ids, "ids")
        mine = [np.isin(wanted, held) for held in self._held]
        missing = ~np.logical_or.reduce(mine)
        if missing.any():
            raise ValueError(f"ids not in the index: {wanted[missing][:5].tolist()}")
        removed = self._gather([actor.remove.remote(wanted[m]) for actor, m in zip(self.actors, mine)])
        self._held = [held[~np.isin(held, wanted)] for held in self._held]
        return int(sum(removed))

    def search(self, q, k: int, *, q_mask=None, filter=None, return_argmax=False):
        """As :meth:`Index.search`; the query travels to every actor as a NumPy array, the
        results come back as NumPy arrays."""
        k = _check_k(k)
        host_q = _arrays.host_values(q)
        host_mask = None if q_mask is None else np.asarray(q_mask)
        allow = None if filter is None else _host_filter(filter, self)
        results = self._gather([actor.search.remote(host_q, k, host_mask, allow, return_argmax)
                                for actor in self.actors])
        return merge_top_k(results, k)

    def save(self, path) -> Path:
        """Write each actor's shard (on a file system every actor and the driver share) as
        ShardedIndex.save lays a sharded index out: either class loads it."""
        folder = saved_whole(
            path, lambda folder: self._gather([actor.write.remote(str(folder / shard_folder(n)))
                                               for n, actor in enumerate(self.actors)]),
            lambda: self._gather([actor.commit.remote(True) for actor in self.actors]),
            lambda: ray.wait([actor.commit.remote(False) for actor in self.actors], num_returns=len(self.actors),
                             timeout=self.timeout))
        return write_manifest(folder, self.dim, self.dtype, self.rescore, len(self.actors), len(self), self._next_id)

    @classmethod
    def load(cls, path, *, num_gpus: float = 0, store: str = "device", mmap: bool = True, timeout: float | None = 600.0,
             gpu_budget_bytes: int = streaming.DEFAULT_GPU_BUDGET) -> "RayIndex":
        """A sharded index saved by :meth:`save` or ShardedIndex.save, an actor a shard (each
        loads its own shard's files: a file system they share)."""
        folder = Path(path)
        manifest = read_manifest(folder)
        index = cls(manifest["dim"], dtype=manifest["dtype"], actors=manifest["shards"], num_gpus=num_gpus,
                    rescore=manifest.get("rescore"), timeout=timeout, store=store, gpu_budget_bytes=gpu_budget_bytes)
        index._held = index._gather([actor.load.remote(str(folder / shard_folder(n)), mmap)
                                     for n, actor in enumerate(index.actors)])
        index._next_id = int(manifest["next_id"])
        check_loaded(folder, manifest, len(index))
        return index

    def _gather(self, futures):
        """ray.get of one future per actor, each failure reported with its shard."""
        out = []
        for shard, future in enumerate(futures):
            try:
                out.append(ray.get(future, timeout=self.timeout))
            except ray.exceptions.GetTimeoutError:
                raise RuntimeError(f"shard {shard}'s Ray actor did not answer within {self.timeout} s") from None
            except ray.exceptions.RayActorError as error:
                raise RuntimeError(f"shard {shard}'s Ray actor died: {error}") from error
            except ray.exceptions.RayTaskError as error:
                raise error.as_instanceof_cause() from None  # the shard's own error (e.g. a ValueError)
        return out


def _host_docs(docs):
    """What add() was given, as host arrays (Ray ships them to the actor)."""

    if isinstance(docs, tuple) and len(docs) == 2:
        return (_arrays.to_host(_arrays.as_operand(docs[0], "docs")), np.asarray(docs[1]))
    if isinstance(docs, list):
        return [_arrays.host_values(x) for x in docs]
    return _arrays.host_values(docs)
