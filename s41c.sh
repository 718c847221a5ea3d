#!/bin/bash
# Device call for split-staged with the split on by default: the GPU tests its default touches,
# then issue 24's fp32 32-query cells beside bf16 and the peers, and the 3xTF32 path they replace.
# carry: [".commit", ".prebuilt.tar.xz", ".whl"]   run: tar -C cupy_maxsim -xJf .prebuilt.tar.xz && bash s41c.sh
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl && export PYTHONPATH="$HOME/site:$PWD"
L="$OUT/s41c.log"
{ echo "commit $(cat .commit 2>/dev/null)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)"; date -u; } | tee "$L"
echo "== tests" | tee -a "$L"
timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_fp32_split.py tests/test_no_cliffs.py \
  tests/test_search.py tests/test_index.py tests/test_gpu.py 2>&1 | tail -12 | tee -a "$L"
echo "== cliffs with peers (split on: the default)" | tee -a "$L"
timeout 200 python3 bench/cliffs.py --dtypes float32,bfloat16 --dims 64,128,320,1024 --queries 32 --reps 5 \
  --out "$OUT" 2>&1 | tail -16 | tee -a "$L"
echo "== the 3xTF32 path it replaces (wgmma_fp32_split=0)" | tee -a "$L"
mkdir -p "$OUT/off"
timeout 100 python3 bench/cliffs.py --dtypes float32 --dims 64,128,320,1024 --queries 32 --ours-only --reps 3 \
  --tunables wgmma_fp32_split=0 --out "$OUT/off" 2>&1 | grep "| float32" | tee -a "$L"
echo "==== summary"; grep -E "passed|failed|error|of our bf16|slower|\| float32" "$L" | head -30
