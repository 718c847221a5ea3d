"""Small calls of every forward and backward kernel variant, for compute-sanitizer memcheck /
racecheck. CuPy's memory pool is off (inside a pool's slab an out-of-bounds read is invisible
to memcheck); run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 for torch's allocator likewise."""

import sys

import cupy
import numpy as np

import cupy_maxsim as cm

cupy.cuda.set_allocator(None)

rng = np.random.default_rng(0)


def rows(shape, dtype):
    return cupy.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def idle_warpgroups():
    """Documents on M with warpgroups past the last query (idle_docs_on_m) and the last group's
    longer ranges: 16 and 32 queries of 32 tokens in groups of 12 (two and one idle), 30 of 16
    tokens, resident and streamed k, int8, the fp32 split's two warpgroups (4 and 12 queries),
    masks, winners, packed (``python bench/sanitize_forward.py idle``: this part alone)."""
    for dtype in (cupy.float16, cupy.float32):
        for nq, lq, nd, ld, dim in [(32, 32, 300, 70, 128), (16, 32, 200, 33, 64), (30, 16, 150, 40, 96),
                                    (32, 32, 150, 40, 192), (4, 32, 100, 40, 128), (12, 32, 150, 40, 100)]:
            q, d = rows((nq, lq, dim), dtype), rows((nd, ld, dim), dtype)
            cm.score(q, d, d_mask=cupy.asarray(rng.random((nd, ld)) < 0.7), return_argmax=True)
            cm.score_packed(q, rows((nd * 20, dim), dtype), cupy.asarray(np.arange(nd + 1) * 20, dtype=cupy.int32))
            if dtype == cupy.float16:
                qv, qs = cm.quantize_int8(q.astype(cupy.float32))
                dv, ds = cm.quantize_int8(d.astype(cupy.float32))
                cm.score(qv, dv, q_scale=qs, d_scale=ds)
    cupy.cuda.Device().synchronize()


def document_halves():
    """Documents on M with 128 document rows a slot (M_HALVES; forced down to the resident query
    blocks' builds): fp16 dims 192, 256 and 2560, masks and lengths off the tile, winners,
    an idle warpgroup (12 queries), packed (``python bench/sanitize_forward.py halves``)."""
    from cupy_maxsim import tuning

    with tuning.override(wgmma_docs_on_m_halves_ksteps=1):
        for dtype in (cupy.float16,):  # (bf16 takes the same code: CuPy has no bfloat16)
            for nq, lq, nd, ld, dim in [(32, 32, 40, 150, 192), (12, 32, 30, 70, 256), (32, 32, 20, 130, 2560)]:
                q, d = rows((nq, lq, dim), dtype), rows((nd, ld, dim), dtype)
                cm.score(q, d, d_mask=cupy.asarray(rng.random((nd, ld)) < 0.7), return_argmax=True)
                cm.score_packed(q, rows((nd * 37, dim), dtype), cupy.asarray(np.arange(nd + 1) * 37, dtype=cupy.int32))
    cupy.cuda.Device().synchronize()


def one_fp32_query():
    """fp32 at fp32 accuracy for one query (the TF32 split-documents builds, streaming k, each
    warpgroup splitting its atoms' small halves): dims 64-2560 (the query's atoms streamed past
    1024), odd dims, masks, lengths off the tile, winners, packed tokens with an empty document
    (``python bench/sanitize_forward.py tf32``); then again in stretches of one accumulator set
    (Tunables.wgmma_tf32_stretch), and with the documents on M (Tunables.wgmma_tf32_doc_rows:
    dims to 512, winners too)."""
    from cupy_maxsim import tuning

    for stretch, doc_rows in ((0, False), (1, False), (4, False), (1, True)):
        with tuning.override(wgmma_tf32_stretch=stretch, wgmma_tf32_doc_rows=doc_rows):
            one_fp32_query_calls()


