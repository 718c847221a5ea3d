"""Where a training step's host time goes, as a timeline: ours beside the autograd floor (an
autograd.Function that only allocates the scores and the gradients, bench_train's floor), with
the same marks at the forward's and the backward's entry and exit, and for ours around every
Output.empty and launch; median microseconds between marks over 3 rounds x 300 free-running
steps per shape: python bench/host_timeline.py
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES, _unit  # noqa: E402

import cupy_maxsim.torch as cmt  # noqa: E402
from cupy_maxsim import _api, _kernels  # noqa: E402

now = time.perf_counter_ns
marks = []


def mark(label):
    marks.append((label, now()))


def marked(function, before, after=None):
    """``function`` with a mark before (and after) each call."""
    def call(*args, **kwargs):
        mark(before)
        result = function(*args, **kwargs)
        if after:
            mark(after)
        return result
    return call


_kernels.PreparedLaunch.__call__ = marked(_kernels.PreparedLaunch.__call__, "launch")
_kernels.PreparedLaunch.launch_packed = marked(_kernels.PreparedLaunch.launch_packed, "launch")
_api.score_with_plan = marked(_api.score_with_plan, "fwd enter", "fwd exit")
_api.BackwardPlan.gradients = marked(_api.BackwardPlan.gradients, "bwd enter", "bwd exit")
_api.Output.empty = marked(_api.Output.empty, "empty")


class Floor(torch.autograd.Function):
    """bench_train's autograd floor, with the marks ours gets."""

    @staticmethod
    def forward(ctx, q, d):
        mark("fwd enter")
        ctx.q, ctx.d = q, d
        out = torch.empty((q.shape[0], d.shape[0]), device=q.device)
        mark("fwd exit")
        return out

    @staticmethod
    def backward(ctx, grad):
        mark("bwd enter")
        grads = torch.empty_like(ctx.q), torch.empty_like(ctx.d)
        mark("bwd exit")
        return grads


for shape, (nq, lq, nd, ld, dim) in list(SHAPES.items())[::-1]:
    q = _unit(torch, (nq, lq, dim), 1).requires_grad_(True)
    d = _unit(torch, (nd, ld, dim), 2).requires_grad_(True)
    grad = torch.randn(nq, nd, device="cuda")

    def make(fn):
        def step():
            mark("start")
            q.grad = d.grad = None
            scores = fn(q, d)
            mark("apply returned")
            scores.backward(grad)
            mark("end")
        return step

    variants = {"autograd floor": make(Floor.apply), "cupy_maxsim": make(cmt.maxsim)}
    results = {}
    for _ in range(3):  # rounds, round-robin
        for name, step in variants.items():
            for _ in range(10):
                step()
            torch.cuda.synchronize()
            steps = []
            for _ in range(300):
                marks.clear()
                step()
                steps.append(list(marks))
            torch.cuda.synchronize()
            results.setdefault(name, []).extend(steps)
    for name, steps in results.items():
        labels = [m[0] for m in steps[0]]
        steps = [s for s in steps if [m[0] for m in s] == labels]
        deltas = np.array([[(s[i][1] - s[i - 1][1]) / 1e3 for i in range(1, len(s))] for s in steps])
        print(f"== {shape}: {name}, median us from the previous mark over {len(steps)} steps")
        for i, label in enumerate(labels[1:]):
            print(f"  {labels[i]:>14s} -> {label:14s} {np.median(deltas[:, i]):7.1f}  "
                  f"(p90 {np.percentile(deltas[:, i], 90):7.1f})")
        print(f"  {'total':31s} {np.median(deltas.sum(1)):7.1f}  (p90 {np.percentile(deltas.sum(1), 90):7.1f})",
              flush=True)
