"""Every kernel variant compiles through NVRTC for sm_80, sm_86, sm_89 and sm_90, with no GPU,
and the ptxas report shows no spills, stack frames or serialized wgmma."""

import os

import pytest

from cupy_maxsim._gpu import nvrtc
from cupy_maxsim._gpu.registry import ARCH_SPECIFIC
from cupy_maxsim._plan.variants import (compile_targets, compile_variants, family_kernels, first_use_variants,
                                        tunable_variants)

ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]


def _nvrtc_or_skip():
    """NVRTC comes with the test extra; without it (e.g. on the bare GPU image) skip, unless
    CUPY_MAXSIM_REQUIRE_NVRTC is set, as .ci/run does, so that CI can never skip silently."""
    try:
        nvrtc._find_nvrtc()
    except RuntimeError as error:
        if os.environ.get("CUPY_MAXSIM_REQUIRE_NVRTC"):
            raise
        pytest.skip(str(error))


def _assert_clean(report) -> None:
    """ptxas's report of one kernel: registers used, no spills, no stack frame, no serialized
    wgmma. Local memory (an array ptxas could not keep in registers) and serialized wgmma
    compile silently and cost much: a documents-on-M reduction indexed at run time once put the
    maxima in a 128-byte stack frame, and an MMA issued before divergent code serialized every
    wgmma of the kernel (both measured slower on the H200)."""
    assert report.registers > 0, report
    assert report.spill_store_bytes == 0 and report.spill_load_bytes == 0, report
    assert report.stack_frame_bytes == 0 and not report.serialized_wgmma, report


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("family,defines", compile_variants(),
                         ids=lambda v: v if isinstance(v, str) else "-".join(d.split("=")[1] for d in v) or "default")
def test_compiles_without_spills(arch, family, defines):
    targets = compile_targets(family, [arch])
    if not targets:
        pytest.skip(f"{family} is built for {ARCH_SPECIFIC[family]} only")
    arch = targets[0]
    _nvrtc_or_skip()
    reports = nvrtc.compile_with_nvrtc(family, arch, defines)
    expected = set(family_kernels(family, defines))
    assert {r.kernel for r in reports} == expected
    for report in reports:
        _assert_clean(report)


@pytest.mark.parametrize("arch,family,defines", first_use_variants(),
                         ids=lambda v: v if isinstance(v, str) else "-".join(d.split("=")[1] for d in v) or "default")
def test_first_use_builds_compile_without_spills(arch, family, defines):
    """The builds of rows on 4 or 8 bytes the planner asks for beyond the compile list (they
    compile at first use, not prebuilt): each on its own architecture, no spills either."""
    _nvrtc_or_skip()
    target = compile_targets(family, [arch])[0]
    for report in nvrtc.compile_with_nvrtc(family, target, defines):
        _assert_clean(report)


@pytest.mark.parametrize("family,defines", tunable_variants(),
                         ids=lambda v: v if isinstance(v, str) else "-".join(d.split("=")[1] for d in v) or "default")
def test_tunable_builds_compile_without_spills(family, defines):
    """The builds opt-in tunables ask for (documents on M in turns), on sm_90: no spills either."""
    _nvrtc_or_skip()
    reports = nvrtc.compile_with_nvrtc(family, compile_targets(family, ["sm_90"])[0], defines)
    assert {r.kernel for r in reports} == set(family_kernels(family, defines))
    for report in reports:
        _assert_clean(report)


def test_every_serialization_remark_counts():
    """ptxas names several causes of serialized wgmma (C7518, C7519, C7520, ...), each one a
    kernel whose MMAs wait for one another; a parser that knew only C7518 passed a C7520 build
    (a branch within a wgmma group, 2026-12-06). C7517, an injected wait, is not one of them."""
    log = "\n".join([
        "ptxas info    : (C7520) Potential Performance Loss: wgmma.mma_async instructions are serialized due to"
        " program dependence on compiler-inserted WG.AR in divergent path in the function 'maxsim_a'",
        "ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized due to"
        " the presence of Extern calls in the function 'maxsim_b'",
        "ptxas info    : (C7517) warpgroup.wait is injected in around line 1115 by compiler to allow use of"
        " registers defined by GMMA in function 'maxsim_c'",
        "ptxas info    : Compiling entry function 'maxsim_c' for 'sm_90a'",
        "ptxas info    : Used 128 registers, used 1 barriers, 0 bytes smem",
    ])
    reports = {r.kernel: r for r in nvrtc._parse_ptxas(log, "sm_90a", ())}
    assert reports["maxsim_a"].serialized_wgmma and reports["maxsim_b"].serialized_wgmma
    assert not reports["maxsim_c"].serialized_wgmma and reports["maxsim_c"].registers == 128


def test_images_keep_subnormals_and_past_the_known_archs_are_ptx():
    """The one compile (prebuilt cubins and a GPU process's first use alike) keeps subnormal
    floats: no -ftz=true, which CuPy's own compile adds (a query token whose largest element is
    subnormal split as zeros: tests/test_fp32_split.py); and a device newer than the NVRTC
    knows gets the PTX of the newest architecture it does, which the driver compiles."""
    _nvrtc_or_skip()
    library = nvrtc._find_nvrtc()
    assert nvrtc.device_arch(library, 90) == "sm_90" and nvrtc.device_arch(library, 80) == "sm_80"
    newest = nvrtc.device_arch(library, 1000)
    assert newest.startswith("compute_")
    ptx = nvrtc.compile_image("maxsim_quantize", newest, (), library).decode()
    assert ".entry maxsim_split_documents" in ptx and "mul.f32" in ptx and ".ftz" not in ptx
    flushed = nvrtc._compile("maxsim_quantize", newest, (), ("-ftz=true",), library)[1].decode()
    assert "mul.ftz.f32" in flushed  # (what the check would see)
