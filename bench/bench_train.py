"""Training-step benchmark: forward + backward into q and d, side by side with the peers.

Providers, each measured in this process and run: cupy_maxsim (``cupy_maxsim.torch.maxsim``,
argmax saved, atomic-free CSR backward), flash-maxsim 0.3.0 (``flash_maxsim_batched_train``,
its default backward), late-interaction-kernels 0.4.5 (``maxsim``), and naive PyTorch (einsum,
max, sum; autograd keeps the similarity tensor); beside them, as a floor, an autograd.Function
that only allocates the scores and the gradients (torch's own host cost of a step here). One step is ``scores = f(q, d)`` followed by
``scores.backward(g)`` with a fixed random g (what any loss on the scores hands back).

Per shape: median step time (bench_forward._median_ms: L2 flushed before each step, as the
anchors measured; and each step waiting for the last). The step is host-bound on some hosts,
and a process's host speed drifts while it runs, so the providers are measured in ROUNDS rounds,
round-robin, and each one's time is the median of its rounds' medians (every round kept). Also
the step captured as a CUDA graph and replayed (the device's time, no host path), the floor
(FLOPs of forward + backward at the bf16 rate measured in the same run, and bytes at the copy
bandwidth), our forward (with argmax) and backward separately, peak extra memory (above the
inputs and their gradients), and the gradients' agreement with naive fp32. Also the ColPali
in-batch run (128 queries x 128 pages x 1030 patches) with our peak extra memory beside naive
PyTorch's.

    python bench/bench_train.py --out bench/results/train-2026-11-29.json
    python bench/bench_train.py --shapes fat --out bench/results/train-fat-<date>-<commit>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import _median_ms, measure_ceilings, provenance  # noqa: E402

SHAPES = {
    "inbatch-colbert: 128x32 vs 128x300": (128, 32, 128, 300, 128),
    "inbatch-colpali: 32x32 vs 128x1030": (32, 32, 128, 1030, 128),
}
#: Issue 24's training line, fat embedding dims (``--shapes fat``): at least 2x flash-maxsim's step.
FAT_SHAPES = {
    "fat-320: 32x32 vs 128x768, dim 320": (32, 32, 128, 768, 320),
    "fat-2560: 32x32 vs 128x768, dim 2560": (32, 32, 128, 768, 2560),
}
#: The provider that is no MaxSim: torch autograd's own floor for a step on this host.
AUTOGRAD_FLOOR = "autograd_floor_allocations_only"
ANCHOR_MS = {"inbatch-colbert: 128x32 vs 128x300": 0.529, "inbatch-colpali: 32x32 vs 128x1030": 0.717}


def providers(torch):
    import cupy_maxsim.torch as cmt

    def naive(q, d):
        return torch.einsum("qtd,nld->qntl", q, d).amax(dim=-1).sum(dim=-1).float()

    class AllocationsOnly(torch.autograd.Function):
        """Not MaxSim: a step that allocates the scores and both gradients and launches nothing,
        the least any torch.autograd.Function step takes on this host (its time is the host's
        floor under a step; its gradients are garbage and never compared)."""

        @staticmethod
        def forward(ctx, q, d):
            ctx.q, ctx.d = q, d
            return torch.empty((q.shape[0], d.shape[0]), device=q.device)

        @staticmethod
        def backward(ctx, grad):
            return torch.empty_like(ctx.q), torch.empty_like(ctx.d)

    found = {"cupy_maxsim": cmt.maxsim, "naive_torch_fp16": naive, AUTOGRAD_FLOOR: AllocationsOnly.apply}
    notes = {}
    try:
        import flash_maxsim as fm

        found["flash_maxsim_0.3.0"] = fm.flash_maxsim_batched_train
    except Exception as error:  # noqa: BLE001 - any import failure means "not measured"
        notes["flash_maxsim_0.3.0"] = f"not importable: {error}"
    try:
        import late_interaction_kernels as lik

        found["late_interaction_kernels_0.4.5"] = lik.maxsim
    except Exception as error:  # noqa: BLE001
        notes["late_interaction_kernels_0.4.5"] = f"not importable: {error}"
    return found, notes


def _unit(torch, shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g)
    return torch.nn.functional.normalize(x, dim=-1).half()


#: Rounds per provider. Every provider's rounds, the floor's included, moved by 2-3x within one
#: process on the H200 lease's host (bench/results/train-summary-2026-11-30-21c3a3d.txt: the
#: allocations-only floor 0.030-0.238 ms, flash 0.461-0.749 ms): the median of 3 followed single
#: bursts, so 7.
ROUNDS = 7


def make_step(fn, q0, d0, grad):
    """(step, q, d): one training step of ``fn`` on copies of q0, d0 that want gradients."""
    q = q0.clone().requires_grad_(True)
    d = d0.clone().requires_grad_(True)

    def step():
        q.grad = None
        d.grad = None
        fn(q, d).backward(grad)

    return step, q, d


def graphed_ms(torch, step):
    """Median ms of the step captured once as a CUDA graph and replayed (L2 flushed before each
    replay): the device's time for a step, without its host path (in a real training step the
    encoder's work keeps the GPU busy while the host catches up). A string where the provider
    cannot be captured."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return _median_ms(torch, graph.replay, reps=30, warmup=3)
    except Exception as error:  # noqa: BLE001 - report, keep going
        torch.cuda.synchronize()
        return repr(error)[:200]


