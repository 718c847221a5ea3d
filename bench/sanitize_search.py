"""Search's selection kernels (maxsim_topk.cu) under compute-sanitizer: ties, NaN, exclusions,
the rounds and the wide selection (every row, k up to TOPK_RANKED_MAX), several blocks, a block's candidates merged both ways, segments of several tiles and partial tiles, rounds forced short, k past
TOPK_RANKED_MAX (the last round unranked); and quantize_int8's kernel (maxsim_quantize.cu) at
dims around a warp, with masks, and an int8 Index searched. CuPy's
memory pool is off (an out-of-bounds read inside a slab is invisible). Run alone, or as the
end of sanitize_forward.py.

    compute-sanitizer --tool memcheck python bench/sanitize_search.py
"""

import cupy
import numpy as np

import cupy_maxsim as cm
from cupy_maxsim import _topk, tuning

cupy.cuda.set_allocator(None)
rng = np.random.default_rng(1)


def rows(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


q, d = rows((3, 8, 64), cupy.float16), rows((2000, 20, 64), cupy.float16)
d[::3] = d[1]  # ties
d[5, 0, 0] = cupy.nan
long_rows = rows((40_001, 3, 64), cupy.float16)  # 16k segments of 4 tiles, a partial last one
long_rows[::7] = long_rows[3]


def searches():
    for min_segment in (_topk.MIN_SEGMENT, 1):  # one segment a row; segments of 4k in rounds
        _topk.MIN_SEGMENT = min_segment
        for k in (1, 100, 1999):
            cm.search(q, d, k)
            cm.search(q, d, k, workspace_bytes=3 * 8 * 300)
    _topk.MIN_SEGMENT = 16384
    for k in (5, 1000, 4097, 8192, 9000):  # (9000: past TOPK_RANKED_MAX, the last round unranked)
        cm.search(q, long_rows, k)
    index = cm.Index(64, dtype="float16", device="cuda")
    index.add(d)
    index.remove(list(range(0, 2000, 5)))
    index.search(q, 50)
    index.search(q, 1999, filter=list(range(0, 2000, 3)))


for merge_kernel in (False, True):  # a block's candidates merged by CuPy's sort, or maxsim_topk_merge
    for wide_min in (-1, 0):  # rows in rounds; every row it can rank by the wide selection
        with tuning.override(search_merge_kernel=merge_kernel, search_wide_select_min=wide_min):
            searches()

for dim in (1, 31, 33, 300):  # quantize_int8: tokens of a warp's width and around it
    x = rows((5, 7, dim), cupy.float16)
    cm.quantize_int8(x, mask=cupy.asarray(rng.random((5, 7)) < 0.7))
    cm.quantize_int8(x.astype(cupy.float64)[:, ::2])
int8_index = cm.Index(64, dtype="int8", device="cuda")
int8_index.add(d[:500])
int8_index.search(q, 10)
cupy.cuda.Device().synchronize()
print("sanitize_search: done")
