"""fp32 at fp32 accuracy for several queries on Hopper as three fp16 products (the Hopper
kernel's split build, Tunables.wgmma_fp32_split): the queries' split (maxsim_quantize.cu
split_rows) bit for bit against NumPy's (bench/split_study.py's arithmetic), and the scores
against float64 within the fp32 line (1e-5 of the largest score) and against the 3xTF32 path:
masks, winners, packed documents with an empty one, non-finite tokens, wide magnitudes, rows off
16 bytes and strided rows, bitwise reproducible."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference, tuning
from support import holey_mask, to_numpy, unit_rows
from test_no_cliffs import _on_hopper, _spy_on_kernels

pytestmark = pytest.mark.gpu

#: The staged build (the producer splits float32 documents) and the presplit one
#: (Tunables.wgmma_fp32_presplit: documents split by a launch, read by TMA).
SPLIT = dict(wgmma_fp32_split=True, wgmma_fp32_presplit=False)
PRESPLIT = dict(wgmma_fp32_split=True, wgmma_fp32_presplit=True)


@pytest.fixture
def builds(monkeypatch):
    """The names of the Hopper builds the forwards of a test fetch (MAXSIM_FP32_SPLIT 1: "split",
    2: "presplit", or the family)."""
    names = {"-DMAXSIM_FP32_SPLIT=1": "split", "-DMAXSIM_FP32_SPLIT=2": "presplit"}
    return _spy_on_kernels(monkeypatch, lambda family, defines: [
        next((names[d] for d in defines if d in names), family)] if family.startswith("maxsim_fwd") else [])


def numpy_exponents(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """codecs.cuh split_exponent in NumPy: per token k (2^k brings its largest |x| into
    [2^14, 2^15), k <= 126; 0 for a zero token or one holding NaN or inf), and whether it holds
    NaN or inf."""
    magnitude = np.abs(rows.astype(np.float64)).max(axis=1) if rows.shape[1] else np.zeros(len(rows))
    bad = ~np.isfinite(magnitude)
    _, exponent = np.frexp(np.where(bad, 0.0, magnitude))
    return np.where((magnitude == 0) | bad, 0, np.minimum(15 - exponent, 126)), bad


def numpy_split(rows: np.ndarray, mask, documents: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """split_rows in NumPy: per token 2^k (its largest |x| in [2^14, 2^15), k <= 126), fp16 big
    and small halves of x 2^k laid out per 64 elements as [big, big, small] (``documents``:
    [big, small], the kernel reading big twice); scales 2^-k, NaN for a token holding NaN or inf
    (its halves zeros), 0 for a masked one (zeros; documents: 1)."""
    count, dim = rows.shape
    atoms = -(-dim // 64)
    real = np.ones(count, bool) if mask is None else mask.astype(bool)
    k, bad = numpy_exponents(rows)
    k = np.where(real, k, 0)
    y = np.zeros((count, 64 * atoms), np.float32)
    y[:, :dim] = np.where((bad | ~real)[:, None], 0.0, rows.astype(np.float64) * np.ldexp(1.0, k)[:, None])
    big = y.astype(np.float16)
    small = (y - big.astype(np.float32)).astype(np.float16)
    big, small = big.reshape(count, atoms, 64), small.reshape(count, atoms, 64)
    parts = [big, small] if documents else [big, big, small]
    halves = np.stack(parts, axis=2).reshape(count, 64 * len(parts) * atoms).view(np.uint16)
    scales = np.where(bad, np.nan, np.ldexp(1.0, -k)).astype(np.float32)
    return halves, np.where(real, scales, np.float32(1 if documents else 0))


@pytest.mark.parametrize("dim", [1, 63, 64, 100, 130, 320, 1028])  # (vectors: two rows side by side, several held, one, re-read)
def test_split_queries_match_numpy(dim):
    import cupy

    from cupy_maxsim._gpu.launch import split_queries

    rng = np.random.default_rng(dim)
    rows = (rng.standard_normal((70, dim)) * 10.0 ** rng.uniform(-30, 30, (70, 1))).astype(np.float32)
    rows[3] = 0.0
    rows[5, dim // 2] = np.nan
    rows[6, 0] = np.inf
    rows[7] = np.float32(1e-40)  # subnormal: the exponent's cap
    mask = rng.random(70) < 0.8
    mask[5] = mask[6] = True
    for m in (None, mask):
        halves, scales = split_queries(cupy.asarray(rows), None if m is None else cupy.asarray(m))
        want_halves, want_scales = numpy_split(rows, m)
        np.testing.assert_array_equal(halves.get(), want_halves)
        np.testing.assert_array_equal(scales.get(), want_scales)


def _documents(dim: int):
    """7 documents of 11 float32 rows of magnitudes 10^-30 to 10^30 (a zero row, real rows
    holding NaN and -inf, a subnormal one, a masked one holding NaN, which does not count), their
    mask, and on the GPU: a strided view of them ((doc, row) strides 13 (D + 3), D + 3), its
    strides in elements, and the mask in a wider array (its row stride 12)."""
    import cupy

    rng = np.random.default_rng(dim)
    docs = (rng.standard_normal((7, 11, dim)) * 10.0 ** rng.uniform(-30, 30, (7, 11, 1))).astype(np.float32)
    docs[0, 3] = 0.0
    docs[1, 5, dim // 2] = np.nan
    docs[2, 6, 0] = -np.inf
    docs[3, 7] = np.float32(1e-40)
    mask = rng.random((7, 11)) < 0.8
    mask[1, 5] = mask[2, 6] = True
    mask[4, 2], docs[4, 2, 0] = False, np.nan
    wide = cupy.zeros((9, 13, dim + 3), cupy.float32)
    wide[:7, :11, :dim] = cupy.asarray(docs)
    view = wide[:7, :11, :dim]
    masks = cupy.zeros((7, 12), bool)
    masks[:, :11] = cupy.asarray(mask)
    return docs, mask, view, (view.strides[0] // 4, view.strides[1] // 4), masks


@pytest.mark.parametrize("dim", [1, 63, 64, 100, 300, 1024, 1028])
def test_split_documents_match_numpy(dim):
    """The presplit build's documents (maxsim_quantize.cu maxsim_split_documents) of padded
    documents under a strided view and a mask, of contiguous ones (rows on 16 bytes where the
    dim is a multiple of 4: read as vectors, rows side by side up to 64, several or one held in
    registers up to 1024, re-read past), and of packed ones, bit for bit as NumPy's."""
    import cupy

    from cupy_maxsim._gpu.launch import split_documents

    docs, mask, view, strides, masks = _documents(dim)
    flat = docs.reshape(-1, dim)
    packed = cupy.asarray(flat)  # (held: a temporary's memory would go back to the pool before the launch)
    for m, got in ((mask, split_documents(view.data.ptr, 0, 7, 11, strides, dim, masks.data.ptr, masks.strides)),
                   (None, split_documents(view.data.ptr, 0, 7, 11, strides, dim)),
                   (mask, split_documents(packed.data.ptr, 0, 7, 11, (11 * dim, dim), dim, masks.data.ptr,
                                          masks.strides)),
                   (None, split_documents(packed.data.ptr, 0, 1, 77, (0, dim), dim))):
        want = numpy_split(flat, None if m is None else m.reshape(-1), documents=True)
        np.testing.assert_array_equal(got[0].get(), want[0])
        np.testing.assert_array_equal(got[1].get(), want[1])


