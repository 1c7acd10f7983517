"""Modulefiles: layout, context and writer, in the manner of Spack's ``modules/common.py``.

- configuration: the site's ``modules`` section (tool, syntax, base/runtime modules);
- layout: the projection ``{name}/{version}`` gives the file under the module root, named by
  the syntax (``.lua`` appended for Lua: :attr:`hpcstack.modules.syntax.ModuleSyntax.suffix`);
- context: :class:`ModuleContext`, exactly the variables a template sees, nothing more; the
  environment it sets is a list of typed changes (:mod:`hpcstack.modules.envchange`) that
  components contribute;
- writer: :func:`render_modulefile` renders the syntax's template (``modulefiles/modulefile.<syntax>.j2``,
  :mod:`hpcstack.modules.syntax`) with the package's jinja2 environment (:mod:`hpcstack.templates`);
  the install writes it atomically, as its last step.
- defaults: :func:`set_default` writes the file that makes ``module load <name>`` pick a version
  (the syntax's :attr:`~hpcstack.modules.syntax.ModuleSyntax.default_file`: ``.version`` for Tcl
  sites, ``.modulerc.lua`` for Lua sites); :class:`WriteDefault` is the install's action that
  writes one when none exists yet.

Templates of both syntaxes share the block names ``header``, ``whatis``, ``autoloads``, ``checks``,
``environment`` and ``footer``, so a template that ``{% extends %}`` ours can replace one block.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

from hpcstack import __version__
from hpcstack.errors import HpcstackError
from hpcstack.fsutil import write_atomic
from hpcstack.modules import modsys
from hpcstack.modules.envchange import EnvChange, PrependPath, check_changes
from hpcstack.modules.syntax import SYNTAXES, get_syntax

PROJECTION = "{name}/{version}"


def modulefile_path(module_root: str, name: str, version: str, syntax: str) -> str:
    """Return the modulefile's path under ``module_root`` (projection ``{name}/{version}``).

    Args:
        module_root (str): a MODULEPATH directory.
        name (str), version (str): e.g. ``"pytorch"``, ``"2.3.1-gpu"``.
        syntax (str): a :data:`~hpcstack.modules.syntax.SYNTAXES` name: ``tcl`` (no suffix) or
            ``lua`` (``.lua``).

    Raises:
        ValueError: unknown syntax.
    """
    rel = PROJECTION.format(name=name, version=version)
    return os.path.join(module_root, get_syntax(syntax).filename(rel))


def root_variable(name: str) -> str:
    """Return the stack's root variable, e.g. ``HPCSTACK_PYTORCH_ROOT`` for ``pytorch``."""
    return "HPCSTACK_" + "".join(c if c.isalnum() else "_" for c in name.upper()) + "_ROOT"


#: The status file in the module root that a modulefile reads on load: one line per DEGRADED or
#: FAILED stack (:mod:`hpcstack.validate.statusfile` writes it).
STATUS_FILE = ".hpcstack-status.json"


