"""Modulefile syntaxes: one class per syntax (Tcl, Lua), in a registry by name.

As EasyBuild's ``ModuleGeneratorTcl``/``ModuleGeneratorLua`` and Spack's ``modules/tcl.py``/
``modules/lmod.py``, each class holds only what differs between the syntaxes, as class
constants: the file suffix, the modulefile template, the default-version file and its template,
how to read the version back, how to recognise a modulefile, and the template filters that quote
values. The templates (``modulefiles/modulefile.<syntax>.j2``) share the block names ``header``,
``whatis``, ``autoloads``, ``checks``, ``environment`` and ``footer``, and loop over the same typed environment changes
(:mod:`hpcstack.modules.envchange`).

A new syntax is one class here, decorated with :func:`register_syntax`, plus its templates in
``modulefiles/``; the site schema's ``modules.syntax`` enum and every caller take it from
:data:`SYNTAXES`.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Callable, ClassVar

from hpcstack import templates
from hpcstack.registry import Registry

#: Registered syntaxes, by the name a site config gives in ``modules.syntax``.
SYNTAXES = Registry("modulefile syntax")


def register_syntax(cls: type["ModuleSyntax"]) -> type["ModuleSyntax"]:
    """Class decorator: add a syntax to :data:`SYNTAXES` and its filters to the templates.

    Raises:
        ValueError: the name is taken, or a filter name clashes with another syntax's.
    """
    if cls.name in SYNTAXES:
        SYNTAXES.add(cls.name, cls)      # raises, naming the class registered already
    templates.add_filters(cls.filters)
    return SYNTAXES.add(cls.name, cls)


def get_syntax(name: str) -> "ModuleSyntax":
    """Return (an instance of) the syntax called ``name``.

    Raises:
        ValueError: no such syntax (the known ones are listed).
    """
    return SYNTAXES.lookup(name)()


class ModuleSyntax:
    """What one modulefile syntax is made of (subclasses set the class constants).

    Attributes:
        name (str): the site config's ``modules.syntax`` value, e.g. ``"tcl"``.
        title (str): its name in messages, e.g. ``"Tcl"``.
        suffix (str): appended to ``<version>`` to name the modulefile (``""``, ``".lua"``).
        template (str): the modulefile template under the data directory.
        default_file (str): the file in ``<module root>/<name>/`` that names the default version.
        default_template (str): its template (sees ``name``, ``version``, ``marker``, ``site_option``).
        default_pattern (re.Pattern): finds the version in that file (group 1).
        filters (dict[str, Callable]): template filters this syntax's templates use.
    """

    name: ClassVar[str]
    title: ClassVar[str]
    suffix: ClassVar[str]
    template: ClassVar[str]
    default_file: ClassVar[str]
    default_template: ClassVar[str]
    default_pattern: ClassVar[re.Pattern]
    filters: ClassVar[dict[str, Callable[[str], str]]] = {}

    def filename(self, version: str) -> str:
        """The modulefile's name in ``<module root>/<name>/``, e.g. ``2.3.1-gpu.lua``."""
        return version + self.suffix

    def version_of(self, path: Path) -> str | None:
        """The version whose modulefile in this syntax ``path`` is, or None when it is not one.

        Args:
            path (Path): a file in ``<module root>/<name>/`` (dot files and ``default`` are never
                modulefiles).
        """
        if path.name.startswith(".") or path.name == "default" or not path.is_file():
            return None
        if not path.name.endswith(self.suffix) or not self._is_modulefile(path):
            return None
        return path.name[:len(path.name) - len(self.suffix)] if self.suffix else path.name

    def _is_modulefile(self, path: Path) -> bool:
        """True when ``path`` (named with :attr:`suffix`) holds a modulefile of this syntax."""
        return True

    def render(self, variables: dict) -> str:
        """Render a modulefile from :attr:`template` with exactly ``variables``."""
        return templates.render(self.template, **variables)

    def render_default(self, name: str, version: str, marker: str, site_option: str) -> str:
        """Render :attr:`default_file`'s text naming ``name/version`` as the default."""
        return templates.render(self.default_template, name=name, version=version, marker=marker,
                                site_option=site_option)

    def read_default(self, text: str) -> str | None:
        """The version a :attr:`default_file` with ``text`` names, or None."""
        m = self.default_pattern.search(text)
        return m.group(1) if m else None