def measure_step(torch, fn, q0, d0, grad, reps=30):
    """(median ms, median ms synced, host ms, peak extra MB, grads, diagnostics) of forward +
    backward (the two timing methods of bench_forward._median_ms, and the host's time per step)."""
    step, q, d = make_step(fn, q0, d0, grad)

    step()  # compile / autotune outside the timing
    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    # Whether the caching allocator had to ask CUDA for memory while we timed (cudaMalloc in a
    # step stalls it), and every step's time: a step's spread tells a stall from a slow path.
    segments = torch.cuda.memory_stats().get("segment.all.allocated", 0)
    times = []
    ms = _median_ms(torch, step, reps=reps, warmup=3, times=times)
    synced = _median_ms(torch, step, reps=reps, warmup=3, synced=True)
    diagnostics = {"segments_allocated_while_timed": torch.cuda.memory_stats().get("segment.all.allocated", 0) - segments,
                   "step_ms_min_max": [min(times), max(times)]}
    host = []  # host time per step (submitted without waiting; best of 5 x 20 steps)
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            step()
        host.append((time.perf_counter() - start) / 20 * 1e3)
    torch.cuda.synchronize()
    return ms, synced, min(host), peak, (q.grad.float().clone(), d.grad.float().clone()), diagnostics


def run(args):
    import torch

    import cupy_maxsim as cm

    ceilings = measure_ceilings(torch)
    found, notes = providers(torch)
    rows = []
    shapes = FAT_SHAPES if args.shapes == "fat" else SHAPES
    for name, (nq, lq, nd, ld, dim) in shapes.items():
        q0, d0 = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
        grad = torch.randn(nq, nd, device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
        flops = 2 * nq * lq * nd * ld * dim  # the forward's products; the backward gathers
        byte_count = 2 * (q0.numel() + d0.numel()) * 2 + nq * nd * 4 * 2  # read inputs, write grads
        floor = max(flops / (ceilings["bf16_tflops"] * 1e9), byte_count / (ceilings["copy_tbps"] * 1e9))
        reference = None
        entry = {"shape": name, "nq": nq, "lq": lq, "nd": nd, "ld": ld, "dim": dim, "floor_ms": floor,
                 "anchor_flash_ms": ANCHOR_MS.get(name), "providers": {}}
        steps = {}
        for provider, fn in found.items():
            try:
                ms, synced, host, peak, grads, diagnostics = measure_step(torch, fn, q0, d0, grad)
            except Exception as error:  # noqa: BLE001 - report, keep going
                entry["providers"][provider] = {"error": repr(error)[:300]}
                continue
            result = {"ms_rounds": [ms], "ms_synced": synced, "ms_host": host, "peak_extra_mb": peak, **diagnostics}
            if provider == "naive_torch_fp16":
                reference = grads
            entry["providers"][provider] = result
            entry["providers"][provider]["_grads"] = grads
            steps[provider] = make_step(fn, q0, d0, grad)[0]
        for _ in range(args.rounds - 1):  # the later rounds, round-robin
            for provider, step in steps.items():
                entry["providers"][provider]["ms_rounds"].append(_median_ms(torch, step, reps=30, warmup=3))
        for provider in steps:
            result = entry["providers"][provider]
            result["ms"] = float(np.median(result["ms_rounds"]))
            result["fraction_of_floor"] = floor / result["ms"]
            result["ms_graphed"] = graphed_ms(torch, make_step(found[provider], q0, d0, grad)[0])
        for provider, result in entry["providers"].items():
            grads = result.pop("_grads", None)
            if grads is not None and reference is not None and provider != AUTOGRAD_FLOOR:
                result["max_grad_diff_vs_naive"] = [float((a - b).abs().max()) for a, b in zip(grads, reference)]
        # Our forward (with and without argmax) and backward alone.
        q, d = q0, d0
        entry["ours_forward_ms"] = _median_ms(torch, lambda: cm.score(q, d))
        entry["ours_forward_argmax_ms"] = _median_ms(torch, lambda: cm.score(q, d, return_argmax=True))
        _, argmax = cm.score(q, d, return_argmax=True)
        entry["ours_backward_ms"] = _median_ms(torch, lambda: cm.score_backward(grad, q, d, argmax))
        a = cm.score_backward(grad, q, d, argmax)
        b = cm.score_backward(grad, q, d, argmax)
        entry["ours_backward_bitwise_repeatable"] = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
        flash = entry["providers"].get("flash_maxsim_0.3.0", {}).get("ms")
        ours = entry["providers"]["cupy_maxsim"].get("ms")
        entry["speedup_vs_flash"] = flash / ours if flash and ours else None
        rows.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "providers"}), flush=True)
        del q0, d0, grad
        torch.cuda.empty_cache()

    colpali = colpali_inbatch(torch, found) if args.shapes == "default" else {}
    return {"provenance": provenance(), "ceilings": ceilings, "notes": notes, "rows": rows,
            "colpali_inbatch_128x128x1030": colpali}