@pytest.mark.parametrize("dim", [1, 64, 100, 300])
def test_split_exponents_match_numpy(dim):
    """The documents' exponents (maxsim_quantize.cu maxsim_split_exponents) of padded documents
    under a strided view and a mask, and of packed ones: k, 1001 (SPLIT_BAD) for a row holding
    NaN or inf, 1000 (SPLIT_ZERO) for a masked one, whatever it holds."""
    import cupy

    from cupy_maxsim._gpu.launch import split_exponents

    docs, mask, view, strides, masks = _documents(dim)
    k, bad = numpy_exponents(docs.reshape(-1, dim))
    want = np.where(bad, 1001, k).reshape(7, 11)
    got = split_exponents(view.data.ptr, 0, 7, 11, strides, dim, masks.data.ptr, masks.strides)
    np.testing.assert_array_equal(got.get().reshape(7, 11), np.where(mask, want, 1000))
    got = split_exponents(view.data.ptr, 0, 7, 11, strides, dim)
    np.testing.assert_array_equal(got.get().reshape(7, 11), want)
    packed = cupy.asarray(docs.reshape(-1, dim))
    got = split_exponents(packed.data.ptr, 0, 1, 77, (0, dim), dim)
    np.testing.assert_array_equal(got.get(), want.reshape(-1))


