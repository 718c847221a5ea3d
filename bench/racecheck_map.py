"""Where a compute-sanitizer report's SASS offsets are in the source, without a GPU: compile
the kernel variant through NVRTC (the device's version: its offsets are the report's), with
-lineinfo, disassemble it with nvdisasm and print each offset's instruction and source line
(the family's concatenated source: headers first, as registry.source builds it).

    python bench/racecheck_map.py maxsim_fwd_wgmma sm_90a maxsim_fwd_wgmma_fp16 0x2b00,0x74a0 \\
        -DMAXSIM_WARPGROUPS=3 -DMAXSIM_KSTEPS=4 ...

Which variant a report came from, where the kernels ran from the package's prebuilt cubins:
the cubins whose instructions at the read and the write offset are a shared-memory load and
store, with their defines (then map those as above, with the NVRTC that built the cubins):

    python bench/racecheck_map.py --prebuilt maxsim_fwd_wgmma sm_90a maxsim_fwd_wgmma_fp16 0x2b10 0x74f0

On the GPU machine, every read/write pair of a whole racecheck report mapped at once: the script
that made the report is run again (not under the sanitizer) with the builds it asks for noted,
each architecture-specific build compiled by CuPy's NVRTC (the report's compiler) with and
without -lineinfo, and each pair printed with the builds whose SASS has a shared-memory load and
store there, and their source lines:

    python bench/racecheck_map.py --report racecheck.log bench/sanitize_forward.py tf32-rows

NVRTC and nvdisasm come from the nvidia-cuda-nvrtc and nvidia-cuda-nvdisasm wheels (or a
toolkit): NVDISASM names the binary; the NVRTC found first on sys.path is used.
"""

import os
import re
import subprocess
import sys
import tempfile


def instruction(listing: str, kernel: str, offset: str):
    """The instruction at ``offset`` (hex) of ``kernel`` in an nvdisasm listing, or None."""
    start = listing.find(f".text.{kernel}:")
    if start < 0:
        return None
    end = listing.find(".text.", start + 10)
    found = re.search(rf"/\*{int(offset, 16):04x}\*/\s+([^;]*);", listing[start:end if end > 0 else None])
    return " ".join(found.group(1).split()) if found else None


def prebuilt_matches(family: str, arch: str, kernel: str, read: str, write: str) -> int:
    """Print the prebuilt cubins (and defines) whose ``kernel`` has a shared-memory load at
    ``read`` and a store at ``write``."""
    from cupy_maxsim._gpu import prebuilt
    from cupy_maxsim._plan.variants import runtime_variants

    tool = os.environ.get("NVDISASM", "nvdisasm")
    for variant_family, defines in runtime_variants():
        path = prebuilt.folder() / prebuilt.file_name(family, defines, arch)
        if variant_family != family or not path.exists():
            continue
        listing = subprocess.run([tool, "-c", str(path)], capture_output=True, text=True, check=True).stdout
        load, store = instruction(listing, kernel, read), instruction(listing, kernel, write)
        if load and store and "LDS" in load and "STS" in store:
            print(f"{path.name}: read {load} | write {store}\n    {' '.join(defines)}")
    return 0


def report_pairs(log: str) -> list:
    """((kernel, read offset, write offset), hazards) of each race in a racecheck report, its
    hazards summed over the launches that reported it: the default analysis report ("Race
    reported between Read access at K+R and Write access at K+W [N hazards]"), or the hazard
    report (``--racecheck-report hazard``: one "Potential ... hazard" a byte, its Read and
    Write accesses a line each; counted one a hazard shown)."""
    found = re.findall(r"Read access at (\w+)\+(0x[0-9a-f]+)\s*\n[= ]*and Write access at \w+\+(0x[0-9a-f]+)"
                       r" \[(\d+) hazards\]", log)
    found += [(kernel, read, write, "1") for kernel, read, write in re.findall(
        r"Potential \w+ hazard detected[^\n]*\n[= ]*Read Thread \([\d,]+\) at (\w+)\+(0x[0-9a-f]+)\s*\n"
        r"[= ]*Write Thread \([\d,]+\) at \w+\+(0x[0-9a-f]+)", log)]
    pairs = {}
    for kernel, read, write, n in found:
        pairs[(kernel, read, write)] = pairs.get((kernel, read, write), 0) + int(n)
    return sorted(pairs.items())


def asked_builds(script: str, args: list) -> list:
    """The (family, defines) of every kernel ``script`` asks the forward and backward for."""
    import runpy

    from cupy_maxsim._gpu import compile as gpu_compile

    asked, get_kernel = [], gpu_compile.get_kernel

    def noting(device, family, name, defines=(), *rest):
        if (family, defines) not in asked:
            asked.append((family, defines))
        return get_kernel(device, family, name, defines, *rest)

    gpu_compile.get_kernel = noting
    sys.argv = [script] + args
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        pass
    return asked


