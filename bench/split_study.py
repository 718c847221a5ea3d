"""fp32 at fp32 accuracy from three fp16 products: is it accurate enough? A count, on the CPU.

Issue 24's compute-bound fp32 line: fp32 inputs at fp32 accuracy (1e-5 against float64) at
least half the speed of our own bf16 kernel on the same 32-query cell. The certification study
(certify_study.py) took "three TF32 products" as the only split, at most 1/6 of the bf16 rate
per element (TF32 runs at half of it), and so looked to certification. This counts another
split: each operand scaled by a power of two (per document token, per query token: exact),
then taken as big + small in fp16 (big = fp16(y), small = fp16(y - big); y - big is exact in
fp32), and three fp16 products kept (big.big + big.small + small.big, as one fp16 dot over 3D:
[qb | qb | qs] . [db | ds | db]). fp16 runs at the bf16 rate, so the three products cost 3
bf16 passes per element, 1.5 of the bf16 cell's MMA work on a 4 GB fp32 cell (half the
elements), against 3.0 for 3xTF32 (6 per element). The scale keeps every element inside fp16's
range (the row's largest |y| in [2^14, 2^15)) and its small half out of the subnormals but for
elements 2^-25 of their row's largest; it is undone after the max (a document token's in the
fold, as int8's scales; a query token's on its maximum).

The bound (y an operand after scaling, r = y - big - small its remainder): |y - big| <=
2^-11 |y| + 2^-25 and |r| <= 2^-22 |y| + 2^-24.9 (fp16's half-ulp in the subnormals is
2^-25), so the dropped part of y_q . y_d (small.small and the remainders' products) is at
most sum_k 3.1 2^-22 |y_qk y_dk| + 2^-24 (|y_qk| + |y_dk|): ``representation_bound``,
asserted on every similarity against its float64 value. The accumulation (3D products in fp32,
tensor cores that truncate: gamma_3D |q| |d|) comes on top, as for every tensor-core path.

Reported per corpus: the worst representation error over its bound, and the score error the
tests measure (max |got - float64| over max |float64|, the three products summed in float32 by
BLAS, a stand-in for the tensor cores' order), beside 3xTF32's and one TF32 pass's.

    python bench/split_study.py [--dims 48,128,768,2560] [--docs 200] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from certify_study import round_to_tf32  # noqa: E402
from fidelity_int8 import make_corpus  # noqa: E402

#: The largest |y| of a scaled row lies in [2^TOP - 1, 2^TOP): fp16's largest finite is 65504.
TOP = 15


def row_scales(x: np.ndarray) -> np.ndarray:
    """Per row (last axis) the power of two that puts its largest |x| in [2^14, 2^15), as
    float64 (at most 2^126, so that 2^-k stays a normal float32: codecs.cuh split_exponent)."""
    largest = np.abs(x.astype(np.float64)).max(axis=-1, keepdims=True)
    _, exponent = np.frexp(largest)  # largest in [2^(e-1), 2^e); zero rows give e = 0
    return np.ldexp(1.0, np.minimum(TOP - exponent, 126))  # (as codecs.cuh split_exponent)


def split_fp16(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(scaled y, big, small, scale): y = x * scale exactly (float64), big = fp16(y), small =
    fp16(y - big), both as float64 (their values, exact)."""
    scale = row_scales(x)
    y = (x.astype(np.float64) * scale).astype(np.float32).astype(np.float64)
    big = y.astype(np.float16).astype(np.float64)
    small = (y - big).astype(np.float32).astype(np.float16).astype(np.float64)  # y - big is exact in fp32
    return y, big, small, scale


def representation_bound(yq: np.ndarray, yd: np.ndarray) -> np.ndarray:
    """The module docstring's bound on |yq . yd - (qb.db + qb.ds + qs.db)|, [Tq, Td]."""
    aq, ad = np.abs(yq), np.abs(yd)
    return 3.1 * 2.0 ** -22 * (aq @ ad.T) + 2.0 ** -24 * (aq.sum(1)[:, None] + ad.sum(1)[None, :])


def maxsim(sims: np.ndarray, num_queries: int, query_length: int, num_docs: int, doc_length: int) -> np.ndarray:
    return sims.reshape(num_queries, query_length, num_docs, doc_length).max(axis=-1).sum(axis=1)


def scores_by_split(q: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, float]:
    """Scores from the three fp16 products summed in float32 (BLAS), and the worst
    representation error over its bound (asserted at most 1)."""
    (nq, lq, dim), (nd, ld, _) = q.shape, d.shape
    yq, qb, qs, sq = split_fp16(q.reshape(-1, dim))
    yd, db, ds, sd = split_fp16(d.reshape(-1, dim))
    three = qb @ db.T + qb @ ds.T + qs @ db.T  # exact products, float64 sums
    exact = yq @ yd.T
    worst = float((np.abs(exact - three) / np.maximum(representation_bound(yq, yd), 1e-300)).max())
    assert worst <= 1.0, f"the representation bound fails: {worst:.3f} of it"
    wide_q = np.concatenate([qb, qb, qs], axis=1).astype(np.float32)
    wide_d = np.concatenate([db, ds, db], axis=1).astype(np.float32)
    sims = (wide_q @ wide_d.T).astype(np.float64) / (sq * sd.T)  # the scales undone exactly
    return maxsim(sims, nq, lq, nd, ld), worst


