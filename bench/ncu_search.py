"""One search each of k=10, 1000 and 2048, 1 query against 1M documents of 128 x 128 fp16, inside
cudaProfilerStart/Stop for ncu: every kernel a search launches, and its time.

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python bench/ncu_search.py
"""

import cupy
from cupy.cuda import profiler

import cupy_maxsim as cm

rng = cupy.random.default_rng(0)
d = cupy.empty((1_000_000, 128, 128), cupy.float16)
for s in range(0, d.shape[0], 50_000):
    d[s:s + 50_000] = rng.standard_normal((50_000, 128, 128), dtype=cupy.float32).astype(cupy.float16)
q = rng.standard_normal((1, 32, 128), dtype=cupy.float32).astype(cupy.float16)
for k in (10, 1000, 2048):
    for _ in range(3):
        cm.search(q, d, k)
cupy.cuda.Device().synchronize()
profiler.start()
for k in (10, 1000, 2048):
    cm.search(q, d, k)
cupy.cuda.Device().synchronize()
profiler.stop()
