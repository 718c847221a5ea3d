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
