"""One query of 32 tokens against a padded corpus, fp16, three calls of ours or of a peer (for
ncu: the third call runs between cudaProfilerStart and Stop, so ``--profile-from-start off``
profiles its kernels alone, whatever a peer's autotuner launched before), so that one
cell's kernels can be read side by side in ncu's sections (DRAM and L2 throughput, issue):

    python bench/ncu_one_query_peer.py ours|flash_maxsim DIM DOCS [LENGTH] [KEY=VALUE,...]

KEY=VALUE,...: tuning.override changes for ours (bench/ab_tunables.py's text), e.g. wgmma_tile_rows=64.

flash_maxsim is flash-maxsim 0.3.0's ``flash_maxsim`` (one query), as bench/cliffs.py calls it.
"""

import sys

import cupy


def main(argv) -> None:
    provider, dim, docs = argv[0], int(argv[1]), int(argv[2])
    length = int(argv[3]) if len(argv) > 3 else 300
    changes = argv[4] if len(argv) > 4 else ""
    rng = cupy.random.default_rng(0)
    q = (rng.standard_normal((1, 32, dim), dtype=cupy.float32) / dim ** 0.5).astype(cupy.float16)
    d = (rng.standard_normal((docs, length, dim), dtype=cupy.float32) / dim ** 0.5).astype(cupy.float16)
    if provider == "ours":
        import cupy_maxsim as cm

        call = lambda: cm.score(q, d)  # noqa: E731
    elif provider == "flash_maxsim":
        import flash_maxsim as fm
        import torch

        tq, td = torch.from_dlpack(q[0]), torch.from_dlpack(d)
        call = lambda: fm.flash_maxsim(tq, td)  # noqa: E731
    else:
        raise SystemExit(f"unknown provider {provider!r}: ours or flash_maxsim")
    from cupy_maxsim import tuning

    with tuning.override(**tuning.changes_from_text(item for item in changes.split(",") if item)):
        for _ in range(2):
            call()
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.profiler.start()
        call()
        cupy.cuda.runtime.deviceSynchronize()
        cupy.cuda.profiler.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
