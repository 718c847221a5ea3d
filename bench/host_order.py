"""Does running another provider (or sleeping) slow our next training steps? Probes our step (do_bench style, and the host free-running) between the peers' runs, after a 1 s sleep and with torch.set_num_threads(1), in one process: python bench/host_order.py"""
import sys, time
import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from bench_train import SHAPES, _unit, providers, make_step
from bench_forward import _median_ms

def host_us(step, calls=20, rounds=5):
    runs = []
    for _ in range(rounds):
        torch.cuda.synchronize(); t = time.perf_counter()
        for _ in range(calls): step()
        runs.append((time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return min(runs)

found, _ = providers(torch)
for name, (nq, lq, nd, ld, dim) in list(SHAPES.items())[::-1]:
    q0, d0 = _unit(torch, (nq, lq, dim), 1), _unit(torch, (nd, ld, dim), 2)
    grad = torch.randn(nq, nd, device="cuda")
    steps = {p: make_step(fn, q0, d0, grad)[0] for p, fn in found.items()}
    for s in steps.values(): s(); s()
    ours = steps["cupy_maxsim"]
    def probe(label):
        ms = _median_ms(torch, ours, reps=30, warmup=3)
        print(f"  {label:28s} ours bench {ms*1e3:6.1f} us  host {host_us(ours):6.1f} us", flush=True)
    print("==", name, flush=True)
    probe("start"); probe("again"); probe("again")
    for other in ("flash_maxsim_0.3.0", "late_interaction_kernels_0.4.5", "naive_torch_fp16"):
        if other not in steps: continue
        _median_ms(torch, steps[other], reps=30, warmup=3)
        probe(f"after {other[:12]}")
        probe("  again")
    time.sleep(1.0); probe("after 1 s sleep")
    torch.set_num_threads(1)
    for other in ("flash_maxsim_0.3.0", "late_interaction_kernels_0.4.5", "naive_torch_fp16"):
        if other not in steps: continue
        _median_ms(torch, steps[other], reps=30, warmup=3)
        probe(f"1 thread, after {other[:12]}")
