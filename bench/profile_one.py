"""One forward call of a shape (fp16, dim 128), after two warm-up calls, for ncu and
compute-sanitizer (profile the third launch: --launch-skip 2 --launch-count 1):

    python bench/profile_one.py NQ LQ ND LD [argmax]

CUPY_MAXSIM_WGMMA=0 profiles the mma.sync kernel on Hopper.
"""

import sys

import cupy

import cupy_maxsim as cm

nq, lq, nd, ld = (int(x) for x in sys.argv[1:5])
rng = cupy.random.default_rng(0)
q = (rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
d = (rng.standard_normal((nd, ld, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
for _ in range(3):
    cm.score(q, d, return_argmax="argmax" in sys.argv)
cupy.cuda.Device().synchronize()
