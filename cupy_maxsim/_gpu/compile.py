"""Compile and cache the kernels: one ``cupy.RawModule`` per (device, family, defines).

A module comes from the first of: the cubins the wheel ships (prebuilt.py: no compile in a new
process), the cubins compiled at an earlier first use, kept under :func:`cache_dir` (keyed by a
hash of the source string, options and NVRTC version, so ``common.cuh`` is concatenated into
each source by registry.source, never ``#include``-d), NVRTC (_gpu/nvrtc.py, the prebuilt
cubins' options: never CuPy's own compile, whose -ftz=true reads subnormal inputs as zero).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .._cache import Cache
from . import prebuilt
from .device import device_properties
from .registry import ARCH_SPECIFIC, source

# (device, family, defines) -> (module, the prebuilt cubin it was loaded from or None)
_modules = Cache("compiled modules")
_kernel_cache = Cache("kernels", limit=1024)


def get_kernel(device: int, family: str, name: str, defines: tuple[str, ...] = (), shared_bytes: int = 0):
    """The compiled ``RawKernel`` ``name`` of ``family`` for ``device`` (the current device),
    allowed ``shared_bytes`` of dynamic shared memory. Driver attributes are set once per
    (kernel, size), never on the per-call path."""
    key = (device, family, defines, name, shared_bytes)
    kernel = _kernel_cache.get(key)
    if kernel is None:
        module, shipped = _modules.get(key[:3]) or _modules.put(key[:3], _load_module(device, family, defines))
        try:
            kernel = module.get_function(name)
        except Exception as error:  # a shipped cubin this driver cannot load: compile instead
            if shipped is None:
                raise
            _refused(shipped, error)
            module, _ = _modules.put(key[:3], (_compile_module(device, family, defines), None))
            kernel = module.get_function(name)
        if shared_bytes > 48 * 1024 and kernel.max_dynamic_shared_size_bytes < shared_bytes:
            kernel.max_dynamic_shared_size_bytes = shared_bytes
            # Ask for the largest shared-memory carve-out, so that several blocks fit on an SM
            # (the default may leave room for one).
            kernel.preferred_shared_memory_carveout = 100
        _kernel_cache.put(key, kernel)
    return kernel



def cache_dir() -> Path:
    """Where compiled architecture-specific kernels are kept across processes."""
    return Path(os.environ.get("CUPY_MAXSIM_CACHE_DIR") or Path.home() / ".cache" / "cupy_maxsim")


def _load_module(device: int, family: str, defines: tuple[str, ...]):
    """(the module of a variant, the prebuilt cubin it came from): the wheel's cubin for this
    device if there is one (None: compiled)."""
    import cupy

    path = prebuilt.find(family, defines, device_properties(device)[3])
    if path is not None:
        try:
            return cupy.RawModule(path=str(path)), path  # (CuPy may load it here or at get_function)
        except Exception as error:
            _refused(path, error)
    return _compile_module(device, family, defines), None


def _refused(path, error) -> None:
    import warnings

    warnings.warn(f"cupy_maxsim: the prebuilt {Path(path).name} did not load ({type(error).__name__}: {error}); "
                  "compiling it", RuntimeWarning, stacklevel=3)


def _compile_module(device: int, family: str, defines: tuple[str, ...]):
    """A variant compiled for ``device`` as the prebuilt cubins are (nvrtc.compile_options:
    CuPy's own compile adds -ftz=true, and its -arch choice has no sm_90a for wgmma), through
    CuPy's NVRTC, kept on disk under a hash of everything that went into it."""
    import cupy

    from . import nvrtc

    library = nvrtc.cupy_nvrtc()
    arch = ARCH_SPECIFIC.get(family) or nvrtc.device_arch(library, device_properties(device)[3])
    inputs = (source(family), nvrtc.compile_options(arch, defines), nvrtc.version(library))
    key = hashlib.sha256(repr(inputs).encode()).hexdigest()[:32]
    path = cache_dir() / f"{family}-{key}.{'cubin' if arch.startswith('sm_') else 'ptx'}"
    if not path.is_file():
        image = nvrtc.compile_image(family, arch, defines, library)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_bytes(image)
            os.replace(partial, path)  # atomic: a concurrent process sees all of it or none
        except OSError:  # no writable cache: this process compiles for itself
            path = Path(tempfile.mkdtemp(prefix="cupy_maxsim-")) / path.name
            path.write_bytes(image)
    return cupy.RawModule(path=str(path))
