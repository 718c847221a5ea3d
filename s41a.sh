#!/bin/bash
# Device call for split-staged (the fp32 split build's producer staging float32 chunks by cp.async,
# per-row exponents from maxsim_split_exponents). carry: [".commit", ".prebuilt.tar.xz"]
#   run: tar -C cupy_maxsim -xJf .prebuilt.tar.xz && bash s41a.sh
# One log ($OUT/s41a.log) and the cliffs json: few files come back.
export PYTHONPATH=$PWD
L="$OUT/s41a.log"
{ echo "commit $(cat .commit 2>/dev/null)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"; date -u; } | tee "$L"
echo "== tests" | tee -a "$L"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp32_split.py 2>&1 | tail -15 | tee -a "$L"
echo "== memcheck" | tee -a "$L"
timeout 90 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_split.py 2>&1 | tail -4 | tee -a "$L"
echo "== racecheck" | tee -a "$L"
timeout 150 compute-sanitizer --tool racecheck python3 bench/sanitize_split.py > "$OUT/racecheck.txt" 2>&1
grep -E "Error|Write|Read|hazard|at 0x|SUMMARY" "$OUT/racecheck.txt" | head -40 | tee -a "$L"; rm -f "$OUT/racecheck.txt"
echo "== exponents pass alone (4 GB float32, 26041 x 300 x 128)" | tee -a "$L"
timeout 60 python3 - <<'PY' 2>&1 | tee -a "$L"
import cupy
from cupy_maxsim._gpu.launch import split_exponents
d = cupy.ones((26041, 300, 128), cupy.float32)
f = lambda: split_exponents(d.data.ptr, 0, 26041, 300, (300 * 128, 128), 128)
for _ in range(3): f()
s, e = cupy.cuda.Event(), cupy.cuda.Event()
s.record(); [f() for _ in range(10)]; e.record(); e.synchronize()
ms = cupy.cuda.get_elapsed_time(s, e) / 10
y = cupy.empty_like(d); s.record(); [y.__setitem__(Ellipsis, d) for _ in range(5)]; e.record(); e.synchronize()
copy = cupy.cuda.get_elapsed_time(s, e) / 5
print(f"split_exponents {ms:.3f} ms = {d.nbytes / ms / 1e9:.2f} TB/s read; copy {copy:.3f} ms = {2 * d.nbytes / copy / 1e9:.2f} TB/s")
PY
echo "== cliffs" | tee -a "$L"
timeout 150 python3 bench/cliffs.py --dtypes float32,bfloat16 --dims 64,128,320,1024 --queries 32 --ours-only \
  --tunables wgmma_fp32_split=1 --reps 5 --out "$OUT" 2>&1 | tail -12 | tee -a "$L"
echo "==== summary"; grep -E "passed|failed|ERROR SUMMARY|RACECHECK SUMMARY|split_exponents|of our bf16|\| float32" "$L"
