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
