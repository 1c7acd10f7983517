"""Drive the site's real module tool in its python mode to build an environment.

Environment Modules (4.x/5.x): ``modulecmd.tcl python load NAME``; Lmod (8.x):
``$LMOD_CMD python load NAME``. Both print Python code that sets ``os.environ`` entries and
``_mlstatus`` (False when the command failed); we run that code against a copy of the
environment instead of our own, in the manner of ReFrame's ``modules.py`` backends
(https://reframe-hpc.readthedocs.io/, "Module systems").

Checked with Environment Modules 5.2 and Lmod 8.6 (Debian 12) by tests/test_modsys.py: ``use``,
``load`` with ``depends-on``/``depends_on``, ``unload`` back to the start (modulo the tools'
bookkeeping variables), Lmod reading a Tcl base module under a Lua one, and errors. Lmod drops
duplicate entries from a path variable it changes (Environment Modules keeps them).

One class per tool (:class:`EnvironmentModules`, :class:`Lmod`), as EasyBuild's ``ModulesTool``
subclasses: each carries, as class constants, its command's variable and usual paths, the
modulefile syntaxes it reads, and the files through which it takes a module's default version.
A new tool is one class here, decorated with :func:`register_tool`; the site schema's
``modules.tool`` enum (and which ``modules.syntax`` goes with it) comes from :data:`TOOLS`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

from hpcstack.fsutil import CHILD_CWD
from hpcstack.registry import Registry
from hpcstack.errors import HpcstackError


class _EnvProxy(dict):
    """A dict standing in for ``os.environ`` while the tool's python code runs."""


class _OsProxy:
    def __init__(self, env: dict[str, str]):
        self.environ = _EnvProxy(env)

    def __getattr__(self, name):  # chdir, putenv, ... are not needed for load/unload/use
        return getattr(os, name)


#: Registered module tools, by the name a site config gives in ``modules.tool``.
TOOLS = Registry("module tool")


def register_tool(cls: type["ModuleTool"]) -> type["ModuleTool"]:
    """Class decorator: add a module tool to :data:`TOOLS` under its ``name``.

    Raises:
        ValueError: the name is taken.
    """
    return TOOLS.add(cls.name, cls)


def get_tool(name: str) -> "ModuleTool":
    """Return (an instance of) the module tool called ``name``.

    Raises:
        ValueError: no such tool (the known ones are listed).
    """
    return TOOLS.lookup(name)()


def default_sources() -> tuple[str, ...]:
    """Every file name in ``<module root>/<name>/`` through which some registered tool may take
    the module's default version (a tree may be shared by several tools)."""
    return tuple(dict.fromkeys(f for cls in TOOLS.values() for f in cls.default_sources))


