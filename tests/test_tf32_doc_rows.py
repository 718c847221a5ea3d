"""fp32 one query at fp32 accuracy with the documents on M (maxsim_fwd_wgmma.cu, TF32_DOC_ROWS;
Tunables.wgmma_tf32_doc_rows): each document atom the MMA's A from registers, split there, the
query staged split as B, three products a k-step (the small halves' product dropped). Against
float64 within the fp32 line (1e-5 of the largest score) and within it of the split-document
build (not bit for bit: a different sum of products): dims of one atom and a part (48, 100: a
part-zero last atom; 99: rows 400 bytes apart, the tail past the dim zero-filled by the copies;
one query on rows off 16 bytes takes the mma.sync kernel), whole atoms (128, 256), a query past one atom's rows
(500), masks with holes, lengths off the tile, an empty document, non-finite document elements
and query tokens, masked query tokens, packed tokens, near-ties, two queries of 16 tokens in one
group, bitwise reproducibility, and the build that ran. GPU only (sm_90)."""

import numpy as np
import pytest

import cupy_maxsim as cm
from cupy_maxsim import reference
from support import assert_scores_match, ragged_gpu_corpus, unit_rows

pytestmark = pytest.mark.gpu

DOC_ROWS = "-DMAXSIM_TF32=3"


def _doc_rows_and_split(call, tunable_ab, kernels_asked):
    """(documents on M, split documents): each answer as float64 arrays, after asserting which
    build ran; the documents-on-M answer twice, bit for bit."""
    def check(on, answer):
        ran = {d for defines in kernels_asked for d in defines if d.startswith("-DMAXSIM_TF32=")}
        assert ran == ({DOC_ROWS} if on else {"-DMAXSIM_TF32=1"}), kernels_asked

    doc_rows, again, split = tunable_ab(call, "wgmma_tf32_doc_rows", (True, True, False), check, bitwise=False)
    for a, b in zip(doc_rows, again):
        np.testing.assert_array_equal(a, b)
    return doc_rows, split


