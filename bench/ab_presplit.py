"""The fp32 split's two builds A/B on the Hopper kernel: the producer splitting float32 documents
it stages (MAXSIM_FP32_SPLIT 1, the default) against documents split by one launch before and
copied by TMA as 16-bit tiles are (MAXSIM_FP32_SPLIT 2, Tunables.wgmma_fp32_presplit), with the
bf16 cell of the same bytes (the documents twice) beside them (issue 24's line: fp32 at fp32 accuracy at least half
our bf16 speed) and the pre-split launch alone (launch.split_documents: float32 read, as many
bytes written). 32x32 queries against about --corpus-gb of 300-token documents per dim; rounds
interleaved, CUDA events over back-to-back calls, medians; whether the two builds' scores are
equal bit for bit, and each one's largest error against float64 on a sample of documents.

    python bench/ab_presplit.py [--dims 128,1024] [--corpus-gb 2] [--rounds 5]
"""

import argparse
import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import cupy_maxsim as cm  # noqa: E402
from ab_search import timed  # noqa: E402
from cupy_maxsim import reference, tuning  # noqa: E402
from cupy_maxsim._gpu.launch import split_documents  # noqa: E402

BUILDS = {"staged": dict(wgmma_fp32_presplit=False), "presplit": dict(wgmma_fp32_presplit=True)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", default="128,1024")
    parser.add_argument("--corpus-gb", type=float, default=2.0, help="float32 corpus bytes per dim, in GB (1e9)")
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    rng = cupy.random.default_rng(0)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    rows = []
    for dim in (int(x) for x in options.dims.split(",")):
        rows.append(measure(rng, dim, options.corpus_gb, options.rounds))
        print(rows[-1], flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    print(f"\n32x32 fp32 queries vs about {options.corpus_gb} GB of float32 300-token documents ({name}); "
          "bf16: the cell of the same bytes (the documents twice, as bf16)")
    print("| dim | docs | staged ms | presplit ms | its split launch ms | bf16 ms | staged / bf16 speed "
          "| presplit / bf16 speed | identical | error vs float64 (staged / presplit) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def measure(rng, dim: int, corpus_gb: float, rounds: int) -> str:
    """One dim's row: the two builds, their split launch and bf16, timed; equality; errors."""
    length = 300
    docs = int(corpus_gb * 1e9 / (length * dim * 4))
    q = rng.standard_normal((32, 32, dim), dtype=cupy.float32)
    d = rng.standard_normal((docs, length, dim), dtype=cupy.float32)
    answers = {}
    for build, changes in BUILDS.items():
        with tuning.override(**changes):
            answers[build] = cupy.asnumpy(cm.score(q, d))
    sample = cupy.asnumpy(d[:8]).astype(np.float64)  # (float64 on the host: a few documents)
    want = reference.maxsim_reference(cupy.asnumpy(q).astype(np.float64), sample)
    errors = {b: float(np.abs(a[:, :8] - want).max() / np.abs(want).max()) for b, a in answers.items()}
    same = bool(np.array_equal(answers["staged"], answers["presplit"]))
    half = d.astype("bfloat16")  # (CuPy 14: ml_dtypes' bfloat16) the same bytes: the documents twice
    bf16 = q.astype("bfloat16"), cupy.concatenate([half, half])
    del half
    times = {key: [] for key in (*BUILDS, "bf16", "split launch")}
    for _ in range(rounds):
        for build, changes in BUILDS.items():
            with tuning.override(**changes):
                times[build].append(timed(lambda: cm.score(q, d), calls=3))
        times["bf16"].append(timed(lambda: cm.score(*bf16), calls=3))
        times["split launch"].append(timed(lambda: split_documents(d.data.ptr, 0, docs, length, (length * dim, dim),
                                                                   dim), calls=3))
    ms = {key: float(np.median(t)) for key, t in times.items()}
    return (f"| {dim} | {docs} | {ms['staged']:.3f} | {ms['presplit']:.3f} | {ms['split launch']:.3f} | "
            f"{ms['bf16']:.3f} | {ms['bf16'] / ms['staged']:.2f} | {ms['bf16'] / ms['presplit']:.2f} | "
            f"{same} | {errors['staged']:.1e} / {errors['presplit']:.1e} |")


if __name__ == "__main__":
    main()
