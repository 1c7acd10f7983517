"""Hostile values in modulefiles, read by the real module tools: the Tcl modulefile and
``.version`` with Environment Modules, the Lua modulefile with Lmod. Every value tries to run a
command (``[exec touch M]``, ``os.execute``, newlines); ``module display`` and ``module load``
must run none. (Each template with every interpreter and stub commands: test_hostile_values.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import MODULES_INIT
from hpcstack import templates
from test_hostile_values import default_context, hostile, module_context

pytestmark = pytest.mark.integration

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def _module(init: Path, root: Path, script: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MODULE", "LMOD", "_LMOD", "__LMOD", "BASH_ENV", "LOADEDMODULES", "_ModuleTable"))}
    return subprocess.run(["bash", "-c", f"source {init}\nmodule use {root}\n{script}"], capture_output=True,
                          text=True, env=env, cwd=root, timeout=120)


@pytest.mark.parametrize("tool", ["environment-modules", "lmod"])
def test_module_tools_run_nothing_from_hostile_values(tool, tmp_path):
    init = MODULES_INIT if tool == "environment-modules" else LMOD_INIT
    if not init.is_file():
        pytest.skip(f"{tool} missing ({init}); scripts/localhost-setup --with-test-tools installs it")
    marker = tmp_path / "pwned"
    for i, v in enumerate(hostile(marker)):
        root = tmp_path / f"mf{i}"
        (root / "hostile").mkdir(parents=True)
        (root / "hostile" / "1.0").write_text(templates.render("modulefiles/modulefile.tcl.j2", **module_context(v)))
        # Lmod reads .version with a parser of its own that aborts on quotes inside braces (nothing
        # runs, but the module is then not read): its version keeps the recipe's pattern, which
        # recipe.check_recipe enforces anyway; the other values (comments) stay hostile
        version = {**default_context(v), **({"version": "1.0"} if tool == "lmod" else {})}
        (root / "hostile" / ".version").write_text(templates.render("modulefiles/version.tcl.j2", **version))
        if tool == "lmod":
            (root / "luastack").mkdir()
            (root / "luastack" / "1.0.lua").write_text(templates.render("modulefiles/modulefile.lua.j2", **module_context(v)))
        names = ["hostile/1.0", "hostile"] + (["luastack/1.0"] if tool == "lmod" else [])
        proc = _module(init, root, "\n".join(f"module display {n}; module load {n}; module unload {n}" for n in names))
        assert not marker.exists(), f"{tool} ran a command from {v!r}:\n{proc.stdout}\n{proc.stderr}"
        # the module was read (display shows its whatis line), not refused unread
        assert "Description" in proc.stdout + proc.stderr, proc.stderr
