"""Search benchmark: cupy_maxsim.search (and an Index) beside score + torch.topk for us,
flash-maxsim and late-interaction-kernels, in one process: milliseconds, queries per second and
peak extra device memory against corpus size and query batch, for each k.

    python bench/bench_search.py [--docs 10000,100000,1000000] [--queries 1,32,1000] [--k 10,100,1000]
                                 [--doc-length 128] [--out DIR]

Writes search-<date>-<commit>.json. "extra MB" is torch's allocator's peak beyond the inputs;
the selection of cupy_maxsim.search runs in CuPy's pool, which it does not see (until the
selection is fused into the kernels: issue 25).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import _median_ms, measure_ceilings, provenance  # noqa: E402
from cliffs import unit  # noqa: E402


def providers(torch, k):
    import cupy_maxsim as cm

    found = {"cupy_maxsim score alone (no top-k: the baseline)": lambda q, d: cm.score(q, d),
             "cupy_maxsim.search": lambda q, d: cm.search(q, d, k),
             "cupy_maxsim score + topk": lambda q, d: torch.topk(cm.score(q, d), min(k, d.shape[0]), dim=-1)}
    try:
        import flash_maxsim as fm

        def flash(q, d):
            scores = fm.flash_maxsim(q[0], d)[None] if q.shape[0] == 1 else fm.flash_maxsim_batched(q, d)
            return torch.topk(scores, min(k, d.shape[0]), dim=-1)

        found["flash_maxsim_0.3.0 + topk"] = flash
    except Exception:  # noqa: BLE001 - not installed: not measured
        pass
    try:
        import late_interaction_kernels as lik

        def lik_fn(q, d):
            if d.numel() > 2**31:
                return None  # its index arithmetic overflows past 2^31 elements (ANCHORS.md)
            return torch.topk(lik.maxsim(q, d), min(k, d.shape[0]), dim=-1)

        found["late_interaction_kernels_0.4.5 + topk"] = lik_fn
    except Exception:  # noqa: BLE001
        pass
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", default="10000,100000,1000000")
    parser.add_argument("--queries", default="1,32,1000")
    parser.add_argument("--k", default="10,100,1000")
    parser.add_argument("--doc-length", type=int, default=128)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args(argv)
    import torch

    ceilings = measure_ceilings(torch)
    meta = provenance()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"search-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}"
    rows = []
    print("| docs | queries | k | provider | ms | QPS | extra MB |")
    print("|---|---|---|---|---|---|---|")
    for num_docs in map(int, options.docs.split(",")):
        d = unit(torch, (num_docs, options.doc_length, options.dim), 2, "float16")
        for num_queries in map(int, options.queries.split(",")):
            q = unit(torch, (num_queries, 32, options.dim), 1, "float16")
            for k in map(int, options.k.split(",")):
                for name, call in providers(torch, k).items():
                    entry = {"docs": num_docs, "queries": num_queries, "k": k, "provider": name}
                    try:
                        if call(q, d) is None:
                            continue
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        base = torch.cuda.memory_allocated()
                        entry["ms"] = _median_ms(torch, lambda: call(q, d), reps=options.reps)
                        entry["extra_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
                        entry["qps"] = num_queries / entry["ms"] * 1e3
                        print(f"| {num_docs} | {num_queries} | {k} | {name} | {entry['ms']:.3f} | {entry['qps']:.0f} | "
                              f"{entry['extra_mb']:.0f} |", flush=True)
                    except Exception as error:  # noqa: BLE001 - a failure is a result
                        entry["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                        print(f"| {num_docs} | {num_queries} | {k} | {name} | {entry['error'][:80]} | | |", flush=True)
                        torch.cuda.synchronize()
                    rows.append(entry)
                    stem.with_suffix(".json").write_text(json.dumps(
                        {"provenance": meta, "ceilings": ceilings, "options": vars(options), "results": rows}, indent=1))
            del q
        del d
        torch.cuda.empty_cache()
    print(f"wrote {stem.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
