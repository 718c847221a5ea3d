"""Time candidate tile configurations of the tensor-core forward on a few shapes (fp16).

Each candidate replaces an entry of _kernels.MMA_CONFIGS (the dispatcher's table) for one
round (max_ksteps is added: dim 128 fits every candidate); prints a table of median ms per (candidate, shape) and the floors.
"""

import sys

import cupy

import bench_forward
import cupy_maxsim as cm
from cupy_maxsim import _api, _kernels

CANDIDATES = {
    32: [dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=4), dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=3),
         dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=6), dict(warps_m=2, warps_n=1, mt=1, nt=4, stages=4)],
    256: [dict(warps_m=2, warps_n=4, mt=2, nt=8, stages=2), dict(warps_m=2, warps_n=4, mt=2, nt=8, stages=3),
          dict(warps_m=4, warps_n=4, mt=1, nt=8, stages=3)],
}
SHAPES = {32: [(1, 32, 10_000, 300), (1, 32, 10_000, 1030), (1, 32, 1_000_000, 128), (1, 32, 1_000, 300)],
          256: [(32, 32, 10_000, 1030), (256, 32, 100_000, 128), (128, 32, 128, 300)]}


def median_ms(fn, reps):
    import torch

    return bench_forward._median_ms(torch, fn, reps=reps)


INT8 = "--int8" in sys.argv  # int8 x int8 documents and queries; the floor counts 1 byte per element
if INT8:
    CANDIDATES = {32: [dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=3), dict(warps_m=4, warps_n=1, mt=2, nt=4, stages=3),
                       dict(warps_m=8, warps_n=1, mt=1, nt=4, stages=3), dict(warps_m=4, warps_n=1, mt=2, nt=4, stages=4),
                       dict(warps_m=4, warps_n=1, mt=1, nt=4, stages=6)],
                  256: [dict(warps_m=2, warps_n=4, mt=2, nt=8, stages=2), dict(warps_m=2, warps_n=4, mt=4, nt=8, stages=2)]}
    SHAPES = {32: [(1, 32, 10_000, 300), (1, 32, 10_000, 1030)], 256: [(32, 32, 10_000, 1030)]}

original = dict(_kernels.MMA_CONFIGS)
for width, candidates in CANDIDATES.items():
    for shape in SHAPES[width]:
        nq, lq, nd, ld = shape
        rng = cupy.random.default_rng(0)
        d = rng.standard_normal((nd, ld, 128), dtype=cupy.float32).astype(cupy.float16)
        q = rng.standard_normal((nq, lq, 128), dtype=cupy.float32).astype(cupy.float16)
        q = q[0] if nq == 1 else q
        flops, nbytes = 2 * nq * lq * nd * ld * 128, (1 if INT8 else 2) * nd * ld * 128
        if INT8:
            (qv, qs), (dv, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
            score = lambda: cm.score(qv, dv, q_scale=qs, d_scale=ds)  # noqa: E731
        else:
            score = lambda: cm.score(q, d)  # noqa: E731
        floor = max(nbytes / 4.3e9, flops / 680e9)
        base = None
        for candidate in candidates:
            _kernels.MMA_CONFIGS[width] = {**candidate, "max_ksteps": 8}
            if _kernels.mma_config(width, 8).shared_bytes > 227 * 1024:
                print(f"{str(shape):<28} {str(tuple(candidate.values())):<24} does not fit", flush=True)
                continue
            _api._mma_plan.cache_clear()
            try:
                ms = median_ms(score, 10 if nd * ld > 5e7 else 30)
                got = score()
                base = got if base is None else base
                diff = float(cupy.abs(got - base).max())
                print(f"{str(shape):<28} {str(tuple(candidate.values())):<24} {ms:9.3f} ms  floor {floor:7.3f}  frac {floor / ms:5.2f}  diff {diff:.1e}", flush=True)
            except Exception as error:  # noqa: BLE001
                print(f"{str(shape):<28} {str(tuple(candidate.values())):<24} failed: {error}", flush=True)
        _kernels.MMA_CONFIGS[width] = original[width]
        _api._mma_plan.cache_clear()
        del d
        cupy.get_default_memory_pool().free_all_blocks()
