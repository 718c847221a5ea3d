"""The planners, the replayed launches and the backward's templates without a GPU: tile
configurations, Hopper tile rows, TMA fall-backs, and the GPU paths' host logic on an H200's
properties with kernels, launches and outputs stubbed (support.stubbed_gpu)."""

import dataclasses
import struct
import types

import numpy as np
import pytest

from cupy_maxsim import _backward, _forward, _replay, training, tuning
from cupy_maxsim._gpu import args as gpu_args
from cupy_maxsim._gpu import tma
from cupy_maxsim._plan import configs
from cupy_maxsim.tuning import DEFAULT
from support import HostOutput, count_calls, gpu_available, part_starts, stub_gpu


@pytest.mark.parametrize("query_length", [1, 5, 27, 31, 32, 33, 64, 100, 256])
def test_query_groups_fit_their_block(query_length):
    """The dispatcher stacks config.queries_per_block(Lq) whole queries on a block: never more
    rows than the block holds, and in the Hopper kernel never a query split over warpgroups."""
    for width in configs.MMA_CONFIGS:
        config = configs.mma_config(width, 8)
        if width >= query_length:
            assert 1 <= config.queries_per_block(query_length) * query_length <= config.block_cols
    if query_length <= 64:
        per_group = 64 // query_length
        assert 1 <= per_group * query_length <= 64
        split = configs.wgmma_config(8, warpgroups_wanted=1)  # one query group: documents split
        assert split.split_docs and split.warpgroups == 3 and split.queries_per_block(query_length) == per_group
        assert split.shared_bytes <= configs.WGMMA_SHARED_LIMIT and split.stages >= 8
        # A query of at most 32 rows leaves half of each thread's rows as padding (not folded).
        rows = per_group * query_length
        assert configs.wgmma_config(8, warpgroups_wanted=1, query_rows=rows).half_rows == (rows <= 32)
        for wanted in (2, 3, 50):
            config = configs.wgmma_config(8, warpgroups_wanted=wanted)
            assert config.warpgroups == min(wanted, 3)
            assert config.queries_per_block(query_length) == config.warpgroups * per_group


@pytest.mark.parametrize("length, int8, rows", [(128, False, 128), (1030, False, 128), (300, False, 64),
                                                (64, False, 64), (1030, True, 64), (2000, False, 128)])
def test_hopper_tile_rows(length, int8, rows, monkeypatch):
    """128-row tiles where they add little padding over 64-row ones (and for int8 only where a
    query's warpgroups split the documents, its kernel's only 128-row build, even when 128 is
    forced)."""
    assert configs.wgmma_tile_rows(length, int8) == rows
    assert configs.wgmma_tile_rows(length, int8, split_docs=True) == (128 if int8 and length == 1030 else rows)
    forced = tuning.Tunables(wgmma_tile_rows=128)
    assert configs.wgmma_tile_rows(length, int8, tunables=forced) == (64 if int8 else 128)
    assert configs.wgmma_tile_rows(length, int8, split_docs=True, tunables=forced) == 128


def test_ragged_packed_documents_take_short_tiles():
    """Packed documents of unequal lengths pad half a tile each on average, whatever their
    mean: 16-128 tokens (mean 72) take 64-row tiles, where equal documents of 72 or 128 tokens
    take 128; long ragged documents (mean 1030) keep 128. The flag comes from the offsets'
    longest document against their mean."""
    from cupy_maxsim import _problem

    for int8 in (False, True):
        assert configs.wgmma_tile_rows(72, int8, split_docs=True, ksteps=4) == 128
        assert configs.wgmma_tile_rows(72, int8, split_docs=True, ksteps=4, ragged=True) == 64
        assert configs.wgmma_tile_rows(128, int8, split_docs=True, ksteps=4) == 128
    assert configs.wgmma_tile_rows(1030, False, split_docs=True, ragged=True) == 128
    q = np.zeros((1, 8, 16), np.float16)
    tokens = np.zeros((30, 16), np.float16)
    equal, _ = _problem.packed_problem(q, tokens, np.array([0, 10, 20, 30]), None, None, None, False)
    unequal, _ = _problem.packed_problem(q, tokens, np.array([0, 5, 20, 30]), None, None, None, False)
    padded = _problem.padded_problem(q, tokens.reshape(3, 10, 16), None, None, None, None, False)
    assert (equal.ragged, unequal.ragged, padded.ragged) == (False, True, False)


def test_doc_tile_map_falls_back_to_copies(monkeypatch):
    """Where TMA's rules fail (16-byte alignment, an item size the map has no type for, 32-bit
    coordinates) or no driver is at hand, the Hopper kernel gets no descriptor (it copies with
    cp.async). 1-, 2- and 4-byte items (int8, 16-bit floats, fp32 for the TF32 builds) get one."""
    none = tma.NO_DOC_TILE_MAP
    assert len(none) == tma.DOC_TILE_MAP_BYTES
    assert tma.doc_tile_map(8, 2, 128, 300, 10, 256, 76800, False) == none  # misaligned pointer
    assert tma.doc_tile_map(256, 2, 100, 300, 10, 200, 60000, False) == none  # 200-byte rows
    assert tma.doc_tile_map(256, 8, 128, 300, 10, 1024, 307200, False) == none  # 8-byte items
    if gpu_available():  # encoding a map needs the driver and a current context (as any array's call has)
        import cupy

        cupy.zeros(1)
        assert tma.doc_tile_map(256, 4, 128, 300, 10, 512, 153600, False) != none  # fp32 (TF32 builds)
    assert tma.doc_tile_map(256, 2, 128, 2**31, 1, 256, 0, True) == none  # past 32-bit rows
    with pytest.raises(ValueError, match="q's rows"):  # a build streaming queries needs q's map
        tma.doc_tile_map(256, 2, 1024, 300, 10, 2048, 614400, False, queries=(8, 1024, 32, 4, 2048, 65536, 4))
    monkeypatch.setattr(tma, "_cuda_driver", lambda: None)
    tma._doc_tile_maps.clear()
    assert tma.doc_tile_map(256, 2, 128, 300, 10, 256, 76800, False) == none  # no driver
    # int8 document scales: their own map only as rows of contiguous float32 on 16 bytes (else
    # the kernel's lanes copy them); the checks come before any driver call.
    assert tma._scale_tile_map(None, None, 300, 10, 64) is None
    assert tma._scale_tile_map(None, (8, 4, 1200), 300, 10, 64) is None  # misaligned pointer
    assert tma._scale_tile_map(None, (256, 8, 2400), 300, 10, 64) is None  # strided rows
    assert tma._scale_tile_map(None, (256, 4, 1204), 301, 10, 64) is None  # 1204-byte documents



#: An H200's device_properties: SMs, shared memory per block and per SM, capability, L2 bytes.
_H200 = (132, 227 * 1024, 228 * 1024, 90, 60 * 2**20)


def _recorded_launches(launches: list):
    """(launch, PreparedLaunch) stubs: each launch, general or prepared, appends
    (kernel, grid, block, argument bytes or (bytes, tensor map), shared bytes, stream)."""
    class Recorded:
        def __init__(self, kernel, grid, block, shared_bytes, arguments=None):
            self.fixed = kernel, tuple(grid), tuple(block), shared_bytes
            self.arguments = arguments

        def __call__(self, head_values, stream_ptr, extra=None):
            buffer = self.arguments(*head_values)  # what the launch's own buffer holds then
            args = gpu_args.ArgTemplate.struct_bytes(buffer, gpu_args.forward_args.size)
            kernel, grid, block, shared = self.fixed
            launches.append((kernel, grid, block, args if extra is None else (args, extra), shared, stream_ptr))

        def launch_packed(self, args, stream_ptr):
            kernel, grid, block, shared = self.fixed
            launches.append((kernel, grid, block, gpu_args.ArgTemplate.struct_bytes(args, gpu_args.backward_args.size),
                             shared, stream_ptr))

    return (lambda *call: launches.append(call)), Recorded


