"""Training step (cupy_maxsim.torch.maxsim forward + backward) with the Hopper kernel's tile rows chosen per
problem, forced to 64 and forced to 128, in one process, twice: python bench/ab_train_tiles.py"""
import sys, torch
sys.path.insert(0, "bench")
from bench_train import _unit, measure_step
import cupy_maxsim.torch as cmt
from bench_forward import planner_settings
for name, (nq, lq, nd, ld) in {"colpali": (32, 32, 128, 1030), "colbert": (128, 32, 128, 300)}.items():
    q0, d0 = _unit(torch, (nq, lq, 128), 1), _unit(torch, (nd, ld, 128), 2)
    grad = torch.randn(nq, nd, device="cuda")
    for rnd in range(2):
        for label, shape in (("auto", dict(warpgroups=3, stages=6)), ("n64", dict(warpgroups=3, stages=6, tile_n=64)), ("n128", dict(warpgroups=3, stages=6, tile_n=128))):
            with planner_settings(WGMMA_SHAPE=shape):
                ms, _, peak, _ = measure_step(torch, lambda q, d: cmt.maxsim(q, d), q0, d0, grad)
            print(name, rnd, label, f"{ms:.3f} ms", flush=True)
