"""Tests for the users' `extend-venv-activate` tool (hpcstack.modules.activate + its Jinja template).

Integration tests: real shells (bash, zsh, dash, fish, tcsh), both real module tools (Environment
Modules with a Tcl modulefile, Lmod with a Lua one: every test that activates a venv runs under
each) and real venvs from `/usr/bin/python3 -m venv` (and virtualenv when installed). Each test
skips, with the reason, when a tool it needs is missing.

The venv lives in a directory named `my venv & x'$z"q`: spaces, &, quotes and $ (CPython's venv
refuses a `:` in a venv path, since it separates PATH entries, so `:` is exercised through the
module init scripts' directory instead).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from hpcstack.modules.activate import render_extend_venv_activate
from moduletools import (BOOKKEEPING, ENVIRONMENT_MODULES, InstalledStack, ModuleTool,
                         find_installed_stack, require, tool_params)

pytestmark = pytest.mark.unit

MODULE = "testpkg/1.0"
PLAIN_MODULE = "plainpkg/1.0"
VENV_MODULE = "venvpkg/1.0"    # like the real stack: a venv's bin/ on PATH, its python real
SYSTEM_PYTHON = "/usr/bin/python3"
INIT_SHELLS = ("bash", "zsh", "sh", "fish", "csh")
VENV_NAME = "my venv & x'$z\"q"
ODD_DIR = "init dir & x:y'$z\"q"
UNSET = None
# Every subprocess gets an environment built from scratch: no BASH_ENV (Lmod's profile script
# exports one that would switch non-interactive bash to Lmod), no inherited module state.
BASE_PATH = "/usr/bin:/bin"
# Module bookkeeping (both tools) and venv save slots: allowed to differ before activation /
# after deactivation.
IGNORED_VARS = re.compile(rf"^({BOOKKEEPING}|_OLD_VIRTUAL_\w*|_)$")
PY_PROBE = ("import sys, json, stackmod, shadow; print(json.dumps({'exe': sys.executable, "
            "'stackmod': stackmod.__file__, 'shadow': shadow.VERSION}))")


# ---------------------------------------------------------------------------------------------
# Shells
# ---------------------------------------------------------------------------------------------

def quote_fish(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_csh(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class Stack:
    """The test module tree: `module use` MODULEPATH to get testpkg/1.0 (in the tool's syntax)."""

    tool: ModuleTool
    modulepath: Path
    bin: Path
    py: Path
    init: dict[str, str]   # module init scripts, copied under a directory with odd characters


@dataclass(frozen=True)
class ShellCase:
    """How to drive one shell: command line, its scripts and a few shell-specific commands."""

    name: str
    argv: tuple[str, ...]
    init: str              # key into the module init scripts
    activate: str          # activation script in VENV/bin
    quote: Callable[[str], str]
    rc: str                # writes the last status to $T_OUT/rc
    module_list: str       # writes `module -t list` to $T_OUT/list
    leftovers: str         # writes hpcstack variables/functions still defined to $T_OUT/left
    prologue: str = ""
    source: str = "source"

    def missing(self, stack: Stack) -> str | None:
        """Why this shell cannot be tested here, or None."""
        if not shutil.which(self.argv[0]):
            return f"{self.argv[0]} is not installed"
        if self.init not in stack.init:
            return f"no {stack.tool.name} init script for {self.init}"
        return None


_SH_LEFT = ('set | grep -i "^_hpcstack_" > "$T_OUT/left"; '
            'typeset -f _hpcstack_restore >> "$T_OUT/left" 2>/dev/null')
BASH = ShellCase("bash", ("bash", "--norc", "--noprofile"), "bash", "activate", shlex.quote,
                 'echo $? > "$T_OUT/rc"', 'module -t list 2> "$T_OUT/list"', _SH_LEFT)
ZSH = ShellCase("zsh", ("zsh", "-f"), "zsh", "activate", shlex.quote,
                'echo $? > "$T_OUT/rc"', 'module -t list 2> "$T_OUT/list"', _SH_LEFT)
DASH = ShellCase("dash", ("dash",), "sh", "activate", shlex.quote,
                 'echo $? > "$T_OUT/rc"', 'module -t list 2> "$T_OUT/list"', _SH_LEFT,
                 source=".")
FISH = ShellCase("fish", ("fish", "--no-config"), "fish", "activate.fish", quote_fish,
                 'echo $status > "$T_OUT/rc"', 'module -t list 2> "$T_OUT/list"',
                 'set -n | grep -i "^_hpcstack_" > "$T_OUT/left"; '
                 'functions -q _hpcstack_restore; and echo _hpcstack_restore >> "$T_OUT/left"')
TCSH = ShellCase("tcsh", ("tcsh", "-f"), "csh", "activate.csh", quote_csh,
                 'echo $status > "$T_OUT/rc"', '( module -t list ) >& "$T_OUT/list"',
                 'set | grep -i "^_hpcstack_" > "$T_OUT/left"',
                 prologue="set prompt = '> '")  # CPython's activate.csh reads $prompt

SHELLS = [pytest.param(s, id=s.name) for s in (BASH, ZSH, FISH, TCSH)]
SHELLS_WITH_DASH = SHELLS + [pytest.param(DASH, id="dash")]


def needs(shell: ShellCase, stack: Stack) -> None:
    """Skip the calling test when ``shell`` or its module init script is missing."""
    reason = shell.missing(stack)
    if reason:
        pytest.skip(reason)


# ---------------------------------------------------------------------------------------------
# Fixtures: module tree, rendered tool, venvs
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="session", params=tool_params())
def stack(request, tmp_path_factory) -> Stack:
    """A `testpkg/1.0` modulefile over a tiny stack, under each real module tool.

    Environment Modules gets a Tcl modulefile, Lmod a Lua one (what hpcstack writes for each).
    """
    mtool: ModuleTool = request.param
    require(mtool)
    root = tmp_path_factory.mktemp(f"stack-{mtool.short}")
    stack_bin, stack_py = root / "bin", root / "site"
    stack_bin.mkdir()
    stack_py.mkdir()
    # a `python` on the stack's PATH entry: if it ever shadowed the venv's, the probe would say so
    fake_python = stack_bin / "python"
    fake_python.write_text("#!/bin/sh\necho '{\"exe\": \"the stack module\'s python\"}'\n")
    fake_python.chmod(0o755)
    (stack_py / "stackmod.py").write_text("NAME = 'stackmod'\n")
    (stack_py / "shadow.py").write_text("VERSION = 'stack'\n")
    mods = root / "modulefiles"
    mtool.write_module(mods, MODULE, prepend={"PATH": str(stack_bin), "PYTHONPATH": str(stack_py)},
                       setenv={"TESTPKG_ROOT": str(root)})
    # a module that leaves PYTHONPATH alone, so the venv's prepend meets an empty/unset value
    mtool.write_module(mods, PLAIN_MODULE, setenv={"PLAINPKG_ROOT": str(root)})
    # a module shaped like the real stack: its own venv's bin/ (a real python) on PATH
    stack_venv = root / "stack venv"
    subprocess.run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(stack_venv)], check=True)
    mtool.write_module(mods, VENV_MODULE, prepend={"PATH": str(stack_venv / "bin"),
                                                   "PYTHONPATH": str(stack_py)})
    odd = root / ODD_DIR
    odd.mkdir()
    init = {}
    for shell in INIT_SHELLS:
        if mtool.init(shell).is_file():
            shutil.copy(mtool.init(shell), odd / shell)
            init[shell] = str(odd / shell)
    return Stack(mtool, mods, stack_bin, stack_py, init)


