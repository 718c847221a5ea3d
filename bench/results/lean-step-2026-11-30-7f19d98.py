# How low can the host path of a training step go? python .exp/lean_step.py
import ctypes, struct, sys, time
import torch
sys.path.insert(0, "bench")
from bench_train import SHAPES, _unit
from bench_forward import _median_ms
import cupy_maxsim as cm
import cupy_maxsim.torch as cmt
from cupy_maxsim import _api, _kernels
from cupy_backends.cuda.api import driver

def host_us(fn, calls=100, rounds=7):
    for _ in range(5): fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls): fn()
        runs.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return min(runs), sorted(runs)[len(runs) // 2]

class Empty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, d):
        ctx.save_for_backward(q, d)
        return q.new_empty((q.shape[0], d.shape[0]), dtype=torch.float32)
    @staticmethod
    def backward(ctx, grad):
        q, d = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(d)

raw_stream = torch._C._cuda_getCurrentRawStream

class Launch:
    """A kernel, its geometry and a reusable argument buffer (cuLaunchKernel copies it)."""
    def __init__(self, kernel, grid, block, shared, nbytes, extra=None):
        self.fn = kernel.kernel.ptr
        g = tuple(grid) + (1,) * (3 - len(grid)); b = tuple(block) + (1,) * (3 - len(block))
        self.geom = g + b + (shared,)
        self.buf = ctypes.create_string_buffer(nbytes)
        bufs = [self.buf] + ([ctypes.create_string_buffer(extra, len(extra))] if extra else [])
        self._keep = bufs
        self.params = (ctypes.c_void_p * len(bufs))(*[ctypes.addressof(x) for x in bufs])
        self.addr = ctypes.addressof(self.params)
    def __call__(self, stream):
        driver.launchKernel(self.fn, *self.geom, stream, self.addr, 0)

def make_lean(q, d):
    qd, dd = q.detach(), d.detach()
    s, a = cm.score(qd, dd, return_argmax=True)
    s, a = cm.score(qd, dd, return_argmax=True)
    plan = _api.backward_plan(qd, dd, a); plan.gradients(torch.zeros_like(s))
    plan = _api.backward_plan(qd, dd, a)
    replay = _api._replays[_api._replay_key(qd, dd, True)]
    template = _api._backward_templates[_api._backward_key(qd, dd, a, False)[0]]
    fp = replay.plan
    tile = _kernels.doc_tile_map(dd.data_ptr(), *replay.tile_map_shape) if replay.tile_map_shape else None
    fwd = Launch(fp.kernel, replay.grid, (fp.threads,), fp.shared, _kernels.forward_args.size, tile)
    fvals = list(replay.values)
    fstruct = _kernels.forward_args._pack
    k, grid, block, shared = template._csr
    csr = Launch(k, grid, block, shared, _kernels.backward_args.size)
    grads = [Launch(k2, g2, b2, 0, _kernels.backward_args.size) for k2, g2, b2 in template._launches]
    bvals = list(template._values)
    bstruct = _kernels.backward_args._pack
    AT = _api._BWD_AT
    words, starts = template._scratch_words, template._scratch_starts
    shape, ashape = replay.shape, replay.argmax_shape
    dev = q.device; idx = dev.index
    qa, da, oa, aa = replay.q_at, replay.d_at, replay.out_at, replay.argmax_at
    gqs = AT["grad_query_stride"]; gds = AT["grad_doc_stride"]

    class Lean(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, d):
            stream = raw_stream(idx)
            qp, dp = q.data_ptr(), d.data_ptr()
            scores = torch.empty(shape, dtype=torch.float32, device=dev)
            argmax = torch.empty(ashape, dtype=torch.int16, device=dev)
            scratch = torch.empty((words,), dtype=torch.int32, device=dev)
            fvals[qa], fvals[da], fvals[oa], fvals[aa] = qp, dp, scores.data_ptr(), argmax.data_ptr()
            fstruct.pack_into(fwd.buf, 0, *fvals)
            fwd(stream)
            sp = scratch.data_ptr()
            vals = list(bvals)
            vals[AT["q"]], vals[AT["d"]], vals[AT["argmax"]] = qp, dp, argmax.data_ptr()
            for name, start in zip(_api._BWD_SCRATCH, starts):
                vals[AT[name]] = 0 if start is None else sp + 4 * start
            bstruct.pack_into(csr.buf, 0, *vals)
            csr(stream)
            ctx.vals, ctx.scratch = vals, scratch
            ctx.save_for_backward(q, d, argmax)
            return scores
        @staticmethod
        def backward(ctx, g):
            q, d, argmax = ctx.saved_tensors
            stream = raw_stream(idx)
            gq = torch.empty_like(q); gd = torch.empty_like(d)
            vals = ctx.vals
            vals[AT["grad"]], vals[AT["grad_q"]], vals[AT["grad_d"]] = g.data_ptr(), gq.data_ptr(), gd.data_ptr()
            vals[gqs], vals[gds] = g.stride()
            for L in grads:
                bstruct.pack_into(L.buf, 0, *vals)
                L(stream)
            return gq, gd
    return Lean.apply

for name, (nq, lq, nd, ld, dim) in SHAPES.items():
    q = _unit(torch, (nq, lq, dim), 1).requires_grad_(True)
    d = _unit(torch, (nd, ld, dim), 2).requires_grad_(True)
    grad = torch.randn(nq, nd, device="cuda")
    import os
    lean = make_lean(q, d) if os.environ.get("LEAN", "1") == "1" else cmt.maxsim
    def step(fn=cmt.maxsim):
        q.grad = d.grad = None
        fn(q, d).backward(grad)
    # the lean step's gradients equal ours
    step(); ref = (q.grad.clone(), d.grad.clone()); step(lean)
    same = torch.equal(ref[0], q.grad) and torch.equal(ref[1], d.grad)
    print("==", name, "tree", cm.__file__, "lean grads bitwise equal:", same, flush=True)
    fns = {"ours": cmt.maxsim, "lean": lean, "empty": Empty.apply}
    try:
        import flash_maxsim as fm; fns["flash"] = fm.flash_maxsim_batched_train
    except Exception as e: print("no flash", e)
    for label, fn in fns.items():
        b, m = host_us(lambda: step(fn))
        ms = _median_ms(torch, lambda: step(fn), reps=30, warmup=3)
        ms2 = _median_ms(torch, lambda: step(fn), reps=30, warmup=3)
        sy = _median_ms(torch, lambda: step(fn), reps=30, warmup=3, synced=True)
        print(f"  {label:6s} host {b:6.1f} us (med {m:6.1f})  bench {ms*1e3:6.1f} / {ms2*1e3:6.1f} us  synced {sy*1e3:6.1f} us", flush=True)
    # GPU kernel times of our step
    from torch.profiler import profile, ProfilerActivity
    for label in ("ours",):
        fn = fns[label]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20): step(fn)
            torch.cuda.synchronize()
        tot = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                tot[e.name] = tot.get(e.name, 0) + e.device_time
        print(f"  {label} GPU per step:", ", ".join(f"{k[:28]} {v/20:.1f}" for k, v in sorted(tot.items(), key=lambda x: -x[1])), flush=True)
