"""Sharded search against shard count (issue 28, item 4): one corpus as one GPU Index and as a
ShardedIndex of 1, 2, 4 and 8 shards over the visible GPUs (several on one GPU where there are
fewer: then the cost of sharding itself, the per-shard searches and the host merge), 1 query
and 256 queries, k=100; whether every sharded result equals the single index's, bitwise.

    python bench/bench_shards.py [--docs 200000] [--dtype float16] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from accept_search import unit_corpus  # noqa: E402
from bench_forward import provenance  # noqa: E402


def wall_ms(cupy, fn, reps):
    times, result = [], None
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        result = fn()
        cupy.cuda.Device().synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times)), result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--shards", default="1,2,4,8")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args(argv)
    import cupy

    import cupy_maxsim as cm

    meta = provenance()
    gpus = cupy.cuda.runtime.getDeviceCount()
    report = {"provenance": meta, "options": vars(options), "gpus": gpus, "rows": []}
    path = Path(options.out) / f"shards-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    d = unit_corpus(cupy, (options.docs, 128, 128), 7)
    queries = {n: unit_corpus(cupy, (n, 32, 128), 8 + n) for n in (1, 256)}
    single = cm.Index(128, dtype=options.dtype, device="cuda")
    single.add(d)
    want = {n: [x.get() for x in single.search(q, 100)] for n, q in queries.items()}
    base = {n: wall_ms(cupy, lambda q=q: single.search(q, 100), 5)[0] for n, q in queries.items()}
    report["rows"].append({"shards": "one Index", "ms_1q": base[1], "ms_256q": base[256]})
    print("| shards | devices | 1 query ms | 256 queries ms | identical |\n|---|---|---|---|---|")
    print(f"| one Index | 1 | {base[1]:.3f} | {base[256]:.2f} | - |", flush=True)
    for count in map(int, options.shards.split(",")):
        sharded = cm.ShardedIndex(128, dtype=options.dtype, devices=list(range(gpus)), shards=count)
        sharded.add(d)
        row = {"shards": count, "devices": min(count, gpus), "identical": True}
        for n, q in queries.items():
            row[f"ms_{n}q" if n == 1 else "ms_256q"], got = wall_ms(cupy, lambda q=q: sharded.search(q, 100), 5)
            row["identical"] &= all(np.array_equal(a.get(), b) for a, b in zip(got, want[n]))
        report["rows"].append(row)
        path.write_text(json.dumps(report, indent=1))
        print(f"| {count} | {row['devices']} | {row['ms_1q']:.3f} | {row['ms_256q']:.2f} | {row['identical']} |", flush=True)
        del sharded
        cupy.get_default_memory_pool().free_all_blocks()
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
