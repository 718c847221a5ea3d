"""Is the int8 Index's search slower under sustained load than alone? One query of 32 tokens
against 1M x 128 x 128 (issue 25's corpus) as an int8 Index and as fp16 scoring: each call
timed alone after the GPU idled (50 ms, L2 flushed), then batches of back-to-back calls with
the GPU's SM and memory clocks, power, temperature and throttle reasons read (nvidia-smi, read
only) after each batch. ncu read the int8 kernel at 4.09 ms (ncu-search-int8-2026-12-04-72f1b5e)
where accept_search reads the search at 4.5-4.6.

    python bench/sustained_int8.py [--batches 6] [--calls 50] [--ab FIELD=A,B] > bench/results/sustained-int8-<date>-<commit>.txt

``--ab FIELD=A,B``: the int8 search also under each value of that tunable (tuning.Tunables, as
Python literals), sustained, the values taking turns batch by batch.
"""

import argparse
import ast
import sys
import time
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ab_search import timed  # noqa: E402
from timing_modes import _GPU_STATE, gpu_state  # noqa: E402

import cupy_maxsim as cm  # noqa: E402
from cupy_maxsim import tuning  # noqa: E402


def alone(fn, calls, flush):
    """Median ms of ``calls`` calls, each after the GPU idled 50 ms with L2 flushed."""
    times = []
    for _ in range(calls):
        flush[...] = 0
        cupy.cuda.Device().synchronize()
        time.sleep(0.05)
        times.append(timed(fn, 1))
    return float(np.median(times))


def sustained(fn, batches, calls):
    """(ms a call, the GPU's state after it) of ``batches`` batches of ``calls`` back-to-back calls."""
    return [(timed(fn, calls), gpu_state()) for _ in range(batches)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--ab", help="FIELD=A,B: the int8 search under each value of tunable FIELD too")
    options = parser.parse_args()
    rng = cupy.random.default_rng(0)
    d = cupy.empty((1_000_000, 128, 128), cupy.float16)
    for s in range(0, d.shape[0], 50_000):
        x = rng.standard_normal((50_000, 128, 128), dtype=cupy.float32)
        d[s:s + 50_000] = (x / cupy.linalg.norm(x, axis=-1, keepdims=True)).astype(cupy.float16)
    q = rng.standard_normal((1, 32, 128), dtype=cupy.float32).astype(cupy.float16)
    flush = cupy.empty(256 * 2**20, cupy.uint8)
    cells = {"fp16 score": lambda: cm.score(q, d)}
    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}; idle: {gpu_state()}")
    results = {}
    for name, fn in cells.items():
        fn(), fn()
        results[name] = (alone(fn, 10, flush), sustained(fn, options.batches, options.calls))
    index = cm.Index(128, dtype="int8", device="cuda")
    index.add(d)
    del d
    cupy.get_default_memory_pool().free_all_blocks()
    for name, fn in {"int8 index search k=1000": lambda: index.search(q, 1000)}.items():
        fn(), fn()
        results[name] = (alone(fn, 10, flush), sustained(fn, options.batches, options.calls))
    if options.ab:
        field, values = options.ab.split("=", 1)
        variants = {f"{field}={v}": ast.literal_eval(v) for v in values.split(",")}

        def under(value):
            def run():
                with tuning.override(**{field: value}):
                    return index.search(q, 1000)
            return run

        for fn in map(under, variants.values()):
            fn(), fn()
        turns = {name: [] for name in variants}
        for _ in range(options.batches):
            for name, value in variants.items():
                turns[name] += sustained(under(value), 1, options.calls)
        for name, rows in turns.items():
            results[f"int8 index search k=1000, {name}"] = (float("nan"), rows)
    print(f"# ms a call: alone (after 50 ms idle, L2 flushed; median of 10), then batches of {options.calls} "
          f"back to back; GPU state ({_GPU_STATE}) after each batch")
    for name, (single, rows) in results.items():
        print(f"## {name}: alone {single:.3f} ms")
        for ms, state in rows:
            print(f"  {ms:.3f} ms | {state}")


if __name__ == "__main__":
    main()
