#!/bin/bash
# Second device call for next-device3, if s40a.sh's split tests and memcheck pass: issue 24's fp32
# 32-query cells under the split (Tunables.wgmma_fp32_split) beside bf16's and the peers, in two
# halves of the sweep's dims (each call under 600 s). carry: [".commit", "cupy_maxsim/prebuilt", ".whl", "s40b.sh"]
#   run: bash s40b.sh low    or    bash s40b.sh high
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl && export PYTHONPATH="$HOME/site:$PWD"
echo "commit $(cat .commit 2>/dev/null)" | tee "$OUT/provenance.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/provenance.txt"
if [ "$1" = "high" ]; then DIMS=320,768,1024,2560,4096; else DIMS=48,64,96,100,128,256; fi
timeout 560 python3 bench/cliffs.py --dtypes float32,bfloat16 --dims "$DIMS" --queries 32 \
  --tunables wgmma_fp32_split=1 --reps 5 --out "$OUT" 2>&1 | tail -30 | tee "$OUT/cliffs-split-peers-$1.txt"
