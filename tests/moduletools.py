"""The two real module tools, as the tests drive them: Environment Modules (Tcl) and Lmod (Lua).

Tests that run under both tools take a :class:`ModuleTool` from :func:`tool_params` and skip, with
the reason, when that tool is missing here (``scripts/localhost-setup --with-test-tools`` installs
both: Environment Modules from apt, Lmod unpacked next to it).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import STACK_TOP

BASE_PATH = "/usr/bin:/bin"
#: Variables the tools keep for their own bookkeeping; they may differ before load / after unload
#: (Lmod 8.6 leaves ``_ModuleTable*`` and ``__LMOD_REF_COUNT_*`` behind after unload).
BOOKKEEPING = (r"LOADEDMODULES|_LMFILES_|MODULES_LM\w*|__MODULES_\w*|_ModuleTable\w*"
               r"|__LMOD_REF_COUNT_\w*|__LMOD_STACK_\w*|LMOD_FAMILY_\w*|LMOD_\w*_FAMILY\w*")


@dataclass(frozen=True)
class ModuleTool:
    """One module tool: where its init scripts are and which modulefile syntax the tests write.

    Attributes:
        name (str): ``environment-modules`` or ``lmod`` (the site config's ``modules.tool``).
        syntax (str): ``tcl`` or ``lua``: the syntax hpcstack writes for a site running it.
        init_dir (Path): directory of the per-shell init scripts (``bash``, ``zsh``, ``sh``, …).
        command (Path): the tool's command for python mode (hpcstack.modules.modsys).
    """

    name: str
    syntax: str
    init_dir: Path
    command: Path

    @property
    def short(self) -> str:
        """``modules`` or ``lmod``: a short test id."""
        return "lmod" if self.name == "lmod" else "modules"

    def init(self, shell: str) -> Path:
        """The init script for ``shell`` (``bash``, ``zsh``, ``sh``, ``fish``, ``csh``)."""
        return self.init_dir / shell

    def missing(self) -> str | None:
        """Why this tool cannot be used here, or None."""
        if not self.init("bash").is_file():
            return f"{self.name} is not installed ({self.init('bash')} missing; run scripts/localhost-setup --with-test-tools)"
        probe = self.bash("module --version", env={})
        if probe.returncode != 0:
            return f"`module --version` fails under {self.name}: {probe.stderr.strip()[:200]}"
        return None

    def bash(self, script: str, env: dict[str, str] | None = None, modulepath: str | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
        """Run ``script`` in a bash with this tool initialised and nothing inherited.

        Args:
            script (str): bash code run after ``source <init>/bash``.
            env (dict[str, str] | None): extra variables (PATH and HOME are set, BASH_ENV never).
            modulepath (str | None): MODULEPATH to start with.
            timeout (float): seconds.
        """
        full = {"PATH": BASE_PATH, "HOME": "/tmp", "LC_ALL": "C.UTF-8", **(env or {})}
        if modulepath is not None:
            full["MODULEPATH"] = modulepath
        return subprocess.run(["bash", "--norc", "--noprofile", "-c",
                               f"source {self.init('bash')}\n{script}"],
                              capture_output=True, text=True, env=full, timeout=timeout)

    def write_module(self, root: Path, name: str, *, setenv: dict[str, str] | None = None,
                     prepend: dict[str, str] | None = None, whatis: str | None = None,
                     depends_on: tuple[str, ...] = ()) -> Path:
        """Write a small modulefile ``root/name`` in this tool's syntax (``.lua`` added for Lua)."""
        setenv, prepend = setenv or {}, prepend or {}
        if self.syntax == "lua":
            lines = [f'whatis("{whatis}")'] if whatis else []
            lines += [f'depends_on("{d}")' for d in depends_on]
            lines += [f'prepend_path("{k}", "{v}")' for k, v in prepend.items()]
            lines += [f'setenv("{k}", "{v}")' for k, v in setenv.items()]
            path = root / f"{name}.lua"
        else:
            lines = ["#%Module"] + ([f"module-whatis {{{whatis}}}"] if whatis else [])
            lines += [f"depends-on {d}" for d in depends_on]
            lines += [f"prepend-path {k} {{{v}}}" for k, v in prepend.items()]
            lines += [f"setenv {k} {{{v}}}" for k, v in setenv.items()]
            path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        return path


ENVIRONMENT_MODULES = ModuleTool("environment-modules", "tcl", Path("/usr/share/modules/init"),
                                 Path("/usr/lib/x86_64-linux-gnu/modulecmd.tcl"))
LMOD = ModuleTool("lmod", "lua", Path("/usr/share/lmod/lmod/init"),
                  Path("/usr/share/lmod/lmod/libexec/lmod"))
TOOLS = (ENVIRONMENT_MODULES, LMOD)


def tool_params() -> list:
    """``pytest.param`` per tool, with ids ``modules`` and ``lmod``."""
    return [pytest.param(t, id=t.short) for t in TOOLS]


def require(tool: ModuleTool) -> None:
    """Skip the calling test (with the reason) when ``tool`` is missing."""
    reason = _missing_cached(tool)
    if reason:
        pytest.skip(reason)


_CACHE: dict[str, str | None] = {}


def _missing_cached(tool: ModuleTool) -> str | None:
    if tool.name not in _CACHE:
        _CACHE[tool.name] = tool.missing()
    return _CACHE[tool.name]


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment for hpcstack's python-mode calls (no inherited module state).

    PATH is :data:`BASE_PATH`: Lmod removes duplicate entries from a path it changes, so a PATH
    with duplicates (as a login shell may have) would not come back byte for byte after unload.
    """
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "USER")}
    env["PATH"] = BASE_PATH
    env.update(extra)
    return env


# ------------------------------------------------------------------------- the installed stack

#: Where the installed pytorch/2.3.1-gpu is: the README's main command's (the ``installed_stack``
#: fixture of tests/conftest.py makes sure it is there).
INSTALL_TOPS = (STACK_TOP,)
BASE_MODULES = Path("/opt/hpcstack/base-modulefiles")


@dataclass(frozen=True)
class InstalledStack:
    """An installed ``pytorch/2.3.1-gpu`` (used read only) and a module root per syntax.

    Attributes:
        prefix (Path): the stack's prefix.
        python_version (str): ``X.Y`` of its venv.
        roots (dict[str, Path]): syntax -> module root with ``pytorch/2.3.1-gpu`` in that syntax
            (``tcl``: the install's own; ``lua``: rendered as a localhost-lmod install writes it).
    """

    prefix: Path
    python_version: str
    roots: dict

    def modulepath(self, syntax: str) -> str:
        """MODULEPATH for loading the stack's module of ``syntax`` (with the base python module)."""
        return f"{self.roots[syntax]}:{BASE_MODULES}"


def find_installed_stack(lua_root: Path) -> "InstalledStack | str":
    """Return the installed stack, with its Lua modulefile rendered into ``lua_root``, or the
    reason there is none (for ``pytest.skip``). The prefix is not touched."""
    from hpcstack.install.components.modulefile import render_for_prefix
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    for top in INSTALL_TOPS:
        prefix = top / "software" / "pytorch" / "2.3.1-gpu"
        if (top / "modulefiles" / "pytorch" / "2.3.1-gpu").is_file() and (prefix / "venv" / "bin" / "python").exists():
            break
    else:
        return (f"no installed pytorch/2.3.1-gpu in {' or '.join(map(str, INSTALL_TOPS))} "
                "(the installed_stack fixture installs it)")
    version = next((prefix / "venv" / "lib").glob("python3.*")).name[len("python"):]
    site = load_site("localhost-lmod", install_root=str(top / "software"))
    text = render_for_prefix(site, load_recipe("pytorch/2.3.1-gpu", site), str(prefix), version, "lua")
    (lua_root / "pytorch").mkdir(parents=True, exist_ok=True)
    (lua_root / "pytorch" / "2.3.1-gpu.lua").write_text(text)
    return InstalledStack(prefix, version, {"tcl": top / "modulefiles", "lua": lua_root})
