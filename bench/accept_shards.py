"""Issue 29's lines on a machine of several GPUs, every provider in one process:

  rate   the pinned host-to-device copy rate: each GPU alone, then every GPU at once
  int8   1M x 128 x 128 int8: one GPU's Index against a ShardedIndex over every GPU (and a
         RayIndex of one actor a GPU, with --ray): one query's latency, 256 queries' throughput
         (k=100), and whether the results equal the one GPU's, bitwise
  fp16   10k x 1030 x 128 fp16: the same
  large  a corpus larger than one GPU (default 8.8M x 70 x 128 fp16, 158 GB; fewer documents
         where the host's memory or the GPUs' together cannot hold it): sharded in GPU memory
         over every GPU, and kept in host memory (one copy, ``copy=None``) and streamed to
         every GPU at once; each GPU's effective rate (its shard's bytes / the search's time)
         against the copy rate of every GPU at once measured in the run

The lines (issue 29): sharded latency <= 1.15 x (one GPU's / GPUs) + the merge (the host merge of
the shards' top-k, timed alone); 256-query throughput >= 0.9 x GPUs x one GPU's; results
identical. A device call has 10 minutes: take rate,int8,fp16 in one and rate,large in another.

    python bench/accept_shards.py [--parts rate,int8,fp16,large] [--ray] [--large-docs 8800000] [--out DIR]

Writes accept-shards-<date>-<commit>.json (each part's rows as they finish) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import provenance  # noqa: E402

K = 100
DIM = 128


def sync_all(cupy, gpus: int) -> None:
    for gpu in range(gpus):
        with cupy.cuda.Device(gpu):
            cupy.cuda.Device().synchronize()


def timed(cupy, gpus: int, fn, reps: int):
    """(median ms of ``reps`` calls after a warm one, each between synchronisations of every GPU;
    the last call's results as host arrays)."""
    result = fn()
    times = []
    for _ in range(reps):
        sync_all(cupy, gpus)
        start = time.perf_counter()
        result = fn()
        sync_all(cupy, gpus)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times)), [x.get() if hasattr(x, "get") else np.asarray(x) for x in result]


def unit_rows(torch, gpu: int, rows: int, seed: int):
    """Unit-norm fp16 rows (rows, DIM) made on GPU ``gpu`` by torch (CuPy's generator ended in an
    illegal address filling 33 GB on the H200, 2026-12-02), as a CuPy array through DLPack."""
    import cupy

    with torch.cuda.device(gpu):
        generator = torch.Generator(device=f"cuda:{gpu}").manual_seed(seed)
        out = torch.empty((rows, DIM), dtype=torch.float16, device=f"cuda:{gpu}")
        step = 2**22
        for start in range(0, rows, step):
            part = torch.randn(min(step, rows - start), DIM, device=f"cuda:{gpu}", generator=generator)
            out[start:start + step] = torch.nn.functional.normalize(part, dim=-1).half()
    with cupy.cuda.Device(gpu):
        return cupy.from_dlpack(out)


