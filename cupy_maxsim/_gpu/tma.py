"""The Hopper kernel's TMA descriptors (cuTensorMapEncodeTiled, which CuPy does not wrap)."""

from __future__ import annotations

import ctypes
import functools
import struct

from .._cache import Cache

#: Bytes of the Hopper kernel's second argument (DocTileMap in maxsim_fwd_wgmma.cu): the
#: documents' CUtensorMap (128), the int8 document scales' (128), q's (128: streamed query
#: atoms), use_tma, packed, use_scale_tma, use_query_tma, padding to the struct's 64-byte alignment.
DOC_TILE_MAP_BYTES = 448
NO_DOC_TILE_MAP = bytes(DOC_TILE_MAP_BYTES)
_doc_tile_maps = Cache("tensor maps")


@functools.lru_cache(maxsize=None)
def _cuda_driver() -> ctypes.CDLL | None:
    """The CUDA driver library (for cuTensorMapEncodeTiled, which CuPy does not wrap), or None."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


#: The tensor map's element type by element size in bytes (CU_TENSOR_MAP_DATA_TYPE_UINT8, UINT16,
#: UINT32: the bits are copied, not interpreted); the sizes the Hopper kernel takes by TMA.
_ELEMENT_TYPES = {1: 0, 2: 1, 4: 2}


#: CU_TENSOR_MAP_L2_PROMOTION_* by bytes (Tunables.tma_l2_promotion).
_L2_PROMOTIONS = {0: 0, 64: 1, 128: 2, 256: 3}


def _swizzled_map(driver, pointer: int, itemsize: int, extents: tuple, strides: tuple, box: tuple,
                  l2_promotion: int = 256) -> bytes | None:
    """A 3-d tensor map (elements, rows, blocks; ``strides`` of rows and blocks in bytes) with
    boxes of 128 bytes x ``box`` (rows, blocks) in the 128-byte swizzle, zeros past the tensor,
    ``l2_promotion`` bytes fetched into L2 a miss, or None where the driver refuses it."""
    encoded = (ctypes.c_uint64 * 16)()
    u64s, u32s = ctypes.c_uint64 * 3, ctypes.c_uint32 * 3
    status = driver.cuTensorMapEncodeTiled(
        encoded, ctypes.c_int(_ELEMENT_TYPES[itemsize]),
        ctypes.c_uint32(3), ctypes.c_void_p(pointer), u64s(*extents),
        (ctypes.c_uint64 * 2)(*strides), u32s(128 // itemsize, *box), u32s(1, 1, 1),
        ctypes.c_int(0),  # no interleave
        ctypes.c_int(3),  # CU_TENSOR_MAP_SWIZZLE_128B
        ctypes.c_int(_L2_PROMOTIONS[l2_promotion]),
        ctypes.c_int(0))  # out-of-range elements read as zeros
    return bytes(encoded) if status == 0 else None


def l2_promotion_of_rows(dim: int, itemsize: int) -> int:
    """The TMA maps' L2 promotion for rows of ``dim`` elements of ``itemsize`` bytes: none for
    rows of 256 bytes of 8- or 16-bit elements (two 128-byte boxes a row), 256 bytes otherwise.
    One query against 4 GB, in three A/Bs: fp16/bf16 dim 128 and int8 dim 256 2-5% faster
    without (fp16 dim 128 0.930 -> 0.900 ms, bf16 0.928 -> 0.899, int8 256 0.968 -> 0.919:
    bench/results/ab-tunables-2026-12-04-8f99250.json); rows of 512 bytes and more 1-6% slower
    without (bf16 dim 256, fp16 dim 2560), 128-byte rows even or slower (-ae33c04.json,
    -6ba2ea0.json); fp32 dim 64 (TF32, not bound by its reads) 3.5% faster in one run and 3.6%
    slower in the next, so it keeps the promotion. ncu counts 31% more L2 sectors read than the
    4 GB with the promotion at dim 128, none more without (ncu-l2-sectors-2026-12-04-ae33c04.txt)."""
    return 0 if dim * itemsize == 256 and itemsize <= 2 else 256


def doc_tile_map(pointer: int, itemsize: int, dim: int, rows: int, docs: int, row_stride: int,
                 doc_stride: int, packed: bool, tile_rows: int = 64, l2_promotion: int | None = None,
                 scales: tuple | None = None, use_tma: bool = True, queries: tuple | None = None) -> bytes:
    """The Hopper kernel's TMA descriptor of a document tensor (``rows`` tokens of ``dim``
    elements per document, strides in bytes; packed corpora: all tokens as one document): boxes
    of 128 bytes of k x ``tile_rows`` rows, the 128-byte swizzle, zeros past the tensor. Cached by all it
    encodes. :data:`NO_DOC_TILE_MAP` (cp.async copies) where TMA's rules are not met: 16-byte
    strides and address, 32-bit coordinates, a CUDA driver at hand. ``scales`` (int8): the
    document scales' (pointer, row stride, document stride), bytes, laid out as the documents'
    rows; their own map where TMA can read them (rows of contiguous float32), else the kernel's
    lanes copy them. ``queries`` (the build streaming queries, WgmmaConfig.stream_query): q's
    (pointer, elements a row, tokens, queries, row stride, query stride in bytes, queries a
    box; the fp32 presplit build's query rows are wider than its documents'), whose map the
    kernel needs (ValueError where TMA cannot read q). ``l2_promotion``: Tunables.tma_l2_promotion
    (None: :func:`l2_promotion_of_rows`)."""
    if l2_promotion is None:
        l2_promotion = l2_promotion_of_rows(dim, itemsize)
    if not use_tma and queries is None:  # the tunables' use_tma (A/B against cp.async)
        return NO_DOC_TILE_MAP
    key = (pointer, itemsize, dim, rows, docs, row_stride, doc_stride, packed, tile_rows, scales, use_tma, queries,
           l2_promotion)
    found = _doc_tile_maps.get(key)
    if found is not None:
        return found
    driver = _cuda_driver()
    doc_map = scale_map = query_map = None
    if (use_tma and pointer % 16 == 0 and row_stride % 16 == 0 and doc_stride % 16 == 0 and row_stride > 0
            and (doc_stride > 0 or docs == 1) and rows + tile_rows < 2**31 and docs < 2**31
            and max(row_stride * rows, doc_stride * docs) < 2**40 and itemsize in _ELEMENT_TYPES and driver is not None):
        doc_map = _swizzled_map(driver, pointer, itemsize, (dim, rows, docs),
                                (row_stride, max(doc_stride, row_stride * rows)), (tile_rows, 1), l2_promotion)
        if doc_map is not None:
            scale_map = _scale_tile_map(driver, scales, rows, docs, tile_rows)
    if queries is not None:
        q_pointer, q_dim, tokens, count, q_row_stride, q_stride, per_box = queries
        q_stride = max(q_stride, q_row_stride * tokens) if count == 1 else q_stride  # one query: any stride
        if (driver is not None and q_pointer % 16 == 0 and q_row_stride % 16 == 0 and q_stride % 16 == 0
                and q_stride >= q_row_stride * tokens and count < 2**31):
            query_map = _swizzled_map(driver, q_pointer, itemsize, (q_dim, tokens, count), (q_row_stride, q_stride),
                                      (tokens, per_box), l2_promotion)
        if query_map is None:
            raise ValueError("q's rows cannot be read by TMA (16-byte pointer and strides are needed)")
    result = NO_DOC_TILE_MAP
    if doc_map is not None or query_map is not None:
        result = ((doc_map or bytes(128)) + (scale_map or bytes(128)) + (query_map or bytes(128))
                  + struct.pack("<iiii", int(doc_map is not None), int(packed), int(scale_map is not None),
                                int(query_map is not None)))
        result += bytes(DOC_TILE_MAP_BYTES - len(result))
    return _doc_tile_maps.put(key, result)


def _scale_tile_map(driver, scales: tuple | None, rows: int, docs: int, tile_rows: int) -> bytes | None:
    """The TMA descriptor of int8 document scales laid out as the documents' rows (2-d: rows,
    documents; float32, boxes of ``tile_rows`` x 1, zeros past the tensor), or None where TMA
    cannot read them: rows not contiguous, a document stride or address off 16 bytes."""
    if scales is None:
        return None
    pointer, row_stride, doc_stride = scales
    doc_stride = doc_stride if docs > 1 else -(-rows * 4 // 16) * 16  # one document: any stride
    if pointer % 16 or row_stride != 4 or doc_stride % 16 or doc_stride <= 0 or doc_stride * docs >= 2**40:
        return None
    encoded = (ctypes.c_uint64 * 16)()
    status = driver.cuTensorMapEncodeTiled(
        encoded, ctypes.c_int(7),  # CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        ctypes.c_uint32(2), ctypes.c_void_p(pointer), (ctypes.c_uint64 * 2)(rows, docs),
        (ctypes.c_uint64 * 1)(doc_stride), (ctypes.c_uint32 * 2)(tile_rows, 1), (ctypes.c_uint32 * 2)(1, 1),
        ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0))  # no interleave, swizzle, promotion
    return bytes(encoded) if status == 0 else None

