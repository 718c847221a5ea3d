"""A/B of this tree against another commit in one process: the forward on every ANCHORS shape
(fp16, bf16, int8), the training step, and a small call's host path.

The other commit's package is imported as ``cupy_maxsim_base`` (bench/ab_host_step.import_base);
both score the same torch tensors, round-robin over rounds, each time with the anchors' method
(bench_forward._median_ms: L2 flushed, median of CUDA-event timings). Per row: each variant's
median over rounds and this tree's ratio to the base (a restructuring must stay within 3%).

    git archive <commit> cupy_maxsim kernels_cu | tar -x -C /tmp/base
    python bench/ab_forward.py --base /tmp/base --out bench/results/ab-forward-<date>-<commit>.txt
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ab_host_step import import_base, round_robin  # noqa: E402
from bench_forward import SHAPES, _host_loop_us, _median_ms, provenance  # noqa: E402
from bench_train import SHAPES as TRAIN_SHAPES, _unit, make_step  # noqa: E402

import cupy_maxsim  # noqa: E402
import cupy_maxsim.torch as cmt  # noqa: E402

FORWARD_SHAPES = ("rerank-1k", "corpus-10k", "colpali-1q-10k", "colpali-32q-10k", "inbatch-128", "colbert-1q-1M",
                  "colbert-256q-100k")


def unit_rows(shape, seed, dtype):
    """Random unit-norm rows of ``dtype``, made in chunks (a 1M x 128 x 128 corpus is 32 GB
    of fp16; its float32 temporaries would not fit beside it)."""
    out = torch.empty(shape, dtype=dtype, device="cuda")
    flat = out.view(-1, shape[-1])
    step = 2**22
    for start in range(0, flat.shape[0], step):
        flat[start:start + step] = _unit(torch, (min(step, flat.shape[0] - start), shape[-1]), seed + start).to(dtype)
    return out


def forward_calls(package, dtype, q, d, quantized):
    if dtype == "int8":
        (qv, qs), (dv, ds) = quantized
        return lambda: package.score(qv, dv, q_scale=qs, d_scale=ds)
    return lambda: package.score(q, d)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="a folder with another commit's cupy_maxsim and kernels_cu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtypes", default="float16,bfloat16,int8")
    parser.add_argument("--shapes", default=",".join(FORWARD_SHAPES))
    parser.add_argument("--out", help="also write the table here")
    options = parser.parse_args()
    base_torch = import_base(options.base)
    base = importlib.import_module("cupy_maxsim_base")
    variants = {"base": base, "this tree": cupy_maxsim}
    lines = [f"# {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d %H:%M')}: bench/ab_forward.py --base "
             f"{options.base}; {options.rounds} rounds round-robin; ms = median over rounds of do_bench medians; "
             f"provenance {provenance()}",
             "| case | base ms | this tree ms | ratio | base rounds | this tree rounds |", "|---|---|---|---|---|---|"]

    def row(case, times):
        b, t = statistics.median(times["base"]), statistics.median(times["this tree"])
        lines.append(f"| {case} | {b:.4f} | {t:.4f} | {t / b:.3f} | " + " ".join(f"{x:.4f}" for x in times["base"])
                     + " | " + " ".join(f"{x:.4f}" for x in times["this tree"]) + " |")
        print(lines[-1], flush=True)
        if options.out:  # as it goes: a run cut at its limit keeps its rows
            Path(options.out).write_text("\n".join(lines) + "\n")

    for dtype in options.dtypes.split(","):
        for shape in options.shapes.split(","):
            nq, lq, nd, ld = SHAPES[shape]
            source = torch.bfloat16 if dtype == "bfloat16" else torch.float16
            q = unit_rows((nq, lq, 128) if nq > 1 else (lq, 128), 1, source)
            d = unit_rows((nd, ld, 128), 2, source)
            quantized = (cupy_maxsim.quantize_int8(q), cupy_maxsim.quantize_int8(d)) if dtype == "int8" else None
            if quantized is not None:
                del d
                d = None
            calls = {name: forward_calls(package, dtype, q, d, quantized) for name, package in variants.items()}
            reps = 10 if nd * ld >= 10**7 and nq > 1 else 30
            times = {name: [] for name in calls}
            for round_ in range(options.rounds):
                # Alternate which goes first (ABBA): the first of a pair measured up to 1.5%
                # faster on compute-bound shapes (ab-forward-2026-12-01-d1e19cb.txt, same kernels).
                for name, call in (list(calls.items()) if round_ % 2 == 0 else list(calls.items())[::-1]):
                    times[name].append(_median_ms(torch, call, reps=reps))
            row(f"{shape} {dtype}", times)
            del q, d, quantized, calls
            torch.cuda.empty_cache()
    # Training step (fwd + bwd through the torch adapter), and the host's microseconds per
    # free-running step.
    adapters = {"base": base_torch.maxsim, "this tree": cmt.maxsim}
    for shape, (nq, lq, nd, ld, dim) in TRAIN_SHAPES.items():
        q0, d0 = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
        grad = torch.randn(nq, nd, device="cuda")
        steps = {name: make_step(fn, q0, d0, grad)[0] for name, fn in adapters.items()}
        host, times = round_robin(steps, options.rounds + 2)
        row(f"train {shape} do_bench", times)
        row(f"train {shape} host ms/step", {name: [us / 1e3 for us in values] for name, values in host.items()})
    # rerank-1k end to end with torch tensors, back to back (the README's per-call figure).
    q, d = _unit(torch, (32, 128), 1), _unit(torch, (1000, 300, 128), 2)
    calls = {name: (lambda package=package: package.score(q, d)) for name, package in variants.items()}
    per_call = {name: [] for name in calls}
    for _ in range(options.rounds + 2):
        for name, call in calls.items():
            per_call[name].append(_host_loop_us(torch, call, calls=500) / 1e3)
    row("rerank-1k end to end, ms per call back to back", per_call)


if __name__ == "__main__":
    main()
