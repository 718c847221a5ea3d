"""The NumPy backend (no GPU) beside the MaxSim users write on the CPU: ``cm.score`` and
``cm.search`` against naive torch (einsum, max, sum, on the CPU in float32, documents 1,000 at a
time) and a float64 NumPy GEMM of the same blocks, on shapes of a CPU reranker and a small
corpus. Best of ``--rounds`` calls each, in one process. Runs on any machine.

    python bench/cpu_backend.py [--rounds 3] [--small] > bench/results/cpu-backend-<date>-<commit>.txt
    python -m cupy_maxsim bench --cpu [--rounds 3] [--small]
"""

import argparse
import os
import platform
import time

import numpy as np

import cupy_maxsim as cm

SHAPES = (  # (queries, query tokens, documents, document tokens, dim, dtype)
    (1, 32, 10_000, 128, 128, "float32"),
    (8, 32, 10_000, 128, 128, "float32"),
    (1, 32, 10_000, 128, 128, "float16"),
    (1, 32, 2_000, 300, 128, "float32"),
    (32, 32, 1_000, 128, 128, "float32"),
)
SMALL = ((1, 32, 200, 64, 128, "float32"), (4, 32, 100, 64, 128, "float16"))  # (--small: seconds)


def best_of(rounds: int, call) -> float:
    call()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="cpu_backend")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="two small shapes (a check that it runs)")
    options = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    print(f"# NumPy backend beside naive torch on the CPU; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, numpy {np.__version__}, torch {torch.__version__ if torch else '-'}, "
          f"cupy_maxsim {cm.__version__}, commit {os.environ.get('CUPY_MAXSIM_COMMIT', '?')}")
    print("| shape | cm.score ms | cm.search k=10 ms | naive torch fp32 ms | score / torch |\n|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for nq, lq, nd, ld, dim, dtype in SMALL if options.small else SHAPES:
        q = rng.standard_normal((nq, lq, dim)).astype(dtype)
        d = rng.standard_normal((nd, ld, dim)).astype(dtype)
        ours = best_of(options.rounds, lambda: cm.score(q, d))
        searched = best_of(options.rounds, lambda: cm.search(q, d, 10))
        naive = float("nan")
        if torch is not None:
            tq, td = torch.from_numpy(q.astype(np.float32)), torch.from_numpy(d.astype(np.float32))

            def torch_maxsim():
                return torch.cat([torch.einsum("qld,nmd->qnlm", tq, td[n:n + 1000]).amax(-1).sum(-1)
                                  for n in range(0, nd, 1000)], 1)

            naive = best_of(options.rounds, torch_maxsim)
        print(f"| {nq}x{lq} vs {nd:,}x{ld}x{dim} {dtype} | {ours:.1f} | {searched:.1f} | {naive:.1f} | "
              f"{ours / naive:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
