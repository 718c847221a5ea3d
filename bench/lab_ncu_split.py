import sys, cupy, numpy as np
import cupy_maxsim as cm
from cupy_maxsim import tuning
dtype, dim = sys.argv[1], int(sys.argv[2])
nd = int(0.5e9 / (300 * dim * (4 if dtype == "float32" else 2)))
r = cupy.random.default_rng(0)
q = r.standard_normal((32, 32, dim), dtype=cupy.float32).astype(dtype)
d = r.standard_normal((nd, 300, dim), dtype=cupy.float32).astype(dtype)
with tuning.override(wgmma_fp32_split=True):
    for _ in range(2): cm.score(q, d)
cupy.cuda.runtime.deviceSynchronize()