class _StubKernel:  # what the planner reads of a compiled kernel
    num_regs = 128


@pytest.fixture
def h200_planner(monkeypatch):
    """_forward.mma_plan on an H200's properties with kernels stubbed (no GPU): yields the list
    of (family, name, defines) the planner asked for."""
    kernels_asked = []

    def get_kernel(device, family, name, defines=(), shared_bytes=0):
        kernels_asked.append((family, name, defines))
        return _StubKernel()

    with stub_gpu(monkeypatch, _H200, get_kernel=get_kernel):
        yield kernels_asked


def test_hopper_plan_without_a_gpu(h200_planner):
    """The forward planner (_forward.mma_plan) on an H200's properties, kernels stubbed: one query
    splits the documents over three warpgroups (128-row tiles for ColPali pages, 64 for 300-token
    documents unless the padded corpus is large; int8 pages too), many queries fill three
    warpgroups, and query groups of a corpus within half the L2 start at rotated documents."""
    def plan(num_queries, mean_length, num_docs=10_000, suffix="fp16", packed=False, argmax_bits=0, dim=128,
             query_length=32, tunables=DEFAULT):
        """(the plan, its kernel's defines as a dict, the kernel's name), planned afresh."""
        h200_planner.clear()
        _forward._plans.clear()
        shape = _forward.planner.ForwardShape(suffix, num_queries, query_length, dim, num_docs, False, argmax_bits,
                                              mean_length, packed)
        result = _forward.mma_plan(0, shape, tunables)
        family, name, defines = h200_planner[-1]
        return result, dict(d.lstrip("-D").split("=") for d in defines), name

    one, defines, name = plan(1, 1030)
    assert name == "maxsim_fwd_wgmma_fp16" and defines["MAXSIM_SPLIT_DOCS"] == "1" and one.tile_rows == 128
    assert (one.group, one.groups, one.doc_rotation) == (1, 1, 0) and one.docs_per_block * 132 >= 10_000
    assert defines["MAXSIM_HALF_ROWS"] == "1"  # 32 query rows: each thread folds one row of two
    assert plan(2, 1030)[1]["MAXSIM_HALF_ROWS"] == "0"  # two queries fill the 64 rows
    # 300-token documents: 64-row tiles, but 128 for a padded corpus past 512 MB (the
    # padding rows cost nothing there); a packed one keeps 64.
    assert plan(1, 300, num_docs=1_000)[0].tile_rows == 64 and plan(1, 300)[0].tile_rows == 128
    assert plan(1, 300, packed=True)[0].tile_rows == 64
    # int8 counts the corpus's elements: 128 rows from as many as 16-bit takes them.
    assert plan(1, 300, suffix="int8")[0].tile_rows == 128 and plan(1, 300, num_docs=1_000, suffix="int8")[0].tile_rows == 64
    int8_plan, _, int8_name = plan(1, 1030, suffix="int8")
    assert int8_plan.tile_rows == 128 and int8_name == "maxsim_fwd_wgmma_int8"
    many, defines, _ = plan(32, 300, num_docs=128)
    assert defines["MAXSIM_SPLIT_DOCS"] == "0" and defines["MAXSIM_WARPGROUPS"] == "3"
    # Many queries: documents on the MMA's M, four 32-token queries per warpgroup; 128 x 300 x
    # 128 fp16 fits the L2: rotated document ranges.
    assert defines["MAXSIM_DOCS_ON_M"] == "1"
    assert (many.group, many.groups, many.tile_rows) == (12, 3, 64) and many.doc_rotation > 0
    # Saving 16-bit winners keeps documents on M, in three warpgroups (two for int8, whose
    # registers they would overflow); 32-bit winners (a document of 32768 tokens or more) and
    # four queries or fewer keep queries on M.
    with_argmax, defines, _ = plan(32, 300, num_docs=128, argmax_bits=16)
    assert (defines["MAXSIM_DOCS_ON_M"], defines["MAXSIM_WARPGROUPS"], defines["MAXSIM_ARGMAX"]) == ("1", "3", "1")
    assert (with_argmax.group, with_argmax.groups) == (12, 3)
    defines = plan(32, 300, num_docs=128, suffix="int8", argmax_bits=16)[1]
    assert (defines["MAXSIM_DOCS_ON_M"], defines["MAXSIM_WARPGROUPS"]) == ("1", "2")
    # int8 of dim 256 without the argmax: two warpgroups too (three would spill); dim 128: three.
    for dim, warpgroups in ((128, "3"), (256, "2")):
        defines = plan(32, 300, num_docs=128, suffix="int8", dim=dim)[1]
        assert (defines["MAXSIM_DOCS_ON_M"], defines["MAXSIM_WARPGROUPS"]) == ("1", warpgroups)
    assert plan(32, 300, num_docs=128, argmax_bits=32)[1]["MAXSIM_DOCS_ON_M"] == "0"
    assert plan(4, 300, num_docs=128)[1]["MAXSIM_DOCS_ON_M"] == "0"
    assert plan(32, 300, num_docs=100_000)[0].doc_rotation == 0  # a corpus far past the L2: no rotation
    # One query at fat dims streams k on the Hopper kernel (a slot per atom, the query block's
    # capacity the next of WGMMA_STREAM_CAPACITIES); past 128 k-steps (fp16 dim 2048) the
    # query's atoms stream through the slots too (capacity 512: fp16 dim 8192, one box of the
    # group's queries); past that, the mma.sync kernel's streaming k. Two queries there take
    # documents on M in two warpgroups.
    for suffix, dim, capacity, streamed_query in (
            ("fp16", 136, "16", None), ("fp16", 320, "32", None), ("fp16", 1536, "96", None), ("fp16", 2048, "128", None),
            ("fp16", 2560, "512", "1"), ("fp16", 2568, "512", "1"), ("fp16", 8192, "512", "1"), ("int8", 320, "16", None),
            ("int8", 5120, "512", "1")):
        streamed, defines, name = plan(1, 768, num_docs=1_000, suffix=suffix, dim=dim)
        assert name == f"maxsim_fwd_wgmma_{suffix}" and defines["MAXSIM_STREAM_K"] == "1"
        assert (defines["MAXSIM_KSTEPS"], defines["MAXSIM_SPLIT_DOCS"], defines["MAXSIM_HALF_ROWS"]) == (capacity, "1", "1")
        assert defines.get("MAXSIM_STREAM_QUERY") == streamed_query, (suffix, dim)
        assert streamed.tile_rows == 64 and streamed.query_box == (1 if streamed_query else 0)
    # Two queries of 16 tokens share the group's 32 rows: one box holds both.
    streamed, defines, _ = plan(2, 768, num_docs=1_000, dim=2560, query_length=16)
    assert defines["MAXSIM_SPLIT_DOCS"] == defines["MAXSIM_STREAM_QUERY"] == "1" and streamed.query_box == 2
    # q's TMA map (query_map_shape): a box of a warpgroup's queries, of the launch's where fewer
    # (the boxes-within-q build), or the split group's.
    def box(num_queries, query_length, dim):
        plan_ = plan(num_queries, 768, num_docs=1_000, dim=dim, query_length=query_length)[0]
        q = types.SimpleNamespace(shape=(num_queries, query_length, dim), dtype="float16",
                                  strides=(query_length * dim, dim, 1))
        return _forward.query_map_shape(types.SimpleNamespace(q=q), plan_)[-1]
    assert (box(2, 32, 2560), box(6, 32, 2560), box(16, 32, 2560), box(1, 31, 2560), box(2, 16, 4104)) == (2, 4, 4, 1, 2)
    # The resident query where asked (the tunable), up to its largest capacity (fp16 2560).
    resident = dataclasses.replace(DEFAULT, wgmma_split_stream_query_ksteps=0)
    defines = plan(1, 768, num_docs=1_000, dim=2560, tunables=resident)[1]
    assert defines["MAXSIM_KSTEPS"] == "160" and "MAXSIM_STREAM_QUERY" not in defines
    assert plan(1, 768, num_docs=1_000, dim=2568, tunables=resident)[2] == "maxsim_fwd_fp16"
    _, defines, name = plan(2, 768, num_docs=1_000, dim=320)
    assert name == "maxsim_fwd_wgmma_fp16" and defines["MAXSIM_DOCS_ON_M"] == "1" and defines["MAXSIM_WARPGROUPS"] == "2"
    assert plan(1, 768, num_docs=1_000, dim=8200)[2] == "maxsim_fwd_fp16"
    assert "MAXSIM_STREAM_K" not in plan(1, 768, num_docs=1_000, dim=128)[1]



