#!/usr/bin/env python3
"""Does the usage hook slow `module load`? ``module load pytorch/2.3.1-gpu`` with and without it.

For each module tool (Environment Modules with the hook as ``MODULES_SITECONFIG``; Lmod with it
as ``LMOD_PACKAGE_PATH``'s ``SitePackage.lua``), one bash session runs ``--runs`` rounds; each
round loads the installed stack's module once with the hook and once without (the order
alternating from round to round, so a noisy machine slows both alike), timing the ``module
load`` command with bash's ``$EPOCHREALTIME``, and purges after each. The hooks are the ones
``hpcstack module usage-hook install`` writes (:func:`hpcstack.lifecycle.usage.render_hooks`),
with their spool in a temporary directory of mode 1733; the stack's module root is
``--root``/modulefiles (Tcl, read by both tools), used read-only. It prints the median of each,
the ratio of the medians and the spread of the per-round ratios (:mod:`stats`), against the
target of 1.1x; it passes or fails nothing.

Usage:
    python3 benchmarks/usage_hook.py [--runs 40] [--root /opt/hpcstack] [--json FILE] [--raw FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stats import fmt, load_average, ratios, verdict  # noqa: E402

STACK = "pytorch/2.3.1-gpu"
BASE_MODULES = Path("/opt/hpcstack/base-modulefiles")
TOOLS = {  # tool -> (init script, the variable that turns the hook on, its value's file)
    "environment-modules": (Path("/usr/share/modules/init/bash"), "MODULES_SITECONFIG", "siteconfig.tcl"),
    "lmod": (Path("/usr/share/lmod/lmod/init/bash"), "LMOD_PACKAGE_PATH", None),
}
TARGET = 1.1


def measure(tool: str, hooks: Path, modulepath: str, runs: int) -> dict[str, list[float]]:
    """Seconds per ``module load`` of :data:`STACK`, ``{"off": [...], "on": [...]}``."""
    init, var, file = TOOLS[tool]
    value = str(hooks / file) if file else str(hooks)
    script = f"""
unset BASH_ENV
source {shlex.quote(str(init))}
export MODULEPATH={shlex.quote(modulepath)}
t() {{ local a=$EPOCHREALTIME; module load {STACK} >/dev/null 2>&1; local b=$EPOCHREALTIME
      echo "$1 $a $b"; module purge >/dev/null 2>&1; }}
for i in $(seq {runs}); do
  if (( i % 2 )); then unset {var}; t off; export {var}={shlex.quote(value)}; t on
  else export {var}={shlex.quote(value)}; t on; unset {var}; t off; fi
  unset {var}
done
"""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LC_ALL": "C.UTF-8",
           "USER": os.environ.get("USER", "root")}
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          env=env, timeout=1800, check=True)
    out: dict[str, list[float]] = {"off": [], "on": []}
    for line in proc.stdout.splitlines():
        which, a, b = line.split()
        out[which].append(float(b) - float(a))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--root", default="/opt/hpcstack", help="holds modulefiles/pytorch/2.3.1-gpu")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--raw", metavar="FILE", help="also write the output, as printed, to FILE")
    args = parser.parse_args(argv)
    lines: list[str] = []

    def out(text: str) -> None:
        print(text)
        lines.append(text)

    from hpcstack.lifecycle.usage import UsageConfig, render_hooks

    root = Path(args.root) / "modulefiles"
    if not (root / STACK).is_file():
        sys.stderr.write(f"no {root / STACK}: install the stack first (README)\n")
        return 2
    results = {}
    with tempfile.TemporaryDirectory(prefix="hpcstack-usage-bench-") as tmp:
        cfg = UsageConfig(tmp)
        cfg.spool.mkdir()
        os.chmod(tmp, 0o755)
        os.chmod(cfg.spool, 0o1733)
        hooks = Path(tmp) / "hooks"
        hooks.mkdir()
        for name, text in render_hooks(cfg, [str(root)], "benchmark").items():
            (hooks / name).write_text(text)
        out(f"module load {STACK}, {args.runs} interleaved rounds per tool, with and without the usage hook")
        out(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}; load {load_average()}")
        for tool, (init, _, _) in TOOLS.items():
            if not init.is_file():
                out(f"{tool}: not installed ({init} missing): left out")
                continue
            times = measure(tool, hooks, f"{root}:{BASE_MODULES}", args.runs)
            events = len(list(cfg.spool.iterdir()))
            for f in cfg.spool.iterdir():
                f.unlink()
            r = ratios(times["on"], times["off"])
            med_on, med_off = statistics.median(times["on"]), statistics.median(times["off"])
            ms = {k: [v * 1000 for v in times[k]] for k in times}
            out(f"{tool}: without {fmt(ms['off'], 'ms', 1)}; with {fmt(ms['on'], 'ms', 1)}; "
                  f"ratio of medians {med_on / med_off:.3f}; events written {events} of {args.runs}")
            out(f"  {verdict(r, TARGET, 'with/without')}")
            results[tool] = {"off": times["off"], "on": times["on"], "ratio_of_medians": med_on / med_off,
                             "events": events}
    if args.raw:
        Path(args.raw).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
