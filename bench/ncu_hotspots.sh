#!/usr/bin/env bash
# Where a forward launch stalls: ncu's per-SASS-instruction warp-stall samples for one call of
# bench/profile_one.py, the top instructions with their main stall reasons, and the
# instructions executed per opcode. Usage (device machine, repo root):
#   OUT=/tmp/out KERNEL=maxsim_fwd_wgmma bash bench/ncu_hotspots.sh 128 32 128 300
set -o pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ncu --clock-control none --kernel-name "regex:${KERNEL:-maxsim_fwd}" --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    python3 bench/profile_one.py "$@" > "$OUT/source.csv" 2> "$OUT/ncu_err.txt"
python3 - "$OUT/source.csv" <<'PY'
import collections, csv, sys
rows = list(csv.reader(open(sys.argv[1])))
start = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
header, body = rows[start], rows[start + 1:]
col = {h: j for j, h in enumerate(header)}
reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
number = lambda r, h: float(r[col[h]] or 0) if len(r) > col[h] else 0.0  # noqa: E731
samples = "Warp Stall Sampling (All Samples)"
total = sum(number(r, samples) for r in body) or 1.0
print("stall reasons:", ", ".join(f"{k[6:]} {v / total:.0%}" for k, v in sorted(
    ((k, sum(number(r, k) for r in body)) for k in reasons), key=lambda kv: -kv[1])[:8]))
for r in sorted(body, key=lambda r: -number(r, samples))[:25]:
    top = sorted(((number(r, k), k[6:]) for k in reasons), reverse=True)[:2]
    print(f"{number(r, samples) / total:6.1%}  {r[col['Source']].strip()[:70]:<70} {top}")
opcodes = collections.Counter()
for r in body:
    words = r[col["Source"]].split()
    if words:
        opcodes[(words[1] if words[0].startswith("@") else words[0]).split(".")[0]] += number(r, "Instructions Executed")
print("instructions executed by opcode:", ", ".join(f"{k} {v:.3g}" for k, v in opcodes.most_common(15)))
PY
