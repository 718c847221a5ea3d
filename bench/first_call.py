"""Issue 26's first-call line: the first call in a fresh process from an installed wheel with
empty caches, beyond CuPy's own import (line: at most 0.5 s on the H200).

Each cell is a new Python process with PYTHONPATH at the installed package (``--site``; default:
this checkout), run from an empty folder, with new empty CUPY_CACHE_DIR and CUPY_MAXSIM_CACHE_DIR.
The process imports CuPy, makes its inputs from NumPy (a copy, no CuPy kernel to compile) and
synchronizes: that is CuPy's own import and context, the baseline. Then it imports cupy_maxsim,
makes the call and synchronizes: the first-call time; then the same call again (warm). Cells:
score (padded fp16), score_packed, search (k=10), int8 score, an int8 Index built and searched,
and a torch training step
(forward and backward; its baseline imports torch too), each with the wheel's prebuilt cubins
and without them (CUPY_MAXSIM_NO_PREBUILT=1: NVRTC compiles, as on a build without cubins).

    python bench/first_call.py [--site DIR] [--out DIR]

Writes first-call-<date>-<commit>.json; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, sys, time
import numpy as np
t0 = time.perf_counter()
import cupy
TORCH = {torch}
if TORCH:
    import torch
    torch.zeros(1, device="cuda")
rng = np.random.default_rng(0)
q = cupy.asarray(rng.standard_normal((32, 128), dtype=np.float32).astype(np.float16))
d = cupy.asarray(rng.standard_normal((1000, 128, 128), dtype=np.float32).astype(np.float16))
cupy.cuda.Device().synchronize()
t1 = time.perf_counter()
import cupy_maxsim as cm
def call():
    {call}
call()
cupy.cuda.Device().synchronize()
t2 = time.perf_counter()
call()
cupy.cuda.Device().synchronize()
t3 = time.perf_counter()
print(json.dumps({{"baseline_s": t1 - t0, "first_call_s": t2 - t1, "warm_s": t3 - t2,
                   "package": cm.__file__}}))
"""

CELLS = {
    "score": (False, "cm.score(q, d)"),
    "score_packed": (False, "cm.score_packed(q, *cm.pack([d[i, : 64 + i % 64] for i in range(1000)]))"),
    "search": (False, "cm.search(q, d, 10)"),
    "int8": (False, "qq, qs = cm.quantize_int8(q); dq, ds = cm.quantize_int8(d); "
                    "cm.score(qq, dq, q_scale=qs, d_scale=ds)"),
    "index_int8": (False, "ix = cm.Index(128, dtype='int8', device='cuda'); ix.add(d); ix.search(q, 10)"),
    "torch_step": (True, "import cupy_maxsim.torch as ct; qt = torch.from_dlpack(q)[None].clone().requires_grad_(); "
                         "ct.maxsim(qt, torch.from_dlpack(d)).sum().backward()"),
}


def run_cell(site: Path, call: str, torch: bool, prebuilt: bool) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                                        if p and Path(p).resolve() != ROOT]),
               "CUPY_CACHE_DIR": str(Path(folder) / "cupy"), "CUPY_MAXSIM_CACHE_DIR": str(Path(folder) / "cm")}
        env.pop("CUPY_MAXSIM_NO_PREBUILT", None)
        if not prebuilt:
            env["CUPY_MAXSIM_NO_PREBUILT"] = "1"
        code = _CHILD.format(torch=torch, call=call)
        done = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True)
        if done.returncode:
            return {"error": done.stderr[-2000:]}
        return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=ROOT, help="where the package is installed (default: the checkout)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--cells", default=",".join(CELLS))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_forward import write_record

    results = {}
    for name in args.cells.split(","):
        torch, call = CELLS[name]
        for prebuilt in (True, False):
            results[f"{name}/{'prebuilt' if prebuilt else 'compiled'}"] = run_cell(args.site, call, torch, prebuilt)
    path = write_record(args.out, "first-call", {"site": str(args.site), "line_s": 0.5, "results": results})
    print(f"{'cell':<26} {'baseline s':>11} {'first call s':>13} {'warm s':>8}  package")
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<26} ERROR {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        print(f"{name:<26} {r['baseline_s']:>11.3f} {r['first_call_s']:>13.3f} {r['warm_s']:>8.4f}  {r['package']}")
    print(f"line: first call at most 0.5 s beyond the baseline (with the wheel's cubins); {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
