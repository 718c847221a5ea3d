"""Search's cost over scoring alone, measured interleaved: queries of 32 tokens (1 by
default) against 1M documents of 128 x 128 fp16 (CuPy arrays), rounds of score and search at
each k in turn, each timed by CUDA events over back-to-back calls; medians of the rounds and
the ratios (issue 25: k=1000 at most 7.9 ms; the top-k at most 3% over scoring). With
--ab FIELD=A,B each k runs once a value of that tunable (tuning.Tunables; values as Python
literals); --merge-ab is --ab search_merge_kernel=False,True. --docs and --doc-tokens shape the
corpus (1M x 128 by default).

    python bench/ab_search.py [--rounds 15] [--queries 1] [--ks 10,1000] [--ab FIELD=A,B] \
        [--docs 1000000] [--doc-tokens 128] > bench/results/ab-search-<date>-<commit>.txt
"""

import ast

import argparse

import cupy
import numpy as np

import cupy_maxsim as cm
from cupy_maxsim import tuning


def timed(fn, calls=5):
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / calls


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--queries", type=int, default=1)
    parser.add_argument("--ks", default="10,1000")
    parser.add_argument("--merge-ab", action="store_true", help="each k with the merge kernel off and on")
    parser.add_argument("--ab", help="FIELD=A,B: each k once a value of tunable FIELD")
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--doc-tokens", type=int, default=128)
    options = parser.parse_args()
    if options.merge_ab:
        options.ab = "search_merge_kernel=False,True"
    field, values = (None, [None]) if not options.ab else options.ab.split("=", 1)
    values = values if field is None else [ast.literal_eval(v) for v in values.split(",")]
    rounds, calls = options.rounds, 5 if options.queries == 1 else 1
    rng = cupy.random.default_rng(0)
    d = cupy.empty((options.docs, options.doc_tokens, 128), cupy.float16)  # filled in slices: no float32 corpus
    for s in range(0, d.shape[0], 50_000):
        part = d[s:s + 50_000]
        part[...] = rng.standard_normal(part.shape, dtype=cupy.float32).astype(cupy.float16)
    q = rng.standard_normal((options.queries, 32, 128), dtype=cupy.float32).astype(cupy.float16)

    def search(k, value=None):
        if field is None:
            return lambda: cm.search(q, d, k)

        def run():
            with tuning.override(**{field: value}):
                return cm.search(q, d, k)
        return run

    cells = {"score": lambda: cm.score(q, d)}
    for k in map(int, options.ks.split(",")):
        for value in values:
            cells[f"search k={k}" + ("" if field is None else f" {field}={value!r}")] = search(k, value)
    for fn in cells.values():
        timed(fn, min(3, calls))  # compile, warm
    times = {name: [] for name in cells}
    for _ in range(rounds):
        for name, fn in cells.items():
            times[name].append(timed(fn, calls))
    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}, "
          f"{rounds} rounds, {options.queries} queries x 32 tokens against {options.docs} x {options.doc_tokens} x 128 "
          f"fp16, {calls} calls a timing")
    base = float(np.median(times["score"]))
    print("| cell | median ms | min ms | x scoring alone |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {np.median(values):.3f} | {np.min(values):.3f} | {np.median(values) / base:.3f} |")


if __name__ == "__main__":
    main()
