"""Search's selection kernel (maxsim_topk.cu) under compute-sanitizer: ties, NaN, exclusions,
several blocks, segments of several tiles and partial tiles, rounds forced short. CuPy's
memory pool is off (an out-of-bounds read inside a slab is invisible). Run alone, or as the
end of sanitize_forward.py.

    compute-sanitizer --tool memcheck python bench/sanitize_search.py
"""

import cupy
import numpy as np

import cupy_maxsim as cm
from cupy_maxsim import _topk

cupy.cuda.set_allocator(None)
rng = np.random.default_rng(1)


def rows(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


q, d = rows((3, 8, 64), cupy.float16), rows((2000, 20, 64), cupy.float16)
d[::3] = d[1]  # ties
d[5, 0, 0] = cupy.nan
for min_segment in (_topk.MIN_SEGMENT, 1):  # one segment a row; segments of 4k in rounds
    _topk.MIN_SEGMENT = min_segment
    for k in (1, 100, 1999):
        cm.search(q, d, k)
        cm.search(q, d, k, workspace_bytes=3 * 8 * 300)
_topk.MIN_SEGMENT = 16384
long_rows = rows((40_001, 3, 64), cupy.float16)  # 16k segments of 4 tiles, a partial last one
long_rows[::7] = long_rows[3]
for k in (5, 1000, 4097):
    cm.search(q, long_rows, k)
index = cm.Index(64, dtype="float16", device="cuda")
index.add(d)
index.remove(list(range(0, 2000, 5)))
index.search(q, 50)
cupy.cuda.Device().synchronize()
print("sanitize_search: done")