class ModuleTool:
    """A module tool driven in its python mode (subclasses set the class constants).

    Attributes:
        name (str): the site config's ``modules.tool``, e.g. ``"lmod"``.
        title (str): its name in messages, e.g. ``"Lmod"``.
        command_variable (str): the variable that names its command (``$LMOD_CMD``).
        default_commands (tuple[str, ...]): where distributions put the command.
        syntaxes (tuple[str, ...]): the modulefile syntaxes it reads
            (:data:`hpcstack.modules.syntax.SYNTAXES` names).
        default_sources (tuple[str, ...]): files (or links) in ``<module root>/<name>/`` through
            which it takes the default version, in the order it reads them.
        job_unsets_bash_env (bool): Slurm job scripts ``unset BASH_ENV`` before sourcing its init,
            so that a site's Lmod ``BASH_ENV`` does not replace this tool in child shells.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    command_variable: ClassVar[str]
    default_commands: ClassVar[tuple[str, ...]]
    syntaxes: ClassVar[tuple[str, ...]]
    default_sources: ClassVar[tuple[str, ...]]
    job_unsets_bash_env: ClassVar[bool] = False

    def find_command(self, configured: str | None = None, env: dict[str, str] | None = None) -> str:
        """Return the path of the tool's command.

        Args:
            configured (str | None): the site's ``modules.command``, if any (then only it is tried).
            env (dict[str, str] | None): environment to read :attr:`command_variable` from;
                default ``os.environ``.

        Raises:
            HpcstackError: the command cannot be found (says what to install or configure).
        """
        env = os.environ if env is None else env
        candidates = [configured] if configured else [env.get(self.command_variable, ""), *self.default_commands]
        for c in candidates:
            if c and os.access(c, os.X_OK) or (c and c.endswith(".tcl") and os.path.isfile(c)):
                return c
        raise HpcstackError(f"cannot find the {self.name} command (tried {', '.join(c for c in candidates if c)}); "
                            "install it or set modules.command in the site config")

    def argv(self, command: str, args: list[str]) -> list[str]:
        """The command line that runs ``<command> python <args>`` (a ``.tcl`` command under tclsh)."""
        prog = [shutil.which("tclsh") or "tclsh", command] if command.endswith(".tcl") else [command]
        return [*prog, "python", *args]

    def run(self, command: str, args: list[str], env: dict[str, str]) -> dict[str, str]:
        """Run ``<command> python <args>`` and return the environment it produces.

        Args:
            command (str): path from :meth:`find_command`.
            args (list[str]): e.g. ``["load", "python/3.12.1-gpu"]`` or ``["use", "/dir"]``.
            env (dict[str, str]): the environment to start from (not modified).

        Returns:
            dict[str, str]: the new environment.

        Raises:
            HpcstackError: the tool reports an error (e.g. an unknown module); its message is shown.
        """
        argv = self.argv(command, args)
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=CHILD_CWD)
        except FileNotFoundError as exc:
            raise HpcstackError(f"cannot run the module tool {argv[0]}: {exc.strerror}")
        ns = {"os": _OsProxy(dict(env))}
        code = proc.stdout.replace("import os\n", "")
        try:
            exec(compile(code, f"<{self.name} python>", "exec"), ns)
        except Exception as exc:  # the tool printed something that is not the python we expect
            raise HpcstackError(f"module {' '.join(args)}: unexpected output from {self.name}: {exc}")
        failed = proc.returncode != 0 or ns.get("_mlstatus") is False or "ERROR" in proc.stderr
        if failed:
            msg = " ".join(line.strip() for line in proc.stderr.splitlines() if line.strip())
            raise HpcstackError(f"module {' '.join(args)} failed: {msg or 'no message'} "
                                "(check the module name and MODULEPATH in the site config)")
        return dict(ns["os"].environ)


@register_tool
class EnvironmentModules(ModuleTool):
    """Environment Modules 4.x/5.x (``modulecmd.tcl``): reads Tcl modulefiles, and a module's
    default from ``.modulerc`` or ``.version`` (https://modules.readthedocs.io/, "modulefile")."""

    name = "environment-modules"
    title = "Environment Modules"
    command_variable = "MODULES_CMD"
    default_commands = ("/usr/share/modules/libexec/modulecmd.tcl",
                        "/usr/share/Modules/libexec/modulecmd.tcl",
                        "/usr/lib/x86_64-linux-gnu/modulecmd.tcl")
    syntaxes = ("tcl",)
    default_sources = (".modulerc", ".version")
    job_unsets_bash_env = True


@register_tool
class Lmod(ModuleTool):
    """Lmod 8.x (``$LMOD_CMD``): reads Lua and Tcl modulefiles, and a module's default from
    ``.modulerc.lua``, ``.modulerc``, ``.version`` or a ``default`` link, the first that names one
    (https://lmod.readthedocs.io/, "How Lmod Picks which Modulefiles to Load")."""

    name = "lmod"
    title = "Lmod"
    command_variable = "LMOD_CMD"
    default_commands = ("/usr/share/lmod/lmod/libexec/lmod", "/opt/apps/lmod/lmod/libexec/lmod")
    syntaxes = ("lua", "tcl")
    default_sources = (".modulerc.lua", ".modulerc", ".version", "default")


# -------------------------------------------------------------- by name (the site's modules.tool)

def find_command(tool: str, configured: str | None = None, env: dict[str, str] | None = None) -> str:
    """Return the path of the module tool's command (:meth:`ModuleTool.find_command`).

    Args:
        tool (str): a :data:`TOOLS` name, ``environment-modules`` or ``lmod``.
        configured (str | None): the site's ``modules.command``, if any.
        env (dict[str, str] | None): environment to read ``$MODULES_CMD`` / ``$LMOD_CMD`` from.

    Raises:
        HpcstackError: the tool cannot be found (says what to install or configure).
        ValueError: an unknown tool.
    """
    return get_tool(tool).find_command(configured, env)


def module_env(tool: str, command: str, args: list[str], env: dict[str, str]) -> dict[str, str]:
    """Run ``<command> python <args>`` and return the environment it produces (:meth:`ModuleTool.run`).

    Args:
        tool (str): a :data:`TOOLS` name.
        command (str): path from :func:`find_command`.
        args (list[str]): e.g. ``["load", "python/3.12.1-gpu"]`` or ``["use", "/dir"]``.
        env (dict[str, str]): the environment to start from (not modified).

    Raises:
        HpcstackError: the tool reports an error (e.g. an unknown module); its message is shown.
        ValueError: an unknown tool.
    """
    return get_tool(tool).run(command, args, env)


def build_environment(tool: str, command: str | None, use: list[str], modules: list[str],
                      env: dict[str, str] | None = None) -> dict[str, str]:
    """Return ``env`` with ``use`` directories added to MODULEPATH and ``modules`` loaded, in order.

    Args:
        tool (str): a :data:`TOOLS` name, ``environment-modules`` or ``lmod``.
        command (str | None): configured tool path or None (see :func:`find_command`).
        use (list[str]): module directories.
        modules (list[str]): modules to load (base first).
        env (dict[str, str] | None): starting environment; default ``os.environ``.

    Raises:
        HpcstackError: tool missing, a directory missing, or a module that does not load.
        ValueError: an unknown tool.
    """
    mtool = get_tool(tool)
    env = dict(os.environ if env is None else env)
    cmd = mtool.find_command(command, env)
    for d in use:
        if not Path(d).is_dir():
            raise HpcstackError(f"module directory {d} does not exist (modules.use in the site config)")
        env = mtool.run(cmd, ["use", d], env)
    for m in modules:
        env = mtool.run(cmd, ["load", m], env)
    return env
