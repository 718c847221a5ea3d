"""Where the host time of a training step goes (cupy_maxsim.torch.maxsim forward + backward on
the training shapes of bench_train), beside flash-maxsim's when it imports.

Per shape and provider: the host time per step (steps submitted without waiting on the GPU;
the training shapes' GPU work is shorter than the launch queue, so the host never blocks), the
same for our pieces (forward with the winners, backward_plan, plan.gradients), then cProfile
over 300 of our steps, then torch.profiler's CPU view of 100 steps of ours and of the empty
Function (torch's own share: autograd nodes, gradient accumulation, allocations), where the
step's host time beyond our pieces and the empty step's is to be found.

    python bench/profile_host_step.py > bench/results/profile-host-step-<date>-<commit>.txt
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402


def host_us(torch, fn, calls=100, rounds=7):
    """Best of ``rounds`` mean host microseconds per call of ``fn`` (no waiting between calls)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return min(runs), sorted(runs)[len(runs) // 2]


def _empty_function(torch):
    """An autograd.Function that allocates its outputs and launches nothing: the host floor of
    any step built on torch.autograd.Function."""

    class EmptyFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, d):
            ctx.save_for_backward(q, d)
            return q.new_empty((q.shape[0], d.shape[0]), dtype=torch.float32)

        @staticmethod
        def backward(ctx, grad):
            q, d = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(d)

    return EmptyFunction


def main() -> int:
    import torch

    import cupy_maxsim as cm
    import cupy_maxsim.torch as cmt

    empty_function = _empty_function(torch)

    try:
        import flash_maxsim as fm
    except Exception:  # noqa: BLE001 - measured only when importable
        fm = None
    for name, (nq, lq, nd, ld, dim) in SHAPES.items():
        q = _unit(torch, (nq, lq, dim), 1).requires_grad_(True)
        d = _unit(torch, (nd, ld, dim), 2).requires_grad_(True)
        grad = torch.randn(nq, nd, device="cuda")

        def step(fn=cmt.maxsim):
            q.grad = d.grad = None
            fn(q, d).backward(grad)

        qd, dd = q.detach(), d.detach()
        _, argmax = cm.score(qd, dd, return_argmax=True)
        plan = cm._api.backward_plan(qd, dd, argmax)
        pieces = {
            "step (ours)": step,
            "forward + winners": lambda: cm.score(qd, dd, return_argmax=True),
            "forward, no winners": lambda: cm.score(qd, dd),
            "backward_plan (CSR launch)": lambda: cm._api.backward_plan(qd, dd, argmax),
            "plan.gradients": lambda: plan.gradients(grad),
            "score_backward": lambda: cm.score_backward(grad, qd, dd, argmax),
        }
        if fm is not None:
            pieces["step (flash-maxsim)"] = lambda: step(fm.flash_maxsim_batched_train)
        pieces["step (empty Function)"] = lambda: step(empty_function.apply)
        print(f"== {name}")
        for label, fn in pieces.items():
            best, median = host_us(torch, fn)
            print(f"  {label:28s} host {best:7.1f} us (median of rounds {median:7.1f})")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(300):
            step()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(40)
        for label, fn in (("ours", step), ("empty Function", lambda: step(empty_function.apply))):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(100):
                    fn()
            torch.cuda.synchronize()
            print(f"-- torch.profiler, 100 steps ({label}), by self CPU time")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
