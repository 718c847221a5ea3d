#!/usr/bin/env bash
# s34g (d00e4b0): the int8 Index under tma_l2_promotion None (256 for its 128-byte rows) / 0 / 128,
# sustained; ncu's L2 fabric metric with the promotion off.
set -o pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 CUPY_MAXSIM_COMMIT=$(cat .commit)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
t sustained; timeout 150 python3 bench/sustained_int8.py --batches 4 --calls 40 --ab tma_l2_promotion=None,0,128 > $OUT/sustained-promo.txt 2>&1; tail -24 $OUT/sustained-promo.txt
NCU="ncu --clock-control none --profile-from-start off -k regex:maxsim_fwd --section SpeedOfLight --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second,lts__cycles_elapsed.avg.per_second"
t ncu-int8-promo0; timeout 120 $NCU python3 bench/profile_one.py 1 32 1000000 128 int8 packed fixed search tune:tma_l2_promotion=0 > $OUT/ncu-int8-promo0.txt 2>&1; grep -E "Duration|L2 Cache|DRAM Through|ltcfabric|fill_device|lts__t_sectors.sum|per_second" $OUT/ncu-int8-promo0.txt | head -20
t ncu-fp16; timeout 120 $NCU python3 bench/profile_one.py 1 32 1000000 128 packed fixed search > $OUT/ncu-fp16.txt 2>&1; grep -E "Duration|L2 Cache|DRAM Through|ltcfabric|fill_device|lts__t_sectors.sum|per_second" $OUT/ncu-fp16.txt | head -20
t done
