"""Prebuilt cubins (cupy_maxsim/_gpu/prebuilt.py): named by what went into them, built without
a GPU, carried by the wheel, found by an installed package, loaded before anything compiles,
and a cubin the driver refuses falls back to compiling."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cupy_maxsim._gpu import prebuilt
from cupy_maxsim._plan.variants import compile_variants, runtime_variants
from test_compile import _nvrtc_or_skip

ROOT = Path(__file__).resolve().parent.parent


def test_a_cubin_is_named_by_source_options_and_arch():
    name = prebuilt.file_name("maxsim_topk", (), "sm_80")
    assert name.startswith("maxsim_topk-sm_80-") and name.endswith(".cubin")
    assert prebuilt.file_name("maxsim_topk", (), "sm_80") == name
    assert prebuilt.file_name("maxsim_topk", (), "sm_86") != name
    assert prebuilt.file_name("maxsim_topk", ("-DX=1",), "sm_80") != name
    assert prebuilt.file_name("maxsim_topk", (), "sm_80", code="// edited\n") != name


def test_each_family_runs_the_arch_it_was_built_for():
    assert prebuilt.target_arch("maxsim_fwd", 86) == "sm_86"
    assert prebuilt.target_arch("maxsim_fwd_wgmma", 90) == "sm_90a"
    assert prebuilt.target_arch("maxsim_fwd_wgmma", 80) is None
    assert prebuilt.target_arch("maxsim_fwd_wgmma", 100) is None


def test_runtime_variants_are_the_compile_checks_without_the_shared_memory_assert():
    variants = runtime_variants()
    assert len(variants) == len(set(variants)) > 100
    assert all(not any(d.startswith("-DMAXSIM_EXPECT_SHARED_BYTES") for d in defines) for _, defines in variants)
    checked = {(f, tuple(d for d in ds if "EXPECT_SHARED" not in d)) for f, ds in compile_variants()}
    assert set(variants) == checked


def test_build_writes_cubins_that_find_locates(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    variants = [("maxsim_offsets", ()), ("maxsim_fwd_wgmma", runtime_variants()[-1][1])]
    seen = []
    paths = prebuilt.build(variants, ("sm_80", "sm_90"), tmp_path, jobs=2, progress=lambda *a: seen.append(a))
    # offsets for both archs, the Hopper family for sm_90a only
    assert sorted(p.name.split("-")[1] for p in paths) == ["sm_80", "sm_90", "sm_90a"]
    assert len(seen) == 3 and all(p.read_bytes()[:4] == b"\x7fELF" for p in paths)
    monkeypatch.setattr(prebuilt, "folder", lambda: tmp_path)
    assert prebuilt.find("maxsim_offsets", (), 80) == tmp_path / prebuilt.file_name("maxsim_offsets", (), "sm_80")
    assert prebuilt.find("maxsim_offsets", (), 89) is None  # not built for sm_89: compile
    assert prebuilt.find("maxsim_fwd_wgmma", variants[1][1], 90).name.split("-")[1] == "sm_90a"
    monkeypatch.setenv("CUPY_MAXSIM_NO_PREBUILT", "1")
    assert prebuilt.find("maxsim_offsets", (), 80) is None
    monkeypatch.delenv("CUPY_MAXSIM_NO_PREBUILT")
    before = {p: p.stat().st_mtime_ns for p in paths}
    assert prebuilt.build(variants, ("sm_80", "sm_90"), tmp_path) == paths  # kept, not rebuilt
    assert {p: p.stat().st_mtime_ns for p in paths} == before


def test_the_wheel_carries_prebuilt_cubins_and_the_installed_package_finds_them(tmp_path):
    """A copy of the project with one prebuilt cubin: the wheel carries it (git ignores the
    folder: pyproject's artifacts), and the installed package finds it where it was installed."""
    pytest.importorskip("build")
    _nvrtc_or_skip()
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", ".gitignore"):
        shutil.copy(ROOT / name, project / name)
    ignore = shutil.ignore_patterns("__pycache__", "prebuilt")
    shutil.copytree(ROOT / "cupy_maxsim", project / "cupy_maxsim", ignore=ignore)
    shutil.copytree(ROOT / "kernels_cu", project / "kernels_cu")
    (cubin,) = prebuilt.build([("maxsim_offsets", ())], ("sm_80",), project / "cupy_maxsim" / "prebuilt")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(project)],
                   check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("*.whl"))
    assert f"cupy_maxsim/prebuilt/{cubin.name}" in zipfile.ZipFile(wheel).namelist()
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    code = ("from cupy_maxsim._gpu import prebuilt; p = prebuilt.find('maxsim_offsets', (), 80); print(p); "
            f"assert p is not None and str(p).startswith({str(site)!r}), p")
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("CUPY_MAXSIM_NO_PREBUILT", None)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env=env)


@pytest.mark.gpu
def test_the_gpu_loads_a_prebuilt_cubin_and_compiles_when_the_driver_refuses_one(tmp_path, monkeypatch):
    _nvrtc_or_skip()
    import cupy

    from cupy_maxsim import _cache
    from cupy_maxsim._gpu import compile as gpu_compile
    from cupy_maxsim._gpu.device import device_properties

    device = cupy.cuda.runtime.getDevice()
    arch = prebuilt.target_arch("maxsim_offsets", device_properties(device)[3])
    (cubin,) = prebuilt.build([("maxsim_offsets", ())], (arch,), tmp_path)
    monkeypatch.setattr(prebuilt, "folder", lambda: tmp_path)
    monkeypatch.delenv("CUPY_MAXSIM_NO_PREBUILT", raising=False)
    _cache.clear_all()
    try:
        gpu_compile.get_kernel(device, "maxsim_offsets", "maxsim_offsets_summary")
        assert gpu_compile._modules[(device, "maxsim_offsets", ())][1] == cubin
        # What a driver older than the cubin would refuse, as another variant's cubin (CuPy
        # keeps a module it loaded from a path: the good one above would be served again).
        variant = ("-DCUPY_MAXSIM_TEST_VARIANT=1",)
        (tmp_path / prebuilt.file_name("maxsim_offsets", variant, arch)).write_bytes(b"not a cubin")
        with pytest.warns(RuntimeWarning, match="did not load"):
            kernel = gpu_compile.get_kernel(device, "maxsim_offsets", "maxsim_offsets_summary", variant)
        assert kernel is not None
        assert gpu_compile._modules[(device, "maxsim_offsets", variant)][1] is None  # compiled
    finally:
        _cache.clear_all()