def _check_scores(q, d, q_mask, d_mask, packed=True, settings=SPLIT):
    """Scores (and winners) under the split (``settings``: SPLIT or PRESPLIT) against float64
    (1e-5 of the largest score) and against the 3xTF32 path; bitwise reproducible; packed
    documents with an empty one."""
    import cupy

    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64), q_mask, d_mask)
    finite = np.isfinite(expected)
    masks = dict(q_mask=cupy.asarray(q_mask), d_mask=cupy.asarray(d_mask))
    with tuning.override(**settings):
        got, winners = cm.score(cupy.asarray(q), cupy.asarray(d), **masks, return_argmax=True)
        got = to_numpy(got)
        again = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d), **masks))
    np.testing.assert_array_equal(got, again)  # bitwise reproducible
    np.testing.assert_array_equal(np.isfinite(got), finite)
    scale = np.abs(expected[finite]).max()
    assert np.abs(got[finite] - expected[finite]).max() <= 1e-5 * scale
    tf32x3 = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d), **masks))
    assert np.abs(got[finite] - tf32x3[finite]).max() <= 2e-5 * scale
    # Winners: -1 exactly where no token can win; each winner's similarity within fp32's
    # accuracy of the max (a near tie may go either way).
    ref_winners = reference.maxsim_argmax_reference(q.astype(np.float64), d.astype(np.float64), q_mask, d_mask)
    winners = to_numpy(winners).astype(np.int64)
    np.testing.assert_array_equal(winners < 0, ref_winners < 0)
    sims = np.where(d_mask[None, :, None, :], np.einsum("qtd,njd->qntj", q.astype(np.float64), d.astype(np.float64)),
                    -np.inf)
    chosen = np.take_along_axis(sims, np.maximum(winners, 0)[..., None], axis=-1)[..., 0]
    real = ref_winners >= 0
    assert np.all(sims.max(-1)[real] - chosen[real] <= 1e-5 * np.abs(sims[np.isfinite(sims)]).max())
    if packed:
        lengths = np.array([d.shape[1], 0, 1, 33, 64, 65, 20])[:d.shape[0]]
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        tokens = np.concatenate([d[n, :lengths[n]] for n in range(len(lengths))])
        with tuning.override(**settings):
            got = to_numpy(cm.score_packed(cupy.asarray(q), cupy.asarray(tokens), cupy.asarray(offsets),
                                           q_mask=masks["q_mask"]))
        want = reference.maxsim_packed_reference(q.astype(np.float64), tokens.astype(np.float64), offsets, q_mask)
        real = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), real)
        assert np.abs(got[real] - want[real]).max() <= 1e-5 * np.abs(want[real]).max()


@pytest.mark.parametrize("nq, lq, dim", [(2, 32, 128), (3, 20, 768), (5, 32, 48), (9, 32, 100), (8, 32, 128),
                                         (13, 27, 320), (40, 16, 1000), (9, 32, 2560), (8, 32, 4104)])
@pytest.mark.parametrize("build", ["split", "presplit"])
def test_fp32_split_matches_float64(nq, lq, dim, build, builds):
    """Padded and packed corpora, masks with holes (an empty document and query), winners; 2 to
    40 queries (a group's last box short where the count is no multiple of 8 queries of 32);
    dims past 512 flush the accumulators into rounding sums (the tensor cores' truncation), 4104
    with a part-empty last 64 elements."""
    rng = np.random.default_rng(dim + nq)
    q = unit_rows(rng, (nq, lq, dim), np.float32)
    d = unit_rows(rng, (7, 90, dim), np.float32)
    _check_scores(q, d, holey_mask(rng, (nq, lq), 0.8), holey_mask(rng, (7, 90), 0.7),
                  settings=PRESPLIT if build == "presplit" else SPLIT)
    if _on_hopper():
        assert build in builds, builds


