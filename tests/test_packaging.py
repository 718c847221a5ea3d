"""Packaging: kernel names, the source loader in a checkout and in an installed wheel."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cupy_maxsim._gpu import args as gpu_args
from cupy_maxsim._gpu import launch as gpu_launch
from cupy_maxsim._gpu import registry, tma
from support import stub_driver

ROOT = Path(__file__).resolve().parent.parent


#: A kernel defined outright, not through an ENTRY macro (the macros' own lines left out:
#: their NAME, or __launch_bounds__ before a line's end).
DEFINED = r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\('


def _defined(text: str) -> set[str]:
    return set(re.findall(DEFINED, text)) - {"NAME", "__launch_bounds__"}


def test_every_kernel_name_exists_in_its_source():
    for family, (filename, names) in registry.FAMILIES.items():
        text = registry.source(family)
        for name in names:
            assert re.search(rf"ENTRY\({name},", text) or name in _defined(text), \
                f"{name} missing from kernels_cu/{filename}"


def test_registry_is_complete():
    """The kernel registry is the one list of kernels: every .cu file is a registered family,
    every entry point in a source is registered, every family has compile variants (the CI
    compile check builds them), and the planners ask only for registered kernels (the guard's
    recorded decisions, tests/data/plan_decisions.json)."""
    import json

    from cupy_maxsim._plan.variants import compile_variants

    files = {path.name for path in (ROOT / "kernels_cu").glob("*.cu")}
    assert files == {filename for filename, _ in registry.FAMILIES.values()}
    for family, (filename, names) in registry.FAMILIES.items():
        text = (ROOT / "kernels_cu" / filename).read_text()
        entries = set(re.findall(r"^ENTRY\((\w+),", text, re.M)) | _defined(text)
        entries |= set(re.findall(r"^\s*MAXSIM_\w*ENTRY\((\w+),", text, re.M))
        assert entries <= set(names), f"{filename} defines unregistered kernels {entries - set(names)}"
    assert {family for family, _ in compile_variants()} == set(registry.FAMILIES)
    declared = {name for _, names in registry.FAMILIES.values() for name in names}
    decisions = json.loads((ROOT / "tests" / "data" / "plan_decisions.json").read_text())
    asked = {launch["kernel"] for launches in decisions.values() for launch in launches}
    assert asked <= declared, asked - declared
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        for stage in ("csr_dq", "dd", "fused"):
            assert registry.kernel_name("maxsim_bwd", dtype, stage) in declared
    with pytest.raises(KeyError):
        registry.kernel_name("maxsim_bwd", "int8", "dd")  # int8 has no gradient


def test_loader_finds_sources_in_checkout():
    assert registry.kernel_dir() == ROOT / "kernels_cu"
    assert "maxsim_fwd_mma" in registry.source("maxsim_fwd")


def test_every_cu_file_documents_itself():
    for path in (ROOT / "kernels_cu").glob("*.cu"):
        first = path.read_text().splitlines()[0]
        assert first.startswith(f"// {path.name}:"), path


def test_import_needs_only_numpy():
    code = "import sys, cupy_maxsim; bad = {'torch', 'jax', 'cupy'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_wheel_carries_kernels_and_loader_finds_them(tmp_path):
    pytest.importorskip("build")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for cu in (ROOT / "kernels_cu").iterdir():
        assert f"cupy_maxsim/kernels_cu/{cu.name}" in names
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    code = ("from cupy_maxsim._gpu import registry; p = registry.kernel_dir(); print(p); "
            "assert 'site' in str(p) and (p / 'maxsim_fwd.cu').is_file()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)})


@pytest.mark.parametrize("struct_name,fields,size", [
    ("ForwardArgs", gpu_args.FORWARD_ARGS, 32 * 8 + 8 * 4),
    ("BackwardArgs", gpu_args.BACKWARD_ARGS, 24 * 8 + 10 * 4),
])
def test_argument_structs_match_the_header(struct_name, fields, size):
    """gpu.args packs exactly the fields of each argument struct, in order, with their sizes."""
    header = (ROOT / "kernels_cu" / "common.cuh").read_text()
    body = re.search(r"struct " + struct_name + r" \{(.*?)\};", header, re.S).group(1)
    body = re.sub(r"//[^\n]*", "", body)
    parsed = []
    for declaration in body.split(";"):
        declaration = declaration.strip()
        if not declaration:
            continue
        kind = "i" if declaration.startswith("int ") else "Q" if "*" in declaration else "q"
        names = declaration.replace("*", " ").split(None, 1)[1] if kind != "Q" else declaration.split("*")[-1]
        for name in names.split(","):
            parsed.append((name.strip().split()[-1], kind))
    assert parsed == list(fields)
    packer = gpu_args.ArgStruct(fields)
    assert packer.size == size
    assert len(packer(**{name: 1 for name, _ in fields})) == size


@pytest.mark.parametrize("kernel,filename", [
    ("maxsim_offsets_summary", "maxsim_offsets.cu"), ("maxsim_parts_offsets", "maxsim_parts.cu"),
    ("maxsim_topk_select", "maxsim_topk.cu"),
    ("maxsim_topk_wide", "maxsim_topk.cu"),
    ("maxsim_topk_finish", "maxsim_topk.cu"), ("maxsim_topk_merge", "maxsim_topk.cu"),
    ("maxsim_quantize", "maxsim_quantize.cu"), ("maxsim_quantize_fp32_split", "maxsim_quantize.cu"),
    ("maxsim_split_documents", "maxsim_quantize.cu"), ("maxsim_split_exponents", "maxsim_quantize.cu"),
])
def test_small_kernels_parameters_match_their_entries(kernel, filename):
    """launch.SMALL_KERNEL_PARAMETERS packs what each small kernel's entry declares, in order:
    a pointer (Q), an i64 (q), an int (i)."""
    source = (ROOT / "kernels_cu" / filename).read_text()
    helper = {"maxsim_topk_select": "topk_select", "maxsim_topk_wide": "topk_wide",
              "maxsim_topk_finish": "topk_finish", "maxsim_topk_merge": "topk_merge",
              "maxsim_offsets_summary": "offsets_summary", "maxsim_parts_offsets": "parts_offsets",
              "maxsim_quantize": "quantize_rows<T>",
              "maxsim_quantize_fp32_split": "split_rows<false>", "maxsim_split_documents": "split_rows<true>",
              "maxsim_split_exponents": "split_exponent_rows"}[kernel]
    # Each entry is `NAME(parameters) { helper(arguments); }` inside its macro, or the same
    # under its own name where it is defined outright.
    entry = re.search(rf"(?:NAME|{kernel})\(([^)]*)\)\s*\{{\s*\\?\s*" + re.escape(helper) + r"\(",
                      source.replace("\\\n", " "), re.S)
    assert entry, kernel
    codes = ""
    for parameter in entry.group(1).replace("\\", " ").split(","):
        parameter = " ".join(parameter.split())
        codes += "Q" if "*" in parameter else "q" if parameter.startswith("i64") else "i" if parameter.startswith("int") else "?"
    assert codes == gpu_launch.SMALL_KERNEL_PARAMETERS[kernel]


def test_arg_template_patches_only_the_head():
    """A call's argument buffer (gpu_args.ArgTemplate): the struct packed once with the leading
    pointers patched in, after cuLaunchKernel's parameter array (the struct's address, then the
    second argument's, 16-byte aligned after the struct); later patches change only their
    fields; the head must lead the struct."""
    import ctypes
    import struct

    fields = gpu_args.BACKWARD_ARGS
    values = [1000 + k for k in range(len(fields))]
    template = gpu_args.ArgTemplate(gpu_args.backward_args, values, gpu_args.BACKWARD_HEAD)
    head = list(range(1, len(gpu_args.BACKWARD_HEAD) + 1))
    buffer = template(*head)
    address = ctypes.addressof(buffer)
    assert struct.unpack_from("<QQ", buffer, 0) == (address + gpu_args.ArgTemplate.HEADER, 0)
    size = gpu_args.backward_args.size
    assert gpu_args.ArgTemplate.struct_bytes(buffer, size) == gpu_args.backward_args.pack(head + values[len(head):])
    at, layout = gpu_args.ArgTemplate.fields_at(gpu_args.backward_args, gpu_args.BACKWARD_GRAD)
    layout.pack_into(buffer, at, 7, 8, 9)
    expected = head + values[len(head):]
    expected[len(head):len(head) + 3] = [7, 8, 9]
    assert gpu_args.ArgTemplate.struct_bytes(buffer, size) == gpu_args.backward_args.pack(expected)
    assert gpu_args.ArgTemplate.struct_bytes(template(*head), size) == gpu_args.backward_args.pack(
        head + values[len(head):])  # each call starts from the template

    forward = gpu_args.ArgTemplate(gpu_args.forward_args, [0] * len(gpu_args.FORWARD_ARGS), gpu_args.FORWARD_HEAD,
                                   extra_bytes=tma.DOC_TILE_MAP_BYTES)
    buffer = forward(1, 2, 3, 4, 5, 6, 7, 8)
    address = ctypes.addressof(buffer)
    extra_at = struct.unpack_from("<QQ", buffer, 0)[1] - address
    assert extra_at % 16 == 0 and extra_at >= gpu_args.ArgTemplate.HEADER + gpu_args.forward_args.size
    assert len(buffer) == extra_at + tma.DOC_TILE_MAP_BYTES
    with pytest.raises(AssertionError):
        gpu_args.ArgTemplate(gpu_args.forward_args, [0] * len(gpu_args.FORWARD_ARGS), ("d", "out"))


def test_prepared_launch_patches_its_own_buffer(monkeypatch):
    """gpu_launch.PreparedLaunch with a launch's own ArgTemplate, the driver stubbed (no GPU):
    each call hands cuLaunchKernel the kernel, the geometry, the stream and a parameter array
    whose first pointer is the struct with the call's pointers patched in and whose second is
    the tensor map of the call (copied only when it changes); launch_packed hands over the
    caller's buffer."""
    import ctypes
    import struct
    import types

    calls = []
    size = {"struct": gpu_args.forward_args.size}  # the bytes a launch's struct has

    def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        first, second = struct.unpack("<QQ", ctypes.string_at(params, 16))
        calls.append(((function, gx, gy, gz, bx, by, bz, shared, stream, extra),
                      ctypes.string_at(first, size["struct"]),
                      ctypes.string_at(second, tma.DOC_TILE_MAP_BYTES) if second else None))

    stub_driver(monkeypatch, launchKernel=launch_kernel)
    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xF00))
    values = [500 + k for k in range(len(gpu_args.FORWARD_ARGS))]
    template = gpu_args.ArgTemplate(gpu_args.forward_args, values, gpu_args.FORWARD_HEAD, tma.DOC_TILE_MAP_BYTES)
    launch = gpu_launch.PreparedLaunch(kernel, (7, 3), (384,), 1000, template)
    map_a, map_b = bytes([1]) * tma.DOC_TILE_MAP_BYTES, bytes([2]) * tma.DOC_TILE_MAP_BYTES
    launch((1, 2, 3, 4, 11, 12, 13, 14), 0xABC, map_a)
    launch((5, 6, 7, 0, 0, 0, 0, 0), 0xABC, map_a)
    launch((5, 6, 7, 0, 0, 15, 0, 0), 0xDEF, map_b)
    geometry = (0xF00, 7, 3, 1, 384, 1, 1, 1000)
    assert [call[0] for call in calls] == [geometry + (0xABC, 0), geometry + (0xABC, 0), geometry + (0xDEF, 0)]
    assert [call[1] for call in calls] == [gpu_args.forward_args.pack(head + values[8:]) for head in (
        [1, 2, 3, 4, 11, 12, 13, 14], [5, 6, 7, 0, 0, 0, 0, 0], [5, 6, 7, 0, 0, 15, 0, 0])]
    assert [call[2] for call in calls] == [map_a, map_a, map_b]

    calls.clear()
    size["struct"] = gpu_args.backward_args.size
    backward = gpu_args.ArgTemplate(gpu_args.backward_args, [0] * len(gpu_args.BACKWARD_ARGS), gpu_args.BACKWARD_HEAD)
    args = backward(*range(1, 10))
    gpu_launch.PreparedLaunch(kernel, (2,), (256,), 0).launch_packed(args, 0x123)
    assert calls[0][0] == (0xF00, 2, 1, 1, 256, 1, 1, 0, 0x123, 0) and calls[0][2] is None
    assert calls[0][1][:9 * 8] == struct.pack("<9Q", *range(1, 10))


