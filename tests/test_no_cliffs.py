"""The paths issue 24 opens on the tensor cores, against the float64 reference: fp32 at fp32
accuracy (3xTF32), fat embedding dims (the mma.sync kernel streaming k), and streaming k forced
at every small shape too (tuning.override), forward with masks, winners, pairs and packed
corpora, non-finite inputs."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import _arrays, reference, tuning
from support import assert_scores_match, holey_mask, to_numpy, unit_rows
from test_gpu import NOISE, SHAPES, _inputs, _like, _to_device, naive_error

pytestmark = pytest.mark.gpu

#: Every format through streaming k from its first k-step.
STREAM_EVERYTHING = dict(mma_resident_max_ksteps=0, fp32_resident_max_ksteps=0)


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(_arrays, "POISON_OUTPUTS", True)


def _check_padded(dtype, nq, lq, nd, ld, dim, seed):
    rng = np.random.default_rng(seed)
    q64, d64, q, d = _inputs(rng, nq, lq, nd, ld, dim, dtype)
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (nd, ld), 0.6)
    got, winners = cm.score(q, d, q_mask=_like(q, q_mask), d_mask=_like(q, d_mask), return_argmax=True)
    expected = reference.maxsim_reference(q64, d64, q_mask, d_mask)
    bound = 2 * naive_error(q64, d64, q_mask, d_mask, dtype, expected) + NOISE[dtype] * lq
    assert_scores_match(got, expected, atol=bound)
    assert np.all(to_numpy(got)[:, 1] == -np.inf)  # holey_mask empties document 1
    if dtype == "float32":
        finite = np.isfinite(expected)
        assert np.abs(to_numpy(got)[finite] - expected[finite]).max() <= 1e-5 * np.abs(expected[finite]).max()
    # Winners reach the max (up to the accumulation), -1 exactly where no token can win.
    ref_winners = reference.maxsim_argmax_reference(q64, d64, q_mask, d_mask)
    winners = to_numpy(winners).astype(np.int64)
    np.testing.assert_array_equal(winners < 0, ref_winners < 0)
    sims = np.where(d_mask[None, :, None, :], np.einsum("qtd,njd->qntj", q64, d64), -np.inf)
    chosen = np.take_along_axis(sims, np.maximum(winners, 0)[..., None], axis=-1)[..., 0]
    real = ref_winners >= 0
    assert np.all(sims.max(-1)[real] - chosen[real] <= (1e-5 if dtype == "float32" else 2e-3))
    again = cm.score(q, d, q_mask=_like(q, q_mask), d_mask=_like(q, d_mask))
    np.testing.assert_array_equal(to_numpy(got), to_numpy(again))  # bitwise reproducible


FAT = [
    pytest.param(1, 32, 6, 70, 320, id="1q-dim320"),
    pytest.param(9, 32, 5, 40, 768, id="9q-dim768"),
    pytest.param(2, 31, 4, 33, 2560, id="2q-dim2560"),
    pytest.param(1, 16, 3, 20, 4104, id="1q-dim4104"),  # a dim that is no multiple of the k chunk
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("nq,lq,nd,ld,dim", FAT)
def test_fat_dims(dtype, nq, lq, nd, ld, dim):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    _check_padded(dtype, nq, lq, nd, ld, dim, seed=dim + nq)


#: test_gpu's shapes that the tensor-core kernels take (the last two are the CUDA cores').
SMALL = [shape for shape in SHAPES if not shape.id.endswith("simt")]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("nq,lq,nd,ld,dim", SMALL)
def test_streaming_k_at_small_dims(dtype, nq, lq, nd, ld, dim):
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    with tuning.override(**STREAM_EVERYTHING):
        _check_padded(dtype, nq, lq, nd, ld, dim, seed=nq * 7 + lq + dim)


def near_tied_fp32(seed, q_shape, d_shape):
    """Unit fp32 queries and documents whose odd rows sit 1e-6 from the even ones, and their
    float64 reference scores."""
    rng = np.random.default_rng(seed)
    q = unit_rows(rng, q_shape, np.float64).astype(np.float32)
    d = unit_rows(rng, d_shape, np.float64)
    d[:, 1::2] = d[:, 0::2] + 1e-6 * rng.standard_normal(d[:, 0::2].shape)
    d = d.astype(np.float32)
    return q, d, reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64))


@pytest.mark.parametrize("dim", [128, 2560])
def test_fp32_resident_and_streamed_agree_with_float64(dim):
    """fp32 at fp32 accuracy either way (relative error <= 1e-5), near-tied rows included."""
    import cupy

    q, d, expected = near_tied_fp32(dim, (4, 32, dim), (30, 60, dim))
    for overrides in ({}, STREAM_EVERYTHING):
        with tuning.override(**overrides):
            got = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d)))
        assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


@pytest.mark.parametrize("streamed", [False, True])
def test_pairs_and_packed_fat_and_streamed(streamed):
    import cupy

    dim = 64 if streamed else 1024
    rng = np.random.default_rng(21)
    q64, d64, q, d = _inputs(rng, 6, 32, 6, 50, dim, "float16")
    q_mask, d_mask = holey_mask(rng, (6, 32)), holey_mask(rng, (6, 50))
    lengths = np.array([50, 0, 1, 17, 33, 20])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens64 = np.concatenate([d64[n, :lengths[n]] for n in range(6)])
    with tuning.override(**(STREAM_EVERYTHING if streamed else {})):
        got = cm.score_pairs(q, d, q_mask=cupy.asarray(q_mask), d_mask=cupy.asarray(d_mask))
        assert_scores_match(got, reference.maxsim_pairs_reference(q64, d64, q_mask, d_mask), atol=2e-2)
        packed = cm.score_packed(q, _to_device(tokens64, "float16"), cupy.asarray(offsets), q_mask=cupy.asarray(q_mask))
        assert_scores_match(packed, reference.maxsim_packed_reference(q64, tokens64, offsets, q_mask), atol=2e-2)
        assert np.all(to_numpy(packed)[:, 1] == -np.inf)


@pytest.mark.parametrize("dim", [64, 1024])
def test_int8_fat_and_streamed(dim):
    import cupy

    rng = np.random.default_rng(22)
    q = cupy.asarray(unit_rows(rng, (3, 32, dim), np.float32))
    d = cupy.asarray(unit_rows(rng, (7, 45, dim), np.float32))
    (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
    expected = reference.maxsim_reference(to_numpy(q8) * to_numpy(qs)[..., None], to_numpy(d8) * to_numpy(ds)[..., None])
    with tuning.override(**(STREAM_EVERYTHING if dim == 64 else {})):
        assert_scores_match(cm.score(q8, d8, q_scale=qs, d_scale=ds), expected, atol=1e-3, rtol=1e-5)
        assert_scores_match(cm.score(q8[0], d8, q_scale=qs[0], d_scale=ds), expected[0], atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("dim,wgmma", [(640, True), (640, False), (641, False)])
def test_non_finite_policy_streamed(dtype, dim, wgmma):
    """A non-finite document element makes its documents' scores NaN; a non-finite query token
    its own query's only (streaming k finds them by another road than the resident block): on
    the Hopper kernel, and on the mma.sync kernel (use_wgmma off), there with rows on 16 bytes
    and, at dim 641, on 2 (fp16: q's rows scanned in 16-bit pieces) or 4 (fp32)."""
    import cupy

    rng = np.random.default_rng(23)
    q = unit_rows(rng, (3, 32, dim), np.float32)
    d = unit_rows(rng, (4, 40, dim), np.float32)
    d[0, 5, 600] = np.nan
    d[1, 39, 0] = -np.inf
    q[1, 4, 333] = np.inf
    q[2, 7, dim - 1] = np.nan  # the last element: the partial last chunk at dim 641
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64))
    with tuning.override(use_wgmma=wgmma):
        got = to_numpy(cm.score(cupy.asarray(q.astype(dtype)), cupy.asarray(d.astype(dtype))))
    assert np.isnan(got[:, :2]).all() and np.isnan(got[1]).all() and np.isnan(got[2]).all()
    finite = np.isfinite(expected)
    assert finite.any()
    assert np.isfinite(got[finite]).all()
    assert_scores_match(got[finite], expected[finite], atol=5e-2)


