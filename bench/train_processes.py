"""bench_train.py in several fresh processes, one summary: the training step is host-bound, and
the host's speed (and how many steps stall) moves from process to process by up to 2x, for the
peers as well (docs/notebook.md, sixth day). Per process and shape: our median step, flash-maxsim's,
the ratio, the fastest step of each, the CUDA-graph steps, and the autograd floor (a Function that
only allocates: what no autograd library's step can beat there); then the median over processes.

    python bench/train_processes.py --processes 3 --out bench/results/train-processes-<date>-<commit>
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from bench_train import AUTOGRAD_FLOOR  # noqa: E402


def summary(reports: list[dict]) -> str:
    lines = ["| process | shape | ours ms | flash ms | vs flash | ours fastest | flash fastest | ours graphed ms "
             "| flash graphed ms | graphed vs flash | autograd floor ms | floor's rounds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {}
    graphed_ratios: dict[str, list[float]] = {}
    for k, report in enumerate(reports, 1):
        for row in report["rows"]:
            ours = row["providers"].get("cupy_maxsim", {})
            flash = row["providers"].get("flash_maxsim_0.3.0", {})
            if "ms" not in ours or "ms" not in flash:
                continue
            ratio = flash["ms"] / ours["ms"]
            ratios.setdefault(row["shape"], []).append(ratio)
            graphed = [result.get("ms_graphed") for result in (ours, flash)]
            graphed_text = " | ".join(f"{g:.3f}" if isinstance(g, float) else "-" for g in graphed)
            if all(isinstance(g, float) for g in graphed):
                graphed_ratios.setdefault(row["shape"], []).append(graphed[1] / graphed[0])
                graphed_text += f" | {graphed[1] / graphed[0]:.2f}x"
            else:
                graphed_text += " | -"
            floor = row["providers"].get(AUTOGRAD_FLOOR, {})
            floor_text = (f"{floor['ms']:.3f} | {' / '.join(f'{m:.3f}' for m in floor['ms_rounds'])}"
                          if "ms" in floor else "- | -")
            lines.append(f"| {k} | {row['shape']} | {ours['ms']:.3f} | {flash['ms']:.3f} | {ratio:.2f}x | "
                         f"{ours['step_ms_min_max'][0]:.3f} | {flash['step_ms_min_max'][0]:.3f} | {graphed_text} | "
                         f"{floor_text} |")
    for shape, values in ratios.items():
        graphed = graphed_ratios.get(shape)
        graphed_text = f"{statistics.median(graphed):.2f}x (min {min(graphed):.2f}x)" if graphed else "-"
        lines.append(f"| median of {len(values)} | {shape} | | | {statistics.median(values):.2f}x "
                     f"(min {min(values):.2f}x) | | | | | {graphed_text} | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="path prefix: <out>-process<k>.json, <out>.txt")
    args = parser.parse_args(argv)
    reports = []
    for k in range(1, args.processes + 1):
        path = Path(f"{args.out}-process{k}.json")
        subprocess.run([sys.executable, str(HERE / "bench_train.py"), "--out", str(path)], check=True,
                       stdout=subprocess.DEVNULL)
        reports.append(json.loads(path.read_text()))
    text = summary(reports)
    Path(f"{args.out}.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
