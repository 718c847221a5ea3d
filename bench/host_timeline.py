"""Where a training step's host time goes, as a timeline: marks around score_with_plan, Output.empty, every prepared launch and BackwardPlan.gradients; median microseconds between marks over 200 steps, free-running and do_bench style: python bench/host_timeline.py"""
import sys, time
import numpy as np
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from bench_train import SHAPES, _unit
import cupy_maxsim.torch as cmt
from cupy_maxsim import _api, _kernels

now = time.perf_counter_ns
marks = []
def mark(label): marks.append((label, now()))

orig_launch = _kernels.PreparedLaunch.__call__
def launch(self, values, stream_ptr, extra=None):
    mark("launch " + str(getattr(self.kernel, "name", "?")).replace("maxsim_", "")[:9])
    orig_launch(self, values, stream_ptr, extra)
_kernels.PreparedLaunch.__call__ = launch
orig_swp = _api.score_with_plan
def swp(*a, **k):
    mark("fwd enter"); r = orig_swp(*a, **k); mark("fwd exit"); return r
_api.score_with_plan = swp
orig_grad = _api.BackwardPlan.gradients
def gradients(self, g):
    mark("bwd enter"); r = orig_grad(self, g); mark("bwd exit"); return r
_api.BackwardPlan.gradients = gradients

orig_empty = _api.Output.empty
def empty(self, shape, dtype):
    mark("empty in"); r = orig_empty(self, shape, dtype); mark("empty out"); return r
_api.Output.empty = empty
flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
for name, (nq, lq, nd, ld, dim) in list(SHAPES.items())[::-1]:
    q = _unit(torch, (nq, lq, dim), 1).requires_grad_(True)
    d = _unit(torch, (nd, ld, dim), 2).requires_grad_(True)
    grad = torch.randn(nq, nd, device="cuda")
    def step():
        mark("start")
        q.grad = d.grad = None
        s = cmt.maxsim(q, d)
        mark("apply returned")
        s.backward(grad)
        mark("end")
    for mode in ("free", "do_bench"):
        for _ in range(10): step()
        torch.cuda.synchronize()
        steps = []
        for _ in range(200):
            marks.clear()
            if mode == "do_bench":
                flush.zero_()
                e0 = torch.cuda.Event(enable_timing=True); e1 = torch.cuda.Event(enable_timing=True); e0.record()
            step()
            if mode == "do_bench": e1.record()
            steps.append(list(marks))
        torch.cuda.synchronize()
        print(f"== {name} ({mode}), median us from the previous mark (over 200 steps)", flush=True)
        labels = [m[0] for m in steps[0]]
        deltas = np.array([[(s[i][1] - s[i - 1][1]) / 1e3 for i in range(1, len(s))] for s in steps if len(s) == len(labels)])
        for i, label in enumerate(labels[1:]):
            print(f"  {labels[i]:>16s} -> {label:16s} {np.median(deltas[:, i]):7.1f}  (p90 {np.percentile(deltas[:, i], 90):7.1f})")
        print(f"  {'total':35s} {np.median(deltas.sum(1)):7.1f}  (p90 {np.percentile(deltas.sum(1), 90):7.1f})", flush=True)
