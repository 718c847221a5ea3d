"""Every kernel variant the planners can ask for: what the compile checks and the CLI build.

The Hopper family's int8 entry and the mma.sync family's fp32 entry exist only where their
registers allow (the #if before each, mirrored by configs.int8_long_tiles,
configs.int8_docs_on_m_warpgroups and configs.fp32_entry);
:func:`family_kernels` says which kernels a variant defines, and the compile test holds the
source to it.
"""

from __future__ import annotations

import typing
from dataclasses import replace

from .._gpu.nvrtc import CompileReport, compile_with_nvrtc
from .._gpu.registry import ARCH_SPECIFIC, FAMILIES
from ..tuning import DEFAULT
from .configs import (LOAD_ALIGNMENTS, MMA_CONFIGS, STREAM_KSTEPS_CHOICES, choose_stages, fp32_entry, int8_docs_on_m_warpgroups,
                      int8_long_tiles, long_tiles_spill, mma_config, wgmma_config, wgmma_docs_on_m_stream_config,
                      wgmma_fp32_split_config, wgmma_stream_config, WGMMA_DOCS_ON_M_STREAM_CAPACITIES, WGMMA_STREAM_CAPACITIES,
                      WGMMA_STREAM_QUERY_CAPACITY, within_q_boxes)


def family_kernels(family: str, defines=()) -> tuple[str, ...]:
    """The kernels a family's source defines under ``defines`` (the Hopper kernel's int8 entry:
    see int8_long_tiles, its fp32 entry: its TF32 builds; the mma.sync kernel's fp32 entry: see
    fp32_entry)."""
    names = FAMILIES[family][1]
    value = dict(d[len("-D"):].split("=", 1) for d in defines)
    if family == "maxsim_fwd" and defines and not fp32_entry(
            int(value["MAXSIM_MT"]), int(value["MAXSIM_NT"]), int(value["MAXSIM_KSTEPS"]),
            int(value.get("MAXSIM_STREAM_K", 0))):
        names = tuple(name for name in names if not name.endswith("_fp32"))
    if family == "maxsim_fwd_wgmma":
        # Its TF32 builds (fp32, MAXSIM_TF32) define the fp32 entry alone, its split builds
        # (MAXSIM_FP32_SPLIT) the fp32_split entry alone; the others every entry but those two.
        tf32 = value.get("MAXSIM_TF32", "0") != "0"
        split = value.get("MAXSIM_FP32_SPLIT", "0") != "0"
        names = tuple(name for name in names if name.endswith("_fp32") == tf32 and name.endswith("_fp32_split") == split)
        if (value.get("MAXSIM_TILE_N") == "128" and not int8_long_tiles(
                value.get("MAXSIM_SPLIT_DOCS") == "1", int(value["MAXSIM_KSTEPS"]))) or (
                value.get("MAXSIM_DOCS_ON_M") == "1" and int(value["MAXSIM_WARPGROUPS"]) > int8_docs_on_m_warpgroups(
                    value.get("MAXSIM_ARGMAX") == "1", int(value["MAXSIM_KSTEPS"]))):
            names = tuple(name for name in names if not name.endswith("_int8"))
    return names


_EXPECT_SHARED = "-DMAXSIM_EXPECT_SHARED_BYTES="


def _checked(config) -> tuple[str, ...]:
    """A tile configuration's defines, plus the shared memory Python gives its launches: the
    kernel's source asserts (static_assert) that its own SHARED_BYTES is the same."""
    return config.defines() + (f"{_EXPECT_SHARED}{config.shared_bytes}",)


def runtime_variants() -> list[tuple[str, tuple[str, ...]]]:
    """The variants of :func:`compile_variants` with the defines a GPU process compiles them
    with (the shared-memory check is the compile test's alone): what the wheel prebuilds."""
    variants = []
    for family, defines in compile_variants():
        variant = (family, tuple(d for d in defines if not d.startswith(_EXPECT_SHARED)))
        if variant not in variants:
            variants.append(variant)
    return variants


#: What the planners read of each architecture the wheel carries cubins for (the tuple of
#: _gpu.device.device_properties: SMs, shared memory per block (opt-in) and per SM, compute
#: capability, L2 bytes). Shared memory sets a tile's stages, so each has variants of its own.
ARCH_PROPERTIES = {
    "sm_80": (108, 166912, 167936, 80, 40 * 2**20),  # A100
    "sm_86": (84, 101376, 102400, 86, 6 * 2**20),  # A10, RTX 3090
    "sm_89": (128, 101376, 102400, 89, 72 * 2**20),  # L4, L40S, RTX 4090
    "sm_90": (132, 232448, 233472, 90, 50 * 2**20),  # H100, H200
}


