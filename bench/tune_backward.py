"""Backward kernel variants on the training shapes: one launch or two, blocks per SM (launch
bounds), rows in flight per warp; GPU time per kernel from torch.profiler. Prints one line per
variant. Every variant must give the same dD bits (each row sums its sources in list order),
and the same dQ bits as the variants with its launch count.

    python bench/tune_backward.py > bench/results/tune-backward-<date>.log
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402

#: (label, compile-time defines, the one-launch backward's shared-memory limit: 0 = two launches)
VARIANTS = [
    ("two launches", (), 0),
    ("one launch, 3 blocks/SM", (), None),
    ("one launch, 4 blocks/SM", ("-DMAXSIM_BWD_FUSED_MIN_BLOCKS=4",), None),
    ("one launch, 3 blocks/SM, 2 rows in flight", ("-DMAXSIM_BWD_INFLIGHT=2",), None),
]


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import cupy_maxsim as cm
    from cupy_maxsim import _api, _kernels

    from cupy_maxsim import reference  # noqa: F401 (import cost outside the timing)

    inputs = {}
    for name, (nq, lq, nd, ld, dim) in SHAPES.items():
        q, d = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
        grad = torch.randn(nq, nd, device="cuda")
        inputs[name] = (q, d, grad, cm.score(q, d, return_argmax=True)[1])
    default_limit = _kernels.BWD_FUSED_SHARED_LIMIT
    baseline = {}
    for label, defines, limit in VARIANTS:
        _kernels.BWD_DEFINES = defines
        _kernels.BWD_FUSED_SHARED_LIMIT = default_limit if limit is None else limit
        _api._backward_templates.clear()  # a template holds its kernels: plan each variant afresh
        line = [f"{label:44s}"]
        for name, (q, d, grad, argmax) in inputs.items():
            grads = cm.score_backward(grad, q, d, argmax)
            torch.cuda.synchronize()
            key = name.split(":")[0]
            one_launch = limit != 0
            same_dd = torch.equal(grads[1], baseline.setdefault((key, "dD"), grads[1]))
            same_dq = torch.equal(grads[0], baseline.setdefault((key, "dQ", one_launch), grads[0]))
            same = same_dd and same_dq
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
