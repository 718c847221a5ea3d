"""Documents on the MMA's M (maxsim_fwd_wgmma.cu, DOCS_ON_M) against queries on M, in one
process, on the compute-bound shapes (fp16 unless named; int8: int8 queries and documents).
Each variant's scores are checked against the float64 reference of a slice before timing.
Prints one line per (shape, variant): median ms (L2 flushed before each call, as ANCHORS.md),
the floor max(bytes / copy bandwidth, FLOPs / bf16 rate) measured in the run and the fraction.

    python bench/ab_docs_on_m.py [shape,...] > bench/results/ab-docs-on-m-<date>-<commit>.log
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402

SHAPES = {  # name: (queries, query tokens, documents, document tokens, dtype)
    "inbatch-128": (128, 32, 128, 300, "float16"),
    "inbatch-128-bf16": (128, 32, 128, 300, "bfloat16"),
    "colpali-32q-10k": (32, 32, 10_000, 1030, "float16"),
    "colpali-32q-10k-int8": (32, 32, 10_000, 1030, "int8"),
    "colbert-256q-100k": (256, 32, 100_000, 128, "float16"),
    "inbatch-colpali-32x128": (32, 32, 128, 1030, "float16"),
}
#: (label, documents on M, consumer warpgroups)
VARIANTS = [("queries on M", False, 3), ("docs on M, 3 wg", True, 3), ("docs on M, 2 wg", True, 2)]


def main() -> int:
    import cupy
    import torch

    import cupy_maxsim as cm
    from cupy_maxsim import _kernels, reference

    ceilings = bench_forward.measure_ceilings(torch)
    print(f"# copy {ceilings['copy_tbps']:.2f} TB/s, bf16 {ceilings['bf16_tflops']:.0f} TFLOP/s")
    shape0 = dict(_kernels.WGMMA_SHAPE)
    wanted = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
    for name in wanted:
        nq, lq, nd, ld, dtype = SHAPES[name]
        rng = cupy.random.default_rng(0)
        q = rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11
        d = rng.standard_normal((nd, ld, 128), dtype=cupy.float32) / 11
        if dtype == "int8":
            (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
            kwargs = dict(q_scale=q_scale, d_scale=d_scale)
            q_ref = q[:8].get().astype(np.float64) * q_scale[:8].get()[..., None]
            d_ref = d[:16].get().astype(np.float64) * d_scale[:16].get()[..., None]
        else:
            q = torch.as_tensor(q, device="cuda").to(getattr(torch, dtype))
            d = torch.as_tensor(d, device="cuda").to(getattr(torch, dtype))
            kwargs = {}
            q_ref = q[:8].float().cpu().numpy().astype(np.float64)
            d_ref = d[:16].float().cpu().numpy().astype(np.float64)
        expected = reference.maxsim_reference(q_ref, d_ref)
        flops = 2.0 * nq * lq * nd * ld * 128
        nbytes = (q.nbytes if hasattr(q, "nbytes") else q.numel() * q.element_size()) + (
            d.nbytes if hasattr(d, "nbytes") else d.numel() * d.element_size())
        floor = max(nbytes / ceilings["copy_tbps"] / 1e9, flops / ceilings["bf16_tflops"] / 1e9 / (2 if dtype == "int8" else 1))
        for label, docs_on_m, warpgroups in VARIANTS:
            with bench_forward.planner_settings(WGMMA_DOCS_ON_M=docs_on_m, WGMMA_SHAPE=dict(shape0, warpgroups=warpgroups)):
                out = cm.score(q, d, **kwargs)
                got = np.asarray(out.float().cpu() if hasattr(out, "cpu") else out.get(), dtype=np.float64)[:8, :16]
                error = float(np.max(np.abs(got - expected) / (1 + np.abs(expected))))
                ms = bench_forward._median_ms(torch, lambda: cm.score(q, d, **kwargs), reps=30 if nd < 1000 else 10)
            print(f"{name:<24} {label:<18} {ms:8.4f} ms  floor {floor:7.4f}  frac {floor / ms:4.2f}  "
                  f"rel err {error:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