def one_fp32_query_calls():
    for nq, lq, nd, ld, dim in [(1, 32, 9, 70, 128), (1, 31, 7, 130, 64), (1, 32, 5, 40, 1024), (1, 20, 3, 33, 2560),
                                (1, 32, 6, 50, 100), (1, 32, 4, 65, 96), (1, 32, 5, 70, 99), (1, 16, 6, 64, 500)]:
        q, d = rows((nq, lq, dim), cupy.float32), rows((nd, ld, dim), cupy.float32)
        mask = cupy.asarray(rng.random((nd, ld)) < 0.7)
        cm.score(q, d, d_mask=mask, return_argmax=True)
        cm.score(q, d, d_mask=mask)  # (no winners: three warpgroups, the query streamed past dim 768)
        cm.score(q[0], d)
        tokens = rows((nd * ld, dim), cupy.float32)[: nd * ld - 1]
        cm.score_packed(q, tokens, cupy.asarray([0, 1, ld, ld, nd * ld - 1], dtype=cupy.int64), return_argmax=True)
    cupy.cuda.Device().synchronize()


def unequal_ranges():
    """One query group over more documents than a block an SM: ranges one document apart
    (_plan/forward.balanced_ranges, common.cuh block_doc_range), on both tensor-core kernels,
    fp16 / fp32 / int8, masks, winners, packed tokens ending where their allocation does
    (``python bench/sanitize_forward.py ranges``)."""
    from cupy_maxsim import tuning

    for use_wgmma in (True, False):
        with tuning.override(use_wgmma=use_wgmma, balanced_ranges=True):
            for dtype in (cupy.float16, cupy.float32):
                for nd in (133, 290):
                    q, d = rows((1, 32, 64), dtype), rows((nd, 9, 64), dtype)
                    cm.score(q, d, d_mask=cupy.asarray(rng.random((nd, 9)) < 0.7), return_argmax=True)
                    cm.score(q, d)
                    offsets = cupy.asarray(np.r_[0, np.cumsum(rng.integers(0, 10, nd))], dtype=cupy.int64)
                    cm.score_packed(q, rows((int(offsets[-1]), 64), dtype), offsets)
            qv, qs = cm.quantize_int8(rows((1, 32, 128), cupy.float32))
            dv, ds = cm.quantize_int8(rows((290, 9, 128), cupy.float32))
            cm.score(qv, dv, q_scale=qs, d_scale=ds)
    cupy.cuda.Device().synchronize()


def document_parts():
    """One query at fat dims scored in parts (Tunables.document_parts_per_ring;
    maxsim_parts.cu): fp32 at dims 300 / 1000 / 2560, fp16 and int8, padded and packed tokens
    (empty documents, documents shorter than a part) ending where their allocation does
    (``python bench/sanitize_forward.py parts``)."""
    from cupy_maxsim import tuning

    with tuning.override(document_parts_per_ring=16):
        for dtype, dim in ((cupy.float32, 300), (cupy.float32, 1000), (cupy.float32, 2560), (cupy.float16, 2560)):
            q, d = rows((1, 32, dim), dtype), rows((30, 130, dim), dtype)
            cm.score(q, d)
            offsets = cupy.asarray(np.r_[0, 0, np.cumsum(rng.integers(0, 200, 29))], dtype=cupy.int64)
            cm.score_packed(q, rows((int(offsets[-1]), dim), dtype), offsets)
        qv, qs = cm.quantize_int8(rows((1, 32, 640), cupy.float32))
        dv, ds = cm.quantize_int8(rows((30, 130, 640), cupy.float32))
        cm.score(qv, dv, q_scale=qs, d_scale=ds)
    cupy.cuda.Device().synchronize()


if sys.argv[1:] == ["parts"]:
    document_parts()
    print("sanitize_forward parts: done")
    sys.exit()
if sys.argv[1:] == ["tf32"]:
    one_fp32_query()
    print("sanitize_forward tf32: done")
    sys.exit()
if sys.argv[1:] == ["tf32-rows"]:  # the documents on M alone
    from cupy_maxsim import tuning

    with tuning.override(wgmma_tf32_doc_rows=True):
        one_fp32_query_calls()
    print("sanitize_forward tf32-rows: done")
    sys.exit()
if sys.argv[1:] == ["ranges"]:
    unequal_ranges()
    print("sanitize_forward ranges: done")
    sys.exit()