def test_small_kernel_scalars_reach_the_driver(monkeypatch):
    """launch() of a small kernel's Scalars (one buffer, native alignment), the driver stubbed:
    cuLaunchKernel gets a pointer a parameter, each reading the value given, for every small
    kernel of SMALL_KERNEL_PARAMETERS."""
    import ctypes
    import struct
    import types

    seen = []

    def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = [ctypes.c_void_p.from_address(params + 8 * n).value for n in range(len(codes))]
        seen.append([struct.unpack("<" + code, ctypes.string_at(pointer, struct.calcsize(code)))[0]
                     for code, pointer in zip(codes, pointers)])  # (read now: the buffer is the launch's)

    stub_driver(monkeypatch, launchKernel=launch_kernel)
    kernel = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xF00))
    for name, codes in gpu_launch.SMALL_KERNEL_PARAMETERS.items():
        values = [2**40 + 3 * n if code in "Qq" else -5 - n if code == "i" else n for n, code in enumerate(codes)]
        seen.clear()
        gpu_launch.launch(kernel, (1,), (32,), gpu_launch.scalars(name, *values), 0, 0x1)
        assert seen == [values], name
    with pytest.raises(ValueError, match="takes 5 parameters"):
        gpu_launch.scalars("maxsim_offsets_summary", 1, 2)


