"""One query against a big corpus under several sets of tunables (each a variant), beside
flash-maxsim, in one process, round-robin, each timing bench_forward._median_ms (L2 flushed
before each call); every variant's scores must equal the first's bit for bit (exit status 1
otherwise). The cells are memory-bound: a variant is read against the others and flash-maxsim,
which reads 4 GB at about 4.5 TB/s where our copy-rate floor says 4.27
(bench/results/cliffs-2026-12-04-112bace-merged.txt).

    python bench/ab_tunables.py --variant base: --variant nopromo:tma_l2_promotion=0 [--cells a,b] [--rounds 3]

(bench/results/ab-doc-order-2026-12-04-9ac014a.txt was its first use, as ab_doc_order.py on the
interleave-docs branch: documents in ranges against interleaved over the grid.)
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_forward import _median_ms, provenance  # noqa: E402
from cliffs import unit  # noqa: E402

import cupy_maxsim as cm  # noqa: E402
from cupy_maxsim import tuning  # noqa: E402

#: (name, dtype, dim, documents, tokens a document, packed lengths: None, "fixed" or "ragged")
CELLS = (
    ("fp16-128-4GB", "float16", 128, 52083, 300, None),
    ("fp16-64-4GB", "float16", 64, 104166, 300, None),
    ("bf16-256-4GB", "bfloat16", 256, 26041, 300, None),
    ("fp16-2560-4GB", "float16", 2560, 2604, 300, None),
    ("int8-128-4GB", "int8", 128, 104166, 300, None),
    ("int8-packed-500kx128", "int8", 128, 500_000, 128, "fixed"),
    ("int8-packed-ragged-200k", "int8", 128, 200_000, 128, "ragged"),
    ("fp16-packed-ragged-200k", "float16", 128, 200_000, 128, "ragged"),
)
#: Short dtype names of the cells, beside --cells' DTYPE-DIM-4GB form (any dtype and dim: 4 GB of
#: 300-token documents, as bench/cliffs.py's one-query cells).
DTYPES = {"fp16": ("float16", 2), "bf16": ("bfloat16", 2), "fp32": ("float32", 4), "int8": ("int8", 1)}


def cells(names: list[str]) -> list[tuple]:
    """The CELLS rows of ``names``, in their order; a name not in CELLS of the DTYPE-DIM-4GB form
    is 4 GB of 300-token padded documents (ValueError for any other)."""
    known = {cell[0]: cell for cell in CELLS}
    rows = []
    for name in names:
        if name in known:
            rows.append(known[name])
            continue
        parts = name.split("-")
        if len(parts) != 3 or parts[0] not in DTYPES or not parts[1].isdigit() or parts[2] != "4GB":
            raise ValueError(f"unknown cell {name!r}: one of {sorted(known)} or DTYPE-DIM-4GB (DTYPE in {sorted(DTYPES)})")
        dtype, itemsize = DTYPES[parts[0]]
        dim = int(parts[1])
        rows.append((name, dtype, dim, round(4e9 / (300 * dim * itemsize)), 300, None))
    return rows


def corpus(dtype, dim, docs, length, packed, seed):
    """(q, d, extra keyword arguments, offsets or None, bytes read) of one cell: unit rows as
    bench/cliffs.py makes them (int8: quantised here)."""
    d = unit(torch, (docs, length, dim), seed, dtype)
    q = unit(torch, (1, 32, dim), seed + 1, dtype)
    offsets = None
    if packed:
        generator = torch.Generator(device="cuda").manual_seed(seed + 2)
        lengths = (torch.full((docs,), length, device="cuda") if packed == "fixed"
                   else torch.randint(16, length + 1, (docs,), device="cuda", generator=generator))
        offsets = torch.zeros(docs + 1, dtype=torch.int64, device="cuda")
        offsets[1:] = torch.cumsum(lengths, 0)
        d = d.view(-1, dim)[:int(offsets[-1])].contiguous()
    extra = {}
    if dtype == "int8":
        (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
        extra = dict(q_scale=q_scale, d_scale=d_scale)
    read = d.numel() * d.element_size() + (extra["d_scale"].numel() * 4 if extra else 0)
    return q, d, extra, offsets, read


def _host_timed(call, spent: list):
    """``call``, appending each call's host seconds to ``spent``: a call whose host time nears
    its kernel's waited for the GPU (a synchronisation in its path), which event timings with
    the host running ahead (_median_ms) then read as GPU time."""
    def timed():
        start = time.perf_counter()
        result = call()
        spent.append(time.perf_counter() - start)
        return result
    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", action="append", required=True, metavar="NAME:KEY=VALUE,...",
                        help="a set of tuning.override changes (none after the colon: the defaults)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", default=",".join(cell[0] for cell in CELLS),
                        help="names from CELLS, or DTYPE-DIM-4GB (fp16, bf16, fp32, int8)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    options = parser.parse_args()
    try:
        import flash_maxsim
    except ImportError:
        flash_maxsim = None
    tunables = {}
    for text in options.variant:
        name, _, changes = text.partition(":")
        tunables[name] = tuning.changes_from_text(item for item in changes.split(",") if item)
    rows = []
    names = list(tunables) + (["flash_maxsim"] if flash_maxsim is not None else [])
    print("| cell | GB | " + " | ".join(f"{name} ms" for name in names) + " | "
          + " | ".join(f"{name} TB/s" for name in tunables) + " |")
    print("|---|---|" + "---|" * (len(names) + len(tunables)))
    for name, dtype, dim, docs, length, packed in cells(options.cells.split(",")):
        q, d, extra, offsets, read = corpus(dtype, dim, docs, length, packed, seed=3 * len(rows))

        def ours(changes):
            def call():
                with tuning.override(**changes):
                    if offsets is None:
                        return cm.score(q, d, **extra)
                    return cm.score_packed(q, d, offsets, **extra)
            return call

        variants = {name: ours(changes) for name, changes in tunables.items()}
        if flash_maxsim is not None and dtype != "int8" and offsets is None:
            variants["flash_maxsim"] = lambda: flash_maxsim.flash_maxsim(q[0], d)
        scores = [variants[name]() for name in tunables]
        identical = all(bool(torch.equal(scores[0], other)) for other in scores[1:])
        times = {key: [] for key in variants}
        host_us = {key: [] for key in variants}  # each round's median host time a call
        for _ in range(options.rounds):
            for key, call in variants.items():
                spent = []
                times[key].append(_median_ms(torch, _host_timed(call, spent), reps=20))
                host_us[key].append(1e6 * statistics.median(spent))
        median = {key: statistics.median(values) for key, values in times.items()}
        gb = read / 1e9
        row = dict(cell=name, dtype=dtype, dim=dim, docs=docs, length=length, packed=packed, gb=gb,
                   identical=identical, ms=median, rounds=times, host_us=host_us)
        rows.append(row)
        print(f"| {name} | {gb:.2f} | " + " | ".join(f"{median[n]:.4f}" if n in median else "-" for n in names)
              + " | " + " | ".join(f"{gb / median[n]:.3f}" for n in tunables) + " |"
              + ("" if identical else " SCORES DIFFER"), flush=True)
        print("  host us a call, by round: " + "; ".join(
            f"{key} " + " ".join(f"{us:.0f}" for us in values) for key, values in host_us.items()), flush=True)
        del q, d, extra, offsets, variants, scores
        torch.cuda.empty_cache()
    meta = provenance()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ab-tunables-{datetime.date.today().isoformat()}-{meta.get('commit', 'unknown')}.json"
    path.write_text(json.dumps({"provenance": meta, "variants": tunables, "rows": rows}, indent=1))
    print(f"wrote {path}")
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
