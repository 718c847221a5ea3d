"""Forward MaxSim benchmark: cupy_maxsim against the peers, same process, same run.

Providers: cupy_maxsim (called with torch CUDA tensors, interop included), naive PyTorch fp16
(einsum, max, sum), naive CuPy, flash-maxsim 0.3.0 and late-interaction-kernels 0.4.5, each
skipped with a note when it is not importable or the shape is out of its reach. Per shape:
median time (CUDA events, after warm-up, the L2 flushed before each call as
triton.testing.do_bench does, the method of ../shared/ANCHORS.md; "ms_synced": each call waiting
for the last, its host path always in the time), the floor from ceilings measured in this run
(device copy bandwidth, bf16 matrix rate), the fraction of the floor reached, the speedup over
the best peer and the peak extra memory. Writes JSON with provenance and a PNG under
bench/results/ (or --out).

    python -m cupy_maxsim bench [--dtype float16] [--shapes rerank-1k,corpus-10k] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

SHAPES = {  # name: (Nq, Lq, Nd, Ld); dim 128
    "rerank-1k": (1, 32, 1_000, 300),
    "corpus-10k": (1, 32, 10_000, 300),
    "colpali-1q-10k": (1, 32, 10_000, 1030),
    "colpali-32q-10k": (32, 32, 10_000, 1030),
    "inbatch-128": (128, 32, 128, 300),
    "colbert-1q-1M": (1, 32, 1_000_000, 128),
    "colbert-256q-100k": (256, 32, 100_000, 128),
    "packed-ragged-100k": (1, 32, 100_000, 300),  # lengths uniform in [16, 300]; packed
}
#: --sweep: time against corpus size (ColBERT documents of 300 tokens), one query and 32.
SWEEP_SHAPES = {f"sweep-{nq}q-{nd // 1000}k": (nq, 32, nd, 300)
                for nq in (1, 32) for nd in (1_000, 3_000, 10_000, 30_000, 100_000)}
DIM = 128
NAIVE_LIMIT_BYTES = 24 * 2**30  # naive providers skip shapes whose similarity tensor is larger


def measure_ceilings(torch):
    """Device copy bandwidth (bytes read + written) and bf16 matrix rate, measured now."""
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    copy_ms = _median_ms(torch, lambda: y.copy_(x), reps=20)
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = _median_ms(torch, lambda: a @ b, reps=20)
    a8 = torch.randint(-127, 128, (8192, 8192), device="cuda", dtype=torch.int8)
    b8 = torch.randint(-127, 128, (8192, 8192), device="cuda", dtype=torch.int8)
    int8_ms = _median_ms(torch, lambda: torch._int_mm(a8, b8), reps=20)
    return {"copy_tbps": 2 * 2 * 2**30 / copy_ms / 1e9, "bf16_tflops": 2 * 8192**3 / mm_ms / 1e9,
            "int8_tops": 2 * 8192**3 / int8_ms / 1e9}


_flush_buffers: dict = {}


def _median_ms(torch, fn, reps=20, warmup=3, synced=False, times=None):
    """Median milliseconds of one call of ``fn`` between CUDA events.

    Default: as ``triton.testing.do_bench`` (how ANCHORS.md measured the peers): a 256 MB write
    flushes the L2 before each call, and the host does not wait between calls, so a call's host
    path overlaps that flush (a host path longer than the flush still shows). ``synced``: each
    call starts after the last one finished, its whole host path inside the events. ``times``: a
    list that gets every call's milliseconds."""
    for _ in range(warmup):
        fn()
    if synced:
        measured = []
        for _ in range(reps):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            measured.append(start.elapsed_time(stop))
        if times is not None:
            times.extend(measured)
        return float(np.median(measured))
    device = torch.cuda.current_device()
    if device not in _flush_buffers:
        _flush_buffers[device] = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    flush = _flush_buffers[device]
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, stop in events:
        flush.zero_()
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    measured = [start.elapsed_time(stop) for start, stop in events]
    if times is not None:
        times.extend(measured)
    return float(np.median(measured))


