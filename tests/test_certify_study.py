"""The certification count (bench/certify_study.py), on the CPU: its rounding is the formats'
own, its error bound holds on every similarity it computes (the study asserts it), and the
exact winner is always among the candidates."""

import numpy as np

from bench import certify_study


def _rounded(x, bits):
    """x rounded to ``bits`` significant bits, half to even (np.round), by scaling in float64."""
    _, exponent = np.frexp(x.astype(np.float64))
    scale = np.ldexp(1.0, exponent - bits)
    return (np.round(x / scale) * scale).astype(np.float32)


def test_rounding_matches_bfloat16_and_tf32():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(10000) * 10.0 ** rng.integers(-5, 5, 10000),
                        [1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -(1 + 2.0 ** -8), 1 + 2.0 ** -11, 0.0]]).astype(np.float32)
    for fmt in ("bf16", "tf32"):
        np.testing.assert_array_equal(certify_study.FAST_FORMATS[fmt].rounded(x),
                                      _rounded(x, certify_study.FAST_FORMATS[fmt].bits))
    assert certify_study.round_to_tf32(np.float32([1 + 2.0 ** -11]))[0] == 1.0  # the tie goes to even


def test_study_counts_candidates_around_every_exact_winner():
    rows = certify_study.study([64], [0.3], num_docs=20, doc_length=40, num_queries=2, query_length=8, centres=16,
                               seed=1)
    assert {row["fast"] for row in rows} == {"bf16", "tf32"}
    for row in rows:
        assert 0 < row["worst_error_over_bound"] <= 1
        assert row["mean_candidates"] >= 1 and row["max_candidates"] >= row["p99_candidates"] >= 1
        # keeping more candidates never costs more; TF32's pass alone costs two bf16 passes
        times = [row[f"time_keep_{k}"] for k in (1, 2, 4, 8)]
        assert times == sorted(times, reverse=True)
    bf16, tf32 = (next(r for r in rows if r["fast"] == f) for f in ("bf16", "tf32"))
    assert tf32["mean_candidates"] <= bf16["mean_candidates"] and tf32["time_keep_8"] >= 2
