"""One call of each Hopper forward path (2/3 warpgroups, one query with documents split, 64/128-row tiles, TMA and cp.async, fp16/int8,
padded/masked/packed) against the mma.sync kernel: a fast first look before the full suite.

    python bench/smoke_hopper.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402


def main() -> int:
    import cupy

    import cupy_maxsim as cm

    rng = cupy.random.default_rng(0)
    worst = 0.0
    for nq, tile_n in ((1, 64), (3, 64), (13, 64), (1, 128), (3, 128), (13, 128)):
        q = (rng.standard_normal((nq, 27, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        d = (rng.standard_normal((200, 300, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        mask = rng.random((200, 300)) < 0.8
        offsets = cupy.asarray([0, 5, 70, 300, 1000, 1001, 4000], dtype=cupy.int32)
        tokens = d.reshape(-1, 128)[:4000]
        (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
        calls = {
            "fp16": lambda: cm.score(q, d),
            "fp16 masked": lambda: cm.score(q, d, d_mask=mask),
            "fp16 packed": lambda: cm.score_packed(q, tokens, offsets),
            "int8": lambda: cm.score(q8, d8, q_scale=qs, d_scale=ds),
        }
        for name, call in calls.items():
            results = []
            for wgmma, tma in ((True, True), (True, False), (False, True)):
                # WGMMA_TILE_ROWS: 16-bit inputs (int8 keeps its planned tiles)
                with bench_forward.planner_settings(USE_WGMMA=wgmma, USE_TMA=tma, WGMMA_TILE_ROWS=tile_n):
                    results.append(call())
            cupy.cuda.runtime.deviceSynchronize()
            tma_vs_copies = float(cupy.nanmax(cupy.abs(results[0] - results[1])))
            vs_classic = float(cupy.nanmax(cupy.abs(results[0] - results[2])))
            worst = max(worst, tma_vs_copies)
            print(f"nq {nq:>2} N{tile_n} {name:<12} TMA vs cp.async {tma_vs_copies:.1e}  vs mma.sync {vs_classic:.1e}", flush=True)
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
