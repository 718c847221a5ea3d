#!/usr/bin/env bash
# The measurements the open issues' acceptance lines ask for, in as few device calls as the
# 10-minute limit allows. Usage (device machine, repo root, peers' wheels installed):
#   CUPY_MAXSIM_COMMIT=<sha> bash bench/closeout_suite.sh forward   # fp16 + bf16, all shapes
#   CUPY_MAXSIM_COMMIT=<sha> bash bench/closeout_suite.sh more      # sweep, int8, fidelity, training
#   CUPY_MAXSIM_COMMIT=<sha> bash bench/closeout_suite.sh check     # GPU suite, memcheck, tune_wgmma
#   CUPY_MAXSIM_COMMIT=<sha> bash bench/closeout_suite.sh land      # smoke, GPU suite, fp16 + int8 tables
#   CUPY_MAXSIM_COMMIT=<sha> bash bench/closeout_suite.sh land2     # bf16 table, training, int8 fidelity
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
case "${1:-forward}" in
  forward)
    timeout 280 python3 bench/bench_forward.py --out "$OUT" --tag all 2>&1 | tail -12
    timeout 280 python3 bench/bench_forward.py --out "$OUT" --dtype bfloat16 --tag all 2>&1 | tail -12 ;;
  more)
    timeout 150 python3 bench/bench_forward.py --out "$OUT" --sweep --tag sweep 2>&1 | tail -14
    timeout 120 python3 bench/bench_forward.py --out "$OUT" --int8 --shapes corpus-10k,colpali-1q-10k,colbert-1q-1M,colpali-32q-10k --tag int8 2>&1 | tail -8
    timeout 90 python3 bench/fidelity_int8.py --out "$OUT/fidelity-int8.json" 2>&1 | tail -6
    timeout 120 python3 bench/bench_train.py --out "$OUT/train.json" 2>&1 | grep "^|" ;;
  land)  # correctness of what lands, then the fp16 and int8 tables with the peers
    timeout 60 python3 bench/smoke_hopper.py 2>&1 | tee "$OUT/smoke.log" | tail -3
    timeout 120 python3 -m pytest -m gpu tests/test_gpu.py tests/test_int8.py tests/test_backward.py -q -p no:warnings 2>&1 | tee "$OUT/gpu-suite.log" | tail -3
    timeout 250 python3 bench/bench_forward.py --out "$OUT" --tag all 2>&1 | tail -12
    timeout 120 python3 bench/bench_forward.py --out "$OUT" --int8 --shapes corpus-10k,colpali-1q-10k,colbert-1q-1M,colpali-32q-10k --tag int8 2>&1 | tail -8 ;;
  final)  # GPU suite, fp16 table, int8 table, bf16 compute-bound shapes, training
    timeout 120 python3 -m pytest -m gpu tests/test_gpu.py tests/test_int8.py tests/test_backward.py -q -p no:warnings 2>&1 | tee "$OUT/gpu-suite.log" | tail -2
    timeout 200 python3 bench/bench_forward.py --out "$OUT" --tag all 2>&1 | tail -10
    timeout 90 python3 bench/bench_forward.py --out "$OUT" --int8 --shapes corpus-10k,colpali-1q-10k,colbert-1q-1M,colpali-32q-10k --tag int8 2>&1 | tail -6
    timeout 90 python3 bench/bench_forward.py --out "$OUT" --dtype bfloat16 --shapes colpali-32q-10k,colbert-256q-100k,inbatch-128 --tag compute 2>&1 | tail -5
    timeout 120 python3 bench/bench_train.py --out "$OUT/train.json" 2>&1 | tee "$OUT/train.txt" | grep "^|" ;;
  land2)  # bf16 table, training, int8 fidelity
    timeout 250 python3 bench/bench_forward.py --out "$OUT" --dtype bfloat16 --tag all 2>&1 | tail -12
    timeout 150 python3 bench/bench_train.py --out "$OUT/train.json" 2>&1 | tee "$OUT/train.txt" | grep "^|"
    timeout 90 python3 bench/fidelity_int8.py --out "$OUT/fidelity-int8.json" 2>&1 | tail -6
    timeout 90 python3 bench/profile_train.py > "$OUT/profile-train.txt" 2>&1; tail -4 "$OUT/profile-train.txt" ;;
  check)
    timeout 150 python3 -m pytest -m gpu tests/test_gpu.py tests/test_int8.py tests/test_backward.py -q -p no:warnings 2>&1 | tee "$OUT/gpu-suite.log" | tail -3
    timeout 100 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_forward.py 2>&1 | tee "$OUT/memcheck.log" | tail -2
    timeout 280 python3 bench/tune_wgmma.py 2>&1 | tee "$OUT/tune-wgmma.log" | tail -40 ;;
esac
