"""NVRTC through ctypes: every kernel image the package loads, and the compile checks.

One compile for all three uses, so that their options agree: the CI compile check and ``python
-m cupy_maxsim compile`` (no GPU: NVRTC and its headers from the nvidia-cuda-nvrtc wheels or a
CUDA toolkit; CuPy refuses to compile without a driver), the wheel's prebuilt cubins, and a GPU
process's first use of a build (_gpu/compile.py, with the NVRTC CuPy loaded). Not CuPy's own
compile: it adds -ftz=true (subnormal inputs read as zero, unlike the prebuilt cubins), and its
getCUBIN drops a cubin's last byte (a file nvdisasm refuses).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import glob
import os
import re
import sys

from .registry import NVRTC_OPTIONS, source


def compile_options(arch: str, defines: tuple[str, ...]) -> tuple[str, ...]:
    """The options every image is compiled with; the prebuilt and first-use cubins' file names
    hash them (prebuilt.file_name, compile._compile_module)."""
    return NVRTC_OPTIONS + tuple(defines) + (f"-arch={arch}",)


@functools.cache
def cupy_nvrtc() -> ctypes.CDLL:
    """The NVRTC library CuPy loaded (in a GPU process: the version CuPy pairs with the driver),
    or, where its name does not find it, the first :func:`_find_nvrtc` finds."""
    from cupy_backends.cuda.libs import nvrtc

    major = nvrtc.getVersion()[0]  # (loads it: dlopen then finds the loaded library by its soname)
    try:
        return ctypes.CDLL(f"libnvrtc.so.{major}")
    except OSError:
        return _find_nvrtc()


def device_arch(library: ctypes.CDLL, compute_capability: int) -> str:
    """What ``library`` compiles for a device of ``compute_capability`` (10 * major + minor):
    its cubin (sm_XY), or past the architectures it knows the PTX of the newest (compute_XY,
    which the driver compiles at load)."""
    count = ctypes.c_int()
    _check(library, library.nvrtcGetNumSupportedArchs(ctypes.byref(count)))
    archs = (ctypes.c_int * count.value)()
    _check(library, library.nvrtcGetSupportedArchs(archs))
    if compute_capability in list(archs):
        return f"sm_{compute_capability}"
    return f"compute_{max(archs)}"


def version(library: ctypes.CDLL) -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(library, library.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
    return major.value, minor.value


def _find_nvrtc() -> ctypes.CDLL:
    candidates = []
    for entry in sys.path:
        candidates += glob.glob(os.path.join(entry, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*"))
        candidates += glob.glob(os.path.join(entry, "nvidia", "cu13", "lib", "libnvrtc.so*"))
    for root in (os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root:
            candidates += glob.glob(os.path.join(root, "lib64", "libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    candidates = [c for c in candidates if "builtins" not in c and ".alt." not in c]
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    raise RuntimeError(
        "NVRTC not found: pip install nvidia-cuda-nvrtc-cu12 (or set CUDA_PATH to a CUDA toolkit)"
    )


@dataclasses.dataclass
class CompileReport:
    kernel: str
    arch: str
    defines: tuple[str, ...]
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    static_shared_bytes: int = 0
    stack_frame_bytes: int = 0  # local memory: an array indexed at run time, or a call's frame
    serialized_wgmma: bool = False  # ptxas serialized the asynchronous MMAs (its C7518-C7520 remarks)


def compile_with_nvrtc(family: str, arch: str, defines: tuple[str, ...] = ()) -> list[CompileReport]:
    """Compile a family to a cubin for ``arch`` (e.g. ``"sm_90"``) and return the ptxas report
    of each kernel. Raises ``RuntimeError`` with the compiler log on failure."""
    log, _ = _compile(family, arch, defines, ("--ptxas-options=-v",))
    return _parse_ptxas(log, arch, defines)


def compile_image(family: str, arch: str, defines: tuple[str, ...] = (), library: ctypes.CDLL | None = None) -> bytes:
    """A family's image for ``arch`` (sm_XY: a cubin; compute_XY: PTX), compiled as a GPU
    process compiles it (_gpu/compile.py, with ``library``: CuPy's NVRTC) and as the wheel
    ships it prebuilt (_gpu/prebuilt.py, no GPU needed)."""
    return _compile(family, arch, defines, (), library)[1]


def _compile(family: str, arch: str, defines: tuple[str, ...], extra: tuple[str, ...],
             library: ctypes.CDLL | None = None) -> tuple[str, bytes]:
    """(NVRTC's log, the image: cubin for sm_XY, PTX for compute_XY) of ``family`` for
    ``arch`` with ``defines``, through ``library`` (default: the first :func:`_find_nvrtc`
    finds); RuntimeError with the log on failure."""
    nvrtc = library or _find_nvrtc()
    program = ctypes.c_void_p()
    code = source(family).encode()
    _check(nvrtc, nvrtc.nvrtcCreateProgram(ctypes.byref(program), code, f"{family}.cu".encode(), 0, None, None))
    try:
        options = compile_options(arch, defines) + tuple(extra)
        array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = nvrtc.nvrtcCompileProgram(program, len(options), array)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.value.decode(errors="replace")
        if status != 0:
            raise RuntimeError(f"NVRTC failed to compile {family} for {arch} {defines}:\n{text}")
        kind = "CUBIN" if arch.startswith("sm_") else "PTX"
        _check(nvrtc, getattr(nvrtc, f"nvrtcGet{kind}Size")(program, ctypes.byref(size)))
        image = ctypes.create_string_buffer(size.value)
        _check(nvrtc, getattr(nvrtc, f"nvrtcGet{kind}")(program, image))
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
    return text, image.raw


def _parse_ptxas(log: str, arch: str, defines: tuple[str, ...]) -> list[CompileReport]:
    reports: dict[str, CompileReport] = {}
    current = None
    for line in log.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)'|Function properties for (\w+)", line)
        if entry:
            name = entry.group(1) or entry.group(2)
            current = reports.setdefault(name, CompileReport(name, arch, defines))
            continue
        # Ahead of its function's report; any cause (C7518: a wait on some paths only, C7520: a
        # wgmma behind a branch within its group, ...): every one leaves the MMAs serialized.
        serialized = re.search(r"\(C75\d\d\)[^']*wgmma[^']*serialized[^']*in the function '(\w+)'", line)
        if serialized:
            reports.setdefault(serialized.group(1), CompileReport(serialized.group(1), arch, defines)).serialized_wgmma = True
            continue
        if current is None:
            continue
        stack = re.search(r"(\d+) bytes stack frame", line)
        if stack:
            current.stack_frame_bytes = int(stack.group(1))
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if spill:
            current.spill_store_bytes = int(spill.group(1))
            current.spill_load_bytes = int(spill.group(2))
        used = re.search(r"Used (\d+) registers", line)
        if used:
            current.registers = int(used.group(1))
            shared = re.search(r"(\d+) bytes smem", line)
            current.static_shared_bytes = int(shared.group(1)) if shared else 0
    return [r for r in reports.values() if r.kernel.startswith("maxsim")]


def _check(nvrtc, status: int) -> None:
    if status != 0:
        nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"NVRTC error {status}: {nvrtc.nvrtcGetErrorString(status).decode()}")

