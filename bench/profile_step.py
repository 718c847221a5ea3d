"""Timeline of training steps (cupy_maxsim.torch.maxsim forward + backward) on the training
shapes, timed as bench_train times them (a 256 MB write flushes the L2 before each step, the
host does not wait between steps): when each host call and each GPU kernel starts and ends,
relative to the end of the flush before the last profiled step, so that the gaps show where a
step's time goes (torch.profiler, CPU and CUDA; the profiler inflates host calls).

    python bench/profile_step.py > bench/results/profile-step-<date>-<commit>.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import cupy_maxsim.torch as cmt

    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
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
            for _ in range(4):
                flush.zero_()
                step()
            torch.cuda.synchronize()
        events = sorted((e for e in prof.events() if e.time_range.elapsed_us() > 0),
                        key=lambda e: e.time_range.start)
        gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        flushes = [e for e in gpu if "fill" in e.name.lower() or "memset" in e.name.lower()]
        t0 = flushes[-1].time_range.end if flushes else gpu[0].time_range.start
        print(f"== {name}: times from the end of the last flush (GPU) ; {len(flushes)} flushes seen")
        for e in events:
            if e.time_range.end < t0 - 400:
                continue
            kind = "GPU" if e.device_type == torch.autograd.DeviceType.CUDA else "cpu"
            if kind == "cpu" and e.time_range.elapsed_us() < 4:
                continue
            print(f"  {kind} {e.time_range.start - t0:8.1f} .. {e.time_range.end - t0:8.1f} us  "
                  f"{e.time_range.elapsed_us():7.1f}  {e.name[:70]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