if sys.argv[1:] == ["idle"]:
    idle_warpgroups()
    print("sanitize_forward idle: done")
    sys.exit()
if sys.argv[1:] == ["halves"]:
    document_halves()
    print("sanitize_forward halves: done")
    sys.exit()

for dtype in (cupy.float16, cupy.float32, cupy.float64):
    for nq, lq, nd, ld, dim in [(1, 31, 5, 70, 128), (6, 32, 9, 33, 96), (3, 20, 4, 17, 64)]:
        q, d = rows((nq, lq, dim), dtype), rows((nd, ld, dim), dtype)
        mask = cupy.asarray(rng.random((nd, ld)) < 0.7)
        cm.score(q, d, d_mask=mask)
        cm.score(q[0], d)
        cm.score_pairs(q, d[:nq] if nd >= nq else rows((nq, ld, dim), dtype))
        offsets = cupy.asarray([0, 5, 5, 40, 41], dtype=cupy.int32)
        cm.score_packed(q, rows((41, dim), dtype), offsets)
for nq, lq, nd, ld, dim in [(1, 31, 5, 70, 128), (6, 32, 9, 33, 96), (2, 8, 4, 17, 100)]:
    qv, qs = cm.quantize_int8(rows((nq, lq, dim), cupy.float32))
    dv, ds = cm.quantize_int8(rows((nd, ld, dim), cupy.float32))
    cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(rng.random((nd, ld)) < 0.7))
    tv, ts = cm.quantize_int8(rows((41, dim), cupy.float32))
    cm.score_packed(qv, tv, cupy.asarray([0, 5, 5, 40, 41], dtype=cupy.int64), q_scale=qs, d_scale=ts)
# Streaming k (issue 24): fat dims, and every format through it from its first k-step at the
# small shapes (masks, pairs, packed, winners, one query and many).
from cupy_maxsim import tuning  # noqa: E402

for overrides, shapes in (({}, [(1, 31, 4, 70, 320), (9, 32, 3, 40, 2560), (2, 16, 3, 20, 4104),
                                 (3, 32, 3, 40, 640), (3, 32, 3, 40, 1000), (8, 32, 2, 40, 2560),
                                 (1, 31, 3, 70, 2560)]),
                          (dict(mma_resident_max_ksteps=0, fp32_resident_max_ksteps=0),
                           [(1, 31, 5, 70, 128), (6, 32, 9, 33, 96), (9, 32, 5, 17, 64)])):
    with tuning.override(**overrides):
        for dtype in (cupy.float16, cupy.float32):
            for nq, lq, nd, ld, dim in shapes:
                q, d = rows((nq, lq, dim), dtype), rows((nd, ld, dim), dtype)
                mask = cupy.asarray(rng.random((nd, ld)) < 0.7)
                cm.score(q, d, d_mask=mask, return_argmax=True)
                cm.score(q[0], d)
                cm.score_pairs(q, d[:nq] if nd >= nq else rows((nq, ld, dim), dtype))
                cm.score_packed(q, rows((41, dim), dtype), cupy.asarray([0, 5, 5, 40, 41], dtype=cupy.int32))
            qv, qs = cm.quantize_int8(rows((nq, lq, dim), cupy.float32))
            dv, ds = cm.quantize_int8(rows((nd, ld, dim), cupy.float32))
            cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=mask)
# Any dim and alignment (issue 24, item 3): odd dims (rows 2, 4 or 8 bytes off 16: plain loads,
# 4- and 8-byte cp.async; a part-zero last chunk), rows shifted off an allocation's start (the
# view ends where its allocation does: a read past a row's end is out of bounds), streaming k
# with a tail, winners, masks, packed.


def shifted(shape, dtype, elements):
    buffer = cupy.zeros(int(np.prod(shape)) + elements, dtype=dtype)
    view = buffer[elements:].reshape(shape)
    view[...] = rows(shape, dtype) if dtype != cupy.int8 else cupy.asarray(rng.integers(-127, 128, shape), cupy.int8)
    return view