@dataclass(frozen=True)
class ModuleContext:
    """The variables a modulefile template may use.

    Attributes:
        name, version (str): module name and version (``pytorch``, ``2.3.1-gpu``).
        whatis (str): one line for ``module-whatis`` / ``whatis``.
        help_lines (list[str]): text of ``ModulesHelp`` / ``help``.
        prefix (str): the stack's prefix.
        root_variable (str): variable set to the prefix (see :func:`root_variable`).
        depends_on (list[str]): modules to ``depends-on`` (base Python first).
        path_prepend (list[str]): directories prepended to PATH (first listed ends up first).
        pythonpath_prepend (list[str]): directories prepended to PYTHONPATH.
        environment (tuple[EnvChange, ...]): further changes, in order (what the recipe's
            components return from ``module_environment``).
        recipe, site (str): where the modulefile came from.
        hpcstack_version (str): the writer's version.
        load_requires (str): a file that must exist for the module to load (``""``: none); on a
            ``layout: squashfs`` site the venv's ``pyvenv.cfg``, present only where the image is
            mounted (:func:`hpcstack.install.image.module_check`). Checked on load only.
        load_error (str): the one line a load fails with when ``load_requires`` is missing.
        whatis_lines (tuple[str, ...]): more ``module-whatis`` / ``whatis`` lines after the
            description (``Name:``, ``Version:``, ``Packages:``, ``Keywords:``): what ``module
            search`` (Environment Modules) and ``module keyword`` (Lmod) look through.
        venv_fence (str): the line that an activate script extended for this module holds
            (``extend-venv-activate``'s fence); ``""``: no check. On load inside an active venv
            whose ``bin/activate`` lacks it, the module prints :attr:`venv_warning`.
        venv_warning (str): that one line; ``@VENV@`` stands for the venv's directory.
        export_all (bool): on load, ``SLURM_EXPORT_ENV=NONE`` (``sbatch --export=NONE``) becomes
            ``ALL``, so that the tasks ``srun`` starts get the environment this module sets.
        status_file (str): the site's status file (:mod:`hpcstack.validate.statusfile`); on load
            the module prints its stack's line there (DEGRADED or FAILED since when); ``""``: no check.

    Raises:
        ValueError: an ``environment`` entry that is not a known :class:`EnvChange`.
    """

    name: str
    version: str
    whatis: str
    help_lines: list[str]
    prefix: str
    root_variable: str
    depends_on: list[str]
    path_prepend: list[str]
    pythonpath_prepend: list[str]
    environment: tuple[EnvChange, ...] = field(default_factory=tuple)
    recipe: str = ""
    site: str = ""
    hpcstack_version: str = __version__
    load_requires: str = ""
    load_error: str = ""
    whatis_lines: tuple[str, ...] = ()
    venv_fence: str = ""
    venv_warning: str = ""
    export_all: bool = False
    status_file: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "environment", check_changes(self.environment, "ModuleContext"))

    @property
    def changes(self) -> tuple[EnvChange, ...]:
        """Every environment change the modulefile makes after setting the root variable, in
        order: PATH, PYTHONPATH, then :attr:`environment`."""
        return (*(PrependPath("PATH", p) for p in self.path_prepend),
                *(PrependPath("PYTHONPATH", p) for p in self.pythonpath_prepend),
                *self.environment)

    def variables(self) -> dict:
        """What the template sees: every attribute, ``environment`` as it is, and ``changes``."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["changes"] = self.changes
        # what the status file's line of this stack starts with (statusfile.render)
        out["status_needle"] = f'\n"{self.name}/{self.version}": "'
        return out


def render_modulefile(context: ModuleContext, syntax: str) -> str:
    """Render a modulefile.

    Args:
        context (ModuleContext): the variables.
        syntax (str): a :data:`~hpcstack.modules.syntax.SYNTAXES` name, ``tcl`` or ``lua``.

    Returns:
        str: the modulefile text.

    Raises:
        ValueError: unknown syntax.
    """
    return get_syntax(syntax).render(context.variables())


# ----------------------------------------------------------------------------------- defaults

#: Per syntax, the file in ``<module root>/<name>/`` that names the default version hpcstack
#: writes (:attr:`~hpcstack.modules.syntax.ModuleSyntax.default_file`): Environment Modules reads
#: ``.version`` (and ``.modulerc``); Lmod reads ``.modulerc.lua``, then ``.modulerc``, then
#: ``.version`` (the first that names a default wins).
DEFAULT_FILES = {name: cls.default_file for name, cls in SYNTAXES.items()}
#: Every name through which one of the tools may take a default version (``default`` is Lmod's
#: symlink form; :attr:`~hpcstack.modules.modsys.ModuleTool.default_sources`). One not written by
#: hpcstack makes :func:`set_default` refuse, not guess.
DEFAULT_CANDIDATES = modsys.default_sources()
#: The line that marks a default file as hpcstack's (and so safe to rewrite).
DEFAULT_MARKER = "Written by hpcstack module set-default"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def render_default(name: str, version: str, syntax: str, site: str | None = None) -> str:
    """Render the default-version file of one syntax (its
    :attr:`~hpcstack.modules.syntax.ModuleSyntax.default_template`: ``modulefiles/version.tcl.j2``
    or ``modulefiles/modulerc.lua.j2``).

    Args:
        name (str): module name, e.g. ``"pytorch"``.
        version (str): the version ``module load <name>`` should pick, e.g. ``"2.3.1-gpu"``.
        syntax (str): ``tcl`` (the text of ``.version``) or ``lua`` (of ``.modulerc.lua``).
        site (str | None): the site, named in the file's "change it with" line.

    Returns:
        str: the file's text.

    Raises:
        ValueError: unknown syntax.
    """
    return get_syntax(syntax).render_default(name, version, DEFAULT_MARKER,
                                             f" --site {site}" if site else "")


def _is_ours(path: Path) -> bool:
    """True when ``path`` is a regular file that hpcstack wrote (it holds :data:`DEFAULT_MARKER`)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        return DEFAULT_MARKER in path.read_text(errors="replace")
    except OSError:
        return False


