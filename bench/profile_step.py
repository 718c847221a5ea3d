"""Timeline of one training step (cupy_maxsim.torch.maxsim forward + backward) on the training
shapes: when each host call and each GPU kernel starts and ends, relative to the step's start
(torch.profiler, CPU and CUDA), so that the gaps between them show where a step's time goes.

    python bench/profile_step.py > bench/results/profile-step-<date>.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    import cupy_maxsim.torch as cmt

    for name, (nq, lq, nd, ld, dim) in SHAPES.items():
        q = _unit(torch, (nq, lq, dim), 1).requires_grad_(True)
        d = _unit(torch, (nd, ld, dim), 2).requires_grad_(True)
        grad = torch.randn(nq, nd, device="cuda")

        def step():
            q.grad = d.grad = None
            cmt.maxsim(q, d).backward(grad)

        for _ in range(5):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                with record_function("step"):
                    step()
                torch.cuda.synchronize()
        events = [e for e in prof.events() if e.time_range.elapsed_us() > 0]
        steps = sorted((e for e in events if e.name == "step"), key=lambda e: e.time_range.start)
        last = steps[-1]
        t0 = last.time_range.start
        print(f"== {name}: step host span {last.time_range.elapsed_us():.1f} us")
        rows = [e for e in events if e.time_range.start >= t0 - 1 and e.time_range.start <= t0 + 2000
                and e.name != "step"]
        rows.sort(key=lambda e: e.time_range.start)
        for e in rows:
            kind = "GPU" if e.device_type == torch.autograd.DeviceType.CUDA else "cpu"
            if kind == "cpu" and e.time_range.elapsed_us() < 3:
                continue
            print(f"  {kind} {e.time_range.start - t0:8.1f} .. {e.time_range.end - t0:8.1f} us  "
                  f"{e.time_range.elapsed_us():7.1f}  {e.name[:70]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
