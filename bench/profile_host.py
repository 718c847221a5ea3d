"""Where the host time of a small call goes: cProfile over back-to-back rerank-1k calls with
torch CUDA tensors (the launch-bound regime)."""

import cProfile
import pstats

import torch

import cupy_maxsim as cm

q = torch.randn(32, 128, device="cuda", dtype=torch.float16)
d = torch.randn(1000, 300, 128, device="cuda", dtype=torch.float16)
for _ in range(50):
    cm.score(q, d)
torch.cuda.synchronize()
profiler = cProfile.Profile()
profiler.enable()
for _ in range(2000):
    cm.score(q, d)
profiler.disable()
torch.cuda.synchronize()
pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
