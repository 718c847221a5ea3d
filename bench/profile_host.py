"""Where the host time of a small call goes: rerank-1k calls with torch CUDA tensors (the
launch-bound regime). First the host time per call (200 calls submitted without waiting: fewer
than the launch queue holds, so the host never blocks on the GPU) and the end-to-end time of
back-to-back calls, then cProfile over 2000 calls.

    python bench/profile_host.py > bench/results/profile-host-<date>-<commit>.txt
"""

import cProfile
import pstats
import time

import torch

import cupy_maxsim as cm

q = torch.randn(32, 128, device="cuda", dtype=torch.float16)
d = torch.randn(1000, 300, 128, device="cuda", dtype=torch.float16)
for _ in range(50):
    cm.score(q, d)
torch.cuda.synchronize()
for label, sync in (("host only, per call", False), ("end to end, back-to-back", True)):
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            cm.score(q, d)
        if sync:
            torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / 200 * 1e6)
        torch.cuda.synchronize()
    print(f"{label}: {min(runs):.1f} us (best of 5 x 200 calls; all {', '.join(f'{r:.1f}' for r in runs)})")
profiler = cProfile.Profile()
profiler.enable()
for _ in range(2000):
    cm.score(q, d)
profiler.disable()
torch.cuda.synchronize()
pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
