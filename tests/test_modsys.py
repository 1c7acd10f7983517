"""hpcstack.modules.modsys: both real module tools in their python mode, on small fake modulefile trees.

Environment Modules reads a Tcl tree, Lmod a Lua one whose module depends on a Tcl one (as on
the localhost-lmod site, where the base python module stays Tcl). Each test skips, with the
reason, when its tool is missing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hpcstack.modules import modsys
from hpcstack.errors import HpcstackError
from moduletools import BOOKKEEPING, ENVIRONMENT_MODULES, LMOD, ModuleTool, clean_env, require, tool_params

pytestmark = pytest.mark.unit

_BOOKKEEPING = re.compile(rf"^({BOOKKEEPING})$")


def _filtered(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not _BOOKKEEPING.match(k)}


@pytest.fixture(params=tool_params())
def mtool(request) -> ModuleTool:
    require(request.param)
    return request.param


@pytest.fixture
def tree(mtool, tmp_path) -> Path:
    """``base/1.0`` (Tcl, like the site's base python module) and ``app/1.0`` (the tool's syntax)
    that depends on it, prepends a bin directory and sets APP_ROOT."""
    root = tmp_path / "mods"
    (tmp_path / "app bin").mkdir()
    base = root / "base" / "1.0"
    base.parent.mkdir(parents=True)
    base.write_text("#%Module\nsetenv BASE_LOADED yes\n")
    mtool.write_module(root, "app/1.0", depends_on=("base/1.0",), whatis="Description: the app",
                       prepend={"PATH": str(tmp_path / "app bin")}, setenv={"APP_ROOT": str(tmp_path)})
    return root


@pytest.mark.integration
def test_find_command_finds_the_installed_tool(mtool):
    cmd = modsys.find_command(mtool.name, env={})
    assert Path(cmd).resolve() == mtool.command.resolve()


@pytest.mark.integration
def test_find_command_takes_the_tools_variable_first(mtool, tmp_path):
    fake = tmp_path / "my-tool"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    var = "LMOD_CMD" if mtool is LMOD else "MODULES_CMD"
    assert modsys.find_command(mtool.name, env={var: str(fake)}) == str(fake)


def test_a_configured_command_that_is_missing_is_one_clear_error():
    with pytest.raises(HpcstackError, match=r"cannot find the lmod command \(tried /nonexistent/lmod\).*modules.command"):
        modsys.find_command("lmod", "/nonexistent/lmod")


@pytest.mark.integration
def test_build_environment_uses_and_loads_with_the_dependency(mtool, tree, tmp_path):
    start = clean_env()
    before = dict(os.environ)
    env = modsys.build_environment(mtool.name, None, [str(tree)], ["app/1.0"], env=start)
    assert env["MODULEPATH"].split(":")[0] == str(tree)
    assert env["LOADEDMODULES"].split(":") == ["base/1.0", "app/1.0"]   # depends-on loaded base
    assert env["BASE_LOADED"] == "yes" and env["APP_ROOT"] == str(tmp_path)
    assert env["PATH"].split(":")[0] == str(tmp_path / "app bin")
    assert dict(os.environ) == before and "APP_ROOT" not in start      # nothing else changed


@pytest.mark.integration
def test_unload_restores_the_environment(mtool, tree):
    cmd = modsys.find_command(mtool.name)
    used = modsys.build_environment(mtool.name, cmd, [str(tree)], [], env=clean_env())
    loaded = modsys.module_env(mtool.name, cmd, ["load", "app/1.0"], used)
    unloaded = modsys.module_env(mtool.name, cmd, ["unload", "app/1.0"], loaded)
    assert _filtered(unloaded) == _filtered(used)   # base/1.0 went too: it was loaded by depends-on
    assert not unloaded.get("LOADEDMODULES")


@pytest.mark.integration
def test_an_unknown_module_is_an_error_naming_it(mtool, tree):
    with pytest.raises(HpcstackError, match=r"module load nosuch/9 failed: .*nosuch.*MODULEPATH"):
        modsys.build_environment(mtool.name, None, [str(tree)], ["nosuch/9"], env=clean_env())


@pytest.mark.integration
def test_a_missing_module_directory_is_an_error(mtool, tmp_path):
    with pytest.raises(HpcstackError, match="module directory .*/absent does not exist .*modules.use"):
        modsys.build_environment(mtool.name, None, [str(tmp_path / "absent")], [], env=clean_env())


@pytest.mark.integration
def test_the_site_switches_tools_by_its_config(localhost_ready):
    """localhost (Environment Modules) and localhost-lmod (Lmod) load the same base python module."""
    from hpcstack.install.resolve import build_modules, detect_python_version
    from hpcstack.site import load_site

    require(LMOD)
    envs = {}
    for name in ("localhost", "localhost-lmod"):
        m = load_site(name).modules   # what resolve.build_environment does, from a clean start
        envs[m.tool] = modsys.build_environment(m.tool, m.command, m.use, build_modules(load_site(name)),
                                                env=clean_env())
    assert set(envs) == {"environment-modules", "lmod"}
    assert "_ModuleTable_Sz_" in envs["lmod"] and "_ModuleTable_Sz_" not in envs["environment-modules"]
    versions = {tool: detect_python_version(env) for tool, env in envs.items()}
    assert len(set(versions.values())) == 1, versions
    for env in envs.values():
        assert re.fullmatch(r"python/3\.\d+", env["LOADEDMODULES"])


@pytest.mark.integration
def test_a_new_module_tool_is_one_registered_class(tmp_path):
    """A tool class registered here (Environment Modules under another name) is found by name
    by the python-mode driver and by the modulefile listing, with nothing else edited."""
    from hpcstack.modules import writer

    require(ENVIRONMENT_MODULES)

    @modsys.register_tool
    class ModulesAgain(modsys.EnvironmentModules):
        name = "modules-again"
        title = "Environment Modules again"

    try:
        ENVIRONMENT_MODULES.write_module(tmp_path, "app/1.0", setenv={"APP_ROOT": "/x"})
        env = modsys.build_environment("modules-again", None, [str(tmp_path)], ["app/1.0"], env=clean_env())
        assert env["APP_ROOT"] == "/x"
        assert writer.available_versions(tmp_path / "app", "modules-again") == ["1.0"]
        with pytest.raises(ValueError, match="registered already"):
            modsys.register_tool(ModulesAgain)
    finally:
        del modsys.TOOLS["modules-again"]
    with pytest.raises(ValueError, match="unknown module tool 'modules-again' \\(known: environment-modules, lmod\\)"):
        modsys.get_tool("modules-again")
