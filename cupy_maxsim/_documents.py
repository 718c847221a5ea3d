"""Documents in the forms Index.add and ShardedIndex.add take them: a list of (Ld_i, D) arrays,
a padded (Nd, Ld, D) array with an optional (Nd, Ld) mask, or a (tokens (T, D), offsets (Nd + 1,))
pair: counted, cut into runs of documents, their offsets checked, packed."""

from __future__ import annotations

import numpy as np

from . import _arrays, quantize


def count(docs) -> int:
    """The number of documents."""
    if isinstance(docs, tuple) and len(docs) == 2:
        return int(_arrays.as_operand(docs[1], "offsets").shape[0]) - 1
    if isinstance(docs, list):
        return len(docs)
    return int(_arrays.as_operand(docs, "docs").shape[0])


def sliced(docs, start: int, stop: int):
    """Documents start..stop, in the same form (a pair's offsets on the host, int64: rebased
    to 0)."""
    if isinstance(docs, tuple) and len(docs) == 2:  # (tokens, host int64 offsets)
        offsets = docs[1]
        stop = min(stop, offsets.shape[0] - 1)
        return docs[0][int(offsets[start]):int(offsets[stop])], offsets[start:stop + 1] - offsets[start]
    return docs[start:stop]


def check_offsets(offsets: np.ndarray, tokens: int) -> None:
    """A ValueError unless host ``offsets`` start at 0, never decrease and end at ``tokens``."""
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != tokens or (
            np.diff(offsets) < 0).any():
        raise ValueError("offsets must start at 0, not decrease, and end at the number of tokens")


def packed(docs, mask, dim: int):
    """(the tokens' operand, host int64 offsets) of documents of width ``dim``."""
    if isinstance(docs, tuple) and len(docs) == 2:
        tokens, offsets = docs
    else:
        tokens, offsets = quantize.pack(docs, mask=mask)
    offsets = np.asarray(_arrays.to_host(_arrays.as_operand(offsets, "offsets")), dtype=np.int64)
    operand = _arrays.as_operand(tokens, "docs")
    if operand.ndim != 2 or operand.shape[1] != dim:
        raise ValueError(f"docs must have tokens of width {dim} (the index's dim), got shape {operand.shape}")
    check_offsets(offsets, operand.shape[0])
    return operand, offsets


def token_rows(offsets: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """The token rows of ``documents`` (positions into packed ``offsets``' tokens), in order:
    each one's start, then consecutive rows."""
    lengths = offsets[documents + 1] - offsets[documents]
    return np.arange(int(lengths.sum())) + np.repeat(offsets[documents] - (np.cumsum(lengths) - lengths), lengths)