def read_defaults(module_dir: str | os.PathLike) -> dict[str, str]:
    """Return the default versions that hpcstack's files in ``module_dir`` name.

    Args:
        module_dir (str | PathLike): ``<module root>/<name>``.

    Returns:
        dict[str, str]: file name (``.version``, ``.modulerc.lua``) -> version, for hpcstack's
        files only; empty when there are none.
    """
    out = {}
    for syntax in SYNTAXES.values():
        path = Path(module_dir) / syntax.default_file
        if _is_ours(path):
            version = syntax().read_default(path.read_text(errors="replace"))
            if version:
                out[syntax.default_file] = version
    return out


def foreign_defaults(module_dir: str | os.PathLike) -> list[str]:
    """Return the default files (or ``default`` link) in ``module_dir`` that hpcstack did not write.

    Args:
        module_dir (str | PathLike): ``<module root>/<name>``.

    Returns:
        list[str]: their paths; a tool may take its default from any of them.
    """
    d = Path(module_dir)
    return [str(d / f) for f in DEFAULT_CANDIDATES
            if ((d / f).exists() or (d / f).is_symlink()) and not _is_ours(d / f)]


def available_versions(module_dir: str | os.PathLike, tool: str) -> list[str]:
    """Return the versions with a modulefile in ``module_dir`` that ``tool`` can read, sorted.

    Args:
        module_dir (str | PathLike): ``<module root>/<name>``.
        tool (str): a :data:`~hpcstack.modules.modsys.TOOLS` name: ``environment-modules`` (Tcl
            files, which start with ``#%Module``) or ``lmod`` (those and ``<version>.lua``).

    Raises:
        ValueError: unknown tool.
    """
    syntaxes = [get_syntax(s) for s in modsys.get_tool(tool).syntaxes]
    d = Path(module_dir)
    try:    # listed through a descriptor, no link followed: a link at <name> is no module's directory
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    found = {v for name in names for syntax in syntaxes for v in [syntax.version_of(d / name)] if v}
    return sorted(found)


@dataclass(frozen=True)
class DefaultChange:
    """What :func:`set_default` did.

    Attributes:
        name, version (str): the module and its new default version.
        previous (str | None): the default before (from hpcstack's file of the site's syntax,
            else its other file), None when hpcstack had written none.
        written (list[str]): the files written.
        notes (list[str]): anything the user should know (e.g. a file left alone).
    """

    name: str
    version: str
    previous: str | None
    written: list[str]
    notes: list[str]


