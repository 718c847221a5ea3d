"""One forward call of a shape, after warm-up, for ncu / compute-sanitizer:
    python bench/profile_one.py NQ LQ ND LD [argmax]"""
import sys

import cupy

import cupy_maxsim as cm
import os
from cupy_maxsim import _kernels
if os.environ.get("WGS"): _kernels.WGMMA_SHAPE = dict(warpgroups=int(os.environ["WGS"]), stages=4)

nq, lq, nd, ld = (int(x) for x in sys.argv[1:5])
rng = cupy.random.default_rng(0)
q = (rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
d = (rng.standard_normal((nd, ld, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
for _ in range(3):
    cm.score(q, d, return_argmax="argmax" in sys.argv)
cupy.cuda.Device().synchronize()
