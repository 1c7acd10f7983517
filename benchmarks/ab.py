#!/usr/bin/env python3
"""Time one command, or two against each other, in alternating rounds; print medians and spreads.

Each command runs under ``bash -c`` with its output kept out of the way (in ``--log`` if given).
With two commands A and B every round runs both, alternating which goes first (round 1 A then B,
round 2 B then A, ...), so that a load that rises or falls during the run, a warmer page cache or
the other's dirty pages weigh on both alike. It prints every round (wall seconds of each, the
ratio B/A and the load averages), then for each command the median wall and CPU seconds with
their spread (min-max and IQR), the ratio B/A of the rounds with its spread (of wall time and of
CPU time: the CPU seconds of a command and its children move less with the load), and with
``--target`` a verdict on ``B/A <= target`` that says whether the rounds straddle the target.

It measures; its exit status is 0 whenever every run of both commands exited 0 (1 otherwise,
with the failing command's last output lines; 2 for bad arguments).

Usage:
    python3 benchmarks/ab.py [--rounds 5] [--warmup 1] [--names A,B] [--target 1.1]
                             [--raw FILE] [--log FILE] CMD_A [CMD_B]

Example (docs/benchmarks.md): the stack's imports with a normal exit against ``os._exit``::

    python3 benchmarks/ab.py --names exit,os._exit \\
        "$PY -c 'import torch, torchvision'" "$PY -c 'import os, torch, torchvision; os._exit(0)'"
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stats import MIN_ROUNDS, fmt, load_average, ratios, summary, verdict  # noqa: E402


def timed(command: str, log) -> tuple[float, float, int, str]:
    """Run ``command`` with ``bash -c``; return (wall s, CPU s of it and its children, exit status,
    the last 2,000 characters of its output)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if log:
        log.write(f"$ {command}\n{proc.stdout}[exit {proc.returncode}, {wall:.3f} s]\n")
    return wall, cpu, proc.returncode, proc.stdout[-2000:]


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the rounds, print the report (and write it to ``--raw``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("commands", nargs="+", metavar="CMD", help="one command (timed alone) or two (A and B)")
    p.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="timed rounds (default %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each command first (default %(default)s)")
    p.add_argument("--names", help="short names of the commands, comma-separated (default A,B)")
    p.add_argument("--target", type=float, help="print a verdict on B/A <= TARGET")
    p.add_argument("--raw", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--log", metavar="FILE", help="append every run's output to FILE")
    args = p.parse_args(argv)
    problems = []
    if len(args.commands) > 2:
        problems.append(f"ab: {len(args.commands)} commands given; one or two")
    if args.rounds < 1:
        problems.append("ab: --rounds must be at least 1")
    if args.warmup < 0:
        problems.append("ab: --warmup must be 0 or more")
    names = args.names.split(",") if args.names else ["A", "B"][:len(args.commands)]
    if len(names) != len(args.commands):
        problems.append(f"ab: --names gives {len(names)} names for {len(args.commands)} commands")
    if args.target is not None and len(args.commands) != 2:
        problems.append("ab: --target needs two commands")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2

    lines: list[str] = []

    def out(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    log = open(args.log, "a") if args.log else None
    try:
        cmds = list(zip(names, args.commands))
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        order = "alternating which goes first" if len(cmds) == 2 else "one command"
        out(f"ab: {args.rounds} rounds, {order}, {args.warmup} untimed warm-up run(s) each; "
            f"{platform.node()}, {os.cpu_count()} cores; {when}; load before {load_average()}")
        for name, cmd in cmds:
            out(f"  {name}: {cmd}")
        for _ in range(args.warmup):
            for name, cmd in cmds:
                _, _, rc, tail = timed(cmd, log)
                if rc != 0:
                    print(f"ab: {name} exited {rc} (warm-up):\n{tail}", file=sys.stderr)
                    return 1
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        loads = []
        for i in range(args.rounds):
            round_cmds = cmds if i % 2 == 0 else cmds[::-1]
            for name, cmd in round_cmds:
                w, c, rc, tail = timed(cmd, log)
                if rc != 0:
                    print(f"ab: {name} exited {rc} in round {i + 1}:\n{tail}", file=sys.stderr)
                    return 1
                wall[name].append(w)
                cpu[name].append(c)
            loads.append(load_average())
            per = ", ".join(f"{n} {wall[n][-1]:.3f} s" for n in names)
            ratio = f", {names[1]}/{names[0]} {wall[names[1]][-1] / wall[names[0]][-1]:.2f}" if len(names) == 2 else ""
            out(f"round {i + 1} ({round_cmds[0][0]} first): {per}{ratio}; load {loads[-1]}")
        out("")
        width = max(len(n) for n in names)
        for n in names:
            out(f"{n:<{width}}  wall {fmt(wall[n], 's', 3)}")
            out(f"{'':<{width}}  cpu  {fmt(cpu[n], 's', 3)}")
        if len(names) == 2:
            a, b = names
            r = ratios(wall[a], wall[b])
            out(f"{b}/{a} per round: {fmt(r, 'x')}")
            out(f"{b}/{a} of the medians: {summary(wall[b])['median'] / summary(wall[a])['median']:.2f}x")
            if all(cpu[a]):
                out(f"{b}/{a} CPU seconds per round: {fmt(ratios(cpu[a], cpu[b]), 'x')} "
                    "(steadier than wall time on a loaded machine)")
            if args.target is not None:
                out(verdict(r, args.target, f"{b}/{a}"))
        out(f"load averages after each round: {'; '.join(loads)}")
    finally:
        if log:
            log.close()
    if args.raw:
        Path(args.raw).parent.mkdir(parents=True, exist_ok=True)
        Path(args.raw).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
