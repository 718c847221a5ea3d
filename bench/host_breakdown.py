"""Host microseconds of a training step's parts on the ColPali shape (32x32 vs 128x1030), each
called back to back on one thread (the forward's): best and median of 7 x 200 calls (whole
steps: 7 x 50), in two rounds: python bench/host_breakdown.py"""
import statistics
import sys
import time
from pathlib import Path

import cupy
import torch
sys.path.insert(0, str(Path(__file__).parent))
from bench_train import AUTOGRAD_FLOOR, SHAPES, _unit, make_step, providers
import cupy_maxsim.torch as cmt
from cupy_maxsim import _api, _kernels
from cupy_maxsim._arrays import as_operand

def host_us(fn, n=200, reps=7):
    runs = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter_ns() - t) / n / 1e3)
    torch.cuda.synchronize()
    return min(runs), statistics.median(runs)

found, _ = providers(torch)
nq, lq, nd, ld, dim = SHAPES["inbatch-colpali: 32x32 vs 128x1030"]
q0, d0 = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
grad = torch.randn(nq, nd, device="cuda")
qd, dd = q0.clone(), d0.clone()

class WithSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d):
        ctx.save_for_backward(q, d, None)
        return torch.empty((q.shape[0], d.shape[0]), device=q.device)
    @staticmethod
    def backward(ctx, g):
        q, d, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(d)

empty_kernel = cupy.RawKernel('extern "C" __global__ void nothing(const long long x) {}', "nothing")
empty_kernel.compile()
prepared = _kernels.PreparedLaunch(empty_kernel, (1,), (32,), 0, _kernels.ArgStruct((("x", "q"),)))
stream = torch.cuda.current_stream().cuda_stream
plan = _api.score_with_plan(qd, dd)[1]

items = {
    "torch.empty (32,128) f32": lambda: torch.empty((32, 128), device="cuda"),
    "torch.empty_like(d) 33 MB": lambda: torch.empty_like(d0),
    "PreparedLaunch (empty kernel)": lambda: prepared([0], stream),
    "as_operand(grad)": lambda: as_operand(grad, "grad_scores"),
    "score_with_plan (replayed, no autograd)": lambda: _api.score_with_plan(qd, dd),
    "score_with_plan + gradients": lambda: _api.score_with_plan(qd, dd)[1].gradients(grad),
    "step: autograd floor (allocations only)": make_step(found[AUTOGRAD_FLOOR], q0, d0, grad)[0],
    "step: floor + save_for_backward": make_step(WithSaved.apply, q0, d0, grad)[0],
    "step: cupy_maxsim": make_step(cmt.maxsim, q0, d0, grad)[0],
    "step: flash_maxsim_0.3.0": make_step(found["flash_maxsim_0.3.0"], q0, d0, grad)[0] if "flash_maxsim_0.3.0" in found else None,
}
for _ in range(3):  # warm every item (compiles, autotunes, replays recorded)
    for fn in items.values():
        if fn is not None:
            fn()
torch.cuda.synchronize()
print(f"{'part (ColPali 32x32 vs 128x1030)':44s} {'best us':>8s} {'median us':>10s}")
for round_ in range(2):
    for name, fn in items.items():
        if fn is None:
            continue
        best, med = host_us(fn, n=50 if name.startswith("step") else 200)
        print(f"{name:44s} {best:8.1f} {med:10.1f}", flush=True)
    print("--")
