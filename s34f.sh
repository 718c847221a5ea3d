#!/usr/bin/env bash
# s34f (d00e4b0): two split warpgroups double-buffering 128-row tiles against three (ab_tunables,
# sustained int8 Index), the Hopper GPU test under both, ncu L2 breakdown of the int8 Index forward.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl
export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1 CUPY_MAXSIM_COMMIT=$(cat .commit)
T0=$(date +%s); t() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
t test; timeout 150 python3 -m pytest -m gpu tests/test_gpu.py -k "hopper_kernel_against_reference" -q 2>&1 | tail -8 > $OUT/gpu-tests.log; tail -3 $OUT/gpu-tests.log
t ab; timeout 200 python3 bench/ab_tunables.py --variant wg3: --variant wg2:wgmma_split_warpgroups=2 --cells fp16-128-4GB,fp16-64-4GB,int8-128-4GB,int8-packed-500kx128 --rounds 3 --out $OUT > $OUT/ab-wg.txt 2>&1; tail -20 $OUT/ab-wg.txt
t sustained; timeout 120 python3 bench/sustained_int8.py --batches 4 --calls 40 --ab wgmma_split_warpgroups=3,2 > $OUT/sustained-wg.txt 2>&1; tail -22 $OUT/sustained-wg.txt
NCU="ncu --clock-control none --profile-from-start off -k regex:maxsim_fwd --section SpeedOfLight --section MemoryWorkloadAnalysis --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.sum,lts__t_requests.sum,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second,lts__cycles_elapsed.avg.per_second"
t ncu-int8; timeout 150 $NCU python3 bench/profile_one.py 1 32 1000000 128 int8 packed fixed search > $OUT/ncu-int8.txt 2>&1; grep -E "Duration|Throughput|lts__|dram__bytes|per_second" $OUT/ncu-int8.txt | head -40
t done
