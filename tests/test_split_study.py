"""The fp16-split count (bench/split_study.py), on the CPU: its scales are powers of two that
put every row's largest element where fp16 holds it, big + small reconstruct each element
within the bound the study asserts, and the three products' scores stay within the tests'
fp32 line (1e-5 of the largest score) on every corpus it builds."""

import numpy as np

from bench import split_study


def test_scales_are_powers_of_two_that_fit_fp16():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((50, 64)) * 10.0 ** rng.uniform(-30, 30, (50, 1))).astype(np.float32)
    x[3] = 0.0
    scale = split_study.row_scales(x)
    mantissa, _ = np.frexp(scale)
    assert np.all(mantissa == 0.5)  # powers of two: scaling is exact
    largest = np.abs(x.astype(np.float64) * scale).max(axis=1)
    real = largest > 0
    assert np.all((largest[real] >= 2.0 ** 14) & (largest[real] < 2.0 ** 15))
    y, big, small, _ = split_study.split_fp16(x)
    assert np.all(np.abs(big) <= 65504)
    assert np.all(np.abs(y - big - small) <= 2.0 ** -22 * np.abs(y) + 2.0 ** -24.9)


def test_three_fp16_products_keep_fp32_accuracy_on_every_corpus():
    rows = split_study.study([40, 136], split_study.KINDS, num_docs=12, doc_length=20, seed=3)
    assert {row["corpus"] for row in rows} == set(split_study.KINDS)
    for row in rows:
        assert 0 < row["worst_representation_error_over_bound"] <= 1
        assert row["split_fp16"] <= 1e-5 and row["tf32x3"] <= 1e-5
        assert row["tf32"] > row["split_fp16"]  # one TF32 pass is not fp32 accuracy; the split is
