"""Where a small search's time goes (issue 25: 10k documents took 1.2-4 ms where scoring them
takes 0.09): one query (and 32) against 10,000 documents of 128 tokens, k = 10 and 1000, with
CuPy arrays. The end-to-end time of back-to-back calls against the host time per call (calls
submitted without waiting), then cProfile over 200 calls of each k, by total time; then the
same for an Index's search (float16 and int8 stores of the same documents, k = 100): the call
each shard of a ShardedIndex makes, whose host time bounds issue 29's latency line.

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

for dtype in ("float16", "int8"):
    index = cm.Index(128, dtype=dtype, device="cuda")
    index.add(d)
    q = rng.standard_normal((1, 32, 128), dtype=cupy.float32).astype(cupy.float16)
    for _ in range(20):
        index.search(q, 100)
    cupy.cuda.Device().synchronize()
    host = []
    for _ in range(50):
        start = time.perf_counter()
        index.search(q, 100)
        host.append((time.perf_counter() - start) * 1e6)
    cupy.cuda.Device().synchronize()
    host.sort()
    print(f"\n# Index({dtype}).search, 1 query, k=100: host us a call median {host[25]:.0f}, min {host[0]:.0f}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(200):
        index.search(q, 100)
    cupy.cuda.Device().synchronize()
    profiler.disable()
    print(f"# cProfile, Index({dtype}).search, 200 calls")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
