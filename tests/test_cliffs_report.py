"""The cliff sweep's report (bench/cliffs.py): which cells it names below issue 24's lines, and
runs from several device calls merged into one. No GPU: synthetic cells."""

import json

from bench import cliffs


def _cell(dtype, dim, nq, ms, floor_ms, peers=None):
    providers = {"cupy_maxsim": {"ms": ms, "fraction_of_floor": floor_ms / ms}}
    row = {"dtype": dtype, "dim": dim, "nq": nq, "lq": 32, "nd": 1000, "ld": 300, "floor_ms": floor_ms,
           "bound": "bytes" if nq == 1 else "flops", "providers": providers}
    for name, peer_ms in (peers or {}).items():
        providers[name] = {"ms": peer_ms}
    if peers:
        row["best_peer"] = min(peers, key=peers.get)
        row["speedup_vs_best_peer"] = peers[row["best_peer"]] / ms
    return row


def test_below_lines_names_each_missed_line():
    results = [
        _cell("float16", 128, 1, 1.0, 0.9),  # 0.90 of the floor: above the memory line
        _cell("float16", 256, 1, 1.0, 0.8),  # 0.80: below it
        _cell("bfloat16", 768, 32, 1.0, 0.5, {"naive_torch": 0.9}),  # 0.50 of the rate, and a peer faster
        _cell("int8", 768, 32, 1.0, 0.55),  # 0.55: above int8's 0.50
        _cell("float16", 64, 32, 1.0, 0.3),  # below dim 128: held to the fold's rate, not listed
        _cell("float32", 768, 32, 2.5, 0.5),  # 2.5x our bf16 on the same cell
        {"dtype": "int8", "dim": 96, "nq": 1, "providers": {"cupy_maxsim": {"error": "RuntimeError: boom"}}},
    ]
    misses = cliffs.below_lines(results)
    assert misses == [
        "float16 dim 256 1q: 0.80 of the floor (line 0.85)",
        "bfloat16 dim 768 32q: 0.50 of the matrix rate (line 0.6)",
        "bfloat16 dim 768 32q: 0.90x naive_torch (1.000 against 0.900 ms)",
        "float32 dim 768 32q: 0.40 of our bf16 speed (line 0.5)",
        "int8 dim 96 1q: no result (RuntimeError: boom)",
    ]


def test_merge_joins_runs_a_later_cell_replacing_an_earlier(tmp_path, capsys):
    first = {"provenance": {"commit": "aaa"}, "ceilings": {"copy_tbps": 4.3},
             "results": [_cell("float16", 128, 1, 2.0, 0.9), _cell("float16", 256, 1, 1.0, 0.9)]}
    second = {"provenance": {"commit": "bbb"}, "ceilings": {"copy_tbps": 4.2},
              "results": [_cell("float16", 128, 1, 1.0, 0.9), _cell("int8", 128, 32, 1.0, 0.7)]}
    paths = []
    for name, run in (("a.json", first), ("b.json", second)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(run))
    assert cliffs.main(["--merge", *map(str, paths), "--out", str(tmp_path / "out")]) == 0
    merged, = (tmp_path / "out").glob("cliffs-*-aaa-bbb-merged.json")
    report = json.loads(merged.read_text())
    cells = {(r["dtype"], r["dim"], r["nq"]): r for r in report["results"]}
    assert sorted(cells) == [("float16", 128, 1), ("float16", 256, 1), ("int8", 128, 32)]
    assert cells[("float16", 128, 1)]["providers"]["cupy_maxsim"]["ms"] == 1.0  # the later run's
    assert report["below_lines"] == []
    assert "cells below the lines: 0 of 3 (0 lines missed)" in capsys.readouterr().out


def test_report_counts_cells_not_missed_lines(tmp_path, capsys):
    """A cell under two lines (its floor and a peer) counts once among the cells below."""
    results = [_cell("float16", 256, 1, 1.0, 0.8, {"flash_maxsim": 0.9}),  # two lines missed
               _cell("float16", 128, 1, 1.0, 0.9)]
    cliffs.report(results, tmp_path / "run", {}, {}, {})
    assert "cells below the lines: 1 of 2 (2 lines missed)" in capsys.readouterr().out
