"""Modulefiles: layout, context and writer, in the manner of Spack's ``modules/common.py``.

- configuration: the site's ``modules`` section (tool, syntax, base/runtime modules);
- layout: the projection ``{name}/{version}`` gives the file under the module root
  (``.lua`` appended for Lua);
- context: :class:`ModuleContext`, exactly the variables a template sees, nothing more;
- writer: :func:`render_modulefile` renders ``modulefiles/modulefile.<syntax>.j2`` with jinja2
  (``trim_blocks``, ``lstrip_blocks``); the install writes it atomically, as its last step.

Templates of both syntaxes share the block names ``header``, ``autoloads``, ``environment`` and
``footer``, so a site can override one block with its own template that ``{% extends %}`` ours.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import jinja2

from . import __version__, data_root

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


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_root() / "modulefiles")),
        trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, autoescape=False)
    env.filters["tcl_quote"] = _tcl_quote
    env.filters["lua_quote"] = _lua_quote
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