def render_tool(where: Path, module: str, init: dict[str, str]) -> Path:
    """Render the tool with hpcstack's render function and install it as an executable."""
    where.mkdir(parents=True, exist_ok=True)
    tool = where / "extend-venv-activate"
    tool.write_text(render_extend_venv_activate(module, init, SYSTEM_PYTHON))
    tool.chmod(0o755)
    return tool


@pytest.fixture(scope="session")
def tool(stack, tmp_path_factory) -> Path:
    return render_tool(tmp_path_factory.mktemp("tool"), MODULE, stack.init)


def run_tool(tool: Path, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(tool), *map(str, args)], capture_output=True, text=True,
                          env={"PATH": BASE_PATH, "HOME": "/tmp"})
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def make_venv(parent: Path, kind: str = "venv", python: str = SYSTEM_PYTHON,
              name: str = VENV_NAME) -> Path:
    """Create a venv (``kind`` "venv" or "virtualenv") without pip, for speed."""
    venv = parent / name
    if kind == "virtualenv":
        if subprocess.run([sys.executable, "-m", "virtualenv", "--version"],
                          capture_output=True).returncode != 0:
            pytest.skip("virtualenv is not installed")
        cmd = [sys.executable, "-m", "virtualenv", "-q", "--no-seed", "-p", python, str(venv)]
    else:
        cmd = [python, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(cmd, check=True, capture_output=True)
    return venv


def site_packages(venv: Path) -> str:
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], check=True,
                          capture_output=True, text=True).stdout.strip()


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mode under ``directory`` (symlinks by target)."""
    def content(p: Path) -> bytes:
        return os.readlink(p).encode() if p.is_symlink() else p.read_bytes()

    return {str(p.relative_to(directory)): (content(p), p.lstat().st_mode)
            for p in sorted(directory.rglob("*")) if p.is_file() or p.is_symlink()}


@pytest.fixture(params=["venv", "virtualenv"])
def venv_kind(request) -> str:
    return request.param


# ---------------------------------------------------------------------------------------------
# Running a shell session: env before / while active / after deactivate
# ---------------------------------------------------------------------------------------------

@dataclass
class Session:
    rc: int
    before: dict[str, str]
    active: dict[str, str]
    after: dict[str, str]
    module_list: str
    probe: dict
    leftovers: str
    proc: subprocess.CompletedProcess
    probe_after: dict | None = None  # the venv's python (by its path) after deactivate


def read_env(path: Path) -> dict[str, str]:
    items = path.read_bytes().decode().split("\0")
    return dict(item.split("=", 1) for item in items if item)


def filtered(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not IGNORED_VARS.match(k)}


def run_session(shell: ShellCase, stack: Stack, venv: Path, out: Path, *,
                pythonpath: str | None = UNSET, preload: bool = False,
                twice: bool = False, module: str = MODULE, probe: str = PY_PROBE,
                probe_after: str | None = None) -> Session:
    """Initialise modules, then activate (once or twice) and deactivate ``venv`` in ``shell``.

    ``probe`` runs as ``python -c`` while the venv is active; ``probe_after``, if given, with the
    venv's python by its path after deactivate (each prints one JSON document)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [shell.prologue,
             'source "$T_INIT"',
             'module use "$T_MODS"',
             f"module load {module}" if preload else "",
             'env -0 > "$T_OUT/before"',
             f'{shell.source} "$T_ACT"',
             shell.rc,
             f'{shell.source} "$T_ACT"' if twice else "",
             'env -0 > "$T_OUT/active"',
             shell.module_list,
             'python -c "$T_PY" > "$T_OUT/probe"',
             "deactivate",
             'env -0 > "$T_OUT/after"',
             shell.leftovers,
             '"$T_VENV_PY" -c "$T_PY_AFTER" > "$T_OUT/probe_after"' if probe_after else ""]
    script = out / f"session.{shell.name}"
    script.write_text("\n".join(line for line in lines if line) + "\n")
    # CPython's deactivate leaves PS1="(venv) " behind in a non-interactive bash: no prompt change
    env = {"PATH": BASE_PATH, "HOME": str(out), "LC_ALL": "C.UTF-8",
           "VIRTUAL_ENV_DISABLE_PROMPT": "1", "T_OUT": str(out),
           "T_INIT": stack.init[shell.init], "T_MODS": str(stack.modulepath),
           "T_ACT": str(venv / "bin" / shell.activate), "T_PY": probe}
    if probe_after:
        env.update(T_VENV_PY=str(venv / "bin" / "python"), T_PY_AFTER=probe_after)
    if pythonpath is not UNSET:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([*shell.argv, str(script)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=out)
    probed = (out / "probe").read_text()
    after = (out / "probe_after").read_text() if probe_after else ""
    return Session(rc=int((out / "rc").read_text()), before=read_env(out / "before"),
                   active=read_env(out / "active"), after=read_env(out / "after"),
                   module_list=(out / "list").read_text(),
                   probe=json.loads(probed) if probed else {}, leftovers=(out / "left").read_text(),
                   proc=proc, probe_after=json.loads(after) if after else None)


def assert_clean_pythonpath(value: str) -> None:
    parts = value.split(":")
    assert all(parts), f"empty element (current directory) in PYTHONPATH={value!r}"


# ---------------------------------------------------------------------------------------------
# Behaviour in real shells
# ---------------------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("pythonpath", [UNSET, "", "/opt/user lib"], ids=["unset", "empty", "set"])
def test_activate_deactivate_roundtrip(shell, pythonpath, venv_kind, stack, tool, tmp_path):
    needs(shell, stack)
    venv = make_venv(tmp_path, venv_kind)
    run_tool(tool, venv)
    site = site_packages(venv)
    s = run_session(shell, stack, venv, tmp_path / "out", pythonpath=pythonpath)
    assert s.rc == 0, s.proc.stderr

    # while active: module loaded, venv python first, venv site-packages first on PYTHONPATH
    assert MODULE in s.module_list.split(), s.module_list
    assert s.active["TESTPKG_ROOT"]
    assert s.active["PATH"].split(":")[0] == str(venv / "bin")
    assert s.probe["exe"] == str(venv / "bin" / "python")
    assert s.probe["stackmod"] == str(stack.py / "stackmod.py")
    assert s.probe["shadow"] == "stack"
    expected = [site, str(stack.py)] + ([pythonpath] if pythonpath else [])
    assert s.active["PYTHONPATH"] == ":".join(expected)
    assert_clean_pythonpath(s.active["PYTHONPATH"])

    # after deactivate: everything back, PYTHONPATH exactly (unset / empty / set)
    assert filtered(s.after) == filtered(s.before)
    assert s.after.get("PYTHONPATH") == pythonpath
    assert MODULE not in s.after.get("LOADEDMODULES", "")
    assert s.leftovers == "", s.leftovers


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("pythonpath", [UNSET, ""], ids=["unset", "empty"])
def test_no_empty_pythonpath_element(shell, pythonpath, stack, tmp_path):
    """With a module that sets no PYTHONPATH, an unset/empty one becomes just the venv's path."""
    needs(shell, stack)
    tool = render_tool(tmp_path / "tool", PLAIN_MODULE, stack.init)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    s = run_session(shell, stack, venv, tmp_path / "out", pythonpath=pythonpath)
    assert s.rc == 0, s.proc.stderr
    assert s.active["PLAINPKG_ROOT"]
    assert s.active["PYTHONPATH"] == site_packages(venv)
    assert s.after.get("PYTHONPATH") == pythonpath
    assert filtered(s.after) == filtered(s.before)


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_package_installed_in_venv_wins_over_stack(shell, stack, tool, tmp_path):
    needs(shell, stack)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    Path(site_packages(venv), "shadow.py").write_text("VERSION = 'venv'\n")
    s = run_session(shell, stack, venv, tmp_path / "out")
    assert s.rc == 0, s.proc.stderr
    assert s.probe["shadow"] == "venv"
    assert s.probe["stackmod"] == str(stack.py / "stackmod.py")


PATH_PROBE = ("import json, os, sys, shadow, mine, stackmod, calendar; print(json.dumps({"
              "'path': sys.path, 'stdlib': os.path.dirname(os.__file__), 'shadow': shadow.VERSION, "
              "'mine': mine.__file__, 'stackmod': stackmod.__file__, 'calendar': calendar.__file__}))")
PLAIN_PATH_PROBE = ("import json, os, sys; print(json.dumps({'path': sys.path, "
                    "'stdlib': os.path.dirname(os.__file__)}))")
PTH_NAME = "00-hpcstack-venv.pth"


def stdlib_end(path: list[str], stdlib: str) -> int:
    """The index after the standard library's entries (its .zip, its directory, lib-dynload)."""
    at = path.index(stdlib)
    return at + 2 if at + 1 < len(path) and path[at + 1].endswith("lib-dynload") else at + 1


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_venv_python_searches_stdlib_first(shell, stack, tool, tmp_path):
    """While active, the venv's python has the standard library first, then the venv's
    site-packages (a user's package, and their copy of one of the stack's, which wins), then the
    stack's, then the user's own PYTHONPATH; a user file named like a standard module does not
    hide it. PYTHONPATH itself is as before, for the session's other Pythons. After deactivate
    the venv's python is a plain venv's: nothing of the stack on sys.path."""
    needs(shell, stack)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    site = site_packages(venv)
    assert (Path(site) / PTH_NAME).is_file()
    for name, text in (("shadow.py", "VERSION = 'venv'\n"), ("mine.py", ""), ("calendar.py", "")):
        Path(site, name).write_text(text)
    s = run_session(shell, stack, venv, tmp_path / "out", pythonpath="/opt/user lib",
                    probe=PATH_PROBE, probe_after=PLAIN_PATH_PROBE)
    assert s.rc == 0, s.proc.stderr
    assert "Error processing line" not in s.proc.stderr, s.proc.stderr
    assert s.active["PYTHONPATH"] == f"{site}:{stack.py}:/opt/user lib"
    path, stdlib = s.probe["path"], s.probe["stdlib"]
    end = stdlib_end(path, stdlib)
    assert path[end:end + 3] == [site, os.path.realpath(stack.py), "/opt/user lib"], path
    assert not {site, str(stack.py), os.path.realpath(stack.py), "/opt/user lib"} & set(path[:end]), path
    assert s.probe["shadow"] == "venv"
    assert s.probe["mine"] == str(Path(site, "mine.py"))
    assert s.probe["stackmod"] == os.path.join(os.path.realpath(stack.py), "stackmod.py")
    assert s.probe["calendar"] == os.path.join(stdlib, "calendar.py")
    # deactivated: the start-up file stays and does nothing; the stack is gone from sys.path
    after = s.probe_after["path"]
    assert str(stack.py) not in after and os.path.realpath(stack.py) not in after, after
    assert after.index(site) >= stdlib_end(after, s.probe_after["stdlib"]), after
    assert filtered(s.after) == filtered(s.before)


@pytest.mark.integration
def test_startup_file_does_nothing_unless_the_venv_is_on_pythonpath(stack, tool, tmp_path):
    """Run by its path with the module's PYTHONPATH alone (the venv not active) the venv's python
    keeps that order, as before; with no PYTHONPATH, or -E, it is a plain venv's."""
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    site = site_packages(venv)
    python = str(venv / "bin" / "python")

    def path(*flags: str, **env: str) -> list[str]:
        out = subprocess.run([python, *flags, "-c", "import sys, json; print(json.dumps(sys.path))"],
                             env={"PATH": BASE_PATH, **env}, capture_output=True, text=True, check=True)
        assert out.stderr == ""
        return json.loads(out.stdout)

    module_only = path(PYTHONPATH=str(stack.py))
    assert module_only.index(str(stack.py)) < module_only.index(site)
    plain = path()
    assert path("-E", PYTHONPATH=f"{site}:{stack.py}") == plain
    assert plain[-1] == site and str(stack.py) not in plain


@pytest.mark.integration
def test_startup_file_written_once_and_undone(venv_kind, tool, tmp_path):
    venv = make_venv(tmp_path, venv_kind)
    pristine = snapshot(venv)
    run_tool(tool, venv)
    pth = Path(site_packages(venv), PTH_NAME)
    text = pth.read_text()
    assert text.startswith("# hpcstack extend-venv-activate:")
    assert repr(site_packages(venv)) in text.splitlines()[-1]
    assert text.splitlines()[-1].startswith("import ")  # the line that site executes
    assert pth.stat().st_mode & 0o777 == 0o644
    again = run_tool(tool, venv)
    assert "nothing to do" in again.stdout
    undone = run_tool(tool, venv, "--undo")
    assert f"removed {pth}" in undone.stdout
    assert not pth.exists() and snapshot(venv) == pristine


@pytest.mark.integration
def test_startup_file_names_odd_paths_as_python_literals(tool, tmp_path):
    """The venv's path (quotes, $, &, a backslash, non-ASCII) reaches the .pth as one ASCII
    literal, and the line does its work there."""
    venv = make_venv(tmp_path, name="v \\ 'q' \"d\" é $x")
    run_tool(tool, venv)
    site = site_packages(venv)
    line = Path(site, PTH_NAME).read_text().splitlines()[-1]
    assert line.isascii()
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys, json; print(json.dumps(sys.path))"],
                         env={"PATH": BASE_PATH, "PYTHONPATH": f"{site}:/x"}, capture_output=True,
                         text=True, check=True)
    assert out.stderr == ""
    assert json.loads(out.stdout)[-2:] == [site, "/x"]


