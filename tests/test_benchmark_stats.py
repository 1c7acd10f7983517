"""``benchmarks/stats.py`` and ``benchmarks/ab.py``: medians, spreads, verdicts, alternating rounds.

No timing is asserted: the commands timed are ``true`` and ``echo``; what is checked is the
order of the rounds, the lines printed, the raw file and the exit statuses.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

_spec = importlib.util.spec_from_file_location("benchmark_stats", REPO / "benchmarks" / "stats.py")
stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stats)

AB = [sys.executable, str(REPO / "benchmarks" / "ab.py")]


def test_summary_gives_the_median_the_extremes_and_the_quartiles():
    s = stats.summary([5, 1, 4, 2, 3])
    assert (s["n"], s["median"], s["min"], s["max"], s["q1"], s["q3"]) == (5, 3, 1, 5, 2, 4)
    assert stats.fmt([1, 2, 3, 4, 5], "x", 1) == "median 3.0x (min-max 1.0-5.0, IQR 2.0-4.0, n 5)"
    with pytest.raises(ValueError):
        stats.summary([])


@pytest.mark.parametrize("values, word, firmness", [
    ([1.0, 1.05, 1.1, 1.02, 1.08], "[HOLDS]", "every round on the same side"),
    ([1.3, 1.4, 1.35, 1.5, 1.32], "[MISSED]", "every round on the same side"),
    ([0.9, 1.0, 1.05, 1.08, 1.6], "[HOLDS]", "the middle half of the rounds on the same side"),
    ([0.9, 1.0, 1.2, 1.3, 1.05], "[HOLDS]", "unsettled"),
    ([1.0, 1.0, 1.0], "[TOO FEW ROUNDS]", "every round on the same side"),
])
def test_a_verdict_comes_from_the_median_ratio_and_says_how_firm_it_is(values, word, firmness):
    line = stats.verdict(values, 1.1, "A/B")
    assert line.startswith(word) and firmness in line, line
    assert f"n {len(values)})" in line


def test_ab_alternates_which_command_goes_first_and_keeps_its_report(tmp_path):
    raw = tmp_path / "raw.txt"
    log = tmp_path / "log.txt"
    proc = subprocess.run([*AB, "--rounds", "5", "--names", "one,two", "--target", "1.5", "--raw", str(raw),
                           "--log", str(log), "true", "echo hello"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    firsts = [line.split("(")[1].split(" ")[0] for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert firsts == ["one", "two", "one", "two", "one"]
    for needle in ("one  wall median", "two  wall median", "two/one per round: median", "n 5)",
                   "two/one <= 1.5x", "load averages after each round"):
        assert needle in proc.stdout, needle
    assert raw.read_text() == proc.stdout
    assert log.read_text().splitlines().count("hello") == 6  # its output: one warm-up and 5 rounds


@pytest.mark.parametrize("args, message", [
    (["a", "b", "c"], "3 commands given"),
    (["--rounds", "0", "true"], "--rounds must be at least 1"),
    (["--names", "x", "true", "true"], "--names gives 1 names for 2 commands"),
    (["--target", "1.1", "true"], "--target needs two commands"),
])
def test_ab_refuses_bad_arguments_with_one_line_each_and_status_2(args, message):
    proc = subprocess.run([*AB, *args], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_ab_stops_at_a_command_that_fails():
    proc = subprocess.run([*AB, "--warmup", "0", "true", "echo broken; exit 3"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "B exited 3 in round 1" in proc.stderr and "broken" in proc.stderr