#: A Tcl word that needs no quoting: it starts with a letter and holds only letters, digits and
#: ``_.+/-`` (module names such as ``python/3.12.1-gpu``, variable names such as ``PATH``).
_TCL_BARE = re.compile(r"[A-Za-z][A-Za-z0-9_.+/-]*")
#: What a braced Tcl word cannot hold as it is: braces and backslashes (they change where the
#: word ends), control characters (``\x1a`` ends a sourced file) and Unicode line separators.
_TCL_BRACE_UNSAFE = re.compile(r"[{}\\\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _tcl_escape(char: str) -> str:
    if char in '"\\$[]{}':
        return "\\" + char
    if char == "\n":
        return "\\n"
    if ord(char) < 0x20 or 0x7f <= ord(char) <= 0x9f or char in "\u2028\u2029":
        return f"\\u{ord(char):04x}"
    return char


def tcl_quote(value: str) -> str:
    """Quote a string as one Tcl word that Tcl never substitutes into (no ``[command]``, no
    ``$variable``): a plain word such as ``pytorch`` or ``PATH`` as it is (:data:`_TCL_BARE`),
    else braces where the text allows them, else a double-quoted string with ``"\\$[]{}``
    backslash-escaped and control characters as ``\\uXXXX``.

    Args:
        value (object): converted with :func:`str`.

    Returns:
        str: the Tcl word (``""`` for an empty string).
    """
    text = str(value)
    if _TCL_BARE.fullmatch(text):
        return text
    if text and not _TCL_BRACE_UNSAFE.search(text):
        return "{" + text + "}"
    return '"' + "".join(_tcl_escape(c) for c in text) + '"'


def lua_quote(value: str) -> str:
    """Quote a string for Lua: a double-quoted string with ``\\`` and ``"`` escaped and every
    control character (newlines, carriage returns, NUL) as a decimal escape ``\\ddd``.

    Args:
        value (object): converted with :func:`str`.
    """
    text = str(value)
    out = []
    for c in text:
        if c in '\\"':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif ord(c) < 0x20 or ord(c) == 0x7f:
            out.append(f"\\{ord(c):03d}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def lua_long_string(value: str) -> str:
    """Return ``value`` as a Lua long string ``[==[...]==]`` whose level no ``]=*]`` in it closes."""
    text = str(value)
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[\n{text}\n]{eq}]"


@register_syntax
class Tcl(ModuleSyntax):
    """Tcl modulefiles (``#%Module1.0``), read by Environment Modules and by Lmod; the default
    version in ``.version`` (``set ModulesVersion``)."""

    name = "tcl"
    title = "Tcl"
    suffix = ""
    template = "modulefiles/modulefile.tcl.j2"
    default_file = ".version"
    default_template = "modulefiles/version.tcl.j2"
    default_pattern = re.compile(r"^\s*set\s+ModulesVersion\s+[{\"]?([^}\"\s]+)", re.M)
    filters = {"tcl_quote": tcl_quote}

    def version_of(self, path: Path) -> str | None:
        # a name ending in .lua is a Lua modulefile, whatever it starts with
        return None if path.name.endswith(".lua") else super().version_of(path)

    def _is_modulefile(self, path: Path) -> bool:
        """Environment Modules reads a file as a modulefile only if it starts with ``#%Module``.

        ``path`` is ``<module root>/<name>/<file>``, in a directory the stack group may write: its
        directory is opened ``O_DIRECTORY|O_NOFOLLOW`` (a link at ``<name>`` is refused) and the
        file once relative to it, ``O_NOFOLLOW|O_NONBLOCK`` (no link followed, no FIFO waited on,
        a device never opened through a link), checked regular by ``fstat``, and its first 8 bytes
        compared. A link (a version linked to another's modulefile, as module trees hold) is
        read with ``readlink`` and followed, a few hops at most, only while its target stays
        inside the module root, as named and as resolved; its target is then opened the same
        way. A link out of the module root (``/dev/watchdog``, a root-only file) is not a
        modulefile."""
        root = os.path.abspath(path.parent.parent)
        real_root = os.path.realpath(root)
        where = os.path.abspath(path)
        for _ in range(8):
            try:
                # the file's directory too is opened with no link followed: a link at
                # <module root>/<name> (to /dev, to a root-only directory) is refused, not listed
                dfd = os.open(os.path.dirname(where), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                return False
            try:
                fd = os.open(os.path.basename(where), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                             | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as exc:
                try:
                    target = os.readlink(os.path.basename(where), dir_fd=dfd) if exc.errno == errno.ELOOP else None
                except OSError:
                    target = None
                finally:
                    os.close(dfd)
                if target is None:
                    return False
                where = os.path.normpath(os.path.join(os.path.dirname(where), target))
                inside = os.path.commonpath([root, where]) == root and where != root
                if not inside or os.path.commonpath([real_root, os.path.realpath(os.path.dirname(where))]) != real_root:
                    return False
                continue
            os.close(dfd)
            try:
                return stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, 8, 0) == b"#%Module"
            except OSError:
                return False
            finally:
                os.close(fd)
        return False


@register_syntax
class Lua(ModuleSyntax):
    """Lua modulefiles (``<version>.lua``), read by Lmod only; the default version in
    ``.modulerc.lua`` (``module_version("<name>/<version>", "default")``)."""

    name = "lua"
    title = "Lua"
    suffix = ".lua"
    template = "modulefiles/modulefile.lua.j2"
    default_file = ".modulerc.lua"
    default_template = "modulefiles/modulerc.lua.j2"
    default_pattern = re.compile(r"^\s*module_version\(\s*\"[^\"/]+/([^\"]+)\"\s*,\s*\"default\"", re.M)
    filters = {"lua_quote": lua_quote, "lua_long_string": lua_long_string}
