"""A/B of kernel trees (each a folder holding ``cupy_maxsim`` and ``kernels_cu``, e.g. a ``git
archive`` of a commit, or one with an experimental patch; without prebuilt cubins, so that every
tree compiles with this machine's NVRTC) on fp32 one query of 32 tokens
against about 4 GB (300 tokens a document), in one process: each tree imported as a package of
its own (ab_host_step.import_tree), the variants (tree x ``Tunables.wgmma_tf32_stretch``)
taking turns every round, each timed as the anchors are (bench_forward._median_ms: L2 flushed,
median of 10 calls between CUDA events). Prints each variant's median over rounds, its rounds,
and its first answer's largest difference from the first variant's (an experiment that breaks
the answers says so).

    git archive HEAD cupy_maxsim kernels_cu | tar -x -C /tmp/trees/base
    python bench/ab_trees.py /tmp/trees/base /tmp/trees/patched --dims 100,1024 --stretches 1,4
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from ab_host_step import import_tree  # noqa: E402
from bench_forward import _median_ms, provenance  # noqa: E402


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
    print(f"# {json.dumps(provenance())}; trees: {', '.join(map(str, args.trees))}")
    print(f"fp32 1x32 vs {args.corpus_gb:g} GB, 300 tokens a document; median ms of 10 calls a round, "
          f"{args.rounds} rounds taking turns")
    for dim in (int(x) for x in args.dims.split(",")):
        generator = torch.Generator(device="cuda").manual_seed(0)
        docs = int(args.corpus_gb * 1e9 // (300 * dim * 4))
        q = torch.randn(1, 32, dim, device="cuda", generator=generator) / 11
        d = torch.randn(docs, 300, dim, device="cuda", generator=generator) / 11
        times, diffs, first = {v: [] for v in variants}, {}, None
        for r in range(args.rounds):
            for name, stretch in variants:
                package = packages[name]
                with package.tuning.override(wgmma_tf32_stretch=stretch):
                    if r == 0:
                        out = package.score(q, d)
                        first = out if first is None else first
                        diffs[name, stretch] = float((out - first).abs().max())
                    times[name, stretch].append(_median_ms(torch, lambda: package.score(q, d), reps=10))
        for v in variants:
            ms = statistics.median(times[v])
            print(f"| {dim} | {v[0]} | stretch {v[1]} | {ms:.3f} ms | {args.corpus_gb * 1e3 / ms:.0f} GB/s | rounds "
                  f"{' '.join(f'{x:.3f}' for x in times[v])} | max diff {diffs[v]:.1e} |", flush=True)
        q = d = first = None  # (the next dim's corpus in their place)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