def set_default(module_root: str, name: str, version: str, syntax: str, tool: str,
                site: str | None = None) -> DefaultChange:
    """Make ``module load <name>`` pick ``<name>/<version>``; each file is replaced atomically.

    Writes the syntax's default file, ``<module_root>/<name>/.version`` (syntax ``tcl``) or
    ``.modulerc.lua`` (``lua``). If hpcstack's file of another syntax is there too (a tree shared
    by both tools), it is rewritten as well, so the tools agree — unless a tool that reads that
    file cannot load the version (e.g. ``.version`` and a version with only a Lua modulefile,
    which Environment Modules cannot read; a note says so). Switching back is the same call with
    the previous version (:attr:`DefaultChange.previous`).

    Args:
        module_root (str): a MODULEPATH directory (the site's ``module_root``).
        name (str): module name, e.g. ``"pytorch"``.
        version (str): e.g. ``"2.3.1-gpu"``; must have a modulefile there that ``tool`` reads.
        syntax (str): the site's ``modules.syntax`` (``tcl`` or ``lua``).
        tool (str): the site's ``modules.tool`` (``environment-modules`` or ``lmod``).
        site (str | None): the site's name, for the "change it with" line in the file.

    Returns:
        DefaultChange: previous default, files written, notes.

    Raises:
        HpcstackError: bad version, no such modulefile (the available versions are listed), or a
            default file hpcstack did not write (which one the tools read would be a guess).
        ValueError: unknown syntax or tool.
    """
    own_file = get_syntax(syntax).default_file
    for what, value in (("module name", name), ("version", version)):
        if not _VERSION_RE.match(value):
            raise HpcstackError(f"bad {what} {value!r}: letters, digits and ._+- only, "
                                "starting with a letter or digit")
    module_dir = Path(module_root) / name
    versions = available_versions(module_dir, tool)
    if version not in versions:
        have = ", ".join(versions) if versions else "none"
        raise HpcstackError(f"no modulefile {name}/{version} for {tool} in {module_root} "
                            f"(available: {have})")
    foreign = foreign_defaults(module_dir)
    if foreign:
        raise HpcstackError(f"{', '.join(foreign)}: not written by hpcstack and may set the default "
                            "of the module too; move it away, or set the default in it by hand")
    current = read_defaults(module_dir)
    previous = current.get(own_file, next(iter(current.values()), None))
    targets, notes = [syntax], []
    for other, cls in SYNTAXES.items():
        if other == syntax or cls.default_file not in current:
            continue
        readers = [t for t in modsys.TOOLS.values() if cls.default_file in t.default_sources]
        blind = [t for t in readers if version not in available_versions(module_dir, t.name)]
        if blind:
            titles = " or ".join(SYNTAXES[s].title for s in blind[0].syntaxes)
            notes.append(f"left {module_dir / cls.default_file} at {current[cls.default_file]}: "
                         f"{name}/{version} has no {titles} modulefile for {blind[0].title}")
        else:
            targets.append(other)
    written = []
    for syn in targets:
        path = module_dir / DEFAULT_FILES[syn]
        try:
            write_atomic(path, render_default(name, version, syn, site), 0o644)
        except OSError as exc:
            raise HpcstackError(f"cannot write {path}: {exc.strerror}") from None
        written.append(str(path))
    return DefaultChange(name, version, previous, written, notes)


def unset_default(module_root: str, name: str) -> list[str]:
    """Remove hpcstack's default files for ``name`` (the tools then pick a version themselves).

    Args:
        module_root (str): a MODULEPATH directory.
        name (str): module name.

    Returns:
        list[str]: the files removed (files not written by hpcstack are left alone).

    Raises:
        HpcstackError: a bad name, or a file that cannot be removed.
    """
    if not _VERSION_RE.match(name):
        raise HpcstackError(f"bad module name {name!r}: letters, digits and ._+- only")
    removed = []
    for fname in DEFAULT_FILES.values():
        path = Path(module_root) / name / fname
        if _is_ours(path):
            try:
                path.unlink()
            except OSError as exc:
                raise HpcstackError(f"cannot remove {path}: {exc.strerror}") from None
            removed.append(str(path))
    return removed
