"""A wheel without some of its folders, to carry to the device machine within its 64 MB (Ray's
wheel is 79 MB, 32 of them Java jars; what cupy_maxsim.ray uses is its core):

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
        -d .whl ray==2.60.0 click msgpack protobuf jsonschema attrs referencing rpds-py jsonschema-specifications
    python bench/slim_wheel.py .whl/ray-2.60.0-*.whl ray/jars ray/rllib ray/data ray/train ray/tune \
        ray/serve ray/llm ray/dashboard/client

The wheel is rewritten in place, its RECORD without the dropped files (pip installs it as any
other); prints the sizes before and after.
"""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile


def slim(wheel: str, drop: list[str]) -> tuple[int, int]:
    """Rewrite ``wheel`` without the files under the folders ``drop``; (bytes before, after)."""
    prefixes = tuple(folder.rstrip("/") + "/" for folder in drop)
    before = os.path.getsize(wheel)
    handle, temporary = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(os.path.abspath(wheel)))
    os.close(handle)
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            if item.filename.startswith(prefixes):
                continue
            data = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(line for line in lines if not line.startswith(prefixes)) + "\n").encode()
            target.writestr(item, data)
    os.replace(temporary, wheel)
    return before, os.path.getsize(wheel)


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(__doc__)
        return 2
    before, after = slim(args[0], args[1:])
    print(f"{args[0]}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
