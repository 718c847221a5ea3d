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


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--prebuilt"] and len(argv) == 6:
        return prebuilt_matches(*argv[1:])
    if len(argv) < 4:
        print(__doc__)
        return 2
    family, arch, kernel, offsets, defines = argv[0], argv[1], argv[2], argv[3], tuple(argv[4:])
    from cupy_maxsim._gpu import nvrtc
    from cupy_maxsim._gpu.registry import source

    plain = nvrtc.compile_cubin(family, arch, defines)
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
