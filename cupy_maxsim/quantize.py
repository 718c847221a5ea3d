"""int8 quantisation and packing: the index-time transforms of a corpus (and of queries).

:func:`quantize_int8` gives the per-token symmetric int8 values and scales the int8 kernels
take; :func:`pack` turns padded or listed documents into the ``(tokens, offsets)`` of
:func:`cupy_maxsim.score_packed`.
"""

from __future__ import annotations

import numpy as np

from ._arrays import Operand, Output, bfloat16_bits, concatenated, module_of
from ._int8 import quantize_operand
from ._problem import check_device, check_ndim, float_operand, mask_operand


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
    return _pack(docs, mask)


def _pack(docs, mask=None, first: int = 0):
    """:func:`pack`; a sequence's documents named from ``docs[first]`` in errors (an Index's
    add packs its documents a batch at a time)."""
    if isinstance(docs, (list, tuple)):
        if mask is not None:
            raise ValueError("mask applies to a padded (Nd, Ld, D) array, got a sequence of documents")
        if len(docs) == 0:
            raise ValueError("docs must hold at least one document, got an empty sequence")
        operands = [float_operand(doc, f"docs[{i}]") for i, doc in enumerate(docs, first)]
        first = operands[0]
        for op in operands:
            check_ndim(op, (2,), "(Ld_i, D)")
            if op.dtype != first.dtype:
                raise TypeError(f"{op.name} must have the dtype of {first.name} ({first.dtype}), got {op.dtype}")
            if op.shape[-1] != first.shape[-1]:
                raise ValueError(f"{op.name} must have the embedding dim of {first.name} ({first.shape[-1]}), "
                                 f"got {op.shape[-1]}")
            check_device(first, op)
        xp = module_of(first)
        arrays = [_backend_array(op) for op in operands]
        # (lengths known here: the offsets made on the host and copied, no CuPy kernel to
        # compile on a first call, as the parts are joined by device copies)
        tokens = concatenated(xp, arrays)
        offsets = xp.asarray(np.concatenate([[0], np.cumsum([a.shape[0] for a in arrays])]).astype(np.int64))
    else:
        padded = float_operand(docs, "docs")
        check_ndim(padded, (3,), "(Nd, Ld, D)")
        first = padded
        xp = module_of(padded)
        array = _backend_array(padded)
        if mask is None:
            tokens = array.reshape(-1, array.shape[-1])
            offsets = xp.asarray(np.arange(array.shape[0] + 1, dtype=np.int64) * array.shape[1])
        else:
            mask_op = mask_operand(mask, "mask", padded.shape[:2], padded)
            keep = _backend_array(mask_op)
            tokens = array[keep]
            offsets = xp.zeros(keep.shape[0] + 1, dtype=np.int64)
            xp.cumsum(keep.sum(axis=1), out=offsets[1:])
    if first.dtype == "bfloat16" and not first.on_gpu:  # host bfloat16 arrives widened: back to bf16, exactly
        tokens = bfloat16_bits(tokens)
    output = Output(first)
    return output.wrap(tokens, dtype=first.dtype), output.wrap(offsets)



def _backend_array(operand: Operand):
    return operand.host if operand.host is not None else operand.cupy()
