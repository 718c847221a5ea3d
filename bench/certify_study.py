"""Can certification meet issue 24's compute-bound fp32 line? A count, on the CPU.

The line: fp32 inputs at fp32 accuracy (1e-5 relative against float64) at least half the
speed of our own bf16 kernel on 32 queries. Any split into TF32 products reaches at most 1/6
(TF32 runs at half the bf16 rate and fp32 accuracy needs three products). The other way:
score with one fast tensor-core pass (the operands rounded to bf16 or TF32), then certify each
query token's winner: every document token whose fast similarity could still beat the fast
winner's (their rigorous error bounds overlap) is a candidate, and only the candidates are
recomputed exactly in fp32. Whether that can be fast depends on how many candidates there
are, which this counts, on the clustered corpora of ``fidelity_int8.py`` (unit tokens around
shared centres: near ties on purpose; smaller spreads, more of them).

The bound of a fast similarity (x and y rounded to x^ and y^ with unit roundoff u; their
products exact in fp32; D of them summed in fp32 by tensor cores that truncate, 2^-23 an add):
|x.y - fast| <= ((2u + u^2) + gamma_D (1 + u)^2) |x| |y|, gamma_D = D 2^-23 / (1 - D 2^-23),
by Cauchy-Schwarz from sum |x_i| |y_i| <= |x| |y| (the norms known per token). A document
token j is a candidate for query token i when fast_ij + E_ij >= max_k (fast_ik - E_ik).

The cost model, per (query token, document) pair, in units of one bf16 kernel's work on it
(Ld document tokens of MMA): the fast pass (1 for bf16, 2 for TF32: half the rate), plus R / Ld
for each exact fp32 dot (R = the bf16 tensor rate over the fp32 CUDA-core rate: 989 / 67 on
the H200, from the data sheet), where a kernel keeping its m best fast similarities a query
token recomputes min(c, m) of them, or all Ld when more than m are candidates (it cannot tell
which). Even c = 1 costs one exact dot: the fast winner's score is not fp32-accurate. Memory
(re-reading candidate rows, fp32 at 4 bytes) and the fold's own work are left out: this is a
ceiling, not a prediction.

    python bench/certify_study.py [--dims 128,768] [--spreads 0.3,0.6,1.0] [--docs 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import typing
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fidelity_int8 import make_corpus  # noqa: E402

from cupy_maxsim import _arrays  # noqa: E402


def round_to_tf32(x: np.ndarray) -> np.ndarray:
    """x (float32) rounded to nearest-even at TF32's 11 significant bits (13 low bits dropped)."""
    raw = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((raw + np.uint64(0xFFF) + ((raw >> np.uint64(13)) & np.uint64(1))) >> np.uint64(13)) << np.uint64(13)
    return rounded.astype(np.uint32).view(np.float32)


def round_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """x rounded to nearest-even bfloat16, as float32 (the library's own conversion)."""
    return _arrays.widened_bfloat16(_arrays.bfloat16_bits(x))


class FastFormat(typing.NamedTuple):
    bits: int  # significant bits (round to nearest: unit roundoff 2^-bits)
    passes: float  # cost of its pass in bf16 passes (TF32 runs at half the bf16 rate)
    rounded: typing.Callable[[np.ndarray], np.ndarray]


FAST_FORMATS = {"bf16": FastFormat(8, 1.0, round_to_bfloat16), "tf32": FastFormat(11, 2.0, round_to_tf32)}
#: H200 data sheet: dense bf16 tensor rate over fp32 CUDA-core rate (989 / 67 TFLOP/s).
TENSOR_OVER_CUDA_CORES = 989.0 / 67.0


def error_bound(fmt: str, dim: int) -> float:
    """The bound's factor on |x| |y| (module docstring)."""
    u = 2.0 ** -FAST_FORMATS[fmt].bits
    gamma = dim * 2.0 ** -23 / (1 - dim * 2.0 ** -23)
    return (2 * u + u * u) + gamma * (1 + u) ** 2


