"""Modulefiles: layout, context and writer, in the manner of Spack's ``modules/common.py``.

- configuration: the site's ``modules`` section (tool, syntax, base/runtime modules);
- layout: the projection ``{name}/{version}`` gives the file under the module root
  (``.lua`` appended for Lua);
- context: :class:`ModuleContext`, exactly the variables a template sees, nothing more;
- writer: :func:`render_modulefile` renders ``modulefiles/modulefile.<syntax>.j2`` with jinja2
  (``trim_blocks``, ``lstrip_blocks``); the install writes it atomically, as its last step.
- defaults: :func:`set_default` writes the file that makes ``module load <name>`` pick a version
  (``.version`` for Tcl sites, ``.modulerc.lua`` for Lua sites, both from templates in
  ``modulefiles/``); :class:`WriteDefault` is the install's action that writes one when none
  exists yet.

Templates of both syntaxes share the block names ``header``, ``autoloads``, ``environment`` and
``footer``, so a site can override one block with its own template that ``{% extends %}`` ours.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jinja2

from hpcstack import __version__, data_root
from hpcstack.errors import HpcstackError
from hpcstack.install.plan import write_atomic

PROJECTION = "{name}/{version}"


def modulefile_path(module_root: str, name: str, version: str, syntax: str) -> str:
    """Return the modulefile's path under ``module_root`` (projection ``{name}/{version}``).

    Args:
        module_root (str): a MODULEPATH directory.
        name (str), version (str): e.g. ``"pytorch"``, ``"2.3.1-gpu"``.
        syntax (str): ``tcl`` (no suffix) or ``lua`` (``.lua``).
    """
    rel = PROJECTION.format(name=name, version=version)
    return os.path.join(module_root, rel + (".lua" if syntax == "lua" else ""))


def root_variable(name: str) -> str:
    """Return the stack's root variable, e.g. ``HPCSTACK_PYTORCH_ROOT`` for ``pytorch``."""
    return "HPCSTACK_" + "".join(c if c.isalnum() else "_" for c in name.upper()) + "_ROOT"


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
        setenv (dict[str, str]): further variables.
        recipe, site (str): where the modulefile came from.
        hpcstack_version (str): the writer's version.
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
    setenv: dict[str, str] = field(default_factory=dict)
    recipe: str = ""
    site: str = ""
    hpcstack_version: str = __version__


def _tcl_quote(value: str) -> str:
    """Quote a string for Tcl: braces when balanced and safe, else backslash-escaped quotes."""
    text = str(value)
    if text and not any(c in text for c in "{}\\") and not text.endswith("\\"):
        return "{" + text + "}"
    return '"' + "".join("\\" + c if c in '"\\$[]{}' else c for c in text) + '"'


def _lua_quote(value: str) -> str:
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _lua_long_string(value: str) -> str:
    """Return ``value`` as a Lua long string ``[==[...]==]`` whose level no ``]=*]`` in it closes."""
    text = str(value)
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[\n{text}\n]{eq}]"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_root() / "modulefiles")),
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, autoescape=False)
    env.filters["tcl_quote"] = _tcl_quote
    env.filters["lua_quote"] = _lua_quote
    env.filters["lua_long_string"] = _lua_long_string
    return env


def render_modulefile(context: ModuleContext, syntax: str, template: str | None = None) -> str:
    """Render a modulefile.

    Args:
        context (ModuleContext): the variables.
        syntax (str): ``tcl`` or ``lua``.
        template (str | None): a template name under ``modulefiles/`` to use instead of
            ``modulefile.<syntax>.j2`` (a site's override that extends it).

    Returns:
        str: the modulefile text.

    Raises:
        ValueError: unknown syntax.
    """
    if syntax not in ("tcl", "lua"):
        raise ValueError(f"unknown modulefile syntax {syntax!r} (tcl or lua)")
    tmpl = _environment().get_template(template or f"modulefile.{syntax}.j2")
    return tmpl.render(**asdict(context))


# ----------------------------------------------------------------------------------- defaults

#: Per syntax, the file in ``<module root>/<name>/`` that names the default version hpcstack
#: writes: Environment Modules reads ``.version`` (and ``.modulerc``); Lmod reads
#: ``.modulerc.lua``, then ``.modulerc``, then ``.version`` (the first that names a default wins).
DEFAULT_FILES = {"tcl": ".version", "lua": ".modulerc.lua"}
#: Every name through which one of the tools may take a default version (``default`` is Lmod's
#: symlink form). One not written by hpcstack makes :func:`set_default` refuse, not guess.
DEFAULT_CANDIDATES = (".modulerc.lua", ".modulerc", ".version", "default")
#: The line that marks a default file as hpcstack's (and so safe to rewrite).
DEFAULT_MARKER = "Written by hpcstack module set-default"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_READ_DEFAULT = {
    ".version": re.compile(r"^\s*set\s+ModulesVersion\s+[{\"]?([^}\"\s]+)", re.M),
    ".modulerc.lua": re.compile(r"^\s*module_version\(\s*\"[^\"/]+/([^\"]+)\"\s*,\s*\"default\"", re.M),
}