# ---- Any dim and alignment (item 3): rows copied in pieces of their alignment -----------------


@pytest.fixture
def no_simt(families):
    """Fails the test if a forward took the CUDA-core kernel (its kernel is fetched per call)."""
    yield
    assert "maxsim_fwd_simt" not in families, families


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("dim", [3, 100, 101, 130, 2500])
def test_odd_dims_on_tensor_cores(dtype, dim, no_simt):
    """Dims that are no multiple of a 16-byte chunk: contiguous rows then start 2, 4 or 8 bytes
    apart from 16 (plain loads, 4- and 8-byte cp.async), and the last chunk is part zeros."""
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    _check_padded(dtype, 3, 32, 7, 70, dim, seed=dim)


def _shifted(x, elements):
    """``x``'s values in a CuPy array whose data starts ``elements`` elements past an
    allocation's start (C-contiguous: every row start moves with it)."""
    import cupy

    buffer = cupy.zeros(x.size + elements, dtype=x.dtype)
    view = buffer[elements:].reshape(x.shape)
    view[...] = cupy.asarray(x)
    return view


@pytest.mark.parametrize("dtype,shift", [("float16", 1), ("float16", 2), ("float16", 4), ("float32", 1),
                                         ("float32", 2), ("int8", 1), ("int8", 2), ("int8", 4), ("int8", 8)])
@pytest.mark.parametrize("dim", [64, 128])
def test_misaligned_rows_match_aligned_bitwise(dtype, shift, dim, no_simt):
    """Rows off 16-byte alignment score bitwise as aligned ones on the same kernel (the
    mma.sync one: tuning use_wgmma off), and match float64."""
    rng = np.random.default_rng(dim + shift)
    q = unit_rows(rng, (5, 32, dim), np.float32)
    d = unit_rows(rng, (20, 45, dim), np.float32)
    d_mask = holey_mask(rng, (20, 45), 0.7)
    import cupy

    if dtype == "int8":
        (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
        expected = reference.maxsim_reference(q8 * qs[..., None].astype(np.float64),
                                              d8 * ds[..., None].astype(np.float64), None, d_mask)
        inputs = lambda s: (_shifted(q8, s), _shifted(d8, s), dict(q_scale=cupy.asarray(qs),  # noqa: E731
                                                                   d_scale=cupy.asarray(ds)))
    else:
        q, d = q.astype(dtype), d.astype(dtype)
        expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64), None, d_mask)
        inputs = lambda s: (_shifted(q, s), _shifted(d, s), {})  # noqa: E731
    with tuning.override(use_wgmma=False):
        results = []
        for s in (0, shift):
            qs_, ds_, extra = inputs(s)
            got, winners = cm.score(qs_, ds_, d_mask=cupy.asarray(d_mask), return_argmax=True, **extra)
            results.append((to_numpy(got), to_numpy(winners)))
    np.testing.assert_array_equal(results[1][0], results[0][0])
    np.testing.assert_array_equal(results[1][1], results[0][1])
    assert_scores_match(results[1][0], expected, atol=1e-3 if dtype == "int8" else NOISE[dtype] * 32, rtol=1e-5)


