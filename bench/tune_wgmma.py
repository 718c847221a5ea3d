"""The Hopper (warpgroup-MMA) forward against the mma.sync forward, and its shape candidates, on
H200, dim 128: compute-bound and training shapes (three or two consumer warpgroups, 64- or
128-row document tiles, queries or documents on the MMA's M, tiles copied by TMA or by cp.async) and in-batch (the document rotation
on and off), and single queries (three warpgroups splitting a block's documents; padded and packed) against
mma.sync.
Every result is checked against the mma.sync kernel's before it is timed. Prints one line per
(shape, variant) with the median, the floor measured in this run (max of bytes / copy bandwidth
and FLOPs / bf16 matmul rate; int8 at half the bytes and twice the rate) and the fraction of it.

    python bench/tune_wgmma.py [shape,...] > bench/results/tune-wgmma-<date>.log
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
    "corpus-10k": (1, 32, 10_000, 300, False, False),
    "colpali-1q-10k": (1, 32, 10_000, 1030, False, False),
    "colbert-1q-1M": (1, 32, 1_000_000, 128, False, False),
    "corpus-10k-int8": (1, 32, 10_000, 300, False, True),
    "colpali-1q-10k-int8": (1, 32, 10_000, 1030, False, True),
    "colbert-1q-1M-int8": (1, 32, 1_000_000, 128, False, True),
    # packed: lengths uniform in [16, Ld] (bench_forward's packed-ragged-100k)
    "packed-ragged-100k": (1, 32, 100_000, 300, False, False),
}
# (label, use the Hopper kernel, its shape, rotate documents, TMA copies)
THREE = dict(warpgroups=3, stages=6, tile_rows=64)
N128 = dict(warpgroups=3, stages=6, tile_rows=128)  # stages cut to what fits; int8 keeps 64
N128_TWO = dict(warpgroups=2, stages=6, tile_rows=128)
DOCS_ON_M = dict(warpgroups=3, stages=6, docs_on_m=True)  # the planner's pick without an argmax
COMPUTE = [("mma.sync", False, None, True, True), ("wgmma cp.async", True, THREE, True, False),
           ("wgmma TMA", True, THREE, True, True), ("wgmma TMA N128", True, N128, True, True),
           ("wgmma TMA N128 2wg", True, N128_TWO, True, True), ("wgmma TMA docs on M", True, DOCS_ON_M, True, True)]
INBATCH = COMPUTE + [("wgmma TMA no rotation", True, THREE, False, True)]
# One query: three warpgroups splitting the documents (SPLIT_DOCS) against mma.sync.
SPLIT = [("mma.sync", False, None, True, True), ("wgmma split cp.async", True, THREE, True, False),
         ("wgmma split TMA", True, THREE, True, True), ("wgmma split TMA N128", True, N128, True, True)]


def variants_for(nq):
    return SPLIT if nq == 1 else INBATCH if nq == 128 else COMPUTE


def main() -> int:
    import cupy
    import torch

    import cupy_maxsim as cm
    from cupy_maxsim import _kernels

    ceilings = bench_forward.measure_ceilings(torch)
    rate, bandwidth = ceilings["bf16_tflops"] * 1e12, ceilings["copy_tbps"] * 1e12
    print(f"# {torch.cuda.get_device_name()}  bf16 matmul rate {rate / 1e12:.0f} TFLOP/s  "
          f"copy {bandwidth / 1e12:.2f} TB/s", flush=True)
    original_shape, device_properties = dict(_kernels.WGMMA_SHAPE), _kernels.device_properties
    wanted = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
    for name in wanted:
        nq, lq, nd, ld, argmax, int8 = SHAPES[name]
        rng = cupy.random.default_rng(0)
        offsets = None
        if name.startswith("packed"):
            offsets = cupy.zeros(nd + 1, dtype=cupy.int64)
            offsets[1:] = cupy.cumsum(rng.integers(16, ld + 1, nd))
            d = (rng.standard_normal((int(offsets[-1]), 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        else:
            d = cupy.empty((nd, ld, 128), dtype=cupy.float16)
            for first in range(0, nd, 100_000):  # in slices: a float32 draw of a whole corpus is 2x its size
                last = min(nd, first + 100_000)
                d[first:last] = rng.standard_normal((last - first, ld, 128), dtype=cupy.float32) / 11
        q = (rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        if offsets is not None:
            score = lambda: cm.score_packed(q, d, offsets)  # noqa: E731
        elif int8:
            (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
            score = lambda: cm.score(q, d, q_scale=q_scale, d_scale=d_scale)  # noqa: E731
        else:
            score = lambda: cm.score(q, d, return_argmax=argmax)  # noqa: E731
        flops = 2 * nq * lq * d.size  # every query row against every real token
        moved = d.nbytes + q.nbytes + nq * nd * 4 + (d_scale.nbytes if int8 else 0)
        floor_ms = max(flops / rate / (2 if int8 else 1), moved / bandwidth) * 1e3
        reps = 10 if flops > 1e12 or moved > 4e9 else 50
        base = scores = got = None
        for label, use_wgmma, shape, rotate, tma in variants_for(nq):
            shape = dict(shape or original_shape)
            # No rotation: the planner is told the L2 holds nothing.
            properties = device_properties if rotate else (lambda device: device_properties(device)[:4] + (0,))
            settings = dict(USE_WGMMA=use_wgmma, USE_TMA=tma, WGMMA_TILE_ROWS=shape.pop("tile_rows", None),
                            WGMMA_DOCS_ON_M=shape.pop("docs_on_m", False), WGMMA_SHAPE=shape,
                            device_properties=properties)
            with bench_forward.planner_settings(**settings):
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
                    print(f"{name:<22} {label:<24} {ms:9.3f} ms  floor {floor_ms:8.3f}  frac {floor_ms / ms:5.2f}  {check}",
                          flush=True)
                except Exception as error:  # noqa: BLE001
                    print(f"{name:<22} {label:<24} failed: {type(error).__name__}: {str(error)[:300]}", flush=True)
        del q, d, base, scores, got
        cupy.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
