"""Per-token symmetric int8 quantisation of an operand (NumPy or CuPy, blocked): what
quantize_int8 returns and what float queries against int8 documents are scored as."""

from __future__ import annotations

import math

import numpy as np

from ._arrays import Operand, module_of, widened_bfloat16
from ._gpu.device import on_stream


def quantize_operand(operand: Operand, mask: Operand | None):
    """(int8 values, float32 scales) as NumPy or CuPy arrays, on the operand's stream."""
    xp = module_of(operand)
    if not operand.on_gpu:
        return _quantize_array(xp, operand.host, operand.dtype, None if mask is None else mask.host)
    with xp.cuda.Device(operand.device), on_stream(operand.stream):
        return _quantize_on_gpu(operand.cupy(), operand.dtype, None if mask is None else mask.cupy())


def _quantize_on_gpu(x, dtype: str, mask):
    """The NumPy path's arithmetic in one kernel (maxsim_quantize.cu), bit for bit."""
    import cupy

    from ._gpu.launch import quantize_int8
    from ._gpu.registry import DTYPE_SUFFIX

    dim = x.shape[-1]
    rows = x.reshape(math.prod(x.shape[:-1]), dim)  # not -1: dim may be 0
    if dim == 0:
        values, scales = cupy.empty(rows.shape, np.int8), cupy.zeros(rows.shape[0], np.float32)
    else:
        flat_mask = None if mask is None else cupy.ascontiguousarray(mask.reshape(-1))
        values, scales = quantize_int8(cupy.ascontiguousarray(rows), DTYPE_SUFFIX[dtype], flat_mask)
    return values.reshape(x.shape), scales.reshape(x.shape[:-1])


#: Tokens quantised per block: keeps the float32 temporaries near 64 MB whatever the corpus.
QUANTIZE_BLOCK_ELEMENTS = 16 * 1024 * 1024


def _quantize_array(xp, x, dtype: str, mask):
    dim = x.shape[-1]
    rows = x.reshape(math.prod(x.shape[:-1]), dim)  # not -1: dim may be 0
    mask_rows = None if mask is None else mask.reshape(-1)
    values = xp.empty(rows.shape, np.int8)
    scales = xp.empty(rows.shape[0], np.float32)
    step = max(1, QUANTIZE_BLOCK_ELEMENTS // max(1, dim))
    for start in range(0, rows.shape[0], step):
        block = rows[start:start + step]
        if dtype == "bfloat16" and block.dtype == np.uint16:  # raw bfloat16 bits (CuPy without ml_dtypes)
            block = widened_bfloat16(block)
        block = block.astype(np.float32)
        scale = (xp.abs(block).max(axis=-1) / 127).astype(np.float32) if dim else \
            xp.zeros(block.shape[0], np.float32)
        safe = xp.where(scale > 0, scale, np.float32(1))
        with np.errstate(invalid="ignore"):  # inf / inf in a non-finite token: zeroed just below
            scaled = xp.nan_to_num(block / safe[:, None], nan=0.0, posinf=0.0, neginf=0.0)
        values[start:start + step] = xp.clip(xp.rint(scaled), -127, 127).astype(np.int8)
        if mask_rows is not None:
            values[start:start + step] *= mask_rows[start:start + step, None]
            scale = xp.where(mask_rows[start:start + step], scale, np.float32(0))
        scales[start:start + step] = scale
    return values.reshape(x.shape), scales.reshape(x.shape[:-1])