def cupy_listing(family: str, arch: str, defines: tuple, extra: tuple) -> str:
    """nvdisasm's listing of a build compiled as the package compiles it (CuPy's NVRTC)."""
    from cupy_maxsim._gpu import nvrtc

    cubin = nvrtc._compile(family, arch, defines, extra, nvrtc.cupy_nvrtc())[1]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        tool = os.environ.get("NVDISASM", "nvdisasm")
        done = subprocess.run([tool, "-c", "-g", path], capture_output=True, text=True)
        if done.returncode:  # (an nvdisasm older than the NVRTC refuses its cubins: carry the
            # nvidia-cuda-nvdisasm wheel of the NVRTC's version and name its binary in NVDISASM)
            raise RuntimeError(f"{tool} failed on {family} {' '.join(defines)}: {done.stderr.strip()}")
        return done.stdout


def source_line(listing: str, kernel: str, offset: str, lines: list) -> str:
    """The source line nvdisasm -g gives for ``offset`` of ``kernel`` (a -lineinfo build)."""
    body = listing[listing.find(f".text.{kernel}:"):]
    current = None
    for line in body.splitlines():
        where = re.search(r"line (\d+)", line) if "//## File" in line else None
        if where:
            current = int(where.group(1))
        if re.search(rf"/\*{int(offset, 16):04x}\*/", line):
            return f"line {current}: {lines[current - 1].strip()}" if current else "line ?"
    return "not found"


def map_report(log_path: str, script: str, args: list) -> int:
    """Print each race of the report with the builds and source lines of its two offsets."""
    from cupy_maxsim._gpu.registry import ARCH_SPECIFIC, source

    pairs = report_pairs(open(log_path).read())
    builds = [(f, d) for f, d in asked_builds(script, args) if f in ARCH_SPECIFIC]
    print(f"{len(pairs)} read/write pairs, {len(builds)} architecture-specific builds asked")
    listings = [(f, d, cupy_listing(f, ARCH_SPECIFIC[f], d, ()), cupy_listing(f, ARCH_SPECIFIC[f], d, ("-lineinfo",)))
                for f, d in builds]
    for (kernel, read, write), hazards in pairs:
        print(f"\n{kernel} read {read} write {write} ({hazards} hazards)")
        for family, defines, plain, lined in listings:
            load, store = instruction(plain, kernel, read), instruction(plain, kernel, write)
            if not (load and store and "LD" in load and "ST" in store):
                continue
            lines = source(family).splitlines()
            print(f"  {' '.join(d for d in defines if 'EXPECT' not in d)}")
            for offset, text in ((read, load), (write, store)):
                same = instruction(lined, kernel, offset) == text
                print(f"    {offset} {text} <- {source_line(lined, kernel, offset, lines)}"
                      f"{'' if same else '  (the -lineinfo build differs here)'}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--report"] and len(argv) >= 3:
        return map_report(argv[1], argv[2], argv[3:])
    if argv[:1] == ["--prebuilt"] and len(argv) == 6:
        return prebuilt_matches(*argv[1:])
    if len(argv) < 4:
        print(__doc__)
        return 2
    family, arch, kernel, offsets, defines = argv[0], argv[1], argv[2], argv[3], tuple(argv[4:])
    from cupy_maxsim._gpu import nvrtc
    from cupy_maxsim._gpu.registry import source

    plain = nvrtc.compile_image(family, arch, defines)
    lined = nvrtc._compile(family, arch, defines, ("-lineinfo",))[1]
    tool = os.environ.get("NVDISASM", "nvdisasm")
    lines = source(family).splitlines()
    with tempfile.TemporaryDirectory() as folder:
        listings = []
        for name, cubin in (("plain", plain), ("lined", lined)):
            path = os.path.join(folder, f"{name}.cubin")
            with open(path, "wb") as f:
                f.write(cubin)
            listings.append(subprocess.run([tool, "-c", "-g", path], capture_output=True, text=True, check=True).stdout)
    for name, listing in zip(("without -lineinfo (the report's build)", "with -lineinfo"), listings):
        body = listing[listing.index(f".text.{kernel}:"):]
        body = body[:body.find("//--------------------- .text.", 1) if "//--------------------- .text." in body[1:] else None]
        print(f"# {kernel}, {name}")
        current = None
        for line in body.splitlines():
            where = re.search(r'line (\d+)', line) if "//## File" in line else None
            if where:
                current = int(where.group(1))
            for offset in offsets.split(","):
                if re.search(rf"/\*{int(offset, 16):04x}\*/", line):
                    text = lines[current - 1].strip() if current else "?"
                    print(f"{offset}: {line.strip()}    <- line {current}: {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