@pytest.mark.integration
def test_site_packages_of_another_account_is_refused(tool, tmp_path):
    """A venv of one's own whose site-packages another account owns: nothing is written there."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory to another account")
    venv = make_venv(tmp_path)
    site = Path(site_packages(venv))
    os.chown(site, 65534, 65534)
    before = snapshot(venv)
    proc = run_tool(tool, venv, check=False)
    assert proc.returncode == 1
    assert f"{site} is nobody's" in proc.stderr or f"{site} is 65534's" in proc.stderr, proc.stderr
    assert snapshot(venv) == before


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("when", ["before", "after"])
def test_venv_made_before_or_after_loading_the_module(when, shell, stack, tmp_path):
    """`python -m venv` before `module load` (the system python) or after it (the stack venv's
    python, as the modulefile's help shows): both venvs load the module and keep their python first."""
    needs(shell, stack)
    tool = render_tool(tmp_path / "tool", VENV_MODULE, stack.init)
    if when == "before":
        venv = make_venv(tmp_path)
    else:
        venv = tmp_path / VENV_NAME
        made = stack.tool.bash(f'module use {shlex.quote(str(stack.modulepath))}\n'
                               f'module load {VENV_MODULE} || exit 1\n'
                               'echo "PY=$(command -v python)"\n'
                               f'python -m venv --without-pip {shlex.quote(str(venv))}')
        assert made.returncode == 0, made.stderr
        assert f"PY={stack.modulepath.parent}/stack venv/bin/python" in made.stdout
    run_tool(tool, venv)
    s = run_session(shell, stack, venv, tmp_path / "out", module=VENV_MODULE)
    assert s.rc == 0, s.proc.stderr
    assert VENV_MODULE in s.module_list.split(), s.module_list
    assert s.probe["exe"] == str(venv / "bin" / "python")
    assert s.probe["stackmod"] == str(stack.py / "stackmod.py")
    assert s.active["PYTHONPATH"] == f"{site_packages(venv)}:{stack.py}"
    assert filtered(s.after) == filtered(s.before)
    assert VENV_MODULE not in s.after.get("LOADEDMODULES", "")


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_preloaded_module_stays_loaded(shell, stack, tool, tmp_path):
    needs(shell, stack)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    s = run_session(shell, stack, venv, tmp_path / "out", preload=True)
    assert s.rc == 0, s.proc.stderr
    assert MODULE in s.before["LOADEDMODULES"].split(":")
    assert s.active["PYTHONPATH"] == f"{site_packages(venv)}:{stack.py}"
    assert MODULE in s.after["LOADEDMODULES"].split(":"), "deactivate unloaded a user's module"
    assert s.after == s.before


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_activating_twice_then_deactivating_restores(shell, stack, tool, tmp_path):
    needs(shell, stack)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    s = run_session(shell, stack, venv, tmp_path / "out", pythonpath="/a", twice=True)
    assert s.active["PYTHONPATH"] == f"{site_packages(venv)}:{stack.py}:/a"
    assert s.active["PATH"].split(":").count(str(venv / "bin")) == 1
    assert filtered(s.after) == filtered(s.before)
    assert s.leftovers == ""


def run_env_i(shell: ShellCase, venv: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    """Run `env -i VAR=... SHELL -c 'source VENV/bin/activate; BODY'`: no `module` function.

    The activate path is written into the command, quoted for the shell, as a user would.
    """
    act = shell.quote(str(venv / "bin" / shell.activate))
    script = "\n".join(line for line in (shell.prologue, f"{shell.source} {act}", body) if line)
    assigns = [f"{key}={value}" for key, value in {"PATH": BASE_PATH, **env}.items()]
    return subprocess.run(["env", "-i", *assigns, *shell.argv, "-c", script], capture_output=True,
                          text=True, timeout=60, cwd=venv.parent)


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS_WITH_DASH)
def test_env_i_activation_initialises_modules(shell, stack, tool, tmp_path):
    needs(shell, stack)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    out = tmp_path / "out"
    out.mkdir()
    body = "\n".join([shell.rc, shell.module_list, 'python -c "$T_PY" > "$T_OUT/probe"'])
    proc = run_env_i(shell, venv, body, MODULEPATH=str(stack.modulepath), T_OUT=str(out),
                     T_PY=PY_PROBE)
    assert (out / "rc").read_text().strip() == "0", proc.stderr
    assert MODULE in (out / "list").read_text().split()
    assert json.loads((out / "probe").read_text())["exe"] == str(venv / "bin" / "python")


@pytest.mark.integration
def test_env_i_bash_literal_command(stack, tool, tmp_path):
    """The exact form from batch jobs: env -i bash --norc -c 'source VENV/bin/activate'."""
    needs(BASH, stack)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    act = shlex.quote(str(venv / "bin" / "activate"))
    proc = subprocess.run(["env", "-i", f"MODULEPATH={stack.modulepath}", "bash", "--norc", "-c",
                           f"source {act} && module -t list && python -c 'import stackmod'"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert MODULE in proc.stderr.split()


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS_WITH_DASH)
def test_missing_module_command_is_an_error(shell, stack, tmp_path):
    needs(shell, stack)
    bogus = {key: f"/nonexistent/modules/init/{key}" for key in INIT_SHELLS}
    tool = render_tool(tmp_path / "tool", MODULE, bogus)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    out = tmp_path / "out"
    out.mkdir()
    body = "\n".join([shell.rc, 'env -0 > "$T_OUT/env"'])
    proc = run_env_i(shell, venv, body, MODULEPATH=str(stack.modulepath), T_OUT=str(out))
    assert "'module' command is missing" in proc.stderr
    assert "/nonexistent/modules/init/" in proc.stderr
    if shell is not TCSH:  # csh's `source` cannot report a status; activation is skipped
        assert (out / "rc").read_text().strip() != "0"
    env = read_env(out / "env")
    assert "VIRTUAL_ENV" not in env and str(venv) not in env["PATH"]


@pytest.mark.integration
@pytest.mark.parametrize("shell", SHELLS)
def test_failed_module_load_is_an_error(shell, stack, tmp_path):
    needs(shell, stack)
    tool = render_tool(tmp_path / "tool", "nosuchpkg/9.9", stack.init)
    venv = make_venv(tmp_path)
    run_tool(tool, venv)
    out = tmp_path / "out"
    out.mkdir()
    script = out / "s"
    script.write_text("\n".join([shell.prologue, 'source "$T_INIT"', 'module use "$T_MODS"',
                                 'env -0 > "$T_OUT/before"', 'source "$T_ACT"', shell.rc,
                                 'env -0 > "$T_OUT/after"', shell.leftovers]) + "\n")
    env = {"PATH": BASE_PATH, "HOME": str(out), "PYTHONPATH": "/keep", "T_OUT": str(out),
           "T_INIT": stack.init[shell.init], "T_MODS": str(stack.modulepath),
           "T_ACT": str(venv / "bin" / shell.activate)}
    proc = subprocess.run([*shell.argv, str(script)], env=env, capture_output=True, text=True,
                          timeout=60, cwd=out)
    assert "'module load' nosuchpkg/9.9 failed" in proc.stderr
    if shell is not TCSH:
        assert (out / "rc").read_text().strip() != "0"
    before, after = read_env(out / "before"), read_env(out / "after")
    assert after["PYTHONPATH"] == "/keep"
    assert "VIRTUAL_ENV" not in after
    assert filtered(after) == filtered(before)
    assert (out / "left").read_text() == ""


# ---------------------------------------------------------------------------------------------
# Patching itself: idempotent, reversible, refuses unknown layouts
# ---------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_patch_is_idempotent(venv_kind, tool, tmp_path):
    venv = make_venv(tmp_path, venv_kind)
    run_tool(tool, venv)
    once = snapshot(venv / "bin")
    second = run_tool(tool, venv)
    assert snapshot(venv / "bin") == once
    assert "nothing to do" in second.stdout


@pytest.mark.integration
def test_patch_records_module_and_site_packages(venv_kind, tool, tmp_path):
    venv = make_venv(tmp_path, venv_kind)
    run_tool(tool, venv)
    activate = (venv / "bin" / "activate").read_text()
    assert f"# >>> hpcstack {MODULE} >>>" in activate
    assert f"module load {MODULE}" in activate
    assert shlex.quote(site_packages(venv)) in activate
    for name in ("activate.fish", "activate.csh"):
        assert f"# <<< hpcstack {MODULE} <<<" in (venv / "bin" / name).read_text()


@pytest.mark.integration
def test_undo_restores_bytes_exactly(venv_kind, tool, tmp_path):
    venv = make_venv(tmp_path, venv_kind)
    pristine = snapshot(venv / "bin")
    run_tool(tool, venv)
    assert snapshot(venv / "bin") != pristine
    run_tool(tool, venv, "--undo")
    assert snapshot(venv / "bin") == pristine
    again = run_tool(tool, venv, "--undo")
    assert "nothing to do" in again.stdout
    assert snapshot(venv / "bin") == pristine


@pytest.mark.integration
@pytest.mark.parametrize("mutation", [
    pytest.param(("deactivate nondestructive\n", "deactivate_all\n"), id="no-load-anchor"),
    pytest.param(('if [ ! "${1:-}" = "nondestructive" ] ; then', 'if true ; then'),
                 id="no-unload-anchor"),
    pytest.param(('_OLD_VIRTUAL_PATH="$PATH"', 'OLDP="$PATH"'), id="path-not-saved-after-load"),
])
def test_unknown_layout_is_refused_untouched(mutation, tool, tmp_path):
    venv = make_venv(tmp_path)
    activate = venv / "bin" / "activate"
    old, new = mutation
    assert old in activate.read_text()
    activate.write_text(activate.read_text().replace(old, new))
    before = snapshot(venv / "bin")
    proc = run_tool(tool, venv, check=False)
    assert proc.returncode == 1
    assert "activate" in proc.stderr and "unchanged" in proc.stderr
    assert snapshot(venv / "bin") == before


@pytest.mark.integration
def test_shell_option_limits_what_is_patched(tool, tmp_path):
    venv = make_venv(tmp_path)
    fish = venv / "bin" / "activate.fish"
    fish.write_text("# some other fish activation script\n")
    before = snapshot(venv / "bin")
    refused = run_tool(tool, venv, check=False)
    assert refused.returncode == 1 and "activate.fish" in refused.stderr
    assert "--shell" in refused.stderr
    assert snapshot(venv / "bin") == before
    run_tool(tool, venv, "--shell", "sh", "--shell", "csh")
    after = snapshot(venv / "bin")
    assert after["activate.fish"] == before["activate.fish"]
    assert after["activate"] != before["activate"]
    assert after["activate.csh"] != before["activate.csh"]


@pytest.mark.integration
def test_other_stack_tool_replaces_extension(stack, tool, tmp_path):
    venv = make_venv(tmp_path)
    pristine = snapshot(venv / "bin")
    run_tool(tool, venv)
    other = render_tool(tmp_path / "other", "otherpkg/2.0", stack.init)
    run_tool(other, venv)
    text = (venv / "bin" / "activate").read_text()
    assert "otherpkg/2.0" in text and MODULE not in text
    run_tool(tool, venv, "--undo")
    assert snapshot(venv / "bin") == pristine


@pytest.mark.integration
def test_does_not_depend_on_marker_comments(stack, tool, tmp_path):
    """3.11 writes '# you cannot...', 3.12 '# You cannot...'; without either it still works."""
    needs(BASH, stack)
    venv = make_venv(tmp_path)
    activate = venv / "bin" / "activate"
    text = activate.read_text()
    assert "# you cannot run it directly" in text
    activate.write_text(text.replace("# you cannot run it directly\n", ""))
    run_tool(tool, venv)
    s = run_session(BASH, stack, venv, tmp_path / "out")
    assert s.rc == 0 and MODULE in s.module_list.split()
    assert filtered(s.after) == filtered(s.before)


def other_pythons() -> list:
    """CPython 3.x interpreters found here (python3.N on PATH, pyenv), one per version."""
    found = {}
    candidates = [shutil.which(f"python3.{minor}") for minor in range(8, 14)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python3"))
    for exe in filter(None, candidates):
        probe = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            found.setdefault(probe.stdout.strip(), exe)
    ordered = sorted(found.items(), key=lambda item: tuple(map(int, item[0].split("."))))
    return [pytest.param(exe, id=version) for version, exe in ordered] or [
        pytest.param(None, marks=pytest.mark.skip(reason="no other CPython 3.x found"))]


@pytest.mark.integration
@pytest.mark.parametrize("python", other_pythons())
def test_other_python_versions(python, stack, tool, tmp_path):
    """venv layouts of other CPython versions; plain path, as older venvs do not quote '$"."""
    needs(BASH, stack)
    venv = make_venv(tmp_path, python=python, name="plain venv & x")
    pristine = snapshot(venv)
    made = run_tool(tool, venv)
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the tool runs on SYSTEM_PYTHON, which stands for the stack's python here
    mine = subprocess.run([SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert (f"is a Python {version} venv and {MODULE} is built for Python {mine}" in made.stderr) == (version != mine)
    site = site_packages(venv)
    Path(site, "shadow.py").write_text("VERSION = 'venv'\n")
    Path(site, "mine.py").write_text("")
    missing = []
    for shell in (BASH, FISH, TCSH):
        reason = shell.missing(stack)
        if reason:
            missing.append(reason)
            continue
        s = run_session(shell, stack, venv, tmp_path / f"out-{shell.name}", pythonpath="",
                        probe=PATH_PROBE)
        assert s.rc == 0 and MODULE in s.module_list.split(), s.proc.stderr
        assert "Error processing line" not in s.proc.stderr, s.proc.stderr
        # the start-up file's line works in this version: the standard library first
        end = stdlib_end(s.probe["path"], s.probe["stdlib"])
        assert s.probe["path"][end:end + 2] == [site, os.path.realpath(stack.py)], s.probe["path"]
        assert s.probe["shadow"] == "venv"
        assert filtered(s.after) == filtered(s.before)
    for name in ("shadow.py", "mine.py"):
        Path(site, name).unlink()
    shutil.rmtree(Path(site, "__pycache__"), ignore_errors=True)
    run_tool(tool, venv, "--undo")
    assert snapshot(venv) == pristine
    if missing:  # the shells that ran passed; the others are said, not passed over
        pytest.skip(f"{'; '.join(missing)}: run scripts/localhost-setup --with-test-tools")


# ---------------------------------------------------------------------------------------------
# The installed stack (e2e): a user's venv with pip, made before or after `module load`
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> InstalledStack:
    found = find_installed_stack(tmp_path_factory.mktemp("lua-modulefiles"))
    if isinstance(found, str):
        pytest.skip(found)
    return found


def tiny_wheel(dest: Path, name: str, version: str) -> Path:
    """A pure-Python wheel ``name==version`` whose module says its version (no build, no index)."""
    import base64
    import hashlib
    import zipfile

    files = {f"{name}/__init__.py": f"__version__ = {version!r}\n",
             f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},{len(text)}"
              for path, text in files.items()]
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record + [f"{name}-{version}.dist-info/RECORD,,"]) + "\n"
    wheel = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.mark.e2e
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("mtool", tool_params())
def test_installed_stack_with_a_users_venv(mtool, when, installed, tmp_path):
    """The README's user flow on the real stack: `python -m venv` (with pip) before or after
    `module load`, extend, activate: torch and horovod from the stack, the stack's constraints
    refuse another version of one of its packages (filelock), which, pip-installed with the
    constraints cleared, wins over the stack's copy; deactivate unloads and restores.

    Environment Modules uses the stack's own installed extend-venv-activate; Lmod the Lua
    modulefile and a tool rendered for Lmod's init, as a localhost-lmod install writes them."""
    require(mtool)
    if mtool is ENVIRONMENT_MODULES:
        tool = installed.prefix / "bin" / "extend-venv-activate"
    else:
        init = {sh: str(mtool.init(sh)) for sh in INIT_SHELLS if mtool.init(sh).is_file()}
        tool = render_tool(tmp_path / "tool", "pytorch/2.3.1-gpu", init)
    venv = tmp_path / "my venv"
    wheel = tiny_wheel(tmp_path, "filelock", "99.0")
    q = shlex.quote
    load = "module load pytorch/2.3.1-gpu || exit 1"
    proc = mtool.bash(f"""
    filter() {{ env | sort | grep -v -E '^({BOOKKEEPING}|_OLD_VIRTUAL_\\w*|_|OLDPWD)='; }}
    {load if when == "after" else ""}
    python3 -m venv {q(str(venv))} || exit 1
    {"module unload pytorch/2.3.1-gpu" if when == "after" else ""}
    {q(str(tool))} {q(str(venv))} || exit 1
    before=$(filter)
    source {q(str(venv / "bin" / "activate"))} || exit 1
    echo "LOADED=$LOADEDMODULES"
    echo "PY=$(command -v python)"
    pip install -q --no-index --no-deps --disable-pip-version-check {q(str(wheel))} >/dev/null 2>&1 \
      && echo CONSTRAINT=ignored || echo CONSTRAINT=held
    PIP_CONSTRAINT= pip install -q --no-index --no-deps --disable-pip-version-check {q(str(wheel))} || exit 1
    python -c 'import torch, horovod.torch, filelock; print("TORCH", torch.__version__, torch.__file__); print("FILELOCK", filelock.__version__, filelock.__file__)'
    deactivate
    echo "AFTER=$LOADEDMODULES"
    [ "$before" = "$(filter)" ] && echo RESTORED || diff <(echo "$before") <(filter)
    """, modulepath=installed.modulepath(mtool.syntax), timeout=600,
        # CPython's deactivate leaves PS1 set in a non-interactive bash: no prompt change
        env={"HOME": str(tmp_path), "VIRTUAL_ENV_DISABLE_PROMPT": "1"})
    out = proc.stdout
    assert re.search(r"^LOADED=python/3\.\d+:pytorch/2\.3\.1-gpu$", out, re.M), proc.stderr
    assert f"PY={venv}/bin/python\n" in out
    # through the stable prefix (PYTHONPATH; the installed tool of a stack from before the
    # venv's start-up file) or by the build's real path (the start-up file)
    prefixes = "|".join(map(re.escape, {str(installed.prefix), os.path.realpath(installed.prefix)}))
    assert re.search(rf"^TORCH 2\.3\.1\S* ({prefixes})/", out, re.M), out
    # the stack's constraints (PIP_CONSTRAINT) refuse another filelock; a user who
    # clears them on purpose gets theirs, and it wins over the stack's copy
    assert "CONSTRAINT=held" in out, out
    assert re.search(rf"^FILELOCK 99\.0 {re.escape(str(venv))}/lib/", out, re.M), out
    assert "AFTER=\n" in out and "RESTORED" in out, out


def count_file_calls(trace: Path) -> int:
    """The system calls of an ``strace -f -e trace=%file`` log."""
    return sum(1 for line in trace.read_text(errors="replace").splitlines()
               if re.match(r"^(?:\[pid\s+)?\d*\]?\s*\w+\(", line))


@pytest.mark.e2e
@pytest.mark.parametrize("mtool", tool_params())
def test_installed_stack_venv_imports_at_the_stacks_cost(mtool, installed, tmp_path):
    """On the real stack, a venv extended by this checkout's tool: the standard library first on
    the venv python's sys.path, then the venv, then the stack's site-packages by its real path;
    torch from the stack, the user's own package from the venv; and `import torch,
    horovod.torch` names files as often as the stack's own python does, within 1 %
    (benchmarks/venv_import.py measures the same; docs/benchmarks.md)."""
    require(mtool)
    if not shutil.which("strace"):
        pytest.skip("strace is missing (scripts/localhost-setup --with-test-tools installs it)")
    init = {sh: str(mtool.init(sh)) for sh in INIT_SHELLS if mtool.init(sh).is_file()}
    stack_python = installed.prefix / "venv" / "bin" / "python"
    tool = tmp_path / "tool" / "extend-venv-activate"
    tool.parent.mkdir()
    tool.write_text(render_extend_venv_activate("pytorch/2.3.1-gpu", init, str(stack_python)))
    tool.chmod(0o755)
    venv = tmp_path / "my venv"
    q = shlex.quote
    imp = "import torch, horovod.torch"
    probe = ("import json, os, sys, torch, mine; print('PROBE ' + json.dumps({'path': sys.path, "
             "'stdlib': os.path.dirname(os.__file__), 'torch': torch.__file__, 'mine': mine.__file__}))")
    proc = mtool.bash(f"""
    module load pytorch/2.3.1-gpu || exit 1
    python -m venv --without-pip {q(str(venv))} || exit 1
    python -c {q(imp)} || exit 1
    (cd / && strace -f -qq -e trace=%file -o {q(str(tmp_path / "stack.txt"))} python -c {q(imp)}) || exit 1
    module unload pytorch/2.3.1-gpu
    {q(str(tool))} {q(str(venv))} || exit 1
    echo "" > "$({q(str(venv / "bin" / "python"))} -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/mine.py"
    source {q(str(venv / "bin" / "activate"))} || exit 1
    python -c {q(imp)} || exit 1
    (cd / && strace -f -qq -e trace=%file -o {q(str(tmp_path / "venv.txt"))} python -c {q(imp)}) || exit 1
    python -c {q(probe)}
    deactivate
    """, modulepath=installed.modulepath(mtool.syntax), timeout=600,
        env={"HOME": str(tmp_path), "VIRTUAL_ENV_DISABLE_PROMPT": "1"})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(re.search(r"^PROBE (.*)$", proc.stdout, re.M).group(1))
    site = str(next(venv.glob("lib/python*/site-packages")))
    real = os.path.realpath(installed.prefix / "venv" / "lib" / f"python{installed.python_version}" / "site-packages")
    path = found["path"]
    end = stdlib_end(path, found["stdlib"])
    assert path[end:end + 2] == [site, real], path
    assert found["torch"].startswith(real + "/") and found["mine"] == os.path.join(site, "mine.py")
    stack_calls = count_file_calls(tmp_path / "stack.txt")
    venv_calls = count_file_calls(tmp_path / "venv.txt")
    assert venv_calls <= stack_calls * 1.01, (venv_calls, stack_calls)


# ---------------------------------------------------------------------------------------------
# Command line and rendering
# ---------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_help_explains_usage(tool, stack):
    text = run_tool(tool, "--help").stdout
    for needle in ("usage: extend-venv-activate", "--undo", MODULE, "PYTHONPATH", "deactivate",
                   "bash", "zsh", "fish", "csh", "# >>> hpcstack", "Environment Modules", "Lmod",
                   f"  bash: {stack.init['bash']}"):
        assert needle in text


@pytest.mark.integration
def test_not_a_venv_is_an_error(tool, tmp_path):
    proc = run_tool(tool, tmp_path, check=False)
    assert proc.returncode == 1
    assert "not found; is" in proc.stderr and "a venv?" in proc.stderr


@pytest.mark.integration
def test_rendered_script_is_standalone(tool):
    text = tool.read_text()
    assert text.startswith(f"#!{SYSTEM_PYTHON}\n")
    assert not re.search(r"^\s*(import|from)\s+(hpcstack|jinja2)", text, re.M)


@pytest.mark.parametrize("kwargs", [
    {"module_name": "bad name"},
    {"module_name": "x'; rm -rf /"},
    {"python": "python3"},
    {"python": "/opt/my python/bin/python"},
    {"module_init": {"bash": "relative/init"}},
])
def test_render_rejects_unsafe_values(kwargs):
    args = {"module_name": MODULE, "module_init": {"bash": "/x"}, "python": SYSTEM_PYTHON}
    with pytest.raises(ValueError):
        render_extend_venv_activate(**{**args, **kwargs})
