"""The planners' decisions, recorded: a guard that a restructuring moves code, not behaviour.

Every problem below runs through the public functions on made-up device arrays with the GPU
layer stubbed (device properties of an A100, sm_80, and of an H200, sm_90; kernels, launches and
outputs stubbed, no GPU): each launch it would make is written down as the kernel's name, its
compile-time defines, grid, block, dynamic shared bytes, whether a TMA tile map goes with it,
and every non-pointer field of its argument struct. ``tests/data/plan_decisions.json`` holds the
decisions of the tree they were recorded on; this test fails on any difference. A deliberate
change to a planner rewrites the file (``python tests/test_plans.py --write``) in the commit
that changes it, and the commit says why.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import cupy_maxsim as cm
from support import count_calls, part_starts, stub_gpu

DECISIONS = Path(__file__).parent / "data" / "plan_decisions.json"

#: device_properties of the two stubbed devices: SMs, shared memory per block (opt-in) and per
#: SM, compute capability, L2 bytes.
DEVICES = {
    "sm80-a100": (108, 163 * 1024, 164 * 1024, 80, 40 * 2**20),
    "sm90-h200": (132, 227 * 1024, 228 * 1024, 90, 60 * 2**20),
}


class FakeDeviceArray:
    """What the library reads of a C-contiguous CuPy array (shape, strides, dtype, device,
    pointer), at a made-up device address."""

    __module__ = "cupy"

    def __init__(self, shape, dtype, ptr, values=None):
        self.shape, self.dtype = tuple(shape), _dtype(dtype)
        self.strides = tuple(int(np.prod(shape[k + 1:], dtype=np.int64)) * self.dtype.itemsize
                             for k in range(len(shape)))
        self.device = types.SimpleNamespace(id=0)
        self.data = types.SimpleNamespace(ptr=ptr)
        self.values = values  # offsets: what the stubbed device check reads back


class _Bfloat16:
    """What the library reads of a bfloat16 dtype (NumPy has none)."""

    name, itemsize = "bfloat16", 2


def _dtype(name: str):
    return _Bfloat16() if name == "bfloat16" else np.dtype(name)


class _Arrays:
    """Fresh fake device arrays at distinct 256-byte-aligned addresses."""

    def __init__(self):
        self.next = 0x10000000

    def __call__(self, shape, dtype="float16", values=None):
        ptr = self.next
        self.next += -(-int(np.prod(shape, dtype=np.int64)) * _dtype(dtype).itemsize // 256) * 256 + 256
        return FakeDeviceArray(shape, dtype, ptr, values)


def _problems():
    """name -> function(arrays) making the call. Sizes chosen to reach every planner branch:
    one query and many, short and long documents, every dtype, masks, pairs, packed, argmax on
    and off, dims off the tensor-core path, forward and backward."""
    problems = {}

    def score(nq, lq, nd, ld, dim=128, dtype="float16", masks=False, argmax=False):
        def run(a):
            q = a((lq, dim) if nq == 0 else (nq, lq, dim), dtype)
            d = a((nd, ld, dim), dtype)
            extra = {}
            if masks:
                extra = dict(q_mask=a(q.shape[:-1], "bool"), d_mask=a((nd, ld), "bool"))
            if dtype == "int8":
                extra.update(q_scale=a(q.shape[:-1], "float32"), d_scale=a((nd, ld), "float32"))
            cm.score(q, d, return_argmax=argmax, **extra)
        return run

    def pairs(b, lq, ld, dim=128, dtype="float16", argmax=False, masks=False):
        def run(a):
            q, d = a((b, lq, dim), dtype), a((b, ld, dim), dtype)
            extra = dict(q_mask=a((b, lq), "bool"), d_mask=a((b, ld), "bool")) if masks else {}
            if dtype == "int8":
                extra.update(q_scale=a((b, lq), "float32"), d_scale=a((b, ld), "float32"))
            cm.score_pairs(q, d, return_argmax=argmax, **extra)
        return run

    def packed(nq, lq, lengths, dim=128, dtype="float16", argmax=False):
        def run(a):
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            q = a((lq, dim) if nq == 0 else (nq, lq, dim), dtype)
            tokens = a((int(offsets[-1]), dim), dtype)
            extra = {}
            if dtype == "int8":
                extra.update(q_scale=a(q.shape[:-1], "float32"), d_scale=a((int(offsets[-1]),), "float32"))
            cm.score_packed(q, tokens, a(offsets.shape, "int64", offsets), return_argmax=argmax, **extra)
        return run

    def backward(nq, lq, nd, ld, dim=128, dtype="float16", mode="padded", lengths=None):
        def run(a):
            q = a((lq, dim) if nq == 0 else (nq, lq, dim), dtype)
            scores_shape = (nd,) if nq == 0 or mode == "pairs" else (nq, nd)
            extra = {}
            if mode == "packed":
                offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                d = a((int(offsets[-1]), dim), dtype)
                extra["offsets"] = a(offsets.shape, "int64", offsets)
                longest = max(lengths)
            else:
                d = a((nd, ld, dim), dtype)
                extra["pairs"] = mode == "pairs"
                longest = ld
            argmax = a(scores_shape + (lq,), "int16" if longest < 32768 else "int32")
            cm.score_backward(a(scores_shape, "float32"), q, d, argmax, **extra)
        return run

    ragged = [int(x) for x in np.random.default_rng(0).integers(16, 301, 500)]
    for dtype, short in (("float16", "fp16"), ("bfloat16", "bf16")):
        problems[f"{short}-rerank-1q-1k-300"] = score(0, 32, 1_000, 300, dtype=dtype)
        problems[f"{short}-corpus-1q-10k-300"] = score(0, 32, 10_000, 300, dtype=dtype)
        problems[f"{short}-colpali-1q-10k-1030"] = score(0, 32, 10_000, 1030, dtype=dtype)
        problems[f"{short}-colpali-32q-10k-1030"] = score(32, 32, 10_000, 1030, dtype=dtype)
        problems[f"{short}-inbatch-128q-128-300"] = score(128, 32, 128, 300, dtype=dtype)
        problems[f"{short}-colbert-256q-100k-128"] = score(256, 32, 100_000, 128, dtype=dtype)
        problems[f"{short}-inbatch-argmax"] = score(128, 32, 128, 300, dtype=dtype, argmax=True)
    problems["fp16-colbert-1q-1M-128"] = score(0, 32, 1_000_000, 128)
    problems["fp16-4q-masks"] = score(4, 31, 500, 77, masks=True)
    problems["fp16-8q-argmax-masks"] = score(8, 32, 300, 200, masks=True, argmax=True)
    problems["fp16-lq64-2q"] = score(2, 64, 1_000, 100)
    problems["fp16-lq65-3q"] = score(3, 65, 1_000, 100)
    problems["fp16-lq200-1q"] = score(1, 200, 100, 100)
    problems["fp16-dim64-16q"] = score(16, 32, 2_000, 180, dim=64)
    problems["fp16-dim96-1q"] = score(0, 32, 2_000, 180, dim=96)
    problems["fp16-dim256-1q"] = score(0, 32, 1_000, 300, dim=256)
    problems["fp16-dim100-simt"] = score(2, 32, 1_000, 300, dim=100)  # (the name from before item 3)
    problems["fp16-long-doc-argmax32"] = score(1, 32, 4, 40_000, argmax=True)
    problems["fp16-long-doc-argmax32-many"] = score(16, 32, 4, 40_000, argmax=True)
    problems["int8-corpus-1q-10k-300"] = score(0, 32, 10_000, 300, dtype="int8")
    problems["int8-colpali-1q-10k-1030"] = score(0, 32, 10_000, 1030, dtype="int8")
    problems["int8-colpali-32q-10k-1030"] = score(32, 32, 10_000, 1030, dtype="int8")
    problems["int8-inbatch-argmax"] = score(128, 32, 128, 300, dtype="int8", argmax=True)
    problems["int8-dim256-32q"] = score(32, 32, 1_000, 300, dim=256, dtype="int8")
    problems["fp32-corpus-1q"] = score(0, 32, 10_000, 300, dtype="float32")
    problems["fp32-inbatch-argmax"] = score(128, 32, 128, 300, dtype="float32", argmax=True)
    problems["fp64-4q"] = score(4, 32, 100, 50, dtype="float64")
    problems["pairs-fp16-64"] = pairs(64, 32, 300)
    problems["pairs-bf16-argmax-masks"] = pairs(64, 32, 300, dtype="bfloat16", argmax=True, masks=True)
    problems["pairs-int8"] = pairs(64, 32, 300, dtype="int8")
    problems["pairs-fp32"] = pairs(16, 32, 100, dtype="float32")
    problems["packed-fp16-1q-ragged"] = packed(0, 32, ragged)
    problems["packed-fp16-32q-ragged-argmax"] = packed(32, 32, ragged, argmax=True)
    problems["packed-bf16-colpali"] = packed(0, 32, [1030] * 300, dtype="bfloat16")
    problems["packed-int8-1q"] = packed(0, 32, ragged, dtype="int8")
    # Short documents, 16-128 tokens: ragged, 64-row tiles; all of 72 tokens (the same mean), 128.
    short = [int(x) for x in np.random.default_rng(1).integers(16, 129, 500)]
    problems["packed-fp16-1q-short-ragged"] = packed(0, 32, short)
    problems["packed-fp16-1q-short-equal"] = packed(0, 32, [72] * 500)
    problems["bwd-colbert-128q-128-300"] = backward(128, 32, 128, 300)
    problems["bwd-colpali-32q-128-1030"] = backward(32, 32, 128, 1030)
    problems["bwd-bf16-8q-300-70"] = backward(8, 32, 300, 70, dtype="bfloat16")
    problems["bwd-fp32-inbatch"] = backward(128, 32, 128, 300, dtype="float32")
    problems["bwd-fp64-small"] = backward(4, 32, 40, 50, dtype="float64")
    problems["bwd-1q-10k"] = backward(0, 32, 10_000, 300)
    problems["bwd-pairs-fp16"] = backward(64, 32, 64, 300, mode="pairs")
    problems["bwd-packed-ragged"] = backward(16, 32, 500, 0, mode="packed", lengths=ragged)
    problems["bwd-long-docs-8192"] = backward(8, 32, 16, 8192)
    problems["bwd-long-docs-40000"] = backward(4, 32, 2, 40_000)
    problems["bwd-320q-fused-too-big"] = backward(320, 32, 40, 70)
    problems["bwd-dim96"] = backward(64, 32, 64, 180, dim=96)
    # Fat dims: the mma.sync kernel streams k (issue 24).
    problems["fp16-dim2560-1q"] = score(0, 32, 1_000, 768, dim=2560)
    problems["bf16-dim320-32q"] = score(32, 32, 2_000, 768, dim=320, dtype="bfloat16")
    problems["fp32-dim1024-32q-argmax"] = score(32, 32, 500, 300, dim=1024, dtype="float32", argmax=True)
    problems["int8-dim4096-8q-masks"] = score(8, 32, 200, 100, dim=4096, dtype="int8", masks=True)
    problems["bwd-dim2560"] = backward(32, 32, 128, 768, dim=2560)
    # Any dim and alignment on the mma.sync kernel (issue 24, item 3): rows copied in pieces of
    # their start's alignment, 8 down to 1 byte; strided dims and float64 stay on the CUDA cores.
    problems["bf16-dim100-32q"] = score(32, 32, 2_000, 300, dim=100, dtype="bfloat16")
    problems["int8-dim100-1q"] = score(0, 32, 2_000, 300, dim=100, dtype="int8")
    problems["int8-dim101-1q-argmax"] = score(1, 32, 2_000, 300, dim=101, dtype="int8", argmax=True)
    problems["fp16-dim3-8q"] = score(8, 32, 500, 50, dim=3)
    problems["fp16-dim2500-1q"] = score(0, 32, 500, 768, dim=2500)
    problems["fp32-dim100-1q"] = score(0, 32, 2_000, 300, dim=100, dtype="float32")
    problems["packed-fp16-dim100"] = packed(4, 32, ragged, dim=100)
    problems["bwd-dim100"] = backward(64, 32, 64, 180, dim=100)
    # Odd k-steps padded to even on the Hopper kernel (fp16 dim 112, int8 dim 96).
    problems["fp16-dim112-1q"] = score(0, 32, 2_000, 300, dim=112)
    problems["fp16-dim112-32q"] = score(32, 32, 2_000, 300, dim=112)
    problems["int8-dim96-1q"] = score(0, 32, 2_000, 300, dim=96, dtype="int8")
    return problems


PROBLEMS = _problems()


class _StubKernel:
    """What the planners read of a compiled kernel, and what the record shows of it."""

    num_regs = 128

    def __init__(self, family, name, defines):
        self.family, self.name, self.defines = family, name, tuple(defines)


def _struct_values(layout, fields, data: bytes) -> dict:
    """The non-pointer fields of a packed argument struct (pointers are made-up addresses)."""
    values = layout.unpack(data[:layout.size])
    return {name: value for (name, code), value in zip(fields, values) if code != "Q"}


@contextlib.contextmanager
def stubbed_gpu(monkeypatch, properties):
    """The GPU layer stubbed on ``properties`` (support.stub_gpu, the one seam); yields the
    list each launch is recorded in."""
    from cupy_maxsim._gpu import args as gpu_args

    launches = []
    forward, backward = gpu_args.forward_args, gpu_args.backward_args

    def record(kernel, grid, block, shared, struct_bytes, tile_map):
        is_backward = kernel.family == "maxsim_bwd"
        layout, fields = (backward, gpu_args.BACKWARD_ARGS) if is_backward else (forward, gpu_args.FORWARD_ARGS)
        launches.append(dict(kernel=kernel.name, defines=sorted(kernel.defines), grid=list(grid), block=list(block),
                             shared_bytes=shared, tile_map=tile_map,
                             args=_struct_values(layout.layout, fields, struct_bytes)))

    def launch(kernel, grid, block, args, shared_bytes, stream_ptr):
        second = isinstance(args, tuple)  # (a tensor map; the parts' merge: its records)
        record(kernel, grid, block, shared_bytes, args[0] if second else args, second and kernel.family != "maxsim_parts")

    class PreparedLaunch:
        def __init__(self, kernel, grid, block, shared_bytes, arguments=None):
            self.fixed = kernel, tuple(grid), tuple(block), shared_bytes
            self.arguments = arguments

        def __call__(self, head_values, stream_ptr, extra=None):  # a replayed forward, or its parts' merge
            kernel, grid, block, shared = self.fixed
            struct_bytes = gpu_args.ArgTemplate.struct_bytes(self.arguments(*head_values), forward.size)
            record(kernel, grid, block, shared, struct_bytes, extra is not None and kernel.family != "maxsim_parts")

        def launch_packed(self, args, stream_ptr):
            kernel, grid, block, shared = self.fixed
            record(kernel, grid, block, shared, gpu_args.ArgTemplate.struct_bytes(args, backward.size), False)

    def offsets_summary(pointer, count, stride, is_64bit, device, stream_ptr):
        values = arrays_by_pointer[pointer].values
        steps = np.diff(values)
        return int(values[0]), int(values[-1]), int((steps < 0).sum()), int(steps.max(initial=0))

    def part_offsets(offsets, is_64bit, doc_length, num_docs, parts, tile_rows, device, stream_ptr):
        # (maxsim_parts.cu's cut: tiles [p T / parts, (p + 1) T / parts) of each document)
        bounds = arrays_by_pointer[offsets].values if offsets else np.arange(num_docs + 1) * doc_length
        starts = [start for first, end in zip(bounds[:-1], bounds[1:])
                  for start in part_starts(first, end, parts, tile_rows)] + [bounds[-1]]
        return FakeDeviceArray((len(starts),), "int64", 0x7F00_0000_0000, np.array(starts, np.int64))

    arrays_by_pointer = {}
    original_init = FakeDeviceArray.__init__

    def remembering_init(self, shape, dtype, ptr, values=None):
        original_init(self, shape, dtype, ptr, values)
        arrays_by_pointer[ptr] = self

    monkeypatch.setattr(FakeDeviceArray, "__init__", remembering_init)
    with stub_gpu(monkeypatch, properties,
                  get_kernel=lambda device, family, name, defines=(), shared_bytes=0: _StubKernel(family, name, defines),
                  launch=launch, prepared_launch=PreparedLaunch, doc_tile_map=lambda *args, **kwargs: b"tile map",
                  offsets_summary=offsets_summary, part_offsets=part_offsets):
        yield launches


def decide(monkeypatch, device: str, problem: str) -> list:
    """The launches ``problem`` makes on ``device``, as recorded."""
    with monkeypatch.context() as patch, stubbed_gpu(patch, DEVICES[device]) as launches:
        PROBLEMS[problem](_Arrays())
        return launches


CASES = [(device, problem) for device in DEVICES for problem in PROBLEMS]


def _recorded() -> dict:
    return json.loads(DECISIONS.read_text()) if DECISIONS.is_file() else {}


def test_presplit_without_room_takes_the_staged_split(monkeypatch):
    """The fp32 split's presplit (documents split into a workspace of their bytes) falls back
    to the staged build, which needs none, where that workspace cannot be allocated."""
    from cupy_maxsim import _forward

    def no_room(problem, stream):
        raise MemoryError("out of memory")  # (CuPy's OutOfMemoryError is a MemoryError)

    problem = "fp32-dim1024-32q-argmax"
    assert "-DMAXSIM_FP32_SPLIT=2" in _recorded()[f"sm90-h200/{problem}"][-1]["defines"]
    with monkeypatch.context() as patch, stubbed_gpu(patch, DEVICES["sm90-h200"]) as launches:
        patch.setattr(_forward, "_split_documents", no_room)
        PROBLEMS[problem](_Arrays())
    assert [launch["kernel"] for launch in launches] == ["maxsim_fwd_wgmma_fp32_split"]
    assert "-DMAXSIM_FP32_SPLIT=1" in launches[0]["defines"]


def test_presplit_maps_each_their_own_rows(monkeypatch):
    """The fp32 presplit build's TMA maps: the documents' halves [big, small] per 64 elements
    (128 halves a 64) and the queries' [big, big, small] (192) are rows of different widths;
    each map has its own (a query map of the documents' width reads past its rows' ends, and
    TMA fills zeros there: the small query halves lost)."""
    from cupy_maxsim._gpu import tma

    maps = []
    problem = "fp32-dim1024-32q-argmax"
    with monkeypatch.context() as patch, stubbed_gpu(patch, DEVICES["sm90-h200"]):
        patch.setattr(tma, "doc_tile_map", lambda *args, **kwargs: maps.append((args, kwargs)) or b"tile map")
        PROBLEMS[problem](_Arrays())
    (args, kwargs), = maps
    atoms = 1024 // 64
    assert args[1:3] == (2, 128 * atoms)  # the documents: fp16 halves, 128 a 64
    assert kwargs["queries"][1] == 192 * atoms and kwargs["queries"][4] == 2 * 192 * atoms  # q: 192 a 64


def test_enough_problems_are_guarded():
    assert len(CASES) >= 40
    assert set(_recorded()) == {f"{device}/{problem}" for device, problem in CASES}


@pytest.mark.parametrize("device,problem", CASES, ids=[f"{d}-{p}" for d, p in CASES])
def test_planner_decisions_unchanged(device, problem, monkeypatch):
    recorded = _recorded().get(f"{device}/{problem}")
    assert recorded is not None, f"{device}/{problem} is not recorded: python tests/test_plans.py --write"
    assert decide(monkeypatch, device, problem) == recorded


def _write() -> None:
    """Record every problem's decisions into DECISIONS (a deliberate planner change)."""
    monkeypatch = pytest.MonkeyPatch()
    result = {f"{device}/{problem}": decide(monkeypatch, device, problem) for device, problem in CASES}
    DECISIONS.parent.mkdir(exist_ok=True)
    DECISIONS.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} problems recorded in {DECISIONS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_plans.py --write")
    _write()


def test_rows_off_16_bytes_by_their_pointers_are_not_recorded_for_replay(monkeypatch):
    """A call whose pointers (not strides) cut its rows to 8-byte pieces takes that plan, but
    leaves no replay: replays run only on 16-byte pointers, whose plan is the 16-byte one."""
    from cupy_maxsim import _replay

    with monkeypatch.context() as patch, stubbed_gpu(patch, DEVICES["sm80-a100"]) as launches:
        q = FakeDeviceArray((2, 32, 128), "float16", 0x10000008)
        d = FakeDeviceArray((100, 50, 128), "float16", 0x20000008)
        cm.score(q, d)
        assert "-DMAXSIM_LOAD_BYTES=8" in launches[0]["defines"]
        assert not _replay.replays
        cm.score(FakeDeviceArray((2, 32, 128), "float16", 0x10000000), FakeDeviceArray((100, 50, 128), "float16",
                                                                                     0x20000000))
        assert not any("LOAD_BYTES" in define for define in launches[1]["defines"])
        assert len(_replay.replays) == 1


def test_fat_documents_in_parts_are_replayed(monkeypatch):
    """One fp16 query against 1,000 documents of 768 x 2560 (3.9 MB each) in parts: the first
    call launches the parts' forward and their merge and leaves a replay; a repeated call (new
    q, d) replays both launches, the same builds and arguments (the parts' offsets recorded with
    them), without the general path."""
    from cupy_maxsim import _forward, _replay, tuning

    with monkeypatch.context() as patch, stubbed_gpu(patch, DEVICES["sm90-h200"]) as launches, \
            tuning.override(document_parts_per_ring=16):
        arrays = _Arrays()
        cm.score(arrays((1, 32, 2560)), arrays((1_000, 768, 2560)))
        first = list(launches)
        assert [launch["kernel"] for launch in first] == ["maxsim_fwd_wgmma_fp16", "maxsim_parts_merge"]
        assert first[0]["args"]["num_docs"] == 7_000 and first[1]["args"]["num_docs"] == 1_000
        assert len(_replay.replays) == 1
        runs = count_calls(patch, _forward, "run")
        launches.clear()
        cm.score(arrays((1, 32, 2560)), arrays((1_000, 768, 2560)))
        assert launches == first and not runs

