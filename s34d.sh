#!/usr/bin/env bash
# s34d: the int8 Index alone against sustained (sustained_int8.py), with clocks.
set -o pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 CUPY_MAXSIM_COMMIT=$(cat .commit)
timeout 200 python3 bench/sustained_int8.py > $OUT/sustained-int8.txt 2>&1; cat $OUT/sustained-int8.txt
