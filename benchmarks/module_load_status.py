#!/usr/bin/env python3
"""Time ``module load`` of a stack's modulefile with and without the status-file check.

Writes the same modulefile twice into a temporary module root (``status_file`` set, and not),
with a status file naming the stack FAILED (the check's worst case: the file found, read,
searched, a line printed), then runs ``module load`` of each N times in one bash per tool (the
real `module` command: Environment Modules and Lmod where installed, as tests/moduletools.py
finds them) and prints the median per load and the ratio (issue 47 wants at most 1.1x).
It measures; it does not pass or fail.

Usage: PYTHONPATH=. python benchmarks/module_load_status.py [--loads N]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from moduletools import TOOLS  # noqa: E402

from hpcstack.modules.writer import ModuleContext, render_modulefile, root_variable  # noqa: E402
from hpcstack.validate.statusfile import render  # noqa: E402


def context(status_file: str) -> ModuleContext:
    prefix = "/sw/pytorch/2.3.1-gpu"
    return ModuleContext(name="pytorch", version="2.3.1-gpu", whatis="PyTorch", help_lines=["h"], prefix=prefix,
                         root_variable=root_variable("pytorch"), depends_on=[], path_prepend=[f"{prefix}/bin"],
                         pythonpath_prepend=[f"{prefix}/venv/lib/python3.12/site-packages"], status_file=status_file)


def time_loads(tool, root: Path, module: str, loads: int) -> list[float]:
    script = (f"for i in $(seq {loads}); do s=$(date +%s%N); module load {module} 2>/dev/null; "
              f"e=$(date +%s%N); module unload {module} 2>/dev/null; echo T $(( (e - s) / 1000 )); done")
    p = tool.bash(script, modulepath=str(root), timeout=600)
    return [int(x) / 1000.0 for x in re.findall(r"^T (\d+)$", p.stdout, re.M)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", type=int, default=40)
    args = ap.parse_args()
    for tool in TOOLS:
        why = tool.missing()
        if why:
            print(f"{tool.name}: skipped ({why})")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            status = root / ".hpcstack-status.json"
            status.write_text(render({"with/1": "FAILED since 2026-11-29"}, "2026-11-30T00:00:00+00:00"))
            ext = ".lua" if tool.syntax == "lua" else ""
            for name, sf in (("without", ""), ("with", str(status))):
                (root / name).mkdir()
                (root / name / f"1{ext}").write_text(
                    render_modulefile(context(sf), tool.syntax).replace("pytorch/2.3.1-gpu", f"{name}/1"))
            time_loads(tool, root, "without/1", 3)                     # warm the caches
            a, b = [], []
            for _ in range(4):                                         # interleaved rounds
                a += time_loads(tool, root, "without/1", args.loads // 4)
                b += time_loads(tool, root, "with/1", args.loads // 4)
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"{tool.name}: module load without the check {ma:.1f} ms, with {mb:.1f} ms "
                  f"(median of {len(a)} and {len(b)}), ratio {mb / ma:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
