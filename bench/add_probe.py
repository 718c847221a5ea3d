"""Host time of ``add(copy=None)`` (the corpus kept as it is, nothing copied) of a host corpus
into a CPU Index and a ShardedIndex, with ids assigned and given (shuffled), beside NumPy's
``np.unique`` of the same ids (what the checks of added ids took until 2026-12-05: 6.2 s of the
108 GB corpus's add on the H200 machine was its 6M ids), and of a search filter's rows (an
allow-list of 1,000 ids made into a boolean over the stored documents, each filtered search).
Runs on any machine, no GPU.

    python bench/add_probe.py [--docs 6032547] > bench/results/add-probe-<date>-<commit>.txt
"""

import argparse
import platform
import time

import numpy as np

import cupy_maxsim as cm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=6_032_547)
    parser.add_argument("--length", type=int, default=2, help="tokens a document (the corpus is zeros)")
    options = parser.parse_args()
    docs = options.docs
    tokens = np.zeros((docs * options.length, 128), np.float16)
    offsets = np.arange(docs + 1, dtype=np.int64) * options.length
    shuffled = np.random.default_rng(0).permutation(docs).astype(np.int64)
    print(f"# {docs:,} documents, numpy {np.__version__}, {platform.processor() or platform.machine()}, "
          f"cupy_maxsim {cm.__version__}")
    print("| call | s |\n|---|---|")
    start = time.perf_counter()
    np.unique(np.arange(docs, dtype=np.int64))
    print(f"| np.unique of the assigned ids (the old check) | {time.perf_counter() - start:.3f} |")
    start = time.perf_counter()
    np.unique(shuffled)
    print(f"| np.unique of the shuffled ids (the old check) | {time.perf_counter() - start:.3f} |")
    for name, make in (("Index", lambda: cm.Index(128, dtype="float16", device="cpu")),
                       ("ShardedIndex x1", lambda: cm.ShardedIndex(128, dtype="float16", devices=["cpu"]))):
        for given, ids in (("assigned", None), ("given, shuffled", shuffled)):
            index = make()
            start = time.perf_counter()
            index.add((tokens, offsets), ids=ids, copy=None)
            print(f"| {name}.add(copy=None), ids {given} | {time.perf_counter() - start:.3f} |")
            if name == "Index":
                allow = np.random.default_rng(1).choice(docs, 1000, replace=False)
                index._filter_rows(allow)  # (a first call may take the ids' sorted view)
                start = time.perf_counter()
                index._filter_rows(allow)
                print(f"| Index filter of 1,000 ids, ids {given} (a search's host step) | {time.perf_counter() - start:.4f} |")


if __name__ == "__main__":
    main()
