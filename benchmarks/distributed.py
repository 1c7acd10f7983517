#!/usr/bin/env python3
"""The Horovod-free path measured against the Horovod one: the same workload on two PyTorch stacks.

One run trains the recipes' ``cpu`` workload (the tiny model, 32x32 images, batch 16, one rank per
node) on the local Slurm cluster, on 1 and on 2 nodes, with

* ``pytorch/2.3.1-gpu`` (torch 2.3.1 with Horovod 0.28.1): the ``horovod`` and ``ddp`` backends;
* ``pytorch/2.14.1-gpu`` (torch 2.14.1, torch.distributed only): the ``ddp`` backend,

each configuration through ``hpcstack validate RECIPE --backend B --nodes 1,2`` (the stack's own
module, launcher, trainer and judge). Rounds alternate the configurations, in an order that
rotates each round, so that a machine whose load drifts during the run favours none of them. It
prints, per configuration, the median of the rounds and their spread (min-max) of the total img/s
on 1 and 2 nodes and of the 2-node scaling efficiency ``img/s(2) / (2 x img/s(1))`` (Horovod's
definition), and the machine's load average before and after. A benchmark measures; it passes or
fails nothing (a run that fails its sanity is reported and left out of the figures).

Run as root or as a user who may submit (``hpcstack validate`` submits as the site's
``slurm.submit_as``); the stacks' prefixes and module roots must be readable by the jobs' user::

    python3 benchmarks/distributed.py --rounds 5 \\
        --old-prefix /opt/hpcstack/software --old-module-root /opt/hpcstack/modulefiles \\
        --new-prefix /var/tmp/h-next/software --new-module-root /var/tmp/h-next/modulefiles

``--json FILE`` keeps every round's figures; ``--rounds 1 --configs 2.14.1-gpu:ddp`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

#: (recipe version, backend) pairs, in the order of the table.
CONFIGS = ("2.3.1-gpu:horovod", "2.3.1-gpu:ddp", "2.14.1-gpu:ddp")


@dataclass
class Round:
    """One configuration's figures in one round (img/s None where a run failed)."""

    config: str
    round: int
    img_s_1: float | None
    img_s_2: float | None
    ok: bool
    seconds: float

    @property
    def efficiency(self) -> float | None:
        """Scaling efficiency of 2 nodes against 1: ``img/s(2) / (2 * img/s(1))``."""
        if self.img_s_1 and self.img_s_2:
            return self.img_s_2 / (2 * self.img_s_1)
        return None


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="rounds (each runs every configuration once)")
    p.add_argument("--site", default="localhost", help="the site (its Slurm section and references)")
    p.add_argument("--old-prefix", default="/opt/hpcstack/software", help="install root of pytorch/2.3.1-gpu")
    p.add_argument("--old-module-root", default="/opt/hpcstack/modulefiles", help="module root of pytorch/2.3.1-gpu")
    p.add_argument("--new-prefix", default="/opt/hpcstack/software", help="install root of pytorch/2.14.1-gpu")
    p.add_argument("--new-module-root", default="/opt/hpcstack/modulefiles", help="module root of pytorch/2.14.1-gpu")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help="comma-separated VERSION:BACKEND of recipe pytorch/VERSION to run")
    p.add_argument("--hpcstack", default=shutil.which("hpcstack") or "hpcstack", help="the hpcstack command")
    p.add_argument("--output-root", default="/tmp",
                   help="where each run's hpcstack-validate output goes (visible to the jobs' user)")
    p.add_argument("--json", metavar="FILE", help="also write every round's figures as JSON")
    args = p.parse_args(argv)
    problems = []
    if args.rounds < 1:
        problems.append(f"--rounds: must be >= 1, got {args.rounds}")
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in args.configs:
        version, _, backend = c.partition(":")
        if not version or not backend:
            problems.append(f"--configs: {c!r}: expected VERSION:BACKEND, e.g. 2.14.1-gpu:ddp")
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    return args


def throughput(path: Path) -> float | None:
    """The ``throughput_total`` img/s of a trainer's JSON-lines output, None when it has none."""
    if not path.is_file():
        return None
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("record") == "throughput_total":
            return float(record["img_per_sec"])
    return None


def run_config(args, config: str, index: int, root: Path) -> Round:
    """Run one configuration (1 and 2 nodes) with ``hpcstack validate``; return its figures."""
    version, _, backend = config.partition(":")
    old = version == "2.3.1-gpu"
    prefix, modules = ((args.old_prefix, args.old_module_root) if old
                       else (args.new_prefix, args.new_module_root))
    out = root / f"r{index}-{version}-{backend}"
    cmd = [args.hpcstack, "validate", f"pytorch/{version}", "--site", args.site, "--prefix", prefix,
           "--module-root", modules, "--backend", backend, "--nodes", "1,2", "--output-dir", str(out)]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - start
    result = Round(config, index, throughput(out / "n1" / f"{backend}.jsonl"),
                   throughput(out / "n2" / f"{backend}.jsonl"), proc.returncode == 0, seconds)
    if not result.ok:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        print(f"    {config} round {index}: hpcstack validate exit {proc.returncode}: {' | '.join(tail)}",
              file=sys.stderr)
    return result


def spread(values: list[float], fmt: str) -> str:
    """``median (min-max)`` of the values, or ``-`` when there are none."""
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def table(results: list[Round], configs: list[str]) -> str:
    """The markdown table: per configuration, median and spread of img/s and efficiency."""
    lines = ["| stack | backend | rounds ok | img/s 1 node | img/s 2 nodes | scaling efficiency |",
             "|---|---|---|---|---|---|"]
    for config in configs:
        rows = [r for r in results if r.config == config]
        ok = [r for r in rows if r.img_s_1 and r.img_s_2]
        version, _, backend = config.partition(":")
        lines.append(f"| pytorch/{version} | {backend} | {len(ok)}/{len(rows)} "
                     f"| {spread([r.img_s_1 for r in ok], '.0f')} | {spread([r.img_s_2 for r in ok], '.0f')} "
                     f"| {spread([r.efficiency for r in ok], '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the rounds and print the table; 0 when every run produced its figures, else 1."""
    args = parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="hpcstack-bench-distributed-", dir=args.output_root))
    os.chmod(root, 0o755)   # the jobs' user writes the runs' own directories (validate makes them)
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
          f"{os.cpu_count()} cores; output in {root}")
    results: list[Round] = []
    for index in range(1, args.rounds + 1):
        shift = (index - 1) % len(args.configs)
        order = args.configs[shift:] + args.configs[:shift]
        for config in order:
            r = run_config(args, config, index, root)
            results.append(r)
            eff = f"{r.efficiency:.2f}" if r.efficiency else "-"
            print(f"round {index} {config}: 1 node {r.img_s_1 or 0:.0f} img/s, 2 nodes "
                  f"{r.img_s_2 or 0:.0f} img/s, efficiency {eff} ({r.seconds:.0f} s)", flush=True)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    print()
    print(table(results, args.configs))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "rounds": args.rounds, "load_before": load_before, "load_after": load_after,
            "results": [{**r.__dict__, "efficiency": r.efficiency} for r in results]}, indent=1) + "\n")
    return 0 if all(r.img_s_1 and r.img_s_2 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