def render_default(name: str, version: str, syntax: str, site: str | None = None) -> str:
    """Render the default-version file of one syntax (``modulefiles/version.tcl.j2`` or
    ``modulefiles/modulerc.lua.j2``).

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
    if syntax not in DEFAULT_FILES:
        raise ValueError(f"unknown modulefile syntax {syntax!r} (tcl or lua)")
    template = "version.tcl.j2" if syntax == "tcl" else "modulerc.lua.j2"
    return _environment().get_template(template).render(
        name=name, version=version, marker=DEFAULT_MARKER,
        site_option=f" --site {site}" if site else "")


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
    for fname, pattern in _READ_DEFAULT.items():
        path = Path(module_dir) / fname
        if _is_ours(path):
            m = pattern.search(path.read_text(errors="replace"))
            if m:
                out[fname] = m.group(1)
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
        tool (str): ``environment-modules`` (Tcl files, which start with ``#%Module``) or
            ``lmod`` (those and ``<version>.lua``).
    """
    d = Path(module_dir)
    if not d.is_dir():
        return []
    found = set()
    for p in d.iterdir():
        if p.name.startswith(".") or p.name == "default" or not p.is_file():
            continue
        if p.name.endswith(".lua"):
            if tool == "lmod":
                found.add(p.name[:-4])
        elif _is_tcl_modulefile(p):
            found.add(p.name)
    return sorted(found)


def _is_tcl_modulefile(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"#%Module"
    except OSError:
        return False


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

    Writes ``<module_root>/<name>/.version`` (syntax ``tcl``) or ``.modulerc.lua`` (``lua``). If
    hpcstack's file of the other syntax is there too (a tree shared by both tools), it is
    rewritten as well, so the tools agree — except a ``.version`` when the version has no Tcl
    modulefile (Environment Modules could not load it; a note says so). Switching back is the
    same call with the previous version (:attr:`DefaultChange.previous`).

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
        ValueError: unknown syntax.
    """
    if syntax not in DEFAULT_FILES:
        raise ValueError(f"unknown modulefile syntax {syntax!r} (tcl or lua)")
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
    own_file = DEFAULT_FILES[syntax]
    other_syntax = "lua" if syntax == "tcl" else "tcl"
    other_file = DEFAULT_FILES[other_syntax]
    previous = current.get(own_file, current.get(other_file))
    targets, notes = [syntax], []
    if other_file in current:
        if other_syntax == "tcl" and version not in available_versions(module_dir, "environment-modules"):
            notes.append(f"left {module_dir / other_file} at {current[other_file]}: {name}/{version} "
                         "has no Tcl modulefile for Environment Modules")
        else:
            targets.append(other_syntax)
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


@dataclass(frozen=True)
class WriteDefault:
    """Install action: write the default-version file for a module if it has no default yet.

    Runs in the ``module`` step, after the modulefile is written, so the first stack installed
    under a name becomes ``module load <name>``'s choice, and a later install never moves an
    existing default (that is ``hpcstack module set-default``'s job).

    It is a :class:`hpcstack.install.actions.WriteFile` with ``unless_exists`` (any file of
    :data:`DEFAULT_CANDIDATES`), so its dry-run bash and its execution are one: execution runs
    the printed bash, an atomic write.

    Args:
        module_dir (str): ``<module root>/<name>``.
        name (str), version (str): the module, e.g. ``"pytorch"``, ``"2.3.1-gpu"``.
        syntax (str): ``tcl`` (writes ``.version``) or ``lua`` (``.modulerc.lua``).
        site (str | None): the site's name, for the file's "change it with" line.
    """

    module_dir: str
    name: str
    version: str
    syntax: str
    site: str | None = None

    @property
    def path(self) -> str:
        """The file this action writes."""
        return os.path.join(self.module_dir, DEFAULT_FILES[self.syntax])

    def write(self):
        """The :class:`~hpcstack.install.actions.WriteFile` this action is."""
        from hpcstack.install.actions import WriteFile

        return WriteFile(self.path, render_default(self.name, self.version, self.syntax, self.site), 0o644,
                         unless_exists=tuple(os.path.join(self.module_dir, f) for f in DEFAULT_CANDIDATES))

    def commands(self) -> tuple:
        return self.write().commands()

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return (self.path,)

    def to_bash(self) -> str:
        return f"# default version, only if {self.name} has none yet\n{self.write().to_bash()}"

    def execute(self, ctx) -> None:
        ctx.log.write(f"default of {self.name}: {self.version} unless one is set in {self.module_dir}\n")
        self.write().execute(ctx)
