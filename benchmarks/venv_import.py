#!/usr/bin/env python3
"""File-system calls of ``import torch, horovod.torch`` in a user's venv extended for a stack,
against the stack's own python.

Three ways of running the import, each in a fresh ``bash`` with the module tool initialised and
the site's module root in use (no ``BASH_ENV``, no inherited module state):

- (a) ``stack``: ``module load MODULE``, then ``python``: the stack's own interpreter;
- (b) ``pythonpath``: a user's venv made with the stack's base Python, extended by
  ``extend-venv-activate`` as it was before the start-up file (the activation puts the venv's
  site-packages, then the module's, first on PYTHONPATH, ahead of the standard library), then
  ``source VENV/bin/activate`` and ``python``: the venv's;
- (c) ``startup-file``: the same venv extended by this checkout's ``extend-venv-activate``
  (rendered with :func:`hpcstack.modules.activate.render_extend_venv_activate` for MODULE, with
  the stack's python as its interpreter): the activation is the same, and the venv's
  ``00-hpcstack-venv.pth`` moves those PYTHONPATH entries after the standard library.

(b) is (c) with the start-up file removed: the activation blocks of both are the same bytes.

Each way runs once untraced (page cache warm, ``.pyc`` files of the venv written) and then
``--rounds`` times under ``strace -f -qq -e trace=%file`` (every call that names a file), rounds
alternating the ways. It counts the calls by name, and as ``install.py`` does: ``open``
(open/openat), ``stat`` (the stat family), ``readlink``; prints the median of each way, the ratios
to (a), and each way's ``sys.path``. Counts are the same from round to round within a few calls;
the load of the machine does not change them. Needs ``strace`` (apt-get install strace), the
stack installed with its modulefile, the module tool's bash init. Takes about a minute.

Usage:
    python3 benchmarks/venv_import.py [--stack /opt/hpcstack/software/pytorch/2.3.1-gpu]
        [--module pytorch/2.3.1-gpu] [--modulepath /opt/hpcstack/modulefiles]
        [--init /usr/share/modules/init/bash] [--work /var/tmp/venv-import-bench] [--rounds 5]
        [--json FILE] [--raw FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from install import IMPORT, OPEN_CALLS, READLINK_CALLS, STAT_CALLS, clean_env  # noqa: E402

WAYS = ("stack", "pythonpath", "startup-file")
LABELS = {"stack": "(a) stack's python", "pythonpath": "(b) venv, PYTHONPATH",
          "startup-file": "(c) venv, start-up file"}
PTH_NAME = "00-hpcstack-venv.pth"


def log(msg: str) -> None:
    print(f"[venv_import] {msg}", file=sys.stderr, flush=True)


def count(trace: Path) -> dict:
    """Count the calls of an ``strace -f`` log: by name, in total, and as open/stat/readlink."""
    by_name: collections.Counter = collections.Counter()
    for line in trace.read_text(errors="replace").splitlines():
        m = re.match(r"^(?:\[pid\s+)?\d*\]?\s*(\w+)\(", line)
        if m:
            by_name[m.group(1)] += 1
    out = {"file_calls": sum(by_name.values()),
           "open": sum(n for c, n in by_name.items() if c in OPEN_CALLS),
           "stat": sum(n for c, n in by_name.items() if c in STAT_CALLS),
           "readlink": sum(n for c, n in by_name.items() if c in READLINK_CALLS)}
    out["metadata"] = out["open"] + out["stat"] + out["readlink"]
    out["by_name"] = dict(by_name.most_common())
    return out


def preamble(init: str, modulepath: str) -> str:
    return (f"unset BASH_ENV\nsource {shlex.quote(init)} || exit 1\n"
            f"module use {shlex.quote(modulepath)}\ncd /\n")


def enter(way: str, module: str, venv: Path) -> str:
    """The lines that set the way up: load the module, or activate the venv (which loads it)."""
    if way == "stack":
        return f"module load {shlex.quote(module)} >/dev/null 2>&1 || exit 1\n"
    return f"source {shlex.quote(str(venv / 'bin' / 'activate'))} >/dev/null 2>&1 || exit 1\n"


def run_bash(script: str, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"failed ({proc.returncode}): {script}\n{proc.stderr[-2000:]}")
    return proc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", default="/opt/hpcstack/software/pytorch/2.3.1-gpu")
    parser.add_argument("--module", default="pytorch/2.3.1-gpu")
    parser.add_argument("--modulepath", default="/opt/hpcstack/modulefiles")
    parser.add_argument("--init", default="/usr/share/modules/init/bash",
                        help="the module tool's bash init script")
    parser.add_argument("--work", default="/var/tmp/venv-import-bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="FILE", help="write every round's counts and the medians")
    parser.add_argument("--raw", metavar="FILE", help="write the report as printed")
    args = parser.parse_args(argv)
    problems = []
    if not shutil.which("strace"):
        problems.append("strace is missing (apt-get install strace)")
    stack_python = Path(args.stack, "venv", "bin", "python")
    if not stack_python.exists():
        problems.append(f"--stack {args.stack}: no venv/bin/python")
    if not Path(args.init).is_file():
        problems.append(f"--init {args.init}: no such file")
    if args.rounds < 1:
        problems.append("--rounds must be at least 1")
    if problems:
        for p in problems:
            print(f"venv_import: error: {p}", file=sys.stderr)
        return 2

    from hpcstack.modules.activate import render_extend_venv_activate

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = clean_env(HOME=str(work), VIRTUAL_ENV_DISABLE_PROMPT="1")
    head = preamble(args.init, args.modulepath)
    # the user's venv, made as the module's help says: the module loaded, then `python -m venv`
    venv = work / "myvenv"
    run_bash(head + enter("stack", args.module, venv) + f"python -m venv {shlex.quote(str(venv))}\n", env)
    tool = work / "extend-venv-activate"
    tool.write_text(render_extend_venv_activate(args.module, {"bash": args.init}, str(stack_python)))
    tool.chmod(0o755)
    made = subprocess.run([str(tool), str(venv)], env=env, capture_output=True, text=True)
    if made.returncode != 0:
        raise RuntimeError(made.stderr)
    pth = next(venv.glob(f"lib/python*/site-packages/{PTH_NAME}"))
    pth_text = pth.read_text()
    log(f"stack {os.path.realpath(args.stack)}; venv {venv}; tool {tool}")

    def setup(way: str) -> None:
        if way == "pythonpath" and pth.exists():
            pth.unlink()
        elif way == "startup-file" and not pth.exists():
            pth.write_text(pth_text)

    paths = {}
    for way in WAYS:  # warm: page cache, the venv's .pyc files
        setup(way)
        out = run_bash(head + enter(way, args.module, venv) +
                       f"python -c {shlex.quote(IMPORT)}\npython -c 'import sys; print(sys.path)'\n", env)
        paths[way] = out.stdout.strip().splitlines()[-1]
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        order = WAYS if r % 2 == 0 else tuple(reversed(WAYS))
        for way in order:
            setup(way)
            trace = work / f"strace-{way}-{r + 1}.txt"
            run_bash(head + enter(way, args.module, venv) +
                     f"strace -f -qq -e trace=%file -o {shlex.quote(str(trace))} python -c {shlex.quote(IMPORT)}\n",
                     env)
            results[way].append(count(trace))
            log(f"round {r + 1} {way}: {results[way][-1]['file_calls']} file calls")
    setup("startup-file")

    keys = ("file_calls", "open", "stat", "readlink", "metadata")
    med = {way: {k: statistics.median(x[k] for x in results[way]) for k in keys} for way in WAYS}
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text)
        lines.append(text)

    say(f"import: python -c {IMPORT!r}; strace -f -e trace=%file; median of {args.rounds} rounds")
    say(f"machine: {platform.node()}, {os.cpu_count()} cores, {platform.platform()}, "
          f"load {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M %Z')}")
    say(f"stack: {args.stack} -> {os.path.realpath(args.stack)}; module {args.module} "
          f"({args.init})")
    say()
    say(f"{'':28}" + "".join(f"{LABELS[w]:>26}" for w in WAYS))
    names = {"file_calls": "file calls (%file)", "open": "  open/openat", "stat": "  stat family",
             "readlink": "  readlink", "metadata": "open + stat + readlink"}
    for k in keys:
        say(f"{names[k]:28}" + "".join(f"{med[w][k]:>26,.0f}" for w in WAYS))
    for k in ("file_calls", "metadata"):
        say(f"{names[k].strip() + ' / (a)':28}" +
              "".join(f"{med[w][k] / med['stack'][k]:>26.4f}" for w in WAYS))
    say()
    say("every round (file calls):")
    for way in WAYS:
        say(f"  {LABELS[way]:26} " + " ".join(str(x["file_calls"]) for x in results[way]))
    say()
    say("sys.path:")
    for way in WAYS:
        say(f"  {LABELS[way]:26} {paths[way]}")
    say()
    say(f"{pth.relative_to(venv)}:")
    say("  " + pth_text.rstrip("\n").replace("\n", "\n  "))
    if args.raw:
        Path(args.raw).write_text("\n".join(lines) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": results, "median": med, "sys_path": paths},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
