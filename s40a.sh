#!/bin/bash
# One device call for next-device3 (main + bf16 + pingpong + jax-stream + fp16-split; `.commit`),
# carried with cupy_maxsim/prebuilt (its sm_90 cubins) and this script:
#   run: bash s40a.sh     carry: [".commit", "cupy_maxsim/prebuilt", "s40a.sh"]
# Order: the new pieces' GPU tests (split, turns, bf16, jax stream), memcheck of the split and turns
# builds with CuPy's pool off, then the fp32 split cells beside bf16's and the turns A/B. Short table last.
export PYTHONPATH=$PWD
echo "commit $(cat .commit 2>/dev/null)" | tee "$OUT/provenance.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv | tee -a "$OUT/provenance.txt"
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__)" | tee -a "$OUT/provenance.txt"
date -u | tee -a "$OUT/provenance.txt"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp32_split.py tests/test_turns.py 2>&1 \
  | tail -25 | tee "$OUT/tests-split-turns.log"
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_backward.py -k jax 2>&1 | tail -5 | tee "$OUT/tests-jax.log"
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_index.py tests/test_shards.py \
  -k "bfloat16 or failed_sharded_add" 2>&1 | tail -5 | tee "$OUT/tests-bf16.log"
timeout 80 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_split.py 2>&1 | tail -4 \
  | tee "$OUT/memcheck-split.log"
timeout 60 compute-sanitizer --tool memcheck --leak-check no python3 -c "
import cupy, numpy as np, cupy_maxsim as cm
from cupy_maxsim import tuning
cupy.cuda.set_allocator(None)
r = cupy.random.default_rng(0)
with tuning.override(wgmma_turns=True):
    q = r.standard_normal((12, 32, 64), dtype=cupy.float32).astype(cupy.float16)
    d = r.standard_normal((9, 70, 64), dtype=cupy.float32).astype(cupy.float16)
    cm.score(q, d, d_mask=r.random((9, 70)) < 0.7, return_argmax=True)
    cm.score_packed(q, d.reshape(-1, 64)[:400], cupy.asarray([0, 5, 5, 140, 141, 400]), return_argmax=True)
    (q8, qs), (d8, ds) = cm.quantize_int8(q), cm.quantize_int8(d)
    cm.score(q8, d8, q_scale=qs, d_scale=ds)
    cm.score(q[:6], d)
cupy.cuda.runtime.deviceSynchronize(); print('done')
" 2>&1 | tail -4 | tee "$OUT/memcheck-turns.log"
timeout 130 python3 bench/cliffs.py --dtypes float32,bfloat16 --dims 64,128,320,1024 --queries 32 --ours-only \
  --tunables wgmma_fp32_split=1 --reps 5 --out "$OUT" 2>&1 | tail -12 | tee "$OUT/cliffs-split.txt"
timeout 100 python3 bench/ab_many_queries.py --ab wgmma_turns=False,True --rounds 3 \
  --only "vs 10000,fp16 dim 64,int8 dim 64,fp16 dim 128" 2>&1 | tail -8 | tee "$OUT/ab-turns.txt"
echo "==== summary"; tail -2 "$OUT/tests-split-turns.log" "$OUT/tests-jax.log" "$OUT/tests-bf16.log" "$OUT/memcheck-split.log" "$OUT/memcheck-turns.log"
tail -6 "$OUT/cliffs-split.txt"; tail -6 "$OUT/ab-turns.txt"