@pytest.mark.parametrize("dim", [130, 2502])
def test_rows_on_4_bytes_keep_to_their_bytes(dim, families):
    """Rows of 260 bytes (fp16 dim 130; 5,004 at 2502, streaming k) start on 16, 4, 8 and 12
    bytes in turn, and come in whole 16-byte lines from where each starts (shifted rows): a
    row's first line holds the row before's last bytes, its last line would reach into the next
    row's first (cut there). Masked rows of infs on either side of real ones change nothing; in
    a packed corpus, single-token documents of NaNs (their first and last elements) beside real
    documents on either side make only their own scores NaN. One query (the mma.sync kernel),
    winners, against float64."""
    import cupy

    rng = np.random.default_rng(dim + 9)
    q = unit_rows(rng, (1, 32, dim), np.float32).astype(np.float16)
    d = unit_rows(rng, (5, 41, dim), np.float32).astype(np.float16)
    d_mask = np.ones((5, 41), bool)
    for row in (6, 7, 9):  # rows 88, 89 and 91 of the corpus: on 16 bytes, and on 4 and 12 (either order)
        d[2, row] = np.inf
        d_mask[2, row] = False
    expected = reference.maxsim_reference(q.astype(np.float64), np.where(d_mask[..., None], d, 0).astype(np.float64),
                                          None, d_mask)
    got, winners = cm.score(cupy.asarray(q), cupy.asarray(d), d_mask=cupy.asarray(d_mask), return_argmax=True)
    assert np.isfinite(to_numpy(got)).all()
    assert_scores_match(got, expected, atol=NOISE["float16"] * 32)
    tokens = unit_rows(rng, (99, dim), np.float32).astype(np.float16)
    offsets = np.array([0, 13, 14, 40, 41, 99])  # tokens 13 (on 4 bytes) and 40 (on 16) alone
    for token in (13, 40):
        tokens[token, :4] = tokens[token, -4:] = np.nan
    got = to_numpy(cm.score_packed(cupy.asarray(q), cupy.asarray(tokens), cupy.asarray(offsets)))
    for n in range(5):
        rows = tokens[offsets[n]:offsets[n + 1]].astype(np.float64)
        if n in (1, 3):
            assert np.isnan(got[0, n]), n
        else:
            want = (q[0].astype(np.float64) @ rows.T).max(axis=1).sum()
            assert np.isclose(got[0, n], want, atol=NOISE["float16"] * 32), (n, got[0, n], want)
    if _on_hopper():
        assert families and set(families) == {"maxsim_fwd"}, families


def test_views_of_wider_rows_and_strided_dims():
    """A dim cut from wider rows (16-byte row starts, a part-zero last chunk) scores bitwise as
    its contiguous copy on the same kernel; a strided dim (no unit stride) takes the CUDA
    cores and still matches float64."""
    import cupy

    rng = np.random.default_rng(31)
    q = cupy.asarray(unit_rows(rng, (4, 32, 128), np.float32).astype(np.float16))
    d = cupy.asarray(unit_rows(rng, (30, 50, 128), np.float32).astype(np.float16))
    q_cut, d_cut = q[..., :100], d[..., :100]
    expected = reference.maxsim_reference(to_numpy(q_cut).astype(np.float64), to_numpy(d_cut).astype(np.float64))
    with tuning.override(use_wgmma=False):
        cut = to_numpy(cm.score(q_cut, d_cut))
        copied = to_numpy(cm.score(cupy.ascontiguousarray(q_cut), cupy.ascontiguousarray(d_cut)))
    np.testing.assert_array_equal(cut, copied)
    assert_scores_match(cut, expected, atol=NOISE["float16"] * 32)
    q_strided, d_strided = q[..., ::2], d[..., ::2]
    expected = reference.maxsim_reference(to_numpy(q_strided).astype(np.float64),
                                          to_numpy(d_strided).astype(np.float64))
    assert_scores_match(cm.score(q_strided, d_strided), expected, atol=NOISE["float16"] * 32)


@pytest.mark.parametrize("dtype,dim", [("float16", 48), ("float16", 80), ("float16", 112), ("bfloat16", 112),
                                       ("int8", 96), ("int8", 160)])
