"""cupy_maxsim._ids: sets of ids by a sort (what np.unique returns, for increasing, shuffled,
repeated, negative, empty and one-element arrays), and the checks on ids being added (assigned
from the next free id; given ids one a document, unique, none taken)."""

import numpy as np
import pytest

from cupy_maxsim import _ids


@pytest.mark.parametrize("values", [
    np.arange(1000), np.arange(1000)[::-1], np.random.default_rng(0).integers(-50, 50, 3000),
    np.random.default_rng(1).permutation(10_000), np.array([], np.int64), np.array([7]), np.array([3, 3]),
    np.array([1, 2, 2, 3]), np.array([2**62, -(2**62), 0]),
])
def test_sorted_unique_is_np_unique(values):
    values = values.astype(np.int64)
    before = values.copy()
    got = _ids.sorted_unique(values)
    np.testing.assert_array_equal(got, np.unique(values))
    assert got.dtype == np.int64 and not np.shares_memory(got, values)
    np.testing.assert_array_equal(values, before)  # the caller's array is not changed


def test_new_ids_assigned_and_checked():
    taken = np.array([5, 9], np.int64)
    np.testing.assert_array_equal(_ids.new_ids(None, 3, 10, taken), [10, 11, 12])
    np.testing.assert_array_equal(_ids.new_ids([12, 3, 40], 3, 10, taken), [12, 3, 40])
    np.testing.assert_array_equal(_ids.new_ids(range(100, 104), 4, 0, taken), [100, 101, 102, 103])
    assert _ids.new_ids(np.array([], np.int64), 0, 0, taken).shape == (0,)
    with pytest.raises(ValueError, match="one id per document"):
        _ids.new_ids([1, 2], 3, 0, taken)
    with pytest.raises(ValueError, match="unique"):
        _ids.new_ids([4, 1, 4], 3, 0, taken)
    with pytest.raises(ValueError, match=r"already in the index: \[9\]"):
        _ids.new_ids([1, 9], 2, 0, taken)
    with pytest.raises(TypeError, match="ids must be a 1-D array of integer ids"):
        _ids.new_ids(np.array([1.5, 2.0]), 2, 0, taken)
    with pytest.raises(TypeError, match="ids must be a 1-D array of integer ids"):
        _ids.new_ids(np.array([[1, 2]]), 2, 0, taken)


@pytest.mark.parametrize("ids", [np.arange(50), np.random.default_rng(2).permutation(50) * 3 - 40, np.array([], np.int64),
                                 np.array([9]), np.array([5, 1, 9, -3])])
def test_find_is_a_lookup(ids):
    ids = ids.astype(np.int64)
    view = _ids.sorted_view(ids)
    assert (view[0] is None) == bool(ids.shape[0] < 2 or (np.diff(ids) > 0).all())
    wanted = np.concatenate([ids[::2], [-1000, 1000, 4, 7], ids[:3]]).astype(np.int64)
    rows, found = _ids.find(view, wanted)
    np.testing.assert_array_equal(found, np.isin(wanted, ids))
    np.testing.assert_array_equal(ids[rows[found]], wanted[found])
