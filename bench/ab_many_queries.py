"""Many queries (documents on M) under two values of a tunable, interleaved rounds in one
process, CUDA events over back-to-back calls; whether the scores of the two are equal bit for
bit. Cells: issue 25's 32 x 10k x 1030 fp16 (and its search, k=100), the cliff sweep's 32 x
4 GB cells (fp16 dims 64 and 128, int8 dims 64 and 128), and packed corpora of 32-128 tokens,
fp16 and int8. Matrix rate of the real work (2 x Lq x Nq x tokens x dim) beside each time.

    python bench/ab_many_queries.py --ab wgmma_turns=False,True [--rounds 5] \
        > bench/results/ab-many-queries-<date>-<commit>.txt
"""

import argparse
import ast

import cupy
import numpy as np

import cupy_maxsim as cm
from ab_search import timed  # (bench/ is the script's directory)
from cupy_maxsim import tuning


def cells(rng):
    """(name, call, real multiply-adds) of each cell, made as it is reached (one cell's corpus
    on the GPU at a time)."""
    dim = 128
    q = rng.standard_normal((32, 32, dim), dtype=cupy.float32).astype(cupy.float16)
    for docs, length, width, dtype in ((10_000, 1030, 128, "fp16"), (52_083, 300, 128, "fp16"),
                                       (104_166, 300, 64, "fp16"), (104_166, 300, 128, "int8"),
                                       (208_333, 300, 64, "int8")):
        d = rng.standard_normal((docs, length, width), dtype=cupy.float32).astype(cupy.float16)
        queries = q[..., :width].copy()
        if dtype == "int8":
            (q8, qs), (d8, ds) = cm.quantize_int8(queries), cm.quantize_int8(d)
            del d
            yield (f"int8 dim {width} 32x32 vs {docs} x {length}",
                   lambda: cm.score(q8, d8, q_scale=qs, d_scale=ds), docs * length * width)
            continue
        yield f"fp16 dim {width} 32x32 vs {docs} x {length}", lambda: cm.score(queries, d), docs * length * width
        if docs == 10_000:
            yield "search k=100, 32x32 vs 10000 x 1030", lambda: cm.search(queries, d, 100), docs * length * width
    lengths = cupy.asarray(np.random.default_rng(0).integers(32, 129, 200_000))
    offsets = cupy.concatenate([cupy.zeros(1, cupy.int64), cupy.cumsum(lengths)])
    tokens = rng.standard_normal((int(offsets[-1]), dim), dtype=cupy.float32).astype(cupy.float16)
    yield "fp16 packed 32x32 vs 200k of 32-128", lambda: cm.score_packed(q, tokens, offsets), tokens.shape[0] * dim
    (q8, qs), (t8, ts) = cm.quantize_int8(q), cm.quantize_int8(tokens)
    yield ("int8 packed 32x32 vs 200k of 32-128",
           lambda: cm.score_packed(q8, t8, offsets, q_scale=qs, d_scale=ts), tokens.shape[0] * dim)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ab", default="wgmma_turns=False,True", help="FIELD=A,B: a tunable's two values")
    parser.add_argument("--only", default="", help="comma-separated substrings: the cells whose names hold one")
    options = parser.parse_args()
    wanted = [w for w in options.only.split(",") if w]
    field, values = options.ab.split("=")
    values = [ast.literal_eval(v) for v in values.split(",")]
    rng = cupy.random.default_rng(1)
    rows = []
    for name, call, work in cells(rng):
        if wanted and not any(w in name for w in wanted):
            continue
        # (by position: two equal values time one build twice, a baseline's spread)
        answers, times = [], [[], []]
        for value in values:
            with tuning.override(**{field: value}):
                answers.append(call())
        same = all(np.array_equal(cupy.asnumpy(a), cupy.asnumpy(b))
                   for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in answers)))
        for _ in range(options.rounds):
            for side, value in enumerate(values):
                with tuning.override(**{field: value}):
                    times[side].append(timed(call, calls=3))
        a, b = (float(np.median(t)) for t in times)
        tflops = 2 * 32 * 32 * work / 1e12
        rows.append(f"| {name} | {a:.3f} | {b:.3f} | {a / b:.3f}x | {tflops / a * 1e3:.0f} | "
                    f"{tflops / b * 1e3:.0f} | {same} |")
        print(rows[-1], flush=True)
        del call, answers
        cupy.get_default_memory_pool().free_all_blocks()
    print(f"\n| cell | {field}={values[0]} ms | ={values[1]} ms | speed-up | TFLOPS | TFLOPS | identical |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
