#!/usr/bin/env bash
# One device call: GPU tests, compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on
# every kernel variant, a few timings.
# Usage (device machine, repo root): [SEEDS=0:200] [SKIP_SANITIZER=1] [SKIP_TIMING=1] bash bench/gpu_suite.sh [pytest -k expr]
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; echo "commit ${CUPY_MAXSIM_COMMIT:-unknown (the device copy has no .git; pass CUPY_MAXSIM_COMMIT)}"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import cupy, numpy, torch, jax; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__)"; } 2>&1 | tee "$OUT/env.txt"
python3 -m pytest -m gpu tests/test_gpu.py tests/test_int8.py tests/test_backward.py tests/test_no_cliffs.py \
  tests/test_fp32_split.py tests/test_search.py tests/test_index.py tests/test_torch_compile.py -q -x ${1:+-k "$1"} 2>&1 \
  | tee "$OUT/gpu_tests.log"
# The random problems: SEEDS=start:stop, default the first 1,000 (issue 27's run). About 0.1 s
# each with the wheel's prebuilt cubins (`prebuild --arch sm_90`, carried to the device:
# 1,000 in 102 s, 2026-12-03); about 0.8 s each where every new variant compiles first.
CUPY_MAXSIM_SEEDS=${SEEDS:-0:1000} python3 -m pytest -m gpu tests/test_random_problems.py -q 2>&1 | tail -3 \
  | tee "$OUT/random_problems.log"
if [ -z "$SKIP_SANITIZER" ]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_forward.py 2>&1 | tail -5 | tee "$OUT/memcheck.log"
  # The fp32 split's builds (staged and presplit) on their own: sanitize_forward's cells are small.
  compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_split.py 2>&1 | tail -3 | tee "$OUT/memcheck_split.log"
  # (each report's variant: bench/racecheck_map.py --prebuilt; every one so far is the split-documents
  # ring's slot hand-off, mbarrier-ordered: tests/results/2026-12-03-racecheck-map-52a9399.txt)
  compute-sanitizer --tool racecheck python3 bench/sanitize_forward.py 2>&1 | tail -5 | tee "$OUT/racecheck.log"
  # Barriers reached by part of a block, and reads of device memory never written (issue 27).
  compute-sanitizer --tool synccheck python3 bench/sanitize_forward.py 2>&1 | tail -5 | tee "$OUT/synccheck.log"
  # (thrust's merge sort, CuPy's argsort in search's multi-block merge, reads its own temporary
  # storage uninitialised: NVIDIA/cccl issues 5327 and 8054)
  compute-sanitizer --tool initcheck --kernel-name-exclude kns=merge_sort python3 bench/sanitize_forward.py 2>&1 \
    | tail -5 | tee "$OUT/initcheck.log"
fi
[ -z "$SKIP_TIMING" ] && python3 bench/bench_forward.py --out "$OUT" --shapes rerank-1k,corpus-10k,colpali-32q-10k 2>&1 | tail -6 | tee "$OUT/bench.log"
