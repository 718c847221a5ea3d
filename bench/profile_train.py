"""Where a training step's time goes: GPU time per kernel (torch.profiler / CUPTI) and host
time per call, for cupy_maxsim's forward-with-argmax and backward on the training shapes.

    python bench/profile_train.py > bench/results/profile-train-<date>.txt
"""

from __future__ import annotations

import io
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import cupy_maxsim as cm

    for name, (nq, lq, nd, ld, dim) in SHAPES.items():
        q, d = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
        grad = torch.randn(nq, nd, device="cuda")
        _, argmax = cm.score(q, d, return_argmax=True)
        calls = {
            "score": lambda: cm.score(q, d),
            "score+argmax": lambda: cm.score(q, d, return_argmax=True),
            "score_backward": lambda: cm.score_backward(grad, q, d, argmax),
        }
        print(f"== {name}")
        for label, fn in calls.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(50):
                fn()
            host_us = (time.perf_counter() - start) / 50 * 1e6
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            per_kernel = defaultdict(float)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    per_kernel[event.name] += event.device_time / 20
            kernels = ", ".join(f"{k[:40]} {v:.1f} us" for k, v in sorted(per_kernel.items(), key=lambda kv: -kv[1]))
            print(f"{label:16s} host {host_us:7.1f} us/call | GPU {sum(per_kernel.values()):7.1f} us: {kernels}")
        if name.startswith("inbatch-colbert"):
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(200):
                cm.score_backward(grad, q, d, argmax)
            profiler.disable()
            torch.cuda.synchronize()
            print("-- host path of score_backward, 200 calls (cProfile, by own time)")
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(16)
            print(text.getvalue(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
