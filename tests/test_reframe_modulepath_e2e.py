"""The emitted ReFrame check runs from a shell without the site's module roots: a cron job, a CI
runner or an admin's non-login shell, whose ``MODULEPATH`` is empty.

The configuration turns off ReFrame's in-process module resolution (``resolve_module_conflicts``)
and its ``prepare_cmds`` put the site's roots on the jobs' ``MODULEPATH``; the check names its
module with the module root; so nothing depends on the caller's ``MODULEPATH``. Needs the
installed localhost stack (as tests/test_export_reframe.py finds it) and the local two-node Slurm.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import MODULES_INIT
from test_export_reframe import (CHECK, REFRAME, emit, localhost_stack, reframe_tool,  # noqa: F401 (fixtures)
                                 workdir)
from test_validate_slurm import STACK_ARGS

pytestmark = pytest.mark.e2e


def _reframe_with_empty_modulepath(args: list[str], cwd, home) -> subprocess.CompletedProcess:
    """ReFrame in a bash whose module tool is initialised but whose MODULEPATH is empty (the
    init reads the machine's modulespath file; the shell then drops every root)."""
    dropped = ("BASH_ENV", "MODULEPATH", "LOADEDMODULES", "_LMFILES_")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["HOME"] = str(home)
    script = (f"source {MODULES_INIT} && export MODULEPATH= && "
              f"test -z \"$MODULEPATH\" && echo MODULEPATH-is-empty && "
              f"exec {REFRAME} --nocolor {' '.join(args)}")
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=900)


def test_reframe_runs_the_check_from_a_shell_whose_modulepath_is_empty(localhost_stack, workdir):
    proc = emit(workdir / "rfm", *STACK_ARGS, "--backend", "horovod", "--nodes", "1", site="localhost")
    assert proc.returncode == 0, proc.stderr
    check = (workdir / "rfm" / CHECK).read_text()
    module_root = STACK_ARGS[STACK_ARGS.index("--module-root") + 1]
    assert f"'path': '{module_root}'" in check
    settings = (workdir / "rfm" / "settings.py").read_text()
    for root in ("/opt/hpcstack/base-modulefiles", module_root):
        assert f"'module use {root}'," in settings, root
    assert "'resolve_module_conflicts': False," in settings
    proc = _reframe_with_empty_modulepath(["-C", str(workdir / "rfm" / "settings.py"), "-c", str(workdir / "rfm"),
                                           "-r"], workdir, workdir)
    out = proc.stdout + proc.stderr
    print(out[-3000:])
    assert "MODULEPATH-is-empty" in out
    assert "No module path defined" not in out, out[-5000:]
    assert proc.returncode == 0, out[-5000:]
    assert "[  PASSED  ] Ran 1/1 test case(s) from 1 check(s) (0 failure(s)" in out, out[-5000:]