@pytest.mark.parametrize("nq", [1, 12])
def test_odd_ksteps_on_the_hopper_kernel(dtype, dim, nq):
    """Dims of an odd number of 32-byte k-steps, padded to even for the Hopper kernel (TMA tiles
    zero-filled past the dim; cp.async where masks are): masked and not, one query and many,
    winners, against float64 (and the mma.sync kernel bitwise where the Hopper one is off)."""
    import cupy

    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(dim + nq)
    if dtype == "int8":
        q = cupy.asarray(unit_rows(rng, (nq, 32, dim), np.float32))
        d = cupy.asarray(unit_rows(rng, (40, 70, dim), np.float32))
        (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
        expected = reference.maxsim_reference(to_numpy(q8) * to_numpy(qs)[..., None],
                                              to_numpy(d8) * to_numpy(ds)[..., None])
        got = cm.score(q8, d8, q_scale=qs, d_scale=ds)
        assert_scores_match(got, expected, atol=1e-3, rtol=1e-5)
        return
    _check_padded(dtype, nq, 32, 9, 70, dim, seed=dim * 3 + nq)
    q64, d64, q, d = _inputs(rng, nq, 32, 40, 70, dim, dtype)
    got = cm.score(q, d)
    assert_scores_match(got, reference.maxsim_reference(q64, d64), atol=NOISE[dtype] * 32)


def _spy_on_kernels(monkeypatch, record):
    """Calls ``record(family, defines)`` for every kernel the forwards fetch (plans and replays
    emptied first, so that each new plan fetches its kernel); returns the list it fills."""
    from cupy_maxsim import _forward, _replay
    from cupy_maxsim._gpu import compile as gpu_compile

    _forward._plans.clear()
    _replay.replays.clear()
    fetch, seen = gpu_compile.get_kernel, []

    def spy(device, family, name, defines=(), *args, **kwargs):
        seen.extend(record(family, defines))
        return fetch(device, family, name, defines, *args, **kwargs)

    monkeypatch.setattr(gpu_compile, "get_kernel", spy)
    return seen


@pytest.fixture
def families(monkeypatch):
    """The kernel families the forwards of a test fetch."""
    return _spy_on_kernels(monkeypatch, lambda family, defines: [family])


@pytest.fixture
def configs(monkeypatch):
    """The defines (as a dict) of the Hopper builds the forwards of a test fetch."""
    return _spy_on_kernels(monkeypatch, lambda family, defines: [dict(d[len("-D"):].split("=", 1) for d in defines)]
                           if family == "maxsim_fwd_wgmma" else [])


def _on_hopper() -> bool:
    import cupy

    from cupy_maxsim._gpu.device import device_properties

    return device_properties(cupy.cuda.runtime.getDevice())[3] == 90


@pytest.mark.parametrize("dtype,shift", [("float16", 2), ("float16", 4), ("int8", 4), ("int8", 8)])
@pytest.mark.parametrize("nq", [1, 3, 12])  # split documents, queries on M, documents on M
def test_rows_off_16_bytes_on_the_hopper_kernel(dtype, shift, nq, families):
    """Rows whose starts sit on 4 or 8 bytes take the Hopper kernel's cp.async pieces (several
    queries; one query keeps mma.sync) and score bitwise as the same rows on 16 bytes (TMA),
    winners too, masked and not; and match float64."""
    import cupy

    rng = np.random.default_rng(nq * 10 + shift)
    q = unit_rows(rng, (nq, 32, 128), np.float32)
    d = unit_rows(rng, (20, 45, 128), np.float32)
    d_mask = holey_mask(rng, (20, 45), 0.7)
    extra = {}
    if dtype == "int8":
        (q, qs), (d, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
        extra = dict(q_scale=cupy.asarray(qs), d_scale=cupy.asarray(ds))
        expected = reference.maxsim_reference(q * qs[..., None].astype(np.float64),
                                              d * ds[..., None].astype(np.float64), None, d_mask)
    else:
        q, d = q.astype(dtype), d.astype(dtype)
        expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64), None, d_mask)
    results = []
    for s in (0, shift):
        for mask in (None, cupy.asarray(d_mask)):
            got, winners = cm.score(_shifted(q, s), _shifted(d, s), d_mask=mask, return_argmax=True, **extra)
            results.append((to_numpy(got), to_numpy(winners)))
    if nq > 1:  # the same kernel both ways: bitwise
        for aligned, shifted in zip(results[:2], results[2:]):
            np.testing.assert_array_equal(shifted[0], aligned[0])
            np.testing.assert_array_equal(shifted[1], aligned[1])
    for got in (results[1][0], results[3][0]):
        assert_scores_match(got, expected, atol=1e-3 if dtype == "int8" else NOISE[dtype] * 32, rtol=1e-5)
    if _on_hopper():  # one query's split rings keep 16-byte rows (forward.choose_kernel): the
        # shifted rows take mma.sync there, the aligned ones the Hopper kernel
        assert set(families) == ({"maxsim_fwd_wgmma"} if nq > 1 else {"maxsim_fwd_wgmma", "maxsim_fwd"}), families


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
@pytest.mark.parametrize("nq", [1, 12])
def test_dim_100_on_the_hopper_kernel(dtype, nq, families):
    """dim 100: contiguous rows of 200 bytes (16-bit; int8 100) start on 8 (4) bytes, and the last
    chunk is part zeros: cp.async pieces on the Hopper kernel (12 queries; one query takes
    mma.sync), bitwise as the same rows cut from
    wider 16-byte rows (TMA, zeros past the dim), and against float64."""
    import cupy

    if dtype == "bfloat16":
        pytest.importorskip("torch")
    rng = np.random.default_rng(100 + nq)
    q = cupy.asarray(unit_rows(rng, (nq, 32, 128), np.float32))
    d = cupy.asarray(unit_rows(rng, (30, 50, 128), np.float32))
    d_mask = cupy.asarray(holey_mask(rng, (30, 50), 0.7))
    if dtype == "int8":
        (q8, qs), (d8, ds) = cm.quantize_int8(q[..., :100]), cm.quantize_int8(d[..., :100])
        wide_q, wide_d = cupy.zeros((nq, 32, 128), cupy.int8), cupy.zeros((30, 50, 128), cupy.int8)
        wide_q[..., :100], wide_d[..., :100] = q8, d8
        cut, contiguous = (wide_q[..., :100], wide_d[..., :100]), (q8, d8)
        extra = dict(q_scale=qs, d_scale=ds)
        expected = reference.maxsim_reference(to_numpy(q8) * to_numpy(qs)[..., None].astype(np.float64),
                                              to_numpy(d8) * to_numpy(ds)[..., None].astype(np.float64), None,
                                              to_numpy(d_mask))
        atol = 1e-3
    else:
        if dtype == "bfloat16":
            import torch

            q, d = torch.as_tensor(q, device="cuda").bfloat16(), torch.as_tensor(d, device="cuda").bfloat16()
        else:
            q, d = q.astype(dtype), d.astype(dtype)
        cut = (q[..., :100], d[..., :100])
        contiguous = tuple(x.contiguous() if dtype == "bfloat16" else cupy.ascontiguousarray(x) for x in cut)
        extra = {}
        expected = reference.maxsim_reference(*(to_numpy(x).astype(np.float64) for x in cut), None, to_numpy(d_mask))
        atol = NOISE[dtype] * 32
    mask = _like(contiguous[0], to_numpy(d_mask).astype(bool))
    got_cut, winners_cut = cm.score(*cut, d_mask=mask, return_argmax=True, **extra)
    got, winners = cm.score(*contiguous, d_mask=mask, return_argmax=True, **extra)
    if nq > 1:  # the same kernel both ways: bitwise
        np.testing.assert_array_equal(to_numpy(got), to_numpy(got_cut))
        np.testing.assert_array_equal(to_numpy(winners), to_numpy(winners_cut))
    assert_scores_match(got, expected, atol=atol, rtol=1e-5)
    assert_scores_match(got_cut, expected, atol=atol, rtol=1e-5)
    if _on_hopper():  # one query: the cut rows on the Hopper kernel, the contiguous on mma.sync
        assert set(families) == ({"maxsim_fwd_wgmma"} if nq > 1 else {"maxsim_fwd_wgmma", "maxsim_fwd"}), families


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dim", [136, 320, 1000, 2560])
def test_one_query_streams_k_on_the_hopper_kernel(dtype, dim, families):
    """One query at dims past 8 resident k-steps: the documents' atoms stream through the split
    rings (a part-zero last atom at 136 and 1000), masked (cp.async) and not (TMA), winners,
    an empty document, bitwise reproducible, against float64."""
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    _check_padded(dtype, 1, 32, 7, 150, dim, seed=dim)
    rng = np.random.default_rng(dim)
    q64, d64, q, d = _inputs(rng, 1, 32, 11, 130, dim, dtype)
    assert_scores_match(cm.score(q, d), reference.maxsim_reference(q64, d64), atol=NOISE[dtype] * 32)
    if _on_hopper():
        assert families and set(families) == {"maxsim_fwd_wgmma"}, families


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("nq, lq, dim", [(1, 32, 2080), (1, 31, 2560), (2, 16, 4104), (1, 27, 8192)])
def test_one_query_streams_its_atoms_too(dtype, nq, lq, dim, configs):
    """One query group at dims past 128 k-steps: the query's atoms ride in the split rings'
    slots beside the documents' (one box of the group's rows by TMA from q; the slot's rows past
    it stale, read as zeros): 31 and 27 tokens (a box short of the slot's 32 rows), two queries
    of 16 tokens in one box, a part-zero last atom (4104), fp16 dim 8192 (the largest), masks,
    winners, an empty document, bitwise reproducible, against float64."""
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    _check_padded(dtype, nq, lq, 7, 150, dim, seed=dim + lq)
    if _on_hopper():
        assert configs and all(c.get("MAXSIM_SPLIT_DOCS") == c.get("MAXSIM_STREAM_QUERY") == "1" for c in configs), configs