for dtype in (cupy.float16, cupy.float32):
    for nq, lq, nd, ld, dim in [(3, 32, 5, 40, 3), (2, 31, 6, 33, 100), (4, 16, 3, 20, 101), (1, 32, 3, 30, 2500)]:
        q, d = rows((nq, lq, dim), dtype), rows((nd, ld, dim), dtype)
        mask = cupy.asarray(rng.random((nd, ld)) < 0.7)
        cm.score(q, d, d_mask=mask, return_argmax=True)
        cm.score(q, d, d_mask=mask)  # (no winners: three warpgroups, the query streamed past dim 768)
        cm.score(q[0], d)
        cm.score_packed(q, rows((41, dim), dtype), cupy.asarray([0, 5, 5, 40, 41], dtype=cupy.int32))
for dtype, shifts in ((cupy.float16, (1, 2, 4)), (cupy.float32, (1, 2)), (cupy.int8, (1, 2, 4, 8))):
    for shift in shifts:
        q, d = shifted((4, 32, 128), dtype, shift), shifted((6, 45, 128), dtype, shift)
        extra = {}
        if dtype == cupy.int8:
            extra = dict(q_scale=cupy.ones((4, 32), cupy.float32), d_scale=cupy.ones((6, 45), cupy.float32))
        cm.score(q, d, return_argmax=True, **extra)
# The Hopper kernel's cp.async pieces (rows on 4 or 8 bytes): one query against long documents
# (split documents, 128-row tiles), many queries (documents on M), masks, winners, packed.
for dtype, shift in ((cupy.float16, 2), (cupy.float16, 4), (cupy.int8, 4), (cupy.int8, 8)):
    for nq in (1, 12):
        q, d = shifted((nq, 32, 128), dtype, shift), shifted((7, 300, 128), dtype, shift)
        extra = {}
        if dtype == cupy.int8:
            extra = dict(q_scale=cupy.ones((nq, 32), cupy.float32), d_scale=cupy.ones((7, 300), cupy.float32))
        cm.score(q, d, d_mask=cupy.asarray(rng.random((7, 300)) < 0.8), return_argmax=True, **extra)
        cm.score(q, d, **extra)
        tokens = d.reshape(-1, 128)[: 7 * 300 - 1]  # ends where its allocation does
        offsets = cupy.asarray([0, 1, 300, 300, 2099], dtype=cupy.int64)
        if dtype == cupy.int8:
            extra["d_scale"] = cupy.ones((2099,), cupy.float32)
        cm.score_packed(q, tokens, offsets, **extra)
# Many queries at fat dims (documents on M streaming k, the Hopper kernel): a part-zero last
# atom (200), masks (cp.async) and not (TMA), winners, packed tokens ending where their
# allocation does, rows on 4 bytes, int8 past 256 dims.
for dim in (200, 320):
    q, d = rows((12, 32, dim), cupy.float16), rows((7, 150, dim), cupy.float16)
    cm.score(q, d, d_mask=cupy.asarray(rng.random((7, 150)) < 0.8), return_argmax=True)
    cm.score(q, d)
    cm.score_packed(q, d.reshape(-1, dim)[: 7 * 150 - 1], cupy.asarray([0, 1, 150, 150, 1049], dtype=cupy.int64),
                    return_argmax=True)
    cm.score(shifted((12, 32, dim), cupy.float16, 2), shifted((7, 150, dim), cupy.float16, 2), return_argmax=True)
# ... and past them, the query atoms streamed too (TMA from q): queries of 27 tokens (boxes of
# 108 rows), a last warpgroup short of queries, a part-zero last atom, masks, winners, packed;
# and without winners.
for dim in (768, 1000):
    q, d = rows((10, 27, dim), cupy.float16), rows((7, 150, dim), cupy.float16)
    q_mask = cupy.asarray(rng.random((10, 27)) < 0.9)
    d_mask = cupy.asarray(rng.random((7, 150)) < 0.8)
    cm.score(q, d, q_mask=q_mask, d_mask=d_mask, return_argmax=True)
    tokens, offsets = d.reshape(-1, dim)[: 7 * 150 - 1], cupy.asarray([0, 1, 150, 150, 1049], dtype=cupy.int64)
    cm.score_packed(q, tokens, offsets, return_argmax=True)
    cm.score(q, d, q_mask=q_mask, d_mask=d_mask)
    cm.score(q, d)
    cm.score_packed(q, tokens, offsets)
