"""An exact multi-vector index: a corpus built once, grown, shrunk, searched and reloaded.

The documents live packed (tokens back to back, int64 offsets) in one store on one device, in
the format chosen at build (float32, float16, or int8 with per-token scales); each has an int64
id, given or assigned, stable forever. ``remove`` marks documents dead (a tombstone) and
compacts the store once dead tokens outnumber live ones; ``search`` never returns a dead or
filtered-out document. ``save`` writes a directory of plain ``.npy`` files and a JSON manifest
(no pickle); ``Index.load`` memory-maps them.

    index = cupy_maxsim.Index(128, dtype="float16", device="cuda")
    index.add(list_of_documents)                      # ids 0..n-1
    scores, ids = index.search(queries, k=10)
    index.remove([3, 17]); index.save("corpus.idx")
    index = cupy_maxsim.Index.load("corpus.idx", device="cuda")
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np

from . import _arrays, _documents, _files, _ids, _replay, _rescore, quantize, scoring, search as _search, streaming
from ._ids import id_array, new_ids
from ._problem import packed_problem

#: Storage formats, by dtype name (bfloat16 held as its bits, uint16: NumPy and CuPy lack it).
FORMATS = ("float32", "float16", "bfloat16", "int8")
MANIFEST = _files.INDEX_MANIFEST
#: Every array a saved index may hold (a save removes those it does not write).
ARRAYS = ("tokens", "offsets", "ids", "scales", "exact")
FORMAT_NAME = "cupy-maxsim-index"
VERSION = 1


#: Query dtypes any index takes (cast to the stored format); an int8 index takes int8 ones too.
_FLOAT_QUERIES = ("float16", "bfloat16", "float32", "float64")


class Index:
    """An exact MaxSim index of documents of ``dim``-wide token embeddings.

    Parameters
    ----------
    dim : int
        Embedding width of every token.
    dtype : {"float32", "float16", "bfloat16", "int8"}
        The stored format (int8: per-token scales, as :func:`cupy_maxsim.quantize_int8`).
    device : "cpu", "cuda", "cuda:N" or "host"
        Where the store lives: NumPy arrays on the host, CuPy arrays on GPU N; "host": on the
        host, searched on a GPU (the queries', else the current one) by streaming it through
        buffers of at most ``gpu_budget_bytes`` in all (:mod:`cupy_maxsim.streaming`; on a
        machine without one, on the CPU the same way). ``last_search`` reports what it did.
    rescore : {None, "float16", "float32"}
        Also keep a host copy of the documents in this format, and rescore each search's
        shortlist from it exactly (an int8 index then ranks as the copy's format does).
    """

    def __init__(self, dim: int, *, dtype: str = "float16", device: str = "cpu", rescore: str | None = None,
                 gpu_budget_bytes: int = streaming.DEFAULT_GPU_BUDGET):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if dtype not in FORMATS:
            raise ValueError(f"dtype must be one of {FORMATS}, got {dtype!r}")
        if rescore not in (None, "float16", "float32"):
            raise ValueError(f"rescore must be None, 'float16' or 'float32', got {rescore!r}")
        self.rescore = rescore
        self._exact = None if rescore is None else np.zeros((0, int(dim)), dtype=rescore)  # host
        self.dim, self.dtype = int(dim), dtype
        self._streamed, self.last_search = device == "host", None
        self.gpu_budget_bytes = streaming.checked_budget(gpu_budget_bytes)
        self._gpu = None if self._streamed else _arrays.parse_device(device)
        if self._gpu is not None:  # (a host store's searches find CuPy when they stream)
            _arrays.require_cupy(f"Index(device={device!r})")
        xp = self._xp
        with self._on_device():
            self._tokens = xp.zeros((0, self.dim), dtype={"int8": np.int8, "bfloat16": np.uint16}.get(dtype, dtype))
            self._scales = xp.zeros((0,), dtype=np.float32) if dtype == "int8" else None
            self._offsets = xp.zeros((1,), dtype=np.int64)
        self._ids = np.zeros((0,), dtype=np.int64)  # host: the id of each stored document
        self._device_ids = None  # (the _ids they copy, on the store's device): _ids_on_device
        self._id_view = None  # (the _ids it orders, _ids.sorted_view of them): _sorted_ids
        self._offsets_cache = self._allowed_cache = (None,)  # per store version: _host_offsets, _allowed_on_device
        self._replays = _replay.IndexReplays()  # per store version: recorded forwards and searches
        self._alive = np.zeros((0,), dtype=bool)
        self._next_id = 0

    # ---- what it holds ------------------------------------------------------------------

    @property
    def device(self) -> str:
        return "host" if self._streamed else "cpu" if self._gpu is None else f"cuda:{self._gpu}"

    @property
    def ids(self) -> np.ndarray:
        """The ids of the live documents, in storage order (a copy)."""
        return self._ids[self._alive]

    def __len__(self) -> int:
        return int(self._alive.sum())

    @property
    def nbytes(self) -> int:
        """Bytes of the store (tokens, scales, offsets, ids)."""
        parts = [self._tokens, self._offsets, self._ids, self._alive, self._scales, self._exact]
        return int(sum(p.nbytes for p in parts if p is not None))

    def __repr__(self) -> str:
        tokens = int(self._offsets[-1])
        size = self.nbytes
        size = f"{size / 1e9:,.2f} GB" if size >= 1e9 else f"{size / 1e6:,.1f} MB" if size >= 1e6 else f"{size:,} bytes"
        return (f"Index(dim={self.dim}, dtype={self.dtype}, device={self.device}, documents={len(self):,}, "
                f"tokens={tokens:,}, removed={int((~self._alive).sum()):,}, {size})")

    # ---- building -------------------------------------------------------------------------

    def add(self, docs, *, ids=None, mask=None, progress: bool = False, batch_docs: int = 8192,
            copy: bool | None = True) -> np.ndarray:
        """Add documents: a list of (Ld_i, dim) arrays, a padded (Nd, Ld, dim) array with an
        optional (Nd, Ld) mask, or a (tokens (T, dim), offsets (Nd + 1,)) pair. ``ids``: one
        int64 per document, none already in the index; default the next free ones. Returns the
        ids added. Documents on the host or any GPU go to the index's device, converted
        ``batch_docs`` at a time (the conversion's temporaries stay that size), with a progress
        bar where ``progress`` (tqdm, if installed); the index changes only once every batch is
        converted.

        ``copy``: True, the store copies the documents (always). None: an empty store keeps the
        tokens of a ``(tokens, offsets)`` pair as they are where they are already its format
        (float16 or float32, not int8), C-contiguous and on its device, and it rescores nothing
        (a corpus as large as the memory it lives in is then held once; it must not be changed
        afterwards), else copies them. False: as None, but a ValueError where it would copy."""
        _documents.check_copy(copy)
        return self._store(docs, self._new_ids(ids, _documents.count(docs)), mask, progress, batch_docs, copy)

    def _store(self, docs, new_ids: np.ndarray, mask=None, progress: bool = False, batch_docs: int = 8192,
               copy: bool | None = True, first: int = 0) -> np.ndarray:
        """add() of ids checked already (a sharded add checks them once for every shard);
        ``first``: where ``docs[0]`` is in what the caller was given (errors name documents so)."""
        count = new_ids.shape[0]
        if isinstance(docs, tuple) and len(docs) == 2:  # the offsets on the host once, for every batch
            docs = (docs[0], _arrays.to_host(_arrays.as_operand(docs[1], "offsets")).astype(np.int64))
            _documents.check_offsets(docs[1], _arrays.as_operand(docs[0], "docs").shape[0])  # (whole: batches see slices)
        if copy is not True:
            refused = self._copy_needed(docs, mask)
            if refused is None:
                return self._adopt(docs, new_ids)
            if copy is False:
                raise ValueError(f"add(copy=False) would have to copy the documents: {refused}")
        if count == 0:
            return new_ids
        # The new store is taken once at its final size and each converted batch written into
        # it: at most the old store, the new one and a batch at once (not the converted
        # documents twice, as joining converted parts would).
        top = int(self._host_offsets()[0][-1])
        total = top + _documents.token_count(docs, mask)
        xp = self._xp
        with self._on_device():  # (module, new store) of the tokens, scales and exact copy
            stores = [(module, _documents.grown(module, old, total)) for module, old in
                      ((xp, self._tokens), (xp, self._scales), (np, self._exact)) if old is not None]
        offsets, at = [], top
        for start in _files.progress(range(0, count, batch_docs), -(-count // batch_docs), "adding", progress):
            tokens, batch_offsets = _documents.packed(_documents.sliced(docs, start, start + batch_docs),
                                                      None if mask is None else mask[start:start + batch_docs], self.dim,
                                                      first + start)
            if at + int(batch_offsets[-1]) > total:
                raise ValueError("docs hold more tokens than they did when add() began counting them")
            with self._on_device():
                parts = [part for part in _documents.converted(tokens, self.dtype, None if self._exact is None
                                                               else self.rescore, self._gpu) if part is not None]
                for (module, store), part in zip(stores, parts):
                    _arrays.copy_rows(module, store, at, part)
            offsets.append(batch_offsets[1:] + at)
            at += int(batch_offsets[-1])
        if at != total:
            raise ValueError("docs hold fewer tokens than they did when add() began counting them")
        with self._on_device():
            self._offsets = _arrays.concatenated(xp, [self._offsets, xp.asarray(np.concatenate(offsets))])
        stores = iter(store for _, store in stores)
        self._tokens = next(stores)
        self._scales = None if self._scales is None else next(stores)
        self._exact = None if self._exact is None else next(stores)
        return self._added(new_ids)

    def _size(self) -> tuple[int, int, int]:
        """(documents stored, live or removed; tokens stored; the next free id): what
        :meth:`_cut_to` returns the store to."""
        return self._ids.shape[0], int(self._host_offsets()[0][-1]), self._next_id

    def _cut_to(self, size: tuple[int, int, int]) -> None:
        """Undo the adds made since :meth:`_size` gave ``size`` (no remove between): a sharded
        add that failed or was interrupted in one shard leaves every shard as it was. An add
        only appends, so the store's first rows are the old store (views of them here)."""
        documents, tokens, self._next_id = size
        self._tokens, self._scales, self._exact = (None if x is None else x[:tokens] for x in
                                                   (self._tokens, self._scales, self._exact))
        self._offsets, self._ids, self._alive = self._offsets[:documents + 1], self._ids[:documents], self._alive[:documents]

    def _added(self, new_ids: np.ndarray) -> np.ndarray:
        """The ids of documents just stored, recorded; returned."""
        self._ids = np.concatenate([self._ids, new_ids])
        self._alive = np.concatenate([self._alive, np.ones(new_ids.shape[0], bool)])
        self._next_id = max(self._next_id, int(new_ids.max()) + 1 if new_ids.size else 0)
        return new_ids

    def _copy_needed(self, docs, mask) -> str | None:
        """Why add(copy=None) must copy ``docs`` into the store; None where it can keep them."""
        if self._ids.shape[0]:
            return "the index holds documents already (only an empty one keeps them as they are)"
        if self.dtype == "int8" or self._exact is not None:
            return "an int8 index stores quantised tokens, and one that rescores a copy of them"
        return _documents.why_copied(docs, self.dtype, self._gpu, self.device)

    def _adopt(self, docs, new_ids: np.ndarray) -> np.ndarray:
        """add() of an empty store that keeps a (tokens, offsets) pair's tokens as they are."""
        operand, offsets = _documents.packed(docs, None, self.dim)
        with self._on_device():
            self._tokens = operand.host if not operand.on_gpu else operand.cupy()
            self._offsets = self._xp.asarray(offsets)
        return self._added(new_ids)

    def remove(self, ids) -> int:
        """Remove the documents of ``ids`` (each must be in the index); returns how many. The
        store is compacted once removed tokens outnumber live ones."""
        wanted = _ids.sorted_unique(id_array(ids, "ids"))  # (an id given twice is removed once)
        rows = self._rows_of(wanted, "ids")
        self._alive = self._alive.copy()  # (a new version: _allowed_on_device caches by identity)
        self._alive[rows] = False
        lengths = np.diff(self._host_offsets()[0])
        if lengths[~self._alive].sum() > lengths[self._alive].sum():
            try:
                self.compact()
            except MemoryError:  # (CuPy's OutOfMemoryError too: the documents are removed all the same)
                warnings.warn("Index.remove: no memory to compact the store now (it holds a copy of the live "
                              "documents); the removed ones stay as tombstones until compact()", RuntimeWarning,
                              stacklevel=2)
        return int(rows.shape[0])

    def compact(self) -> None:
        """Drop removed documents from the store (ids stay as they were)."""
        if self._alive.all():
            return
        offsets = _arrays.to_host(self._offsets)
        keep = np.flatnonzero(self._alive)
        lengths = np.diff(offsets)[keep]
        token_rows = _documents.token_rows(offsets, keep)
        with self._on_device():  # (every new array made before any is kept: memory running out midway changes nothing)
            xp = self._xp
            rows = xp.asarray(token_rows)
            tokens, scales = self._tokens[rows], None if self._scales is None else self._scales[rows]
            offsets = xp.asarray(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        exact = None if self._exact is None else self._exact[token_rows]
        self._tokens, self._scales, self._offsets, self._exact = tokens, scales, offsets, exact
        self._ids, self._alive = self._ids[keep], np.ones(keep.shape[0], bool)

    # ---- searching ------------------------------------------------------------------------

    def search(self, q, k: int, *, q_mask=None, q_scale=None, filter=None, return_argmax=False, shortlist=None,
               workspace_bytes=_search.WORKSPACE_BYTES):
        """The k best live documents for each query: ``(scores, ids)`` (and the winners with
        ``return_argmax``), as :func:`cupy_maxsim.search` orders them, ids the index's own (-1
        past what there is; ties to the lower id). ``filter``: an allow-list of
        ids, or a boolean array over :attr:`ids` (True: may be returned). Results in the
        framework of ``q``; ``q`` lives on the index's device. An int8 index quantises float
        queries (once a call); int8 queries come with their ``q_scale``. An index that
        rescores takes the ``shortlist`` best (default max(4k, k + 16), at most the documents
        stored, at least k) from its store and ranks them by exact scores from its host copy."""
        k = _search._check_k(k)
        if self._sorted_ids()[0] is not None:  # (ids out of storage order: the rows' ties are not the ids')
            given = None if shortlist is None else _rescore.shortlist_depth(k, shortlist, self._ids.shape[0])
            return _search.ties_to_lower_ids(lambda depth: self._ranked(
                q, depth, q_mask, q_scale, filter, return_argmax, given and max(given, depth), workspace_bytes),
                k, self._ids.shape[0], _arrays.as_operand(q, "q"))
        return self._ranked(q, k, q_mask, q_scale, filter, return_argmax, shortlist, workspace_bytes)

    def _ranked(self, q, k, q_mask, q_scale, filter, return_argmax, shortlist, workspace_bytes):
        """search() with ties to the lower storage row."""
        if self._exact is None:
            return self._search(q, k, q_mask, q_scale, filter, return_argmax, workspace_bytes)
        if q_scale is not None or _arrays.as_operand(q, "q").dtype == "int8":
            raise ValueError("an index that rescores takes float queries (it rescores them exactly), not int8 ones")
        depth = _rescore.shortlist_depth(k, shortlist, self._ids.shape[0])
        like, _, rows = self._search(q, depth, q_mask, None, filter, False, workspace_bytes, rows=True)
        return _rescore.rescored(self, q, q_mask, rows, k, return_argmax, like)

    def _search(self, q, k, q_mask, q_scale, filter, return_argmax, workspace_bytes, rows=False):
        """search() from the store; ``rows``: (like, scores, storage rows), unwrapped. A GPU
        store's search of a repeated signature is replayed (_replay.SearchReplay)."""
        replays = self._replays.of(self._tokens, self._scales, self._offsets, self._alive, self._ids)
        replayable = filter is None and q_scale is None and not (return_argmax or rows or self._streamed)
        found, key, recorder = replays.searched(q, q_mask, k, workspace_bytes) if replayable else (None,) * 3
        if found is not None:
            return found
        # (read, never written: _alive is replaced by remove(), not changed in place)
        allowed = self._alive if filter is None else self._alive & self._filter_rows(filter)
        scales = {} if q_scale is None else {"q_scale": q_scale}
        q_operand = _arrays.as_operand(q, "q")
        if q_operand.ndim not in (2, 3) or q_operand.shape[-1] != self.dim:
            raise ValueError(f"q must have shape (Lq, {self.dim}) or (Nq, Lq, {self.dim}) (the index's dim), "
                             f"got shape {q_operand.shape}")
        q_dtype = q_operand.dtype
        if q_dtype not in _FLOAT_QUERIES + (("int8",) if self._scales is not None else ()):
            raise TypeError(f"q must have dtype {', '.join(_FLOAT_QUERIES)}{' or int8' * (self._scales is not None)} "
                            f"(the index stores {self.dtype}), got {q_dtype}")
        if self._scales is None and q_dtype != self.dtype:  # queries (small) cast to the stored format
            q, recorder = _arrays.cast(q, self.dtype), None  # (a replay would skip the cast)
        if self._scales is not None:  # float queries quantised once, not once per block
            if q_dtype != "int8":
                q, q_scale = (quantize.quantize_int8(q, mask=q_mask) if recorder is None
                              else recorder.quantized(q, q_mask))
                scales["q_scale"] = q_scale
            scales["d_scale"] = self._scales
        if self._streamed:
            return self._answered(*streaming.top_k(self, q, q_mask, scales, k, return_argmax, workspace_bytes,
                                                   allowed, self.gpu_budget_bytes, streaming.copies_for(q, self)), rows)
        host_offsets, longest = self._host_offsets()
        tokens = self._tokens if self.dtype != "bfloat16" else _arrays.bfloat16_view(self._tokens, "tokens")
        problem, _ = packed_problem(q, tokens, self._offsets, q_mask, scales.get("q_scale"),
                                    scales.get("d_scale"), return_argmax, (0, int(host_offsets[-1]), longest))
        allowed_device = self._allowed_on_device() if filter is None else self._to_store_device(allowed)
        extras = (q_mask, None, scales.get("q_scale"), scales.get("d_scale"))

        def block(start, stop):  # (its offsets are the store's: checked when they were stored)
            if (start, stop) == (0, problem.num_docs):  # (every document: the problem above, not validated again)
                return self._forward(problem, q, extras, replays.forwards)
            return scoring.score_packed_with_bounds(
                q, tokens, self._offsets[start:stop + 1], q_mask, scales.get("q_scale"), scales.get("d_scale"),
                return_argmax, (int(host_offsets[start]), int(host_offsets[stop]), longest))[0]

        ids = None if rows else self._ids_on_device()  # (search answers with them: no mapping after)
        results = _search._top_k(problem, block, k, workspace_bytes, allowed_device, ids=ids,
                                 tape=None if recorder is None else recorder.selection)
        if recorder is not None:
            replays.settle(key, recorder, problem, q, extras)
        return self._answered(problem, results, rows, mapped=not rows)

    def _forward(self, problem, q, extras, recorded: dict):
        """The scores (and winners) of ``problem``, one block of every stored document; on a GPU
        replayed from this store version's ``recorded`` forwards where the query's signature
        repeats (_replay.run_recorded). ``extras``: (q_mask, None, q_scale, d_scale)."""
        if not problem.q.on_gpu:
            return scoring.score_problem(problem)
        return _replay.run_recorded(recorded, problem, q, self._tokens, extras)

    def _answered(self, problem, results, rows, mapped=False):
        """search's results with storage rows mapped to the index's ids (``mapped``: search
        answered with them), on the device of the results; ``rows``: (like, scores, storage
        rows) instead."""
        if rows:
            return problem.like, results[0], _arrays.to_host(_arrays.as_operand(results[1], "rows"))
        if mapped:
            return results
        operand = _arrays.as_operand(results[1], "ids")
        with _search._gpu_stream(problem.like):
            local = operand.host if not operand.on_gpu else operand.cupy()
            xp = _arrays.module_of(operand)
            # (a host-streamed store's ids go to the queries' GPU per call)
            store_ids = self._ids_on_device() if xp is self._xp else xp.asarray(self._ids_on_device())
            mapped = _search.mapped_ids(xp, local, store_ids)
        return (results[0], _arrays.Output(problem.like).wrap(mapped)) + tuple(results[2:])

    def _host_offsets(self):
        """(the store's offsets on the host, its longest document), read back once per store
        version (_offsets is replaced, never changed in place), not once per search."""
        if self._offsets_cache[0] is not self._offsets:
            offsets = _arrays.to_host(self._offsets)
            longest = int(np.diff(offsets).max()) if offsets.shape[0] > 1 else 0
            self._offsets_cache = (self._offsets, offsets, longest)
        return self._offsets_cache[1:]

    def _allowed_on_device(self):
        """The live documents as search's ``allowed`` on the store's device, once per version
        of _alive (replaced by remove(), never changed in place); None while every stored
        document is live (nothing to exclude: search skips the exclusion's sort)."""
        if self._allowed_cache[0] is not self._alive:
            self._allowed_cache = (self._alive, None if self._alive.all() else self._to_store_device(self._alive))
        return self._allowed_cache[1]

    def _to_store_device(self, array):
        with self._on_device():
            return self._xp.asarray(array)

    def _ids_on_device(self):
        """The ids on the store's device, copied once per version (_ids is replaced, never
        changed in place); an empty store gets one -1, so that the gather stays in bounds."""
        if self._device_ids is None or self._device_ids[0] is not self._ids:
            with self._on_device():
                self._device_ids = (self._ids, self._xp.asarray(self._ids if self._ids.size else np.full(1, -1)))
        return self._device_ids[1]

    # ---- files ------------------------------------------------------------------------------

    def save(self, path, *, progress: bool = False) -> Path:
        """Write the index to directory ``path`` (created; removed documents compacted away
        first): tokens.npy, offsets.npy, ids.npy (and scales.npy for int8, exact.npy when it
        rescores), manifest.json last (a folder without it is no index). Each array goes to a
        file of its own, renamed over the old one (_files.py): a save stopped midway leaves the
        old index or none, and an index loaded from ``path`` may be saved back into it."""
        return self._written(path, progress).commit()

    def _written(self, path, progress: bool) -> _files.Pending:
        """save() up to its commit: the arrays in their partial files (a sharded save writes
        every shard's before it commits any)."""
        self.compact()
        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {"tokens": self._tokens, "offsets": self._offsets, "ids": self._ids}
        arrays.update({name: x for name, x in (("scales", self._scales), ("exact", self._exact)) if x is not None})
        partial = _files.write_arrays(folder, arrays, progress)
        manifest = {"format": FORMAT_NAME, "version": VERSION, "dim": self.dim, "dtype": self.dtype, "rescore": self.rescore,
                    "documents": len(self), "tokens": int(self._offsets[-1]), "next_id": self._next_id,
                    "files": sorted(f"{name}.npy" for name in arrays)}
        return _files.Pending(folder, MANIFEST, partial, ARRAYS, manifest)

    @classmethod
    def load(cls, path, *, device: str = "cpu", mmap: bool = True, progress: bool = False,
             gpu_budget_bytes: int = streaming.DEFAULT_GPU_BUDGET) -> "Index":
        """An index saved by :meth:`save`. On the CPU (and the host, ``device="host"``, whose
        searches stream it through a GPU within ``gpu_budget_bytes``) with ``mmap`` the arrays
        are memory-mapped (read-only, nothing copied in Python); on a GPU they are copied to it
        once."""
        folder = Path(path)
        manifest = _files.read_manifest(folder, MANIFEST, FORMAT_NAME, VERSION)
        index = cls(manifest["dim"], dtype=manifest["dtype"], device=device, rescore=manifest.get("rescore"),
                    gpu_budget_bytes=gpu_budget_bytes)
        # Every file memory-mapped, then (on a GPU, or without mmap) copied a chunk at a time.
        stored = ["tokens", "offsets"] + (["scales"] if manifest["dtype"] == "int8" else [])
        host = (["exact"] if index.rescore is not None else []) + ["ids"]
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in stored + host}
        for xp, names in ((index._xp, stored), (np, host)):
            if xp is not np or not mmap:
                with index._on_device():
                    arrays.update(_files.copied(xp, {name: arrays[name] for name in names}, progress))
        index._tokens, index._offsets, index._scales = arrays["tokens"], arrays["offsets"], arrays.get("scales")
        index._exact = arrays.get("exact")  # (host)
        index._ids = np.asarray(arrays["ids"])
        index._alive = np.ones(index._ids.shape[0], bool)
        index._next_id = int(manifest["next_id"])
        if index._tokens.shape != (manifest["tokens"], manifest["dim"]) or index._ids.shape[0] != manifest["documents"]:
            raise ValueError(f"{folder}: the arrays do not match {MANIFEST} (a partial write?)")
        return index

    # ---- internals --------------------------------------------------------------------------

    @property
    def _xp(self):
        if self._gpu is None:
            return np
        import cupy

        return cupy

    def _on_device(self):
        if self._gpu is None:
            return contextlib.nullcontext()
        import cupy

        return cupy.cuda.Device(self._gpu)

    def _new_ids(self, ids, count: int) -> np.ndarray:
        # (a removed id may come again before compact(): find() takes an id's last row, the live one)
        return new_ids(ids, count, self._next_id, self.ids)

    def _rows_of(self, ids: np.ndarray, name: str) -> np.ndarray:
        """Storage rows of live ``ids``; ValueError naming any that is not in the index."""
        rows, found = _ids.find(self._sorted_ids(), ids)
        if self._alive.size:
            found &= self._alive[rows]
        if not found.all():
            raise ValueError(f"{name} not in the index: {ids[~found][:5].tolist()}")
        return rows

    def _sorted_ids(self):
        """_ids.sorted_view of the ids, taken once per version (_ids is replaced, never changed)."""
        if self._id_view is None or self._id_view[0] is not self._ids:
            self._id_view = (self._ids, _ids.sorted_view(self._ids))
        return self._id_view[1]

    def _filter_rows(self, filter) -> np.ndarray:
        """A boolean array over storage rows: True where ``filter`` allows the document."""
        if isinstance(filter, (list, tuple, range)):
            filter = np.asarray(filter)  # (a list of bools is a mask, not ids 0 and 1)
        operand = _arrays.as_operand(filter, "filter")
        values = _arrays.to_host(operand)
        if operand.dtype == "bool":
            if values.shape != (len(self),):
                raise ValueError(f"filter as a boolean array must be shaped like index.ids ({len(self)},), "
                                 f"got {values.shape}")
            allowed = np.zeros(self._ids.shape[0], bool)
            allowed[np.flatnonzero(self._alive)[values]] = True
            return allowed
        rows, found = _ids.find(self._sorted_ids(), id_array(values, "filter"))
        allowed = np.zeros(self._ids.shape[0], bool)
        allowed[rows[found]] = True
        return allowed
