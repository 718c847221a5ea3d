#!/usr/bin/env bash
# One device call for the training work: GPU tests (forward and backward), the training-step
# benchmark against the peers, the training runs, then compute-sanitizer on every kernel.
# Usage (device machine, repo root): bash bench/train_suite.sh
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ date -u; echo "commit ${CUPY_MAXSIM_COMMIT:-unknown (the device copy has no .git; pass CUPY_MAXSIM_COMMIT)}"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
  python3 -c "import cupy, numpy, torch, jax; print('cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'jax', jax.__version__)"; } 2>&1 | tee "$OUT/env.txt"
timeout 300 python3 -m pytest -m gpu tests/test_backward.py tests/test_gpu.py tests/test_int8.py -q -x ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tail -25 | tee "$OUT/gpu_tests.log"
timeout 240 python3 bench/bench_train.py --out "$OUT/train.json" 2>&1 | tail -20 | tee "$OUT/bench_train.log"
timeout 120 python3 bench/train_demo.py --out "$OUT/train_demo.json" 2>&1 | tail -5 | tee "$OUT/train_demo.log"
if [ -z "$SKIP_SANITIZER" ]; then
  timeout 200 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_forward.py 2>&1 | tail -4 | tee "$OUT/memcheck.log"
  timeout 200 compute-sanitizer --tool racecheck python3 bench/sanitize_forward.py 2>&1 | tail -4 | tee "$OUT/racecheck.log"
fi
