"""CUDA devices and streams: the current device's context, the caller's stream, properties."""

from __future__ import annotations

import contextlib
import threading

from .._cache import Cache

_streams = Cache("streams")
_device_props = Cache("device properties")


_thread_devices = threading.local()


def on_device(device: int):
    """Context in which ``device`` is this thread's current device, its primary context current:
    the launches go straight through the driver, which needs one. A switch only when another
    device is current (entering cupy.cuda.Device costs microseconds, and small calls are
    host-bound). A thread that never touched CUDA (torch runs backward on threads of its own)
    has no current context, though cudaGetDevice answers 0: its first call here sets the device
    (cudaSetDevice makes the primary context current)."""
    import cupy

    if cupy.cuda.runtime.getDevice() != device:
        return cupy.cuda.Device(device)
    ready = getattr(_thread_devices, "ready", None)
    if ready is None:
        ready = _thread_devices.ready = set()
    if device not in ready:
        cupy.cuda.runtime.setDevice(device)
        ready.add(device)
    return contextlib.nullcontext()


def on_stream(stream_ptr: int | None):
    """Context in which CuPy work (kernels, array operations) runs on the caller's stream
    ``stream_ptr``; CuPy's current stream when None."""
    if stream_ptr is None:
        return contextlib.nullcontext()
    stream = _streams.get(stream_ptr)
    if stream is None:
        import cupy

        stream = _streams.put(stream_ptr, cupy.cuda.Stream.from_external(_StreamHandle(stream_ptr)))
    return stream



def device_properties(device: int) -> tuple[int, int, int, int, int]:
    """(multiprocessor count, opt-in shared memory per block, shared memory per SM, compute
    capability as 10 * major + minor, L2 cache bytes) of a CUDA device, cached."""
    props = _device_props.get(device)
    if props is None:
        import cupy

        handle = cupy.cuda.Device(device)
        attributes = handle.attributes
        props = (attributes["MultiProcessorCount"], attributes["MaxSharedMemoryPerBlockOptin"],
                 attributes["MaxSharedMemoryPerMultiprocessor"], int(handle.compute_capability),
                 attributes["L2CacheSize"])
        _device_props.put(device, props)
    return props




class _StreamHandle:
    """A raw CUDA stream pointer speaking the CUDA stream protocol (for Stream.from_external)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


# ---- NVRTC without a GPU --------------------------------------------------------------------


def resident_blocks(kernel, threads: int, shared_bytes: int, device: int) -> int:
    """Blocks of ``kernel`` one SM holds at once, limited by registers, shared memory and
    threads (a persistent grid is sized from this)."""
    smem_per_sm = device_properties(device)[2]
    # Registers are allocated per warp in units of 256.
    per_warp = -(-kernel.num_regs * 32 // 256) * 256
    by_registers = 65536 // (per_warp * (threads // 32))
    return max(1, min(by_registers, smem_per_sm // (shared_bytes + 1024), 2048 // threads))

