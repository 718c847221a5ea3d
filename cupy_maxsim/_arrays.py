"""Arrays in and out: the one place that knows about CuPy, NumPy, PyTorch, JAX and DLPack.

``as_operand`` turns any supported input into an :class:`Operand` (a NumPy array on the host,
or a device pointer with shape, strides and dtype on a GPU) without copying, and remembers the
caller's framework, device and stream. ``Output`` allocates results in the framework of ``q``
and hands them back there. Host bfloat16 inputs are the single exception to zero-copy: NumPy
has no bfloat16 arithmetic, so they are widened to float32 once (the CPU backend computes in
float32 anyway).

Per-framework fast paths keep small calls short: a torch CUDA tensor is read through
``data_ptr()``/``stride()`` (no DLPack capsule) and results are allocated by torch itself;
kernels then run on torch's current stream, with no device-wide synchronisation.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

_TORCH_DTYPES = {
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.bool": "bool",
    "torch.int16": "int16",
    "torch.int32": "int32",
    "torch.int64": "int64",
    "torch.int8": "int8",
    "torch.uint8": "uint8",
}

#: Tests set this to fill every result with NaN before the kernels run, so an element a
#: kernel forgot to write cannot pass.
POISON_OUTPUTS = False

def _poison(dtype: str, bits: bool = False):
    """What POISON_OUTPUTS fills with: NaN (bits 0x7fff for bfloat16 held as uint16 ``bits``),
    or an integer no kernel writes."""
    if dtype == "bfloat16" and bits:
        return 0x7FFF
    return np.nan if dtype.startswith("float") or dtype == "bfloat16" else 12345


ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "bool": 1, "int8": 1, "uint8": 1,
            "int16": 2, "int32": 4, "int64": 8}


@dataclasses.dataclass
class Operand:
    """An input array as the backends see it.

    ``host`` holds the NumPy array when the data live in host memory; otherwise ``ptr``,
    ``shape``, ``strides`` (in elements) and ``dtype`` describe device memory on CUDA device
    ``device``. ``keepalive`` pins whatever owns the memory for the duration of the call.
    """

    name: str
    framework: str
    dtype: str
    shape: tuple
    strides: tuple
    device: int  # -1 for host memory
    ptr: int = 0
    host: np.ndarray | None = None
    keepalive: object = None
    torch_device: object = None

    def with_changes(self, **changes) -> "Operand":
        """A shallow copy with some fields replaced (dataclasses.replace re-runs __init__ and
        costs microseconds on the per-call path)."""
        copy = object.__new__(Operand)
        copy.__dict__.update(self.__dict__)
        copy.__dict__.update(changes)
        return copy

    @property
    def stream(self) -> int | None:
        """The CUDA stream to launch on: torch's current stream for torch tensors (read only
        when a launch needs it, since it costs microseconds), else None (CuPy's current)."""
        if self.torch_device is None:
            return None
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # ~10x cheaper, same value
        if raw is not None:
            return raw(self.torch_device.index)
        return torch.cuda.current_stream(self.torch_device).cuda_stream

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def on_gpu(self) -> bool:
        return self.device >= 0

    def cupy(self):
        """A CuPy view of device memory (zero-copy)."""
        import cupy

        if isinstance(self.keepalive, cupy.ndarray):
            return self.keepalive
        dtype = np.dtype(self.dtype) if self.dtype != "bfloat16" else np.uint16
        item = ITEMSIZE[self.dtype]
        extent = 1 + sum((n - 1) * abs(s) for n, s in zip(self.shape, self.strides)) if all(self.shape) else 0
        memory = cupy.cuda.UnownedMemory(self.ptr, extent * item, self.keepalive, self.device)
        return cupy.ndarray(self.shape, dtype, cupy.cuda.MemoryPointer(memory, 0),
                            strides=tuple(s * item for s in self.strides))


def _framework_of(x) -> str:
    module = type(x).__module__.split(".")[0]
    if module == "numpy" or isinstance(x, np.ndarray):
        return "numpy"
    if module in ("cupy", "torch", "jax", "jaxlib"):
        return "jax" if module == "jaxlib" else module
    if hasattr(x, "__dlpack__"):
        return "dlpack"
    return "other"


def as_operand(x, name: str) -> Operand:
    """Wrap ``x`` (any supported array) without copying. Raises TypeError for anything else.
    An :class:`Operand` passes through (adapters build them for buffers no framework wraps)."""
    if isinstance(x, Operand):
        return x.with_changes(name=name)
    framework = _framework_of(x)
    if framework == "numpy":
        array = np.asarray(x)
        return _host_operand(array, name, "numpy")
    if framework == "torch":
        return _torch_operand(x, name)
    if framework == "cupy":
        return _cupy_operand(x, name, "cupy")
    if framework == "jax":
        import jax

        if isinstance(x, jax.core.Tracer):  # (under jit, grad or vmap: no buffer to read yet)
            raise TypeError(f"{name} is a traced JAX value (inside jax.jit, jax.grad or jax.vmap): cupy_maxsim's "
                            "NumPy-level functions take concrete arrays; use cupy_maxsim.jax.maxsim (maxsim_pairs, "
                            "maxsim_packed, maxsim_candidates) inside traced code")
        platform = next(iter(x.devices())).platform
        if platform == "cpu":
            return _host_operand(np.asarray(x), name, "jax")
        require_cupy(f"{name} on a GPU")
        import cupy

        return _cupy_operand(cupy.from_dlpack(x), name, "jax")
    if framework == "dlpack":
        device_type, _ = x.__dlpack_device__()
        if device_type == 1:  # kDLCPU
            return _host_operand(np.from_dlpack(x), name, "dlpack")
        require_cupy(f"{name} on a GPU")
        import cupy

        return _cupy_operand(cupy.from_dlpack(x), name, "dlpack")
    raise TypeError(
        f"{name} must be an array (NumPy, CuPy, PyTorch, JAX or any __dlpack__ producer), "
        f"got {type(x).__name__}"
    )


def require_cupy(what: str) -> None:
    """An ImportError that says how to install CuPy where ``what`` needs the GPU backend and
    CuPy is not there (a bare "No module named 'cupy'" does not say which package to take)."""
    if sys.modules.get("cupy") is not None:  # (imported already: a dict lookup a call)
        return
    try:
        import cupy  # noqa: F401
    except ImportError:
        raise ImportError(f"{what} needs the GPU backend, CuPy: pip install \"cupy-maxsim[cuda12]\" (CUDA 12 "
                          "driver), [cuda13] or [cuda12-ctk] (see the README's Install)") from None


def dtype_name(dtype) -> str:
    """``dtype.name``, remembered by dtype: NumPy computes the name in Python each time (about
    4 us, and an Index search reads five of them)."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


_DTYPE_NAMES: dict = {}


def _host_operand(array: np.ndarray, name: str, framework: str) -> Operand:
    dtype = dtype_name(array.dtype)
    if dtype == "bfloat16":  # ml_dtypes (JAX): widen once, NumPy cannot compute in it
        array = array.astype(np.float32)
    item = array.dtype.itemsize
    return Operand(name, framework, dtype, array.shape, tuple(s // item for s in array.strides), -1,
                   host=array)


def device_buffer_operand(buffer, dtype: str, name: str = "x") -> Operand:
    """An operand over any object with ``__cuda_array_interface__`` (e.g. a JAX buffer in a
    callback), of the given dtype name: works for bfloat16, which NumPy-typed interfaces lack."""
    interface = buffer.__cuda_array_interface__
    shape = tuple(interface["shape"])
    item = ITEMSIZE[dtype]
    strides = interface.get("strides")
    if strides is None:
        strides, step = [], 1
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    else:
        strides = [s // item for s in strides]
    import cupy

    return Operand(name, "cupy", dtype, shape, tuple(strides), cupy.cuda.runtime.getDevice(),
                   ptr=interface["data"][0], keepalive=buffer)


def _cupy_operand(array, name: str, framework: str) -> Operand:
    dtype = dtype_name(array.dtype)
    item = array.dtype.itemsize
    return Operand(name, framework, dtype, tuple(array.shape), tuple(s // item for s in array.strides),
                   array.device.id, ptr=array.data.ptr, keepalive=array)


def _torch_operand(x, name: str) -> Operand:
    dtype = _TORCH_DTYPES.get(str(x.dtype), str(x.dtype))
    if x.requires_grad:
        x = x.detach()
    if not x.is_cuda:
        if dtype == "bfloat16":
            array = x.float().numpy()
        else:
            array = x.resolve_conj().resolve_neg().numpy()
        operand = _host_operand(array, name, "torch")
        operand.dtype = dtype
        return operand
    device = x.device
    require_cupy(f"{name} on a GPU")
    return Operand(name, "torch", dtype, tuple(x.shape), tuple(x.stride()), device.index,
                   ptr=x.data_ptr(), keepalive=x, torch_device=device)


class Output:
    """Allocates results in the framework and on the device of ``like`` (the query operand).
    ``tensor``: the caller's torch tensor of ``like``, where at hand (a training step's
    forward): torch then allocates beside it (``new_empty``, ``empty_like``) without parsing a
    device and a dtype, 1.5-3.5 us of host time less per result on the H200
    (bench/results/host-threads-2026-11-30-195ed5d.txt)."""

    def __init__(self, like: Operand, tensor=None):
        self.like = like
        self.tensor = tensor

    def empty(self, shape: tuple, dtype: str):
        """Returns (array handed back to the caller later, device pointer or host ndarray).
        bfloat16 outside torch is held as uint16 bits (hand it back with ``wrap(x, dtype)``)."""
        like = self.like
        if not like.on_gpu:
            array = np.empty(shape, dtype)
            return array, array
        if like.framework == "torch":
            import torch

            if self.tensor is not None:
                tensor = self.tensor.new_empty(shape, dtype=getattr(torch, dtype))
            else:
                tensor = torch.empty(shape, dtype=getattr(torch, dtype), device=like.torch_device)
            if POISON_OUTPUTS:
                self.fill(tensor, _poison(dtype))
            return tensor, tensor.data_ptr()
        import cupy

        with cupy.cuda.Device(like.device):
            array = cupy.empty(shape, np.uint16 if dtype == "bfloat16" else dtype)
            if POISON_OUTPUTS:
                self.fill(array, _poison(dtype, bits=True))
        return array, array.data.ptr

    def empty_like(self, operand: Operand, array):
        """:meth:`empty` of ``operand``'s shape and dtype, contiguous; ``array``: the caller's
        array of it (a torch tensor there: torch.empty_like, the cheapest torch allocation)."""
        if self.like.framework == "torch" and self.like.on_gpu and type(array).__module__ == "torch":
            import torch

            tensor = torch.empty_like(array, memory_format=torch.contiguous_format)
            if POISON_OUTPUTS:
                self.fill(tensor, _poison(operand.dtype))
            return tensor, tensor.data_ptr()
        return self.empty(operand.shape, operand.dtype)

    def fill(self, array, value) -> None:
        """Fill an array from :meth:`empty` on the caller's stream."""
        if isinstance(array, np.ndarray):
            array.fill(value)
            return
        if hasattr(array, "fill_"):  # torch: its own stream
            array.fill_(value)
            return
        import cupy

        from ._gpu.device import on_stream

        with cupy.cuda.Device(self.like.device), on_stream(self.like.stream):
            array.fill(value)

    def wrap(self, array, dtype: str | None = None):
        """Hand a NumPy or CuPy array back in the caller's framework.

        ``dtype="bfloat16"`` marks raw bfloat16 bits held as uint16 (CuPy has no bfloat16
        without ml_dtypes), which are viewed back as bfloat16 in frameworks that have it.
        """
        like = self.like
        bits = dtype == "bfloat16" and array.dtype == np.uint16
        if like.framework == "torch":
            import torch

            if isinstance(array, torch.Tensor):
                return array
            if isinstance(array, np.ndarray):
                tensor = torch.from_numpy(array.view(np.int16) if bits else array)
            else:
                tensor = torch.from_dlpack(array)
            return tensor.view(torch.bfloat16) if bits else tensor
        if like.framework == "jax":
            import jax

            result = jax.numpy.asarray(array) if isinstance(array, np.ndarray) else jax.dlpack.from_dlpack(array)
            return jax.lax.bitcast_convert_type(result, jax.numpy.bfloat16) if bits else result
        if bits and isinstance(array, np.ndarray):  # NumPy bfloat16 inputs came through ml_dtypes
            try:
                import ml_dtypes
            except ImportError:  # bits of a bfloat16 from elsewhere: nothing to view them as
                return array
            return array.view(ml_dtypes.bfloat16)
        return array


