"""Issue 26's speed and memory lines: the MaxSim part of a PyLate contrastive step and of a
colpali-engine step, forward and backward, with our scorers beside the packages' own backends
(torch, late-interaction-kernels, and PyLate's flash-maxsim), in one process.

- PyLate: 128 queries of 32 tokens against their positive and one hard negative each (256
  documents of 300 tokens, dim 128; a third of the document tokens masked as padding), scored
  by ``pylate.scores.colbert_scores`` (backend torch, lik, flash) or
  ``cupy_maxsim.integrations.pylate.colbert_scores``, then Contrastive's cross entropy over the
  256 documents and its backward.
- colpali-engine: 32 queries of 32 tokens against 128 pages of 1030 patches (in-batch, zero
  padded), by ``colpali_engine.utils.maxsim.maxsim_inbatch`` (COLPALI_SCORES_BACKEND torch or
  lik) or ``cupy_maxsim.integrations.colpali_engine.maxsim_inbatch``, then cross entropy with
  the first 32 pages as positives, and its backward.

Each cell: CUDA events over back-to-back steps, medians of interleaved rounds; peak memory
beyond the inputs (torch's allocator and CuPy's pool both watched). PyLate's and colpali-engine's
packages are imported without running their top-level ``__init__`` (which import their models:
transformers, datasets, peft); the scoring modules themselves are theirs, unchanged.

    python bench/bench_integrations.py [--rounds 5] [--dtype bfloat16] [--profile] [--out DIR]

The MaxSim part of a step is the step less the same loss and backward on precomputed scores
(the cell "loss alone", timed among the others).

Writes integrations-<date>-<commit>.json; prints a table last.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def _package_without_init(name: str):
    """Register package ``name`` (dotted) as a bare module on its real folder, so that its
    submodules import without its ``__init__``; parents first."""
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        dotted = ".".join(parts[:depth])
        if dotted in sys.modules:
            continue
        if depth == 1:
            spec = importlib.util.find_spec(dotted)
            folder = list(spec.submodule_search_locations)
        else:
            folder = [os.path.join(sys.modules[".".join(parts[:depth - 1])].__path__[0], parts[depth - 1])]
        module = types.ModuleType(dotted)
        module.__path__ = folder
        sys.modules[dotted] = module
        if depth > 1:
            setattr(sys.modules[".".join(parts[:depth - 1])], parts[depth - 1], module)


def pylate_scorers():
    """{backend: scorer(q, d, q_mask, d_mask)} of PyLate's own colbert_scores, and ours."""
    import pylate  # noqa: F401 - its __init__ holds only the version

    _package_without_init("pylate.utils")
    from pylate.scores import colbert as pylate_colbert

    from cupy_maxsim.integrations import pylate as ours

    scorers = {f"pylate {b}": (lambda b: lambda q, d, qm, dm: pylate_colbert.colbert_scores(q, d, qm, dm, backend=b))(b)
               for b in ("torch", "lik", "flash")}
    scorers["cupy_maxsim"] = lambda q, d, qm, dm: ours.colbert_scores(q, d, qm, dm)
    return scorers


def colpali_scorers():
    """{backend: scorer(q, d)} of colpali-engine's maxsim_inbatch, and ours."""
    _package_without_init("colpali_engine.utils")
    from colpali_engine.utils import maxsim as colpali_maxsim

    from cupy_maxsim.integrations import colpali_engine as ours

    def backend(name):
        def scorer(q, d):
            os.environ["COLPALI_SCORES_BACKEND"] = name
            return colpali_maxsim.maxsim_inbatch(q, d)
        return scorer

    return {"colpali torch": backend("torch"), "colpali lik": backend("lik"),
            "cupy_maxsim": lambda q, d: ours.maxsim_inbatch(q, d)}


