"""RayIndex with GPU actors (issue 28, item 3, on the H200): two actors sharing one GPU, each
shard's Index on the actor's GPU, against one GPU index in this process. A cluster of its own
with a GPU (the CPU tests' module-scoped cluster in test_shards.py has none)."""

import numpy as np
import pytest

import cupy_maxsim as cm
from support import holey_mask, unit_rows

DIM = 32


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_ray_gpu_actors_are_one_gpu_index(dtype):
    ray = pytest.importorskip("ray")
    import cupy
    import cupy_maxsim.ray as cmr

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        rng = np.random.default_rng(11)
        docs = [unit_rows(rng, (int(n), DIM), np.float32) for n in rng.integers(0, 80, 3000)]
        single = cm.Index(DIM, dtype=dtype, device="cuda")
        remote = cmr.RayIndex(DIM, dtype=dtype, actors=2, num_gpus=0.5, timeout=120)
        single.add([cupy.asarray(x) for x in docs])
        remote.add(docs)
        for index in (single, remote):
            index.remove(list(range(0, 3000, 13)))
        q = unit_rows(rng, (4, 16, DIM), np.float32).astype(np.float16)
        q_mask = holey_mask(rng, (4, 16), 0.8)
        for k in (1, 25, 300):
            want = [x.get() for x in single.search(cupy.asarray(q), k, q_mask=cupy.asarray(q_mask), return_argmax=True)]
            got = remote.search(q, k, q_mask=q_mask, return_argmax=True)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.asarray(a), b)
    finally:
        ray.shutdown()
