"""Documents in the forms Index.add and ShardedIndex.add take them: a list of (Ld_i, D) arrays,
a padded (Nd, Ld, D) array with an optional (Nd, Ld) mask, or a (tokens (T, D), offsets (Nd + 1,))
pair: counted, cut into runs of documents, their offsets checked, packed, and converted into a
store's format on its device."""

from __future__ import annotations

import contextlib

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


def packed(docs, mask, dim: int, first: int = 0):
    """(the tokens' operand, host int64 offsets) of documents of width ``dim``; ``first``: the
    position of ``docs[0]`` among the documents given to add (errors name theirs)."""
    if isinstance(docs, tuple) and len(docs) == 2:
        tokens, offsets = docs
    else:
        tokens, offsets = quantize._pack(docs, mask, first)
    offsets = np.asarray(_arrays.to_host(_arrays.as_operand(offsets, "offsets")), dtype=np.int64)
    operand = _arrays.as_operand(tokens, "docs")
    if operand.ndim != 2 or operand.shape[1] != dim:
        raise ValueError(f"docs must have tokens of width {dim} (the index's dim), got shape {operand.shape}")
    check_offsets(offsets, operand.shape[0])
    return operand, offsets


def check_copy(copy) -> None:
    """add()'s ``copy``: True (always copy), None (keep where possible) or False (keep, or say why not)."""
    if copy not in (True, False, None):
        raise ValueError(f"copy must be True, False or None, got {copy!r}")


def why_copied(docs, dtype: str, gpu: int | None, device: str) -> str | None:
    """Why a store of ``dtype`` on ``gpu`` (None: the host; ``device``: its name) cannot keep
    ``docs``' tokens as they are; None where it can (a (tokens, offsets) pair of its format,
    C-contiguous, on its device)."""
    if not (isinstance(docs, tuple) and len(docs) == 2):
        return "only a (tokens, offsets) pair is kept as it is"
    operand = _arrays.as_operand(docs[0], "docs")
    if operand.dtype != dtype:
        return f"the tokens are {operand.dtype}, the index stores {dtype}"
    if operand.on_gpu != (gpu is not None) or (operand.on_gpu and operand.device != gpu):
        return f"the tokens are on {'GPU %d' % operand.device if operand.on_gpu else 'the host'}, the index on {device}"
    if dtype == "bfloat16" and not operand.on_gpu:
        return "host bfloat16 tokens are widened on the way in (NumPy has no bfloat16)"
    tokens = operand.host if not operand.on_gpu else operand.cupy()
    if not tokens.flags.c_contiguous:
        return "the tokens are not C-contiguous"
    return None


def token_count(docs, mask) -> int:
    """Tokens the documents will store (what quantize.pack keeps: a mask's real ones); what it
    cannot count (a malformed document) counts 0, and the conversion of its batch reports it.
    A pair's offsets on the host."""
    if isinstance(docs, tuple) and len(docs) == 2:
        return int(docs[1][-1]) if docs[1].shape[0] else 0
    if isinstance(docs, list):
        shapes = [x.shape if hasattr(x, "shape") else _arrays.as_operand(x, f"docs[{i}]").shape
                  for i, x in enumerate(docs)]
        return sum(int(shape[0]) for shape in shapes if len(shape) == 2)
    shape = _arrays.as_operand(docs, "docs").shape
    if len(shape) != 3:
        return 0
    if mask is None:
        return int(shape[0]) * int(shape[1])
    return int(np.count_nonzero(_arrays.to_host(_arrays.as_operand(mask, "mask"))))


def grown(xp, store, rows: int):
    """A new array of ``rows`` rows (``store``'s dtype and row shape) beginning with ``store``'s
    rows; the rest to be written."""
    out = xp.empty((rows,) + store.shape[1:], store.dtype)
    _arrays.copy_rows(xp, out, 0, xp.ascontiguousarray(store))
    return out


def converted(operand, dtype: str, exact_dtype: str | None, gpu: int | None):
    """A batch's tokens (an operand) in a store's format ``dtype`` on its device (``gpu``, or
    None: the host): (values, int8 scales or None, a host copy in ``exact_dtype`` or None).
    Tokens on another device or the host are converted where a GPU is (uploaded first to a GPU
    store; on their own GPU for a host store) and the results moved. Called inside the store's
    device context."""
    x = operand.host if not operand.on_gpu else operand.cupy()
    if operand.dtype == "bfloat16":
        x = _arrays.widened_bfloat16(x)
    elif operand.dtype not in ("float16", "float32", "float64"):
        raise TypeError(f"docs must be floating point, got dtype {operand.dtype}")
    # (the exact copy lives on the host: made before host documents go to the GPU)
    exact = None if exact_dtype is None else _arrays.to_host(_arrays.as_operand(x, "docs")).astype(exact_dtype)
    if gpu is not None and not (operand.on_gpu and operand.device == gpu):
        import cupy

        x = cupy.asarray(x.get() if operand.on_gpu else x)
    with contextlib.nullcontext() if gpu is not None or not operand.on_gpu else _on_gpu(operand.device):
        if dtype == "int8":
            values, scales = quantize.quantize_int8(x)
        elif dtype == "bfloat16":  # (stored as its bits: NumPy and CuPy have no bfloat16)
            values, scales = _arrays.bfloat16_bits(x), None
        else:
            values, scales = x.astype(dtype, copy=True), None
        if gpu is None and operand.on_gpu:  # converted on the documents' GPU, stored on the host
            values, scales = values.get(), None if scales is None else scales.get()
    return values, scales, exact


def _on_gpu(device: int):
    import cupy

    return cupy.cuda.Device(device)


def token_rows(offsets: np.ndarray, documents: np.ndarray) -> np.ndarray:
    """The token rows of ``documents`` (positions into packed ``offsets``' tokens), in order:
    each one's start, then consecutive rows."""
    lengths = offsets[documents + 1] - offsets[documents]
    return np.arange(int(lengths.sum())) + np.repeat(offsets[documents] - (np.cumsum(lengths) - lengths), lengths)