@pytest.mark.parametrize("nq, lq, dim", [(1, 32, 2080), (1, 27, 2560), (2, 16, 4088)])
def test_fp32_one_query_streams_its_atoms_too(nq, lq, dim, configs):
    """fp32 at fp32 accuracy, one query group past 128 k-steps (dim 1024): the query's atoms
    ride in the slots beside the documents' (its TF32 halves split in registers as they are
    read), masks, winners, an empty document, bitwise reproducible, within 1e-5 of float64
    (near-tied rows too). (Precision "high" at these dims: test_fp32_one_query_at_precision_high.)"""
    import cupy

    _check_padded("float32", nq, lq, 7, 150, dim, seed=dim + lq)
    q, d, expected = near_tied_fp32(dim, (nq, lq, dim), (9, 60, dim))
    got = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d)))
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    if _on_hopper():
        assert configs and all(c.get("MAXSIM_TF32") == "1" and c.get("MAXSIM_STREAM_QUERY") == "1"
                               for c in configs), configs


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_one_query_streamed_atoms_non_finite(dtype, configs):
    """The query's atoms streamed (unstaged, so nothing zeroes them in shared memory; fp32: the
    TF32 build splitting them as read): a non-finite real token makes its own query's scores
    NaN and not its neighbour's in the same box (its fragments are zeros, so the document
    witness stays finite), a masked one changes nothing, and a non-finite document element
    makes its document's scores NaN for both."""
    import cupy

    rng = np.random.default_rng(31 if dtype == "float16" else 32)
    q = unit_rows(rng, (2, 16, 2560), np.float32)
    d = unit_rows(rng, (4, 90, 2560), np.float32)
    q_mask = np.ones((2, 16), bool)
    q[1, 5, 2000] = np.inf  # a real token: query 1's scores NaN
    q[0, 9, 7] = np.nan  # a masked token: nothing
    q_mask[0, 9] = False
    d[2, 70, 1500] = -np.inf  # a real row of the second tile: document 2's scores NaN
    expected = reference.maxsim_reference(np.nan_to_num(q).astype(np.float64), d.astype(np.float64), q_mask)
    got = to_numpy(cm.score(cupy.asarray(q.astype(dtype)), cupy.asarray(d.astype(dtype)),
                            q_mask=cupy.asarray(q_mask)))
    nan = np.zeros(got.shape, bool)
    nan[1, :] = nan[:, 2] = True
    assert np.isnan(got[nan]).all() and not np.isnan(got[~nan]).any()
    if dtype == "float32":  # fp32 accuracy
        assert np.abs(got[~nan] - expected[~nan]).max() <= 1e-5 * np.abs(expected[~nan]).max()
    else:
        assert_scores_match(got[~nan], expected[~nan], atol=NOISE["float16"] * 32)
    if _on_hopper():
        assert configs and all(c.get("MAXSIM_SPLIT_DOCS") == c.get("MAXSIM_STREAM_QUERY") == "1" for c in configs), configs
        assert all(c.get("MAXSIM_TF32") == ("1" if dtype == "float32" else None) for c in configs), configs


