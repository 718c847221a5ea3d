"""The device functions of kernels_cu/ and their lengths in lines (for the house rule that no
device function runs over 200 lines; tests/test_packaging.py holds the sources to it)."""

from __future__ import annotations

import re
from pathlib import Path

#: A device function's definition: __device__ (or a kernel's __global__), its name, its
#: parameters, then its body.
_HEAD = re.compile(r"__(?:device|global)__[^;{()]*?\b(\w+)\s*\(")


def _strip(text: str) -> str:
    """The source with comments and string literals blanked (newlines kept)."""
    def blank(match):
        return re.sub(r"[^\n]", " ", match.group(0))
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\])*"', blank, text, flags=re.S)


def device_functions(path: Path) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every device function defined in ``path``; a lambda or a
    local struct's method counts towards the function it sits in."""
    text = _strip(path.read_text())
    found, position = [], 0
    while True:
        match = _HEAD.search(text, position)
        if match is None:
            return found
        depth, k = 0, match.end() - 1
        while k < len(text):  # past the parameter list
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        rest = re.match(r"[^;{]*", text[k:])
        k += rest.end()
        if k >= len(text) or text[k] == ";":  # a declaration, not a definition
            position = k
            continue
        depth = 0
        while k < len(text):
            depth += {"{": 1, "}": -1}.get(text[k], 0)
            k += 1
            if depth == 0:
                break
        first = text.count("\n", 0, match.start()) + 1
        found.append((match.group(1), first, text.count("\n", match.start(), k) + 1))
        position = k


if __name__ == "__main__":
    for cu in sorted((Path(__file__).resolve().parent.parent / "kernels_cu").iterdir()):
        for name, line, length in device_functions(cu):
            if length > 100:
                print(f"{cu.name}:{line} {name} {length} lines")
