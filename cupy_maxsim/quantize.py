"""int8 quantisation and packing: the index-time transforms of a corpus (and of queries).

:func:`quantize_int8` gives the per-token symmetric int8 values and scales the int8 kernels
take; :func:`pack` turns padded or listed documents into the ``(tokens, offsets)`` of
:func:`cupy_maxsim.score_packed`.
"""

from __future__ import annotations

import numpy as np

from ._arrays import Operand, Output, module_of
from ._gpu.device import on_stream
from ._problem import check_ndim, check_pair, float_operand, mask_operand


def quantize_int8(x, *, mask=None):
    """Per-token symmetric int8 quantisation for int8 MaxSim scoring.

    Parameters
    ----------
    x : array, shape (..., D)
        Token embeddings (float16, bfloat16, float32 or float64): padded ``(Nd, Ld, D)``,
        packed ``(T, D)`` or queries.
    mask : bool array, shape x.shape[:-1], optional
        True marks real tokens; masked tokens get values 0 and scale 0.

    Returns
    -------
    values : int8 array, shape x.shape
        ``round(x / scale)`` in [-127, 127].
    scales : float32 array, shape x.shape[:-1]
        ``max |x| / 127`` per token (0 for an all-zero or masked token). A token holding NaN or
        inf gets a NaN or inf scale, so every score it takes part in is NaN, as with floats.
        In the framework and on the device of ``x``.
    """
    operand = float_operand(x, "x")
    if operand.ndim < 1:
        raise ValueError(f"x must have shape (..., D), got shape {operand.shape}")
    mask_op = mask_operand(mask, "mask", operand.shape[:-1], operand)
    values, scales = quantize_operand(operand, mask_op)
    output = Output(operand)
    return output.wrap(values), output.wrap(scales)


def quantize_operand(operand: Operand, mask: Operand | None):
    """(int8 values, float32 scales) as NumPy or CuPy arrays, on the operand's stream."""
    xp = module_of(operand)
    if not operand.on_gpu:
        return _quantize_array(xp, operand.host, operand.dtype, None if mask is None else mask.host)
    with xp.cuda.Device(operand.device), on_stream(operand.stream):
        return _quantize_array(xp, operand.cupy(), operand.dtype, None if mask is None else mask.cupy())


#: Tokens quantised per block: keeps the float32 temporaries near 64 MB whatever the corpus.
QUANTIZE_BLOCK_ELEMENTS = 16 * 1024 * 1024


def _quantize_array(xp, x, dtype: str, mask):
    dim = x.shape[-1]
    rows = x.reshape(-1, dim)
    mask_rows = None if mask is None else mask.reshape(-1)
    values = xp.empty(rows.shape, np.int8)
    scales = xp.empty(rows.shape[0], np.float32)
    step = max(1, QUANTIZE_BLOCK_ELEMENTS // max(1, dim))
    for start in range(0, rows.shape[0], step):
        block = rows[start:start + step]
        if dtype == "bfloat16" and block.dtype == np.uint16:  # raw bfloat16 bits (CuPy without ml_dtypes)
            block = (block.astype(np.uint32) << 16).view(np.float32)
        block = block.astype(np.float32)
        scale = (xp.abs(block).max(axis=-1) / 127).astype(np.float32) if dim else \
            xp.zeros(block.shape[0], np.float32)
        safe = xp.where(scale > 0, scale, np.float32(1))
        scaled = xp.nan_to_num(block / safe[:, None], nan=0.0, posinf=0.0, neginf=0.0)
        values[start:start + step] = xp.clip(xp.rint(scaled), -127, 127).astype(np.int8)
        if mask_rows is not None:
            values[start:start + step] *= mask_rows[start:start + step, None]
            scale = xp.where(mask_rows[start:start + step], scale, np.float32(0))
        scales[start:start + step] = scale
    return values.reshape(x.shape), scales.reshape(x.shape[:-1])


def pack(docs, mask=None):
    """Pack documents into ``(tokens, offsets)`` for :func:`score_packed`.

    Parameters
    ----------
    docs : sequence of arrays of shape (Ld_i, D), or one padded array of shape (Nd, Ld, D)
        Documents in one framework and on one device.
    mask : bool array, shape (Nd, Ld), optional
        With a padded ``docs``: True marks the real tokens kept (holes allowed).

    Returns
    -------
    tokens : array, shape (T, D)
    offsets : int64 array, shape (Nd + 1,)
        In the framework and on the device of the documents.
    """
    if isinstance(docs, (list, tuple)):
        if mask is not None:
            raise ValueError("mask applies to a padded (Nd, Ld, D) array, got a sequence of documents")
        if len(docs) == 0:
            raise ValueError("docs must hold at least one document, got an empty sequence")
        operands = [float_operand(doc, f"docs[{i}]") for i, doc in enumerate(docs)]
        first = operands[0]
        for op in operands:
            check_ndim(op, (2,), "(Ld_i, D)")
            check_pair(first, op)
        xp = module_of(first)
        arrays = [_backend_array(op) for op in operands]
        tokens = xp.concatenate(arrays, axis=0)
        lengths = xp.asarray([a.shape[0] for a in arrays], dtype=np.int64)
    else:
        padded = float_operand(docs, "docs")
        check_ndim(padded, (3,), "(Nd, Ld, D)")
        first = padded
        xp = module_of(padded)
        array = _backend_array(padded)
        if mask is None:
            tokens = array.reshape(-1, array.shape[-1])
            lengths = xp.full(array.shape[0], array.shape[1], dtype=np.int64)
        else:
            mask_op = mask_operand(mask, "mask", padded.shape[:2], padded)
            keep = _backend_array(mask_op)
            tokens = array[keep]
            lengths = keep.sum(axis=1).astype(np.int64)
    offsets = xp.zeros(lengths.shape[0] + 1, dtype=np.int64)
    xp.cumsum(lengths, out=offsets[1:])
    output = Output(first)
    return output.wrap(tokens, dtype=first.dtype), output.wrap(offsets)



def _backend_array(operand: Operand):
    return operand.host if operand.host is not None else operand.cupy()
