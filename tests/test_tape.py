"""_gpu.tape on the CPU, the driver and CuPy's allocations stubbed: a recorded stretch of small
launches replays with the inputs and the tape's own arrays patched in, every parameter else as
recorded; a pointer the tape cannot place, or a launch of another kind, leaves it unreplayable."""

import ctypes
import itertools
import struct
import sys
import types

import numpy as np
import pytest

from cupy_maxsim._gpu import launch as gpu_launch
from cupy_maxsim._gpu import tape as gpu_tape
from support import stub_driver


class FakeArray:
    """What the tape reads of a CuPy array: a device pointer, a shape, reshape."""

    def __init__(self, shape, dtype, ptr, zeroed=False):
        self.shape, self.dtype, self.zeroed = tuple(shape), np.dtype(dtype), zeroed
        self.data = types.SimpleNamespace(ptr=ptr)

    def reshape(self, *shape):
        return FakeArray(shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape, self.dtype,
                         self.data.ptr, self.zeroed)


@pytest.fixture
def stubbed(monkeypatch):
    """(launches seen: (function, geometry, cooperative, parameter values), allocations made),
    with cupy and the driver stubbed."""
    launches, allocations, addresses = [], [], itertools.count(2**40, 4096)

    def allocate(zeroed):
        def make(shape, dtype):
            array = FakeArray(shape if isinstance(shape, tuple) else (shape,), dtype, next(addresses), zeroed)
            allocations.append(array)
            return array
        return make

    def reader(cooperative):
        def launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, *extra):
            codes = current_codes[0]
            pointers = [ctypes.c_void_p.from_address(params + 8 * n).value for n in range(len(codes))]
            values = [struct.unpack("@" + c, ctypes.string_at(p, struct.calcsize(c)))[0] for c, p in zip(codes, pointers)]
            launches.append((function, (gx, gy, gz, bx, by, bz, shared), stream, cooperative, values))
        return launch_kernel

    current_codes = [None]
    stub_driver(monkeypatch, launchKernel=reader(False), launchCooperativeKernel=reader(True))
    cupy = types.ModuleType("cupy")
    cupy.empty, cupy.zeros, cupy.int32, cupy.float32 = allocate(False), allocate(True), np.int32, np.float32
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return launches, allocations, current_codes


KERNEL = types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xF00))
SELECT = "maxsim_topk_select"  # scores, row_stride, n, k, segment_length, allowed, positions, chosen, ranked


def _record(stubbed, allowed_ptr=0, extra_pointer=None):
    """Two launches as a selection's rounds: the second reads the first's output."""
    launches, allocations, codes = stubbed
    codes[0] = gpu_launch.SMALL_KERNEL_PARAMETERS[SELECT]
    scores = FakeArray((2, 100), np.float32, 2**39)
    allowed = None if not allowed_ptr else FakeArray((100,), np.bool_, allowed_ptr)
    tape = gpu_tape.Tape()
    with tape.recording((scores,), (allowed,)):
        first = gpu_tape.allocated((2, 4, 8), np.int32)
        gpu_launch.launch(KERNEL, (4, 2), (512,), gpu_launch.scalars(
            SELECT, scores.data.ptr, 100, 100, 8, 25, allowed_ptr, 0, first.data.ptr, 0), 64, 0x5)
        second = gpu_tape.allocated((2, 1, 8), np.int32, zeroed=True)
        gpu_launch.launch(KERNEL, (1, 2), (512,), gpu_launch.scalars(
            SELECT, scores.data.ptr, 100, 32, 8, 32, allowed_ptr, extra_pointer or first.data.ptr, second.data.ptr, 1),
            64, 0x5, cooperative=True)
    return tape, scores, first, second


def test_a_replay_patches_inputs_and_its_own_arrays(stubbed):
    launches, allocations, _ = stubbed
    tape, scores, first, second = _record(stubbed, allowed_ptr=2**38)
    assert tape.answered(second.reshape(2, 8)) and tape.replayable
    recorded = [values for *_, values in launches]
    launches.clear(), allocations.clear()
    (answer,) = tape.replay(0x77, (2**37,))
    new_first, new_second = allocations
    assert answer.shape == (2, 8) and answer.data.ptr == new_second.data.ptr
    assert (new_first.zeroed, new_second.zeroed) == (False, True) and new_second.shape == (2, 1, 8)
    expected = [list(values) for values in recorded]
    for values, new in zip(expected, (new_first, new_second)):
        values[0], values[7] = 2**37, new.data.ptr  # the input's pointer, the new output's
    expected[1][6] = new_first.data.ptr  # the second round reads the first's new output
    assert [values for *_, values in launches] == expected
    assert [(stream, cooperative) for _, _, stream, cooperative, _ in launches] == [(0x77, False), (0x77, True)]
    assert [geometry for _, geometry, *_ in launches] == [(4, 2, 1, 512, 1, 1, 64), (1, 2, 1, 512, 1, 1, 64)]


def test_a_pointer_it_cannot_place_leaves_the_tape_unreplayable(stubbed):
    tape, _, _, second = _record(stubbed, extra_pointer=2**36)  # (a copy made outside the wrappers)
    assert not tape.answered(second) and not tape.replayable
    tape, _, _, second = _record(stubbed, allowed_ptr=2**38)
    assert not tape.answered(FakeArray((2, 8), np.int32, 2**35))  # an answer the tape did not allocate


def test_another_kind_of_launch_spoils_the_tape(stubbed):
    launches, _, codes = stubbed
    tape = gpu_tape.Tape()
    with tape.recording(()):
        out = gpu_tape.allocated((4,), np.int32)
        codes[0] = "Q"
        gpu_launch.launch(KERNEL, (1,), (32,), struct.pack("<Q", out.data.ptr), 0, 0x5)
    assert not tape.answered(out)
    assert gpu_tape.recording_tape() is None  # (the recording ended with its block)
    with pytest.raises(RuntimeError, match="recording already"):
        with tape.recording(()), gpu_tape.Tape().recording(()):
            pass
