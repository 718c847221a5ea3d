"""Every bad input raises the documented error, with a message naming the argument."""

import numpy as np
import pytest

import cupy_maxsim as cm

Q = np.zeros((2, 4, 8), np.float32)
D = np.zeros((3, 5, 8), np.float32)


@pytest.mark.parametrize(
    "call,error,message",
    [
        pytest.param(lambda: cm.score([[1.0]], D), TypeError, "q must be an array", id="list"),
        pytest.param(lambda: cm.score(Q.astype(np.int32), D), TypeError, "q must have dtype", id="int-q"),
        pytest.param(lambda: cm.score(Q, D.astype(np.float64)), TypeError, "same dtype", id="mixed-dtype"),
        pytest.param(lambda: cm.score(Q[0, 0], D), ValueError, "q must have shape", id="q-1d"),
        pytest.param(lambda: cm.score(Q, D[0]), ValueError, "d must have shape", id="d-2d"),
        pytest.param(lambda: cm.score(Q, D[:, :, :4]), ValueError, "same embedding dim", id="dim"),
        pytest.param(lambda: cm.score(Q, D, d_mask=np.ones((3, 4), bool)), ValueError,
                     r"d_mask must have shape \(3, 5\)", id="d-mask-shape"),
        pytest.param(lambda: cm.score(Q, D, q_mask=np.ones((2, 4), np.int8)), TypeError,
                     "q_mask must be a boolean", id="q-mask-dtype"),
        pytest.param(lambda: cm.score(Q[0], D, q_mask=np.ones((2, 4), bool)), ValueError,
                     r"q_mask must have shape \(4,\)", id="q-mask-single"),
        pytest.param(lambda: cm.score_pairs(Q, D), ValueError, "same number of pairs", id="pairs-count"),
        pytest.param(lambda: cm.score_pairs(Q[0], D), ValueError, "q must have shape", id="pairs-ndim"),
        pytest.param(lambda: cm.score_packed(Q, D[0], np.array([0, 2, 9])), ValueError,
                     "within", id="offsets-past-end"),
        pytest.param(lambda: cm.score_packed(Q, D[0], np.array([0, 3, 2])), ValueError,
                     "decreasing", id="offsets-decreasing"),
        pytest.param(lambda: cm.score_packed(Q, D[0], np.array([-1, 2])), ValueError, "within",
                     id="offsets-negative"),
        # Steps that overflow int64: 2^62 + 1 -> -2^62 is a step of -2^63 - 1, which wraps to
        # +2^63 - 1; only a comparison of neighbours sees the decrease (the kernels would read
        # before the tokens).
        pytest.param(lambda: cm.score_packed(Q, D[0], np.array([0, 2**62 + 1, -2**62, 5])), ValueError,
                     "1 decreasing step", id="offsets-decreasing-past-int64"),
        pytest.param(lambda: cm.score_packed(Q, D[0], np.array([0.0, 2.0])), TypeError,
                     "offsets must have dtype int32 or int64", id="offsets-float"),
        pytest.param(lambda: cm.score_packed(Q, D[0], np.zeros((2, 2), np.int64)), ValueError,
                     "offsets must have shape", id="offsets-2d"),
        pytest.param(lambda: cm.score_packed(Q, D, np.array([0, 2])), ValueError,
                     "tokens must have shape", id="tokens-3d"),
        pytest.param(lambda: cm.pack([D[0], D[0, :, :4]]), ValueError, r"docs\[1\] must have the embedding dim of docs\[0\]", id="pack-dim"),
        pytest.param(lambda: cm.pack([]), ValueError, "at least one document", id="pack-empty"),
    ],
)
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()
