"""Jupyter kernels of installed stacks: ``hpcstack kernel install`` and ``hpcstack kernel remove``.

A kernel is a kernelspec directory (https://jupyter-client.readthedocs.io/en/stable/kernels.html,
"Kernel specs"): ``kernel.json`` and a launcher script. Jupyter (JupyterLab, JupyterHub, Open
OnDemand) runs ``kernel.json``'s ``argv``; the launcher, rendered from
``templates/jupyter-kernel.sh.j2``, sources the site's module tool init, loads the stack's module
(``module use`` of the site's directories first), optionally activates a user's venv extended with
``extend-venv-activate``, and ``exec``\\ s ``<python> -m ipykernel_launcher -f {connection_file}``
with the stack's interpreter (``<prefix>/venv/bin/python``), or the venv's, named by its path:
the kernel runs in the stack's own Python with its own ipykernel (from the recipe's lock),
whatever environment Jupyter itself runs in (an activated venv, the module already loaded). A module
that does not load ends the launcher at once with the tool's message on stderr, so Jupyter reports
a dead kernel instead of waiting for one.

Where kernelspecs go follows ``jupyter kernelspec install`` (jupyter_core's paths): the system
directory (``/usr/local/share/jupyter/kernels``) by default, ``--user`` the user's Jupyter data
directory (``~/.local/share/jupyter/kernels``, ``$JUPYTER_DATA_DIR``), ``--prefix DIR``
``DIR/share/jupyter/kernels`` (a JupyterHub's own environment, say).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpcstack import __version__, gate, trust
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.modules import writer
from hpcstack.modules.modsys import get_tool

#: Kernel names jupyter_client accepts (``jupyter_client.kernelspec._is_valid_kernel_name``).
KERNEL_NAME = re.compile(r"^[a-z0-9._-]+$", re.IGNORECASE)
LAUNCHER = "launch"
TEMPLATE = "templates/jupyter-kernel.sh.j2"


def kernels_dir(user: bool = False, prefix: str | None = None) -> Path:
    """The directory of kernelspecs, as ``jupyter kernelspec install`` picks it.

    Args:
        user (bool): the user's Jupyter data directory (``jupyter_core.paths.jupyter_data_dir``).
        prefix (str | None): ``<prefix>/share/jupyter/kernels`` (e.g. a JupyterHub's environment).

    Returns:
        Path: ``…/kernels``; by default the first system directory
        (``jupyter_core.paths.SYSTEM_JUPYTER_PATH``, ``/usr/local/share/jupyter`` on Linux).
    """
    from jupyter_core.paths import SYSTEM_JUPYTER_PATH, jupyter_data_dir

    if prefix:
        return Path(os.path.abspath(prefix)) / "share" / "jupyter" / "kernels"
    if user:
        return Path(jupyter_data_dir()) / "kernels"
    return Path(SYSTEM_JUPYTER_PATH[0]) / "kernels"


#: The largest record of a loaded stack read to tell its site (:func:`recorded_site`).
MAX_RECORD = 1 << 20


def recorded_site(variable: str, root: str, version: str, known_sites: list[str],
                  pol: "trust.Policy") -> tuple[str, dict] | None:
    """The site a loaded stack's install recorded, for ``hpcstack kernel`` without ``--site``:
    ``<root>/.hpcstack/provenance.json`` names the site, ``<root>/.hpcstack/site.json`` the
    install and module roots it used, where ``root`` is the stack's prefix as the environment
    names it (``HPCSTACK_<NAME>_ROOT``, set by its module).

    The environment is the caller's: whoever set it chooses these files, and what they say
    decides the module root that the kernel's launcher loads modules from, in everyone who starts
    it. So each file, and every directory above it as named and with its links resolved (the
    prefix is a link to the build), must pass the trust rule of ``pol``
    (:func:`hpcstack.trust.path_problem`) before it is read, and it is read through the gate
    (:func:`hpcstack.gate.read_file` on the resolved path: no link followed, a regular file of at
    most :data:`MAX_RECORD` bytes). Run by a user on their own stack (or root's), the rule
    trusts the user: the records are read.

    Args:
        variable (str): the variable's name, for messages (``HPCSTACK_PYTORCH_ROOT``).
        root (str): its value.
        version (str): the stack's version (the prefix's last component must be it).
        known_sites (list[str]): the sites of the search path; a recorded name among them is
            returned as the name, any other as the recorded file.
        pol (hpcstack.trust.Policy): the command's policy.

    Returns:
        tuple[str, dict] | None: the site (name or file) and ``load_site`` keyword overrides
        (``install_root``, ``module_root``); None when ``root`` is not an absolute prefix of that
        version or its records are missing or not what hpcstack writes (the caller infers the site
        otherwise).

    Raises:
        ConfigError: a record, or a directory above it, that an account ``pol`` does not trust
            can change, or a link that appeared on its resolved path (one line naming the
            variable, the path and whose it is; exit status 2).
    """
    if not root or not os.path.isabs(root) or os.path.basename(os.path.normpath(root)) != version:
        return None
    state = os.path.join(os.path.normpath(root), ".hpcstack")
    docs = []
    for name in ("provenance.json", "site.json"):
        path = os.path.join(state, name)
        if not os.path.lexists(path):
            return None
        problem = None if pol.trust_writable else trust.path_problem(path, pol)
        try:
            if problem:
                raise gate.GateError(path, problem)
            docs.append(json.loads(gate.read_file(os.path.realpath(path), MAX_RECORD, pol)))
        except gate.GateError as exc:
            raise ConfigError([f"{variable}={root}: {exc}; hpcstack reads the site that a loaded stack recorded "
                               f"only where {pol.who()} alone can change it (a kernel loads modules from the "
                               f"module root it names): give --site, or pass {trust.OVERRIDE}"]) from None
        except (OSError, ValueError, RecursionError):
            return None
    recorded, used = docs
    try:
        site = recorded["site"]
        name = site["name"] if site["name"] in known_sites else site["file"]
        roots = {key: used.get(key) for key in ("install_root", "module_root")}
    except (KeyError, TypeError, AttributeError):
        return None
    if not isinstance(name, str) or not all(v is None or isinstance(v, str) for v in roots.values()):
        return None
    return name, roots


def default_kernel_name(recipe_name: str, version: str) -> str:
    """``pytorch-2.3.1-gpu`` for ``pytorch/2.3.1-gpu`` (a kernel name has no ``/``)."""
    return f"{recipe_name}-{version}".lower()


@dataclass(frozen=True)
class KernelSpec:
    """One kernel of a stack: where it goes and what its files say.

    Attributes:
        name (str): the kernel's name (its directory), e.g. ``pytorch-2.3.1-gpu``.
        directory (Path): ``<kernels dir>/<name>``.
        display_name (str): what Jupyter's launcher shows: the recipe's whatis (and the venv).
        kernel_json (dict): the ``kernel.json`` content.
        launcher (str): the launcher script's text.
    """

    name: str
    directory: Path
    display_name: str
    kernel_json: dict
    launcher: str


def make_kernel(site, recipe, *, name: str | None = None, user: bool = False, prefix: str | None = None,
                venv: str | None = None, command: str = "") -> KernelSpec:
    """Build (without writing) the kernelspec of an installed stack.

    Args:
        site (hpcstack.site.Site): the site: its module tool, init script, ``modules.use`` and
            module root.
        recipe (hpcstack.recipe.Recipe): the stack's recipe (name, version, whatis).
        name (str | None): the kernel's name; default ``<name>-<version>``.
        user (bool), prefix (str | None): where it goes (:func:`kernels_dir`).
        venv (str | None): a user's venv extended with ``extend-venv-activate`` to activate after
            the module is loaded.
        command (str): the command line that wrote it (recorded in the launcher).

    Returns:
        KernelSpec: what :func:`install_kernel` writes.

    Raises:
        ConfigError: a bad kernel name, no bash init script for the site's module tool, the
            stack's modulefile missing (not installed), or a venv that does not exist or was not
            extended with ``extend-venv-activate`` (one line each, exit status 2).
    """
    problems = []
    kernel_name = name or default_kernel_name(recipe.name, recipe.version)
    if not KERNEL_NAME.match(kernel_name):
        problems.append(f"--name {kernel_name!r}: a kernel name has only letters, digits and ._- "
                        "(jupyter_client's rule)")
    init = site.modules.init.get("bash")
    if not init:
        problems.append(f"{site.path}: modules.init.bash: missing key (the kernel's launcher sources it "
                        "to get `module`)")
    modulefile = writer.modulefile_path(site.module_root, recipe.name, recipe.version, site.modules.syntax)
    if not os.path.isfile(modulefile):
        problems.append(f"{recipe.full_name} is not installed for site {site.name} (no modulefile "
                        f"{modulefile}): hpcstack install {recipe.full_name} --site {site.ref} first")
    venv_dir = None
    if venv is not None:
        venv_dir = os.path.abspath(os.path.expanduser(venv))
        activate = Path(venv_dir) / "bin" / "activate"
        if not activate.is_file():
            problems.append(f"--venv {venv}: no {activate} (make it with python -m venv, then "
                            "extend-venv-activate)")
        elif f"# >>> hpcstack {recipe.full_name} >>>" not in activate.read_text(errors="replace"):
            problems.append(f"--venv {venv}: not extended for {recipe.full_name}: run `module load "
                            f"{recipe.full_name} && extend-venv-activate {venv}` first")
    if problems:
        raise ConfigError(problems)
    tool = get_tool(site.modules.tool)
    # the stack's stable prefix, as hpcstack.install.layout.StackLayout names it
    stack_python = os.path.join(site.install_root, recipe.name, recipe.version, "venv", "bin", "python")
    python = os.path.join(venv_dir, "bin", "python") if venv_dir else stack_python
    display = recipe.whatis + (f" (venv {venv_dir})" if venv_dir else "")
    directory = kernels_dir(user, prefix) / kernel_name
    from hpcstack.templates import render

    launcher = render(
        TEMPLATE, kernel_name=kernel_name, display_name=display, hpcstack_version=__version__,
        command=command or f"hpcstack kernel install {recipe.full_name} --site {site.ref}",
        module=recipe.full_name, tool_title=tool.title, module_init=init,
        unset_bash_env=tool.job_unsets_bash_env, module_use=list(site.modules.use),
        # the site's profiles and module hierarchy (which may reset MODULEPATH), then the stack's module root
        module_preloads=site.modules.preloads, module_use_after=[site.module_root],
        venv=venv_dir, python=python)
    kernel_json = {
        "argv": ["/bin/bash", str(directory / LAUNCHER), "{connection_file}"],
        "display_name": display,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": True,
                     "hpcstack": {"recipe": recipe.full_name, "site": site.name, "module": recipe.full_name,
                                  "module_tool": site.modules.tool, "venv": venv_dir,
                                  "version": __version__}},
    }
    return KernelSpec(kernel_name, directory, display, kernel_json, launcher)


def _written_by_hpcstack(directory: Path) -> bool:
    try:
        data = json.loads((directory / "kernel.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "hpcstack" in (data.get("metadata") or {})


def install_kernel(spec: KernelSpec) -> Path:
    """Write the kernelspec directory: built in a temporary directory beside it, then renamed into
    place, so Jupyter sees the old kernel or the new one, never half of one.

    Args:
        spec (KernelSpec): from :func:`make_kernel`.

    Returns:
        Path: the kernel's directory.

    Raises:
        ConfigError: a kernel of that name exists and was not written by hpcstack (exit 2).
        OSError: the kernels directory cannot be written (e.g. the system one without root: use
            ``--user`` or ``--prefix``).
    """
    target = spec.directory
    if target.exists() and not _written_by_hpcstack(target):
        raise ConfigError([f"{target}: a kernel that hpcstack did not write; remove it with "
                           f"`jupyter kernelspec remove {spec.name}`, or give --name"])
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{spec.name}."))
    try:
        (tmp / "kernel.json").write_text(json.dumps(spec.kernel_json, indent=1) + "\n")
        (tmp / LAUNCHER).write_text(spec.launcher)
        (tmp / LAUNCHER).chmod(0o755)
        (tmp / "kernel.json").chmod(0o644)
        tmp.chmod(0o755)
        old = None
        if target.exists():
            old = target.parent / f".{spec.name}.old-{os.getpid()}"
            os.rename(target, old)
        os.rename(tmp, target)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def remove_kernel(name: str, user: bool = False, prefix: str | None = None) -> Path:
    """Remove a kernel that :func:`install_kernel` wrote.

    Args:
        name (str): the kernel's name.
        user (bool), prefix (str | None): where it is (:func:`kernels_dir`).

    Returns:
        Path: the directory removed.

    Raises:
        HpcstackError: no such kernel there (exit 1).
        ConfigError: the kernel was not written by hpcstack (exit 2; ``jupyter kernelspec
            remove`` removes any).
    """
    target = kernels_dir(user, prefix) / name
    if not target.is_dir():
        raise HpcstackError(f"no kernel {name!r} in {target.parent}")
    if not _written_by_hpcstack(target):
        raise ConfigError([f"{target}: a kernel that hpcstack did not write; "
                           f"`jupyter kernelspec remove {name}` removes it"])
    trash = target.parent / f".{name}.removed-{os.getpid()}"
    os.rename(target, trash)
    shutil.rmtree(trash)
    return target
