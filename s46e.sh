#!/usr/bin/env bash
# s46e: branch tf32-stretch (split-loads + one accumulator set by stretches, off by default): its GPU tests, memcheck of
# fp32 one query (two sets and stretches), then fp32 one query against main in one process: main, the branch's two sets
# (split-loads), the branch's stretches (three warpgroups where no winners).
# Carry: .whl .prebuilt-tf32-stretch-d8e321a.tar.xz .prebuilt-main.tar.xz .commit ab_main (git archive main cupy_maxsim kernels_cu bench).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --target "$HOME/site" .whl/*.whl 2>/dev/null; export PYTHONPATH="$HOME/site:$PWD" PYTHONUNBUFFERED=1
mkdir -p cupy_maxsim/prebuilt ab_main/cupy_maxsim/prebuilt && tar -C cupy_maxsim -xJf .prebuilt-tf32-stretch-d8e321a.tar.xz && tar -C ab_main/cupy_maxsim -xJf .prebuilt-main.tar.xz
T0=$(date +%s); export CUPY_MAXSIM_COMMIT=$(cat .commit)
{ date -u; echo "commit $(cat .commit) (main: a298046, kernels as 204b639)"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv; } 2>&1 | tee $OUT/env.txt
echo "== pytest"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_tf32_stretch.py tests/test_no_cliffs.py -k "stretch or float32 or fp32 or stream_queries" 2>&1 | tail -4 | tee $OUT/tests.log
echo "== memcheck sanitize_forward tf32 ($(( $(date +%s) - T0 )) s)"
timeout 80 compute-sanitizer --tool memcheck --leak-check no python3 bench/sanitize_forward.py tf32 2>&1 | tail -3 | tee $OUT/memcheck.log
echo "== A/B fp32 one query ($(( $(date +%s) - T0 )) s)"
timeout 120 python3 - <<'PY' 2>&1 | tee $OUT/ab.txt
import sys, statistics, importlib
from pathlib import Path
sys.path.insert(0, "bench")
import torch
from ab_host_step import import_base
from bench_forward import _median_ms
import cupy_maxsim as ours
from cupy_maxsim import tuning
import_base(Path("ab_main"))
base = importlib.import_module("cupy_maxsim_base")
print("fp32 1x32 vs 4 GB (300 tokens a document), do_bench-style medians (L2 flushed) of 3 rounds, the three taking turns")
print("| dim | docs | main ms | two sets (split-loads) ms | stretches of 4 ms | split-loads / main | stretches / main | max diff stretches vs main |")
def stretched(q, d):
    with tuning.override(wgmma_tf32_stretch=4):
        return ours.score(q, d)
def sets(q, d):
    with tuning.override(wgmma_tf32_stretch=0):
        return ours.score(q, d)
for dim in (128, 768, 1024):
    docs = int(4e9 / (300 * dim * 4))
    g = torch.Generator(device="cuda").manual_seed(dim)
    q = torch.nn.functional.normalize(torch.randn(1, 32, dim, device="cuda", generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(docs, 300, dim, device="cuda", generator=g), dim=-1)
    calls = {"main": lambda: base.score(q, d), "sets": lambda: sets(q, d), "stretch": lambda: stretched(q, d)}
    answers = {k: f() for k, f in calls.items()}
    diff = float((answers["stretch"] - answers["main"]).abs().max() / answers["main"].abs().max())
    same = bool(torch.equal(answers["sets"], answers["main"]))
    times = {k: [] for k in calls}
    for _ in range(3):
        for k, f in calls.items():
            times[k].append(_median_ms(torch, f, reps=20))
    m = {k: statistics.median(v) for k, v in times.items()}
    print(f"| {dim} | {docs} | {m['main']:.3f} | {m['sets']:.3f} (identical {same}) | {m['stretch']:.3f} | {m['main'] / m['sets']:.3f}x | {m['main'] / m['stretch']:.3f}x | {diff:.2e} |", flush=True)
    del d; torch.cuda.empty_cache()
PY
echo "== end ($(( $(date +%s) - T0 )) s)"
