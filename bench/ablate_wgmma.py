"""Which part of the Hopper forward limits it: the same kernel with the fold, the MMAs or both
removed by source patches (timing only: the scores of a patched kernel are wrong by design).
fp16, dim 128, 3 warpgroups, 6 stages.

    python bench/ablate_wgmma.py > bench/results/ablation-wgmma-<date>.log
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402

FOLD = ("        if (info.biased)\n            fold_tile(acc, info, true);\n        else\n            fold_tile(acc, info, false);\n", "")
MMA = ("for (int ks = 0; ks < KSTEPS; ++ks) Wgmma64<T>::run(acc, a_regs[ks], desc + kstep_offset(ks), ks);",
       "if (desc == 1) Wgmma64<T>::run(acc, a_regs[0], desc, 0);")  # never true: no MMA issued
PATCHES = {"base": [], "no-fold": [FOLD], "no-mma": [MMA], "no-fold-no-mma": [FOLD, MMA]}
SHAPES = {"inbatch-128": (128, 32, 128, 300), "colpali-32q-10k": (32, 32, 10_000, 1030)}


def main() -> int:
    import cupy
    import torch

    import cupy_maxsim as cm
    from cupy_maxsim import _api, _kernels

    original = _kernels.source
    for name, (nq, lq, nd, ld) in SHAPES.items():
        rng = cupy.random.default_rng(0)
        q = (rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        d = (rng.standard_normal((nd, ld, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        for label, patch in PATCHES.items():
            def patched(family, patch=patch):
                text = original(family)
                for old, new in patch:
                    if family == "maxsim_fwd_wgmma":
                        assert old in text, f"patch target gone: {old[:60]}"
                        text = text.replace(old, new)
                return text

            _kernels.source = patched
            _kernels._modules.clear(), _kernels._kernel_cache.clear(), _api._mma_plan.cache_clear()
            ms = bench_forward._median_ms(torch, lambda: cm.score(q, d), reps=20 if nd < 1000 else 5)
            print(f"{name:<16} {label:<15} {ms:8.3f} ms", flush=True)
    _kernels.source = original
    _kernels._modules.clear(), _kernels._kernel_cache.clear(), _api._mma_plan.cache_clear()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
