#!/usr/bin/env python3
"""How long does `module load pytorch/2.3.1-gpu` take, under each module tool?

For each tool and modulefile syntax it reads, one bash session loads, in turn and interleaved
(so a noisy machine slows all alike), then purges:

  - the installed stack's module ``pytorch/2.3.1-gpu`` (which ``depends-on`` the base python
    module, so this is what a user's ``module load`` costs);
  - a trivial modulefile (one ``setenv``);
  - the trivial modulefile with a ``depends-on python`` (the dependency's share of the stack's
    figure): what the stack is held to, ``module load`` <= 1.1x this;
  - the same in a directory with a default-version file (``.version`` for Tcl,
    ``.modulerc.lua`` for Lua), as ``hpcstack`` writes beside the stack's modulefile: that
    file's share (Environment Modules evaluates it on every load from the directory);

and prints the median wall time of each over ``--runs`` rounds (bash's ``$EPOCHREALTIME`` around
the ``module load`` command), the ratios of the medians, and for the target (the stack against
the trivial modulefile with the same ``depends-on``) the ratio of every round with its spread
(min-max, IQR: :mod:`stats`), so a verdict says whether the rounds straddle the target. Tools and syntaxes: Environment Modules with the install's Tcl
modulefile; Lmod with the Lua modulefile a localhost-lmod install writes (rendered into a
temporary root for the same prefix; the stack is only read); Lmod with the Tcl modulefile.
It measures; it passes or fails nothing. A tool that is missing is left out, with the reason.

Usage:
    python3 benchmarks/module_load.py [--runs 20] [--root /opt/hpcstack] [--json FILE] [--raw FILE]

``--root`` holds ``software/pytorch/2.3.1-gpu`` and ``modulefiles/`` (default: the e2e tests'
``$HPCSTACK_E2E_ROOT`` or /var/tmp/hpcstack-e2e if a stack is there, else /opt/hpcstack); the
base python module is taken from /opt/hpcstack/base-modulefiles (scripts/localhost-setup).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stats import fmt, verdict  # noqa: E402

STACK = "pytorch/2.3.1-gpu"
BASE_MODULES = Path("/opt/hpcstack/base-modulefiles")
TOOLS = {  # tool -> its bash init script
    "environment-modules": Path("/usr/share/modules/init/bash"),
    "lmod": Path("/usr/share/lmod/lmod/init/bash"),
}
CASES = [("environment-modules", "tcl"), ("lmod", "lua"), ("lmod", "tcl")]
MODULES = {"stack": STACK, "trivial": "trivial/1.0", "trivial+depends-on": "trivialdep/1.0",
           "trivial+depends-on+default": "trivialdef/1.0"}
#: the target: the stack's load against a trivial modulefile with the same depends-on
TARGET = 1.1


def find_root(given: str | None) -> Path:
    """The directory holding ``software/pytorch/2.3.1-gpu`` and its ``modulefiles``."""
    candidates = [Path(given)] if given else [
        Path(os.environ.get("HPCSTACK_E2E_ROOT", "/var/tmp/hpcstack-e2e")), Path("/opt/hpcstack")]
    for top in candidates:
        if (top / "modulefiles" / "pytorch" / "2.3.1-gpu").is_file():
            return top
    sys.exit(f"module_load: no installed {STACK} (modulefile) under {' or '.join(map(str, candidates))}")


def write_tree(tmp: Path, syntax: str, top: Path) -> Path:
    """A module root with the trivial modulefiles, and the stack's Lua modulefile for ``lua``."""
    root = tmp / f"mf-{syntax}"
    for name, dep in (("trivial", ""), ("trivialdep", "python"), ("trivialdef", "python")):
        d = root / name
        d.mkdir(parents=True)
        if syntax == "lua":
            (d / "1.0.lua").write_text((f'depends_on("{dep}")\n' if dep else "")
                                       + 'setenv("HPCSTACK_BENCH_TRIVIAL", "1")\n')
            if name == "trivialdef":
                (d / ".modulerc.lua").write_text('module_version("trivialdef/1.0", "default")\n')
        else:
            (d / "1.0").write_text("#%Module1.0\n" + (f"depends-on {dep}\n" if dep else "")
                                   + "setenv HPCSTACK_BENCH_TRIVIAL 1\n")
            if name == "trivialdef":
                (d / ".version").write_text("#%Module1.0\nset ModulesVersion {1.0}\n")
    if syntax == "lua":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from hpcstack.install.components.modulefile import render_for_prefix
        from hpcstack.recipe import load_recipe
        from hpcstack.site import load_site

        prefix = top / "software" / "pytorch" / "2.3.1-gpu"
        version = next((prefix / "venv" / "lib").glob("python3.*")).name[len("python"):]
        site = load_site("localhost-lmod", install_root=str(top / "software"))
        text = render_for_prefix(site, load_recipe(STACK, site), str(prefix), version, "lua")
        (root / "pytorch").mkdir()
        (root / "pytorch" / "2.3.1-gpu.lua").write_text(text)
        # the default-version file an install writes beside it (modulerc.lua.j2)
        (root / "pytorch" / ".modulerc.lua").write_text('module_version("pytorch/2.3.1-gpu", "default")\n')
    return root


