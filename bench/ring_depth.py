"""Ring depth A/B on the Hopper kernel: its documents-on-M build that streams the query atoms
(bf16, 32x32 queries against about 4 GB of 300-token documents) at its fitted stages and at
fewer, everything else the same, with the fp32 split beside it (its ring: four slots). Whether
four 40 KB slots cap a slot's rate: the split ran 0.81 us a slot where this build ran 0.42 with
five (the notebook's forty-first session). Slot times are the kernel's time over the slots a
block multiplies (tiles x atoms x query groups / SMs); rounds interleaved, medians.

    python bench/ring_depth.py [--dim 1024] [--stages 5,4,3] [--rounds 5]
"""

import argparse
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import cupy_maxsim as cm  # noqa: E402
from ab_search import timed  # noqa: E402
from cupy_maxsim import _cache  # noqa: E402
from cupy_maxsim._plan import configs  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--stages", default="5,4,3", help="the stages the bf16 build is asked for")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    dim, doc_length, query_groups = options.dim, 300, 4  # 32x32 query rows: four groups of 256
    sms = cupy.cuda.runtime.getDeviceProperties(0)["multiProcessorCount"]
    rng = cupy.random.default_rng(0)
    cells = {}
    for dtype, item, atoms_per_64 in (("bfloat16", 2, 1), ("float32", 4, 3)):
        docs = int(4e9 / (doc_length * dim * item))
        q = rng.standard_normal((32, 32, dim), dtype=cupy.float32).astype(dtype)
        d = rng.standard_normal((docs, doc_length, dim), dtype=cupy.float32).astype(dtype)
        slots = docs * -(-doc_length // 64) * (-(-dim // 64) * atoms_per_64) * query_groups / sms
        cells[dtype] = (q, d, slots)
    stages = [int(s) for s in options.stages.split(",")]
    wanted = configs.WGMMA_SHAPE["stages"]
    times = {(dtype, s): [] for dtype in cells for s in (stages if dtype == "bfloat16" else [0])}
    for _ in range(options.rounds):
        for (dtype, s), runs in times.items():
            q, d, _ = cells[dtype]
            configs.WGMMA_SHAPE["stages"] = s or wanted  # (the fp32 split's build fits its own)
            _cache.clear_all()
            cm.score(q, d)  # (plan, compile, warm)
            runs.append(timed(lambda: cm.score(q, d), calls=3))
    configs.WGMMA_SHAPE["stages"] = wanted
    _cache.clear_all()
    print(f"| dtype | stages asked | ms | us a slot |  ({cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, dim {dim})")
    print("|---|---|---|---|")
    for (dtype, s), runs in times.items():
        ms = float(np.median(runs))
        print(f"| {dtype} | {s or 'its own'} | {ms:.3f} | {1e3 * ms / cells[dtype][2]:.3f} |")


if __name__ == "__main__":
    main()
