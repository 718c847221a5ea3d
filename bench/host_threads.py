"""Host microseconds per call of the operations a training step's adapter makes, on the
forward's thread and on torch's backward thread (the same loop run inside an autograd
Function's backward): which allocation call, which launch path and which operand check to use
where. Best and median of 7 x 200 calls: python bench/host_threads.py [--out FILE]"""
import argparse
import ctypes
import statistics
import time

import cupy
import torch

from cupy_maxsim import _kernels
from cupy_maxsim._arrays import Output, as_operand

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--out", help="also write the table here")
options = parser.parse_args()

device = torch.device("cuda", 0)
q = torch.randn(32, 32, 128, device=device, dtype=torch.float16)
grad = torch.randn(32, 128, device=device)
empty_kernel = cupy.RawKernel('extern "C" __global__ void nothing(const long long x) {}', "nothing")
empty_kernel.compile()
function = empty_kernel.kernel.ptr
template = _kernels.ArgTemplate(_kernels.ArgStruct((("x", "q"),)), [0], ("x",))
prepared = _kernels.PreparedLaunch(empty_kernel, (1,), (32,), 0)
packed = template(0)
backward_template = _kernels.ArgTemplate(_kernels.backward_args, [0] * len(_kernels.BACKWARD_ARGS),
                                         _kernels.BACKWARD_HEAD)


def ctypes_launch(library):
    launch = library.cuLaunchKernel
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    launch.restype = ctypes.c_int
    return lambda stream: launch(function, 1, 1, 1, 32, 1, 1, 0, stream, ctypes.addressof(packed), None)


cdll_launch = ctypes_launch(ctypes.CDLL("libcuda.so.1"))
pydll_launch = ctypes_launch(ctypes.PyDLL("libcuda.so.1"))
raw_stream = torch._C._cuda_getCurrentRawStream
d = torch.randn(128, 1030, 128, device=device, dtype=torch.float16)
output = Output(as_operand(q, "q"))
names = {torch.float32: "float32"}


def import_in_function():
    import torch

    return torch


def versions_generator(tensors):
    return tuple(None if t is None else t._version for t in tensors)

ITEMS = {
    "torch.empty(shape, dtype=, device=torch.device)": lambda: torch.empty((32, 128), dtype=torch.float32, device=device),
    "torch.empty(shape, dtype=, device=int)": lambda: torch.empty((32, 128), dtype=torch.float32, device=0),
    "q.new_empty(shape, dtype=)": lambda: q.new_empty((32, 128), dtype=torch.float32),
    "torch.empty_like(q)": lambda: torch.empty_like(q),
    "raw current stream": lambda: raw_stream(0),
    "launch: PreparedLaunch.launch_packed (cupy driver)": lambda: prepared.launch_packed(packed, raw_stream(0)),
    "launch: ctypes CDLL cuLaunchKernel": lambda: cdll_launch(raw_stream(0)),
    "launch: ctypes PyDLL cuLaunchKernel (keeps the GIL)": lambda: pydll_launch(raw_stream(0)),
    "torch.empty_like(d) 33 MB": lambda: torch.empty_like(d),
    "Output.empty((32, 128), float32) (the library's)": lambda: output.empty((32, 128), "float32"),
    "as_operand(grad)": lambda: as_operand(grad, "grad_scores"),
    "a step's backward arguments (ArgTemplate call)": lambda: backward_template(*range(9)),
    "import torch inside a function": import_in_function,
    "str(grad.dtype)": lambda: str(grad.dtype),
    "dict by dtype object": lambda: names.get(grad.dtype),
    "versions: generator over (q, d, None)": lambda: versions_generator((q, d, None)),
    "versions: (q._version, d._version)": lambda: (q._version, d._version),
    "grad.data_ptr(), grad.stride(), grad.shape": lambda: (grad.data_ptr(), grad.stride(), grad.shape),
}


def time_items(n=200, reps=7) -> dict:
    result = {}
    for name, fn in ITEMS.items():
        for _ in range(20):
            fn()
        runs = []
        for _ in range(reps):
            t = time.perf_counter_ns()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter_ns() - t) / n / 1e3)
        result[name] = (min(runs), statistics.median(runs))
    return result


class TimedInBackward(torch.autograd.Function):
    found: dict = {}

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        cupy.cuda.runtime.setDevice(0)  # this thread's primary context current (the library does the same)
        TimedInBackward.found = time_items()
        return g


lines = [f"{'call':52s} {'fwd best':>9s} {'fwd med':>8s} {'bwd best':>9s} {'bwd med':>8s}"]
for round_ in range(2):
    main = time_items()
    x = torch.zeros(4, device=device, requires_grad=True)
    TimedInBackward.apply(x).sum().backward()
    torch.cuda.synchronize()
    back = TimedInBackward.found
    for name in ITEMS:
        lines.append(f"{name:52s} {main[name][0]:9.1f} {main[name][1]:8.1f} {back[name][0]:9.1f} {back[name][1]:8.1f}")
    lines.append("--")
print("\n".join(lines), flush=True)
if options.out:
    with open(options.out, "w") as f:
        f.write("\n".join(lines) + "\n")