@pytest.mark.parametrize("build", ["split", "presplit"])
def test_fp32_split_wide_magnitudes_and_near_ties(build, builds):
    """Tokens scaled by 10^-15 to 10^15 (each token's own power of two keeps it in fp16's range),
    elements of 2^-40 to 1 (small halves in fp16's subnormals), documents whose every other token
    is its neighbour one ulp apart."""
    settings = PRESPLIT if build == "presplit" else SPLIT
    rng = np.random.default_rng(7)
    q = unit_rows(rng, (9, 32, 128), np.float32) * (10.0 ** rng.uniform(-15, 15, (9, 32, 1))).astype(np.float32)
    d = unit_rows(rng, (6, 70, 128), np.float32) * (10.0 ** rng.uniform(-15, 15, (6, 70, 1))).astype(np.float32)
    ones = np.ones((9, 32), bool), np.ones((6, 70), bool)
    _check_scores(q, d, *ones, packed=False, settings=settings)
    q = (np.sign(rng.standard_normal((9, 32, 96))) * 2.0 ** rng.uniform(-40, 0, (9, 32, 96))).astype(np.float32)
    d = (np.sign(rng.standard_normal((6, 70, 96))) * 2.0 ** rng.uniform(-40, 0, (6, 70, 96))).astype(np.float32)
    _check_scores(q, d, np.ones((9, 32), bool), ones[1], packed=False, settings=settings)
    d[:, 1::2] = np.nextafter(d[:, 0::2], np.float32(np.inf))
    _check_scores(q, d, np.ones((9, 32), bool), ones[1], packed=False, settings=settings)
    if _on_hopper():
        assert build in builds, builds


@pytest.mark.parametrize("settings", [SPLIT, PRESPLIT], ids=["split", "presplit"])
def test_fp32_split_non_finite_tokens(settings):
    """A real document token holding NaN or inf makes its document's scores NaN, a real query
    token its query's (against documents with a real token); masked ones are ignored."""
    import cupy

    rng = np.random.default_rng(3)
    q = unit_rows(rng, (9, 32, 64), np.float32)
    d = unit_rows(rng, (6, 50, 64), np.float32)
    q_mask, d_mask = np.ones((9, 32), bool), np.ones((6, 50), bool)
    d[2, 7, 5] = np.nan
    d[3, 9, 0] = np.inf
    d[4, 11, 1] = np.nan
    d_mask[4, 11] = False  # masked: ignored
    q[5, 3, 2] = -np.inf
    q[6, 4, 2] = np.nan
    q_mask[6, 4] = False
    with tuning.override(**settings):
        got = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d), q_mask=cupy.asarray(q_mask),
                                d_mask=cupy.asarray(d_mask)))
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64), q_mask, d_mask)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    assert np.isnan(got[:, 2]).all() and np.isnan(got[:, 3]).all() and np.isnan(got[5]).all()
    finite = np.isfinite(expected)
    assert np.abs(got[finite] - expected[finite]).max() <= 1e-5 * np.abs(expected[finite]).max()


def test_fp32_split_rows_off_16_bytes_and_strided(builds):
    """Documents whose rows start on 4 bytes (a view one element in) or stride past the dim
    score bitwise as the same values in a contiguous tensor (the producer's loads element by
    element against 16-byte vectors)."""
    import cupy

    rng = np.random.default_rng(11)
    q = unit_rows(rng, (9, 32, 100), np.float32)
    d = unit_rows(rng, (5, 60, 100), np.float32)
    with tuning.override(**SPLIT):
        want = to_numpy(cm.score(cupy.asarray(q), cupy.asarray(d)))
        flat = cupy.zeros(d.size + 1, cupy.float32)
        flat[1:] = cupy.asarray(d).reshape(-1)
        shifted = flat[1:].reshape(d.shape)  # rows on 4 bytes (400-byte rows, one element in)
        wide = cupy.zeros((5, 60, 104), cupy.float32)
        wide[..., :100] = cupy.asarray(d)
        for view in (shifted, wide[..., :100]):
            np.testing.assert_array_equal(to_numpy(cm.score(cupy.asarray(q), view)), want)
    expected = reference.maxsim_reference(q.astype(np.float64), d.astype(np.float64))
    assert np.abs(want - expected).max() <= 1e-5 * np.abs(expected).max()
    if _on_hopper():
        assert "split" in builds, builds