def measure(tool: str, modulepath: list[Path], runs: int) -> dict[str, list[float]]:
    """``module load`` wall times (ms) of each of :data:`MODULES` in one bash session, one per
    round, in round order (each round loads every module once, in turn)."""
    body = [f"source {shlex.quote(str(TOOLS[tool]))}",
            f"export MODULEPATH={shlex.quote(':'.join(map(str, modulepath)))}",
            f"module load {STACK} && [ -n \"$HPCSTACK_PYTORCH_ROOT\" ] || exit 3",
            "module purge",
            f"for i in $(seq {runs}); do"]
    for key, mod in MODULES.items():
        body.append(f"  t0=$EPOCHREALTIME; module load {mod}; t1=$EPOCHREALTIME; module purge; "
                    f"echo \"{key} $t0 $t1\"")
    body.append("done")
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(body)],
                          env={"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir(), "LC_ALL": "C.UTF-8"},
                          capture_output=True, text=True, timeout=60 + 10 * runs)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool}: the benchmark's shell failed: {proc.stderr.strip()[-500:]}")
    out = {}
    for key in MODULES:
        times = [float(b) - float(a) for a, b in re.findall(rf"^{re.escape(key)} ([0-9.]+) ([0-9.]+)$",
                                                            proc.stdout, re.M)]
        out[key] = [round(1000 * t, 2) for t in times]
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure every tool and syntax found, print the table and verdicts (also to ``--raw``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds; the median is reported (default 20)")
    parser.add_argument("--root", help="directory with software/ and modulefiles/ of the installed stack")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--raw", metavar="FILE", help="also write the printed report to FILE")
    args = parser.parse_args(argv)
    top = find_root(args.root)
    results, skipped = [], []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for tool, syntax in CASES:
            if not TOOLS[tool].is_file():
                skipped.append(f"{tool}: not installed ({TOOLS[tool]} missing)")
                continue
            trees = write_tree(Path(tmp) / tool, syntax, top)
            stack_root = trees if syntax == "lua" else top / "modulefiles"
            path = [trees, stack_root, BASE_MODULES] if syntax == "tcl" else [trees, BASE_MODULES]
            rounds = measure(tool, path, args.runs)
            medians = {k: round(statistics.median(v), 1) for k, v in rounds.items()}
            results.append({"tool": tool, "syntax": syntax, **medians, "rounds": rounds})
    load_after = os.getloadavg()
    lines = [f"module load, median of {args.runs} interleaved runs (ms); stack {top}/software/{STACK}; "
             f"{platform.node()}, {os.cpu_count()} cores, load average {load_before[0]:.1f} before, "
             f"{load_after[0]:.1f} after (1 min)",
             f"{'tool':<22}{'syntax':<8}{'stack':>8}{'trivial':>9}{'+dep':>8}{'+dep+default':>14}"
             f"{'stack/trivial':>15}{'stack/+dep':>12}"]
    for r in results:
        lines.append(f"{r['tool']:<22}{r['syntax']:<8}{r['stack']:>8.1f}{r['trivial']:>9.1f}"
                     f"{r['trivial+depends-on']:>8.1f}{r['trivial+depends-on+default']:>14.1f}"
                     f"{r['stack'] / r['trivial']:>15.2f}{r['stack'] / r['trivial+depends-on']:>12.2f}")
    lines.append("spread of each (ms), and of the ratio stack / +dep of each round:")
    for r in results:
        rounds = r["rounds"]
        lines.append(f"  {r['tool']} {r['syntax']}: stack {fmt(rounds['stack'], 'ms', 1)}")
        lines.append(f"  {r['tool']} {r['syntax']}: +dep  {fmt(rounds['trivial+depends-on'], 'ms', 1)}")
        per = [s / d for s, d in zip(rounds["stack"], rounds["trivial+depends-on"])]
        r["ratio_rounds"] = [round(x, 3) for x in per]
        lines.append(f"  {r['tool']} {r['syntax']}: stack/+dep per round {fmt(per, 'x')}")
    for r in results:
        lines.append(verdict(r["ratio_rounds"], TARGET, f"{r['tool']} {r['syntax']}: module load {STACK} "
                             f"/ a trivial modulefile with the same depends-on (per round)"))
    for line in skipped:
        lines.append(f"left out: {line}")
    print("\n".join(lines))
    if args.raw:
        Path(args.raw).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": args.runs, "load_average": load_before[0],
                                               "results": results, "skipped": skipped}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