def test_replayed_launch_without_a_gpu(h200_planner, monkeypatch):
    """A recorded forward launch (_replay.Replay) replayed with new pointers, launches stubbed:
    the plan's kernel, grid, block and shared memory, the recorded arguments with q, d and the
    result's pointers swapped in, the tile map of the new documents; None (the general path)
    for documents off 16-byte alignment."""
    from cupy_maxsim._arrays import Operand
    from cupy_maxsim._gpu import launch as gpu_launch

    launches = []
    launch, prepared = _recorded_launches(launches)
    monkeypatch.setattr(gpu_launch, "launch", launch)
    monkeypatch.setattr(gpu_launch, "PreparedLaunch", prepared)
    monkeypatch.setattr(tma, "doc_tile_map",
                        lambda pointer, *shape, scales=None, use_tma=True, queries=None:
                        ("map", pointer) + shape + (scales, queries))
    shape = _forward.planner.ForwardShape("fp16", 1, 32, 128, 1_000, False, 0, 300, False)
    plan = _forward.mma_plan(0, shape, DEFAULT)
    names = [name for name, _ in gpu_args.FORWARD_ARGS]
    values = {name: 1000 + k for k, name in enumerate(names)}
    tile_map_shape = (2, 128, 300, 1_000, 256, 300 * 256, False, plan.tile_rows, 0)  # (L2 promotion 0, as recorded)
    like = Operand("q", "cupy", "float16", (1, 32, 128), (4096, 128, 1), 0)  # CuPy: its current stream
    replay = _replay.Replay(like, (1_000,), "float32", None, plan, values, tile_map_shape, True)
    device_array = lambda pointer: types.SimpleNamespace(data=types.SimpleNamespace(ptr=pointer))  # noqa: E731
    q, d = device_array(0x10000), device_array(0x200000)

    result = replay(q, d)
    assert result.shape == (1_000,) and result.dtype == np.float32
    (kernel, grid, block, (args, tile_map), shared, stream), = launches
    assert (kernel, grid, block, shared, stream) == (plan.kernel, (plan.grid_x, plan.groups), (plan.threads,),
                                                     plan.shared, None)
    sent = dict(zip(names, gpu_args.forward_args.layout.unpack(args)))
    no_extras = dict(q_mask=0, d_mask=0, q_scale=0, d_scale=0)
    assert sent == dict(values, q=0x10000, d=0x200000, out=result.ctypes.data, argmax=0, **no_extras)  # no winners
    assert tile_map == ("map", 0x200000) + tile_map_shape + (None, None)
    # A build streaming the query atoms: q's map follows q (its shape as recorded).
    query_shape = (32, 1, 256, 8192, 4)
    launches.clear()
    _replay.Replay(like, (1_000,), "float32", None, plan, values, tile_map_shape, True, None, query_shape)(q, d)
    assert launches[0][3][1] == ("map", 0x200000) + tile_map_shape + (None, (0x10000,) + query_shape)

    # Masks and int8 scales (a signature of their own): their pointers patched in too, the
    # documents' scales into the tile map with the recorded strides.
    scaled = _replay.Replay(like, (1_000,), "float32", None, plan, values, tile_map_shape, True, (4, 1200))
    extras = (device_array(0x300000), None, device_array(0x400000), device_array(0x500000))
    result = scaled(q, d, extras)
    sent = dict(zip(names, gpu_args.forward_args.layout.unpack(launches[-1][3][0])))
    assert sent == dict(values, q=0x10000, d=0x200000, out=result.ctypes.data, argmax=0, q_mask=0x300000, d_mask=0,
                        q_scale=0x400000, d_scale=0x500000)
    assert launches[-1][3][1] == ("map", 0x200000) + tile_map_shape + ((0x500000, 4, 1200), None)
    del launches[1:]

    # With the winners: a second result, its pointer in the argmax field.
    with_argmax = _replay.Replay(like, (1_000,), "float32", "int16", plan, values, tile_map_shape, True)
    result, argmax = with_argmax(q, d)
    assert argmax.shape == (1_000, 32) and argmax.dtype == np.int16
    sent = dict(zip(names, gpu_args.forward_args.layout.unpack(launches[-1][3][0])))
    assert sent == dict(values, q=0x10000, d=0x200000, out=result.ctypes.data, argmax=argmax.ctypes.data, **no_extras)
    # With a backward template (score_with_plan replayed): the plan of the winners instead, the
    # winners and the backward's scratch in one allocation (the scratch 16-byte aligned after
    # 1,000 x 32 int16 winners: 16,000 words).
    class Template:
        _scratch_words = 777

        def _rebound(self, pointers, arrays, stream):
            return types.SimpleNamespace(pointers=pointers, arrays=arrays, stream=stream,
                                         _stage=lambda output, scratch_ptr, arrays: staged.append(scratch_ptr))

    staged = []
    result, plan = with_argmax.with_backward(Template())(q, d)
    sent = dict(zip(names, gpu_args.forward_args.layout.unpack(launches[-1][3][0])))
    assert plan.pointers == (0x10000, 0x200000, sent["argmax"]) and plan.arrays[:2] == (q, d)
    work = plan.arrays[2]
    assert work.shape == (16_000 + 777,) and work.dtype == np.int32 and sent["argmax"] == work.ctypes.data
    assert staged == [work.ctypes.data + 4 * 16_000] and sent["out"] == result.ctypes.data
    assert with_argmax.backward is None  # the plain replay is left as it was
    del launches[1:]

    assert replay(q, device_array(0x200002)) is None and len(launches) == 1  # documents 2 bytes off alignment

    # Documents scored in parts (_forward.PartsRecord): the recorded launch writes the parts'
    # records into scratch of the recorded size, then the merge's launch (the problem's own
    # arguments, its pointers patched in) folds them into the scores.
    monkeypatch.setattr(gpu_launch, "merge_parts_launch", lambda device, warps: ("merge", (warps,), (256,)))
    merge_values = dict({name: 5000 + k for k, name in enumerate(names)}, num_queries=1, num_docs=1_000,
                        query_length=32)
    parts = _forward.PartsRecord(starts=None, merge_values=merge_values, parts=5)
    assert parts.record_floats == 5_000 * 33
    launches.clear()
    plan = _forward.mma_plan(0, shape, DEFAULT)  # (the name held the backward's plan above)
    result = _replay.Replay(like, (1_000,), "float32", None, plan, values, tile_map_shape, True, None, None,
                            parts)(q, d)
    (forward, merge) = launches
    sent = dict(zip(names, gpu_args.forward_args.layout.unpack(forward[3][0])))
    records_ptr, parts_sent = struct.unpack("@Qi4x", merge[3][1])
    assert sent == dict(values, q=0x10000, d=0x200000, out=records_ptr, argmax=0, **no_extras) and parts_sent == 5
    assert merge[:3] == ("merge", (1_000,), (256,)) and merge[4:] == (0, None)
    merged = dict(zip(names, gpu_args.forward_args.layout.unpack(merge[3][0])))
    assert merged == dict(merge_values, q=0x10000, d=0x200000, out=result.ctypes.data, argmax=0, **no_extras)
    assert result.shape == (1_000,) and result.dtype == np.float32