def widened_bfloat16(bits):
    """bfloat16 values held as their bits (uint16, NumPy or CuPy; any other 16-bit view is
    reinterpreted) as float32, exactly. Values widened already (a host bfloat16 operand holds
    float32: _host_operand) come back as they are: widened again, their bytes were read as
    bits, twice the dim (host bfloat16 documents could not be added to an Index)."""
    if bits.dtype.itemsize != 2:
        return bits
    bits = bits if bits.dtype == np.uint16 else bits.view(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bfloat16_bits(array):
    """float16, float32 (or float64) values, NumPy or CuPy, as bfloat16 bits (uint16) in the
    same module, rounded to nearest even; NaN stays NaN. Exact for values that came from
    bfloat16 (host bfloat16 inputs are widened to float32)."""
    xp = np if isinstance(array, np.ndarray) else _cupy_module()
    bits = array.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return xp.where(xp.isnan(array), np.uint16(0x7FC0), rounded)


def _cupy_module():
    import cupy

    return cupy


def module_of(operand: Operand):
    """The array module (NumPy or CuPy) that computes on the operand's memory."""
    if operand.on_gpu:
        import cupy

        return cupy
    return np


def _namespace(x):
    """The array API namespace of a NumPy, CuPy or JAX array (torch tensors: None)."""
    if type(x).__module__.split(".")[0] == "torch":
        return None
    return x.__array_namespace__() if hasattr(x, "__array_namespace__") else np


def reshaped(x, shape: tuple):
    """``x`` reshaped in its own framework (a view where its layout allows)."""
    namespace = _namespace(x)
    return x.reshape(shape) if namespace is None else namespace.reshape(x, shape)


def repeated_rows(x, times: int):
    """(N, ...) -> (N * times, ...), each row ``times`` times in a row, in ``x``'s framework (a
    copy)."""
    namespace = _namespace(x)
    if namespace is None:
        return x.unsqueeze(1).expand(x.shape[0], times, *x.shape[1:]).reshape(x.shape[0] * times, *x.shape[1:])
    expanded = namespace.broadcast_to(namespace.expand_dims(x, axis=1), (x.shape[0], times) + tuple(x.shape[1:]))
    return namespace.reshape(expanded, (x.shape[0] * times,) + tuple(x.shape[1:]))


def to_host(x) -> np.ndarray:
    """A NumPy copy (or view) of an Operand or a NumPy / CuPy array."""
    if isinstance(x, Operand):
        return x.host if not x.on_gpu else x.cupy().get()
    return x if isinstance(x, np.ndarray) else x.get()


def host_values(x) -> np.ndarray:
    """Any array's values as a NumPy array (bfloat16 widened exactly to float32)."""
    operand = as_operand(x, "q")
    values = to_host(operand)
    return np.asarray(widened_bfloat16(values) if operand.dtype == "bfloat16" else values)


def concatenated(xp, arrays):
    """``xp.concatenate(arrays)`` along the first axis; on the GPU by copies of device memory
    where the parts are C-contiguous and alike (CuPy's concatenate is a kernel compiled on a new
    machine's first call, as is the copy kernel of a slice assignment)."""
    arrays = list(arrays)
    first = arrays[0]
    if xp is np or not all(a.flags.c_contiguous and a.shape[1:] == first.shape[1:] and a.dtype == first.dtype
                           for a in arrays):
        return xp.concatenate(arrays)
    out = xp.empty((sum(a.shape[0] for a in arrays),) + first.shape[1:], first.dtype)
    at = 0
    for part in arrays:
        copy_rows(xp, out, at, part)
        at += part.shape[0]
    return out


def copy_rows(xp, out, at: int, part) -> None:
    """``out[at:at + len(part)] = part``; on the GPU by a copy of device memory where both are
    C-contiguous and of one dtype (no copy kernel to compile: see concatenated)."""
    if xp is np or not (part.flags.c_contiguous and out.flags.c_contiguous and part.dtype == out.dtype
                        and part.shape[1:] == out.shape[1:]):
        out[at:at + part.shape[0]] = part
    elif part.nbytes:
        row = out.nbytes // max(1, out.shape[0])
        (out.data + at * row).copy_from_device_async(part.data, part.nbytes, stream=xp.cuda.get_current_stream())


def answer(host_results, like: Operand) -> tuple:
    """Host (NumPy) results on the device and in the framework of the query operand ``like``."""
    out = list(host_results)
    if like.on_gpu:
        import cupy

        with cupy.cuda.Device(like.device):
            out = [cupy.asarray(x) for x in out]
    output = Output(like)
    return tuple(output.wrap(x) for x in out)


def cast(x, dtype: str):
    """``x`` as ``dtype`` in its own framework (an Index's queries cast to its stored format:
    the results follow the framework of the query); bfloat16 from NumPy or CuPy, which have no
    such dtype, as an Operand of its bits (:func:`bfloat16_view`)."""
    framework = type(x).__module__.split(".")[0]
    if framework == "torch":
        import torch

        return x.to(getattr(torch, dtype))
    if dtype == "bfloat16" and framework in ("numpy", "cupy"):
        operand = as_operand(x, "q")
        values = operand.host if not operand.on_gpu else operand.cupy()
        return bfloat16_view(bfloat16_bits(widened_bfloat16(values) if operand.dtype == "bfloat16" else values),
                             "q").with_changes(framework=framework)
    return x.astype(dtype)


def bfloat16_view(bits, name: str) -> Operand:
    """An Operand of bfloat16 over its bits (a uint16 NumPy or CuPy array: a bfloat16 Index's
    store, or a query cast to it). On the host it holds the bits, not widened values as a host
    bfloat16 input does: the NumPy backend widens a block of them at a time (_cpu._block)."""
    return as_operand(bits, name).with_changes(dtype="bfloat16")


def parse_device(device) -> int | None:
    """A store's device name ("cpu", "cuda", "cuda:N") as its GPU number, or None for the CPU."""
    if device in ("cpu", None):
        return None
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        number = device.partition(":")[2] or "0"
        if number.isdigit():
            return int(number)
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
