"""Small calls of the Hopper kernel's fp32 split builds (Tunables.wgmma_fp32_split: fp32 at fp32
accuracy as three fp16 products, the producer splitting the documents' rows itself; and with
Tunables.wgmma_fp32_presplit, the documents split by a launch before and read by TMA), for
compute-sanitizer memcheck / racecheck on its own (sanitize_forward.py takes minutes): padded
and packed corpora with empty documents, masks, winners, a group's last box short, dims from 1
to 2600 (a partial last 64 elements), rows on 4 bytes in views that end where their allocation
does (a read past a row's end is out of bounds), non-finite tokens. CuPy's memory pool is off
(inside a pool's slab an out-of-bounds read is invisible to memcheck).

    compute-sanitizer --tool memcheck python3 bench/sanitize_split.py [split] [presplit]

(both builds without arguments.)
"""

import sys

import cupy
import numpy as np

import cupy_maxsim as cm
from cupy_maxsim import tuning

cupy.cuda.set_allocator(None)
rng = np.random.default_rng(0)


def rows(shape, shift=0):
    """float32 rows; ``shift`` elements into an allocation that ends where the view does."""
    buffer = cupy.zeros(int(np.prod(shape)) + shift, dtype=cupy.float32)
    view = buffer[shift:].reshape(shape)
    view[...] = cupy.asarray(rng.standard_normal(shape).astype(np.float32))
    return view


builds = sys.argv[1:] or ["split", "presplit"]
for presplit in [build == "presplit" for build in builds]:  # (presplit: rows on 16 bytes; shifted cells stay staged)
    with tuning.override(wgmma_fp32_split=True, wgmma_fp32_presplit=presplit):
        for nq, lq, nd, ld, dim, shift in [(2, 32, 3, 40, 64, 0), (5, 32, 4, 70, 1, 0), (9, 32, 5, 33, 48, 1),
                                           (8, 32, 3, 65, 100, 1), (33, 32, 4, 40, 128, 0), (13, 27, 3, 20, 130, 2),
                                           (9, 32, 2, 40, 2600, 1), (9, 32, 3, 37, 200, 0), (9, 32, 2, 40, 2600, 0)]:
            q, d = rows((nq, lq, dim)), rows((nd, ld, dim), shift)
            d[1, 3, 0] = np.nan  # a non-finite real token: its document's scores NaN
            q_mask = cupy.asarray(rng.random((nq, lq)) < 0.8)
            d_mask = cupy.asarray(rng.random((nd, ld)) < 0.7)
            cm.score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
            cm.score(q, d)
            cm.score_packed(q, rows((41, dim), shift), cupy.asarray([0, 5, 5, 40, 41], dtype=cupy.int32),
                            q_mask=q_mask)
cupy.cuda.runtime.deviceSynchronize()
print("done")