def _padded_comparison(torch, cm, q, packed, num_docs, doc_length):
    """The packed corpus padded to ``doc_length`` tokens per document (a mask marks the real
    ones), scored by us: the time a padded layout costs, beside the packed one."""
    tokens, offsets = packed
    lengths = offsets[1:] - offsets[:-1]
    doc_of_token = torch.repeat_interleave(torch.arange(num_docs, device="cuda"), lengths)
    row_of_token = torch.arange(tokens.shape[0], device="cuda") - offsets[doc_of_token]
    padded = torch.zeros(num_docs, doc_length, tokens.shape[1], dtype=tokens.dtype, device="cuda")
    padded[doc_of_token, row_of_token] = tokens
    mask = torch.arange(doc_length, device="cuda")[None, :] < lengths[:, None]
    del doc_of_token, row_of_token
    packed_ms = _median_ms(torch, lambda: cm.score_packed(q, tokens, offsets), reps=10)
    padded_ms = _median_ms(torch, lambda: cm.score(q, padded, d_mask=mask), reps=10)
    same = float((cm.score(q, padded, d_mask=mask) - cm.score_packed(q, tokens, offsets)).abs().max())
    return {"padded_ms": padded_ms, "packed_ms": packed_ms, "packed_over_padded": packed_ms / padded_ms,
            "max_abs_diff": same}


def _host_loop_us(torch, fn, calls=200):
    """End-to-end time per call of back-to-back calls (host path and kernel), in microseconds."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def providers(torch):
    import cupy_maxsim as cm

    found = {"cupy_maxsim": lambda q, d, packed: cm.score_packed(q, *packed) if packed else cm.score(q, d)}

    def naive_torch(q, d, packed):
        if packed:
            return None
        return torch.einsum("qid,njd->qnij", q, d).amax(-1).float().sum(-1)

    found["naive_torch_fp16"] = naive_torch
    try:
        import cupy

        def naive_cupy(q, d, packed):
            if packed or q.dtype != torch.float16:
                return None
            cq, cd = cupy.from_dlpack(q), cupy.from_dlpack(d)
            return cupy.einsum("qid,njd->qnij", cq, cd).max(-1).astype(cupy.float32).sum(-1)

        found["naive_cupy"] = naive_cupy
    except ImportError:
        pass
    notes = {}
    try:
        import flash_maxsim as fm

        def flash(q, d, packed):
            if packed:
                tokens, offsets = packed
                return fm.flash_maxsim_packed(q[0], tokens, offsets)
            return fm.flash_maxsim(q[0], d) if q.shape[0] == 1 else fm.flash_maxsim_batched(q, d)

        found["flash_maxsim_0.3.0"] = flash
    except Exception as error:  # noqa: BLE001 - any import failure means "not measured"
        notes["flash_maxsim_0.3.0"] = f"not importable: {error}"
    try:
        import late_interaction_kernels as lik

        def lik_fn(q, d, packed):
            if packed:
                tokens, offsets = packed
                return lik.maxsim_varlen(q, tokens, offsets) if hasattr(lik, "maxsim_varlen") else None
            return lik.maxsim(q, d)

        found["late_interaction_kernels_0.4.5"] = lik_fn
    except Exception as error:  # noqa: BLE001
        notes["late_interaction_kernels_0.4.5"] = f"not importable: {error}"
    return found, notes


def int8_providers(torch):
    """INT8 mode: our int8 x int8 kernel and our fp16 kernel on the same shapes, and
    flash-maxsim's int8x8 (one query only). Quantisation happens once per shape, untimed."""
    import cupy_maxsim as cm

    cache = {}

    def prepared(name, q, d, make):
        key = (name, id(q), id(d))
        if key not in cache:
            if not any(k[1:] == key[1:] for k in cache):  # a new shape: drop the last one's data
                cache.clear()
            cache[key] = make()
        return cache[key]

    def ours_int8(q, d, packed):
        if packed:
            tokens, offsets = packed
            qv, qs, tv, ts = prepared("ours", q, tokens, lambda: (*cm.quantize_int8(q), *cm.quantize_int8(tokens)))
            return cm.score_packed(qv, tv, offsets, q_scale=qs, d_scale=ts)
        qv, qs, dv, ds = prepared("ours", q, d, lambda: (*cm.quantize_int8(q), *cm.quantize_int8(d)))
        return cm.score(qv, dv, q_scale=qs, d_scale=ds)

    found = {"cupy_maxsim_int8": ours_int8,
             "cupy_maxsim_fp16": lambda q, d, packed: cm.score_packed(q, *packed) if packed else cm.score(q, d)}
    notes = {}
    try:
        import flash_maxsim as fm

        def flash_int8(q, d, packed):
            if packed or q.shape[0] != 1:
                return None  # flash_maxsim_int8x8 takes one query and padded documents
            qv, qs, dv, ds = prepared("flash", q, d, lambda: (*fm.quantize_query_int8(q[0]),
                                                            *fm.quantize_int8_symmetric(d)))
            return fm.flash_maxsim_int8x8(q[0], dv, ds.reshape(ds.shape[0], -1), Q_int8=qv, q_scales=qs)

        found["flash_maxsim_0.3.0_int8x8"] = flash_int8
    except Exception as error:  # noqa: BLE001
        notes["flash_maxsim_0.3.0_int8x8"] = f"not importable: {error}"
    return found, notes


