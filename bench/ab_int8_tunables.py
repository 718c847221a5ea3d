"""The int8 one-query forward under other tunables, on one corpus, rounds interleaved: the
planner's choice beside 64-row tiles, fewer or more ring slots when splitting documents, and
full query rows (no half-row fold); each against the bytes floor (tokens and scales at the copy
rate measured in the run). Issue 25's int8 line needs this forward at about 0.99 of the floor.

    python bench/ab_int8_tunables.py [--docs 1000000] [--rounds 7] [--out DIR]

Writes int8-tunables-<date>-<commit>.json; prints a table last.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab_int8_layouts import corpus_arguments  # noqa: E402
from accept_search import interleaved, unit_corpus  # noqa: E402
from bench_forward import measure_ceilings, write_record  # noqa: E402

#: name -> tuning.override(**changes)
VARIANTS = {
    "planner": {},
    "64-row tiles": {"wgmma_tile_rows": 64},
    "18 split slots": {"wgmma_split_stages": 18},
    "24 split slots": {"wgmma_split_stages": 24},
    "full query rows": {"wgmma_half_rows": False},
}


def main() -> None:
    options = corpus_arguments(__doc__).parse_args()

    import cupy
    import torch

    import cupy_maxsim as cm
    from cupy_maxsim import tuning

    ceilings = measure_ceilings(torch)
    d16 = unit_corpus(cupy, (options.docs, options.tokens, 128), 0)
    d8, d_scale = cm.quantize_int8(d16)
    del d16
    cupy.get_default_memory_pool().free_all_blocks()
    q8, q_scale = cm.quantize_int8(unit_corpus(cupy, (1, 32, 128), 1))
    reference = cm.score(q8, d8, q_scale=q_scale, d_scale=d_scale)

    def call(changes):
        def run():
            with tuning.override(**changes):
                return cm.score(q8, d8, q_scale=q_scale, d_scale=d_scale)
        return run

    cells, errors = {}, {}
    for name, changes in VARIANTS.items():
        try:  # each variant's answer is the planner's, bit for bit
            same = bool(cupy.array_equal(call(changes)(), reference))
            cells[name] = call(changes)
            errors[name] = None if same else "differs from the planner's scores"
        except Exception as error:  # noqa: BLE001 - a variant that does not exist is a result
            errors[name] = f"{type(error).__name__}: {str(error)[:160]}"
    times = interleaved(cupy, cells, options.rounds, 5)
    nbytes = d8.nbytes + d_scale.nbytes
    floor_ms = nbytes / ceilings["copy_tbps"] / 1e9
    results = {name: {"ms": times.get(name), "x_floor": times[name] / floor_ms if name in times else None,
                      "changes": VARIANTS[name], "error": errors[name]} for name in VARIANTS}
    path = write_record(options.out, "int8-tunables", {"ceilings": ceilings, "docs": options.docs,
                                                       "tokens": options.tokens, "floor_ms": floor_ms,
                                                       "results": results})
    print(f"{'variant':<20} {'ms':>7} {'x floor':>7}  (floor {floor_ms:.3f} ms)")
    for name, row in results.items():
        if row["ms"] is None:
            print(f"{name:<20} {row['error']}")
        else:
            print(f"{name:<20} {row['ms']:7.3f} {row['x_floor']:7.3f}  {row['error'] or ''}")
    print(path)


if __name__ == "__main__":
    main()
