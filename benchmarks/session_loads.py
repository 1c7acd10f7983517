#!/usr/bin/env python3
"""How many times a command loads its site and its recipe, and how many Python function calls
the path from ``hpcstack.cli.main`` to its first build step makes (docs/benchmarks.md, "One
session per command").

Runs, in this process, with a profile hook (:func:`sys.setprofile`) that counts every Python
function call:

* ``hpcstack install RECIPE --site SITE --prefix TMP/sw --module-root TMP/mf``: counting stops,
  and the install is interrupted, when the first build step starts (``Runner._run_step``); the
  throw-away roots are removed afterwards;
* ``hpcstack validate RECIPE --site SITE --dry-run`` (to its end: nothing is submitted).

For each it prints the loads of a site (``hpcstack.site.load_site``) and of a recipe
(``hpcstack.recipe.load_recipe``), the lookups of their files on the search path
(``site_path``, ``recipe_path``), the trust policies made (``trust.policy``), trust checks of input
files (``trust.check_inputs``) and of directories (``trust.check_dirs``), the function calls up to
the command's service (``InstallService``/``ValidationService``: the loading) and in all. Works with any hpcstack on
``PYTHONPATH`` (e.g. a worktree of an older commit, for a before/after figure).

Usage: benchmarks/session_loads.py [--recipe pytorch/2.3.1-gpu] [--site localhost]
Needs: root (the install's roots), the localhost site's prerequisites (scripts/localhost-setup).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import shutil
import sys
import tempfile
from collections import Counter

COUNTED = {("site.py", "load_site"): "site loads", ("recipe.py", "load_recipe"): "recipe loads",
           ("site.py", "site_path"): "site lookups", ("recipe.py", "recipe_path"): "recipe lookups",
           ("trust.py", "policy"): "policies", ("trust.py", "check_inputs"): "input checks",
           ("trust.py", "check_dirs"): "dir checks"}
#: Where loading ends and the command's work begins.
SERVICES = ("InstallService", "ValidationService")


class _FirstStep(BaseException):
    """Raised by the profile hook where the first build step starts."""


def measure(argv: list[str], stop_at: str | None) -> Counter:
    """Run ``hpcstack.cli.main(argv)`` under the counting hook; stop at the first call of a
    function named ``stop_at`` (None: run to the end)."""
    from hpcstack.cli import main

    counts: Counter = Counter()

    def hook(frame, event, arg):
        if event != "call":
            return
        counts["function calls"] += 1
        code = frame.f_code
        key = (code.co_filename.rsplit("/", 1)[-1], code.co_name)
        if key in COUNTED and "/hpcstack/" in code.co_filename:
            counts[COUNTED[key]] += 1
        if code.co_name == "__init__" and "calls to the service" not in counts:
            owner = frame.f_locals.get("self")
            if type(owner).__name__ in SERVICES:
                counts["calls to the service"] = counts["function calls"]
        if stop_at and code.co_name == stop_at and "/hpcstack/install/" in code.co_filename:
            counts["reached " + stop_at] = 1
            sys.setprofile(None)
            raise _FirstStep()

    out, err = io.StringIO(), io.StringIO()
    sys.setprofile(hook)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            counts["exit status"] = main(argv)
    except _FirstStep:
        pass
    finally:
        sys.setprofile(None)
    if stop_at and not counts.get("reached " + stop_at):
        print(err.getvalue()[-2000:], file=sys.stderr)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="pytorch/2.3.1-gpu")
    parser.add_argument("--site", default="localhost")
    args = parser.parse_args()
    import hpcstack

    print(f"hpcstack {hpcstack.__version__} from {hpcstack.__file__}")
    roots = tempfile.mkdtemp(prefix="hpcstack-session-bench-", dir="/var/tmp")
    try:
        runs = {
            "install (to the first build step)": measure(
                ["install", args.recipe, "--site", args.site, "--prefix", f"{roots}/sw",
                 "--module-root", f"{roots}/mf"], "_run_step"),
            "validate --dry-run": measure(["validate", args.recipe, "--site", args.site, "--dry-run"], None),
        }
    finally:
        shutil.rmtree(roots, ignore_errors=True)
    keys = ["site loads", "recipe loads", "site lookups", "recipe lookups", "policies", "input checks",
            "dir checks", "calls to the service", "function calls"]
    for name, counts in runs.items():
        print(f"{name}: " + ", ".join(f"{k} {counts.get(k, 0)}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