def scores_by_tf32(q: np.ndarray, d: np.ndarray, products: int) -> np.ndarray:
    """One TF32 pass (products=1) or 3xTF32 (big.big + big.small + small.big), float32 sums."""
    (nq, lq, dim), (nd, ld, _) = q.shape, d.shape
    qt, dt = q.reshape(-1, dim).astype(np.float32), d.reshape(-1, dim).astype(np.float32)
    qb, db = round_to_tf32(qt), round_to_tf32(dt)
    sims = qb @ db.T
    if products == 3:
        sims = round_to_tf32(qt - qb) @ db.T + qb @ round_to_tf32(dt - db).T + sims
    return maxsim(sims.astype(np.float64), nq, lq, nd, ld)


def corpus(kind: str, dim: int, num_docs: int, doc_length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 queries [8, 32, dim] and documents [num_docs, doc_length, dim]:
    clustered: unit tokens around shared centres (fidelity_int8.py; near ties on purpose);
    wide-rows: the same, each token scaled by 10^U(-15, 15) (per-token scales at work; products
    within float32's range);
    wide-elements: elements of magnitude 2^U(-40, 0), random signs (small halves subnormal);
    ulp-ties: clustered documents whose every other token is its neighbour one ulp apart."""
    q, d = make_corpus(num_docs, doc_length, 8, 32, dim, 64, 0.3, seed)
    q, d = q.astype(np.float32), d.astype(np.float32)
    rng = np.random.default_rng(seed + 1)
    if kind == "wide-rows":
        q = q * (10.0 ** rng.uniform(-15, 15, q.shape[:2] + (1,))).astype(np.float32)
        d = d * (10.0 ** rng.uniform(-15, 15, d.shape[:2] + (1,))).astype(np.float32)
    elif kind == "wide-elements":
        q, d = (np.sign(rng.standard_normal(x.shape)) * 2.0 ** rng.uniform(-40, 0, x.shape) for x in (q, d))
        q, d = q.astype(np.float32), d.astype(np.float32)
    elif kind == "ulp-ties":
        d[:, 1::2] = np.nextafter(d[:, 0::2], np.float32(np.inf))
    return q, d


KINDS = ("clustered", "wide-rows", "wide-elements", "ulp-ties")


def study(dims, kinds, num_docs, doc_length, seed):
    rows = []
    for dim in dims:
        for kind in kinds:
            q, d = corpus(kind, dim, num_docs, doc_length, seed)
            reference = maxsim(q.reshape(-1, dim).astype(np.float64) @ d.reshape(-1, dim).astype(np.float64).T,
                               q.shape[0], q.shape[1], d.shape[0], d.shape[1])
            scale = np.abs(reference).max()
            split, worst = scores_by_split(q, d)
            tf32x3 = scores_by_tf32(q, d, 3)
            row = dict(dim=dim, corpus=kind, worst_representation_error_over_bound=worst,
                       split_fp16=float(np.abs(split - reference).max() / scale),
                       split_fp16_per_score=float((np.abs(split - reference) / np.abs(reference)).max()),
                       tf32x3=float(np.abs(tf32x3 - reference).max() / scale),
                       tf32x3_per_score=float((np.abs(tf32x3 - reference) / np.abs(reference)).max()),
                       tf32=float(np.abs(scores_by_tf32(q, d, 1) - reference).max() / scale))
            rows.append(row)
            print(f"dim {dim:5d} {kind:13s}: fp16 split {row['split_fp16']:.2e} (per score <= "
                  f"{row['split_fp16_per_score']:.2e}; representation <= {worst:.2f} of its bound), "
                  f"3xTF32 {row['tf32x3']:.2e} (per score <= {row['tf32x3_per_score']:.2e}), one TF32 pass {row['tf32']:.2e}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="48,128,768,2560")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--doc-length", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write split-study-<date>.json here")
    args = parser.parse_args(argv)
    rows = study([int(x) for x in args.dims.split(",")], args.kinds.split(","), args.docs, args.doc_length, args.seed)
    worst = max(r["split_fp16"] for r in rows)
    print(f"fp16 split: worst score error {worst:.2e} of the largest score (the tests' line: 1e-5); MMA work on a "
          f"4 GB fp32 cell over the bf16 cell's: 1.5 (3xTF32: 3.0)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"split-study-{datetime.date.today().isoformat()}.json"
        meta = dict(vars(args), python=platform.python_version(), numpy=np.__version__, machine=platform.machine())
        path.write_text(json.dumps({"provenance": meta, "rows": rows}, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
