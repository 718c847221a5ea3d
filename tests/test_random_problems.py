"""1,200 seeded random problems on the GPU against the float64 reference (issue 27, item 5): every
dtype (fp16, bf16, fp32, int8), one query and many, padded, pairs and packed, masks with holes,
empty documents, dims from 8 to 2560 (odd ones too), winners on and off. Each
problem is drawn from its own seed, so a failure names the one to replay:
``pytest tests/test_random_problems.py -k 'seed-417'``. A device call too short for all of them
takes a slice: ``CUPY_MAXSIM_SEEDS=500:900 pytest -m gpu tests/test_random_problems.py``."""

import os

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference
from support import assert_scores_match, holey_mask, to_numpy, unit_rows

pytestmark = pytest.mark.gpu

PROBLEMS = 1200
DIMS = (8, 16, 32, 48, 64, 96, 100, 128, 136, 256, 320, 768, 2560)
DTYPES = ("float16", "bfloat16", "float32", "int8")
#: Similarity error per summed query token, by dtype (inputs already rounded to it; int8 exact
#: in its integer dot, fp32 accumulation everywhere).
NOISE = {"float16": 2e-3, "bfloat16": 2e-3, "float32": 1e-5, "int8": 1e-4}


def _draw(seed):
    rng = np.random.default_rng(seed)
    dtype = DTYPES[rng.integers(len(DTYPES))]
    mode = ("padded", "padded", "single", "pairs", "packed")[rng.integers(5)]
    dim = int(DIMS[rng.integers(len(DIMS))])
    nq = 1 if mode == "single" else int(rng.integers(1, 10))
    lq = int(rng.integers(1, 70))
    nd = nq if mode == "pairs" else int(rng.integers(0, 20))
    ld = int(rng.integers(1, 90))
    return rng, dtype, mode, dim, nq, lq, nd, ld, bool(rng.integers(2))


def _device(x, dtype):
    """Host values on the GPU as ``dtype`` (bfloat16: a torch tensor; else CuPy)."""
    import cupy

    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(np.asarray(x, np.float32)).to("cuda", torch.bfloat16)
    return cupy.asarray(np.asarray(x).astype(dtype))


def _mask(mask, dtype):
    """A mask in the framework of that dtype's inputs."""
    if dtype == "bfloat16":
        import torch

        return torch.from_numpy(mask).cuda()
    return _device(mask, "bool")


def _rounded(x, dtype):
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32).astype(np.float64)
    return x.astype(np.float32).astype(np.float64)


#: The seeds this run draws (CUPY_MAXSIM_SEEDS=start:stop, a slice of them; default all).
SEEDS = range(*map(int, os.environ.get("CUPY_MAXSIM_SEEDS", f"0:{PROBLEMS}").split(":")))


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed-{s}")
def test_random_problem(seed):
    rng, dtype, mode, dim, nq, lq, nd, ld, winners = _draw(seed)
    q64 = _rounded(unit_rows(rng, (nq, lq, dim), np.float64), dtype)
    d64 = _rounded(unit_rows(rng, (nd, ld, dim), np.float64), dtype)
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (nd, ld), 0.6)
    real_rows = lambda x: np.concatenate([x[n][d_mask[n]] for n in range(nd)]) if nd else x.reshape(  # noqa: E731
        (0,) + x.shape[2:])
    kwargs = {}
    if dtype == "int8":  # the reference scores the dequantised values the kernels see
        (q8, qs), (d8, ds) = cm.quantize_int8(q64.astype(np.float32)), cm.quantize_int8(d64.astype(np.float32))
        q64, d64 = q8 * qs[..., None].astype(np.float64), d8 * ds[..., None].astype(np.float64)
        q, d, tokens = _device(q8, "int8"), _device(d8, "int8"), _device(real_rows(d8), "int8")
        kwargs = {"q_scale": _device(qs, "float32"), "d_scale": _device(ds, "float32")}
        token_scales = _device(real_rows(ds), "float32")
    else:
        q, d, tokens = _device(q64, dtype), _device(d64, dtype), _device(real_rows(d64), dtype)
    tolerance = NOISE[dtype] * lq + 1e-6
    if mode == "packed":
        offsets = np.concatenate([[0], np.cumsum(d_mask.sum(1))]).astype(np.int64)
        if dtype == "int8":
            kwargs["d_scale"] = token_scales
        got = cm.score_packed(q, tokens, _device(offsets, "int64"), q_mask=_mask(q_mask, dtype), **kwargs)
        expected = reference.maxsim_packed_reference(q64, real_rows(d64), offsets, q_mask)
    elif mode == "pairs":
        got = cm.score_pairs(q, d, q_mask=_mask(q_mask, dtype), d_mask=_mask(d_mask, dtype), **kwargs)
        expected = reference.maxsim_pairs_reference(q64, d64, q_mask, d_mask)
    else:
        one = mode == "single"
        if one and "q_scale" in kwargs:
            kwargs["q_scale"] = kwargs["q_scale"][0]
        result = cm.score(q[0] if one else q, d, q_mask=_mask(q_mask[0] if one else q_mask, dtype),
                          d_mask=_mask(d_mask, dtype), return_argmax=winners, **kwargs)
        got = result[0] if winners else result
        expected = reference.maxsim_reference(q64, d64, q_mask, d_mask)
        expected = expected[0] if one else expected
        if winners:
            ref_winners = reference.maxsim_argmax_reference(q64, d64, q_mask, d_mask)
            argmax = to_numpy(result[1]).astype(np.int64).reshape(ref_winners.shape)
            np.testing.assert_array_equal(argmax < 0, ref_winners < 0)
    assert_scores_match(got, expected, atol=tolerance)