def compile_variants() -> list[tuple[str, tuple[str, ...]]]:
    """Every (family, defines) variant the dispatcher can ask for on ARCH_PROPERTIES' devices
    at dims 16 to 256 (whole 16-byte rows) with every query stacking, streaming k (fatter
    dims), rows at each alignment below 16 bytes (dim 100-ish; 4 and 8 bytes on the Hopper
    kernel too), with and without the argmax;
    the tensor-core forwards' with their shared memory checked. (tests/test_planners.py holds
    the planners to this list over a grid of shapes.)"""
    variants = [("maxsim_fwd_simt", ()), ("maxsim_bwd", DEFAULT.bwd_defines), ("maxsim_offsets", ()), ("maxsim_parts", ()),
                ("maxsim_topk", ()), ("maxsim_quantize", ())]

    def add(family, config):
        for staged in ([config] if family != "maxsim_fwd" else
                       [choose_stages(config, props[1]) for props in ARCH_PROPERTIES.values()]):
            if staged is not None and (family, _checked(staged)) not in variants:
                variants.append((family, _checked(staged)))

    for width in MMA_CONFIGS:
        for ksteps in (1, 2, 3, 4, 6, 8, 10, 12, 16):  # fp16 dims 16 to 256, fp32 to 96, int8 to 320+
            for argmax in (False, True):
                config = mma_config(width, ksteps, argmax)
                if config is not None:
                    add("maxsim_fwd", config)
        for argmax in (False, True):  # streaming k: every dim past the resident query block
            for stream_ksteps in STREAM_KSTEPS_CHOICES:
                add("maxsim_fwd", mma_config(width, 0, argmax, stream=True, stream_ksteps=stream_ksteps))
    for load_bytes in LOAD_ALIGNMENTS[:-1]:  # rows not 16-byte aligned (odd dims), dim 100-ish
        for shifted in (0, 1) if load_bytes == 4 else (0,):  # 16-bit rows on 4 bytes: shifted lines
            for argmax in (False, True):
                add("maxsim_fwd", replace(mma_config(32, 7, argmax), load_bytes=load_bytes, shifted_rows=shifted))
            add("maxsim_fwd", replace(mma_config(256, 7), load_bytes=load_bytes, shifted_rows=shifted))
    for ksteps in (2, 4, 6, 8):
        for argmax in (False, True):
            for warpgroups in (1, 2, 3):  # 1: one query group, documents split
                for tile_n in (64, 128):
                    for query_rows in (32, 64) if warpgroups == 1 else (64,):  # 32: half rows
                        config = wgmma_config(ksteps, argmax, warpgroups, tile_n, query_rows)
                        if tile_n == 128 and long_tiles_spill(config.split_docs, ksteps, argmax, config.half_rows):
                            continue  # (the planner takes 64-row tiles there)
                        add("maxsim_fwd_wgmma", config)
        for config in _docs_on_m_configs(ksteps, DEFAULT):
            add("maxsim_fwd_wgmma", config)
    for capacity in WGMMA_STREAM_CAPACITIES:  # one query at fat dims on the Hopper kernel (streaming k)
        for argmax in (False, True):
            add("maxsim_fwd_wgmma", wgmma_stream_config(capacity, argmax))
            for tf32 in (1, 2):  # fp32, one query: at fp32 accuracy, and precision "high"
                add("maxsim_fwd_wgmma", wgmma_stream_config(capacity, argmax, tf32=tf32))
            if argmax:  # (at fp32 accuracy, winners past 16 bits keep the split documents)
                add("maxsim_fwd_wgmma", wgmma_stream_config(capacity, 32, tf32=1))
    for argmax in (False, True):  # ... and past fp16 dim 2048 (fp32 1024), the query's atoms streamed too
        for tf32 in (0, 1, 2):
            add("maxsim_fwd_wgmma", wgmma_stream_config(WGMMA_STREAM_QUERY_CAPACITY, argmax, tf32=tf32,
                                                        stream_queries=True))
    for capacity in WGMMA_DOCS_ON_M_STREAM_CAPACITIES:  # many queries at fat dims (documents on M)
        for argmax in (False, True):
            for warpgroups in (2, 3):
                for int8 in (False, True):
                    add("maxsim_fwd_wgmma", wgmma_docs_on_m_stream_config(capacity, argmax, warpgroups, int8))
                add("maxsim_fwd_wgmma", wgmma_docs_on_m_stream_config(capacity, argmax, warpgroups, tf32=2))
    for argmax in (False, True):  # ... and past them, the query atoms streamed too
        for tf32 in (0, 2):
            whole_groups = wgmma_docs_on_m_stream_config(WGMMA_STREAM_QUERY_CAPACITY, argmax, tf32=tf32)
            add("maxsim_fwd_wgmma", whole_groups)
            add("maxsim_fwd_wgmma", within_q_boxes(whole_groups, 1, 32))  # (one query: a box short)
    for argmax in (False, True):  # 16-bit, 128 document rows a slot (Tunables.wgmma_docs_on_m_halves_ksteps)
        for capacity in WGMMA_DOCS_ON_M_STREAM_CAPACITIES:
            for warpgroups in (2, 3):
                add("maxsim_fwd_wgmma", wgmma_docs_on_m_stream_config(capacity, argmax, warpgroups, tile_n=128))
        whole_groups = wgmma_docs_on_m_stream_config(WGMMA_STREAM_QUERY_CAPACITY, argmax, tile_n=128)
        add("maxsim_fwd_wgmma", whole_groups)
        add("maxsim_fwd_wgmma", within_q_boxes(whole_groups, 1, 32))
    for argmax in (False, True):  # fp32 at fp32 accuracy, several queries: three fp16 products (Tunables.wgmma_fp32_split)
        split = wgmma_fp32_split_config(argmax)
        for load_bytes in (16, 8, 4):  # (the producer's loads: 16-byte vectors where the rows allow)
            add("maxsim_fwd_wgmma", replace(split, load_bytes=load_bytes))
            add("maxsim_fwd_wgmma", replace(within_q_boxes(split, 1, 32), load_bytes=load_bytes))
        presplit = wgmma_fp32_split_config(argmax, presplit=True)  # (Tunables.wgmma_fp32_presplit: TMA, 16-byte rows)
        add("maxsim_fwd_wgmma", presplit)
        add("maxsim_fwd_wgmma", within_q_boxes(presplit, 1, 32))
    for load_bytes in (4, 8):  # rows off 16 bytes on the Hopper kernel (cp.async pieces): dim 100-ish
        for ksteps in (4, 8):
            # (many queries only: one query's split rings keep 16-byte rows, forward.choose_kernel)
            for config in _off_16_bytes_docs_on_m_configs(ksteps, load_bytes, DEFAULT):
                add("maxsim_fwd_wgmma", config)
    return variants


