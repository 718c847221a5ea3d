"""One call of a shape (fp16, dim 128), after two warm-up calls, for ncu and
compute-sanitizer (profile the third launch: --launch-skip 2 --launch-count 1; or every kernel
of the third call, which runs between cudaProfilerStart and Stop: --profile-from-start off):

    python bench/profile_one.py NQ LQ ND LD [argmax] [int8] [packed] [backward] [search] [float32] [dim=N] [tune:KEY=VALUE ...]

``int8``: queries and documents quantised (per-token scales); ``packed``: the documents packed
with lengths uniform in [16, LD] (the benchmark's ragged corpus); ``fixed``: packed documents all
of length LD (an Index of equal documents, issue 25's 1M x 128 corpus). CUPY_MAXSIM_WGMMA=0 profiles
the mma.sync kernel on Hopper. ``backward``: one forward with the argmax, then three
``score_backward`` calls (the same launch-skip profiles the third backward's kernels; padded
fp16 documents only). ``float32``: fp32 inputs (not cast to fp16); ``dim=N``: embedding dim N;
``tune:KEY=VALUE``: the calls made under ``tuning.override(KEY=VALUE)`` (integers as ints),
e.g. ``tune:wgmma_tile_rows=128``. ``search``: ``search`` (``search_packed``) with k=1000 instead
of scoring, as an Index searches (``int8 packed fixed search 1 32 1000000 128``: issue 25's int8
Index; against ``... 500000 256``, the same bytes in half the documents).
"""

import sys

import cupy

import cupy_maxsim as cm
from cupy_maxsim import tuning

nq, lq, nd, ld = (int(x) for x in sys.argv[1:5])
flags = {flag for flag in sys.argv[5:] if not flag.startswith(("dim=", "tune:"))}
changes = tuning.changes_from_text(flag[5:] for flag in sys.argv[5:] if flag.startswith("tune:"))
dim = next((int(flag[4:]) for flag in sys.argv[5:] if flag.startswith("dim=")), 128)
dtype = cupy.float32 if "float32" in flags else cupy.float16
if "backward" in flags and flags & {"int8", "packed"}:
    raise SystemExit("backward: padded fp16 documents only")
rng = cupy.random.default_rng(0)
q = (rng.standard_normal((nq, lq, dim), dtype=cupy.float32) / 11).astype(dtype)
d = cupy.empty((nd, ld, dim), dtype)
for start in range(0, nd, 50_000):  # (a float32 temporary of the whole corpus would not fit at 1M x 128 x 128)
    d[start:start + 50_000] = (rng.standard_normal((min(50_000, nd - start), ld, dim), dtype=cupy.float32) / 11).astype(dtype)
extra = {}
if "packed" in flags:
    lengths = cupy.full(nd, ld) if "fixed" in flags else rng.integers(16, ld + 1, nd)
    offsets = cupy.concatenate([cupy.zeros(1, cupy.int64), cupy.cumsum(lengths)])
    d = cupy.ascontiguousarray(d.reshape(-1, dim)[: int(offsets[-1])])
if "int8" in flags:
    (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
    extra = dict(q_scale=q_scale, d_scale=d_scale)
if "backward" in flags:
    _, argmax = cm.score(q, d, return_argmax=True)
    grad = rng.standard_normal((nq, nd), dtype=cupy.float32)
if "search" in flags and flags & {"backward", "argmax"}:
    raise SystemExit("search: without backward or argmax")


def call():
    if "backward" in flags:
        cm.score_backward(grad, q, d, argmax)
    elif "search" in flags and "packed" in flags:
        cm.search_packed(q, d, offsets, 1000, **extra)
    elif "search" in flags:
        cm.search(q, d, 1000, **extra)
    elif "packed" in flags:
        cm.score_packed(q, d, offsets, return_argmax="argmax" in flags, **extra)
    else:
        cm.score(q, d, return_argmax="argmax" in flags, **extra)


with tuning.override(**changes):
    for _ in range(2):
        call()
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.start()
    call()
    cupy.cuda.Device().synchronize()
    cupy.cuda.profiler.stop()
