"""The cliff sweep: every dtype x embedding dim x {one query, 32 queries} against a corpus of
about the same bytes, cupy_maxsim beside flash-maxsim, late-interaction-kernels and naive
PyTorch in one process, each cell read against its floor from ceilings measured in this run.

A cliff is a cell far below its floor or slower than a peer: before issue 24, fp32 and dims
past 256 (or not a multiple of 8) fell to the CUDA-core kernel, 50-300x slower than the peers.
Floor of a cell: max(bytes of q + d + scores at the copy rate, FLOPs at the matrix rate of
its dtype: bf16 for fp16/bf16, TF32 for fp32 (one TF32 pass: what fp32 inputs could cost at
the least), int8 for int8). Writes cliffs-<date>-<commit>.json and a heatmap PNG of fraction of
floor and of speed-up over the best peer per cell.

    python bench/cliffs.py [--dtypes float16,float32] [--dims 64,128,2560] [--queries 1,32]
                           [--corpus-gb 4] [--doc-length 300] [--shift ELEMENTS] [--out DIR]
    python bench/cliffs.py --merge RUN.json [RUN.json ...] [--out DIR]
    python -m cupy_maxsim bench --cliffs [same options]

Each run ends with the cells below issue 24's acceptance lines (below_lines); ``--merge`` joins
runs made in several device calls (a later run's cell replaces an earlier one's) into one JSON,
heatmap and list, measuring nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import _median_ms, measure_ceilings, provenance  # noqa: E402

DTYPES = ("float16", "bfloat16", "float32", "int8")
DIMS = (48, 64, 96, 100, 128, 256, 320, 768, 1024, 2560, 4096)
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1}
QUERY_LENGTH = 32
NAIVE_LIMIT_BYTES = 24 * 2**30  # naive torch skips cells whose similarity tensor is larger


def tf32_tflops(torch) -> float:
    """The TF32 matrix rate, measured now (fp32 operands, TF32 tensor cores)."""
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        ms = _median_ms(torch, lambda: a @ b, reps=20)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2 * 8192**3 / ms / 1e9


def unit(torch, shape, seed, dtype):
    """Unit-norm random rows of ``dtype`` (int8: fp16 rows, quantised by the caller), made in
    chunks so that a float32 temporary never holds the whole corpus."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    store = torch.float16 if dtype == "int8" else getattr(torch, dtype)
    out = torch.empty(shape, dtype=store, device="cuda")
    flat = out.view(-1, shape[-1])
    step = max(1, 2**28 // shape[-1])
    for start in range(0, flat.shape[0], step):
        rows = torch.randn(min(step, flat.shape[0] - start), shape[-1], device="cuda", generator=generator)
        flat[start:start + step] = torch.nn.functional.normalize(rows, dim=-1).to(store)
    return out


def shifted(torch, x, elements):
    """``x``'s values in a tensor whose data starts ``elements`` elements past an allocation's
    start: every row start off its alignment (0: ``x`` itself)."""
    if not elements:
        return x
    buffer = torch.empty(x.numel() + elements, dtype=x.dtype, device=x.device)
    view = buffer[elements:].view(x.shape)
    view.copy_(x)
    return view


def cell_providers(torch, dtype, shift=0):
    """name -> call(q, d) for one cell's inputs (int8: fp16 q and d, quantised once, untimed,
    for each provider that takes int8). A call returns None where the provider has no path."""
    import cupy_maxsim as cm

    found, notes, prepared = {}, {}, {}

    def once(key, make):
        if key not in prepared:
            prepared[key] = make()
        return prepared[key]

    if dtype == "int8":
        def ours(q, d):
            qv, qs, dv, ds = once("ours", lambda: (*cm.quantize_int8(q), *cm.quantize_int8(d)))
            qv, dv = once("ours shifted", lambda: (shifted(torch, qv, shift), shifted(torch, dv, shift)))
            return cm.score(qv, dv, q_scale=qs, d_scale=ds)
    else:
        def ours(q, d):
            return cm.score(q, d)
    found["cupy_maxsim"] = ours

    def naive(q, d):
        if dtype == "int8":
            return None
        return torch.einsum("qid,njd->qnij", q, d).amax(-1).float().sum(-1)

    found["naive_torch"] = naive
    try:
        import flash_maxsim as fm

        def flash(q, d):
            if dtype == "int8":
                if q.shape[0] != 1:
                    return None  # flash_maxsim_int8x8 takes one query
                qv, qs, dv, ds = once("flash", lambda: (*fm.quantize_query_int8(q[0]), *fm.quantize_int8_symmetric(d)))
                return fm.flash_maxsim_int8x8(q[0], dv, ds.reshape(ds.shape[0], -1), Q_int8=qv, q_scales=qs)
            return fm.flash_maxsim(q[0], d) if q.shape[0] == 1 else fm.flash_maxsim_batched(q, d)

        found["flash_maxsim_0.3.0"] = flash
    except Exception as error:  # noqa: BLE001 - any import failure means "not measured"
        notes["flash_maxsim_0.3.0"] = f"not importable: {error}"
    try:
        import late_interaction_kernels as lik

        def lik_fn(q, d):
            if dtype == "int8" or d.numel() > 2**31:
                return None  # its index arithmetic overflows past 2^31 elements (ANCHORS.md)
            return lik.maxsim(q, d)

        found["late_interaction_kernels_0.4.5"] = lik_fn
    except Exception as error:  # noqa: BLE001
        notes["late_interaction_kernels_0.4.5"] = f"not importable: {error}"
    return found, notes


def measure_cell(torch, dtype, dim, nq, options, ceilings):
    itemsize = ITEMSIZE[dtype]
    ld = options.doc_length
    nd = max(1, int(options.corpus_gb * 1e9 // (ld * dim * itemsize)))
    q = unit(torch, (nq, QUERY_LENGTH, dim), 1, dtype)
    d = unit(torch, (nd, ld, dim), 2, dtype)
    if dtype != "int8":  # (int8: its quantised rows are shifted, cell_providers)
        q, d = shifted(torch, q, options.shift), shifted(torch, d, options.shift)
    # int8: twice the measured bf16 rate (Hopper's int8 tensor rate; torch._int_mm reaches far
    # less, which would make an int8 floor meaningless: bench_forward.py says the same).
    rate = {"float32": ceilings["tf32_tflops"], "int8": 2 * ceilings["bf16_tflops"]}.get(dtype, ceilings["bf16_tflops"])
    bytes_moved = itemsize * (q.numel() + d.numel()) + 4 * nq * nd
    flops = 2 * nq * QUERY_LENGTH * nd * ld * dim
    bytes_ms, flops_ms = bytes_moved / ceilings["copy_tbps"] / 1e9, flops / rate / 1e9
    row = {"dtype": dtype, "dim": dim, "nq": nq, "lq": QUERY_LENGTH, "nd": nd, "ld": ld,
           "bytes_floor_ms": bytes_ms, "flops_floor_ms": flops_ms, "floor_ms": max(bytes_ms, flops_ms),
           "bound": "bytes" if bytes_ms >= flops_ms else "flops", "providers": {}}
    found, notes = cell_providers(torch, dtype, options.shift)
    if options.ours_only:
        found = {"cupy_maxsim": found["cupy_maxsim"]}
    reference = None
    for name, fn in found.items():
        entry = {}
        if name == "naive_torch" and 4 * nq * QUERY_LENGTH * nd * ld > NAIVE_LIMIT_BYTES:
            row["providers"][name] = {"skipped": "similarity tensor does not fit"}
            continue
        try:
            out = fn(q, d)
            if out is None:
                row["providers"][name] = {"skipped": "no such path"}
                continue
            scores = torch.as_tensor(out, device="cuda").reshape(-1).double()
            reference = scores if reference is None else reference
            ms = _median_ms(torch, lambda: fn(q, d), reps=options.reps)
            entry.update(ms=ms, fraction_of_floor=row["floor_ms"] / ms,
                         max_abs_diff_vs_cupy_maxsim=float((scores - reference).abs().max()))
        except Exception as error:  # noqa: BLE001 - a crash is a result
            entry["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            torch.cuda.synchronize()
        row["providers"][name] = entry
    ours = row["providers"]["cupy_maxsim"].get("ms")
    peers = {k: v["ms"] for k, v in row["providers"].items() if k != "cupy_maxsim" and "ms" in v}
    if ours and peers:
        row["best_peer"] = min(peers, key=peers.get)
        row["speedup_vs_best_peer"] = peers[row["best_peer"]] / ours
    row["notes"] = notes
    del q, d, found
    torch.cuda.empty_cache()
    try:  # quantisation temporaries live in CuPy's pool
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass
    return row


def line(row) -> str:
    ours = row["providers"]["cupy_maxsim"]
    peer = row.get("best_peer", "-")
    peer_ms = row["providers"].get(peer, {}).get("ms")
    return (f"| {row['dtype']} | {row['dim']} | {row['nq']}x{row['lq']} vs {row['nd']}x{row['ld']} | "
            f"{ours.get('ms', float('nan')):.3f} | {row['floor_ms']:.3f} ({row['bound']}) | "
            f"{ours.get('fraction_of_floor', float('nan')):.2f} | {peer} {peer_ms if peer_ms is None else round(peer_ms, 3)} | "
            f"{row.get('speedup_vs_best_peer', float('nan')):.2f} |" + (f" {ours['error']}" if "error" in ours else ""))


#: Issue 24's acceptance lines: one query (memory-bound) at least this fraction of its floor;
#: 32 queries at dims of 128 and more at least this fraction of the matrix rate, by dtype.
MEMORY_LINE = 0.85
COMPUTE_LINES = {"float16": 0.60, "bfloat16": 0.60, "int8": 0.50}
COMPUTE_LINE_MIN_DIM = 128


def below_lines(results) -> list[str]:
    """The cells under issue 24's lines, one line each with the line it misses (``cell: why``):
    see :func:`misses_by_cell`."""
    return [f"{cell}: {why}" for cell, why in misses_by_cell(results)]


def misses_by_cell(results) -> list[tuple[str, str]]:
    """(cell, the line it misses) for each miss: a fraction of the floor under MEMORY_LINE (one
    query) or COMPUTE_LINES (many queries, dims of 128 and more), fp32 slower than half our
    bf16 speed on the same cell, a peer faster, no result; a cell can miss several. (Many
    queries below dim 128 are held to the max fold's instruction rate instead, which this run
    does not measure.)"""
    misses = []
    ours_ms = {(r["dtype"], r["dim"], r["nq"]): r["providers"]["cupy_maxsim"].get("ms") for r in results}
    for r in results:
        ours = r["providers"]["cupy_maxsim"]
        cell = f"{r['dtype']} dim {r['dim']} {r['nq']}q"
        if ours.get("ms") is None:
            misses.append((cell, f"no result ({ours.get('error', 'not measured')})"))
            continue
        fraction = ours["fraction_of_floor"]
        if r["nq"] == 1 and fraction < MEMORY_LINE:
            misses.append((cell, f"{fraction:.2f} of the floor (line {MEMORY_LINE})"))
        line_ = COMPUTE_LINES.get(r["dtype"])
        if r["nq"] > 1 and r["dim"] >= COMPUTE_LINE_MIN_DIM and line_ is not None and fraction < line_:
            misses.append((cell, f"{fraction:.2f} of the matrix rate (line {line_})"))
        bf16 = ours_ms.get(("bfloat16", r["dim"], r["nq"]))
        if r["dtype"] == "float32" and bf16 and ours["ms"] > 2 * bf16:
            misses.append((cell, f"{bf16 / ours['ms']:.2f} of our bf16 speed (line 0.5)"))
        if r.get("speedup_vs_best_peer", 1.0) < 1.0:
            misses.append((cell, f"{r['speedup_vs_best_peer']:.2f}x {r['best_peer']} "
                                 f"({ours['ms']:.3f} against {r['providers'][r['best_peer']]['ms']:.3f} ms)"))
    return misses


def report(results, stem: Path, meta: dict, ceilings: dict, options: dict) -> None:
    """The run's JSON (with its cells below the lines), heatmap and list of misses."""
    misses = below_lines(results)
    stem.with_suffix(".json").write_text(json.dumps(
        {"provenance": meta, "ceilings": ceilings, "options": options, "results": results, "below_lines": misses},
        indent=1))
    picture = heatmap(results, stem.with_suffix(".png"))
    cells = {cell for cell, _ in misses_by_cell(results)}  # (a cell can miss several lines: its floor and a peer)
    print(f"cells below the lines: {len(cells)} of {len(results)} ({len(misses)} lines missed)")
    for miss in misses:
        print(f"- {miss}")
    print(f"wrote {stem.with_suffix('.json')}" + (f" and {picture}" if picture else ""))


def merge(paths, out: Path) -> int:
    """Join the runs at ``paths`` (cliffs JSONs) into one, a later run's cell replacing an
    earlier one's; written beside them as cliffs-<date>-<commits>-merged."""
    cells, commits, ceilings = {}, [], {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        commit = run["provenance"].get("commit", "unknown")
        if commit not in commits:
            commits.append(commit)
        ceilings[str(path)] = run["ceilings"]
        for r in run["results"]:
            cells[(r["dtype"], r["dim"], r["nq"])] = dict(r, run=str(path))
    results = sorted(cells.values(), key=lambda r: (DTYPES.index(r["dtype"]), r["dim"], r["nq"]))
    for r in results:
        print(line(r))
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"cliffs-{datetime.date.today().isoformat()}-{'-'.join(commits)}-merged"
    report(results, stem, {"commits": commits, "runs": [str(p) for p in paths]}, ceilings, {"merge": True})
    return 0


def heatmap(results, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    dtypes = sorted({r["dtype"] for r in results}, key=DTYPES.index)
    dims = sorted({r["dim"] for r in results})
    queries = sorted({r["nq"] for r in results})
    fig, axes = plt.subplots(1, 2 * len(queries), figsize=(5 * 2 * len(queries), 0.6 * len(dtypes) + 2.5))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for i, (key, label) in enumerate((("fraction_of_floor", "fraction of floor"), ("speedup_vs_best_peer", "x best peer"))):
        for j, nq in enumerate(queries):
            ax = axes[i * len(queries) + j]
            grid = [[float("nan")] * len(dims) for _ in dtypes]
            for r in results:
                if r["nq"] == nq:
                    value = r["providers"]["cupy_maxsim"].get(key) if key == "fraction_of_floor" else r.get(key)
                    grid[dtypes.index(r["dtype"])][dims.index(r["dim"])] = value if value is not None else float("nan")
            image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1 if key == "fraction_of_floor" else 4, aspect="auto")
            for a, row in enumerate(grid):
                for b, value in enumerate(row):
                    ax.text(b, a, f"{value:.2f}", ha="center", va="center", color="w", fontsize=7)
            ax.set_xticks(range(len(dims)), [str(x) for x in dims], fontsize=7)
            ax.set_yticks(range(len(dtypes)), dtypes)
            ax.set_title(f"{label}, {nq} quer{'y' if nq == 1 else 'ies'}", fontsize=9)
            fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--dims", default=",".join(map(str, DIMS)))
    parser.add_argument("--queries", default="1,32")
    parser.add_argument("--corpus-gb", type=float, default=4.0, help="corpus bytes per cell, in GB (1e9)")
    parser.add_argument("--doc-length", type=int, default=300)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--shift", type=int, default=0,
                        help="start q's and d's rows this many elements past an allocation's start (misaligned rows)")
    parser.add_argument("--ours-only", action="store_true", help="cupy_maxsim alone (A/B of tunables)")
    parser.add_argument("--tunables", default="", help="tuning.override for cupy_maxsim, e.g. stream_ksteps=8,use_wgmma=0")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--merge", nargs="+", metavar="RUN.json", help="join earlier runs' JSONs; measures nothing")
    options = parser.parse_args(argv)
    if options.merge:
        return merge(options.merge, Path(options.out))
    import torch

    from cupy_maxsim import tuning

    changes = tuning.changes_from_text(item for item in options.tunables.split(",") if item)
    with tuning.override(**changes):
        return _sweep(torch, options)


def _sweep(torch, options) -> int:
    ceilings = measure_ceilings(torch)
    ceilings["tf32_tflops"] = tf32_tflops(torch)
    print(f"# ceilings: {json.dumps({k: round(v, 1) for k, v in ceilings.items()})}", flush=True)
    print("| dtype | dim | cell | ms | floor ms | fraction | best peer ms | x best peer |", flush=True)
    print("|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = provenance()
    tag = "-" + options.tunables.replace("=", "").replace(",", "-") if options.tunables else ""
    tag += f"-shift{options.shift}" if options.shift else ""
    stem = out / f"cliffs-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}{tag}"
    for dtype in options.dtypes.split(","):
        for dim in map(int, options.dims.split(",")):
            for nq in map(int, options.queries.split(",")):
                row = measure_cell(torch, dtype, dim, nq, options, ceilings)
                results.append(row)
                print(line(row), flush=True)
                # as it goes: a run cut at its limit keeps its cells
                stem.with_suffix(".json").write_text(json.dumps(
                    {"provenance": meta, "ceilings": ceilings, "options": vars(options), "results": results}, indent=1))
    report(results, stem, meta, ceilings, vars(options))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