@pytest.mark.parametrize("dim", [320, 2560, 5120])
def test_one_query_streams_k_int8_and_packed(dim, families):
    """int8 (its scales in a tile's last slot) and a packed corpus (tiles that start anywhere,
    empty documents) through the Hopper kernel's streamed atoms, with winners."""
    import cupy

    rng = np.random.default_rng(dim + 1)
    q = cupy.asarray(unit_rows(rng, (1, 32, dim), np.float32))
    d = cupy.asarray(unit_rows(rng, (9, 140, dim), np.float32))
    d_mask = holey_mask(rng, (9, 140), 0.7)
    (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
    expected = reference.maxsim_reference(to_numpy(q8) * to_numpy(qs)[..., None], to_numpy(d8) * to_numpy(ds)[..., None],
                                          None, d_mask)
    for mask in (None, cupy.asarray(d_mask)):
        got, winners = cm.score(q8, d8, q_scale=qs, d_scale=ds, d_mask=mask, return_argmax=True)
        if mask is not None:
            assert_scores_match(got, expected, atol=1e-3, rtol=1e-5)
    tokens = cupy.asarray(unit_rows(rng, (700, dim), np.float32)).astype(cupy.float16)
    offsets = cupy.asarray([0, 65, 65, 300, 301, 700], dtype=cupy.int64)
    got, winners = cm.score_packed(q.astype(cupy.float16), tokens, offsets, return_argmax=True)
    t64, q64 = to_numpy(tokens), to_numpy(q.astype(cupy.float16))
    bounds = to_numpy(offsets).astype(int)
    for n in range(5):
        rows = t64[bounds[n]:bounds[n + 1]]
        want = -np.inf if len(rows) == 0 else (q64[0] @ rows.T).max(axis=1).sum()
        assert np.isclose(to_numpy(got)[0, n], want, atol=NOISE["float16"] * 32) or want == to_numpy(got)[0, n]
    if _on_hopper():
        assert families and set(families) == {"maxsim_fwd_wgmma"}, families


def _docs_on_m_streamed(configs) -> bool:
    return bool(configs) and all(c.get("MAXSIM_DOCS_ON_M") == "1" and c.get("MAXSIM_STREAM_K") == "1" for c in configs)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dim", [136, 200, 256, 320])
def test_many_queries_stream_k_with_documents_on_m(dtype, dim, configs):
    """Many queries at dims past 8 resident k-steps (documents on M): the documents' atoms
    stream past the warpgroups' resident query blocks (a part-zero last atom at 136 and 200),
    masked and not, winners, an empty document, rows on 4 bytes (cp.async pieces) bitwise as on
    16 (TMA), bitwise reproducible, against float64."""
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    _check_padded(dtype, 12, 32, 7, 150, dim, seed=dim)
    rng = np.random.default_rng(dim)
    q64, d64, q, d = _inputs(rng, 12, 32, 11, 130, dim, dtype)
    got, winners = cm.score(q, d, return_argmax=True)
    assert_scores_match(got, reference.maxsim_reference(q64, d64), atol=NOISE[dtype] * 32)
    if dtype == "float16":
        shifted, shifted_winners = cm.score(_shifted(q, 2), _shifted(d, 2), return_argmax=True)
        np.testing.assert_array_equal(to_numpy(shifted), to_numpy(got))
        np.testing.assert_array_equal(to_numpy(shifted_winners), to_numpy(winners))
    if _on_hopper():
        assert _docs_on_m_streamed(configs), configs


def _check_int8_and_packed(rng, dim, docs, tokens, offsets):
    """8 int8 queries of 32 tokens against ``docs`` (shape) int8 documents, masked and not, and
    fp16 queries against ``tokens`` packed fp16 tokens at ``offsets``, against float64."""
    import cupy

    q = cupy.asarray(unit_rows(rng, (8, 32, dim), np.float32))
    d = cupy.asarray(unit_rows(rng, docs + (dim,), np.float32))
    d_mask = holey_mask(rng, docs, 0.7)
    (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
    q_ref, d_ref = to_numpy(q8) * to_numpy(qs)[..., None], to_numpy(d8) * to_numpy(ds)[..., None]
    got, winners = cm.score(q8, d8, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(d_mask), return_argmax=True)
    assert_scores_match(got, reference.maxsim_reference(q_ref, d_ref, None, d_mask), atol=1e-3, rtol=1e-5)
    assert_scores_match(cm.score(q8, d8, q_scale=qs, d_scale=ds), reference.maxsim_reference(q_ref, d_ref),
                        atol=1e-3, rtol=1e-5)
    tokens = cupy.asarray(unit_rows(rng, (tokens, dim), np.float32)).astype(cupy.float16)
    offsets = cupy.asarray(offsets, dtype=cupy.int64)
    q16 = q.astype(cupy.float16)
    got = to_numpy(cm.score_packed(q16, tokens, offsets))
    t64, q64, bounds = to_numpy(tokens).astype(np.float64), to_numpy(q16).astype(np.float64), to_numpy(offsets).astype(int)
    for n in range(len(bounds) - 1):
        rows = t64[bounds[n]:bounds[n + 1]]
        want = np.full(8, -np.inf) if len(rows) == 0 else np.einsum("qtd,jd->qtj", q64, rows).max(-1).sum(-1)
        assert_scores_match(got[:, n], want, atol=NOISE["float16"] * 32)


@pytest.mark.parametrize("dim", [320, 640])
def test_many_queries_stream_k_int8_and_packed(dim, configs):
    """int8 (its scales in a tile's last slot; past 256 dims converted by I2F) and a packed
    corpus (tiles that start anywhere, empty documents) with documents on M streaming k."""
    _check_int8_and_packed(np.random.default_rng(dim + 2), dim, (9, 140), 700, [0, 65, 65, 300, 301, 700])
    if _on_hopper():
        assert _docs_on_m_streamed(configs), configs


def _queries_streamed(configs) -> bool:
    # (1: boxes of whole groups; 2: the build keeping boxes within q, for other query counts)
    return _docs_on_m_streamed(configs) and all(c.get("MAXSIM_STREAM_QUERY") in ("1", "2") for c in configs)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("dim", [384, 1000, 2560])
def test_many_queries_stream_queries_too(dtype, dim, configs):
    """Many queries at dims whose query blocks do not fit (documents on M, the query atoms
    streamed beside the documents' by TMA from q): a part-zero last atom (1000), queries of 27
    tokens (a box of 108 rows: the rest of the slot's rows stale, their columns unread), a last
    warpgroup with fewer queries, masks, winners, an empty document, against float64, bitwise
    reproducible (_check_padded); then 12 and 16 queries of 32 tokens unmasked (the build keeping
    boxes within q, and whole groups' plain one). 64-row tiles, even where the tunables ask for
    128, but for 16-bit dims from Tunables.wgmma_docs_on_m_halves_ksteps on (2560: 128 document
    rows a slot, M_HALVES)."""
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    with tuning.override(wgmma_tile_rows=128):
        _check_padded(dtype, 10, 27, 7, 150, dim, seed=dim + 5)
        rng = np.random.default_rng(dim)
        for num_queries in (12, 16):
            q64, d64, q, d = _inputs(rng, num_queries, 32, 11, 130, dim, dtype)
            assert_scores_match(cm.score(q, d), reference.maxsim_reference(q64, d64), atol=NOISE[dtype] * 32)
    if _on_hopper():
        assert _queries_streamed(configs), configs
        assert {c["MAXSIM_STREAM_QUERY"] for c in configs} == {"1", "2"}, configs
        halves = 0 < tuning.current().wgmma_docs_on_m_halves_ksteps <= dim * 2 // 32
        assert {c.get("MAXSIM_TILE_N") for c in configs} == {"128" if halves else "64"}, configs


def test_many_queries_stream_queries_non_finite(configs):
    """Streaming the query atoms, nothing zeroes a query row: a non-finite real query token
    makes its own query's scores NaN, a non-finite masked one changes nothing, and a non-finite
    document element makes its document's scores NaN for every query, in its first tile or a
    later one: all found through the similarities (NaN-propagating maxima), even an -inf
    element whose similarities are all -inf (every query's element there positive), which a
    max alone would pass over."""
    import cupy

    rng = np.random.default_rng(29)
    q = unit_rows(rng, (9, 32, 768), np.float32)
    d = unit_rows(rng, (5, 130, 768), np.float32)
    q_mask = np.ones((9, 32), bool)
    d_mask = np.ones((5, 130), bool)
    q[2, 7, 700] = np.inf  # a real token: query 2's scores NaN
    q[5, 3, 10] = np.nan  # a masked token: nothing
    q_mask[5, 3] = False
    d[1, 60, 5] = np.nan  # a real row: document 1's scores NaN
    d[3, 20, 400] = np.inf  # a masked row: nothing
    d_mask[3, 20] = False
    d[4, 100, 9] = -np.inf  # a real row of the second tile: document 4's scores NaN ...
    q[..., 9] = np.abs(q[..., 9]) + 1e-2  # (... though its similarities are all -inf)
    d[0, 72, 11] = np.nan  # a masked one: nothing
    d_mask[0, 72] = False
    expected = reference.maxsim_reference(np.nan_to_num(q).astype(np.float64), np.nan_to_num(d).astype(np.float64),
                                          q_mask, d_mask)
    got = to_numpy(cm.score(cupy.asarray(q.astype(np.float16)), cupy.asarray(d.astype(np.float16)),
                            q_mask=cupy.asarray(q_mask), d_mask=cupy.asarray(d_mask)))
    nan = np.zeros(got.shape, bool)
    nan[2, :] = nan[:, 1] = nan[:, 4] = True
    assert np.isnan(got[nan]).all() and not np.isnan(got[~nan]).any()
    assert_scores_match(got[~nan], expected[~nan], atol=NOISE["float16"] * 32)
    if _on_hopper():
        assert _queries_streamed(configs), configs


@pytest.mark.parametrize("dim", [1024, 4096])
def test_many_queries_stream_queries_int8_and_packed(dim, configs):
    """int8 (scales per row of the streamed query atoms, 2048 and 8192-byte rows converted by
    I2F) masked and not, and a packed fp16 corpus, the query atoms streamed."""
    _check_int8_and_packed(np.random.default_rng(dim + 3), dim, (6, 90), 400, [0, 65, 65, 300, 301, 400])
    if _on_hopper():
        assert _queries_streamed(configs), configs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("nq, dim", [(2, 320), (3, 320), (4, 2560), (3, 1000), (6, 768)])
def test_few_queries_at_fat_dims_on_documents_on_m(dtype, nq, dim, configs):
    """Two to four queries of 32 tokens at fat dims (too few rows for documents on M's two
    warpgroups, too many for one query's split rings) on documents on M all the same: the
    second warpgroup's rows (none of them a query's at 2 and 3 queries) read nothing; a box of
    q's map holds 2 or 3 queries where there are no more (past 768: streamed), and at 6 queries
    the second warpgroup's box starts back over two of the first's (no box reaches past q). Masks,
    winners, an empty document against float64, bitwise reproducible; int8 at twice the dim
    (its rows of the same bytes), masked."""
    import cupy

    if dtype == "bfloat16":
        pytest.importorskip("torch")
    _check_padded(dtype, nq, 32, 7, 150, dim, seed=nq * dim)
    if dtype == "float16":
        rng = np.random.default_rng(nq + dim)
        q = cupy.asarray(unit_rows(rng, (nq, 32, 2 * dim), np.float32))
        d = cupy.asarray(unit_rows(rng, (6, 90, 2 * dim), np.float32))
        d_mask = holey_mask(rng, (6, 90), 0.7)
        (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
        q_ref, d_ref = to_numpy(q8) * to_numpy(qs)[..., None], to_numpy(d8) * to_numpy(ds)[..., None]
        got = cm.score(q8, d8, q_scale=qs, d_scale=ds, d_mask=cupy.asarray(d_mask))
        assert_scores_match(got, reference.maxsim_reference(q_ref, d_ref, None, d_mask), atol=1e-3, rtol=1e-5)
    if _on_hopper():
        assert _docs_on_m_streamed(configs), configs
        assert {c.get("MAXSIM_WARPGROUPS") for c in configs} == {"2"}, configs


def test_many_queries_stream_queries_training_step():
    """A torch training step at a fat dim (the forward with winners replayed after the first
    step, q's map rebuilt for each new q), gradients against float64."""
    torch = pytest.importorskip("torch")
    import cupy_maxsim.torch as cmt

    gen = torch.Generator(device="cuda").manual_seed(5)
    for step in range(3):
        q = torch.randn(8, 32, 768, device="cuda", generator=gen).half().requires_grad_()
        d = torch.randn(6, 60, 768, device="cuda", generator=gen).half().requires_grad_()
        weights = torch.randn(8, 6, device="cuda", generator=gen)
        (cmt.maxsim(q, d) * weights).sum().backward()
        q64, d64 = q.detach().double().requires_grad_(), d.detach().double().requires_grad_()
        sims = torch.einsum("qtk,njk->qntj", q64, d64)
        (sims.max(-1).values.sum(-1) * weights.double()).sum().backward()
        torch.testing.assert_close(q.grad.double(), q64.grad, atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(d.grad.double(), d64.grad, atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("dim", [64, 128, 200, 256, 1000])
def test_fp32_one_query_on_the_hopper_kernel(dim, families):
    """fp32, one query: the Hopper kernel's TF32 builds (big and small halves of both operands,
    the document's split in shared memory) at fp32 accuracy against float64: masks (cp.async)
    and not (TMA), winners, an empty document, near-ties, a packed corpus, bitwise
    reproducible; a part-zero last atom at 200 and 1000."""
    import cupy

    _check_padded("float32", 1, 32, 7, 150, dim, seed=dim + 5)
    q, d, expected = near_tied_fp32(dim, (1, 32, dim), (13, 130, dim))
    got = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d)))
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    tokens = d.reshape(-1, dim)[:900]
    offsets = np.array([0, 65, 65, 300, 301, 900])
    got = to_numpy(cm.score_packed(cupy.asarray(q), cupy.asarray(tokens), cupy.asarray(offsets)))
    for n in range(5):
        rows = tokens[offsets[n]:offsets[n + 1]].astype(np.float64)
        want = -np.inf if len(rows) == 0 else (q[0].astype(np.float64) @ rows.T).max(axis=1).sum()
        assert got[0, n] == want or abs(got[0, n] - want) <= 1e-5 * abs(want)
    if _on_hopper():
        assert families and set(families) == {"maxsim_fwd_wgmma"}, families


def test_fp32_one_query_non_finite_on_the_hopper_kernel(families):
    """The TF32 builds keep the non-finite policy: a NaN or inf document element makes its
    documents' scores NaN, a non-finite query token its own query's."""
    import cupy

    rng = np.random.default_rng(29)
    q = unit_rows(rng, (1, 32, 128), np.float32)
    d = unit_rows(rng, (4, 40, 128), np.float32)
    d[0, 5, 100] = np.nan
    d[1, 39, 0] = -np.inf
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64))
    got = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d)))
    assert np.isnan(got[:, :2]).all()
    assert_scores_match(got[:, 2:], expected[:, 2:], atol=1e-5)
    q[0, 4, 3] = np.inf
    assert np.isnan(to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d)))).all()
    if _on_hopper():
        assert set(families) == {"maxsim_fwd_wgmma"}, families


