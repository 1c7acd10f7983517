#!/usr/bin/env python3
"""Do the fault tests hold on a loaded machine? They must: no test may depend on timing.

Runs ``tests/test_faults.py`` (the kills and interrupts of an install, each aimed with a failpoint
that holds the install at a known moment) ``--rounds`` times with the installed tool's pytest,
while ``--busy`` busy loops per core (plain Python ``while True``, each in its own process, at
normal priority) keep every core loaded, then once more without the load for comparison. Prints,
per round, the load average seen, the tests passed and failed and the wall time; then the
totals. It measures; a failed round is printed and counted, and the exit status is 1 if any
round failed (so CI or an admin can run it as a check).

Usage:
    sudo python3 benchmarks/faults_under_load.py [--rounds 2] [--busy 2] [-k EXPR] [--raw FILE]

Needs what the fault tests need (root, the localhost prerequisites of scripts/localhost-setup,
hpcstack installed in /opt/hpcstack/tool: ``scripts/run-tests --quick`` puts it there).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTEST = Path("/opt/hpcstack/tool/bin/pytest")


def _spin() -> None:
    while True:
        pass


def run_round(pytest_args: list[str]) -> tuple[int, int, float, str]:
    """One pytest run of the fault tests: (passed, failed, seconds, summary line)."""
    start = time.monotonic()
    proc = subprocess.run([str(PYTEST), "-q", "-p", "no:cacheprovider", "tests/test_faults.py", *pytest_args],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "HPCSTACK_TEST_INSTALLED": "1"})
    seconds = time.monotonic() - start
    lines = [l for l in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", l)]
    summary = lines[-1] if lines else proc.stdout[-500:] + proc.stderr[-500:]
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", summary)) else 0
    failed = int(m.group(1)) if (m := re.search(r"(\d+) (failed|error)", summary)) else 0
    if proc.returncode and not failed:
        failed = 1
    return passed, failed, seconds, summary.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="loaded rounds (default 2)")
    parser.add_argument("--busy", type=int, default=2, help="busy loops per core (default 2)")
    parser.add_argument("-k", default=None, help="pytest -k expression (default: every fault test)")
    parser.add_argument("--raw", type=Path, help="also write the output to this file")
    args = parser.parse_args(argv)
    if not PYTEST.exists():
        print(f"error: {PYTEST} missing: run scripts/run-tests --quick first", file=sys.stderr)
        return 2
    extra = ["-k", args.k] if args.k else []
    out: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        out.append(line)

    cores = os.cpu_count() or 1
    say(f"# benchmarks/faults_under_load.py: {cores} cores, {args.busy} busy loops per core, "
        f"{args.rounds} loaded rounds; {time.strftime('%Y-%m-%d %H:%M')}")
    failed_rounds = 0
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores * args.busy)]
    for p in spinners:
        p.start()
    try:
        time.sleep(5)  # let the load average rise before the first round (it only reports)
        for n in range(1, args.rounds + 1):
            passed, failed, seconds, summary = run_round(extra)
            failed_rounds += bool(failed)
            say(f"loaded round {n}: load {os.getloadavg()[0]:.1f}, {passed} passed, {failed} failed, "
                f"{seconds:.0f} s  ({summary})")
    finally:
        for p in spinners:
            p.kill()
    passed, failed, seconds, summary = run_round(extra)
    failed_rounds += bool(failed)
    say(f"unloaded round: load {os.getloadavg()[0]:.1f}, {passed} passed, {failed} failed, {seconds:.0f} s  ({summary})")
    say(f"rounds failed: {failed_rounds} of {args.rounds + 1}")
    if args.raw:
        args.raw.write_text("\n".join(out) + "\n")
    return 1 if failed_rounds else 0


if __name__ == "__main__":
    sys.exit(main())
