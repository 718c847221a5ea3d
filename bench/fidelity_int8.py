"""INT8 fidelity: how much does int8 x int8 scoring change a ranking?

Corpus with realistic structure: unit-norm token vectors drawn around a few hundred shared
centres (so near-ties occur), 10,000 documents; queries drawn the same way. Per query, the
top-10 / top-20 / top-100 overlap and the Spearman correlation of each scorer's scores with the
fp32 reference, averaged over queries (and the worst query's top-20 overlap):

- int8: documents quantised once with ``quantize_int8``, queries on the fly (cupy_maxsim);
- fp16 (ours): the same embeddings rounded to fp16, scored by cupy_maxsim (fp32 accumulation);
- naive fp16: similarities stored in fp16 before the max, as the naive PyTorch code does.

Runs on the GPU when CuPy sees one, else on the CPU backend (same semantics; the JSON names the
backend). The reference is float64 scoring of the fp32 embeddings.

    python bench/fidelity_int8.py --out bench/results/fidelity-int8-<date>.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import cupy_maxsim as cm  # noqa: E402


def clustered_tokens(rng, centres, count, spread):
    """Unit vectors around random centres: centre + spread * noise, normalised."""
    picks = centres[rng.integers(0, len(centres), size=count)]
    x = picks + spread * rng.standard_normal(picks.shape) / np.sqrt(picks.shape[1])
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_corpus(num_docs, doc_length, num_queries, query_length, dim, num_centres, spread, seed):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((num_centres, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    docs = clustered_tokens(rng, centres, num_docs * doc_length, spread).reshape(num_docs, doc_length, dim)
    queries = clustered_tokens(rng, centres, num_queries * query_length, spread).reshape(
        num_queries, query_length, dim)
    return queries, docs


def naive_fp16_scores(q, d, block=500):
    """Similarities rounded to fp16 before the max (the naive implementation's storage)."""
    q16, d16 = q.astype(np.float16).astype(np.float32), d.astype(np.float16).astype(np.float32)
    out = np.empty((q.shape[0], d.shape[0]), np.float32)
    for n0 in range(0, d.shape[0], block):
        block_docs = d16[n0:n0 + block]
        sims = q16.reshape(-1, q.shape[2]) @ block_docs.reshape(-1, d.shape[2]).T  # (Nq*Lq, nb*Ld)
        sims = sims.astype(np.float16).astype(np.float32).reshape(q.shape[0], q.shape[1], len(block_docs), d.shape[1])
        out[:, n0:n0 + block] = sims.max(axis=-1).sum(axis=1)
    return out


def ranks(x):
    order = np.argsort(x)
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    return r


def compare(scores, reference, ks=(10, 20, 100)):
    result = {f"top{k}_overlap": [] for k in ks}
    result["spearman"] = []
    for s, ref in zip(scores, reference):
        for k in ks:
            top = set(np.argsort(-s)[:k])
            top_ref = set(np.argsort(-ref)[:k])
            result[f"top{k}_overlap"].append(len(top & top_ref) / k)
        result["spearman"].append(float(np.corrcoef(ranks(s), ranks(ref))[0, 1]))
    summary = {key: float(np.mean(values)) for key, values in result.items()}
    summary["top20_overlap_worst_query"] = float(np.min(result["top20_overlap"]))
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--doc-length", type=int, default=128)
    parser.add_argument("--queries", type=int, default=32)
    parser.add_argument("--query-length", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--centres", type=int, default=300)
    parser.add_argument("--spread", type=float, default=0.6, help="noise around the centres (relative)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    q, d = make_corpus(args.docs, args.doc_length, args.queries, args.query_length, args.dim, args.centres,
                       args.spread, seed=0)
    try:
        import cupy

        gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy or no driver: the CPU backend
        gpu = False
    xp = cupy if gpu else np

    def as_host(x):
        return x.get() if hasattr(x, "get") else np.asarray(x)

    started = time.time()
    reference = as_host(cm.score(q.astype(np.float64), d.astype(np.float64)))  # float64 of the fp32 data
    d_values, d_scales = cm.quantize_int8(xp.asarray(d))
    scorers = {
        "int8 (cupy_maxsim)": as_host(cm.score(xp.asarray(q), d_values, d_scale=d_scales)),
        "fp16 (cupy_maxsim)": as_host(cm.score(xp.asarray(q.astype(np.float16)), xp.asarray(d.astype(np.float16)))),
        "naive fp16 (similarities stored in fp16)": naive_fp16_scores(q, d),
    }
    # An int8 Index rescoring a shortlist from its fp16 host copy, against fp16 exhaustive search
    # (issue 25: the same top-20).
    index = cm.Index(args.dim, dtype="int8", rescore="float16", device="cuda" if gpu else "cpu")
    index.add(xp.asarray(d))
    fp16_top = np.argsort(-scorers["fp16 (cupy_maxsim)"], axis=1, kind="stable")[:, :20]
    rescored = {}
    for shortlist in (20, 40, 80):
        ids = as_host(index.search(xp.asarray(q), 20, shortlist=shortlist)[1])
        overlap = [len(set(a) & set(b)) / 20 for a, b in zip(ids, fp16_top)]
        rescored[f"shortlist {shortlist}"] = {"top20_overlap_vs_fp16": float(np.mean(overlap)),
                                              "worst_query": float(np.min(overlap)),
                                              "same_order": float(np.mean([list(a) == list(b) for a, b in zip(ids, fp16_top)]))}
    import datetime
    import os
    import subprocess

    commit = os.environ.get("CUPY_MAXSIM_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).parent).stdout.strip()
        except OSError:
            commit = ""
    report = {
        "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"numpy": np.__version__, "cupy_maxsim": cm.__version__},
        "backend": "cupy_maxsim GPU kernels" if gpu else "cupy_maxsim CPU backend (NumPy)",
        "corpus": vars(args) | {"out": None},
        "seconds": time.time() - started,
        "results": {name: compare(s, reference) for name, s in scorers.items()},
        "int8_index_fp16_rescoring_vs_fp16_exhaustive": rescored,
    }
    if gpu:
        report["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"backend: {report['backend']}; {args.docs} docs x {args.doc_length} tokens, {args.queries} queries, "
          f"{args.centres} centres")
    print("| scorer | top-10 | top-20 | top-100 | Spearman | worst top-20 |")
    print("|---|---|---|---|---|---|")
    for name, r in report["results"].items():
        print(f"| {name} | {r['top10_overlap']:.4f} | {r['top20_overlap']:.4f} | {r['top100_overlap']:.4f} | "
              f"{r['spearman']:.5f} | {r['top20_overlap_worst_query']:.2f} |")
    for name, r in rescored.items():
        print(f"int8 Index, fp16 rescoring of a {name}: top-20 overlap with fp16 exhaustive "
              f"{r['top20_overlap_vs_fp16']:.4f} (worst query {r['worst_query']:.2f}, same order {r['same_order']:.2f})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
