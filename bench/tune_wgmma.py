"""The Hopper (warpgroup-MMA) forward against the mma.sync forward, and its shape candidates
(warpgroups per block, ring stages) on the compute-bound shapes, fp16, dim 128. Every result is
checked against the mma.sync kernel's before it is timed. Prints one line per (shape, variant)
with the median, the compute floor (FLOPs / the bf16 matmul rate measured in this run) and the
fraction of it.

    python bench/tune_wgmma.py > bench/results/tune-wgmma-<date>.log
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402

SHAPES = {  # name: (queries, query tokens, documents, document tokens, argmax, int8)
    "inbatch-128": (128, 32, 128, 300, False, False),
    "inbatch-128+argmax": (128, 32, 128, 300, True, False),
    "colpali-train+argmax": (32, 32, 128, 1030, True, False),
    "colpali-32q-10k": (32, 32, 10_000, 1030, False, False),
    "colbert-256q-100k": (256, 32, 100_000, 128, False, False),
    "colpali-32q-10k-int8": (32, 32, 10_000, 1030, False, True),
}
VARIANTS = [None, dict(warpgroups=2, stages=6), dict(warpgroups=3, stages=4), dict(warpgroups=3, stages=6)]


def main() -> int:
    import cupy
    import torch

    import cupy_maxsim as cm
    from cupy_maxsim import _api, _kernels

    rate = bench_forward.measure_ceilings(torch)["bf16_tflops"] * 1e12
    print(f"# {torch.cuda.get_device_name()}  bf16 matmul rate {rate / 1e12:.0f} TFLOP/s", flush=True)
    original = dict(_kernels.WGMMA_SHAPE)
    for name, (nq, lq, nd, ld, argmax, int8) in SHAPES.items():
        rng = cupy.random.default_rng(0)
        d = (rng.standard_normal((nd, ld, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        q = (rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        if int8:
            (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
            score = lambda: cm.score(q, d, q_scale=q_scale, d_scale=d_scale)  # noqa: E731
        else:
            score = lambda: cm.score(q, d, return_argmax=argmax)  # noqa: E731
        flops = 2 * nq * lq * nd * ld * 128
        floor_ms = flops / rate * 1e3 / (2 if int8 else 1)
        reps = 10 if flops > 1e12 else 50
        base = None
        for variant in VARIANTS:
            _kernels.USE_WGMMA = variant is not None
            _kernels.WGMMA_SHAPE = dict(variant or original)
            _api._mma_plan.cache_clear()
            label = "mma.sync" if variant is None else f"wgmma {variant['warpgroups']}wg {variant['stages']}st"
            try:
                got = score()
                scores = got[0] if argmax else got
                if base is None:
                    base = (scores, got[1] if argmax else None)
                    check = ""
                else:
                    diff = float(cupy.nanmax(cupy.abs(scores - base[0])))
                    check = f"diff {diff:.1e}"
                    if argmax:
                        check += f" argmax-agree {float((got[1] == base[1]).mean()):.4f}"
                ms = bench_forward._median_ms(torch, score, reps=reps)
                print(f"{name:<22} {label:<18} {ms:9.3f} ms  floor {floor_ms:8.3f}  frac {floor_ms / ms:5.2f}  {check}",
                      flush=True)
            except Exception as error:  # noqa: BLE001
                print(f"{name:<22} {label:<18} failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
        del q, d
        cupy.get_default_memory_pool().free_all_blocks()
    _kernels.WGMMA_SHAPE, _kernels.USE_WGMMA = original, True
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
