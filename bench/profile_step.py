"""Timeline of training steps (cupy_maxsim.torch.maxsim forward + backward) on the training
shapes, run as bench_train times them (a 256 MB write flushes the L2 before each step, the
host does not wait between steps): each step's GPU span, then for the fastest and the slowest
of STEPS steps when each host call and each GPU kernel starts and ends, relative to the end of
the step's flush, so that the gaps show where a slow step's time goes (torch.profiler, CPU and
CUDA; the profiler inflates host calls).

    python bench/profile_step.py > bench/results/profile-step-<date>-<commit>.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402

STEPS = 30  # as bench_train times them


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
            for _ in range(STEPS):
                flush.zero_()
                step()
            torch.cuda.synchronize()
        events = sorted((e for e in prof.events() if e.time_range.elapsed_us() > 0),
                        key=lambda e: e.time_range.start)
        gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        flushes = [e for e in gpu if "fill" in e.name.lower() or "memset" in e.name.lower()]
        # Step k: from the end of flush k to the end of its last GPU work before flush k + 1.
        spans = []
        for k, flush_event in enumerate(flushes):
            start = flush_event.time_range.end
            stop = flushes[k + 1].time_range.start if k + 1 < len(flushes) else float("inf")
            last = max((e.time_range.end for e in gpu if start <= e.time_range.start < stop), default=start)
            spans.append((last - start, start, min(stop, last)))
        ordered = sorted(spans)
        print(f"== {name}: {len(spans)} steps, GPU span from the end of each flush: fastest "
              f"{ordered[0][0]:.1f} us, median {ordered[len(ordered) // 2][0]:.1f}, slowest {ordered[-1][0]:.1f}")
        for label, (span, t0, t1) in (("fastest", ordered[0]), ("slowest", ordered[-1])):
            print(f"-- {label} step ({span:.1f} us), times from the end of its flush")
            for e in events:
                if e.time_range.end < t0 - 400 or e.time_range.start > t1:
                    continue
                kind = "GPU" if e.device_type == torch.autograd.DeviceType.CUDA else "cpu"
                if kind == "cpu" and e.time_range.elapsed_us() < 4:
                    continue
                print(f"  {kind} {e.time_range.start - t0:8.1f} .. {e.time_range.end - t0:8.1f} us  "
                      f"{e.time_range.elapsed_us():7.1f}  {e.name[:70]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
