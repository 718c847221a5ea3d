#!/bin/bash
# Last device call of session 41 (9ba1b91+: the split staged, converted at its first slot, one
# arrival a warp; on by default): its GPU tests, then the fp32/bf16 32-query cells beside the peers.
# carry: [".commit", ".prebuilt.tar.xz", ".whl"]   run: tar -C cupy_maxsim -xJf .prebuilt.tar.xz && bash s41d.sh
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl && export PYTHONPATH="$HOME/site:$PWD"
L="$OUT/s41d.log"
{ echo "commit $(cat .commit 2>/dev/null)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; date -u; } | tee "$L"
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp32_split.py 2>&1 | tail -2 | tee -a "$L"
timeout 200 python3 bench/cliffs.py --dtypes float32,bfloat16 --dims 64,128,320,1024 --queries 32 --reps 3 \
  --out "$OUT" 2>&1 | tail -16 | tee -a "$L"
