"""Where a small search's time goes (issue 25: 10k documents took 1.2-4 ms where scoring them
takes 0.09): one query (and 32) against 10,000 documents of 128 tokens, k = 10 and 1000, with
CuPy arrays. The end-to-end time of back-to-back calls against the host time per call (calls
submitted without waiting), then cProfile over 200 calls of each k, by total time.

    python bench/profile_search.py > bench/results/profile-search-<date>-<commit>.txt
"""

import cProfile
import pstats
import time

import cupy

import cupy_maxsim as cm

rng = cupy.random.default_rng(0)
d = rng.standard_normal((10_000, 128, 128), dtype=cupy.float32).astype(cupy.float16)
for nq in (1, 32):
    q = rng.standard_normal((nq, 32, 128), dtype=cupy.float32).astype(cupy.float16)
    for k in (10, 1000):
        for _ in range(20):
            cm.search(q, d, k)
        cupy.cuda.Device().synchronize()
        line = []
        for label, sync in (("host", False), ("end to end", True)):
            runs = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(20):
                    cm.search(q, d, k)
                if sync:
                    cupy.cuda.Device().synchronize()
                runs.append((time.perf_counter() - start) / 20 * 1e3)
                cupy.cuda.Device().synchronize()
            line.append(f"{label} {min(runs):.3f} ms")
        start = time.perf_counter()
        for _ in range(20):
            cm.score(q, d)
        cupy.cuda.Device().synchronize()
        line.append(f"score alone {(time.perf_counter() - start) / 20 * 1e3:.3f} ms")
        print(f"{nq} queries, k={k}: " + ", ".join(line), flush=True)
for k in (10, 1000):
    q = rng.standard_normal((1, 32, 128), dtype=cupy.float32).astype(cupy.float16)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        cm.search(q, d, k)
    cupy.cuda.Device().synchronize()
    profiler.disable()
    print(f"\n# cProfile, 1 query, k={k}, 200 calls")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