def _off_16_bytes_docs_on_m_configs(ksteps: int, load_bytes: int, tunables) -> list:
    """Documents on M for rows on ``load_bytes`` (4 or 8: cp.async pieces), k resident."""
    return [replace(wgmma_config(ksteps, False, warpgroups, docs_on_m=True, int8=int8, tunables=tunables),
                    load_bytes=load_bytes) for warpgroups in (2, 3) for int8 in (False, True)]


def planned_forwards(properties: tuple, grid, tunables=DEFAULT) -> typing.Iterator[tuple[tuple, object]]:
    """(fields, the planner's KernelChoice) for each ForwardShape's ``fields`` in ``grid`` that
    a tensor-core forward takes on a device of ``properties`` under ``tunables``: the walk
    that holds the planner to the compile list (tests/test_planners.py) and finds the
    first-use builds (:func:`first_use_variants`)."""
    from .forward import ForwardShape, choose_kernel

    for fields in grid:
        choice = choose_kernel(ForwardShape(*fields), properties, tunables)
        if choice is not None:
            yield fields, choice


def _docs_on_m_configs(ksteps: int, tunables) -> list:
    """Documents on M with k resident at ``ksteps``: two and three warpgroups (int8: see
    int8_docs_on_m_warpgroups), with and without winners, 16-bit, int8 and fp32 under "high"."""
    configs = []
    for warpgroups in (2, 3):
        for argmax in (False, True):
            for int8 in (False, True):
                configs.append(wgmma_config(ksteps, argmax, warpgroups, docs_on_m=True, int8=int8, tunables=tunables))
            configs.append(wgmma_config(ksteps, argmax, warpgroups, docs_on_m=True, tf32=2, tunables=tunables))
    return configs


