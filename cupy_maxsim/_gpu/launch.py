"""Launches straight through the driver (cuLaunchKernel) with by-value struct arguments.

CuPy's generic argument handling cost several microseconds per launch, and small calls are
host-bound; a :class:`PreparedLaunch` settles kernel and geometry once, so that a repeated call
only patches pointers into bytes packed once.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import typing

from .._cache import Cache
from .args import ArgTemplate
from .compile import get_kernel
from .device import device_properties, on_device, on_stream
from .tape import allocated, recording_tape

def launch(kernel, grid, block, args, shared_bytes: int, stream_ptr: int | None, cooperative: bool = False) -> None:
    """Launch with by-value struct arguments (``args``: one from :class:`ArgStruct`, a tuple of
    such bytes, or a small kernel's :class:`Scalars`) on the caller's stream (``stream_ptr``),
    or CuPy's current stream when None.
    Straight through the driver (cuLaunchKernel): CuPy's generic argument handling cost several
    microseconds per launch, and small calls are host-bound. ``cooperative``: every block
    resident at once (cuLaunchCooperativeKernel; the grid must fit: :func:`resident_blocks`)."""
    from cupy_backends.cuda.api import driver

    entry = _function_pointers.get(id(kernel))
    if entry is None:
        entry = _function_pointers.put(id(kernel), (kernel, kernel.kernel.ptr))
    if isinstance(args, Scalars):  # (one buffer, a pointer into it a parameter)
        buffer = ctypes.create_string_buffer(args.packed, len(args.packed))
        base = ctypes.addressof(buffer)
        params = (ctypes.c_void_p * len(args.offsets))(*[base + offset for offset in args.offsets])
    else:
        values = [ctypes.create_string_buffer(a, len(a)) for a in ((args,) if isinstance(args, bytes) else args)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    geometry = _launch_geometry(grid, block, shared_bytes)
    tape = recording_tape()
    if tape is not None:
        tape.note_launch(kernel, entry[1], geometry, cooperative, args if isinstance(args, Scalars) else None)
    if cooperative:
        driver.launchCooperativeKernel(entry[1], *geometry, _stream_or_current(stream_ptr), ctypes.addressof(params))
    else:
        driver.launchKernel(entry[1], *geometry, _stream_or_current(stream_ptr), ctypes.addressof(params), 0)


def resident_blocks(device: int, kernel, threads: int, shared_bytes: int) -> int:
    """Blocks of ``kernel`` (``threads`` each, ``shared_bytes`` of dynamic shared memory) that
    the whole GPU holds at once: the most a cooperative launch may have."""
    key = (device, id(kernel), threads, shared_bytes)
    blocks = _resident.get(key)
    if blocks is None:
        from cupy_backends.cuda.api import driver

        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, threads, shared_bytes)
        blocks = _resident.put(key, (kernel, per_sm * device_properties(device)[0]))
    return blocks[1]


def _launch_geometry(grid, block, shared_bytes: int) -> tuple:
    """cuLaunchKernel's grid x, y, z, block x, y, z and shared bytes from 1-3 dimensional tuples."""
    return tuple(grid) + (1,) * (3 - len(grid)) + tuple(block) + (1,) * (3 - len(block)) + (shared_bytes,)


def _stream_or_current(stream_ptr: int | None) -> int:
    """``stream_ptr``, or CuPy's current stream where it is None."""
    if stream_ptr is None:
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return stream_ptr


class PreparedLaunch:
    """A launch whose kernel and geometry are settled, so that only the arguments change from
    call to call (a replayed call, a training step). ``arguments``: an :class:`ArgTemplate` of
    the launch's own, whose pointers each call (``__call__``) patches into a buffer held here
    (cuLaunchKernel copies it at the launch, so a launch allocates nothing; a lock keeps two
    threads from filling it at once); without one, the caller's buffers
    (:meth:`launch_packed`)."""

    def __init__(self, kernel, grid, block, shared_bytes: int, arguments: ArgTemplate | None = None):
        self.kernel = kernel  # holds the module, so that the function pointer stays valid
        self._function = kernel.kernel.ptr
        self._geometry = _launch_geometry(grid, block, shared_bytes)
        if arguments is not None:
            self._args = arguments(*(0,) * arguments.head_fields)
            self._head_into = arguments.head.pack_into
            self._extra_address = ctypes.addressof(self._args) + arguments.extra_at
            self._extra = None  # the second argument's bytes in the buffer now
            self._lock = threading.Lock()
        from cupy_backends.cuda.api import driver

        self._launch_kernel = driver.launchKernel

    def __call__(self, head_values: tuple, stream_ptr: int | None, extra: bytes | None = None) -> None:
        """Launch with the template's arguments, ``head_values`` patched in (and ``extra``'s
        bytes as the second argument) on ``stream_ptr`` (None: CuPy's current stream)."""
        stream_ptr = _stream_or_current(stream_ptr)
        args = self._args
        with self._lock:
            self._head_into(args, ArgTemplate.HEADER, *head_values)
            if extra is not None and extra is not self._extra:  # tensor maps are cached: mostly the same one
                ctypes.memmove(self._extra_address, extra, len(extra))
                self._extra = extra
            self._launch_kernel(self._function, *self._geometry, stream_ptr, ctypes.addressof(args), 0)

    def launch_packed(self, args, stream_ptr: int | None) -> None:
        """Launch with the caller's arguments (a buffer from an :class:`ArgTemplate`), no lock."""
        self._launch_kernel(self._function, *self._geometry, _stream_or_current(stream_ptr), ctypes.addressof(args), 0)


#: (device, id(RawKernel), threads, shared bytes) -> (the kernel, the blocks the GPU holds at once).
_resident = Cache("resident blocks", limit=256)

#: id(RawKernel) -> (the kernel, its CUfunction). The entry holds the kernel, so that its id is
#: never recycled: a tool that empties _kernel_cache (bench/ablate_wgmma.py) would otherwise find
#: a freed kernel's function under a new kernel's id, and launch it.
_function_pointers = Cache("function pointers", limit=1024)


#: The small kernels' scalar parameters in order (struct codes: Q pointer, q int64, i int32),
#: as their entries in kernels_cu/ declare them (tests/test_packaging.py parses and compares).
SMALL_KERNEL_PARAMETERS = {
    "maxsim_offsets_summary": "QqqiQ",  # offsets, count, stride, is_64bit, summary
    "maxsim_parts_offsets": "QiqqiiQ",  # offsets, is_64bit, doc_length, num_docs, parts, tile_rows, part_offsets
    "maxsim_topk_select": "QqiiiQQQi",  # scores, row_stride, n, k, segment_length, allowed, positions, chosen, ranked
    "maxsim_topk_wide": "QqiiQQQQ",    # scores, row_stride, n, k, allowed, state, candidates, chosen
    "maxsim_topk_finish": "QqQiqQQQQ",  # scores, row_stride, chosen, k, start, allowed, ids, out_scores, out_ids
    "maxsim_topk_merge": "QQiQQiiQQQ",  # a_scores, a_ids, ka, b_scores, b_ids, kb, k, order, out_scores, out_ids
    "maxsim_quantize": "QqiQQQ",        # x, rows, dim, mask, values, scales (every maxsim_quantize_<suffix>)
    "maxsim_quantize_fp32_split": "QqiQQQ",  # x, rows, dim, mask, halves, scales
    # x, docs, doc_length, doc_stride, row_stride, dim, mask, mask_doc_stride, mask_row_stride, halves, scales
    "maxsim_split_documents": "QqqqqiQqqQQ",
    # x, docs, doc_length, doc_stride, row_stride, dim, mask, mask_doc_stride, mask_row_stride, exponents
    "maxsim_split_exponents": "QqqqqiQqqQ",
}


class Scalars(typing.NamedTuple):
    """A small kernel's scalar parameters packed in one buffer (native alignment), and where
    each starts: :func:`launch` hands cuLaunchKernel a pointer into one buffer a parameter, not
    a buffer each (nine ctypes buffers a launch were a third of a selection launch's host
    time, profile-search-2026-12-05-7448d57)."""

    packed: bytes
    offsets: tuple[int, ...]
    codes: str  # each parameter's struct code (Q: a pointer)


def scalars(kernel: str, *values) -> Scalars:
    """The scalar parameters of small kernel ``kernel`` (a key of SMALL_KERNEL_PARAMETERS), for
    :func:`launch`."""
    layout, offsets = _scalar_layout(kernel)
    if len(offsets) != len(values):
        raise ValueError(f"{kernel} takes {len(offsets)} parameters, got {len(values)}")
    return Scalars(layout.pack(*values), offsets, SMALL_KERNEL_PARAMETERS[kernel])


def _scalar_layout(kernel: str) -> tuple[struct.Struct, tuple[int, ...]]:
    """(the parameters' struct, each one's offset in it) of a small kernel, each field at its
    natural alignment (what struct's native mode pads to)."""
    layout = _scalar_layouts.get(kernel)
    if layout is None:
        codes, offsets, at = SMALL_KERNEL_PARAMETERS[kernel], [], 0
        for code in codes:
            size = struct.calcsize(code)
            at = -(-at // size) * size
            offsets.append(at)
            at += size
        layout = _scalar_layouts[kernel] = (struct.Struct("@" + codes), tuple(offsets))
        assert layout[0].size >= at and all(struct.calcsize("@" + codes[:n + 1]) == offsets[n] + struct.calcsize(c)
                                             for n, c in enumerate(codes))
    return layout


_scalar_layouts: dict = {}


def _pointer(array) -> int:
    """A CuPy array's device address, or 0 (NULL) for None."""
    return 0 if array is None else array.data.ptr


def strided_blocks(device: int, items: int, per_block: int, per_sm: int) -> int:
    """Blocks of a grid-strided small kernel over ``items`` (``per_block`` a block a pass): one
    pass where that takes at most ``per_sm`` blocks an SM, else that many (at least one)."""
    return max(1, min(per_sm * device_properties(device)[0], -(-items // per_block)))


def offsets_summary(pointer: int, count: int, stride: int, is_64bit: bool, device: int,
                    stream_ptr: int | None) -> tuple[int, int, int, int]:
    """(first, last, number of decreasing steps, longest step) of ``count`` device-resident
    packed-document offsets (``stride`` in elements), on the caller's stream: one launch and one
    read back (maxsim_offsets.cu). The longest step means something only where no step
    decreases (callers reject the offsets otherwise)."""
    import cupy

    with on_device(device), on_stream(stream_ptr):
        summary = cupy.zeros(4, cupy.int64)
        blocks = strided_blocks(device, count - 1, 256, per_sm=2)
        launch(get_kernel(device, "maxsim_offsets", "maxsim_offsets_summary"), (blocks,), (256,),
               scalars("maxsim_offsets_summary", pointer, count, stride, int(is_64bit), summary.data.ptr), 0, stream_ptr)
        return tuple(int(v) for v in summary.get())


def part_offsets(offsets, is_64bit: bool, doc_length: int, num_docs: int, parts: int, tile_rows: int, device: int,
                 stream_ptr: int | None):
    """The packed offsets (int64, num_docs * parts + 1) of every document's ``parts`` parts of
    whole ``tile_rows``-row tiles (maxsim_parts.cu): documents at device ``offsets`` (int32 or
    int64, contiguous), or padded ones of ``doc_length`` tokens back to back (``offsets`` 0)."""
    import cupy

    with on_device(device), on_stream(stream_ptr):
        out = cupy.empty(num_docs * parts + 1, cupy.int64)
        blocks = strided_blocks(device, out.size, 256, per_sm=2)
        launch(get_kernel(device, "maxsim_parts", "maxsim_parts_offsets"), (blocks,), (256,),
               scalars("maxsim_parts_offsets", offsets, int(is_64bit), doc_length, num_docs, parts, tile_rows,
                       out.data.ptr), 0, stream_ptr)
        return out


def merge_parts(args: bytes, records_ptr: int, parts: int, warps: int, device: int, stream_ptr: int | None) -> None:
    """The scores of a problem whose documents were scored in ``parts`` parts (maxsim_parts.cu:
    the records at ``records_ptr``, float32, as the forward wrote them), written where ``args``
    (its ForwardArgs) says: one warp a (query, document), ``warps`` of them."""
    kernel, grid, block = merge_parts_launch(device, warps)
    launch(kernel, grid, block, (args, part_records(records_ptr, parts)), 0, stream_ptr)


def merge_parts_launch(device: int, warps: int) -> tuple:
    """(kernel, grid, block) of maxsim_parts_merge over ``warps`` (query, document) pairs on
    ``device``: merge_parts's, and a replay's prepared launch (_replay.Replay)."""
    blocks = strided_blocks(device, warps, 8, per_sm=8)
    return get_kernel(device, "maxsim_parts", "maxsim_parts_merge"), (blocks,), (256,)


def part_records(records_ptr: int, parts: int) -> bytes:
    """maxsim_parts_merge's second argument (PartRecords: the records' pointer, the parts a
    document), padded to its 16 bytes."""
    return struct.pack("@Qi4x", records_ptr, parts)


#: Threads of a top-k selection block, the keys it keeps in shared memory, and the most
#: positions its last round ranks (TOPK_THREADS, TOPK_CACHED_KEYS, TOPK_RANKED_MAX in maxsim_topk.cu).
TOPK_THREADS, TOPK_CACHED_KEYS = 512, 16384
TOPK_RANKED_MAX = TOPK_CACHED_KEYS // 2


def top_k_select(scores, k: int, segment_length: int, allowed, positions, ranked: bool = False):
    """One launch of maxsim_topk_select on the current device and stream: for each segment of
    ``segment_length`` elements of each row, the row positions of its k best, in the elements'
    order (``ranked``: in rank order, search's; one segment a row, k <= TOPK_RANKED_MAX), -1
    padded: (rows, segments, k) int32. The elements: the rows of ``scores`` (a
    C-contiguous CuPy float32 array (rows, n)) or, given ``positions`` (C-contiguous int32
    (rows, m), -1: padding), the scores at those positions. ``allowed``: bool (n,) over the
    positions (False: excluded, after every live element), or None (all live)."""
    import cupy

    rows, n = scores.shape
    width = n if positions is None else positions.shape[1]
    segments = -(-width // segment_length)
    if ranked and (segments != 1 or k > TOPK_RANKED_MAX):
        raise ValueError(f"a ranked selection is one segment of at most {TOPK_RANKED_MAX}, got {segments} and k={k}")
    chosen = allocated((rows, segments, k), cupy.int32)
    if rows:
        shared = 4 * TOPK_CACHED_KEYS
        kernel = get_kernel(scores.device.id, "maxsim_topk", "maxsim_topk_select", shared_bytes=shared)
        launch(kernel, (segments, rows), (TOPK_THREADS,),
               scalars("maxsim_topk_select", scores.data.ptr, n, width, k, segment_length,  # (n: the row stride)
                       _pointer(allowed), _pointer(positions), chosen.data.ptr, int(ranked)), shared, None)
    return chosen


#: Elements a thread of a selecting block takes, a wide selection's chunk (a block's elements
#: at a time), its radix passes and the ints of a row's state before the chunks' histograms
#: (TOPK_ITEMS, TOPK_WIDE_CHUNK, TOPK_WIDE_PASSES, TOPK_WIDE_HEAD in maxsim_topk.cu).
TOPK_ITEMS, TOPK_WIDE_PASSES = 8, 4
TOPK_WIDE_CHUNK, TOPK_WIDE_HEAD = TOPK_THREADS * TOPK_ITEMS, TOPK_WIDE_PASSES * 256 + 1


def top_k_wide(scores, k: int, allowed):
    """The positions of each row's k best in rank order (search's), (rows, k) int32, by the wide
    selection (maxsim_topk.cu: every row whole, a block a chunk of TOPK_WIDE_CHUNK elements or
    several, one cooperative launch) on the current device and stream; None where the GPU cannot
    hold a block for every row at once. ``scores``: C-contiguous CuPy float32 (rows, n), k < n,
    k <= TOPK_RANKED_MAX; ``allowed``: bool (n,) or None (all live)."""
    import cupy

    rows, n = scores.shape
    if not 0 < k < n or k > TOPK_RANKED_MAX:
        raise ValueError(f"the wide selection takes 0 < k < n and k <= {TOPK_RANKED_MAX}, got k={k}, n={n}")
    device, shared = scores.device.id, 8 * k
    kernel = get_kernel(device, "maxsim_topk", "maxsim_topk_wide", shared_bytes=8 * TOPK_RANKED_MAX)
    chunks = -(-n // TOPK_WIDE_CHUNK)
    blocks = min(chunks, resident_blocks(device, kernel, TOPK_THREADS, shared) // max(1, rows))
    if blocks < 1:
        return None
    row_ints = TOPK_WIDE_HEAD + 256 * chunks
    state = allocated((rows * row_ints + 1,), cupy.int32, zeroed=True)  # (+1: the grid barrier's count)
    candidates, chosen = allocated((rows, k), cupy.int32), allocated((rows, k), cupy.int32)
    if rows:
        launch(kernel, (blocks, rows), (TOPK_THREADS,),
               scalars("maxsim_topk_wide", scores.data.ptr, n, n, k, _pointer(allowed), state.data.ptr,
                       candidates.data.ptr, chosen.data.ptr), shared, None, cooperative=True)
    return chosen


#: Threads of a finishing block (TOPK_FINISH_THREADS in maxsim_topk.cu).
TOPK_FINISH_THREADS = 256


def top_k_finish(scores, chosen, start: int, allowed, ids):
    """One launch of maxsim_topk_finish on the current device and stream: search's (scores,
    ids) of a block, (rows, k) float32 and int64, from the last round's ranked positions
    ``chosen`` ((rows, k) int32, -1 padded) into ``scores`` (C-contiguous float32 (rows, n));
    a document's id is ``ids[start + position]`` (int64; None: ``start + position``); padding
    and documents that ``allowed`` (bool (n,) or None) excludes give -inf and -1."""
    import cupy

    rows, k = chosen.shape
    out_scores, out_ids = allocated((rows, k), cupy.float32), allocated((rows, k), cupy.int64)
    if rows and k:
        kernel = get_kernel(scores.device.id, "maxsim_topk", "maxsim_topk_finish")
        launch(kernel, (-(-k // TOPK_FINISH_THREADS), rows), (TOPK_FINISH_THREADS,),
               scalars("maxsim_topk_finish", scores.data.ptr, scores.shape[1], chosen.data.ptr, k, start, _pointer(allowed),
                       _pointer(ids), out_scores.data.ptr, out_ids.data.ptr), 0, None)
    return out_scores, out_ids


#: Threads of a merging block (TOPK_MERGE_THREADS in maxsim_topk.cu).
TOPK_MERGE_THREADS = 256


def top_k_merge(a_scores, a_ids, b_scores, b_ids, k: int):
    """One launch of maxsim_topk_merge on the current device and stream: each row's k best of
    two candidate lists (C-contiguous CuPy (rows, ka) and (rows, kb): float32 scores, int64 ids,
    -1 excluded), each in search's order with every id of the first below every id of the
    second: (positions in their concatenation int64, scores, ids), each (rows, min(k, ka + kb))."""
    import cupy

    rows, ka = a_scores.shape
    kb = b_scores.shape[1]
    k = min(k, ka + kb)
    order = cupy.empty((rows, k), cupy.int64)
    out_scores, out_ids = cupy.empty((rows, k), cupy.float32), cupy.empty((rows, k), cupy.int64)
    if rows and k:
        launch(get_kernel(a_scores.device.id, "maxsim_topk", "maxsim_topk_merge"), (rows,), (TOPK_MERGE_THREADS,),
               scalars("maxsim_topk_merge", a_scores.data.ptr, a_ids.data.ptr, ka, b_scores.data.ptr, b_ids.data.ptr,
                       kb, k, order.data.ptr, out_scores.data.ptr, out_ids.data.ptr), 0, None)
    return order, out_scores, out_ids


#: Threads of a quantising block (QUANTIZE_THREADS in maxsim_quantize.cu): a warp a token.
QUANTIZE_THREADS = 256


def quantize_int8(rows, suffix: str, mask):
    """One launch of maxsim_quantize_<suffix> on the current device and stream: (int8 values,
    float32 scales) of C-contiguous CuPy tokens ``rows`` (T, D) whose elements are of kernel
    suffix ``suffix`` (bfloat16 may come as its raw uint16 bits); ``mask``: C-contiguous bool
    (T,) or None."""
    import cupy

    values = allocated(rows.shape, cupy.int8)
    return values, _token_warps(f"maxsim_quantize_{suffix}", "maxsim_quantize", rows, mask, values)


def split_queries(rows, mask):
    """One launch of maxsim_quantize_fp32_split on the current device and stream: (fp16 halves
    as uint16 (T, 192 * ceil(D / 64)): per 64 elements the atoms big, big, small; float32 scales
    (T,): 2^-k, NaN for a token holding NaN or inf) of C-contiguous float32 CuPy tokens ``rows``
    (T, D), what the Hopper kernel's fp32 split build reads as q (maxsim_quantize.cu split_rows);
    ``mask``: C-contiguous bool (T,) or None."""
    import cupy

    halves = allocated((rows.shape[0], 192 * -(-rows.shape[1] // 64)), cupy.uint16)
    return halves, _token_warps("maxsim_quantize_fp32_split", "maxsim_quantize_fp32_split", rows, mask, halves)


def split_documents(x: int, device: int, docs: int, doc_length: int, strides: tuple[int, int], dim: int,
                    mask: int = 0, mask_strides: tuple[int, int] = (0, 0)):
    """One launch of maxsim_split_documents on the current device and stream: float32 document
    rows at ``x`` (as split_exponents takes them) as split_queries splits queries, but per 64
    elements the atoms big, small (the kernel reads big twice): (halves as uint16 (docs *
    doc_length, 128 * ceil(dim / 64)): the float32 bytes; float32 scales (docs * doc_length,):
    2^-k, 1 for a masked row, NaN for one holding NaN or inf), what the Hopper kernel's presplit
    build (MAXSIM_FP32_SPLIT 2) copies by TMA as its documents and their tiles' scales."""
    import cupy

    rows = docs * doc_length
    halves = allocated((rows, 128 * -(-dim // 64)), cupy.uint16)
    scales = allocated((rows,), cupy.float32)
    if rows:
        launch(get_kernel(device, "maxsim_quantize", "maxsim_split_documents"), (_row_blocks(device, rows),),
               (QUANTIZE_THREADS,), scalars("maxsim_split_documents", x, docs, doc_length, *strides, dim, mask,
                                            *mask_strides, halves.data.ptr, scales.data.ptr), 0, None)
    return halves, scales


#: Rows a warp of maxsim_split_exponents takes at once (SPLIT_EXPONENT_ROWS in maxsim_quantize.cu).
SPLIT_EXPONENT_ROWS = 4


def split_exponents(x: int, device: int, docs: int, doc_length: int, strides: tuple[int, int], dim: int,
                    mask: int = 0, mask_strides: tuple[int, int] = (0, 0)):
    """One launch of maxsim_split_exponents on the current device and stream: the int32
    exponents (docs * doc_length,) of float32 document rows at ``x`` (``docs`` documents of
    ``doc_length`` rows, ``strides`` (doc, row) in elements; packed: one document of every
    token), what the Hopper kernel's fp32 split build reads as the documents' scales; ``mask``:
    a bool (docs, doc_length) pointer with its (doc, row) strides, or 0."""
    import cupy

    rows = docs * doc_length
    exponents = allocated((rows,), cupy.int32)
    if rows:
        launch(get_kernel(device, "maxsim_quantize", "maxsim_split_exponents"),
               (_row_blocks(device, rows, SPLIT_EXPONENT_ROWS),), (QUANTIZE_THREADS,),
               scalars("maxsim_split_exponents", x, docs, doc_length, *strides, dim, mask, *mask_strides,
                       exponents.data.ptr), 0, None)
    return exponents


def _row_blocks(device: int, rows: int, rows_per_warp: int = 1) -> int:
    """Blocks of QUANTIZE_THREADS for a maxsim_quantize kernel whose warps take ``rows_per_warp``
    of ``rows`` at a time: enough for every row, at most 32 a SM (the warps stride the rest)."""
    return min(-(-rows // (QUANTIZE_THREADS // 32 * rows_per_warp)), 32 * device_properties(device)[0])


def _token_warps(name: str, parameters: str, rows, mask, out):
    """A maxsim_quantize kernel ``name`` (a warp a token of ``rows``, its scalar parameters
    SMALL_KERNEL_PARAMETERS[parameters]) writing ``out``; returns the tokens' float32 scales."""
    import cupy

    count, dim = rows.shape
    scales = allocated((count,), cupy.float32)
    if count:
        launch(get_kernel(rows.device.id, "maxsim_quantize", name), (_row_blocks(rows.device.id, count),), (QUANTIZE_THREADS,),
               scalars(parameters, rows.data.ptr, count, dim, _pointer(mask), out.data.ptr, scales.data.ptr), 0, None)
    return scales
