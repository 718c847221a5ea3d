"""Host-resident corpora streamed through a GPU (issue 28, item 1): an Index whose store lives
in host memory (``Index(dim, device="host")``) is searched on a GPU segment by segment, each
segment's tokens (and int8 scales) copied into one of a few device buffers on a stream of its
own while the segment before it is scored, so that the copies hide behind the scoring and the
GPU holds at most ``gpu_budget_bytes`` of the corpus at once. Every waiting query is scored in
one pass over the corpus; the per-segment best merge exactly as :func:`cupy_maxsim.search`'s
blocks do (the same results as an in-memory index).

The copies go through :class:`CudaCopies` (pinned host memory registered in place, a copy
stream, events); :class:`HostCopies` is the same contract with NumPy arrays, with which the
CPU tests run every step but the transfer itself.
"""

from __future__ import annotations

import dataclasses
import mmap
import weakref

import numpy as np

#: Device bytes a host-resident index's search may hold of the corpus by default.
DEFAULT_GPU_BUDGET = 2 * 2**30
#: cudaHostRegister's flags (driver_types.h): cudaHostRegisterPortable, cudaHostRegisterReadOnly.
HOST_REGISTER_PORTABLE, HOST_REGISTER_READ_ONLY = 0x01, 0x08
#: The host's page: what cudaHostRegister pins.
PAGE = mmap.PAGESIZE
#: Device buffers segments rotate through: one being scored, one being filled (a third would
#: let a copy run two segments ahead; two measured enough where copies are slower than scoring).
BUFFERS = 2


@dataclasses.dataclass
class SearchReport:
    """What one streamed search did (``Index.last_search``): segments, bytes copied to the GPU,
    and the most device bytes its buffers held."""

    segments: int = 0
    bytes_copied: int = 0
    buffer_bytes: int = 0


