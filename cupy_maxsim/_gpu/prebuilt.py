"""Cubins compiled ahead of time and shipped in the wheel, so that a new process's first call
loads a kernel instead of compiling it (NVRTC takes seconds a family on an empty cache).

``python -m cupy_maxsim prebuild`` compiles every variant the planners ask for
(:func:`cupy_maxsim._plan.variants.runtime_variants`) for :data:`ARCHS` into :func:`folder`
(``cupy_maxsim/prebuilt/``, which the wheel carries: pyproject's ``artifacts``). NVRTC comes from
the nvidia-cuda-nvrtc wheels; no GPU is needed. A cubin's name holds a hash of everything that
went into it (the family's full source, the options, the architecture), so an edited kernel or a
new tile never meets a stale binary: it is simply not found, and compiles as before.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from pathlib import Path

from .nvrtc import compile_options
from .registry import ARCH_SPECIFIC, source

#: The architectures the wheel carries cubins for (the Hopper family: sm_90a). A cubin runs on
#: its own compute capability (and later minors of its major); others compile on first use.
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")


def folder() -> Path:
    """Where the prebuilt cubins live: inside the package (installed or in a checkout)."""
    return Path(__file__).resolve().parent.parent / "prebuilt"


def target_arch(family: str, compute_capability: int) -> str | None:
    """The architecture a device of ``compute_capability`` (10 * major + minor) runs ``family``
    built for; None where the family does not run there (wgmma off sm_90)."""
    native = f"sm_{compute_capability}"
    specific = ARCH_SPECIFIC.get(family)
    if specific is None:
        return native
    return specific if specific.rstrip("a") == native else None


def file_name(family: str, defines: tuple[str, ...], arch: str, code: str | None = None) -> str:
    """The cubin's file name: family, architecture and a hash of source, options and arch."""
    options = compile_options(arch, defines)
    digest = hashlib.sha256(repr((source(family) if code is None else code, options)).encode()).hexdigest()
    return f"{family}-{arch}-{digest[:32]}.cubin"


def find(family: str, defines: tuple[str, ...], compute_capability: int) -> Path | None:
    """The prebuilt cubin of this variant for this device, or None (compile it)."""
    if os.environ.get("CUPY_MAXSIM_NO_PREBUILT"):  # to measure or debug the compile path
        return None
    arch = target_arch(family, compute_capability)
    if arch is None or not folder().is_dir():
        return None
    path = folder() / file_name(family, defines, arch)
    return path if path.is_file() else None


def build(variants, archs=ARCHS, out: Path | None = None, jobs: int | None = None, progress=None) -> list[Path]:
    """Compile each (family, defines) of ``variants`` for each of ``archs`` (the Hopper family
    for sm_90a where sm_90 is asked for) into ``out`` (default :func:`folder`), ``jobs`` at a
    time in worker processes; cubins already there are kept. Returns every cubin's path;
    ``progress(done, total, path)`` after each. Raises RuntimeError with NVRTC's log on failure."""
    out = Path(out) if out is not None else folder()
    out.mkdir(parents=True, exist_ok=True)
    codes = {}
    work = []
    for family, defines in variants:
        code = codes.setdefault(family, source(family))
        for arch in archs:
            specific = ARCH_SPECIFIC.get(family)
            if specific is not None:
                if specific.rstrip("a") != arch:
                    continue
                arch = specific
            path = out / file_name(family, defines, arch, code)
            if path not in {p for *_, p in work}:
                work.append((family, defines, arch, path))
    paths = [path for *_, path in work]
    todo = [item for item in work if not item[-1].is_file()]
    done = len(work) - len(todo)
    with concurrent.futures.ProcessPoolExecutor(jobs or os.cpu_count() or 1) as pool:
        futures = [pool.submit(_build_one, *item) for item in todo]
        for future in concurrent.futures.as_completed(futures):
            path = future.result()
            done += 1
            if progress is not None:
                progress(done, len(work), path)
    return paths


def _build_one(family: str, defines: tuple[str, ...], arch: str, path: Path) -> Path:
    from .nvrtc import compile_image

    cubin = compile_image(family, arch, defines)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(cubin)
    os.replace(partial, path)  # atomic: an interrupted build leaves no half cubin
    return path
