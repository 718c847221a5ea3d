"""A/B of the kernels' device time alone (torch.profiler's CUDA time per kernel), this tree
against another commit (imported as cupy_maxsim_base), for shapes where do_bench includes a
host path: which side of a difference is the GPU's.

    python bench/ab_kernel_times.py --base /tmp/base [--shapes inbatch-128:int8,rerank-1k:int8]
"""
from __future__ import annotations

import argparse
import collections
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ab_forward import unit_rows  # noqa: E402
from ab_host_step import import_base  # noqa: E402
from bench_forward import SHAPES  # noqa: E402

import cupy_maxsim  # noqa: E402


def kernel_us(call, calls=50, prefix="maxsim") -> dict:
    """Mean device microseconds per call of each CUDA kernel ``call`` launches whose name starts
    with ``prefix`` ("": every kernel)."""
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    totals = collections.Counter()
    for event in profile.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
    return {name: total / calls for name, total in totals.items() if name.startswith(prefix)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True)
    parser.add_argument("--shapes", default="inbatch-128:int8,rerank-1k:int8,colbert-256q-100k:float16")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    import_base(options.base)
    variants = {"base": importlib.import_module("cupy_maxsim_base"), "this tree": cupy_maxsim}
    for item in options.shapes.split(","):
        shape, dtype = item.split(":")
        nq, lq, nd, ld = SHAPES[shape]
        source = torch.bfloat16 if dtype == "bfloat16" else torch.float16
        q = unit_rows((nq, lq, 128) if nq > 1 else (lq, 128), 1, source)
        d = unit_rows((nd, ld, 128), 2, source)
        if dtype == "int8":
            (qv, qs), (dv, ds) = cupy_maxsim.quantize_int8(q), cupy_maxsim.quantize_int8(d)
            calls = {n: (lambda p=p: p.score(qv, dv, q_scale=qs, d_scale=ds)) for n, p in variants.items()}
        else:
            calls = {n: (lambda p=p: p.score(q, d)) for n, p in variants.items()}
        times = {n: collections.defaultdict(list) for n in calls}
        for round_ in range(options.rounds):
            for name, call in (list(calls.items()) if round_ % 2 == 0 else list(calls.items())[::-1]):
                for kernel, us in kernel_us(call).items():
                    times[name][kernel].append(us)
        for name in calls:
            print(f"{shape} {dtype} {name:10s} " + "; ".join(f"{k} " + " ".join(f"{x:.1f}" for x in v) + " us"
                                                         for k, v in times[name].items()), flush=True)
        del q, d
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