def checked_budget(value) -> int:
    """``gpu_budget_bytes`` as given, or a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"gpu_budget_bytes must be a positive int, got {value!r}")
    return int(value)


def segment_ranges(offsets: np.ndarray, max_tokens: int, max_docs: int) -> list[tuple[int, int]]:
    """Consecutive document ranges [start, stop) of at most ``max_tokens`` tokens and
    ``max_docs`` documents each, covering every document of the packed ``offsets`` (host
    int64). A document longer than ``max_tokens`` is refused (it fits no buffer)."""
    lengths = np.diff(offsets)
    if lengths.size and int(lengths.max()) > max_tokens:
        raise ValueError(f"gpu_budget_bytes holds {max_tokens:,} tokens a buffer, but a document has "
                         f"{int(lengths.max()):,}: raise gpu_budget_bytes")
    ranges, start, count = [], 0, offsets.shape[0] - 1
    while start < count:
        # The furthest stop whose tokens fit, by a search over the offsets (no loop per document).
        stop = int(np.searchsorted(offsets, offsets[start] + max_tokens, side="right")) - 1
        stop = max(start + 1, min(stop, start + max_docs, count))
        ranges.append((start, stop))
        start = stop
    return ranges


class HostCopies:
    """The copy contract on the host (NumPy "device" buffers): what the CPU tests stream through."""

    xp = np

    def buffer(self, shape, dtype):
        return np.empty(shape, dtype)

    def upload(self, slot: int, destination, source) -> None:
        destination[...] = source

    def ready(self, slot: int) -> None:
        pass

    def release(self, slot: int) -> None:
        pass

    def pinned(self, array):
        return array


class CudaCopies:
    """Host-to-device copies on a stream of their own, ordered against the scoring by events:
    a buffer is filled only after the scoring that read it last has finished (``release``), and
    scored only after its copy has landed (``ready``)."""

    def __init__(self, device: int):
        import cupy

        self.xp, self.device = cupy, device
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.landed = [cupy.cuda.Event(disable_timing=True) for _ in range(BUFFERS)]
            self.free = [None] * BUFFERS

    def buffer(self, shape, dtype):
        return self.xp.empty(shape, dtype)

    def upload(self, slot: int, destination, source) -> None:
        if self.free[slot] is not None:
            self.stream.wait_event(self.free[slot])
        destination.set(source, stream=self.stream)
        self.landed[slot].record(self.stream)

    def ready(self, slot: int) -> None:
        self.xp.cuda.get_current_stream().wait_event(self.landed[slot])

    def release(self, slot: int) -> None:
        event = self.xp.cuda.Event(disable_timing=True)
        event.record(self.xp.cuda.get_current_stream())
        self.free[slot] = event

    def pinned(self, array):
        """``array``'s memory page-locked in place (cudaHostRegister), so that copies from it
        run asynchronously at the full rate, for as long as the returned array lives (its
        finalizer unregisters it). Where the registration is refused: the whole pages inside
        the array (its first or last page may be registered already, by a neighbouring view
        of one array: another shard's store); where that is refused too (memory-mapped files
        on some systems), a pinned copy; where the host cannot pin that much either (a store
        larger than its memory, memory-mapped), the array itself, its copies staged through
        the driver (slower, the same results).

        Memory freed while registered stays pinned in the driver's view: a later copy from an
        allocation that reuses those addresses read stale pages (garbage scores and "invalid
        argument" copies in tests after the streaming ones, H200 2026-12-02), so the
        registration must end before the memory does."""
        runtime = self.xp.cuda.runtime
        array = np.ascontiguousarray(array)
        if array.nbytes == 0:
            return array
        # Portable: pinned for every GPU's copies (a sharded store's, or another device's
        # search); read-only memory (an index loaded memory-mapped) is registered as such.
        flags = HOST_REGISTER_PORTABLE | (0 if array.flags.writeable else HOST_REGISTER_READ_ONLY)
        start, end = array.ctypes.data, array.ctypes.data + array.nbytes
        inside = (-(-start // PAGE) * PAGE, end // PAGE * PAGE)
        for first, last in [(start, end)] + ([inside] if inside[1] - inside[0] >= PAGE else []):
            try:
                runtime.hostRegister(first, last - first, flags)
            except Exception:  # noqa: BLE001 - any refusal: the next way
                continue
            # (array holds its memory's owner: the finalizer runs before the memory can go)
            weakref.finalize(array, _unregister, runtime, first)
            return array
        try:
            memory = self.xp.cuda.alloc_pinned_memory(array.nbytes)
        except Exception:  # noqa: BLE001 - more than the host can pin (a store past its memory)
            return array  # (copies from pageable memory: staged by the driver, slower, the same)
        copy = np.frombuffer(memory, array.dtype, array.size).reshape(array.shape)
        copy[...] = array
        return copy


def _unregister(runtime, pointer: int) -> None:
    try:
        runtime.hostUnregister(pointer)
    except Exception:  # noqa: BLE001 - the context is already gone (the process exits)
        pass


class SegmentSource:
    """``block(start, stop)`` for search's loop over ``ranges``: the segment's tokens, scales
    and offsets from 0 on the device, its copy issued while the segment before it was scored."""

    def __init__(self, copies, tokens, scales, offsets, ranges, report: SearchReport, bfloat16: bool = False):
        self.copies, self.tokens, self.scales, self.offsets, self.ranges = copies, tokens, scales, offsets, ranges
        self.bfloat16 = bfloat16  # (tokens are bfloat16 bits)
        self.report = report
        xp = copies.xp
        widest = max((int(offsets[b] - offsets[a]) for a, b in ranges), default=0)
        self.buffers = [copies.buffer((max(1, widest), tokens.shape[1]), tokens.dtype) for _ in range(BUFFERS)]
        self.scale_buffers = None if scales is None else [copies.buffer((max(1, widest),), scales.dtype)
                                                          for _ in range(BUFFERS)]
        report.buffer_bytes = sum(b.nbytes for b in self.buffers + (self.scale_buffers or []))
        self.local_offsets = [xp.asarray(offsets[a:b + 1] - offsets[a]) for a, b in ranges]
        self.position = {r: n for n, r in enumerate(ranges)}
        self.issued = -1
        self._issue(0)

    def _issue(self, n: int) -> None:
        """The copy of segment ``n`` into buffer n % BUFFERS (after the scoring that read it)."""
        if n >= len(self.ranges) or n <= self.issued:
            return
        a, b = self.ranges[n]
        first, last = int(self.offsets[a]), int(self.offsets[b])
        slot = n % BUFFERS
        self.copies.upload(slot, self.buffers[slot][:last - first], self.tokens[first:last])
        if self.scales is not None:
            self.copies.upload(slot, self.scale_buffers[slot][:last - first], self.scales[first:last])
        self.report.segments += 1
        self.report.bytes_copied += (last - first) * self.tokens.shape[1] * self.tokens.itemsize + (
            0 if self.scales is None else (last - first) * 4)
        self.issued = n

    def __call__(self, start: int, stop: int):
        n = self.position[(start, stop)]
        self._issue(n)
        slot = n % BUFFERS
        self.copies.ready(slot)
        first, last = int(self.offsets[start]), int(self.offsets[stop])
        tokens = self.buffers[slot][:last - first]
        if self.bfloat16:  # (the store's bits)
            from ._arrays import bfloat16_view

            tokens = bfloat16_view(tokens, "tokens")
        scales = None if self.scales is None else self.scale_buffers[slot][:last - first]
        return tokens, scales, self.local_offsets[n], slot

    def scored(self, n_slot: int, start: int, stop: int) -> None:
        """Segment (start, stop) in ``n_slot`` is scored (its launches queued): free its buffer
        for the segment BUFFERS on, and issue the next copy."""
        self.copies.release(n_slot)
        self._issue(self.position[(start, stop)] + 1)


def copies_for(q, index) -> object:
    """Where a host-resident index's search runs: the GPU of ``q``; for host queries the
    current GPU where CuPy finds one (the results come back to the host); else the host."""
    from . import _arrays

    operand = _arrays.as_operand(q, "q")
    if operand.on_gpu:
        return CudaCopies(operand.device)
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return CudaCopies(cupy.cuda.runtime.getDevice())
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no GPU: the host
        pass
    return HostCopies()


def top_k(index, q, q_mask, scales: dict, k: int, return_argmax: bool, workspace_bytes: int, allowed: np.ndarray,
          budget_bytes: int, copies):
    """search's top-k over ``index``'s host store through ``copies``: (problem, results), the
    results as _search._top_k returns them (storage rows for ids), in the framework and on the
    device of ``q``. ``scales``: q_scale (and
    the store's d_scale, which is streamed with the tokens)."""
    from . import _arrays, scoring
    from ._problem import argmax_dtype, packed_problem
    from .search import _top_k, docs_per_block

    original = q
    tokens, d_scale = _pinned(index, copies)
    offsets = np.asarray(index._offsets)
    xp = copies.xp
    moved = _arrays.as_operand(q, "q").on_gpu != (xp is not np)  # host queries to the GPU
    q_scale = scales.get("q_scale")
    if moved:
        with _device_of(copies):
            q_mask, q_scale = (None if x is None else xp.asarray(_arrays.host_values(x)) for x in (q_mask, q_scale))
            if index.dtype == "bfloat16":  # (bfloat16 queries: their bits go, viewed again as bfloat16)
                values = _arrays.to_host(_arrays.as_operand(q, "q"))  # (bits, or a host input's widened values)
                bits = values if values.dtype == np.uint16 else _arrays.bfloat16_bits(values)
                q = _arrays.bfloat16_view(xp.asarray(bits), "q")
            else:
                q = xp.asarray(_arrays.host_values(q))
    shape = _arrays.as_operand(q, "q").shape
    num_queries = int(np.prod(shape[:-2], dtype=np.int64)) or 1
    bytes_per_token = tokens.shape[1] * tokens.itemsize + (0 if d_scale is None else 4)
    max_tokens = max(1, budget_bytes // (BUFFERS * bytes_per_token))
    ranges = segment_ranges(offsets, max_tokens, docs_per_block(num_queries, shape[-2], return_argmax, workspace_bytes))
    report = index.last_search = SearchReport()
    with _device_of(copies):
        allowed_device = xp.asarray(allowed)
        if not ranges:  # an empty index: nothing to stream
            source = SegmentSource(copies, tokens, d_scale, np.zeros(2, np.int64), [(0, 1)], report,
                                   index.dtype == "bfloat16")
            ranges_for_problem = [(0, 1)]
        else:
            source = SegmentSource(copies, tokens, d_scale, offsets, ranges, report, index.dtype == "bfloat16")
            ranges_for_problem = ranges
        first, first_scales, first_offsets, _ = source(*ranges_for_problem[0])
        problem, _ = packed_problem(q, first, first_offsets, q_mask, q_scale,
                                    None if first_scales is None else first_scales, False)
        # (the longest document only for winners: a pass over every offset, each search)
        winners = argmax_dtype(int(np.diff(offsets).max(initial=0))) if return_argmax else None
        problem = problem._replace(num_docs=offsets.shape[0] - 1, argmax_dtype=winners)

        def block(start, stop):
            segment, segment_scales, local, slot = source(start, stop)
            extra = {} if segment_scales is None else {"q_scale": q_scale, "d_scale": segment_scales}
            result = scoring.score_packed(q, segment, local, q_mask=q_mask, return_argmax=return_argmax, **extra)
            source.scored(slot, start, stop)
            return result

        results = _top_k(problem, block, k, workspace_bytes, allowed_device, ranges=ranges)
    if moved:  # host queries scored on a GPU: the results on the host, in their framework
        like = _arrays.as_operand(original, "q")
        problem, results = problem._replace(like=like), _arrays.answer(tuple(x.get() for x in results), like)
    return problem, results


def _pinned(index, copies):
    """The store's tokens and scales as the copies read them (page-locked for the GPU), kept
    on the index until its store changes."""
    cached = getattr(index, "_streamed_store", None)
    if cached is not None and cached[0] is index._tokens and cached[1] is copies.__class__:
        return cached[2], cached[3]
    tokens = copies.pinned(index._tokens)
    scales = None if index._scales is None else copies.pinned(index._scales)
    index._streamed_store = (index._tokens, copies.__class__, tokens, scales)
    return tokens, scales


def _device_of(copies):
    import contextlib

    if copies.xp is np:
        return contextlib.nullcontext()
    return copies.xp.cuda.Device(copies.device)
