"""A/B of kernel trees (each a folder holding ``cupy_maxsim`` and ``kernels_cu``, e.g. a ``git
archive`` of a commit, or one with an experimental patch) on fp32 one query of 32 tokens
against about 4 GB (300 tokens a document), in one process: each tree imported as a package of
its own, the variants (tree x ``Tunables.wgmma_tf32_stretch``) taking turns every round, the L2
flushed before each call, CUDA-event times, the median of 10 calls a round. Prints each
variant's median over rounds, its rounds, and its first answer's largest difference from the
first variant's (an experiment that breaks the answers says so).

    git archive HEAD cupy_maxsim kernels_cu | tar -x -C /tmp/trees/base
    python bench/ab_trees.py /tmp/trees/base /tmp/trees/patched --dims 100,1024 --stretches 1,4
"""
from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import cupy as cp


def import_tree(path: Path, name: str):
    root = Path(tempfile.mkdtemp())
    shutil.copytree(path / "cupy_maxsim", root / name, ignore=shutil.ignore_patterns("prebuilt", "__pycache__"))
    shutil.copytree(path / "kernels_cu", root / "kernels_cu")
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--dims", default="100,1024,4096")
    parser.add_argument("--stretches", default="1", help="Tunables.wgmma_tf32_stretch values, e.g. 1,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus-gb", type=float, default=4.0)
    args = parser.parse_args(argv)
    packages = {tree.name: import_tree(tree, f"cupy_maxsim_ab{i}") for i, tree in enumerate(args.trees)}
    variants = [(name, int(s)) for name in packages for s in args.stretches.split(",")]
    flush = cp.empty(256 << 20, cp.uint8)
    print(f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}: fp32 1x32 vs {args.corpus_gb:g} GB, 300 tokens "
          f"a document; median ms of 10 calls a round, {args.rounds} rounds taking turns")
    for dim in (int(x) for x in args.dims.split(",")):
        rng = cp.random.default_rng(0)
        q = rng.standard_normal((1, 32, dim), dtype=cp.float32) / 11
        d = rng.standard_normal((int(args.corpus_gb * 1e9 // (300 * dim * 4)), 300, dim), dtype=cp.float32) / 11
        times, diffs, first = {v: [] for v in variants}, {}, None
        for r in range(args.rounds):
            for name, stretch in variants:
                package = packages[name]
                with package.tuning.override(wgmma_tf32_stretch=stretch):
                    out = package.score(q, d)
                    if r == 0:
                        first = out if first is None else first
                        diffs[name, stretch] = float(cp.abs(out - first).max())
                    calls = []
                    for _ in range(10):
                        flush.fill(r)
                        start, end = cp.cuda.Event(), cp.cuda.Event()
                        start.record()
                        package.score(q, d)
                        end.record()
                        end.synchronize()
                        calls.append(cp.cuda.get_elapsed_time(start, end))
                    times[name, stretch].append(statistics.median(calls))
        for v in variants:
            ms = statistics.median(times[v])
            print(f"| {dim} | {v[0]} | stretch {v[1]} | {ms:.3f} ms | {args.corpus_gb * 1e3 / ms:.0f} GB/s | rounds "
                  f"{' '.join(f'{x:.3f}' for x in times[v])} | max diff {diffs[v]:.1e} |", flush=True)
        del q, d, first
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
