"""Quick forward timings of cupy_maxsim alone (CUDA events, median), with the floors."""

import json
import os
import sys
import time

import cupy
import numpy as np

import cupy_maxsim as cm
from cupy_maxsim import reference

COPY_TBPS, BF16_TFLOPS = 4.30, 680.0
SHAPES = {
    "rerank-1k": (1, 32, 1000, 300),
    "corpus-10k": (1, 32, 10_000, 300),
    "colpali-1q-10k": (1, 32, 10_000, 1030),
    "colpali-32q-10k": (32, 32, 10_000, 1030),
    "inbatch-128": (128, 32, 128, 300),
    "colbert-1q-1M": (1, 32, 1_000_000, 128),
    "colbert-256q-100k": (256, 32, 100_000, 128),
}


def median_ms(fn, reps=20):
    fn()
    times = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


rows = []
for name, (nq, lq, nd, ld) in SHAPES.items():
    dim = 128
    rng = cupy.random.default_rng(1)
    d = rng.standard_normal((nd, ld, dim), dtype=cupy.float32).astype(cupy.float16)
    q = rng.standard_normal((nq, lq, dim), dtype=cupy.float32).astype(cupy.float16)
    q = q[0] if nq == 1 else q
    ms = median_ms(lambda: cm.score(q, d), reps=10 if nd * ld > 5e7 else 30)
    bytes_moved = 2 * (nq * lq * dim + nd * ld * dim) + 4 * nq * nd
    flops = 2 * nq * lq * nd * ld * dim
    floor = max(bytes_moved / COPY_TBPS / 1e9, flops / BF16_TFLOPS / 1e9)
    sample = np.r_[0:2, nd - 2:nd]
    got = cm.score(q, d)
    got = got[..., sample].get()
    ref = reference.maxsim_reference(q.get(), d[sample].get())
    err = float(np.abs(got - ref).max())
    rows.append((name, ms, floor, floor / ms, err))
    del d
    cupy.get_default_memory_pool().free_all_blocks()
print(f"{'shape':<20} {'ms':>9} {'floor':>8} {'frac':>6} {'max err':>9}")
for name, ms, floor, frac, err in rows:
    print(f"{name:<20} {ms:9.3f} {floor:8.3f} {frac:6.2f} {err:9.2e}")
out = os.environ.get("OUT")
if out:
    json.dump(rows, open(os.path.join(out, "quick_forward.json"), "w"))
