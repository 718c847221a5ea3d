"""What a one-query call costs beyond its bytes: the median time (the anchors' method, L2 flushed
before each call) against corpora of 250 to 40,000 documents of 300 tokens (fp16, dim 128),
fit to a + b * bytes. a is the fixed cost (launch, prologue, the last documents' tail), 1 / b
the bandwidth the call streams at, beside the copy bandwidth measured in the same run. For
cupy_maxsim with 64- and 128-row tiles, flash-maxsim if installed, and a kernel that does
nothing (the launch alone), on the same data; the end-to-end time of back-to-back torch calls
on the rerank size (1,000 documents) too.

    python bench/fixed_cost.py [--label NAME] [--no-peers]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402

SIZES = (250, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 40_000)
QUERY_TOKENS, DOC_TOKENS, DIM = 32, 300, 128


def fit(sizes, times_ms, bytes_per_doc):
    """Least squares of time (us) on bytes: (fixed us, streaming TB/s)."""
    x = np.asarray(sizes, float) * bytes_per_doc
    slope, intercept = np.polyfit(x, np.asarray(times_ms) * 1e3, 1)
    return intercept, 1e-6 / slope if slope > 0 else float("inf")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="")
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args(argv)
    import torch

    import cupy_maxsim as cm
    copy_tbps = bench_forward.measure_ceilings(torch)["copy_tbps"]
    generator = torch.Generator(device="cuda").manual_seed(0)
    corpus = torch.randn(max(SIZES), DOC_TOKENS, DIM, device="cuda", generator=generator).half()
    query = torch.randn(QUERY_TOKENS, DIM, device="cuda", generator=generator).half()
    queries = query[None]
    providers = {}  # name: (tile rows of ours, the call)
    for rows in (None, 64, 128):
        providers[f"cupy_maxsim{args.label} {'planned' if rows is None else f'N{rows}'}"] = (
            rows, lambda d: cm.score(queries, d))
    if not args.no_peers:
        try:
            from flash_maxsim import flash_maxsim
            providers["flash_maxsim"] = (None, lambda d: flash_maxsim(query, d))
        except ImportError:
            pass
    one = torch.zeros(1, device="cuda")
    providers["empty kernel (launch only)"] = (None, lambda d: one.add_(1))

    bytes_per_doc = DOC_TOKENS * DIM * 2
    print(f"# copy bandwidth {copy_tbps:.2f} TB/s; floor = bytes / copy bandwidth")
    print(f"{'provider':34s}" + "".join(f"{n:>9d}" for n in SIZES) + "   fixed us  stream TB/s")
    print(f"{'floor (us)':34s}" + "".join(f"{n * bytes_per_doc / copy_tbps / 1e6:9.1f}" for n in SIZES))
    for name, (rows, fn) in providers.items():
        times = []
        with bench_forward.planner_settings(WGMMA_TILE_ROWS=rows):
            for n in SIZES:
                d = corpus[:n]
                times.append(bench_forward._median_ms(torch, lambda: fn(d), reps=30))
        fixed, tbps = fit(SIZES[2:], times[2:], bytes_per_doc)
        print(f"{name:34s}" + "".join(f"{t * 1e3:9.1f}" for t in times) + f"   {fixed:8.1f}  {tbps:11.2f}")
    rerank = corpus[:1_000]
    for name, (rows, fn) in providers.items():
        if "empty" in name:
            continue
        with bench_forward.planner_settings(WGMMA_TILE_ROWS=rows):
            us = bench_forward._host_loop_us(torch, lambda: fn(rerank))
        print(f"end to end, back-to-back, 1,000 docs: {name:34s} {us:6.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