def colpali_inbatch(torch, found):
    """ColPali in-batch contrastive step, 128 queries x 128 pages x 1030 patches: runs, and
    the peak extra memory of ours beside naive PyTorch's."""
    nq, lq, nd, ld, dim = 128, 32, 128, 1030, 128
    q0, d0 = _unit(torch, (nq, lq, dim), 4), _unit(torch, (nd, ld, dim), 5)
    labels = torch.arange(nq, device="cuda")
    out = {}
    for provider in ("cupy_maxsim", "naive_torch_fp16", "flash_maxsim_0.3.0"):
        fn = found.get(provider)
        if fn is None:
            continue

        def loss_fn(q, d, fn=fn):
            return torch.nn.functional.cross_entropy(fn(q, d) / 0.05, labels)

        try:
            q = q0.clone().requires_grad_(True)
            d = d0.clone().requires_grad_(True)
            loss_fn(q, d).backward()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            q.grad = d.grad = None
            loss = loss_fn(q, d)
            loss.backward()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 2**20
            ms = _median_ms(torch, lambda: loss_fn(q, d).backward(), reps=10, warmup=2)
            out[provider] = {"ms": ms, "peak_extra_mb": peak, "loss": float(loss.detach())}
        except Exception as error:  # noqa: BLE001
            out[provider] = {"error": repr(error)[:300]}
        torch.cuda.empty_cache()
    print(json.dumps(out), flush=True)
    return out


def table(report) -> str:
    lines = ["| shape | floor ms | provider | step ms | step ms synced | host ms | frac of floor | peak extra MB "
             "| vs flash | graphed ms | graphed vs flash |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        flash = row["providers"].get("flash_maxsim_0.3.0", {}).get("ms")
        for provider, result in row["providers"].items():
            if "ms" not in result:
                lines.append(f"| {row['shape']} | | {provider} | {result.get('error', '')[:60]} | | | | | | | |")
                continue
            speed = f"{flash / result['ms']:.2f}x" if flash else "-"
            graphed = result.get("ms_graphed")
            flash_graphed = row["providers"].get("flash_maxsim_0.3.0", {}).get("ms_graphed")
            graphed_text = f"{graphed:.3f}" if isinstance(graphed, float) else f"({str(graphed)[:40]})"
            graphed_speed = (f"{flash_graphed / graphed:.2f}x" if isinstance(graphed, float)
                             and isinstance(flash_graphed, float) else "-")
            lines.append(f"| {row['shape']} | {row['floor_ms']:.3f} | {provider} | {result['ms']:.3f} | "
                         f"{result['ms_synced']:.3f} | {result['ms_host']:.3f} | {result['fraction_of_floor']:.2f} | "
                         f"{result['peak_extra_mb']:.1f} | {speed} | {graphed_text} | {graphed_speed} |")
        lines.append(f"| {row['shape']} | | ours fwd / fwd+argmax / bwd | {row['ours_forward_ms']:.3f} / "
                     f"{row['ours_forward_argmax_ms']:.3f} / {row['ours_backward_ms']:.3f} | | | | | | | |")
    for provider, result in report["colpali_inbatch_128x128x1030"].items():
        if "ms" in result:
            lines.append(f"| colpali in-batch 128x128x1030 | | {provider} | {result['ms']:.3f} | | | | "
                         f"{result['peak_extra_mb']:.1f} | | | |")
        else:
            lines.append(f"| colpali in-batch 128x128x1030 | | {provider} | {result['error'][:60]} | | | | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON report path")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of every provider, round-robin")
    parser.add_argument("--shapes", choices=("default", "fat"), default="default",
                        help="default: ColBERT and ColPali in-batch (and the 128-query ColPali run); "
                             "fat: dims 320 and 2560, 32x32 vs 128x768 (issue 24)")
    args = parser.parse_args(argv)
    report = run(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