def copy_rates(cupy, gpus: int, nbytes: int = 2**31) -> dict:
    """Pinned host-to-device GB/s: each GPU alone (median of 5), and every GPU at once (each
    GPU's rate while all copy: the slowest one's bytes over the common time)."""
    buffers = []
    for gpu in range(gpus):
        with cupy.cuda.Device(gpu):
            host = np.frombuffer(cupy.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
            host[::4096] = 1  # (touched: resident before the clock)
            buffers.append((host, cupy.empty(nbytes, cupy.uint8)))

    def copy(gpu):
        with cupy.cuda.Device(gpu):
            host, device = buffers[gpu]
            device.set(host)
            cupy.cuda.get_current_stream().synchronize()

    alone = []
    for gpu in range(gpus):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            copy(gpu)
            times.append(time.perf_counter() - start)
        alone.append(nbytes / float(np.median(times)) / 1e9)
    together = []
    with ThreadPoolExecutor(max_workers=gpus) as pool:
        for _ in range(3):
            start = time.perf_counter()
            list(pool.map(copy, range(gpus)))
            together.append(nbytes / (time.perf_counter() - start) / 1e9)
    del buffers
    return {"alone_gbps": alone, "at_once_gbps_each": float(np.median(together)), "bytes": nbytes}


def merge_ms(shards, k: int, results) -> float:
    """The host merge of ``shards`` shards' top-k lists alone (each shard's list the one GPU's,
    a worst case of equal scores), median of 50."""
    import cupy_maxsim.shards as sharding

    parts = [tuple(results)] * shards
    times = []
    for _ in range(50):
        start = time.perf_counter()
        sharding.merge_top_k(parts, k)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def compare(cupy, gpus, name, providers, queries, report):
    """Each provider's latency (1 query) and throughput (256) against the first's, the lines."""
    rows = []
    base = None
    for label, index in providers:
        lat, got1 = timed(cupy, gpus, lambda index=index: index.search(queries[1], K), 20)
        batch, got256 = timed(cupy, gpus, lambda index=index: index.search(queries[256], K), 3)
        row = {"corpus": name, "provider": label, "gpus": 1 if base is None else gpus, "ms_1q": lat,
               "ms_256q": batch, "qps_256": 256e3 / batch}
        if base is None:
            base = (lat, batch, got1, got256)
            row["merge_ms"] = merge_ms(gpus, K, got1)
        else:
            merge = rows[0]["merge_ms"]
            row["identical"] = all(np.array_equal(a, b) for a, b in zip(got1 + got256, base[2] + base[3]))
            row["latency_line_ms"] = 1.15 * base[0] / gpus + merge
            row["latency_holds"] = lat <= row["latency_line_ms"]
            row["throughput_over_linear"] = (base[1] / batch) / gpus
            row["throughput_holds"] = row["throughput_over_linear"] >= 0.9
        rows.append(row)
        report["rows"].append(row)
        print(f"| {name} | {label} | {lat:.3f} | {batch:.1f} | {row['qps_256']:.0f} | "
              f"{row.get('latency_line_ms', float('nan')):.3f} | {row.get('throughput_over_linear', float('nan')):.3f} | "
              f"{row.get('identical', '-')} |", flush=True)
    return rows


def corpus_part(cupy, torch, cm, gpus, name, docs, length, dtype, pieces, options, report):
    """One GPU's Index, a ShardedIndex over every GPU (and a RayIndex), built from the same
    pieces (made on GPU 0 by seed), compared."""
    single = cm.Index(DIM, dtype=dtype, device="cuda:0")
    sharded = cm.ShardedIndex(DIM, dtype=dtype, devices=list(range(gpus)))
    remote = None
    if options.ray:
        import cupy_maxsim.ray as cmr

        remote = cmr.RayIndex(DIM, dtype=dtype, actors=gpus, num_gpus=1, timeout=1200)
    built = time.perf_counter()
    per_piece = -(-docs // pieces)
    for piece, start in enumerate(range(0, docs, per_piece)):
        count = min(per_piece, docs - start)
        d = unit_rows(torch, 0, count * length, 1000 + piece).reshape(count, length, DIM)
        single.add(d)
        sharded.add(d)
        if remote is not None:
            remote.add(d)
        del d
        cupy.get_default_memory_pool().free_all_blocks()
    report.setdefault("build_s", {})[name] = time.perf_counter() - built
    queries = {n: unit_rows(torch, 0, n * 32, 7 + n).reshape(n, 32, DIM) for n in (1, 256)}
    providers = [("one GPU", single), (f"ShardedIndex x{gpus}", sharded)]
    if remote is not None:
        providers.append((f"RayIndex x{gpus}", remote))
    compare(cupy, gpus, name, providers, queries, report)
    del single, sharded, remote
    for gpu in range(gpus):
        with cupy.cuda.Device(gpu):
            cupy.get_default_memory_pool().free_all_blocks()


def large_part(cupy, torch, cm, gpus, options, report, rates):
    """A corpus larger than one GPU: in GPU memory over every GPU, then on the host streamed to
    every GPU at once."""
    length = 70
    row_bytes = DIM * 2
    gpu_bytes = [cupy.cuda.Device(g).mem_info[1] for g in range(gpus)]
    host_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    # Held at once: the host corpus (kept by the host shards), and each GPU's shard (with its
    # search's workspace): fewer documents where either does not fit.
    fits = min(int(0.8 * host_bytes), int(0.85 * sum(gpu_bytes))) // (length * row_bytes)
    docs = min(options.large_docs, fits)
    corpus_bytes = docs * length * row_bytes
    print(f"# large: {docs:,} x {length} x {DIM} fp16 = {corpus_bytes / 1e9:.1f} GB (asked {options.large_docs:,}); "
          f"one GPU {gpu_bytes[0] / 1e9:.1f} GB, host {host_bytes / 1e9:.0f} GB", flush=True)
    entry = {"corpus": "large", "docs": docs, "tokens_per_doc": length, "bytes": corpus_bytes,
             "larger_than_one_gpu": corpus_bytes > gpu_bytes[0]}
    report["large"] = entry
    made = time.perf_counter()
    tokens = np.empty((docs * length, DIM), np.float16)
    chunk = 2**24

    def fill(job):
        n, start = job
        gpu = n % gpus
        rows = min(chunk, tokens.shape[0] - start)
        part = unit_rows(torch, gpu, rows, 5000 + n)
        with cupy.cuda.Device(gpu):
            part.get(out=tokens[start:start + rows])
            del part
            cupy.get_default_memory_pool().free_all_blocks()

    with ThreadPoolExecutor(max_workers=gpus) as pool:
        list(pool.map(fill, enumerate(range(0, tokens.shape[0], chunk))))
    offsets = np.arange(docs + 1, dtype=np.int64) * length
    entry["made_s"] = time.perf_counter() - made
    queries = {n: unit_rows(torch, 0, n * 32, 7 + n).reshape(n, 32, DIM) for n in (1, 256)}
    per_gpu = corpus_bytes / gpus
    results = {}
    for store in ("device", "host"):
        built = time.perf_counter()
        index = cm.ShardedIndex(DIM, dtype="float16", devices=list(range(gpus)), store=store,
                                gpu_budget_bytes=options.budget_gb * 2**30)
        index.add((tokens, offsets), copy=None)
        entry[f"{store}_build_s"] = time.perf_counter() - built
        warm = time.perf_counter()
        index.search(queries[1], K)  # (compiles; a host store's first search registers its pages)
        sync_all(cupy, gpus)
        entry[f"{store}_first_search_s"] = time.perf_counter() - warm
        for n, reps in ((1, 3), (256, 2)):
            ms, got = timed(cupy, gpus, lambda n=n: index.search(queries[n], K), reps)
            rate = per_gpu / (ms / 1e3) / 1e9
            results[(store, n)] = got
            row = {"corpus": "large", "store": store, "queries": n, "ms": ms, "gb_per_gpu": per_gpu / 1e9,
                   "effective_gbps_per_gpu": rate}
            if store == "host":
                row["h2d_gbps_each_at_once"] = rates.get("at_once_gbps_each")
                row["fraction_of_h2d"] = rate / rates["at_once_gbps_each"] if rates else None
                row["identical_to_device"] = all(np.array_equal(a, b) for a, b in zip(got, results[("device", n)]))
                row["segments"] = [shard.last_search.segments for shard in index.shards]
            report["rows"].append(row)
            print(f"| large {store} | {n} | {ms:.1f} | {rate:.1f} | {row.get('fraction_of_h2d') or float('nan'):.2f} | "
                  f"{row.get('identical_to_device', '-')} |", flush=True)
        del index
        for gpu in range(gpus):
            with cupy.cuda.Device(gpu):
                cupy.get_default_memory_pool().free_all_blocks()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="rate,int8,fp16")
    parser.add_argument("--ray", action="store_true", help="also a RayIndex of one actor a GPU")
    parser.add_argument("--large-docs", type=int, default=8_800_000)
    parser.add_argument("--budget-gb", type=int, default=8, help="each host shard's GPU budget")
    parser.add_argument("--int8-docs", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args(argv)
    parts = options.parts.split(",")
    import cupy
    import torch

    import cupy_maxsim as cm

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # (multicast stays off: KINDS.md)
    gpus = cupy.cuda.runtime.getDeviceCount()
    meta = provenance()
    report = {"provenance": meta, "options": vars(options), "gpus": gpus, "k": K, "rows": []}
    path = Path(options.out) / f"accept-shards-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if options.ray:
        import ray

        ray.init(num_gpus=gpus, include_dashboard=False, log_to_driver=False)
        report["provenance"]["versions"]["ray"] = ray.__version__
    rates = {}
    if "rate" in parts:
        rates = report["copy_rates"] = copy_rates(cupy, gpus)
        print(f"# host-to-device GB/s: alone {', '.join(f'{r:.1f}' for r in rates['alone_gbps'])}; "
              f"every GPU at once {rates['at_once_gbps_each']:.1f} each", flush=True)
    print(f"# {gpus} GPUs, k={K}\n| corpus | provider | 1 query ms | 256 queries ms | QPS | latency line ms | "
          "throughput / linear | identical |\n|---|---|---|---|---|---|---|---|", flush=True)
    if "int8" in parts:
        corpus_part(cupy, torch, cm, gpus, f"{options.int8_docs:,} x 128 int8", options.int8_docs, 128, "int8", 8,
                    options, report)
        path.write_text(json.dumps(report, indent=1))
    if "fp16" in parts:
        corpus_part(cupy, torch, cm, gpus, "10k x 1030 fp16", 10_000, 1030, "float16", 1, options, report)
        path.write_text(json.dumps(report, indent=1))
    if "large" in parts:
        print("| large store | queries | ms | GB/s a GPU | of h2d at once | identical |\n|---|---|---|---|---|---|")
        large_part(cupy, torch, cm, gpus, options, report, rates)
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