class _FakeCupyArray:
    """What the library reads of a C-contiguous CuPy array (shape, strides, dtype, device, pointer), at
    a made-up device address: the GPU paths' host logic, run without a GPU."""

    __module__ = "cupy"

    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.strides = tuple(int(np.prod(shape[k + 1:], dtype=np.int64)) * self.dtype.itemsize
                             for k in range(len(shape)))
        self.device = types.SimpleNamespace(id=0)
        self.data = types.SimpleNamespace(ptr=ptr)


@pytest.fixture
def backward_launches(monkeypatch):
    """The backward planner on an H200's properties, kernels (their names), launches and
    outputs stubbed (host memory), no templates yet: yields the list launches are recorded in."""
    launches = []
    launch, prepared = _recorded_launches(launches)
    with stub_gpu(monkeypatch, _H200, get_kernel=lambda device, family, name, defines=(), shared_bytes=0: name,
                  launch=launch, prepared_launch=prepared):
        yield launches


def _backward_args_sent(call) -> dict:
    """A recorded backward launch's argument struct, field by field."""
    return dict(zip([n for n, _ in gpu_args.BACKWARD_ARGS], gpu_args.backward_args.layout.unpack(call[3])))


def test_backward_templates_without_a_gpu(backward_launches, monkeypatch):
    """backward_plan on an H200's properties, kernels and launches stubbed, 300 documents (more
    than the one-launch backward takes): the general path launches nothing and leaves a
    template; a later plan of the same signature at new pointers starts from it (the same
    arguments, its own pointers); gradients() launches the CSR with dQ (one block per
    document, then dQ's), then dD with the sum of dQ's document chunks past the documents,
    with its own scratch; documents off 16-byte alignment are a signature of their own (no
    vector loads)."""
    launches = backward_launches
    rebound = count_calls(monkeypatch, _backward.BackwardPlan, "_rebound")
    sent = _backward_args_sent
    pointers = ("q", "d", "argmax", "sources", "row_ranges", "partial", "grad", "grad_q", "grad_d")

    def gradients_at(base):
        q = _FakeCupyArray((8, 32, 128), np.float16, base)
        d = _FakeCupyArray((300, 70, 128), np.float16, base + 0x100000 + (base & 2))
        argmax = _FakeCupyArray((8, 300, 32), np.int16, base + 0x800000)
        grad = _FakeCupyArray((8, 300), np.float32, base + 0x900000)
        launches.clear()
        plan = training.backward_plan(q, d, argmax)
        assert not launches  # the forward's part launches nothing
        grad_q, grad_d = plan.gradients(grad)
        csr_dq, dd = launches
        assert sent(csr_dq) == sent(dd)
        assert (grad_q.shape, grad_d.shape) == ((8, 32, 128), (300, 70, 128))
        return plan, (q, d, argmax, grad, grad_q, grad_d), csr_dq, dd

    first, arrays, csr_dq, dd = gradients_at(0x10000000)
    args = sent(dd)
    assert len(_replay.backward_templates) == 1 and args["vector_loads"] == 1
    assert (csr_dq[0], dd[0]) == ("maxsim_bwd_csr_dq_fp16", "maxsim_bwd_dd_fp16")  # sparse rows: the segment walk
    chunks = -(-300 // args["docs_per_chunk"])
    dq_blocks = 8 * 32 // (configs.BWD_THREADS // 32) * chunks  # query tokens x 1 dim chunk x doc chunks
    assert chunks == 10 and csr_dq[1] == (300 + dq_blocks,)  # the CSR's blocks, then dQ's
    assert csr_dq[4] == configs.bwd_csr_shared_bytes(args["count_warps"], 70) and args["csr_counts_stride"] == 0
    assert dd[1][0] > 300 and dd[4] == 0  # blocks past the documents sum dQ's chunks
    q, d, argmax, grad, grad_q, grad_d = arrays
    assert [args[k] for k in ("q", "d", "argmax", "grad", "grad_q", "grad_d")] == [
        q.data.ptr, d.data.ptr, argmax.data.ptr, grad.data.ptr, grad_q.ctypes.data, grad_d.ctypes.data]
    scratch = first._scratch.ctypes.data  # CSR first, then the row lists, then dQ's partials
    assert args["sources"] == scratch < args["row_ranges"] < args["partial"] < scratch + 4 * first._scratch.size

    again, arrays, csr_dq_again, dd_again = gradients_at(0x20000000)
    assert len(_replay.backward_templates) == 1 and len(rebound) == 1  # the same signature: from the template
    args_again = sent(dd_again)
    assert {k: v for k, v in args_again.items() if k not in pointers} == {
        k: v for k, v in args.items() if k not in pointers}
    q, d, argmax, grad, grad_q, grad_d = arrays
    assert [args_again[k] for k in ("q", "d", "argmax", "grad", "grad_q", "grad_d")] == [
        q.data.ptr, d.data.ptr, argmax.data.ptr, grad.data.ptr, grad_q.ctypes.data, grad_d.ctypes.data]
    assert args_again["sources"] == again._scratch.ctypes.data != scratch  # its own scratch

    # A replayed forward stages the first gradients (outputs and arguments, its scratch allocated
    # with the winners); the backward patches in grad_scores only: the same arguments as the
    # general path's. A second backward of the same forward gets outputs and scratch of its own.
    grad_at, grad_fields = gpu_args.backward_args.part(("grad", "grad_query_stride", "grad_doc_stride"))
    assert (_backward.GRAD_AT, _backward.GRAD_FIELDS.format) == (grad_at + gpu_args.ArgTemplate.HEADER, grad_fields.format)  # what the staged backward patches
    q, d, argmax, grad = arrays[:4]
    replayed = _replay.backward_templates[next(iter(_replay.backward_templates))]._rebound(
        (q.data.ptr, d.data.ptr, argmax.data.ptr), (q, d, argmax), None)
    replayed._stage(HostOutput(None), 0x30000000)
    launches.clear()
    grad_q, grad_d = replayed.gradients(grad)
    staged_csr_dq, staged_dd = launches
    assert (staged_csr_dq[:3], staged_dd[:3]) == (csr_dq_again[:3], dd_again[:3])
    staged_args = sent(staged_dd)
    assert sent(staged_csr_dq) == staged_args and staged_args["sources"] == 0x30000000
    assert (staged_args["grad_q"], staged_args["grad_d"]) == (grad_q.ctypes.data, grad_d.ctypes.data)
    assert {k: v for k, v in staged_args.items() if k not in pointers + ("grad_q", "grad_d")} == {
        k: v for k, v in args_again.items() if k not in pointers + ("grad_q", "grad_d")}
    assert staged_args["grad"] == grad.data.ptr and (grad_q.shape, grad_d.shape) == ((8, 32, 128), (300, 70, 128))
    launches.clear()
    grad_q2, grad_d2 = replayed.gradients(grad)
    again_args = sent(launches[-1])
    assert again_args["sources"] == replayed._scratch.ctypes.data != 0x30000000
    assert again_args["grad_q"] == grad_q2.ctypes.data != grad_q.ctypes.data

    # Staged without the caller's scratch (score_with_plan's general path): the plan's own.
    fresh = training.backward_plan(q, d, argmax)
    fresh._stage()
    launches.clear()
    grad_q3, _ = fresh.gradients(grad)
    fresh_args = sent(launches[-1])
    assert fresh_args["sources"] == fresh._scratch.ctypes.data and fresh_args["grad_q"] == grad_q3.ctypes.data
    assert {k: v for k, v in fresh_args.items() if k not in pointers + ("grad_q", "grad_d")} == {
        k: v for k, v in args_again.items() if k not in pointers + ("grad_q", "grad_d")}

    _, _, _, dd_off = gradients_at(0x40000002)  # documents 2 bytes off 16-byte alignment
    assert len(_replay.backward_templates) == 2 and len(rebound) == 3 and sent(dd_off)["vector_loads"] == 0


def test_one_launch_backward_without_a_gpu(backward_launches):
    """In-batch shapes (documents' sources within the shared-memory limit, at most
    BWD_FUSED_MAX_DOCS documents, few winners re-read per row group) take one launch: dQ's
    blocks in the first columns of the grid, then a column of row groups per document, no
    scratch (the staged replay's work buffer is the winners alone); more documents, more
    sources than shared memory holds or ColBERT's dense rows take two (16-bit dense rows: the
    _wide kernels)."""
    launches = backward_launches
    sent = _backward_args_sent
    warps = configs.BWD_THREADS // 32

    def launched(num_queries, num_docs, length=70, dtype=np.float16):
        q = _FakeCupyArray((num_queries, 32, 128), dtype, 0x10000000)
        d = _FakeCupyArray((num_docs, length, 128), dtype, 0x20000000)
        argmax = _FakeCupyArray((num_queries, num_docs, 32), np.int16, 0x30000000)
        grad = _FakeCupyArray((num_queries, num_docs), np.float32, 0x40000000)
        launches.clear()
        plan = training.backward_plan(q, d, argmax)
        plan.gradients(grad)
        return plan, list(launches)

    plan, (fused,) = launched(8, 40)
    args = sent(fused)
    rows_per_warp = args["rows_per_warp"]
    groups = -(-70 // (warps * rows_per_warp))
    dq_columns = -(-(8 * 32 // warps) // groups)
    assert fused[0] == "maxsim_bwd_fused_fp16" and fused[1] == (dq_columns + 40, groups)
    assert fused[4] == configs.bwd_fused_shared_bytes(warps, warps * rows_per_warp, 8 * 32)
    assert plan._scratch_words == 0 and args["docs_per_chunk"] == 40
    assert [args[k] for k in ("sources", "row_ranges", "csr_counts", "partial")] == [0, 0, 0, 0]
    assert launched(32, 128, 1030)[1][0][0] == "maxsim_bwd_fused_fp16"  # ColPali in-batch training
    # ColBERT's: 10 row groups x 4,096 winners a document; dense rows in 16-bit: the wide kernels
    assert [c[0] for c in launched(128, 128, 300)[1]] == ["maxsim_bwd_csr_dq_fp16_wide", "maxsim_bwd_dd_fp16_wide"]
    assert [c[0] for c in launched(128, 128, 300, dtype=np.float32)[1]] == ["maxsim_bwd_csr_dq_fp32",
                                                                            "maxsim_bwd_dd_fp32"]
    assert launched(8, DEFAULT.bwd_fused_max_docs + 1)[1][0][0] == "maxsim_bwd_csr_dq_fp16"  # dQ in chunks
    assert launched(8, DEFAULT.bwd_fused_max_docs + 1, dtype=np.float64)[1][0][0] == "maxsim_bwd_fused_fp64"
    assert len(launched(320, 40)[1]) == 2  # 10,240 sources a document: more than shared memory holds


def test_csr_layout_keeps_dq_occupancy():
    """The CSR build's shared memory (given to dQ's blocks of the same launch too) stays within
    a quarter of an H200 SM up to about 4,800 tokens, then takes up to the block limit, then
    global counts."""
    sm_count, smem_limit, smem_per_sm = _H200[:3]
    quarter = smem_per_sm // configs.BWD_BLOCKS_PER_SM
    for longest in (1, 300, 1030, 4000):
        warps, stride = configs.bwd_csr_layout(longest, smem_limit, smem_per_sm)
        assert stride == 0 and 1 <= warps <= configs.BWD_THREADS // 32
        assert configs.bwd_csr_shared_bytes(warps, longest) + 1024 <= quarter
    assert configs.bwd_csr_layout(300, smem_limit, smem_per_sm) == (8, 0)
    warps, stride = configs.bwd_csr_layout(8192, smem_limit, smem_per_sm)
    assert stride == 0 and quarter < configs.bwd_csr_shared_bytes(warps, 8192) <= smem_limit
    assert configs.bwd_csr_layout(30000, smem_limit, smem_per_sm) == (1, configs.bwd_csr_shared_bytes(1, 30000) // 4)


@pytest.mark.parametrize("precision", ["highest", "high", "split"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_the_planners_ask_only_for_variants_compiled_and_prebuilt(arch, precision):
    """Over a grid of shapes (every tensor-core format, dims 16 to 2560 of whole 16-byte rows,
    one query to stacks of many, query lengths about each tile width, short and long documents,
    padded and packed, pairs, winners of 16 and 32 bits), every forward the planner picks on
    ``arch``'s properties is among the compile checks' variants, so CI compiles it (no spills)
    and a wheel ships its cubin. (fp16 dim 32 with winners once picked a 128-row Hopper tile
    that ptxas spilled; dims 16 to 48 and fp32 dim 96 compiled only at first use.) Under both
    float32 precisions (fp32 plans differently under "high"), and with fp32's split build
    ("split": Tunables.wgmma_fp32_split)."""
    import itertools

    from cupy_maxsim import tuning
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES, planned_forwards, runtime_variants

    grid = [(suffix, nq, lq, dim, nd, pairs, argmax, ld, packed)
            for suffix, dim, (nq, lq), (ld, nd), argmax, packed, pairs in itertools.product(
                ("fp16", "bf16", "fp32", "int8"), (16, 32, 48, 64, 96, 128, 256, 320, 2560),
                ((1, 1), (1, 27), (1, 32), (1, 33), (1, 64), (1, 100), (2, 32), (3, 20), (4, 32), (5, 31), (9, 32),
                 (13, 27), (40, 32), (2, 64), (3, 100)),
                ((17, 10), (150, 10), (700, 1000), (1030, 100000)), (0, 16, 32), (False, True), (False, True))
            if not (pairs and (packed or nq == 1))]
    known = set(runtime_variants())
    missing = {(choice.family, choice.config.defines(), fields)
               for fields, choice in planned_forwards(ARCH_PROPERTIES[arch], grid,
                                                      tuning.Tunables(float32_precision="highest" if precision == "split"
                                                                      else precision,
                                                                      wgmma_fp32_split=precision == "split"))
               if (choice.family, choice.config.defines()) not in known}
    assert not missing, sorted(missing)[:5]


def test_float32_precision_high_on_the_planner():
    """Under float32_matmul_precision("high") one fp32 query on Hopper takes the TF32 build that
    reads the documents as TF32 (tf32=2, no small halves; "highest" the documents on M, tf32=3),
    many queries the Hopper kernel with documents on M reading both operands as TF32 (where "highest" splits them into three fp16
    products), but not with rows off 16 bytes (there the split too); other dtypes plan as under
    "highest"; a precision torch does not name for this is a ValueError."""
    from cupy_maxsim import tuning
    from cupy_maxsim._plan.forward import ForwardShape, choose_kernel
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES, runtime_variants

    properties = ARCH_PROPERTIES["sm_90"]
    known = set(runtime_variants())
    one, many = ForwardShape("fp32", 1, 32, 128, 1000, False, 0, 300, False), ForwardShape(
        "fp32", 32, 32, 128, 1000, False, 0, 300, False)
    with tuning.float32_matmul_precision("high") as high:
        assert tuning.current().float32_precision == "high"
    highest = tuning.current()
    assert highest.float32_precision == "highest"
    split_docs = dataclasses.replace(highest, wgmma_tf32_doc_rows=False)
    assert choose_kernel(one, properties, highest).config.tf32 == 3  # (the documents on M)
    assert choose_kernel(one, properties, split_docs).config.tf32 == 1
    choice = choose_kernel(one, properties, high)
    assert choice.config.tf32 == 2 and (choice.family, choice.config.defines()) in known
    assert choice.config.stages > choose_kernel(one, properties, split_docs).config.stages  # no small halves
    assert choose_kernel(many, properties, highest).config.fp32_split
    assert choose_kernel(many, properties, dataclasses.replace(highest, wgmma_fp32_split=False)).family == "maxsim_fwd"
    choice = choose_kernel(many, properties, high)
    assert choice.family == "maxsim_fwd_wgmma" and choice.config.docs_on_m and choice.config.tf32 == 2
    assert (choice.family, choice.config.defines()) in known
    odd_rows = ForwardShape("fp32", 32, 32, 130, 1000, False, 0, 300, False, 8)
    assert choose_kernel(odd_rows, properties, high) == choose_kernel(odd_rows, properties, highest)
    fp16 = ForwardShape("fp16", 1, 32, 128, 1000, False, 0, 300, False)
    assert choose_kernel(fp16, properties, high) == choose_kernel(fp16, properties, highest)
    for bad in ("medium", "HIGH", None):
        with pytest.raises(ValueError, match="precision"):
            with tuning.float32_matmul_precision(bad):
                pass
        with pytest.raises(ValueError, match="float32_precision"):  # the override door too
            with tuning.override(float32_precision=bad):
                pass


def test_streamed_query_atoms_in_64_row_tiles():
    """Many queries at a fat dim stream the query atoms in 64-row document tiles, whatever the
    tunables ask (128-row tiles there were built and measured no faster), with or without the
    argmax, 16-bit or int8, each a prebuilt variant; a tile shape the kernel does not build is
    a ValueError."""
    from cupy_maxsim import tuning
    from cupy_maxsim._plan.forward import ForwardShape, choose_kernel
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES, runtime_variants

    properties = ARCH_PROPERTIES["sm_90"]
    known = set(runtime_variants())

    def tile_rows(suffix, argmax, tunables):
        choice = choose_kernel(ForwardShape(suffix, 32, 32, 1024, 2000, False, argmax, 300, False), properties, tunables)
        assert choice.config.stream_query and (choice.family, choice.config.defines()) in known
        return choice.config.tile_n

    with tuning.override(wgmma_tile_rows=128) as asked:
        pass
    for suffix in ("fp16", "bf16", "int8"):
        for argmax in (0, 16):
            assert tile_rows(suffix, argmax, tuning.current()) == tile_rows(suffix, argmax, asked) == 64
    for bad in (96, 0, "128"):
        with pytest.raises(ValueError, match="wgmma_tile_rows"):
            with tuning.override(wgmma_tile_rows=bad):
                pass


def test_one_fp32_query_in_stretches():
    """fp32 one query at fp32 accuracy with Tunables.wgmma_tf32_stretch: the TF32 split-document
    build with one accumulator set (TF32_STRETCH), in three warpgroups without winners, the query
    resident up to dim 768 and streamed past it (three rings and small-half buffers beside a
    resident query of 128 KB do not fit), in two with winners (three spilled there), each among
    the builds the compile checks take (the default); off, the two-set build in two warpgroups,
    the query resident to dim 1024; a stretch that is not a count of atoms is a ValueError."""
    from cupy_maxsim import tuning
    from cupy_maxsim._plan.forward import ForwardShape, choose_kernel
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES, compile_variants, tunable_variants

    properties = ARCH_PROPERTIES["sm_90"]
    known = {(family, tuple(d for d in defines if "EXPECT_SHARED_BYTES" not in d))  # (the compile checks' assert)
             for family, defines in compile_variants() + tunable_variants()}

    def config(dim, argmax, tunables):
        choice = choose_kernel(ForwardShape("fp32", 1, 32, dim, 2000, False, argmax, 300, False), properties, tunables)
        assert choice.config.tf32 == 1 and (choice.family, choice.config.defines()) in known, choice
        return choice.config

    with tuning.override(wgmma_tf32_doc_rows=False) as stretched:
        pass
    with tuning.override(wgmma_tf32_stretch=0, wgmma_tf32_doc_rows=False) as two_sets:
        pass
    for dim, argmax, warpgroups, streamed in ((128, 0, 3, 0), (768, 0, 3, 0), (1024, 0, 3, 1), (128, 16, 2, 0),
                                              (1024, 16, 2, 0), (2560, 0, 3, 1), (2560, 16, 2, 1)):
        on, off = config(dim, argmax, stretched), config(dim, argmax, two_sets)
        assert (on.tf32_stretch, on.warpgroups, on.stream_query) == (1, warpgroups, streamed), (dim, argmax)
        assert (off.tf32_stretch, off.warpgroups, off.stream_query) == (0, 2, int(dim > 1024)), (dim, argmax)
    for bad in (-1, 2.0, "4"):
        with pytest.raises(ValueError, match="wgmma_tf32_stretch"):
            with tuning.override(wgmma_tf32_stretch=bad):
                pass


def test_one_fp32_query_documents_on_m():
    """fp32 one query at fp32 accuracy with Tunables.wgmma_tf32_doc_rows takes the documents on M
    (TF32_DOC_ROWS: tf32 3, three warpgroups) where the split query stays resident beside rings of
    three slots (dims to 512), winners too where 16 bits hold their rows (the default); 32-bit
    winners, fatter dims or the tunable off keep the split documents; each build among those the
    compile checks take."""
    from cupy_maxsim import tuning
    from cupy_maxsim._plan.forward import ForwardShape, choose_kernel
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES, compile_variants, tunable_variants

    properties = ARCH_PROPERTIES["sm_90"]
    known = {(family, tuple(d for d in defines if "EXPECT_SHARED_BYTES" not in d))
             for family, defines in compile_variants() + tunable_variants()}
    with tuning.override(wgmma_tf32_doc_rows=False) as off:
        pass
    with tuning.override(wgmma_tf32_doc_rows=True) as on:
        pass
    assert tuning.current() == on
    for dim, argmax, tf32 in ((48, 0, 3), (100, 0, 3), (128, 0, 3), (256, 0, 3), (512, 0, 3), (513, 0, 1),
                              (1024, 0, 1), (128, 16, 3), (500, 16, 3), (128, 32, 1), (2560, 0, 1)):
        for tunables, want in ((on, tf32), (off, 1)):
            choice = choose_kernel(ForwardShape("fp32", 1, 32, dim, 2000, False, argmax, 300, False), properties,
                                   tunables)
            assert choice.config.tf32 == want and (choice.family, choice.config.defines()) in known, (dim, choice)
            if want == 3:
                assert choice.config.warpgroups == 3 and choice.config.stages // 3 >= 3, choice


def test_tunables_from_command_line_text():
    """The benchmarks' ``KEY=VALUE`` tunables: integers as ints (negative too), the rest as
    text, each a valid override (an unknown field is the dataclass's TypeError)."""
    from cupy_maxsim import tuning

    changes = tuning.changes_from_text(["wgmma_tile_rows=128", "use_wgmma=0", "float32_precision=high",
                                        "stream_ksteps=-1"])
    assert changes == dict(wgmma_tile_rows=128, use_wgmma=0, float32_precision="high", stream_ksteps=-1)
    with tuning.override(**tuning.changes_from_text(["wgmma_tile_rows=64"])) as tunables:
        assert tunables.wgmma_tile_rows == 64
    with pytest.raises(TypeError):
        with tuning.override(**tuning.changes_from_text(["no_such_field=1"])):
            pass


@pytest.mark.parametrize("suffix", ["fp16", "bf16", "int8"])
def test_few_queries_at_fat_dims_take_documents_on_m(suffix):
    """Two to four queries of 32 tokens (rows past one query's half rows, too few for documents
    on M's two warpgroups) at a fat dim take the Hopper kernel with documents on M streaming k
    (query blocks resident at dim 320 in 16-bit, 640 in int8; the query atoms streamed at 2560
    and 5120), in two
    warpgroups, a prebuilt variant; never mma.sync. One query keeps its split rings; 32-bit
    winners keep mma.sync."""
    from cupy_maxsim import tuning
    from cupy_maxsim._plan.forward import ForwardShape, choose_kernel
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES, runtime_variants

    properties, known = ARCH_PROPERTIES["sm_90"], set(runtime_variants())
    for queries in (2, 3, 4):
        for dim in ((640, 5120) if suffix == "int8" else (320, 2560)):
            for argmax in (0, 16):
                choice = choose_kernel(ForwardShape(suffix, queries, 32, dim, 2000, False, argmax, 300, False),
                                       properties, tuning.current())
                assert choice.family == "maxsim_fwd_wgmma" and (choice.family, choice.config.defines()) in known
                config = choice.config
                assert config.docs_on_m and config.stream_k and config.warpgroups == 2, (queries, dim, config)
                # (streamed query atoms: 2-4 queries leave a box of q's map short, the build
                # that keeps boxes within q)
                assert config.stream_query == (2 if dim > 640 else 0), (queries, dim, config)
    for queries, boxes in ((8, 1), (16, 1), (10, 2), (6, 2)):  # whole groups keep the plain boxes' build
        dim = 5120 if suffix == "int8" else 2560
        choice = choose_kernel(ForwardShape(suffix, queries, 32, dim, 2000, False, 0, 300, False), properties,
                               tuning.current())
        assert (choice.family, choice.config.defines()) in known and choice.config.stream_query == boxes, queries
    one = choose_kernel(ForwardShape(suffix, 1, 32, 2560, 2000, False, 0, 300, False), properties, tuning.current())
    assert not one.config.docs_on_m
    wide = choose_kernel(ForwardShape(suffix, 4, 32, 2560, 2000, False, 32, 300, False), properties, tuning.current())
    assert wide is None or wide.family == "maxsim_fwd"


def test_tma_l2_promotion_is_one_the_driver_names():
    """Tunables.tma_l2_promotion (the TMA maps' L2 promotion) takes None (by the rows' width), 0,
    64, 128 or 256 bytes; anything else is a ValueError when the override is made, before any launch."""
    from cupy_maxsim import tuning

    for good in (None, 0, 64, 128, 256):
        with tuning.override(tma_l2_promotion=good) as chosen:
            assert chosen.tma_l2_promotion == good
    # None: by the rows' width, none for 256-byte rows of 8- or 16-bit elements (two boxes a
    # row), 256 bytes otherwise
    rows = ((64, 2), (128, 2), (256, 1), (64, 4), (256, 2), (2560, 2))
    assert [tma.l2_promotion_of_rows(dim, itemsize) for dim, itemsize in rows] == [256, 0, 0, 256, 256, 256]
    for bad in (32, 512, "256"):
        with pytest.raises(ValueError, match="tma_l2_promotion"):
            with tuning.override(tma_l2_promotion=bad):
                pass


def test_fp32_split_on_the_planner():
    """Tunables.wgmma_fp32_split: fp32 at "highest" with more query rows than one query's 32
    takes the Hopper kernel's split build (any dim, rows on 4 bytes and more, a group's last box
    kept within q where the count asks), not under "high", not for one query, pairs or 32-bit
    winners, not before Hopper; without the tunable, mma.sync's 3xTF32 as before."""
    from cupy_maxsim import tuning
    from cupy_maxsim._plan.forward import ForwardShape, choose_kernel
    from cupy_maxsim._plan.variants import ARCH_PROPERTIES

    def choose(nq, dim=128, lq=32, argmax=0, load_bytes=16, pairs=False, arch="sm_90", **changes):
        tunables = tuning.Tunables(**dict(dict(wgmma_fp32_split=True), **changes))
        return choose_kernel(ForwardShape("fp32", nq, lq, dim, 1000, pairs, argmax, 300.0, False, load_bytes),
                             ARCH_PROPERTIES[arch], tunables)

    def name(*args, **kwargs):
        choice = choose(*args, **kwargs)
        return choice and (choice.name, getattr(choice.config, "stream_query", None), choice.config.load_bytes)

    assert name(32) == ("maxsim_fwd_wgmma_fp32_split", 1, 16)
    assert name(33) == ("maxsim_fwd_wgmma_fp32_split", 2, 16)  # the last group's box within q
    for dim in (1, 48, 100, 1000, 2560, 8192):
        assert name(9, dim)[0] == "maxsim_fwd_wgmma_fp32_split"
    assert name(9, 100, load_bytes=4) == ("maxsim_fwd_wgmma_fp32_split", 2, 4)
    assert name(9, argmax=16)[0] == "maxsim_fwd_wgmma_fp32_split"
    assert name(2) == ("maxsim_fwd_wgmma_fp32_split", 2, 16) and name(1, lq=64)[0] == "maxsim_fwd_wgmma_fp32_split"
    for other in (name(1), name(2, lq=16), name(9, argmax=32), name(9, pairs=True), name(9, arch="sm_80"),
                  name(9, float32_precision="high"), name(9, wgmma_fp32_split=False), name(9, use_tma=False)):
        assert other is None or other[0] != "maxsim_fwd_wgmma_fp32_split", other
    # Tunables.wgmma_fp32_presplit: the documents split before (build 2) for rows on 16 bytes
    # whose halves (1000 x 300 rows x 256 bytes per 64 of the dim) fit fp32_presplit_max_bytes.
    assert choose(9, wgmma_fp32_presplit=False).config.fp32_split == 1
    assert choose(9).config.fp32_split == 2 and choose(9, 2560).config.fp32_split == 2
    assert choose(9, 100, load_bytes=8).config.fp32_split == 1
    assert choose(9, 128, fp32_presplit_max_bytes=1000 * 300 * 512 - 1).config.fp32_split == 1


def test_the_last_query_group_takes_longer_ranges(h200_planner):
    """Documents on M: where the last query group's warpgroups past the last query idle (32
    queries of 32 tokens in groups of 12: its third), its blocks take longer document ranges in
    proportion to the MMAs they skip, so that one wave of blocks (132 on an H200) finishes
    together; groups alike (36 queries), several waves, or the tunable off keep one range (0: the
    last group's ranges are the others', every warpgroup multiplying); one group with idle
    warpgroups (the fp32 split's two for four queries) has its own, the same."""
    def plan(num_queries, num_docs=10_000, suffix="fp16", dim=128, query_length=32, tunables=DEFAULT):
        h200_planner.clear()
        _forward._plans.clear()
        shape = _forward.planner.ForwardShape(suffix, num_queries, query_length, dim, num_docs, False, 0, 1030, False)
        return _forward.mma_plan(0, shape, tunables)

    balanced = plan(32)
    assert (balanced.group, balanced.groups) == (12, 3)
    whole, last = balanced.docs_per_block, balanced.last_group_docs_per_block
    whole_blocks, last_blocks = -(-10_000 // whole), -(-10_000 // last)
    assert 2 * whole_blocks + last_blocks <= 132 and last > whole and balanced.grid_x == whole_blocks
    # The model: per tile, a warpgroup's 8 k-steps of MMAs and the fold's 14 (FOLD_KSTEPS).
    share = (2 * 8 + 14) / (3 * 8 + 14)
    assert abs(last_blocks * 1.0 / (whole_blocks * share) - 1.0) < 0.05
    for alike in (plan(36), plan(32, tunables=dataclasses.replace(DEFAULT, wgmma_idle_groups=False)),
                  plan(1000)):
        assert alike.last_group_docs_per_block == 0
    one_group = plan(4, suffix="fp32")
    assert (one_group.groups, one_group.last_group_docs_per_block) == (1, one_group.docs_per_block)
    assert plan(8, suffix="fp32").last_group_docs_per_block == 0  # (two warpgroups of four: none idles)
    # Many groups in one wave (500 queries, 42 groups): every range of every group within the grid.
    many = plan(500, num_docs=200)
    for per_block in (many.docs_per_block, many.last_group_docs_per_block or many.docs_per_block):
        assert many.grid_x * per_block >= 200 and many.grid_x * many.groups <= 2 * 132
    # Queries of 16 tokens, eight a warpgroup: 30 queries leave the second group's six in one.
    short = plan(30, query_length=16)
    assert (short.group, short.groups) == (24, 2) and short.last_group_docs_per_block > short.docs_per_block
    # Streaming k at dim 192 (documents on M, three warpgroups of resident query blocks); at
    # 320 two warpgroups of four queries: 32 queries fill them.
    fat = plan(32, dim=192)
    assert fat.group == 12 and fat.last_group_docs_per_block > fat.docs_per_block
    assert plan(32, dim=320).group == 8 and plan(32, dim=320).last_group_docs_per_block == 0


def test_fat_dims_take_128_document_rows_a_slot(h200_planner):
    """Documents on M streaming the query atoms: 128 document rows a slot (two halves against one
    query atom, M_HALVES) from Tunables.wgmma_docs_on_m_halves_ksteps on (fp16 dim 2048), 16-bit
    only; 64 below it, for int8, and with the tunable at 0."""
    def tile_rows(suffix, dim, tunables=DEFAULT):
        h200_planner.clear()
        _forward._plans.clear()
        shape = _forward.planner.ForwardShape(suffix, 32, 32, dim, 2_000, False, 0, 300, False)
        plan = _forward.mma_plan(0, shape, tunables)
        defines = dict(d.lstrip("-D").split("=") for d in h200_planner[-1][2])
        assert defines["MAXSIM_DOCS_ON_M"] == "1" and defines["MAXSIM_TILE_N"] == str(plan.tile_rows)
        return plan.tile_rows

    assert [tile_rows("fp16", dim) for dim in (1024, 2000, 2048, 2560, 8192)] == [64, 64, 128, 128, 128]
    assert tile_rows("bf16", 4096) == 128 and tile_rows("int8", 4096) == 64
    assert tile_rows("fp16", 2560, dataclasses.replace(DEFAULT, wgmma_docs_on_m_halves_ksteps=0)) == 64
    assert tile_rows("fp16", 256, dataclasses.replace(DEFAULT, wgmma_docs_on_m_halves_ksteps=1)) == 128


@pytest.mark.parametrize("groups", [2, 3, 5, 17, 40, 43])
def test_idle_group_ranges_cover_every_document(groups):
    """Whatever the rounding, every group's blocks (the grid's x, sized by the larger count) cover
    every document, the last group's ranges are at least a whole group's, and one wave holds them."""
    from cupy_maxsim._plan.forward import idle_group_ranges

    for blocks in (132, 264):
        for num_docs in (1, 7, 130, 999, 10_000, 1_000_003):
            for share in (0.3, 0.69, 0.79, 0.95):
                whole, last = idle_group_ranges(num_docs, groups, share, blocks)
                grid_x = max(-(-num_docs // whole), -(-num_docs // last))
                assert last >= whole and grid_x * whole >= num_docs and grid_x * last >= num_docs
                assert (groups - 1) * -(-num_docs // whole) + -(-num_docs // last) <= max(blocks, groups), (
                    num_docs, share, whole, last)


def test_one_query_group_ranges_fill_every_sm(h200_planner):
    """One query group: a block an SM (up to the documents), ranges at most one document apart,
    long ones first, together every document once, in order (the kernel's block_doc_range, read
    the way common.cuh reads it); ranges of one size with the tunable off (its default until it
    has run on a GPU)."""
    from cupy_maxsim._plan.forward import balanced_ranges

    for blocks in (132, 264):
        for num_docs in (0, 1, 7, 131, 132, 133, 813, 1302, 52_083, 1_000_003):
            per, ranges, long_ranges = balanced_ranges(num_docs, blocks)
            assert ranges == max(1, min(num_docs, blocks)) and 0 <= long_ranges <= ranges
            covered = []
            for block in range(ranges):
                short = block >= long_ranges
                begin = block * per - (block - long_ranges if short else 0)
                end = min(begin + per - short, num_docs)
                assert end - begin in (per, per - 1) or (num_docs == 0 and end == begin)
                covered.append((begin, end))
            assert [begin for begin, _ in covered[1:]] == [end for _, end in covered[:-1]]
            assert covered[0][0] == 0 and covered[-1][1] == num_docs

    def plan(tunables=DEFAULT, suffix="fp32", num_queries=1, dim=4096):
        h200_planner.clear()
        _forward._plans.clear()
        shape = _forward.planner.ForwardShape(suffix, num_queries, 32, dim, 813, False, 0, 300, False)
        return _forward.mma_plan(0, shape, tunables)

    on = dataclasses.replace(DEFAULT, balanced_ranges=True)
    balanced, ceiled = plan(on), plan()
    assert (balanced.grid_x, balanced.docs_per_block, balanced.long_ranges) == (132, 7, 21)
    assert (ceiled.grid_x, ceiled.docs_per_block, ceiled.long_ranges) == (117, 7, 117)
    # One group of 12 queries (documents on M, not split documents): the Hopper kernel reads
    # ranges of one size there, and the planner gives it no others.
    docs_on_m = plan(on, "fp16", 12, 128)
    assert docs_on_m.groups == 1 and docs_on_m.long_ranges == docs_on_m.grid_x


def test_document_parts():
    """planner.document_parts: whole documents where every ring reads enough of them (or the
    tunable is off), else parts enough for about per_ring a ring, at most a part a tile of an
    average document (whole tiles) and MAX_DOCUMENT_PARTS; the parts of a document as
    maxsim_parts.cu cuts them (tiles [p T / U, (p + 1) T / U)) cover its tokens once, in order,
    each part starting on a tile of the whole document."""
    from cupy_maxsim._plan.forward import MAX_DOCUMENT_PARTS, document_parts

    rings = 132 * 3
    assert document_parts(1302, 300, 64, rings, 0) == 1  # off
    assert document_parts(52_083, 300, 64, rings, 16) == 1  # 131 documents a ring
    assert document_parts(1302, 300, 64, rings, 16) == 5  # fp32 dim 2560: a part a tile (5 tiles)
    assert document_parts(1302, 300, 64, rings, 8) == 3
    assert document_parts(813, 300, 64, rings, 4) == 2
    assert document_parts(10, 100_000, 64, rings, 16) == MAX_DOCUMENT_PARTS
    assert document_parts(0, 300, 64, rings, 16) == 1
    for length in (0, 1, 63, 64, 65, 300, 1030):
        for parts in (2, 3, 5, 32):
            starts = part_starts(0, length, parts, 64) + [length]
            assert starts[0] == 0 and all(a <= b for a, b in zip(starts, starts[1:]))
            assert all(s % 64 == 0 or s == length for s in starts)
