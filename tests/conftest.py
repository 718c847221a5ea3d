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
