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
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from hpcstack.errors import HpcstackError

#: Where the distributions put the tools when ``$MODULES_CMD`` / ``$LMOD_CMD`` are not set.
_DEFAULT_COMMANDS = {
    "environment-modules": ["/usr/share/modules/libexec/modulecmd.tcl",
                            "/usr/share/Modules/libexec/modulecmd.tcl",
                            "/usr/lib/x86_64-linux-gnu/modulecmd.tcl"],
    "lmod": ["/usr/share/lmod/lmod/libexec/lmod", "/opt/apps/lmod/lmod/libexec/lmod"],
}
_ENV_VAR = {"environment-modules": "MODULES_CMD", "lmod": "LMOD_CMD"}


class _EnvProxy(dict):
    """A dict standing in for ``os.environ`` while the tool's python code runs."""


class _OsProxy:
    def __init__(self, env: dict[str, str]):
        self.environ = _EnvProxy(env)

    def __getattr__(self, name):  # chdir, putenv, ... are not needed for load/unload/use
        return getattr(os, name)


def find_command(tool: str, configured: str | None = None, env: dict[str, str] | None = None) -> str:
    """Return the path of the module tool's command.

    Args:
        tool (str): ``environment-modules`` or ``lmod``.
        configured (str | None): the site's ``modules.command``, if any.
        env (dict[str, str] | None): environment to read ``$MODULES_CMD`` / ``$LMOD_CMD`` from.

    Raises:
        HpcstackError: the tool cannot be found (says what to install or configure).
    """
    env = os.environ if env is None else env
    candidates = [configured] if configured else [env.get(_ENV_VAR[tool], "")] + _DEFAULT_COMMANDS[tool]
    for c in candidates:
        if c and os.access(c, os.X_OK) or (c and c.endswith(".tcl") and os.path.isfile(c)):
            return c
    raise HpcstackError(f"cannot find the {tool} command (tried {', '.join(c for c in candidates if c)}); "
                        "install it or set modules.command in the site config")


def module_env(tool: str, command: str, args: list[str], env: dict[str, str]) -> dict[str, str]:
    """Run ``<command> python <args>`` and return the environment it produces.

    Args:
        tool (str): ``environment-modules`` or ``lmod``.
        command (str): path from :func:`find_command`.
        args (list[str]): e.g. ``["load", "python/3.12.1-gpu"]`` or ``["use", "/dir"]``.
        env (dict[str, str]): the environment to start from (not modified).

    Returns:
        dict[str, str]: the new environment.

    Raises:
        HpcstackError: the tool reports an error (e.g. an unknown module); its message is shown.
    """
    argv = ([shutil.which("tclsh") or "tclsh", command] if command.endswith(".tcl") else [command])
    argv += ["python", *args]
    try:
        proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise HpcstackError(f"cannot run the module tool {argv[0]}: {exc.strerror}")
    ns = {"os": _OsProxy(dict(env))}
    code = proc.stdout.replace("import os\n", "")
    try:
        exec(compile(code, f"<{tool} python>", "exec"), ns)
    except Exception as exc:  # the tool printed something that is not the python we expect
        raise HpcstackError(f"module {' '.join(args)}: unexpected output from {tool}: {exc}")
    failed = proc.returncode != 0 or ns.get("_mlstatus") is False or "ERROR" in proc.stderr
    if failed:
        msg = " ".join(line.strip() for line in proc.stderr.splitlines() if line.strip())
        raise HpcstackError(f"module {' '.join(args)} failed: {msg or 'no message'} "
                            "(check the module name and MODULEPATH in the site config)")
    return dict(ns["os"].environ)


def build_environment(tool: str, command: str | None, use: list[str], modules: list[str],
                      env: dict[str, str] | None = None) -> dict[str, str]:
    """Return ``env`` with ``use`` directories added to MODULEPATH and ``modules`` loaded, in order.

    Args:
        tool (str): ``environment-modules`` or ``lmod``.
        command (str | None): configured tool path or None (see :func:`find_command`).
        use (list[str]): module directories.
        modules (list[str]): modules to load (base first).
        env (dict[str, str] | None): starting environment; default ``os.environ``.

    Raises:
        HpcstackError: tool missing, a directory missing, or a module that does not load.
    """
    env = dict(os.environ if env is None else env)
    cmd = find_command(tool, command, env)
    for d in use:
        if not Path(d).is_dir():
            raise HpcstackError(f"module directory {d} does not exist (modules.use in the site config)")
        env = module_env(tool, cmd, ["use", d], env)
    for m in modules:
        env = module_env(tool, cmd, ["load", m], env)
    return env
