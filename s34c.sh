#!/usr/bin/env bash
# s34c: issue 25's acceptance run at the wide selection (accept_search), and the search host probe.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl
export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1 CUPY_MAXSIM_COMMIT=$(cat .commit)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
t probe; timeout 90 python3 bench/search_host_probe.py --docs 200000 > $OUT/probe-200k.txt 2>&1; cat $OUT/probe-200k.txt
t ab200k; timeout 90 python3 bench/ab_search.py --rounds 7 --docs 200000 --ks 10,1000,2048 --ab search_wide_select_min=-1,16384 > $OUT/ab-200k.txt 2>&1; cat $OUT/ab-200k.txt
t accept; timeout 420 python3 bench/accept_search.py --out $OUT > $OUT/accept.log 2>&1; tail -25 $OUT/accept.log
t done