def _on_16_bytes(xp, values):
    """``values`` (float32) in rows that start 16 bytes apart or a multiple of that: a view of a
    wider array where the dim is not a multiple of 4 (the copies' zero fill past the dim)."""
    dim = values.shape[-1]
    wide = xp.full(values.shape[:-1] + (-(-dim // 4) * 4,), np.float32(7.0))  # (never read: past the dim)
    wide[..., :dim] = xp.asarray(values)
    return wide[..., :dim]


def _line(expected):
    return 1e-5 * np.abs(expected[np.isfinite(expected)]).max()


@pytest.mark.parametrize("dim,length", [(48, 70), (99, 40), (100, 130), (128, 300), (256, 64), (500, 90)])
def test_padded_masked_corpus(hopper_cupy, tunable_ab, kernels_asked, dim, length):
    rng = np.random.default_rng(dim)
    q64 = unit_rows(rng, (1, 32, dim), np.float64).astype(np.float32).astype(np.float64)
    d64 = unit_rows(rng, (40, length, dim), np.float64).astype(np.float32).astype(np.float64)
    d64[5, 3, 7] = np.nan
    d64[6, length - 1, dim - 1] = -np.inf
    mask = rng.random((40, length)) < 0.8
    mask[7] = False
    mask[9, length // 2:] = False
    mask[5, 3] = mask[6, length - 1] = True
    q, d = (_on_16_bytes(hopper_cupy, a.astype(np.float32)) for a in (q64, d64))
    call = lambda: cm.score(q, d, d_mask=hopper_cupy.asarray(mask))  # noqa: E731
    doc_rows, split = _doc_rows_and_split(call, tunable_ab, kernels_asked)
    expected = reference.maxsim_reference(q64, d64, None, mask)
    assert_scores_match(doc_rows[0], expected, atol=_line(expected))
    assert_scores_match(doc_rows[0], split[0], atol=_line(expected))
    assert np.isnan(doc_rows[0][:, 5:7]).all() and (doc_rows[0][:, 7] == -np.inf).all()
    # Unmasked (TMA tiles, lengths only), with the query's own mask and a non-finite token.
    q_mask = np.ones((1, 32), bool)
    q_mask[0, 3:9] = False
    expected = reference.maxsim_reference(q64, d64, q_mask, None)
    got = cm.score(q, d, q_mask=hopper_cupy.asarray(q_mask))
    assert_scores_match(got, expected, atol=_line(expected))
    q64[0, 4, 1] = np.inf  # masked: no effect
    q64[0, 20, 0] = np.nan  # real: every score NaN
    got = cm.score(_on_16_bytes(hopper_cupy, q64.astype(np.float32)), d, q_mask=hopper_cupy.asarray(q_mask))
    assert np.isnan(got.get()).all()


@pytest.mark.parametrize("dim", [100, 128])
def test_near_ties_and_two_queries(hopper_cupy, tunable_ab, kernels_asked, dim):
    """Document rows 1e-6 apart in pairs (the products' error must stay below the gaps' effect
    on the line), and two queries of 16 tokens sharing the group's 32 rows."""
    rng = np.random.default_rng(dim + 1)
    q64 = unit_rows(rng, (2, 16, dim), np.float64).astype(np.float32).astype(np.float64)
    d = unit_rows(rng, (30, 150, dim), np.float64)
    d[:, 1::2] = d[:, 0::2] + 1e-6 * rng.standard_normal(d[:, 0::2].shape)
    d64 = d.astype(np.float32).astype(np.float64)
    q, dd = hopper_cupy.asarray(q64.astype(np.float32)), hopper_cupy.asarray(d64.astype(np.float32))
    doc_rows, split = _doc_rows_and_split(lambda: cm.score(q, dd), tunable_ab, kernels_asked)
    expected = reference.maxsim_reference(q64, d64)
    assert_scores_match(doc_rows[0], expected, atol=_line(expected))
    assert_scores_match(doc_rows[0], split[0], atol=_line(expected))


def test_packed_tokens(hopper_cupy, tunable_ab, kernels_asked):
    q, t, offsets, q64, t64, host_offsets = ragged_gpu_corpus(np.random.default_rng(7), 1, lq=30, dim=100,
                                                              dtype=np.float32, docs=60, longest=200)
    doc_rows, split = _doc_rows_and_split(lambda: cm.score_packed(q, t, offsets), tunable_ab, kernels_asked)
    expected = reference.maxsim_packed_reference(q64, t64, host_offsets)
    assert_scores_match(doc_rows[0], expected, atol=_line(expected))
    assert_scores_match(doc_rows[0], split[0], atol=_line(expected))


@pytest.mark.parametrize("dim,length", [(48, 70), (100, 130), (128, 300), (500, 90)])
def test_winners(hopper_cupy, tunable_ab, kernels_asked, dim, length):
    """Winners from the documents on M (16-bit rows, as documents on M keep them): each reaches
    its token's max within the fp32 line, -1 exactly where no row can win (masked query tokens,
    an emptied document), the lowest row where every row ties (a document of one row repeated:
    rows in every tile, warp and lane); and the scores bit for bit those of the same call
    without winners (the property that kept the build opt-in while it had none)."""
    rng = np.random.default_rng(dim + 3)
    q64 = unit_rows(rng, (1, 32, dim), np.float64).astype(np.float32).astype(np.float64)
    d64 = unit_rows(rng, (30, length, dim), np.float64).astype(np.float32).astype(np.float64)
    d64[4] = d64[4, :1]  # every row the same: row 0 wins every token
    q_mask, d_mask = np.ones((1, 32), bool), rng.random((30, length)) < 0.7
    q_mask[0, 5:9] = False
    d_mask[4], d_mask[2] = True, False
    q, d = (hopper_cupy.asarray(a.astype(np.float32)) for a in (q64, d64))
    masks = dict(q_mask=hopper_cupy.asarray(q_mask), d_mask=hopper_cupy.asarray(d_mask))

    def check(on, answer):
        ran = {x for defines in kernels_asked for x in defines if x.startswith("-DMAXSIM_TF32=")}
        assert ran == {DOC_ROWS}, kernels_asked

    got, winners, again = tunable_ab(lambda: (*cm.score(q, d, return_argmax=True, **masks), cm.score(q, d, **masks)),
                                     "wgmma_tf32_doc_rows", (True,), check)
    np.testing.assert_array_equal(got, again)
    expected = reference.maxsim_reference(q64, d64, q_mask, d_mask)
    assert_scores_match(got, expected, atol=_line(expected))
    ref_winners = reference.maxsim_argmax_reference(q64, d64, q_mask, d_mask)
    winners = winners.astype(np.int64)
    np.testing.assert_array_equal(winners < 0, ref_winners < 0)
    assert (winners[0, 4][q_mask[0]] == 0).all()
    sims = np.where(d_mask[None, :, None, :], np.einsum("qtd,njd->qntj", q64, d64), -np.inf)
    chosen = np.take_along_axis(sims, np.maximum(winners, 0)[..., None], axis=-1)[..., 0]
    real = ref_winners >= 0
    assert np.all(sims.max(-1)[real] - chosen[real] <= 1e-5)