class PeakMemory:
    """Peak bytes beyond the start: torch's allocator and CuPy's pool (accept_search's hook)."""

    def __init__(self):
        import cupy
        import torch

        from accept_search import PeakBytes

        self.torch, self.cupy_peak = torch, PeakBytes(cupy)

    def __enter__(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.reset_peak_memory_stats()
        self.torch_start = self.torch.cuda.memory_allocated()
        self.cupy_peak.__enter__()
        return self

    def __exit__(self, *exc):
        self.torch.cuda.synchronize()
        self.cupy_peak.__exit__(*exc)
        self.bytes = self.torch.cuda.max_memory_allocated() - self.torch_start + self.cupy_peak.peak


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--profile", action="store_true",
                        help="also each cell's CUDA kernels' time a step (torch.profiler)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    import torch

    from bench_forward import write_record

    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def unit(*shape):
        x = torch.randn(*shape, device="cuda", generator=gen)
        return (x / x.norm(dim=-1, keepdim=True)).to(dtype)

    # PyLate: 128 queries, a positive and a hard negative each, 300-token documents.
    pq, pd = unit(128, 32, 128), unit(256, 300, 128)
    pq_mask = torch.ones(128, 32, dtype=torch.bool, device="cuda")
    lengths = torch.randint(100, 301, (256,), device="cuda", generator=gen)
    pd_mask = torch.arange(300, device="cuda")[None] < lengths[:, None]
    pd = pd * pd_mask[..., None]
    labels = torch.arange(128, device="cuda")

    # colpali-engine: 32 queries against 128 pages of 1030 patches, zero padded.
    cq, cd = unit(32, 32, 128), unit(128, 1030, 128)
    c_labels = torch.arange(32, device="cuda")

    # The loss alone on precomputed scores: the part of a step that is not MaxSim's.
    p_scores = torch.randn(128, 256, device="cuda", generator=gen).to(dtype)
    c_scores = torch.randn(32, 128, device="cuda", generator=gen).to(dtype)

    def loss_alone(scores, labels):
        def step():
            s = scores.detach().requires_grad_()
            torch.nn.functional.cross_entropy(s.float(), labels).backward()
            return s, None, None
        return step

    cells = {"pylate contrastive | loss alone": loss_alone(p_scores, labels)}
    for name, scorer in pylate_scorers().items():
        def step(scorer=scorer):
            q, d = pq.detach().requires_grad_(), pd.detach().requires_grad_()
            scores = scorer(q, d, pq_mask, pd_mask)
            torch.nn.functional.cross_entropy(scores.float(), labels).backward()
            return scores, q.grad, d.grad
        cells[f"pylate contrastive | {name}"] = step
    for name, scorer in colpali_scorers().items():
        def step(scorer=scorer):
            q, d = cq.detach().requires_grad_(), cd.detach().requires_grad_()
            scores = scorer(q, d)
            torch.nn.functional.cross_entropy(scores.float(), c_labels).backward()
            return scores, q.grad, d.grad
        cells[f"colpali in-batch | {name}"] = step
    cells["colpali in-batch | loss alone"] = loss_alone(c_scores, c_labels)

    results, references = {}, {}
    for name, step in list(cells.items()):  # warm, compile, check against the torch backend
        try:
            with PeakMemory() as peak:
                scores, dq, dd = step()
            results[name] = {"peak_mb": peak.bytes / 2**20}
            group = name.split(" | ")[0]
            if name.endswith("torch") and dq is not None:
                references[group] = (scores.float(), dq.float(), dd.float())
        except Exception as error:  # noqa: BLE001 - a backend that cannot run this shape is reported
            results[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            del cells[name]
    for name in cells:
        group = name.split(" | ")[0]
        if group in references and "error" not in results[name] and not name.endswith("loss alone"):
            scores, dq, dd = cells[name]()
            ref = references[group]
            results[name]["max_abs_diff"] = {k: float((a.float() - b).abs().max()) for k, a, b in
                                             zip(("scores", "dq", "dd"), (scores, dq, dd), ref)}
    times = {name: [] for name in cells}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(args.rounds):
        for name, step in cells.items():
            step()
            start.record()
            for _ in range(args.calls):
                step()
            stop.record()
            stop.synchronize()
            times[name].append(start.elapsed_time(stop) / args.calls)
    for name, ts in times.items():
        results[name]["ms"] = sorted(ts)[len(ts) // 2]
    for name in cells:  # the MaxSim part: the step less the loss alone
        base = results.get(f"{name.split(' | ')[0]} | loss alone", {}).get("ms")
        if base is not None and not name.endswith("loss alone"):
            results[name]["maxsim_ms"] = results[name]["ms"] - base
    if args.profile:
        from ab_kernel_times import kernel_us

        for name, step in cells.items():
            results[name]["kernels_us"] = kernel_us(step, args.calls, prefix="")
    path = write_record(args.out, "integrations",
                        {"dtype": args.dtype, "rounds": args.rounds, "calls": args.calls, "results": results})
    if args.profile:
        for name, r in results.items():
            kernels = r.get("kernels_us", {})
            print(f"{name}: {sum(kernels.values()):.1f} us of kernels a step")
            for kernel, us in sorted(kernels.items(), key=lambda kv: -kv[1])[:8]:
                print(f"    {us:8.1f} us  {kernel[:100]}")
    print(f"{'cell':<44} {'ms':>8} {'maxsim ms':>9} {'peak MB':>9}  max |diff| vs torch (scores, dq, dd)")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<44} {r['error'][:90]}")
            continue
        diff = r.get("max_abs_diff")
        print(f"{name:<44} {r['ms']:>8.3f} {r.get('maxsim_ms', float('nan')):>9.3f} {r['peak_mb']:>9.1f}  "
              + (", ".join(f"{v:.2g}" for v in diff.values()) if diff else "-"))
    for group in ("pylate contrastive", "colpali in-batch"):
        ours = results.get(f"{group} | cupy_maxsim", {})
        lik = results.get(f"{group} | {group.split()[0]} lik", {})
        torch_default = results.get(f"{group} | {group.split()[0]} torch", {})
        if "ms" in ours and "ms" in lik:
            print(f"{group}: lik / ours time {lik['ms'] / ours['ms']:.2f}x the step, "
                  f"{lik['maxsim_ms'] / ours['maxsim_ms']:.2f}x its MaxSim part (line: at least 2x)")
        if "peak_mb" in ours and "peak_mb" in torch_default and "ms" in ours:
            print(f"{group}: torch / ours memory {torch_default['peak_mb'] / max(ours['peak_mb'], 1e-9):.1f}x "
                  "(line: at least 5x)")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
