"""Exact search beside fast-plaid (PLAID: approximate) on one synthetic corpus, in one process
(issue 25's last line): 1M documents of 32-128 tokens (about 80M tokens of 128 dims drawn around
shared centres, unit norm, fp16), 1,000 queries of 32 tokens drawn the same way.

- fast-plaid 1.7 (nbits 4, its defaults otherwise): build seconds, one query's milliseconds,
  a batch of 1,000 queries' QPS, overlap@10 with the exact ranking;
- cupy_maxsim.Index fp16 (exact) and int8 with fp16 rescoring (host copy): the same, build
  seconds too; score_packed + torch.topk (the exact baseline of the issue's text).

Wall-clock times (fast-plaid answers Python lists, so each call ends synchronised); medians.

    python bench/bench_plaid.py [--docs 1000000] [--queries 1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import measure_ceilings, provenance  # noqa: E402


def clustered(torch, count, centres, spread, generator):
    """``count`` unit fp16 rows around random ``centres``, made in slices on the GPU."""
    out = torch.empty((count, centres.shape[1]), dtype=torch.float16, device="cuda")
    step = 1 << 22
    for s in range(0, count, step):
        n = min(step, count - s)
        picks = centres[torch.randint(0, centres.shape[0], (n,), device="cuda", generator=generator)]
        x = picks + spread * torch.randn(picks.shape, device="cuda", generator=generator) / picks.shape[1] ** 0.5
        out[s:s + n] = torch.nn.functional.normalize(x, dim=-1).half()
    return out


def wall_ms(torch, fn, reps):
    """Median wall-clock milliseconds of ``fn`` (synchronised after each call), and its last result."""
    times, result = [], None
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times)), result


def overlap(got, want):
    """Mean over queries of |got_i & want_i| / k (ids, -1 ignored)."""
    return float(np.mean([len(set(a[a >= 0]) & set(b[b >= 0])) / max(1, (b >= 0).sum()) for a, b in zip(got, want)]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--centres", type=int, default=4096)
    parser.add_argument("--spread", type=float, default=0.6)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args(argv)
    import torch

    import cupy_maxsim as cm

    meta, ceilings = provenance(), measure_ceilings(torch)
    report = {"provenance": meta, "ceilings": ceilings, "options": vars(options), "rows": []}
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"plaid-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}.json"
    g = torch.Generator(device="cuda").manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(options.centres, 128, device="cuda", generator=g), dim=-1)
    lengths = torch.randint(32, 129, (options.docs,), generator=torch.Generator().manual_seed(1))
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).cuda()
    tokens = clustered(torch, int(offsets[-1]), centres, options.spread, g)
    queries = clustered(torch, options.queries * 32, centres, options.spread, g).view(options.queries, 32, 128)
    report["corpus"] = {"documents": options.docs, "tokens": int(offsets[-1]), "bytes_fp16": tokens.nbytes}
    k = options.k
    rows = report["rows"]

    def record(name, **values):
        rows.append({"provider": name, **values})
        path.write_text(json.dumps(report, indent=1))
        print(name, {key: (round(v, 4) if isinstance(v, float) else v) for key, v in values.items()}, flush=True)

    # Exact: score_packed + torch.topk (the baseline), and the fp16 Index.
    ms_one, _ = wall_ms(torch, lambda: torch.topk(cm.score_packed(queries[:1], tokens, offsets), k, dim=-1), 10)
    ms_all, _ = wall_ms(torch, lambda: torch.topk(cm.score_packed(queries, tokens, offsets), k, dim=-1), 3)
    record("cupy_maxsim score_packed + torch.topk (exact)", one_query_ms=ms_one, batch_qps=options.queries / ms_all * 1e3)
    started = time.perf_counter()
    exact = cm.Index(128, dtype="float16", device="cuda")
    exact.add((tokens, offsets))
    torch.cuda.synchronize()
    build = time.perf_counter() - started
    ms_one, _ = wall_ms(torch, lambda: exact.search(queries[:1], k), 10)
    ms_all, (_, want) = wall_ms(torch, lambda: exact.search(queries, k), 3)
    want = want.cpu().numpy()
    record("cupy_maxsim.Index float16 (exact)", build_s=build, one_query_ms=ms_one,
           batch_qps=options.queries / ms_all * 1e3, overlap_at_k=overlap(want, want))
    del exact
    torch.cuda.empty_cache()

    # int8 with fp16 rescoring from the host copy.
    started = time.perf_counter()
    rescored = cm.Index(128, dtype="int8", device="cuda", rescore="float16")
    rescored.add((tokens, offsets))
    torch.cuda.synchronize()
    build = time.perf_counter() - started
    ms_one, _ = wall_ms(torch, lambda: rescored.search(queries[:1], k), 10)
    ms_all, (_, got) = wall_ms(torch, lambda: rescored.search(queries, k), 2)
    record("cupy_maxsim.Index int8 + fp16 rescoring", build_s=build, one_query_ms=ms_one,
           batch_qps=options.queries / ms_all * 1e3, overlap_at_k=overlap(got.cpu().numpy(), want))
    ms_one, _ = wall_ms(torch, lambda: rescored._search(queries[:1], k, None, None, None, False, 64 << 20), 10)
    record("cupy_maxsim.Index int8, no rescoring (its first stage)", one_query_ms=ms_one)
    del rescored
    torch.cuda.empty_cache()

    # fast-plaid.
    try:
        from fast_plaid import search as fps
    except Exception as error:  # noqa: BLE001 - not installed: said, not measured
        record("fast-plaid", error=f"{type(error).__name__}: {error}")
    else:
        folder = tempfile.mkdtemp(prefix="fast-plaid-")
        started = time.perf_counter()
        plaid = fps.FastPlaid(index=folder, device="cuda:0")
        docs = list(torch.split(tokens, lengths.tolist()))
        plaid.create(documents_embeddings=docs, nbits=4)
        torch.cuda.synchronize()
        build = time.perf_counter() - started
        del docs
        search = lambda q: plaid.search(queries_embeddings=q, top_k=k, show_progress=False)  # noqa: E731
        ms_one, _ = wall_ms(torch, lambda: search(queries[:1]), 10)
        ms_all, found = wall_ms(torch, lambda: search(queries), 3)
        got = np.full((options.queries, k), -1)
        for i, hits in enumerate(found):
            ids = [h[0] for h in hits][:k]
            got[i, :len(ids)] = ids
        record(f"fast-plaid {getattr(sys.modules.get('fast_plaid'), '__version__', '1.7')} nbits 4", build_s=build,
               one_query_ms=ms_one, batch_qps=options.queries / ms_all * 1e3, overlap_at_k=overlap(got, want))
    print(f"\n{meta['gpu']} | commit {meta.get('commit')} | {report['corpus']}\n")
    print("| provider | build s | one query ms | batch QPS | overlap@k |\n|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['provider']} | {row.get('build_s', '-')} | {row.get('one_query_ms', '-')} | "
              f"{row.get('batch_qps', '-')} | {row.get('overlap_at_k', '-')} |")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
