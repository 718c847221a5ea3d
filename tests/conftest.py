import numpy as np
import pytest
from support import gpu_available

GPU = gpu_available()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU (CuPy and a driver are needed)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def hopper_cupy():
    """CuPy on an sm_90 GPU (the warpgroup-MMA kernel's), else the test skips."""
    cupy = pytest.importorskip("cupy")
    from cupy_maxsim._gpu.device import device_properties

    if device_properties(cupy.cuda.runtime.getDevice())[3] != 90:
        pytest.skip("the warpgroup-MMA kernel runs on sm_90 only")
    return cupy


@pytest.fixture
def kernels_asked(monkeypatch):
    """The defines of every kernel the forward asks for (_forward.gpu_compile.get_kernel), in order."""
    from cupy_maxsim import _forward

    asked = []
    get_kernel = _forward.gpu_compile.get_kernel
    monkeypatch.setattr(_forward.gpu_compile, "get_kernel",
                        lambda device, family, name, defines=(), *a: asked.append(defines) or
                        get_kernel(device, family, name, defines, *a))
    return asked


@pytest.fixture
def tunable_ab(kernels_asked):
    """tunable_ab(call, tunable, values, check=None, bitwise=True): ``call`` once under each of
    ``values`` of the Tunables field ``tunable``, planned afresh each time (plans, replays and
    kernels_asked cleared); ``check(value, answer)`` runs inside the override after each call
    (kernels_asked then holds that call's builds). With ``bitwise``, asserts every value's answers
    (scores, winners) equal bit for bit and returns the first value's; else returns them all, as
    float64 NumPy arrays (support.answer_arrays)."""
    from cupy_maxsim import _forward, _replay, tuning
    from support import answer_arrays

    def run(call, tunable, values, check=None, bitwise=True):
        results = []
        for value in values:
            _forward._plans.clear()
            _replay.replays.clear()
            kernels_asked.clear()
            with tuning.override(**{tunable: value}):
                answer = answer_arrays(call())
                if check is not None:
                    check(value, answer)
            results.append(answer)
        if not bitwise:
            return results
        for other in results[1:]:
            for a, b in zip(results[0], other):
                np.testing.assert_array_equal(a, b)
        return results[0]

    return run
