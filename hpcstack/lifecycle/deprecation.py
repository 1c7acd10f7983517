"""``hpcstack module deprecate`` and ``undeprecate``: a stack that is superseded says so at every
``module load``, is marked in ``module avail``, and after its date cannot be loaded, saying why and
what to use instead, with each module tool's own features where it has them.

Environment Modules 5.2 (Tcl sites): rules in the module root's ``.modulerc`` (the modulepath's rc
file, so each module's ``.version`` still sets its default): ``module-tag deprecated NAME/VERSION``
(``module avail`` shows ``<deprecated>``) and ``module-forbid --after DATE --message … --nearly-message
… NAME/VERSION`` (after the date ``module load`` fails with the message; in the last
``nearly_forbidden_days``, 14 by default, the tool warns with the nearly-message); and a block at
the end of the modulefile prints the one line at each load before the date.

Lmod 8.6 (Lua sites): its modulerc functions are ``module_version``, ``module_alias``,
``hide_version`` and ``hide_modulefile`` (Lmod 8.6.19's ``mrc_funcs.lua``): no forbid rule with a
date. Its admin "nag" file (``LMOD_ADMIN_FILE``) prints messages at load, but it is one file per Lmod
installation, outside the module root, and prints a multi-line box. So the block at the end of the
Lua modulefile does it all: ``add_property("state", "obsolete")`` (Lmod's own property: ``module
avail`` shows ``(O)``), the one line at load (``io.stderr:write``: ``LmodMessage`` wraps it at the
terminal's width), and ``LmodError`` after the date. Checked with Lmod 8.6.19.

The record of every deprecation of a module root is ``<module root>/.hpcstack/deprecations.json``
(read by ``hpcstack uninstall``, and left behind for users' venvs and kernels when the stack goes).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import write_atomic

#: Where a module root records its deprecations.
RECORD = os.path.join(".hpcstack", "deprecations.json")
BEGIN = "hpcstack deprecation of {module}: written by hpcstack module deprecate; removed by undeprecate"
END = "end of the hpcstack deprecation of {module}"
_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


@dataclass(frozen=True)
class Deprecation:
    """One deprecated module.

    Attributes:
        module (str): ``NAME/VERSION``.
        replacement (str | None): ``NAME/VERSION`` to use instead.
        after (str | None): ``YYYY-MM-DD``: from that day on it cannot be loaded.
        message (str | None): the admin's own words, added to the line.
        since (str): the day it was deprecated.
    """

    module: str
    replacement: str | None = None
    after: str | None = None
    message: str | None = None
    since: str = ""

    def line(self) -> str:
        """The one line users see at load and activate: what, what instead, until when."""
        parts = [f"{self.module} is deprecated"]
        if self.replacement:
            parts.append(f"use {self.replacement} instead")
        if self.after:
            parts.append(f"it cannot be loaded from {self.after} on")
        text = "; ".join(parts)
        return text + (f" ({self.message})" if self.message else "")

    def retired(self, with_date: bool | None = None) -> str:
        """The line after the date (and once the stack is gone).

        Args:
            with_date (bool | None): name the date (default: when it has come; a stack removed
                with ``--force`` before its date was not retired "on" it).
        """
        with_date = self.past() if with_date is None else with_date
        text = f"{self.module} was retired" + (f" on {self.after}" if self.after and with_date else "")
        text += f": use {self.replacement} instead" if self.replacement else ": no replacement was named"
        return text + (f" ({self.message})" if self.message else "")

    def past(self, today: _dt.date | None = None) -> bool:
        """True from its date on."""
        return bool(self.after) and (today or _dt.date.today()) >= _dt.date.fromisoformat(self.after)


def check_args(module: str, replacement: str | None, after: str | None, message: str | None) -> list[str]:
    """One line per bad argument of ``module deprecate`` (empty when all are good)."""
    problems = []
    for label, value in (("target", module), ("--replacement", replacement)):
        if value is None:
            continue
        name, _, version = value.partition("/")
        if not (_WORD.match(name) and _WORD.match(version)):
            problems.append(f"{label}: {value!r}: expected NAME/VERSION, e.g. pytorch/2.3.1-gpu "
                            "(letters, digits and ._+-)")
    if after is not None:
        try:
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", after):
                raise ValueError
            _dt.date.fromisoformat(after)
        except ValueError:
            problems.append(f"--after: {after!r}: expected a date YYYY-MM-DD, e.g. 2027-06-30")
    if message is not None and (not message.strip() or re.search(r"[\x00-\x1f\x7f]", message)):
        problems.append("--message: give one line of text (no control characters or line breaks)")
    return problems


def read_all(module_root: str) -> dict[str, Deprecation]:
    """Every deprecation recorded in a module root (``NAME/VERSION`` -> :class:`Deprecation`)."""
    try:
        data = json.loads((Path(module_root) / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for module, entry in (data.get("modules") or {}).items():
        try:
            out[module] = Deprecation(**entry)
        except TypeError:
            continue
    return out


def _write_all(module_root: str, records: dict[str, Deprecation]) -> None:
    doc = {"written_by": "hpcstack module deprecate", "modules": {k: asdict(v) for k, v in sorted(records.items())}}
    write_atomic(Path(module_root) / RECORD, json.dumps(doc, indent=1) + "\n", 0o644)


def _markers(module: str, comment: str) -> tuple[str, str]:
    return f"{comment} {BEGIN.format(module=module)}", f"{comment} {END.format(module=module)}"


def _splice(text: str, begin: str, end: str, block: str) -> str:
    """``text`` without its block between ``begin`` and ``end`` (inclusive), plus ``block``."""
    lines = text.splitlines(keepends=True)
    out, inside = [], False
    for line in lines:
        if line.rstrip("\n") == begin:
            inside = True
            continue
        if inside:
            if line.rstrip("\n") == end:
                inside = False
            continue
        out.append(line)
    kept = "".join(out)
    if block:
        kept = kept.rstrip("\n") + "\n\n" + block
    return kept


def _blocks(dep: Deprecation, syntax: str, tool: str = "environment-modules") -> tuple[str, str | None]:
    """The modulefile's block, and (Tcl modulefiles read by Environment Modules) the module root's
    .modulerc block: Lmod reading Tcl modulefiles knows no module-forbid or module-tag."""
    from hpcstack.templates import render

    comment = "--" if syntax == "lua" else "#"
    begin, end = _markers(dep.module, comment)
    common = dict(begin=begin, end=end, line=dep.line(), retired=dep.retired(with_date=True), after=dep.after,
                  module=dep.module)
    block = render(f"modulefiles/deprecation.{syntax}.j2", **common)
    rc = (render("modulefiles/modulerc-deprecation.tcl.j2", **common)
          if syntax == "tcl" and tool == "environment-modules" else None)
    return block, rc


def deprecate(site, module: str, replacement: str | None = None, after: str | None = None,
              message: str | None = None) -> tuple[Deprecation, list[str]]:
    """Deprecate an installed module: record it, add the block to its modulefile and (Tcl) the
    rules to the module root's ``.modulerc``. Run again, it replaces what it wrote before.

    Args:
        site (hpcstack.site.Site): the site (module root, syntax).
        module (str): ``NAME/VERSION``.
        replacement (str | None): ``NAME/VERSION`` to use instead (need not be installed yet).
        after (str | None): ``YYYY-MM-DD`` from which it cannot be loaded.
        message (str | None): one line of the admin's own.

    Returns:
        tuple[Deprecation, list[str]]: the record, and the files written.

    Raises:
        ConfigError: a bad argument (one line each), or no modulefile of ``module`` (exit 2).
    """
    from hpcstack.modules.writer import modulefile_path

    problems = check_args(module, replacement, after, message)
    if problems:
        raise ConfigError(problems)
    name, version = module.split("/")
    syntax = site.modules.syntax
    path = Path(modulefile_path(site.module_root, name, version, syntax))
    if not path.is_file():
        raise ConfigError([f"{module}: no modulefile {path} (install it first, or give --site/--module-root)"])
    dep = Deprecation(module, replacement, after, message, _dt.date.today().isoformat())
    block, rc = _blocks(dep, syntax, site.modules.tool)
    comment = "--" if syntax == "lua" else "#"
    written = []
    write_atomic(path, _splice(path.read_text(), *_markers(module, comment), block), 0o644)
    written.append(str(path))
    rc_path = Path(site.module_root) / ".modulerc"
    if rc is not None:
        old = rc_path.read_text() if rc_path.is_file() else "#%Module\n"
        write_atomic(rc_path, _splice(old, *_markers(module, "#"), rc), 0o644)
        written.append(str(rc_path))
    records = read_all(site.module_root)
    records[module] = dep
    _write_all(site.module_root, records)
    written.append(str(Path(site.module_root) / RECORD))
    return dep, written


def undeprecate(site, module: str) -> list[str]:
    """Undo :func:`deprecate`: remove the blocks and the record.

    Returns:
        list[str]: the files changed.

    Raises:
        HpcstackError: ``module`` is not deprecated in this module root.
    """
    from hpcstack.modules.writer import modulefile_path

    records = read_all(site.module_root)
    if module not in records:
        raise HpcstackError(f"{module} is not deprecated in {site.module_root}")
    name, version = module.split("/")
    changed = []
    for syntax, comment in (("tcl", "#"), ("lua", "--")):
        path = Path(modulefile_path(site.module_root, name, version, syntax))
        if path.is_file() and "Written by hpcstack uninstall" in path.read_text()[:300]:
            path.unlink()  # the stand-in of a stack that is gone
            changed.append(f"{path} (removed)")
        elif path.is_file():
            write_atomic(path, _splice(path.read_text(), *_markers(module, comment), ""), 0o644)
            changed.append(str(path))
    rc_path = Path(site.module_root) / ".modulerc"
    if rc_path.is_file():
        write_atomic(rc_path, _splice(rc_path.read_text(), *_markers(module, "#"), ""), 0o644)
        changed.append(str(rc_path))
    del records[module]
    _write_all(site.module_root, records)
    changed.append(str(Path(site.module_root) / RECORD))
    return changed


def uninstall_refusal(site, module: str, today: _dt.date | None = None) -> str | None:
    """Why ``hpcstack uninstall`` without ``--force`` must not remove ``module`` now: it is
    deprecated and its date has not come (its users were told they have until then). None when
    it may go (not deprecated, or past its date)."""
    dep = read_all(site.module_root).get(module)
    if dep and not dep.past(today):
        until = f"until {dep.after}" if dep.after else "with no date set (give one with --after)"
        return (f"refusing to uninstall {module}: it is deprecated and its users were told it stays "
                f"{until}; wait, or use --force")
    return None


#: The first line of a retired module's stand-in (:func:`write_retired`).
RETIRED_MARKER = "# Written by hpcstack uninstall: the stack is gone; this stand-in says what to use instead"


def write_retired(site, module: str) -> str | None:
    """After ``hpcstack uninstall`` of a deprecated module: write a stand-in modulefile whose load
    fails with the one retired line (replacement named), so that users' venvs, kernels and job
    scripts that still load it are told what to use instead.

    Returns:
        str | None: the file written, or None when ``module`` is not deprecated.
    """
    from hpcstack.modules.writer import modulefile_path
    from hpcstack.templates import render

    dep = read_all(site.module_root).get(module)
    if dep is None:
        return None
    name, version = module.split("/")
    syntax = site.modules.syntax
    path = modulefile_path(site.module_root, name, version, syntax)
    marker = RETIRED_MARKER if syntax == "tcl" else RETIRED_MARKER.lstrip("# ")
    write_atomic(path, render(f"modulefiles/retired.{syntax}.j2", marker=marker, line=dep.retired()), 0o644)
    return path
