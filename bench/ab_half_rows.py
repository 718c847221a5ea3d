"""Half rows (one query of <= 32 rows: each thread folds one accumulator row, not two) on and
off, alternated three times in one process, on one-query shapes (16-bit padded and packed, int8).
Median ms per call as ANCHORS.md measured (L2 flushed before each call).

    python bench/ab_half_rows.py > bench/results/ab-half-rows-<date>-<commit>.log
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402


def main() -> int:
    import cupy
    import torch

    import cupy_maxsim as cm
    rng = cupy.random.default_rng(0)
    q = torch.as_tensor(rng.standard_normal((1, 32, 128), dtype=cupy.float32) / 11, device="cuda").half()
    padded = torch.as_tensor(rng.standard_normal((10_000, 300, 128), dtype=cupy.float32) / 11, device="cuda").half()
    lengths = rng.integers(16, 301, 100_000)
    offsets = torch.as_tensor(cupy.concatenate([cupy.zeros(1, cupy.int64), cupy.cumsum(lengths)]), device="cuda")
    tokens = torch.as_tensor(rng.standard_normal((int(lengths.sum()), 128), dtype=cupy.float32) / 11,
                             device="cuda").half()
    (q8, q8_scale), (d8, d8_scale) = cm.quantize_int8(q), cm.quantize_int8(padded)
    calls = {"corpus-10k fp16": lambda: cm.score(q, padded),
             "packed-ragged-100k fp16": lambda: cm.score_packed(q, tokens, offsets),
             "corpus-10k int8": lambda: cm.score(q8, d8, q_scale=q8_scale, d_scale=d8_scale)}
    for round_ in range(3):
        for half in (True, False):
            with bench_forward.planner_settings(WGMMA_HALF_ROWS=half):
                for name, call in calls.items():
                    ms = bench_forward._median_ms(torch, call, reps=30)
                    print(f"round {round_}  half rows {'on ' if half else 'off'}  {name:<26} {ms:7.4f} ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
