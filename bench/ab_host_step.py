"""A/B of the training step's host path in one process: this tree's ``cupy_maxsim.torch``
against another commit's (a copy imported as ``cupy_maxsim_base``) and the autograd floor
(bench_train's allocations-only Function), round-robin, as the host's speed drifts within a
process by 2-3x (docs/notebook.md). Per round and variant: the median host microseconds of a
free-running step (300 steps, no sync between: the host's own path) and the do_bench median
(bench_forward._median_ms, the anchors' method).

    git archive <commit> cupy_maxsim kernels_cu | tar -x -C /tmp/base
    python bench/ab_host_step.py --base /tmp/base --out bench/results/ab-host-step-<date>-<commit>.txt
"""
from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import _median_ms  # noqa: E402
from bench_train import AUTOGRAD_FLOOR, SHAPES, _unit, make_step, providers  # noqa: E402

import cupy_maxsim.torch as cmt  # noqa: E402


def import_tree(path: Path, name: str):
    """``path``'s cupy_maxsim (and kernels_cu beside it) as the package ``name``, in a folder of
    its own (the kernels are found beside the package)."""
    root = Path(tempfile.mkdtemp())
    shutil.copytree(path / "cupy_maxsim", root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(path / "kernels_cu", root / "kernels_cu")
    sys.path.insert(0, str(root))
    return importlib.import_module(name)


def import_base(path: Path):
    """``path``'s cupy_maxsim as the package cupy_maxsim_base; its torch adapter."""
    import_tree(path, "cupy_maxsim_base")
    return importlib.import_module("cupy_maxsim_base.torch")


def host_us(step, steps=300) -> float:
    """Median host microseconds of a free-running step (the device queue holds the launches)."""
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        step()
        times.append((time.perf_counter_ns() - start) / 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def round_robin(steps: dict, rounds: int) -> tuple[dict, dict]:
    """({name: host us per round}, {name: do_bench ms per round}) of each training step, the
    variants taking turns every round."""
    host = {name: [] for name in steps}
    bench = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            host[name].append(host_us(step))
            bench[name].append(_median_ms(torch, step, reps=50))
    return host, bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", type=Path, required=True, help="a folder with another commit's cupy_maxsim and kernels_cu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="also write the table here")
    options = parser.parse_args()
    base = import_base(options.base)
    floor = providers(torch)[0][AUTOGRAD_FLOOR]
    variants = {"floor": floor, "base": base.maxsim, "this tree": cmt.maxsim}
    lines = [f"# {torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}: bench/ab_host_step.py --base "
             f"{options.base} ({options.rounds} rounds, round-robin; host: median us of 300 free-running steps; "
             "do_bench: median ms)"]
    for shape, (nq, lq, nd, ld, dim) in SHAPES.items():
        q0, d0 = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
        grad = torch.randn(nq, nd, device="cuda")
        steps = {name: make_step(fn, q0, d0, grad)[0] for name, fn in variants.items()}
        host, bench = round_robin(steps, options.rounds)
        lines.append(f"== {shape}")
        for name in steps:
            lines.append(f"  {name:10s} host us " + " ".join(f"{x:6.1f}" for x in host[name])
                         + f"  (median {statistics.median(host[name]):6.1f})   do_bench ms "
                         + " ".join(f"{x:.3f}" for x in bench[name]) + f"  (median {statistics.median(bench[name]):.3f})")
        for name in ("base", "this tree"):
            extra = [h - f for h, f in zip(host[name], host["floor"])]
            lines.append(f"  {name:10s} minus floor, host us per round: " + " ".join(f"{x:6.1f}" for x in extra)
                         + f"  (median {statistics.median(extra):6.1f})")
        print("\n".join(lines[-6:]), flush=True)
    if options.out:
        Path(options.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
