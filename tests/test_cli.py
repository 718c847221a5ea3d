"""The command line runs end to end on the CPU backend."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args):
    return subprocess.run([sys.executable, "-m", "cupy_maxsim", *args], cwd=ROOT, capture_output=True, text=True)


def test_info():
    result = run("info")
    assert result.returncode == 0, result.stderr
    assert "kernels_cu" in result.stdout


def test_demo_on_cpu_ranks_the_planted_pages():
    result = run("demo", "--cpu", "--docs", "40")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "planted page ranked first for 8/8 queries" in result.stdout


def test_bench_takes_its_documented_options():
    """`bench --shapes ... --dtype ...` reaches bench/bench_forward.py (argparse once refused
    them); without CuPy, torch or a GPU it says what it needs instead of a traceback."""
    result = run("bench", "--shapes", "rerank-1k", "--dtype", "bfloat16")
    assert "unrecognized arguments" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    if result.returncode != 0:
        assert "needs" in result.stdout, result.stdout


def test_bench_on_the_cpu():
    """`bench --cpu` measures the NumPy backend on any machine (a table row a shape)."""
    result = run("bench", "--cpu", "--small", "--rounds", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| 1x32 vs 200x64x128 float32 |" in result.stdout and "| 4x32 vs 100x64x128 float16 |" in result.stdout


def test_unknown_options_are_refused_outside_bench():
    result = run("info", "--bogus")
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr


def test_compile_without_nvrtc_says_so_once(monkeypatch, capsys):
    from cupy_maxsim import __main__ as cli
    from cupy_maxsim._gpu import nvrtc

    def missing():
        raise RuntimeError("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12")

    monkeypatch.setattr(nvrtc, "_find_nvrtc", missing)
    assert cli.main(["compile", "--arch", "sm_80"]) == 1
    assert capsys.readouterr().out.count("NVRTC not found") == 1