def run(args):
    import torch

    import cupy_maxsim as cm

    ceilings = measure_ceilings(torch)
    found, notes = int8_providers(torch) if args.int8 else providers(torch)
    primary = "cupy_maxsim_int8" if args.int8 else "cupy_maxsim"
    if args.sweep:
        wanted = list(SWEEP_SHAPES)
    else:
        wanted = [s for s in args.shapes.split(",") if s] if args.shapes else list(SHAPES)
    dtype = getattr(torch, args.dtype)
    results = []
    for name in wanted:
        nq, lq, nd, ld = {**SHAPES, **SWEEP_SHAPES}[name]
        generator = torch.Generator(device="cuda").manual_seed(0)
        q = torch.nn.functional.normalize(torch.randn(nq, lq, DIM, device="cuda", generator=generator), dim=-1).to(dtype)
        packed = None
        if name.startswith("packed"):
            lengths = torch.randint(16, ld + 1, (nd,), device="cuda", generator=generator)
            offsets = torch.zeros(nd + 1, dtype=torch.int64, device="cuda")
            offsets[1:] = torch.cumsum(lengths, 0)
            tokens = torch.nn.functional.normalize(
                torch.randn(int(offsets[-1]), DIM, device="cuda", generator=generator), dim=-1).to(dtype)
            packed = (tokens, offsets)
            d = None
            real_tokens = int(offsets[-1])
        else:
            d = torch.nn.functional.normalize(torch.randn(nd, ld, DIM, device="cuda", generator=generator), dim=-1).to(dtype)
            real_tokens = nd * ld
        q_arg = q
        torch.cuda.empty_cache()  # release the float32 temporaries of the inputs for other allocators
        # int8 floor: half the fp16 bytes (ANCHORS.md), operations at twice the measured bf16
        # rate (Hopper's int8 tensor rate; torch._int_mm reaches only ~126 TOPS, which made the
        # int8 floor of one query compute-bound and its fractions meaningless before 2026-11-30).
        element_bytes, rate = (1, 2 * ceilings["bf16_tflops"]) if args.int8 else (2, ceilings["bf16_tflops"])
        bytes_moved = element_bytes * (nq * lq * DIM + real_tokens * DIM) + 4 * nq * nd
        flops = 2 * nq * lq * real_tokens * DIM
        floor_ms = max(bytes_moved / ceilings["copy_tbps"] / 1e9, flops / rate / 1e9)
        row = {"shape": name, "nq": nq, "lq": lq, "nd": nd, "ld": ld, "dim": DIM, "dtype": args.dtype,
               "real_tokens": real_tokens, "floor_ms": floor_ms, "providers": {}}
        reference_scores = None
        for provider, fn in found.items():
            entry = {}
            sims_bytes = 2 * nq * lq * nd * ld
            if provider.startswith("naive") and sims_bytes > NAIVE_LIMIT_BYTES:
                entry["skipped"] = f"similarity tensor would be {sims_bytes / 2**30:.0f} GiB"
                row["providers"][provider] = entry
                continue
            if provider.startswith("late_interaction") and nd * ld * DIM > 2**31:
                # Its index arithmetic overflows past 2^31 elements (an illegal memory access,
                # ANCHORS.md), which would poison this process's CUDA context.
                entry["skipped"] = "crashes past 2^31 elements (illegal memory access); not run"
                row["providers"][provider] = entry
                continue
            if provider == "naive_cupy" and nd * ld > 3_000_000:
                entry["skipped"] = "slow (einsum path); measured on small shapes only"
                row["providers"][provider] = entry
                continue
            try:
                call = (lambda: fn(q_arg, d, packed))
                out = call()
                if out is None:
                    entry["skipped"] = "no such path"
                    row["providers"][provider] = entry
                    continue
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                reps = args.reps if nd * ld < 5e7 else max(5, args.reps // 4)
                ms = _median_ms(torch, call, reps=reps)
                extra = torch.cuda.max_memory_allocated() - base
                entry["ms_synced"] = _median_ms(torch, call, reps=reps, synced=True)
                scores = torch.as_tensor(np.asarray(out.get() if hasattr(out, "get") else out.float().cpu()))
                scores = scores.reshape(-1).double()
                if reference_scores is None:
                    reference_scores = scores
                entry.update(ms=ms, fraction_of_floor=floor_ms / ms, extra_mb=extra / 2**20,
                             max_abs_diff_vs_cupy_maxsim=float((scores - reference_scores).abs().max()))
                if name == "rerank-1k" and not args.int8:
                    entry["end_to_end_us"] = _host_loop_us(torch, call)
            except Exception as error:  # noqa: BLE001 - a crash is a result
                entry["error"] = f"{type(error).__name__}: {str(error)[:200]}"
                torch.cuda.synchronize()
            row["providers"][provider] = entry
        if packed is not None and not args.int8:
            row["padded"] = _padded_comparison(torch, cm, q, packed, nd, ld)
        ours = row["providers"].get(primary, {}).get("ms")
        peers = [v["ms"] for k, v in row["providers"].items() if not k.startswith("cupy_maxsim") and "ms" in v]
        if ours and peers:
            row["speedup_vs_best_peer"] = min(peers) / ours
        results.append(row)
        del q, d, packed
        torch.cuda.empty_cache()
        try:  # CuPy-side temporaries (e.g. quantisation) live in CuPy's pool
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
        except ImportError:
            pass
        _print_row(row)
    return {"ceilings": ceilings, "notes": notes, "results": results, "primary": primary}


def _print_row(row):
    parts = []
    for provider, entry in row["providers"].items():
        if "ms" in entry:
            extra = f" e2e {entry['end_to_end_us']:.0f}us" if "end_to_end_us" in entry else ""
            parts.append(f"{provider} {entry['ms']:.3f}ms (synced {entry['ms_synced']:.3f}, "
                         f"{entry['fraction_of_floor']:.2f}, {entry['extra_mb']:.0f}MB){extra}")
        else:
            parts.append(f"{provider} -")
    print(f"{row['shape']}: floor {row['floor_ms']:.3f}ms | " + " | ".join(parts), flush=True)


def provenance():
    import cupy
    import torch

    # The device copy of the tree may carry a stale .git: the commit passed in wins, and a tree
    # that differs from the .git's HEAD is named so (session 51's cliffs JSON named a commit
    # before the one whose tree it ran).
    commit = os.environ.get("CUPY_MAXSIM_COMMIT", "")
    if not commit:
        here = Path(__file__).parent
        try:
            git = lambda *args: subprocess.run(["git", *args], capture_output=True, text=True, cwd=here)  # noqa: E731
            commit = git("rev-parse", "HEAD").stdout.strip()
            if commit and git("diff", "--quiet", "HEAD").returncode == 1:
                commit += "-changed"
        except OSError:
            commit = ""
    versions = {"python": platform.python_version(), "numpy": np.__version__, "cupy": cupy.__version__,
                "torch": torch.__version__}
    for name in ("triton", "flash_maxsim", "late_interaction_kernels", "jax"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            versions[name] = None
    return {"gpu": torch.cuda.get_device_name(), "versions": versions,
            "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def write_record(out: Path, stem: str, record: dict) -> Path:
    """``record`` after :func:`provenance`, as ``out/<stem>-<date>-<commit>.json``; its path."""
    record = {**provenance(), **record}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}-{datetime.date.today()}-{record['commit'] or 'unknown'}.json"
    path.write_text(json.dumps(record, indent=1))
    return path


def table(report) -> str:
    lines = [f"{'shape':<20} {'floor':>7} {'ours':>8} {'frac':>5} {'best peer':>10} {'speedup':>7} {'extra MB':>8}"]
    for row in report["results"]:
        ours = row["providers"].get(report["primary"], {})
        peers = {k: v["ms"] for k, v in row["providers"].items() if not k.startswith(("cupy_maxsim", "naive"))
                 and "ms" in v}
        best = min(peers.values()) if peers else float("nan")
        lines.append(f"{row['shape']:<20} {row['floor_ms']:7.3f} {ours.get('ms', float('nan')):8.3f} "
                     f"{ours.get('fraction_of_floor', float('nan')):5.2f} {best:10.3f} "
                     f"{best / ours['ms'] if 'ms' in ours else float('nan'):7.2f} {ours.get('extra_mb', float('nan')):8.1f}")
        if "padded" in row:
            padded = row["padded"]
            lines.append(f"  {row['shape']} padded to {row['ld']} (masked): {padded['padded_ms']:.3f} ms; packed / padded "
                         f"{padded['packed_over_padded']:.2f} (same scores within {padded['max_abs_diff']:.1e})")
    return "\n".join(lines)


def plot(report, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    figure, axes = plt.subplots(figsize=(9, 5))
    rows = [r for r in report["results"] if not r["shape"].startswith("packed")]
    names = [r["shape"] for r in rows]
    providers_seen = sorted({p for r in rows for p in r["providers"]})
    for provider in providers_seen + ["floor"]:
        values = [r["floor_ms"] if provider == "floor" else r["providers"][provider].get("ms", np.nan)
                  if provider in r["providers"] else np.nan for r in rows]
        axes.plot(names, values, marker="o", linestyle="--" if provider == "floor" else "-", label=provider)
    axes.set_yscale("log")
    axes.set_ylabel("median ms (log)")
    axes.set_title(f"MaxSim forward, {report['primary']}, {report['dtype']}, {report['gpu']}")
    axes.tick_params(axis="x", rotation=30)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def plot_sweep(report, path):
    """Time against corpus size, one panel for one query and one for 32, a line per provider."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = [r for r in report["results"] if r["shape"].startswith("sweep-")]
    if not rows:
        return
    figure, panels = plt.subplots(1, 2, figsize=(12, 5))
    for axes, nq in zip(panels, (1, 32)):
        mine = sorted((r for r in rows if r["nq"] == nq), key=lambda r: r["nd"])
        sizes = [r["nd"] for r in mine]
        for provider in sorted({p for r in mine for p in r["providers"]}) + ["floor"]:
            values = [r["floor_ms"] if provider == "floor" else r["providers"].get(provider, {}).get("ms", np.nan)
                      for r in mine]
            axes.plot(sizes, values, marker="o", linestyle="--" if provider == "floor" else "-", label=provider)
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("documents (300 tokens, dim 128)")
        axes.set_ylabel("median ms")
        axes.set_title(f"{nq} quer{'y' if nq == 1 else 'ies'} x 32 tokens")
        axes.legend(fontsize=7)
    figure.suptitle(f"MaxSim forward against corpus size, {report['dtype']}, {report['gpu']}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--shapes", default="")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--tag", default="", help="added to the result file names")
    parser.add_argument("--int8", action="store_true", help="int8 x int8 scoring against int8 peers and our fp16")
    parser.add_argument("--sweep", action="store_true", help="time against corpus size (1k-100k docs, 1 and 32 queries)")
    args = parser.parse_args(argv)
    report = {**provenance(), "dtype": args.dtype}
    report.update(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kind = "int8" if args.int8 else args.dtype
    stem = f"forward-{kind}-{report['date'][:10]}{'-' + args.tag if args.tag else ''}"
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    plot(report, out / f"{stem}.png")
    plot_sweep(report, out / f"{stem}-sweep.png")
    ceilings = report["ceilings"]
    print(f"ceilings: copy {ceilings['copy_tbps']:.2f} TB/s, bf16 {ceilings['bf16_tflops']:.0f} TFLOP/s, "
          f"int8 {ceilings['int8_tops']:.0f} TOPS")
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