qv, qs = cm.quantize_int8(rows((8, 32, 1024), cupy.float32))
dv, ds = cm.quantize_int8(rows((5, 140, 1024), cupy.float32))
cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(rng.random((5, 140)) < 0.7), return_argmax=True)
qv, qs = cm.quantize_int8(rows((8, 32, 640), cupy.float32))
dv, ds = cm.quantize_int8(rows((5, 140, 640), cupy.float32))
cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(rng.random((5, 140)) < 0.7), return_argmax=True)
cm.score(qv, dv, q_scale=qs, d_scale=ds)
for dim in (100, 101, 3):
    qv, qs = cm.quantize_int8(rows((3, 32, dim), cupy.float32))
    dv, ds = cm.quantize_int8(rows((5, 40, dim), cupy.float32))
    cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(rng.random((5, 40)) < 0.7), return_argmax=True)
# fp32 under precision "high" (TF32): one query, and many queries on the documents-on-M TF32
# build (resident query blocks to dim 64, streamed documents to 160, streamed query atoms past
# it), masks, winners, packed tokens ending where their allocation does, an empty document.
with tuning.float32_matmul_precision("high"):
    for nq, lq, nd, ld, dim in [(1, 31, 5, 70, 128), (12, 32, 7, 150, 64), (9, 27, 7, 150, 128), (5, 32, 4, 90, 1000)]:
        q, d = rows((nq, lq, dim), cupy.float32), rows((nd, ld, dim), cupy.float32)
        cm.score(q, d, d_mask=cupy.asarray(rng.random((nd, ld)) < 0.8), return_argmax=True)
        cm.score(q, d)
        cm.score_packed(q, d.reshape(-1, dim)[: nd * ld - 1],
                        cupy.asarray([0, 1, ld, ld, nd * ld - 1], dtype=cupy.int64), return_argmax=True)
