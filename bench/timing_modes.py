"""Is one query's time bimodal, and is it the GPU's state or our kernel? One cell (4 GB of
300-token documents), ours and flash-maxsim alternating in batches, every call timed alone
between CUDA events (L2 flushed before it, as bench_forward._median_ms), the GPU's SM and memory
clocks, power and temperature read (nvidia-smi, read only) between batches:

    python bench/timing_modes.py [--dtype float16] [--dim 64] [--batches 10] [--calls 20] [--out DIR]

fp16 dim 64 read 0.93 ms in some rounds and 1.02-1.09 in others of one process while
flash-maxsim stayed at 0.88 (bench/results/ab-tunables-2026-12-04-{6ba2ea0,8f99250}.json);
ncu read 0.917 ms (docs/notebook.md, thirty-second session). Prints each batch's median and
spread per provider with the clocks beside it; writes timing-modes-<date>-<commit>.json.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import _median_ms, write_record  # noqa: E402
from cliffs import unit  # noqa: E402

import cupy_maxsim as cm  # noqa: E402

_GPU_STATE = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def gpu_state() -> str:
    """nvidia-smi's SM and memory clocks, power, temperature and throttle reasons (a query, no
    setting changed), or why it could not be read."""
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={_GPU_STATE}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return f"unread: {error}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args()
    docs = round(4e9 / (300 * options.dim * 2))
    d = unit(torch, (docs, 300, options.dim), 0, options.dtype)
    q = unit(torch, (1, 32, options.dim), 1, options.dtype)
    providers = {"ours": lambda: cm.score(q, d)}
    try:
        import flash_maxsim

        providers["flash_maxsim"] = lambda: flash_maxsim.flash_maxsim(q[0], d)
    except ImportError:
        pass
    for call in providers.values():  # first-use builds and autotuners outside the timings
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    batches = []
    print(f"{options.dtype} dim {options.dim}, {docs} x 300 tokens, {options.calls} calls a batch")
    print("| batch | provider | median ms | min | max | GPU state after (SM MHz, mem MHz, W, C, reasons) |")
    print("|---|---|---|---|---|---|")
    for batch in range(options.batches):
        for name, call in providers.items():
            times = []  # every call's milliseconds, L2 flushed before each
            median = _median_ms(torch, call, reps=options.calls, warmup=0, times=times)
            state = gpu_state()
            batches.append(dict(batch=batch, provider=name, ms=times, state=state))
            print(f"| {batch} | {name} | {median:.4f} | {min(times):.4f} | {max(times):.4f} | {state} |",
                  flush=True)
    path = write_record(Path(options.out), "timing-modes", {"options": vars(options), "batches": batches})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