def test_formats_match_the_codecs():
    """registry.FORMATS (Python) and codecs.cuh's Codec<T> (C++) describe the same element
    formats: the kernels' type, bits and scaling of every dtype, and nothing more on either side."""
    header = (ROOT / "kernels_cu" / "codecs.cuh").read_text()
    codecs = {ctype: (int(bits), scaled == "true")
              for ctype, bits, scaled in re.findall(r"^MAXSIM_CODEC\((\w+), (\d+), (\w+), \w+, \w+\)", header, re.M)}
    formats = list(registry.FORMATS.values()) + [registry.FP32_SPLIT]  # (the split: a format, not a dtype)
    assert codecs == {f.ctype: (f.bits, f.scaled) for f in formats}
    assert "sizeof(T)" not in "".join(p.read_text() for p in (ROOT / "kernels_cu").glob("*.cu"))


def test_no_device_function_over_200_lines():
    """The house rule for kernels_cu/: a device function (with its lambdas) fits a screenful or
    three; a longer one is split into named pieces."""
    from kernel_functions import device_functions

    lengths = {f"{path.name}:{line} {name}": length for path in sorted((ROOT / "kernels_cu").iterdir())
               for name, line, length in device_functions(path)}
    assert len(lengths) > 50  # the scanner sees the functions
    assert {where: n for where, n in lengths.items() if n > 200} == {}


def test_no_python_module_over_500_lines():
    """One job a module (issue 23): a module past 500 lines is doing two."""
    package = ROOT / "cupy_maxsim"
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in package.rglob("*.py")}
    assert {path: n for path, n in lengths.items() if n > 500} == {}


def test_every_extra_the_readme_installs_exists():
    """Each `.[a,b]` the README's commands and install lines name is an extra of pyproject.toml."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {name for group in re.findall(r'"\.\[([\w,-]+)\]"', (ROOT / "README.md").read_text())
             for name in group.split(",")}
    assert named and named <= extras, sorted(named - extras)
