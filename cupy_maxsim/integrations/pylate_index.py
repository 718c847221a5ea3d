"""A PyLate end-to-end index on :class:`cupy_maxsim.Index`: exact MaxSim retrieval for
``pylate.retrieve.ColBERT`` (which hands an end-to-end index the queries and returns what it
answers), where PLAID and its relatives are approximate.

    from pylate import retrieve
    from cupy_maxsim.integrations.pylate_index import ExactIndex
    index = ExactIndex(dim=128, device="cuda")
    index.add_documents(documents_ids, model.encode(documents, is_query=False))
    results = retrieve.ColBERT(index=index).retrieve(model.encode(queries, is_query=True), k=10)

Document ids are PyLate's (strings, or anything hashable); the store keeps its own int64 ids
beside them. ``subset`` restricts the search inside it: one list of ids for every query, or a
list per query. ``index.save(folder)`` / ``ExactIndex.load(folder, device=...)`` keep it (the
store as cupy_maxsim.Index saves it, memory-mapped on load, and the PyLate ids in JSON).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from pylate.indexes.base import Base

from .. import _files
from ..index import Index

#: The PyLate ids of a saved ExactIndex's documents, beside the store's files.
NAMES = "pylate_ids.json"


class ExactIndex(Base):
    """Exact MaxSim over every document (no candidate generation), ranked as
    :meth:`cupy_maxsim.Index.search` ranks: by score, ties to the document added first."""

    is_end_to_end_index = True

    def __init__(self, name: str | None = "colbert_collection", recreate: bool = False, *, dim: int,
                 dtype: str = "float16", device: str = "cpu", rescore: str | None = None):
        self.name = name
        self.index = Index(dim, dtype=dtype, device=device, rescore=rescore)
        self._key = {}  # PyLate id -> the store's int64 id
        self._name = []  # the store's id -> PyLate id

    def add_documents(self, documents_ids, documents_embeddings, batch_size: int = 2000, **kwargs) -> "ExactIndex":
        """Add documents: PyLate ids and their (L_i, dim) embeddings (``model.encode(...,
        is_query=False)``); an id already there is refused."""
        documents_ids = list(documents_ids)
        if len(documents_ids) != len(documents_embeddings):
            raise ValueError(f"documents_ids and documents_embeddings differ in length: {len(documents_ids)} and "
                             f"{len(documents_embeddings)}")
        taken = [doc for doc in documents_ids if doc in self._key]
        if taken or len(set(documents_ids)) != len(documents_ids):
            raise ValueError(f"documents_ids must be new and unique, got {taken[:5] or 'repeats'}")
        first, size = len(self._name), self.index._size()
        try:  # (a batch that fails undoes the batches before it: names and store stay together)
            for start in range(0, len(documents_ids), batch_size):
                batch = [self._device_rows(x) for x in documents_embeddings[start:start + batch_size]]
                self.index.add(batch, ids=np.arange(first + start, first + start + len(batch), dtype=np.int64))
        except BaseException:
            self.index._cut_to(size)
            raise
        self._name.extend(documents_ids)
        self._key.update({doc: first + n for n, doc in enumerate(documents_ids)})
        return self

    def remove_documents(self, documents_ids) -> "ExactIndex":
        """Remove documents by PyLate id; every id must be in the index (checked before any is
        removed: a missing one leaves the index as it was)."""
        documents_ids = list(documents_ids)
        missing = [doc for doc in documents_ids if doc not in self._key]
        if missing or len(set(documents_ids)) != len(documents_ids):
            raise ValueError(f"documents_ids must be in the index, each once, got {missing[:5] or 'repeats'}")
        self.index.remove(np.array([self._key[doc] for doc in documents_ids], dtype=np.int64))
        for doc in documents_ids:
            del self._key[doc]
        return self

    def __call__(self, queries_embeddings, k: int = 10, subset=None, **kwargs) -> list[list[dict]]:
        """For each query (a list of (L_i, dim) arrays, or a padded (Nq, L, dim) / one (L, dim)),
        its k best documents as PyLate's ``RerankResult``s: ``{"id": ..., "score": ...}``."""
        queries, mask = self._queries(queries_embeddings)
        if subset is not None and len(subset) and isinstance(subset[0], (list, tuple, np.ndarray)):
            if len(subset) != queries.shape[0]:
                raise ValueError(f"subset has {len(subset)} lists for {queries.shape[0]} queries")
            hits = [self._search(queries[n:n + 1], mask[n:n + 1], k, subset[n]) for n in range(queries.shape[0])]
            return [h[0] for h in hits]
        return self._search(queries, mask, k, subset)

    def get_documents_embeddings(self, documents_ids):
        """The stored embeddings (the store's format, on the host) of each list of ids."""
        offsets, tokens = _host(self.index._offsets), self.index._tokens
        groups = [list(group) for group in documents_ids]
        missing = [doc for group in groups for doc in group if doc not in self._key]
        if missing:
            raise ValueError(f"documents_ids must be in the index, got {missing[:5]}")
        # (the store's rows of every id at once: not a dict of every stored id a call)
        rows = self.index._rows_of(np.array([self._key[doc] for group in groups for doc in group], np.int64),
                                   "documents_ids").tolist()
        out, at = [], 0
        for group in groups:
            out.append([_host(tokens[offsets[n]:offsets[n + 1]]) for n in rows[at:at + len(group)]])
            at += len(group)
        return out

    def save(self, path) -> Path:
        """The store as :meth:`cupy_maxsim.Index.save` writes it, and the PyLate ids of its
        documents (``pylate_ids.json``, after it: strings or integers) in folder ``path``."""
        live = self.index.ids.tolist()
        names = [self._name[i] for i in live]
        if not all(isinstance(name, (str, int)) and not isinstance(name, bool) for name in names):
            raise ValueError("only string or integer PyLate ids can be saved (JSON)")
        folder = self.index.save(path)
        _files.write_json(folder / NAMES, {"name": self.name, "ids": live, "names": names})
        return folder

    @classmethod
    def load(cls, path, *, device: str = "cpu", mmap: bool = True) -> "ExactIndex":
        """An ExactIndex saved by :meth:`save` (its store memory-mapped on the CPU with ``mmap``,
        else copied to ``device``)."""
        folder = Path(path)
        index = Index.load(folder, device=device, mmap=mmap)
        try:
            saved = json.loads((folder / NAMES).read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"{folder} holds no {NAMES}: not a saved ExactIndex") from None
        if saved["ids"] != index.ids.tolist():
            raise ValueError(f"{folder / NAMES} does not name the saved store's documents (a partial write?)")
        out = cls.__new__(cls)
        out.name, out.index = saved["name"], index
        out._name = [None] * max([index._next_id] + [i + 1 for i in saved["ids"]])
        for i, name in zip(saved["ids"], saved["names"]):
            out._name[i] = name
        out._key = dict(zip(saved["names"], saved["ids"]))
        return out

    # ---- internals --------------------------------------------------------------------------

    def _search(self, queries, mask, k, subset):
        allowed = None if subset is None else np.array([self._key[doc] for doc in subset if doc in self._key], np.int64)
        scores, ids = self.index.search(queries, k, q_mask=mask, filter=allowed)
        scores, ids = _host(scores), _host(ids)
        return [[{"id": self._name[i], "score": float(s)} for s, i in zip(row_scores, row_ids) if i >= 0]
                for row_scores, row_ids in zip(scores, ids)]

    def _device_rows(self, x):
        """One document's rows on the store's device (PyLate hands NumPy arrays or tensors)."""
        x = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
        if self.index.device == "cpu":
            return x.cpu().numpy() if x.dtype != torch.bfloat16 else x.float().cpu().numpy()
        return x.to(self.index.device)

    def _queries(self, queries_embeddings):
        """(Nq, L, dim) on the store's device and its (Nq, L) mask: lists padded, padding masked."""
        if isinstance(queries_embeddings, (np.ndarray, torch.Tensor)) and queries_embeddings.ndim in (2, 3):
            items = [queries_embeddings] if queries_embeddings.ndim == 2 else list(queries_embeddings)
        else:
            items = list(queries_embeddings)
        items = [self._device_rows(x) for x in items]
        longest = max(x.shape[0] for x in items)
        xp = np if self.index.device == "cpu" else torch
        if xp is np:
            out = np.zeros((len(items), longest, items[0].shape[-1]), items[0].dtype)
        else:
            out = items[0].new_zeros((len(items), longest, items[0].shape[-1]))
        mask = np.zeros((len(items), longest), bool)
        for n, x in enumerate(items):
            out[n, :x.shape[0]] = x
            mask[n, :x.shape[0]] = True
        return out, mask if xp is np else torch.from_numpy(mask).to(out.device)


def _host(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return x.get() if hasattr(x, "get") else np.asarray(x)