try:
    import torch

    q = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(7, 50, 128, device="cuda", dtype=torch.bfloat16)
    cm.score(q, d)
    # Many stacked queries (the Hopper warpgroup-MMA kernel on sm_90, documents on M): queries
    # straddling warpgroups (Lq 27), masks, packed documents, the argmax, dim 96.
    q = torch.randn(13, 27, 128, device="cuda", dtype=torch.bfloat16)
    d = torch.randn(9, 150, 128, device="cuda", dtype=torch.bfloat16)
    d_mask = torch.rand(9, 150, device="cuda") < 0.7
    cm.score(q, d, d_mask=d_mask, return_argmax=True)
    cm.score_packed(q, d.reshape(-1, 128)[:1000], torch.tensor([0, 1, 64, 64, 500, 1000], device="cuda"))
    cm.score_packed(q, d.reshape(-1, 128)[:1000], torch.tensor([0, 1, 64, 64, 500, 1000], device="cuda"),
                    return_argmax=True)
    cm.score(q[..., :96].contiguous(), d[..., :96].contiguous())
    # One query against long documents, several per block (the split-document rings; TMA, and
    # cp.async with a mask), int8 too.
    long_docs = torch.randn(300, 700, 128, device="cuda", dtype=torch.bfloat16)
    cm.score(q[0], long_docs)
    cm.score(q[0], long_docs, d_mask=torch.rand(300, 700, device="cuda") < 0.9, return_argmax=True)
    (qv, qs), (dv, ds) = cm.quantize_int8(q[:1]), cm.quantize_int8(long_docs)
    cm.score(qv, dv, q_scale=qs, d_scale=ds)
    # int8 with many queries at dim 128 (documents on M in the Hopper kernel), masked.
    (qv, qs), (dv, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
    cm.score(qv, dv, q_scale=qs, d_scale=ds, d_mask=d_mask)
except ImportError:
    pass
# Training: the forward with argmax, then the backward (padded with masks, pairs, packed, one
# hot row per document, and many documents so that dQ takes the chunked path), in one launch
# where it fits and, with its limit at 0, in two.

for fused_limit in (tuning.DEFAULT.bwd_fused_shared_limit, 0):
    with tuning.override(bwd_fused_shared_limit=fused_limit):
        for dtype in (cupy.float16, cupy.float32, cupy.float64):
            # (16, 32, 4, 40, 136): dense rows, the _wide kernels in 16 bits, two dim chunks;
            # (8, 32, 130, 40, 128): one launch with 130 documents
            for nq, lq, nd, ld, dim in [(3, 31, 5, 70, 128), (6, 32, 9, 33, 96), (2, 5, 3, 20, 100), (16, 32, 4, 40, 136),
                                        (8, 32, 130, 40, 128)]:
                q, d = rows((nq, lq, dim), dtype), rows((nd, ld, dim), dtype)
                mask = cupy.asarray(rng.random((nd, ld)) < 0.7)
                scores, argmax = cm.score(q, d, d_mask=mask, return_argmax=True)
                cm.score_backward(cupy.ones_like(scores), q, d, argmax)
                s1, a1 = cm.score(q[0], d, return_argmax=True)
                cm.score_backward(cupy.ones_like(s1), q[0], d, a1)
                dp = d[:nq] if nd >= nq else rows((nq, ld, dim), dtype)
                sp, ap = cm.score_pairs(q, dp, return_argmax=True)
                cm.score_backward(cupy.ones_like(sp), q, dp, ap, pairs=True)
                tokens, offsets = rows((41, dim), dtype), cupy.asarray([0, 5, 5, 40, 41], dtype=cupy.int32)
                sk, ak = cm.score_packed(q, tokens, offsets, return_argmax=True)
                cm.score_backward(cupy.ones_like(sk), q, tokens, ak, offsets=offsets)
                ends_empty = cupy.asarray([0, 5, 5, 41, 41], dtype=cupy.int32)  # an empty last document
                sk, ak = cm.score_packed(q, tokens, ends_empty, return_argmax=True)
                cm.score_backward(cupy.ones_like(sk), q, tokens, ak, offsets=ends_empty)
        for dtype in (cupy.float32, cupy.float16):  # float16: hot rows in the _wide kernels
            hot_q = rows((40, 32, 64), dtype)
            hot_d = rows((3, 20, 64), dtype) * 0.01
            hot_d[:, 4] = hot_q.mean(axis=(0, 1)) * (50 if dtype == cupy.float32 else 5)
            sh, ah = cm.score(hot_q, hot_d, return_argmax=True)
            cm.score_backward(cupy.ones_like(sh), hot_q, hot_d, ah)
many_d = rows((5000, 8, 64), cupy.float16)
sm, am = cm.score(rows((2, 8, 64), cupy.float16), many_d, return_argmax=True)
cm.score_backward(cupy.ones_like(sm), rows((2, 8, 64), cupy.float16), many_d, am)
try:  # torch training steps: after the first, the forward is replayed and stages the backward
    import torch

    import cupy_maxsim.torch as cmt
    for nq, lq, nd, ld in [(4, 32, 6, 130), (3, 20, 5, 1030)]:
        tq = torch.randn(nq, lq, 128, device="cuda", dtype=torch.float16, requires_grad=True)
        td = torch.randn(nd, ld, 128, device="cuda", dtype=torch.float16, requires_grad=True)
        for _ in range(3):
            cmt.maxsim(tq, td).backward(torch.randn(nq, nd, device="cuda"))
        scores = cmt.maxsim(tq, td)  # a second backward of one forward (retain_graph)
        scores.sum().backward(retain_graph=True)
        scores.sum().backward()
    torch.cuda.synchronize()
except ImportError:
    pass
cupy.cuda.Device().synchronize()
print("sanitize_forward: done")
idle_warpgroups()
print("sanitize_forward idle: done")
document_halves()
print("sanitize_forward halves: done")
unequal_ranges()
print("sanitize_forward ranges: done")
document_parts()
print("sanitize_forward parts: done")
# Search's selection kernel (maxsim_topk.cu), also alone: python bench/sanitize_search.py
import sanitize_search  # noqa: E402,F401
