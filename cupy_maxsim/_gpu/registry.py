"""The kernel registry: every source family, the kernels it defines and where its source is.

One table (:data:`FAMILIES`) that compiling, dispatch and the packaging tests all read: a
family's kernels are named ``<family>_<suffix>`` by the dtype suffixes of :data:`DTYPE_SUFFIX`
(plus a layout tag where a family has one), and every name must appear as ``ENTRY(name,`` in
its source (tests/test_packaging.py).
"""

from __future__ import annotations

import typing
from pathlib import Path

class Format(typing.NamedTuple):
    """An element format as the kernels see it: the Python side of kernels_cu/codecs.cuh's
    Codec<T> (tests/test_packaging.py holds the two to each other)."""

    suffix: str  # of its kernels' names
    ctype: str  # the kernels' type
    bits: int
    scaled: bool  # tokens carry per-token scales (int8)
    tensor_cores: bool  # the mma.sync forward (maxsim_fwd.cu) takes it
    hopper: bool  # so does the Hopper forward (maxsim_fwd_wgmma.cu)


#: dtype name -> its format. A new format (fp8, 4-bit) is a row here and a codec in codecs.cuh.
FORMATS = {
    "float16": Format("fp16", "fp16_t", 16, False, True, True),
    "bfloat16": Format("bf16", "bf16_t", 16, False, True, True),
    "float32": Format("fp32", "float", 32, False, True, False),  # 3xTF32 (common.cuh, Mma16816<float>)
    "float64": Format("fp64", "double", 64, False, False, False),
    "int8": Format("int8", "i8", 8, True, True, True),
}
#: float32 as the Hopper kernel's fp32 split build reads it (fp16 halves of power-of-two-scaled
#: tokens: codecs.cuh, fp32_split_t): not a dtype of its own, but a format of the kernels' all
#: the same (its queries are split into it by maxsim_quantize_fp32_split, its documents by its
#: producer or, presplit, by maxsim_split_documents).
FP32_SPLIT = Format("fp32_split", "fp32_split_t", 16, True, False, True)
#: dtype name -> the suffix of its kernels' names, and back.
DTYPE_SUFFIX = {dtype: f.suffix for dtype, f in FORMATS.items()}
SUFFIX_DTYPE = {suffix: dtype for dtype, suffix in DTYPE_SUFFIX.items()}
#: kernel suffix -> format.
SUFFIX_FORMAT = {f.suffix: f for f in FORMATS.values()}

#: Kernel names each source family defines; tests check that every one exists in the source.
FAMILIES = {
    "maxsim_fwd": ("maxsim_fwd.cu", ("maxsim_fwd_fp16", "maxsim_fwd_bf16", "maxsim_fwd_fp32", "maxsim_fwd_int8")),
    "maxsim_fwd_wgmma": (
        "maxsim_fwd_wgmma.cu",
        ("maxsim_fwd_wgmma_fp16", "maxsim_fwd_wgmma_bf16", "maxsim_fwd_wgmma_int8", "maxsim_fwd_wgmma_fp32",
         "maxsim_fwd_wgmma_fp32_split"),
    ),
    "maxsim_fwd_simt": (
        "maxsim_fwd_simt.cu",
        ("maxsim_fwd_simt_fp16", "maxsim_fwd_simt_bf16", "maxsim_fwd_simt_fp32", "maxsim_fwd_simt_fp64",
         "maxsim_fwd_simt_int8"),
    ),
    "maxsim_bwd": (
        "maxsim_bwd.cu",
        tuple(f"maxsim_bwd_{stage}_{suffix}" for suffix in ("fp16", "bf16", "fp32", "fp64", "fp16_wide", "bf16_wide")
              for stage in ("csr_dq", "dd", "fused")),
    ),
    "maxsim_offsets": ("maxsim_offsets.cu", ("maxsim_offsets_summary",)),
    "maxsim_parts": ("maxsim_parts.cu", ("maxsim_parts_offsets", "maxsim_parts_merge")),
    "maxsim_topk": ("maxsim_topk.cu", ("maxsim_topk_select", "maxsim_topk_wide", "maxsim_topk_finish",
                                     "maxsim_topk_merge")),
    "maxsim_quantize": ("maxsim_quantize.cu",
                        tuple(f"maxsim_quantize_{s}" for s in ("fp16", "bf16", "fp32", "fp64", "fp32_split"))
                        + ("maxsim_split_exponents", "maxsim_split_documents")),
}


#: NVRTC's options for every family (with the variant's defines and the architecture after them).
NVRTC_OPTIONS = ("-std=c++17",)

#: Families written with architecture-specific instructions (wgmma exists on sm_90a only).
ARCH_SPECIFIC = {"maxsim_fwd_wgmma": "sm_90a"}


def kernel_name(family: str, dtype: str, stage: str = "", wide: bool = False) -> str:
    """The registered name of ``family``'s kernel for ``dtype``: ``<family>[_<stage>]_<suffix>``
    (``stage``: the backward's csr_dq, dd or fused), ``_wide`` after it for the backward's
    16-byte rows."""
    name = f"{family}_{stage + '_' if stage else ''}{DTYPE_SUFFIX[dtype]}{'_wide' if wide else ''}"
    if name not in FAMILIES[family][1]:
        raise KeyError(f"{name} is not registered in {family}")
    return name


def kernel_dir() -> Path:
    """The ``kernels_cu`` folder: inside the installed wheel, else the repository root."""
    here = Path(__file__).resolve().parent.parent  # the package folder
    for candidate in (here / "kernels_cu", here.parent / "kernels_cu"):
        if (candidate / "common.cuh").is_file():
            return candidate
    raise FileNotFoundError(
        f"cannot find kernels_cu/ (looked in {here / 'kernels_cu'} and {here.parent / 'kernels_cu'})"
    )


#: The headers in front of every family's source, in this order: concatenated, not #include-d,
#: since CuPy's disk cache hashes the source string only (an edited header must never serve a
#: stale binary).
HEADERS = ("common.cuh", "codecs.cuh", "epilogue.cuh")


def source(family: str) -> str:
    """Full source of a kernel family: the headers followed by the family's .cu file."""
    folder = kernel_dir()
    filename, _ = FAMILIES[family]
    return "\n".join((folder / header).read_text() for header in HEADERS + (filename,))
