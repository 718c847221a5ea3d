"""Document ids: the arrays users pass as ids, the checks on ids being added, and sets of ids.

Sets are taken by one sort, not ``np.unique``: NumPy 2.4 hashes int64 arrays there, 6.8 s for
the 6M ids of a 108 GB corpus's ``add`` (0.36 s by a sort, 3 ms where they already increase, as
assigned ids do) and 0.15 s for 400k shortlisted rows (0.02 s by a sort): notebook, 2026-12-05.
"""

from __future__ import annotations

import numpy as np

from . import _arrays


def id_array(ids, name: str) -> np.ndarray:
    """``ids`` (a list, range or any 1-D integer array, on any device) as host int64; a
    TypeError naming ``name`` for anything else."""
    values = np.asarray(_arrays.to_host(_arrays.as_operand(ids, name)) if not isinstance(ids, (list, tuple, range)) else ids)
    if values.ndim != 1 or (values.size and values.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be a 1-D array of integer ids, got dtype {values.dtype} shape {values.shape}")
    if values.dtype.kind == "u" and values.size and int(values.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit int64, got {int(values.max())}")  # (not wrapped to negative ids)
    return values.astype(np.int64)


def increasing(values: np.ndarray) -> bool:
    """Whether a 1-D array strictly increases (assigned ids do): one pass, no sort."""
    return values.shape[0] < 2 or bool((values[1:] > values[:-1]).all())


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-D integer array (a new array, ascending), by one sort, or
    none where the values already increase."""
    if increasing(values):
        return values.copy()
    ordered = np.sort(values)
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def new_ids(ids, count: int, next_id: int, taken: np.ndarray) -> np.ndarray:
    """The ids of ``count`` documents being added: the next free ones from ``next_id``, or
    ``ids`` checked (one a document, unique, none in ``taken``: the live ids; a removed id may
    come again)."""
    if ids is None:
        return np.arange(next_id, next_id + count, dtype=np.int64)
    new = id_array(ids, "ids")
    if new.size and int(new.min()) < 0:  # (-1 marks a search's missing result)
        raise ValueError(f"ids must not be negative (-1 marks a missing search result), got {new[new < 0][:5].tolist()}")
    if new.shape[0] != count:
        raise ValueError(f"ids must give one id per document: {count} documents, {new.shape[0]} ids")
    if sorted_unique(new).shape[0] != count:
        raise ValueError("ids must be unique")
    clash = np.isin(new, taken)
    if clash.any():
        raise ValueError(f"ids already in the index: {new[clash][:5].tolist()}")
    return new


def sorted_view(ids: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(the stable argsort of ``ids``, or None where they already increase, as assigned ids
    do; ``ids`` in that order): what :func:`find` searches, taken once per version of an index's
    ids."""
    if increasing(ids):
        return None, ids
    order = np.argsort(ids, kind="stable")
    return order, ids[order]


def find(view: tuple[np.ndarray | None, np.ndarray], wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a row of the viewed ids holding each of ``wanted``, whether one does: rows of the ids not
    found are any row), by binary search: a filter of 1,000 ids against 6M costs microseconds
    where ``np.isin`` over the 6M took 0.25 s. An id held by several rows (removed, then added
    again before a compaction) is found in its last row: the one that can be live."""
    order, ordered = view
    if not ordered.shape[0]:
        return np.zeros(wanted.shape, np.int64), np.zeros(wanted.shape, bool)
    position = np.maximum(np.searchsorted(ordered, wanted, side="right") - 1, 0)
    return (position if order is None else order[position]), ordered[position] == wanted
