#!/usr/bin/env bash
# s34e: what bounds the int8 Index's forward: ncu L2 breakdown of int8 and fp16 packed fixed 1M x 128
# (profile_one ... search), and the int8 search under tma_l2_promotion values, sustained.
set -o pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 CUPY_MAXSIM_COMMIT=$(cat .commit)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
NCU="ncu --clock-control none --profile-from-start off -k regex:maxsim_fwd --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:l1tex__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.sum,lts__t_requests.sum,lts__t_tag_requests.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second,lts__cycles_elapsed.avg.per_second"
t ncu-int8; timeout 200 $NCU python3 bench/profile_one.py 1 32 1000000 128 int8 packed fixed search > $OUT/ncu-int8.txt 2>&1; grep -E "Duration|Throughput|lts__|dram__bytes|per_second|Busy|Hit" $OUT/ncu-int8.txt | head -60
t ncu-fp16; timeout 200 $NCU python3 bench/profile_one.py 1 32 1000000 128 packed fixed search > $OUT/ncu-fp16.txt 2>&1; grep -E "Duration|Throughput|lts__|dram__bytes|per_second|Busy|Hit" $OUT/ncu-fp16.txt | head -60
t sustained; timeout 150 python3 bench/sustained_int8.py --batches 4 --calls 40 --ab tma_l2_promotion=None,0,128 > $OUT/sustained-ab.txt 2>&1; tail -32 $OUT/sustained-ab.txt
t done
