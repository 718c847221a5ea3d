import json, sys
c, n, note = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows=[]
for p in range(1, n + 1):
    try:
        r=json.load(open(f"bench/results/train-2026-11-30-{c}-process{p}.json"))
    except FileNotFoundError:
        continue
    for row in r["rows"]:
        pr=row["providers"]; o=pr["cupy_maxsim"]; f=pr["flash_maxsim_0.3.0"]; fl=pr["autograd_floor_allocations_only"]
        rows.append(f"| {p} | {row['shape']} | {o['ms']:.3f} | {f['ms']:.3f} | {f['ms']/o['ms']:.2f}x | {o['ms_graphed']:.3f} | {f['ms_graphed']:.3f} | {f['ms_graphed']/o['ms_graphed']:.2f}x | {fl['ms']:.3f} ({min(fl['ms_rounds']):.3f}-{max(fl['ms_rounds']):.3f}) | {o['peak_extra_mb']:.1f} / {f['peak_extra_mb']:.1f} |")
hdr = f"# H200, 2026-11-30, tree {c}, flash-maxsim 0.3.0, bench/train_processes.py --processes {n}, do_bench medians of 7 rounds. {note}\n| process | shape | ours ms | flash ms | vs flash | ours graphed | flash graphed | graphed vs flash | autograd floor ms (rounds) | peak extra MB ours / flash |\n|---|---|---|---|---|---|---|---|---|---|"
open(f"bench/results/train-summary-2026-11-30-{c}.txt","w").write(hdr+"\n"+"\n".join(rows)+"\n")
print("\n".join(rows))
