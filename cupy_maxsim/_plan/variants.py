"""Every kernel variant the planners can ask for: what the compile checks and the CLI build.

The Hopper family's int8 entry and the mma.sync family's fp32 entry exist only where their
registers allow (the #if before each, mirrored by configs.int8_long_tiles,
configs.int8_docs_on_m_warpgroups and configs.fp32_entry);
:func:`family_kernels` says which kernels a variant defines, and the compile test holds the
source to it.
"""

from __future__ import annotations

from dataclasses import replace

from .._gpu.nvrtc import CompileReport, compile_with_nvrtc
from .._gpu.registry import ARCH_SPECIFIC, FAMILIES
from ..tuning import DEFAULT
from .configs import (LOAD_ALIGNMENTS, MMA_CONFIGS, STREAM_KSTEPS_CHOICES, choose_stages, fp32_entry, int8_docs_on_m_warpgroups,
                      int8_long_tiles, mma_config, wgmma_config)


def family_kernels(family: str, defines=()) -> tuple[str, ...]:
    """The kernels a family's source defines under ``defines`` (the Hopper kernel's int8 entry:
    see int8_long_tiles; the mma.sync kernel's fp32 entry: see fp32_entry)."""
    names = FAMILIES[family][1]
    value = dict(d[len("-D"):].split("=", 1) for d in defines)
    if family == "maxsim_fwd" and defines and not fp32_entry(
            int(value["MAXSIM_MT"]), int(value["MAXSIM_NT"]), int(value["MAXSIM_KSTEPS"]),
            int(value.get("MAXSIM_STREAM_K", 0))):
        names = tuple(name for name in names if not name.endswith("_fp32"))
    if family == "maxsim_fwd_wgmma":
        if (value.get("MAXSIM_TILE_N") == "128" and not int8_long_tiles(
                value.get("MAXSIM_SPLIT_DOCS") == "1", int(value["MAXSIM_KSTEPS"]))) or (
                value.get("MAXSIM_DOCS_ON_M") == "1" and int(value["MAXSIM_WARPGROUPS"]) > int8_docs_on_m_warpgroups(
                    value.get("MAXSIM_ARGMAX") == "1", int(value["MAXSIM_KSTEPS"]))):
            names = tuple(name for name in names if not name.endswith("_int8"))
    return names


_EXPECT_SHARED = "-DMAXSIM_EXPECT_SHARED_BYTES="


def _checked(config) -> tuple[str, ...]:
    """A tile configuration's defines, plus the shared memory Python gives its launches: the
    kernel's source asserts (static_assert) that its own SHARED_BYTES is the same."""
    return config.defines() + (f"{_EXPECT_SHARED}{config.shared_bytes}",)


def runtime_variants() -> list[tuple[str, tuple[str, ...]]]:
    """The variants of :func:`compile_variants` with the defines a GPU process compiles them
    with (the shared-memory check is the compile test's alone): what the wheel prebuilds."""
    variants = []
    for family, defines in compile_variants():
        variant = (family, tuple(d for d in defines if not d.startswith(_EXPECT_SHARED)))
        if variant not in variants:
            variants.append(variant)
    return variants


def compile_variants() -> list[tuple[str, tuple[str, ...]]]:
    """Every (family, defines) variant the dispatcher can ask for at dim 64, 96, 128 and 256,
    streaming k (fatter dims) and rows at each alignment below 16 bytes, with and without the
    argmax; the tensor-core forwards' with
    their shared memory checked."""
    variants = [("maxsim_fwd_simt", ()), ("maxsim_bwd", DEFAULT.bwd_defines), ("maxsim_offsets", ()), ("maxsim_topk", ()),
                ("maxsim_quantize", ())]
    for width in MMA_CONFIGS:
        for ksteps in (4, 6, 8, 16):
            config = mma_config(width, ksteps)
            if config is not None:
                variants.append(("maxsim_fwd", _checked(config)))
                variants.append(("maxsim_fwd", _checked(mma_config(width, ksteps, argmax=True))))
        for argmax in (False, True):  # streaming k: every dim past the resident query block
            for stream_ksteps in STREAM_KSTEPS_CHOICES:
                config = choose_stages(mma_config(width, 0, argmax, stream=True, stream_ksteps=stream_ksteps))
                variants.append(("maxsim_fwd", _checked(config)))
    for load_bytes in LOAD_ALIGNMENTS[:-1]:  # rows not 16-byte aligned (odd dims), dim 100-ish
        for argmax in (False, True):
            variants.append(("maxsim_fwd", _checked(replace(mma_config(32, 7, argmax), load_bytes=load_bytes))))
        variants.append(("maxsim_fwd", _checked(replace(mma_config(256, 7), load_bytes=load_bytes))))
    for ksteps in (4, 6, 8):
        for argmax in (False, True):
            for warpgroups in (1, 2, 3):  # 1: one query group, documents split
                for tile_n in (64, 128):
                    for query_rows in (32, 64) if warpgroups == 1 else (64,):  # 32: half rows
                        config = wgmma_config(ksteps, argmax, warpgroups, tile_n, query_rows)
                        variants.append(("maxsim_fwd_wgmma", _checked(config)))
        for warpgroups in (2, 3):  # documents on M (int8: see int8_docs_on_m_warpgroups)
            for argmax in (False, True):
                for int8 in (False, True):
                    config = wgmma_config(ksteps, argmax, warpgroups, docs_on_m=True, int8=int8)
                    if ("maxsim_fwd_wgmma", _checked(config)) not in variants:
                        variants.append(("maxsim_fwd_wgmma", _checked(config)))
    return variants


def compile_targets(family: str, archs) -> tuple[str, ...]:
    """The architectures among ``archs`` that ``family`` is built for (sm_90a stands for sm_90)."""
    arch = ARCH_SPECIFIC.get(family)
    if arch is None:
        return tuple(archs)
    return (arch,) if arch.rstrip("a") in archs else ()


def compile_all(archs=("sm_80", "sm_86", "sm_89", "sm_90")) -> list[CompileReport]:
    """Compile every kernel variant for every architecture through NVRTC (no GPU needed)."""
    reports = []
    for family, defines in compile_variants():
        for arch in compile_targets(family, archs):
            reports += compile_with_nvrtc(family, arch, defines)
    return reports
