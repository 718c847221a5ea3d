"""A/B of the selection kernel's histogram (maxsim_topk.cu): a match.any for every element (the
old way, -DTOPK_MATCH_ANY=1) against a shuffle and a vote for the common one-digit warp, on the
selection alone (all its rounds, the last one ranked), over search-shaped scores: 1 query x 1M
documents and 32 queries x 10k, k from 10 to 2048. CUDA events over back-to-back calls,
interleaved rounds, medians.

    python bench/ab_topk.py [--rounds 7] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import provenance  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    import cupy

    from cupy_maxsim import _topk
    from cupy_maxsim._gpu import compile as gpu_compile
    from cupy_maxsim._gpu import launch
    from cupy_maxsim._gpu.device import device_properties

    real_get_kernel = launch.get_kernel
    variant = {"defines": ()}

    def get_kernel(device, family, name, defines=(), shared_bytes=0):
        if family == "maxsim_topk":
            defines = tuple(defines) + variant["defines"]
        return real_get_kernel(device, family, name, defines, shared_bytes)

    launch.get_kernel = get_kernel
    sms = device_properties(0)[0]
    rng = cupy.random.default_rng(0)
    cells = {}
    for rows, n in ((1, 1_000_000), (32, 10_000)):
        # Scores as a search sees them: 32 tokens' maxima of unit vectors, a narrow range.
        scores = (20.0 + rng.standard_normal((rows, n), dtype=cupy.float32)).astype(cupy.float32)
        for k in (10, 100, 1000, 2048):
            cells[(rows, n, k)] = scores

    def selection(scores, k):
        return _topk.top_k_positions(cupy, scores, k, None, launch.top_k_select, 2 * sms, launch.TOPK_RANKED_MAX)[0]

    variants = {"match_any": ("-DTOPK_MATCH_ANY=1",), "vote": ()}
    outputs = {}
    for name, defines in variants.items():  # compile, warm, and the two agree
        variant["defines"] = defines
        outputs[name] = [selection(s, k).get() for (_, _, k), s in cells.items()]
    agree = all((a == b).all() for a, b in zip(*outputs.values()))
    times = {(name, cell): [] for name in variants for cell in cells}
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    calls = 20
    for _ in range(args.rounds):
        for name, defines in variants.items():
            variant["defines"] = defines
            for cell, scores in cells.items():
                selection(scores, cell[2])
                start.record()
                for _ in range(calls):
                    selection(scores, cell[2])
                stop.record()
                stop.synchronize()
                times[(name, cell)].append(cupy.cuda.get_elapsed_time(start, stop) / calls)
    launch.get_kernel = real_get_kernel
    gpu_compile._kernel_cache.clear()
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    table = [{"rows": c[0], "n": c[1], "k": c[2], **{name: median(times[(name, c)]) for name in variants}}
             for c in cells]
    record = {**provenance(), "agree": agree, "rounds": args.rounds, "calls": calls, "ms": table}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ab-topk-{datetime.date.today()}-{record.get('commit', 'unknown')}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"{'rows x n':<14} {'k':>5} {'match_any ms':>13} {'vote ms':>9} {'ratio':>6}")
    for row in table:
        print(f"{row['rows']} x {row['n']:<10} {row['k']:>5} {row['match_any']:>13.4f} {row['vote']:>9.4f} "
              f"{row['vote'] / row['match_any']:>6.3f}")
    print(f"results agree: {agree}; {path}")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