def candidate_counts(q: np.ndarray, d: np.ndarray, fmt: str, exact: np.ndarray) -> tuple[np.ndarray, float]:
    """Candidates per (query token, document) (an int array [Nq * Lq, Nd]) and the largest
    |fast - exact| / bound seen (the bound holds where it is at most 1: asserted, and the exact
    winner is always a candidate). ``exact``: the float64 similarities [Nq * Lq, Nd, Ld]."""
    dim, rounded = q.shape[-1], FAST_FORMATS[fmt].rounded
    qt, dt = q.reshape(-1, dim), d.reshape(-1, dim)
    fast = rounded(qt) @ rounded(dt).T  # float32 sums of exact products
    bound = error_bound(fmt, dim) * np.linalg.norm(qt, axis=1)[:, None] * np.linalg.norm(dt, axis=1)[None, :]
    fast = fast.reshape(len(qt), d.shape[0], d.shape[1])
    bound = bound.reshape(fast.shape)
    worst = float((np.abs(fast - exact) / bound).max())
    assert worst <= 1.0, f"the {fmt} bound fails: |fast - exact| reaches {worst:.3f} of it"
    floor = (fast - bound).max(axis=-1, keepdims=True)  # the winner's score is at least this
    candidate = (fast + bound) >= floor
    winner = exact.argmax(axis=-1)[..., None]
    assert np.take_along_axis(candidate, winner, axis=-1).all(), "an exact winner outside its candidates"
    return candidate.sum(axis=-1), worst


def relative_time(counts: np.ndarray, doc_length: int, fmt: str, keep: int) -> float:
    """The cost model (module docstring): time over our bf16 kernel's on the same cell."""
    exact = np.where(counts <= keep, counts, doc_length)
    return FAST_FORMATS[fmt].passes + TENSOR_OVER_CUDA_CORES * float(exact.mean()) / doc_length


def study(dims, spreads, num_docs, doc_length, num_queries, query_length, centres, seed):
    rows = []
    for dim in dims:
        for spread in spreads:
            q, d = make_corpus(num_docs, doc_length, num_queries, query_length, dim, centres, spread, seed)
            exact = (q.reshape(-1, dim).astype(np.float64) @ d.reshape(-1, dim).astype(np.float64).T).reshape(
                -1, num_docs, doc_length)
            top2 = np.partition(exact, -2, axis=-1)[..., -2:]
            gap = float(np.median(top2[..., 1] - top2[..., 0]))
            for fmt in FAST_FORMATS:
                counts, worst = candidate_counts(q, d, fmt, exact)
                row = dict(dim=dim, spread=spread, fast=fmt, bound=error_bound(fmt, dim),
                           worst_error_over_bound=worst,
                           median_top2_gap=gap, certified_alone=float((counts == 1).mean()),
                           mean_candidates=float(counts.mean()), p99_candidates=float(np.percentile(counts, 99)),
                           max_candidates=int(counts.max()))
                for keep in (1, 2, 4, 8):
                    row[f"over_{keep}"] = float((counts > keep).mean())
                    row[f"time_keep_{keep}"] = relative_time(counts, doc_length, fmt, keep)
                rows.append(row)
                print(f"dim {dim:5d} spread {spread:.2f} {fmt}: bound {row['bound']:.2e} (median top-2 gap {gap:.2e}), "
                      f"alone {row['certified_alone']:.3f}, mean {row['mean_candidates']:.2f}, "
                      f"p99 {row['p99_candidates']:.0f}, max {row['max_candidates']} (error <= {worst:.2f} of the bound); "
                      f"time over bf16 keeping "
                      + ", ".join(f"{k}: {row[f'time_keep_{k}']:.2f}" for k in (1, 2, 4, 8)), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="128,768")
    parser.add_argument("--spreads", default="0.3,0.6,1.0")
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--doc-length", type=int, default=300)
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--query-length", type=int, default=32)
    parser.add_argument("--centres", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write certify-study-<date>.json here")
    args = parser.parse_args(argv)
    dims = [int(x) for x in args.dims.split(",")]
    spreads = [float(x) for x in args.spreads.split(",")]
    rows = study(dims, spreads, args.docs, args.doc_length, args.queries, args.query_length, args.centres, args.seed)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"certify-study-{datetime.date.today().isoformat()}.json"
        meta = dict(vars(args), python=platform.python_version(), numpy=np.__version__, machine=platform.machine(),
                    tensor_over_cuda_cores=TENSOR_OVER_CUDA_CORES)
        path.write_text(json.dumps({"provenance": meta, "rows": rows}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
