"""Command line: ``python -m cupy_maxsim {info, compile, prebuild, demo, bench}``."""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

import cupy_maxsim as cm


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def info(_args) -> int:
    from ._gpu.registry import kernel_dir

    print(f"cupy_maxsim {cm.__version__}  python {platform.python_version()}  numpy {np.__version__}")
    print(f"kernels_cu: {kernel_dir()}")
    try:
        import cupy

        print(f"cupy {cupy.__version__}  CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
        from ._gpu.compile import cache_dir

        print(f"kernel cache: {cache_dir()}  (CUPY_MAXSIM_CACHE_DIR)")
        for device in range(cupy.cuda.runtime.getDeviceCount()):
            props = cupy.cuda.runtime.getDeviceProperties(device)
            print(f"device {device}: {props['name'].decode()}  sm_{props['major']}{props['minor']}  "
                  f"{props['totalGlobalMem'] / 2**30:.0f} GiB  {props['multiProcessorCount']} SMs")
    except ImportError:
        print("GPU backend: CuPy is not installed (pip install \"cupy-maxsim[cuda12]\" or [cuda13]); "
              "host arrays run on the CPU backend (NumPy)")
    except Exception as error:  # CuPy without a usable GPU or driver
        print(f"GPU backend: no usable CUDA GPU here (CuPy: {type(error).__name__}: {error}); "
              "host arrays run on the CPU backend (NumPy)")
    for name in ("torch", "jax"):
        try:
            module = __import__(name)
            print(f"{name} {module.__version__}")
        except ImportError:
            print(f"{name}: not installed")
    return 0


def compile_kernels(args) -> int:
    from ._gpu.nvrtc import compile_with_nvrtc
    from ._plan.variants import compile_targets, compile_variants

    from ._gpu.nvrtc import _find_nvrtc

    try:
        _find_nvrtc()
    except RuntimeError as error:  # once, not once per variant
        print(f"cannot compile: {error}")
        return 1
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    failures = 0
    print(f"{'kernel':<26} {'arch':<7} {'variant':<34} {'regs':>5} {'spill':>6}")
    for family, defines in compile_variants():
        for arch in compile_targets(family, archs):
            variant = " ".join(d.split("=")[1] for d in defines) or "-"
            try:
                reports = compile_with_nvrtc(family, arch, defines)
            except RuntimeError as error:
                failures += 1
                print(f"{family:<26} {arch:<7} {variant:<34} FAILED\n{error}")
                continue
            for r in reports:
                spill = r.spill_store_bytes + r.spill_load_bytes
                failures += spill > 0
                print(f"{r.kernel:<26} {arch:<7} {variant:<34} {r.registers:>5} {spill:>6}")
    print("variant = the kernel's compile-time defines (see _plan/configs.py: MmaConfig, WgmmaConfig); shared memory is dynamic")
    print("all kernels compiled, no spills" if not failures else f"{failures} failures or spilling kernels")
    return 1 if failures else 0


def prebuild(args) -> int:
    """Compile the cubins the wheel ships (_gpu/prebuilt.py) into cupy_maxsim/prebuilt/."""
    from ._gpu import prebuilt
    from ._gpu.nvrtc import _find_nvrtc
    from ._plan.variants import runtime_variants

    try:
        _find_nvrtc()
    except RuntimeError as error:
        print(f"cannot compile: {error}")
        return 1
    archs = tuple(a.strip() for a in args.arch.split(",") if a.strip())
    out = prebuilt.folder() if args.out is None else args.out
    start = time.perf_counter()

    def progress(done, total, path):
        print(f"\r{done}/{total} cubins ({time.perf_counter() - start:.0f} s) {path.name:<70}",
              end="" if done < total else "\n", flush=True)

    paths = prebuilt.build(runtime_variants(), archs, out, jobs=args.jobs or None, progress=progress)
    kept = {p.name for p in paths}
    stale = [p for p in Path(out).glob("*.cubin") if p.name not in kept]
    for path in stale:  # an edited kernel's old cubins: nothing would ever load them
        path.unlink()
    size = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} cubins for {', '.join(archs)} in {out} ({size / 2**20:.1f} MiB"
          f"{f', {len(stale)} stale removed' if stale else ''}, {time.perf_counter() - start:.0f} s); "
          "python -m build --wheel now ships them")
    return 0


