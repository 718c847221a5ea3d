"""Which part of the Hopper forward limits it: the same kernel with the fold, the MMAs or both
removed by source patches (timing only: the scores of a patched kernel are wrong by design),
and, for one query (warpgroups splitting the documents), with shallower rings, other document
orders and cache policies. fp16 or int8, dim 128; one query: 64- and 128-row tiles, with the
streaming rate against the copy bandwidth; int8 also without the document scales' copies.

    python bench/ablate_wgmma.py [shape,...] > bench/results/ablation-wgmma-<date>.log
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_forward  # noqa: E402

FOLD = ("        if (!info.biased)\n            fold_tile(acc, info, false, false);\n        else if (args.d_mask == nullptr)\n"
        "            fold_tile(acc, info, true, false);\n        else\n            fold_tile(acc, info, true, true);\n", "")
MMA = ("for (int ks = 0; ks < KSTEPS; ++ks) WgmmaTile<T>::run(acc, a_regs[ks], desc + kstep_offset(ks), ks);",
       "if (desc == 1) WgmmaTile<T>::run(acc, a_regs[0], desc, 0);")  # never true: no MMA issued
PATCHES = {"base": [], "no-fold": [FOLD], "no-mma": [MMA], "no-fold-no-mma": [FOLD, MMA]}
# The same with documents on M (many queries), and with half of each tile's k-steps (does the
# time follow the MMAs?).
DOCS_FOLD = ("            if (tile.biased)\n                fold_rows(real0, real1, tile.s0, tile.s1, tile.first_row, true, FIRST);\n"
             "            else\n                fold_rows(real0, real1, tile.s0, tile.s1, tile.first_row, false, FIRST);\n", "")
DOCS_MMA = ("WgmmaDocsOnM<T>::run(acc, doc_desc + kstep_offset(ks), query_desc + query_kstep_offset(ks), ks);",
            "if (doc_desc == 1) WgmmaDocsOnM<T>::run(acc, doc_desc, query_desc, 0);")
DOCS_HALF_K = ("            for (int ks = 0; ks < KSTEPS; ++ks)\n                WgmmaDocsOnM",
               "            for (int ks = 0; ks < KSTEPS / 2; ++ks)\n                WgmmaDocsOnM")
# ... and without a finished document's reductions and sums (scores wrong by design).
DOCS_CLOSE = [("                keep_max_of_halves<16>(best, lane);", "if (doc_count < 0) {"),
              ("                keep_max_of_halves<4>(best, lane);", "}"),
              ("            close_document(tile.doc);\n", "")]
DOCS_ON_M_PATCHES = {"base": [], "no-fold": [DOCS_FOLD], "no-mma": [DOCS_MMA], "no-fold-no-mma": [DOCS_FOLD, DOCS_MMA],
                     "half-k": [DOCS_HALF_K], "half-k-no-fold": [DOCS_HALF_K, DOCS_FOLD],
                     "no-close": DOCS_CLOSE, "no-fold-no-mma-no-close": [DOCS_FOLD, DOCS_MMA] + DOCS_CLOSE}
# One query: block b takes documents b, b + grid, b + 2 grid, ... (the blocks read neighbouring
# documents at the same time) instead of a contiguous range.
INTERLEAVED = [("    const i64 doc_count = doc_end - doc_begin;",
                "    const i64 doc_count = SPLIT_DOCS ? (args.num_docs - blockIdx.x + gridDim.x - 1) / gridDim.x\n"
                "                                     : doc_end - doc_begin;"),
               ("        return doc_begin + (p >= doc_count ? p - doc_count : p);",
                "        if (SPLIT_DOCS) return (i64)blockIdx.x + position * gridDim.x;\n"
                "        return doc_begin + (p >= doc_count ? p - doc_count : p);")]
# Document tiles read with an L2 evict-first policy (read once; the flush's dirty lines stay).
EVICT_FIRST = [("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\\n\"\n"
                "        ::\"r\"(smem_address(dst))",
                "{\\n.reg .b64 policy;\\ncreatepolicy.fractional.L2::evict_first.b64 policy, 1.0;\\n\"\n"
                "        \"cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], policy;\\n}\\n\"\n"
                "        ::\"r\"(smem_address(dst))")]
ONE_QUERY_PATCHES = {"interleaved": INTERLEAVED, "evict-first": EVICT_FIRST,
                     "interleaved+evict-first": INTERLEAVED + EVICT_FIRST}
# int8: the producer copies no document scales (the fold reads whatever the slots hold).
NO_SCALES = [("                    for (int r = lane; r < TILE_N; r += 32) copy_scale(r, r < rows_left);", "")]
INT8_PATCHES = {"no-scale-copies": NO_SCALES, "no-scale-copies-no-fold": NO_SCALES + [FOLD]}
# name: (queries, query tokens, documents, document tokens, tile rows or None (planned), int8)
SHAPES = {"inbatch-128": (128, 32, 128, 300, None, False), "colpali-32q-10k": (32, 32, 10_000, 1030, None, False),
          "corpus-10k N64": (1, 32, 10_000, 300, 64, False), "corpus-10k N128": (1, 32, 10_000, 300, 128, False),
          "corpus-10k-int8 N64": (1, 32, 10_000, 300, 64, True), "corpus-10k-int8 N128": (1, 32, 10_000, 300, 128, True),
          "colbert-1q-200k-int8 N128": (1, 32, 200_000, 128, 128, True),
          "colpali-32q-10k-int8": (32, 32, 10_000, 1030, None, True)}
#: One query: the base kernel with rings of fewer slots (the stages of all three rings).
SPLIT_STAGES = (12, 9, 6)


def main() -> int:
    import cupy
    import torch

    import cupy_maxsim as cm
    from cupy_maxsim import _kernels

    original, original_stages = _kernels.source, _kernels.WGMMA_SPLIT_STAGES
    copy_tbps = bench_forward.measure_ceilings(torch)["copy_tbps"]
    print(f"# copy bandwidth {copy_tbps:.2f} TB/s")
    wanted = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
    for name in wanted:
        nq, lq, nd, ld, tile_rows, int8 = SHAPES[name]
        rng = cupy.random.default_rng(0)
        q = (rng.standard_normal((nq, lq, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        d = (rng.standard_normal((nd, ld, 128), dtype=cupy.float32) / 11).astype(cupy.float16)
        if int8:
            (q, q_scale), (d, d_scale) = cm.quantize_int8(q), cm.quantize_int8(d)
            score = lambda: cm.score(q, d, q_scale=q_scale, d_scale=d_scale)  # noqa: E731
        else:
            score = lambda: cm.score(q, d)  # noqa: E731
        docs_on_m = nq > 1 and _kernels.WGMMA_DOCS_ON_M  # the planner's choice for these shapes
        variants = [(label, patch, original_stages) for label, patch in (DOCS_ON_M_PATCHES if docs_on_m else PATCHES).items()]
        if int8 and not docs_on_m:
            variants += [(label, patch, original_stages) for label, patch in INT8_PATCHES.items()]
        if nq == 1:
            variants += [(label, patch, original_stages) for label, patch in ONE_QUERY_PATCHES.items()]
        if nq == 1 and tile_rows == 64:
            variants += [(f"base, {stages} stages", [], stages) for stages in SPLIT_STAGES]
        for label, patch, stages in variants:
            def patched(family, patch=patch):
                text = original(family)
                for old, new in patch:
                    if family == "maxsim_fwd_wgmma":
                        assert old in text, f"patch target gone: {old[:60]}"
                        text = text.replace(old, new)
                return text

            with bench_forward.planner_settings(recompile=True, source=patched, WGMMA_SPLIT_STAGES=stages,
                                                WGMMA_TILE_ROWS=tile_rows):
                ms = bench_forward._median_ms(torch, score, reps=20 if nq > 1 and nd < 1000 else 10)
            rate = f"  {d.nbytes / ms / 1e9:5.2f} TB/s" if nq == 1 else ""
            print(f"{name:<26} {label:<24} {ms:8.3f} ms{rate}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
