"""benchmarks/distributed.py without a cluster: its help, bad command lines (one line each, exit
2) and the table of medians and spreads it prints."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "distributed.py"

pytestmark = pytest.mark.unit


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def load():
    spec = importlib.util.spec_from_file_location("bench_distributed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module    # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_help_names_the_stacks_options():
    proc = run("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--rounds", "--old-prefix", "--old-module-root", "--new-prefix", "--new-module-root", "--configs"):
        assert option in proc.stdout


def test_bad_command_lines_give_one_line_each_and_exit_2():
    proc = run("--rounds", "0", "--configs", "2.14.1-gpu")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: --rounds: must be >= 1, got 0",
        "error: --configs: '2.14.1-gpu': expected VERSION:BACKEND, e.g. 2.14.1-gpu:ddp"]


def test_table_gives_median_spread_and_efficiency():
    m = load()
    rounds = [m.Round("2.14.1-gpu:ddp", i, one, two, True, 10.0)
              for i, (one, two) in enumerate([(1000, 1600), (900, 1800), (1100, 1100)], 1)]
    rounds.append(m.Round("2.14.1-gpu:ddp", 4, None, 1500, False, 5.0))   # a failed run: left out
    row = m.table(rounds, ["2.14.1-gpu:ddp"]).splitlines()[2]
    assert row == "| pytorch/2.14.1-gpu | ddp | 3/4 | 1000 (900-1100) | 1600 (1100-1800) | 0.80 (0.50-1.00) |"
