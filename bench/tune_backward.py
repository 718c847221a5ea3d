"""Backward kernel tunables on the training shapes: rows in flight per warp and blocks per SM
(launch bounds), GPU time per kernel from torch.profiler. Prints one line per variant.

    python bench/tune_backward.py > bench/results/tune-backward-<date>.log
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402

VARIANTS = [(4, 4), (2, 4), (8, 3), (4, 3)]


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import cupy_maxsim as cm
    from cupy_maxsim import _kernels

    from cupy_maxsim import reference  # noqa: F401  (import cost outside the timing)

    inputs = {}
    for name, (nq, lq, nd, ld, dim) in SHAPES.items():
        q, d = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
        grad = torch.randn(nq, nd, device="cuda")
        inputs[name] = (q, d, grad, cm.score(q, d, return_argmax=True)[1])
    baseline = {}
    for inflight, min_blocks in VARIANTS:
        _kernels.BWD_DEFINES = (f"-DMAXSIM_BWD_INFLIGHT={inflight}", f"-DMAXSIM_BWD_MIN_BLOCKS={min_blocks}")
        line = [f"inflight {inflight:2d} min_blocks {min_blocks}"]
        for name, (q, d, grad, argmax) in inputs.items():
            grads = cm.score_backward(grad, q, d, argmax)
            torch.cuda.synchronize()
            key = name.split(":")[0]
            if key in baseline:  # every variant computes the same bits
                same = all(torch.equal(a, b) for a, b in zip(grads, baseline[key]))
            else:
                baseline[key], same = grads, True
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    cm.score_backward(grad, q, d, argmax)
                torch.cuda.synchronize()
            per_kernel = defaultdict(float)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    per_kernel[event.name.replace("maxsim_bwd_", "").replace("_fp16", "")] += event.device_time / 20
            total = sum(per_kernel.values())
            line.append(f"{key}: total {total:6.1f} us (" + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_kernel.items()))
                        + f"){'' if same else ' BITS DIFFER'}")
        print(" | ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