@pytest.mark.parametrize("dim", [128, 1000, 2560])  # 2560: the query's atoms streamed too
def test_fp32_one_query_at_precision_high(dim, families):
    """float32_matmul_precision("high"): one fp32 query reads the documents as TF32 (within
    2^-10 of each element: |error| <= 2^-9 sum |q||d| a token pair), masks and winners as ever;
    the default stays within 1e-5."""
    import cupy

    rng = np.random.default_rng(dim + 7)
    q = unit_rows(rng, (1, 32, dim), np.float32)
    d = unit_rows(rng, (9, 140, dim), np.float32)
    d_mask = holey_mask(rng, (9, 140), 0.7)
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64), None, d_mask)
    bound = 2.0 ** -9 * reference.maxsim_reference(np.abs(q).astype(np.float64), np.abs(d).astype(np.float64))
    with tuning.float32_matmul_precision("high"):
        got, winners = cm.score(cupy.asarray(q), cupy.asarray(d), d_mask=cupy.asarray(d_mask), return_argmax=True)
    got = to_numpy(got)
    finite = np.isfinite(expected)
    assert np.all(np.abs(got[finite] - expected[finite]) <= bound[finite] + 1e-6)
    assert np.array_equal(np.isfinite(got), finite)
    exact = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d), d_mask=cupy.asarray(d_mask)))
    assert np.abs(exact[finite] - expected[finite]).max() <= 1e-5 * np.abs(expected[finite]).max()
    if _on_hopper():
        assert set(families) == {"maxsim_fwd_wgmma"}, families