def tunable_variants() -> list[tuple[str, tuple[str, ...]]]:
    """The builds opt-in tunables ask for beyond :func:`compile_variants` (documents on M in
    turns: Tunables.wgmma_turns; fp32 one query in two accumulator sets or in stretches of four
    atoms: Tunables.wgmma_tf32_stretch 0 or 4; its documents on M: wgmma_tf32_doc_rows; documents
    in parts: document_parts_per_ring), as the compile checks take them: compiled in CI,
    not prebuilt while the tunable is at its default."""
    turned = replace(DEFAULT, wgmma_turns=True)
    listed = set(compile_variants())
    found = {}
    configs = [c for ksteps in (2, 4, 6, 8) for c in _docs_on_m_configs(ksteps, turned)]
    configs += [c for load_bytes in (4, 8) for ksteps in (4, 8)
                for c in _off_16_bytes_docs_on_m_configs(ksteps, load_bytes, turned)]
    configs += [wgmma_stream_config(capacity, argmax, replace(DEFAULT, wgmma_tf32_stretch=stretch,
                                                              wgmma_tf32_doc_rows=doc_rows), tf32=1,
                                    stream_queries=streamed)
                for stretch in (0, 1, 4)  # fp32 one query: two accumulator sets (no TF32_STRETCH), stretches
                for doc_rows in (False, True)  # ... or, where they fit, its documents on M
                for capacity in WGMMA_STREAM_CAPACITIES + (WGMMA_STREAM_QUERY_CAPACITY,) for argmax in (False, True)
                for streamed in ((True,) if capacity == WGMMA_STREAM_QUERY_CAPACITY else (False,))]
    # Documents in parts (Tunables.document_parts_per_ring): the one-query streaming builds the
    # planner takes by default, without winners, writing a part's record.
    configs += [replace(config, part_maxima=1)
                for tf32 in (0, 1) for capacity in WGMMA_STREAM_CAPACITIES + (WGMMA_STREAM_QUERY_CAPACITY,)
                for config in [wgmma_stream_config(capacity, 0, DEFAULT, tf32, stream_queries=True)] if config]
    for config in configs:
        found.setdefault(("maxsim_fwd_wgmma", _checked(config)), None)
    return [variant for variant in found if variant not in listed]


def first_use_variants() -> list[tuple[str, str, tuple[str, ...]]]:
    """The builds the planner asks for rows on 4 or 8 bytes (odd dims, views shifted off 16
    bytes) beyond :func:`compile_variants`: (architecture, family, defines as the compile checks
    take them) over a grid of such shapes on an A100's and an H200's properties (sm_86 and sm_89
    ask for the same shapes with fewer stages: 663 builds with them, 351 without, a compile
    each in CI). They compile at first use on a GPU (a second or so each) rather than ship as
    prebuilt cubins (tens of MB); the compile test holds each to no spills on its own
    architecture."""
    import itertools

    grid = [(suffix, queries, length, dim, docs, False, argmax, tokens, packed, load_bytes)
            for suffix, dim, (queries, length), (tokens, docs), argmax, packed, load_bytes in itertools.product(
                ("fp16", "bf16", "fp32", "int8"), (20, 60, 100, 130, 200, 1000, 2500),
                ((1, 1), (1, 32), (2, 16), (1, 64), (3, 20), (4, 32), (40, 32)), ((17, 10), (150, 10), (1030, 100000)),
                (0, 16), (False, True), (4, 8))]
    listed = set(compile_variants())
    found = {}  # (an ordered set)
    for arch in ("sm_80", "sm_90"):
        for _, choice in planned_forwards(ARCH_PROPERTIES[arch], grid):
            defines = _checked(choice.config)
            if (choice.family, defines) not in listed:
                found[(arch, choice.family, defines)] = None
    return list(found)


def compile_targets(family: str, archs) -> tuple[str, ...]:
    """The architectures among ``archs`` that ``family`` is built for (sm_90a stands for sm_90)."""
    arch = ARCH_SPECIFIC.get(family)
    if arch is None:
        return tuple(archs)
    return (arch,) if arch.rstrip("a") in archs else ()


def compile_all(archs=("sm_80", "sm_86", "sm_89", "sm_90")) -> list[CompileReport]:
    """Compile every kernel variant for every architecture through NVRTC (no GPU needed)."""
    reports = []
    for family, defines in compile_variants():
        for arch in compile_targets(family, archs):
            reports += compile_with_nvrtc(family, arch, defines)
    return reports
