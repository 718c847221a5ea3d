"""Does a search call wait for the GPU? Host time of each call of score and search (1 query of
32 tokens against N x 128 x 128 fp16, k=10 and 1000), submitted back to back without waiting:
a call whose host time is near the kernels' time waits for the stream somewhere.

    python bench/search_host_probe.py [--docs 200000] [--calls 20]
"""

import argparse
import time

import cupy
import numpy as np

import cupy_maxsim as cm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=20)
    options = parser.parse_args()
    rng = cupy.random.default_rng(0)
    d = cupy.empty((options.docs, 128, 128), cupy.float16)
    for s in range(0, d.shape[0], 50_000):
        part = d[s:s + 50_000]
        part[...] = rng.standard_normal(part.shape, dtype=cupy.float32).astype(cupy.float16)
    q = rng.standard_normal((1, 32, 128), dtype=cupy.float32).astype(cupy.float16)
    cells = {"score": lambda: cm.score(q, d), "search k=10": lambda: cm.search(q, d, 10),
             "search k=1000": lambda: cm.search(q, d, 1000)}
    print(f"# {options.docs} x 128 x 128 fp16, 1 query; host us a call (submitted back to back), then GPU ms a call")
    print("| cell | host us median | host us max | end-to-end ms a call |\n|---|---|---|---|")
    for name, fn in cells.items():
        for _ in range(3):
            fn()
        cupy.cuda.Device().synchronize()
        host = []
        start = cupy.cuda.Event()
        stop = cupy.cuda.Event()
        start.record()
        for _ in range(options.calls):
            began = time.perf_counter()
            fn()
            host.append((time.perf_counter() - began) * 1e6)
        stop.record()
        stop.synchronize()
        gpu = cupy.cuda.get_elapsed_time(start, stop) / options.calls
        print(f"| {name} | {np.median(host):.0f} | {np.max(host):.0f} | {gpu:.3f} |")


if __name__ == "__main__":
    main()