@pytest.mark.parametrize("nq, lq, dim", [(9, 32, 48), (5, 32, 64), (2, 32, 96), (9, 32, 128), (40, 16, 160),
                                         (3, 31, 320), (9, 32, 1000)])
def test_fp32_many_queries_at_precision_high(nq, lq, dim, configs):
    """float32_matmul_precision("high") with several queries on Hopper: documents on M with both
    operands read as TF32 (|error| <= 2^-9 sum |q||d| a token pair, as one query's bound),
    resident query blocks (dims 48, 64), streamed documents (96-160) and streamed query atoms
    (320, 1000), 2 to 40 queries (a group's last box short at 3, 9 and 40), masks, winners,
    packed documents with an empty one; "highest" stays within 1e-5 of float64."""
    import cupy

    rng = np.random.default_rng(dim + nq)
    q = unit_rows(rng, (nq, lq, dim), np.float32)
    d = unit_rows(rng, (7, 90, dim), np.float32)
    q_mask, d_mask = holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (7, 90), 0.7)
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64), q_mask, d_mask)
    bound = 2.0 ** -9 * reference.maxsim_reference(np.abs(q).astype(np.float64), np.abs(d).astype(np.float64),
                                                   q_mask, d_mask)
    finite = np.isfinite(expected)
    masks = dict(q_mask=cupy.asarray(q_mask), d_mask=cupy.asarray(d_mask))
    with tuning.float32_matmul_precision("high"):
        got, winners = cm.score(cupy.asarray(q), cupy.asarray(d), **masks, return_argmax=True)
        got = to_numpy(got)
        assert np.array_equal(np.isfinite(got), finite)
        assert np.all(np.abs(got[finite] - expected[finite]) <= bound[finite] + 1e-6)
        # Winners reach the max up to the bound; -1 exactly where no token can win.
        ref_winners = reference.maxsim_argmax_reference(q.astype(np.float64), d.astype(np.float64), q_mask, d_mask)
        winners = to_numpy(winners).astype(np.int64)
        np.testing.assert_array_equal(winners < 0, ref_winners < 0)
        sims = np.where(d_mask[None, :, None, :], np.einsum("qtd,njd->qntj", q.astype(np.float64),
                                                            d.astype(np.float64)), -np.inf)
        chosen = np.take_along_axis(sims, np.maximum(winners, 0)[..., None], axis=-1)[..., 0]
        real = ref_winners >= 0  # (unit rows: each of the two similarities within 2^-9 of its TF32 value)
        assert np.all(sims.max(-1)[real] - chosen[real] <= 2.0 ** -8)
        again = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d), **masks))
        np.testing.assert_array_equal(got, again)  # bitwise reproducible
        lengths = np.array([90, 0, 1, 33, 64, 65, 20])
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        tokens = np.concatenate([d[n, :lengths[n]] for n in range(7)])
        packed = to_numpy(cm.score_packed(cupy.asarray(q), cupy.asarray(tokens), cupy.asarray(offsets),
                                          q_mask=masks["q_mask"]))
        packed_expected = reference.maxsim_packed_reference(q.astype(np.float64), tokens.astype(np.float64), offsets,
                                                            q_mask)
        packed_bound = 2.0 ** -9 * reference.maxsim_packed_reference(np.abs(q).astype(np.float64),
                                                                     np.abs(tokens).astype(np.float64), offsets, q_mask)
        real = np.isfinite(packed_expected)
        assert np.array_equal(np.isfinite(packed), real)
        assert np.all(np.abs(packed[real] - packed_expected[real]) <= packed_bound[real] + 1e-6)
    exact = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d), **masks))
    assert np.abs(exact[finite] - expected[finite]).max() <= 1e-5 * np.abs(expected[finite]).max()
    if _on_hopper():
        high = [c for c in configs if c.get("MAXSIM_TF32") == "2"]
        assert high and all(c.get("MAXSIM_DOCS_ON_M") == "1" for c in high), configs
