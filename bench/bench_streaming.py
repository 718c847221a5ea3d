"""Streamed search (issue 28): a host-resident Index searched through a GPU budget smaller than
the corpus, its effective rate (corpus bytes / search time) against the host-to-device copy
rate measured in the same run, for several query batches.

    python bench/bench_streaming.py [--corpus-gb 40] [--budget-gb 8] [--queries 1,32,256] [--out DIR]

Writes streaming-<date>-<commit>.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import provenance  # noqa: E402


def h2d_gbps(cupy, nbytes: int = 2**30) -> float:
    """Pinned host-to-device copy rate, GB/s (median of 5)."""
    host = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
    device = cupy.empty(nbytes, cupy.uint8)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        device.set(host)
        cupy.cuda.get_current_stream().synchronize()
        times.append(time.perf_counter() - start)
    return nbytes / float(np.median(times)) / 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus-gb", type=float, default=40.0)
    parser.add_argument("--budget-gb", type=float, default=8.0)
    parser.add_argument("--queries", default="1,32,256")
    parser.add_argument("--doc-length", type=int, default=128)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args(argv)
    import cupy

    import cupy_maxsim as cm

    tokens_per_doc, dim = options.doc_length, options.dim
    docs = int(options.corpus_gb * 1e9 // (tokens_per_doc * dim * 2))
    rng = np.random.default_rng(0)
    tokens = np.empty((docs * tokens_per_doc, dim), np.float16)
    # One random block of 4M rows, tiled with a different roll each time: drawing 40 GB of
    # normals takes minutes, and the rate measured does not depend on the values.
    block = rng.standard_normal((2**22, dim), np.float32).astype(np.float16)
    for start in range(0, tokens.shape[0], 2**22):
        rows = min(2**22, tokens.shape[0] - start)
        tokens[start:start + rows] = np.roll(block, start // 2**22 * 997, axis=0)[:rows]
    offsets = np.arange(docs + 1, dtype=np.int64) * tokens_per_doc
    index = cm.Index(dim, dtype="float16", device="host", gpu_budget_bytes=int(options.budget_gb * 1e9))
    index.add((tokens, offsets))
    rate = h2d_gbps(cupy)
    rows = []
    print(f"# host-to-device {rate:.1f} GB/s; corpus {tokens.nbytes / 1e9:.1f} GB, budget {options.budget_gb} GB")
    print("| queries | s | effective GB/s | fraction of h2d | segments |")
    for nq in map(int, options.queries.split(",")):
        q = cupy.asarray(rng.standard_normal((nq, 32, dim), np.float32).astype(np.float16))
        index.search(q, 10)  # warm: compile, pin
        cupy.cuda.get_current_stream().synchronize()
        start = time.perf_counter()
        index.search(q, 10)
        cupy.cuda.get_current_stream().synchronize()
        seconds = time.perf_counter() - start
        effective = tokens.nbytes / seconds / 1e9
        report = index.last_search
        rows.append(dict(queries=nq, seconds=seconds, effective_gbps=effective, h2d_gbps=rate,
                         segments=report.segments, buffer_bytes=report.buffer_bytes))
        print(f"| {nq} | {seconds:.3f} | {effective:.1f} | {effective / rate:.2f} | {report.segments} |", flush=True)
    meta = provenance()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"streaming-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}.json"
    path.write_text(json.dumps({"provenance": meta, "options": vars(options), "results": rows}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