def demo(args) -> int:
    """Score a synthetic ColPali-shaped corpus and rank it, beside the naive einsum way."""
    gpu = _gpu_available() and not args.cpu
    rng = np.random.default_rng(0)
    num_docs = args.docs or (10_000 if gpu else 500)
    num_queries, query_length, doc_length, dim = 8, 24, 1030, 128
    print(f"corpus: {num_docs} pages x {doc_length} patches x {dim} dims (fp16), "
          f"{num_queries} queries x {query_length} tokens, on {'the GPU' if gpu else 'the CPU (no GPU found; smaller corpus)'}")
    if gpu:
        import cupy as xp
    else:
        xp = np
    docs = xp.asarray(_unit(rng.standard_normal((num_docs, doc_length, dim), dtype=np.float32)).astype(np.float16))
    queries = xp.asarray(_unit(rng.standard_normal((num_queries, query_length, dim), dtype=np.float32)).astype(np.float16))
    # Plant the answer: query i is built from page 7 * i's patches, plus noise.
    targets = [7 * i % num_docs for i in range(num_queries)]
    for i, t in enumerate(targets):
        noise = xp.asarray(rng.standard_normal((query_length, dim), dtype=np.float32)) * 0.02
        queries[i] = (docs[t, :query_length].astype(np.float32) + noise).astype(np.float16)

    def timed(fn):
        fn()
        if gpu:
            xp.cuda.Device().synchronize()
            xp.get_default_memory_pool().free_all_blocks()
            before = xp.get_default_memory_pool().used_bytes()
            start = time.perf_counter()
            result = fn()
            xp.cuda.Device().synchronize()
            return result, time.perf_counter() - start, xp.get_default_memory_pool().total_bytes() - before
        start = time.perf_counter()
        return fn(), time.perf_counter() - start, 0

    scores, seconds, extra = timed(lambda: cm.score(queries, docs))
    naive_docs = min(num_docs, 2000 if gpu else 50)

    def naive():
        # fp16 einsum on the GPU (as PyTorch users write it); NumPy has no fast fp16, so fp32.
        compute = xp.float16 if gpu else xp.float32
        sims = xp.einsum("qid,njd->qnij", queries.astype(compute), docs[:naive_docs].astype(compute))
        return sims.max(axis=-1).astype(xp.float32).sum(axis=-1)

    naive_scores, naive_seconds, naive_extra = timed(naive)
    top = xp.argsort(-scores, axis=1)[:, :5]
    found = sum(int(top[i, 0]) == t for i, t in enumerate(targets))
    # The two score different numbers of pages (the naive tensor would not fit): per page too.
    print(f"cupy_maxsim.score : {seconds * 1e3:8.2f} ms for {num_docs} pages ({seconds / num_docs * 1e6:.2f} us a page)"
          + (f", {extra / 2**20:.0f} MiB extra" if gpu else ""))
    print(f"naive einsum      : {naive_seconds * 1e3:8.2f} ms for {naive_docs} pages "
          f"({naive_seconds / naive_docs * 1e6:.2f} us a page)"
          + (f", {naive_extra / 2**20:.0f} MiB extra (the [Nq, Nd, Lq, Ld] tensor)" if gpu else ""))
    difference = float(xp.abs(scores[:, :naive_docs] - naive_scores).max())
    print(f"max |difference| on the shared pages: {difference:.3g} (naive keeps fp16 similarities)")
    print(f"planted page ranked first for {found}/{num_queries} queries; top-5 of query 0: {top[0].tolist()}")
    return 0 if found == num_queries else 1


def _unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def bench(args) -> int:
    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "bench_forward.py").is_file():
        print("python -m cupy_maxsim bench runs from a source checkout (bench/ is not in the wheel)")
        return 1
    sys.path.insert(0, str(root))
    if "--cpu" in args.rest:  # the NumPy backend beside naive torch on the CPU (bench/cpu_backend.py), any machine
        from bench import cpu_backend

        return cpu_backend.main([a for a in args.rest if a != "--cpu"])
    missing = [name for name in ("cupy", "torch") if not _importable(name)]
    if missing or not _gpu_available():
        print("python -m cupy_maxsim bench measures on a CUDA GPU, beside the peers (torch packages): it needs "
              + (f"{' and '.join(missing)} installed" if missing else "a CUDA GPU that CuPy can see")
              + "; bench --cpu measures the CPU backend on any machine")
        return 1
    if "--cliffs" in args.rest:  # the dtype x dim sweep (bench/cliffs.py)
        from bench import cliffs

        return cliffs.main([a for a in args.rest if a != "--cliffs"])
    from bench import bench_forward

    return bench_forward.main(args.rest)


def _prebuilt_archs() -> tuple[str, ...]:
    from ._gpu.prebuilt import ARCHS

    return ARCHS


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cupy_maxsim", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, devices, kernel cache").set_defaults(run=info)
    compile_parser = commands.add_parser("compile", help="compile every kernel through NVRTC (no GPU needed)")
    compile_parser.add_argument("--arch", default="sm_80,sm_86,sm_89,sm_90")
    compile_parser.set_defaults(run=compile_kernels)
    prebuild_parser = commands.add_parser(
        "prebuild", help="compile the cubins the wheel ships into cupy_maxsim/prebuilt/ (no GPU needed)")
    prebuild_parser.add_argument("--arch", default=",".join(_prebuilt_archs()))
    prebuild_parser.add_argument("--out", type=Path, default=None, help="another folder (default: the package's)")
    prebuild_parser.add_argument("--jobs", type=int, default=0, help="compiler processes (default: one a core)")
    prebuild_parser.set_defaults(run=prebuild)
    demo_parser = commands.add_parser("demo", help="score and rank a synthetic ColPali corpus")
    demo_parser.add_argument("--docs", type=int, default=0)
    demo_parser.add_argument("--cpu", action="store_true", help="use the NumPy backend")
    demo_parser.set_defaults(run=demo)
    bench_parser = commands.add_parser(
        "bench", help="benchmark against the peers (source checkout); --cliffs: the dtype x dim sweep; "
                      "--cpu: the CPU backend beside naive torch")
    bench_parser.add_argument("rest", nargs=argparse.REMAINDER)
    bench_parser.set_defaults(run=bench)
    # bench hands everything after it to bench/bench_forward.py (argparse's REMAINDER would not
    # take options that lead it, such as --shapes).
    args, unknown = parser.parse_known_args(argv)
    if args.command == "bench":
        args.rest = unknown + args.rest
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
