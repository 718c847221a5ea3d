#!/usr/bin/env bash
# s34b: the wide selection in one cooperative launch (70042d4): GPU tests of topk/search/index, memcheck + racecheck of
# sanitize_search, ab_search 1q (wide off/on) and 32q x 10k x 1030 (wide off/always), ncu of searches.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl
export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1 CUPY_MAXSIM_COMMIT=$(cat .commit)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ date -u; echo "commit $CUPY_MAXSIM_COMMIT"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt
t tests; timeout 200 python3 -m pytest -m gpu tests/test_topk.py tests/test_search.py tests/test_index.py tests/test_shards.py tests/test_streaming.py -q 2>&1 | tail -25 > $OUT/gpu_tests.log; tail -3 $OUT/gpu_tests.log
t memcheck; PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_search.py 2>&1 | tail -6 > $OUT/memcheck.log; tail -3 $OUT/memcheck.log
t ab1; timeout 150 python3 bench/ab_search.py --rounds 7 --ks 10,100,1000,2048 --ab search_wide_select_min=-1,16384 > $OUT/ab-1q.txt 2>&1; cat $OUT/ab-1q.txt
t ab32; timeout 100 python3 bench/ab_search.py --rounds 9 --queries 32 --docs 10000 --doc-tokens 1030 --ks 100 --ab search_wide_select_min=-1,0 > $OUT/ab-32q.txt 2>&1; cat $OUT/ab-32q.txt
t ncu; timeout 120 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv python3 bench/ncu_search.py > $OUT/ncu-search.csv 2>&1
python3 - <<'PY' > $OUT/ncu-summary.txt
import csv, os
rows = [r for r in csv.reader(open(os.environ["OUT"] + "/ncu-search.csv")) if len(r) > 10]
head = rows[0]; ki, ui, vi = head.index("Kernel Name"), head.index("Metric Unit"), head.index("Metric Value")
gi = head.index("Grid Size") if "Grid Size" in head else None
for r in rows[1:]:
    print(f"{r[ki][:40]:40s} {r[gi] if gi is not None else '':>16s} {r[vi]:>12s} {r[ui]}")
PY
cat $OUT/ncu-summary.txt
t racecheck; timeout 200 compute-sanitizer --tool racecheck python3 bench/sanitize_search.py > $OUT/racecheck-full.log 2>&1
{ grep -o "access at [a-z_0-9]*" $OUT/racecheck-full.log | sort | uniq -c; tail -3 $OUT/racecheck-full.log; } > $OUT/racecheck.log; cat $OUT/racecheck.log; rm $OUT/racecheck-full.log
t done
