"""Where the int8 Index's first stage loses to the bytes floor: one corpus of equal-length
documents (1M x 128 tokens x 128 dims by default) scored for one query of 32 tokens in four
layouts, in one process, rounds interleaved: fp16 padded (``score``), fp16 packed
(``score_packed``), int8 padded and int8 packed (per-token scales), and an int8 Index's search
(k=1000) over the same documents. Each against its own bytes floor (tokens, scales and offsets
at the copy rate measured in the run).

    python bench/ab_int8_layouts.py [--docs 1000000] [--rounds 7] [--out DIR] [--once]

Writes int8-layouts-<date>-<commit>.json; prints a table last.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from accept_search import interleaved, unit_corpus  # noqa: E402
from bench_forward import measure_ceilings, write_record  # noqa: E402


def corpus_arguments(doc: str) -> argparse.ArgumentParser:
    """The int8 benches' options: the corpus (documents of equal length, dim 128), rounds, out."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser


def main() -> None:
    parser = corpus_arguments(__doc__)
    parser.add_argument("--once", action="store_true",
                        help="call fp16 padded, int8 padded and int8 packed once each and stop (under ncu)")
    options = parser.parse_args()

    import cupy
    import torch

    import cupy_maxsim as cm

    ceilings = measure_ceilings(torch)
    n, t = options.docs, options.tokens
    d16 = unit_corpus(cupy, (n, t, 128), 0)
    q = unit_corpus(cupy, (1, 32, 128), 1)
    offsets = cupy.arange(n + 1, dtype=cupy.int64) * t
    d8, d_scale = cm.quantize_int8(d16)
    q8, q_scale = cm.quantize_int8(q)
    cells = {
        "fp16 padded": (lambda: cm.score(q, d16), d16.nbytes),
        "fp16 packed": (lambda: cm.score_packed(q, d16.reshape(n * t, 128), offsets), d16.nbytes + offsets.nbytes),
        "int8 padded": (lambda: cm.score(q8, d8, q_scale=q_scale, d_scale=d_scale), d8.nbytes + d_scale.nbytes),
        "int8 packed": (lambda: cm.score_packed(q8, d8.reshape(n * t, 128), offsets, q_scale=q_scale,
                                                d_scale=d_scale.reshape(n * t)),
                        d8.nbytes + d_scale.nbytes + offsets.nbytes),
    }
    if options.once:
        for name in ("fp16 padded", "int8 padded", "int8 packed"):
            cells[name][0]()
        cupy.cuda.Device().synchronize()
        return
    index = cm.Index(128, dtype="int8", device="cuda")
    index.add(d16)  # its own int8 store (about 17 GB beside the 33 GB fp16 corpus and its int8 copy)
    cells["int8 Index search k=1000"] = (lambda: index.search(q, 1000),
                                         index._tokens.nbytes + index._scales.nbytes + index._offsets.nbytes)
    cupy.cuda.Device().synchronize()
    times = interleaved(cupy, {name: cell[0] for name, cell in cells.items()}, options.rounds, 5)
    results = {name: {"ms": times[name], "bytes": nbytes, "floor_ms": nbytes / ceilings["copy_tbps"] / 1e9}
               for name, (_, nbytes) in cells.items()}
    record = {"ceilings": ceilings, "docs": n, "tokens": t, "results": results}
    path = write_record(options.out, "int8-layouts", record)
    print(f"{'layout':<28} {'ms':>7} {'floor':>7} {'x floor':>7}")
    for name, row in results.items():
        print(f"{name:<28} {row['ms']:7.3f} {row['floor_ms']:7.3f} {row['ms'] / row['floor_ms']:7.3f}")
    print(path)


if __name__ == "__main__":
    main()
