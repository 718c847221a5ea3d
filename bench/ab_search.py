"""Search's cost over scoring alone, measured interleaved: 1 query of 32 tokens against 1M
documents of 128 x 128 fp16 (CuPy arrays), rounds of score / search k=10 / search k=1000 in
turn, each timed by CUDA events over 5 back-to-back calls; medians of the rounds and the
ratios (issue 25: k=1000 at most 7.9 ms; the top-k at most 3% over scoring).

    python bench/ab_search.py [--rounds 15] > bench/results/ab-search-<date>-<commit>.txt
"""

import argparse

import cupy
import numpy as np

import cupy_maxsim as cm


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
    rounds = parser.parse_args().rounds
    rng = cupy.random.default_rng(0)
    d = cupy.empty((1_000_000, 128, 128), cupy.float16)  # filled in slices: no float32 corpus
    for s in range(0, d.shape[0], 50_000):
        d[s:s + 50_000] = rng.standard_normal((50_000, 128, 128), dtype=cupy.float32).astype(cupy.float16)
    q = rng.standard_normal((1, 32, 128), dtype=cupy.float32).astype(cupy.float16)
    cells = {"score": lambda: cm.score(q, d), "search k=10": lambda: cm.search(q, d, 10),
             "search k=1000": lambda: cm.search(q, d, 1000)}
    for fn in cells.values():
        timed(fn, 3)  # compile, warm
    times = {name: [] for name in cells}
    for _ in range(rounds):
        for name, fn in cells.items():
            times[name].append(timed(fn))
    print(f"# {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, cupy {cupy.__version__}, {rounds} rounds")
    base = float(np.median(times["score"]))
    print("| cell | median ms | min ms | x scoring alone |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {np.median(values):.3f} | {np.min(values):.3f} | {np.median(values) / base:.3f} |")


if __name__ == "__main__":
    main()
