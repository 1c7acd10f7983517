"""Uninstall by the records: remove only what this hpcstack's own records say it published, at
the paths they record, and follow no link while removing.

``hpcstack uninstall NAME/VERSION`` is given a stack's name, a site and perhaps ``--prefix`` and
``--module-root``; from these alone it could compute ``<install_root>/<name>/<version>`` and
delete whatever lies there. It does not. Run as root on a login node, that would delete what a
user put there (a directory of their own, or a symbolic link ``<install_root>/<name> -> /elsewhere``
that made root delete ``/elsewhere/<version>``). What it removes is decided by the records an
install leaves (:mod:`hpcstack.install.provenance`, :mod:`hpcstack.install.layout`):

- a **build** (``<install_root>/<name>/.<version>-<id>``, or a build of an earlier layout) only
  when its ``.hpcstack/provenance.json`` names the stack's prefix as its ``prefix`` and the
  build's own path as its ``stage_prefix`` (a build moved, renamed or copied elsewhere is refused);
- the **prefix** (the link ``<install_root>/<name>/<version>``) only when it points at such a
  build (or dangles, with the stack's state file present); a real directory there only when it
  is itself such a build (the layout before staging);
- the **modulefile** only when such a record names it as ``modulefile``; its default marker
  only with it;
- the **stage dir** only when such a record's ``site.json`` names its ``stage_root``;
- the **state file** ``<install_root>/.hpcstack/state/<name>-<version>.json`` last.

Everything on the way must be root's (the running user's or root's, for an admin account
that is not root): every directory from ``/`` down to what is removed, each as named and as
resolved, is owned by root and not writable by every user (``/tmp``'s sticky bit accepted), as
in :mod:`hpcstack.trust`; a symbolic link above the install root (or module or stage root) is
followed only when root owns it; below them nothing is followed: directories are opened with
``O_NOFOLLOW`` relative to the descriptor of the one above (``openat``), and removed through
those descriptors (``unlinkat``; :func:`shutil.rmtree` with ``dir_fd``, which never follows a
link), so a link swapped in meanwhile is removed as a link, never followed. A record, a state
file or a build owned by another user, a symbolic link where a directory of the stack should be,
a recorded path that is not where the record says: one line, exit status 2, nothing removed.
A build directory with no record at all (an install cut short before it wrote one) is kept and
named.

A build is renamed aside first (``.<version>.trash-<id>-<pid>``, atomic), then emptied with its
record last, so an uninstall cut short leaves either the build or a trash directory that still
holds its record, which the next uninstall recognises and finishes.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.trust import user_name
from hpcstack.install import image
from hpcstack.install.actions import PRE_STAGING, describe_os_error
from hpcstack.install.layout import STATE_DIR, StackLayout, default_marker

__all__ = ["Refused", "Removal", "uninstall", "marker_of", "remove_marker"]

#: The record a build keeps of itself (:func:`hpcstack.install.provenance.record_inputs`).
RECORD = "provenance.json"
#: The copy of the site as used, holding ``stage_root``.
SITE_RECORD = "site.json"
#: A record larger than this is not one hpcstack wrote.
MAX_RECORD = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_ID = r"[0-9a-f]{12}(?:-[0-9]+)?"


class Refused(ConfigError):
    """Uninstall refuses: a path that is not what the records say, or not root's (exit 2).

    Args:
        stack (str): ``NAME/VERSION``.
        why (str): the one line's reason.
    """

    def __init__(self, stack: str, why: str):
        super().__init__([f"refusing to uninstall {stack}: {why}"])


def _owners() -> set[int]:
    """Who may own what uninstall reads and removes: root (and the running user, when not root)."""
    return {0, os.geteuid()}


def _problem(st: os.stat_result) -> str | None:
    """Why what ``st`` describes (lstat) is not root's to remove, or None."""
    if st.st_uid not in _owners():
        return f"is owned by {user_name(st.st_uid)}, not root" + ("" if os.geteuid() == 0 else " or you")
    if (stat.S_ISDIR(st.st_mode) and st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX):
        return "is writable by every user"
    return None


@dataclass
class _Walk:
    """Directory descriptors opened for one uninstall; closed together."""

    stack: str
    fds: ExitStack = field(default_factory=ExitStack)

    def __enter__(self) -> "_Walk":
        return self

    def __exit__(self, *exc) -> None:
        self.fds.close()

    def refuse(self, why: str):
        """Raise :class:`Refused` with ``why``."""
        raise Refused(self.stack, why)

    def _keep(self, fd: int) -> int:
        self.fds.callback(os.close, fd)
        return fd

    def open_root(self, path: str) -> int | None:
        """A descriptor of directory ``path`` (an install, module or stage root), or None when
        it does not exist. Every component as named is checked (:func:`_problem`; a link only
        for its owner), then the resolved path is opened from ``/`` one component at a time with
        ``O_NOFOLLOW``, each checked again.

        Raises:
            Refused: a component owned by another user, writable by every user, or swapped.
        """
        path = os.path.abspath(path)
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            here = "/" + "/".join(parts[:i])
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                return None
            except OSError as exc:
                self.refuse(f"cannot look at {here}: {describe_os_error(exc)}")
            why = (f"is a symbolic link owned by {user_name(st.st_uid)}" if stat.S_ISLNK(st.st_mode)
                   and st.st_uid not in _owners() else None if stat.S_ISLNK(st.st_mode) else _problem(st))
            if why:
                self.refuse(f"{here} {why}; hpcstack removes nothing through a path another user can change")
        real = os.path.realpath(path)
        fd = self._keep(os.open("/", _DIR_FLAGS))
        shown = ""
        for part in [p for p in real.split("/") if p]:
            shown += "/" + part
            fd = self.open_below(fd, part, shown)
            if fd is None:
                return None
        return fd

    def open_below(self, fd: int, name: str, shown: str) -> int | None:
        """Open directory ``name`` in directory ``fd`` without following a link; None if absent.

        Raises:
            Refused: ``name`` is a link, not a directory, or not root's.
        """
        try:
            sub = self._keep(os.open(name, _DIR_FLAGS, dir_fd=fd))
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                self.refuse(f"cannot open {shown}: {describe_os_error(exc)}")
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                self.refuse(f"{shown} changed while hpcstack looked at it; try again")
            if stat.S_ISLNK(st.st_mode):
                self.refuse(f"{shown} is a symbolic link (to {os.readlink(name, dir_fd=fd)}), where the stack "
                            "has a directory; uninstall follows no link: remove it yourself if it is yours")
            self.refuse(f"{shown} is not a directory")
        why = _problem(os.fstat(sub))
        if why:
            self.refuse(f"{shown} {why}; hpcstack removes nothing another user can change")
        return sub

    def file_at(self, fd: int, name: str, shown: str) -> os.stat_result | None:
        """lstat of ``name`` in ``fd`` (None if absent), refusing an entry another user owns."""
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        why = _problem(st)
        if why:
            self.refuse(f"{shown} {why}; hpcstack removes nothing another user made")
        return st

    def read_json(self, fd: int, name: str, shown: str) -> dict | None:
        """A record: regular file ``name`` in ``fd``, root's, JSON object; None when absent or
        not a JSON object (then it is no record of hpcstack's).

        Raises:
            Refused: the record is a link, not a regular file, or another user's.
        """
        try:
            ffd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.refuse(f"the record {shown} is a symbolic link; a record is a file hpcstack wrote")
            self.refuse(f"cannot read the record {shown}: {describe_os_error(exc)}")
        with os.fdopen(ffd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                self.refuse(f"the record {shown} is not a regular file")
            why = _problem(st)
            if why:
                self.refuse(f"the record {shown} {why}; a record is a file hpcstack wrote")
            data = f.read(MAX_RECORD + 1)
        try:
            doc = json.loads(data) if len(data) <= MAX_RECORD else None
        except (ValueError, RecursionError):
            doc = None
        return doc if isinstance(doc, dict) else None


@dataclass
class _Build:
    """A recorded build found in a directory: ``fd`` (parent), ``entry`` (its name there),
    ``path`` (as the records name it), ``record`` (its ``provenance.json``), ``site`` (its
    ``site.json``), ``trash`` (the name it is renamed to before it is emptied)."""

    fd: int
    entry: str
    path: str
    record: dict
    site: dict
    trash: str = ""


@dataclass
class Removal:
    """What :func:`uninstall` removes (or, for a dry run, would remove), and what it keeps.

    Attributes:
        removed (list[str]): paths, in order (modulefile, prefix, builds, stage dir).
        kept (list[str]): one line per directory kept because no record names it.
        modulefile (str | None): the stack's modulefile, when a record names it and it is there.
        recorded_modulefile (bool): some record names the stack's modulefile.
        state_file (str | None): the stack's state file, when there (removed last).
    """

    removed: list = field(default_factory=list)
    kept: list = field(default_factory=list)
    modulefile: str | None = None
    recorded_modulefile: bool = False
    state_file: str | None = None

    @property
    def found(self) -> bool:
        """Something of the stack is there: a path to remove, or its state file."""
        return bool(self.removed or self.state_file)


def _entry_id(layout: StackLayout, entry: str) -> tuple[str, bool] | None:
    """``(build id, is trash)`` of a directory entry of ``<install_root>/<name>``, else None."""
    v = re.escape(layout.version)
    m = re.fullmatch(rf"\.{v}-({_ID}|{PRE_STAGING})", entry)
    if m:
        return m.group(1), False
    m = re.fullmatch(rf"\.{v}\.trash-({_ID}|{PRE_STAGING})-[0-9]+", entry)
    return (m.group(1), True) if m else None


def _mismatch(record: dict, layout: StackLayout, path: str, build_id: str) -> str | None:
    """Why ``record`` (found in the build at ``path``) is not a record of that build of this stack."""
    prefix, stage = record.get("prefix"), record.get("stage_prefix")
    if not isinstance(prefix, str) or os.path.normpath(prefix) != layout.prefix:
        return f"its record says it is a build of {prefix!r}, not of {layout.prefix}"
    where = {path} | ({layout.prefix} if build_id in (PRE_STAGING, "") else set())
    if not isinstance(stage, str) or os.path.normpath(stage) not in where:
        return f"its record says it was built at {stage!r}, not at {path}"
    if build_id not in ("", PRE_STAGING) and record.get("build_id") != build_id:
        return f"its record names build {record.get('build_id')!r}, not {build_id}"
    return None


def _read_build(walk: _Walk, layout: StackLayout, fd: int, entry: str, path: str, build_id: str,
                shown: str) -> _Build | None:
    """The build at ``entry`` of ``fd`` with its verified record, or None when it has none.

    Raises:
        Refused: the build or its record is not root's or a link, or the record names another path.
    """
    bfd = walk.open_below(fd, entry, shown)
    if bfd is None:
        return None
    sfd = walk.open_below(bfd, STATE_DIR, f"{shown}/{STATE_DIR}")
    record = walk.read_json(sfd, RECORD, f"{shown}/{STATE_DIR}/{RECORD}") if sfd is not None else None
    if record is None:
        return None
    why = _mismatch(record, layout, path, build_id)
    if why:
        walk.refuse(f"{shown}: {why}; hpcstack removes only what its records say it published, where they say")
    site = walk.read_json(sfd, SITE_RECORD, f"{shown}/{STATE_DIR}/{SITE_RECORD}") or {}
    return _Build(fd, entry, path, record, site)


def _remove_entry(fd: int, name: str, shown: str) -> None:
    """Remove ``name`` in directory ``fd``: a link or file is unlinked, a directory removed with
    :func:`shutil.rmtree` through descriptors (never following a link; Python >= 3.11, else by
    path below a directory already checked)."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=fd)
    elif sys.version_info >= (3, 11):
        shutil.rmtree(name, dir_fd=fd)
    else:  # pragma: no cover - Python 3.9/3.10: rmtree by path (it opens each level with O_NOFOLLOW)
        shutil.rmtree(shown)


def _remove_build(build: _Build) -> None:
    """Rename the build aside (atomic), then empty it with its record last, then remove it."""
    trash = build.trash or build.entry
    if build.entry != trash:
        os.rename(build.entry, trash, src_dir_fd=build.fd, dst_dir_fd=build.fd)
    shown = os.path.join(os.path.dirname(build.path), trash)
    bfd = os.open(trash, _DIR_FLAGS, dir_fd=build.fd)
    try:
        for entry in os.listdir(bfd):
            if entry != STATE_DIR:
                _remove_entry(bfd, entry, os.path.join(shown, entry))
        try:
            sfd = os.open(STATE_DIR, _DIR_FLAGS, dir_fd=bfd)
        except FileNotFoundError:
            sfd = None
        if sfd is not None:
            try:
                for entry in os.listdir(sfd):
                    if entry != RECORD:
                        _remove_entry(sfd, entry, os.path.join(shown, STATE_DIR, entry))
                try:
                    os.unlink(RECORD, dir_fd=sfd)
                except FileNotFoundError:
                    pass
            finally:
                os.close(sfd)
            os.rmdir(STATE_DIR, dir_fd=bfd)
    finally:
        os.close(bfd)
    os.rmdir(trash, dir_fd=build.fd)


def uninstall(layout: StackLayout, dry_run: bool = False) -> Removal:
    """Remove the stack of ``layout`` as its records say: modulefile, prefix, builds, stage
    dir, state file; or, with ``dry_run``, check everything and say what would go.

    Args:
        layout (StackLayout): the stack, made with :meth:`StackLayout.for_site` (its modulefile
            and stage dir are those of the site, ``--prefix`` and ``--module-root`` applied).
        dry_run (bool): remove nothing.

    Returns:
        Removal: what was (would be) removed and kept; nothing removed when nothing is there.

    Raises:
        Refused: (exit 2) a path on the way is another user's, a symbolic link where the stack
            has a directory, a recorded path is not where the record says, or something is at
            the prefix that no record names (see the module's docstring).
        HpcstackError: a removal fails (e.g. no permission); re-running finishes the job.
    """
    stack = f"{layout.name}/{layout.version}"
    out = Removal()
    with _Walk(stack) as walk:
        f = _Found(walk, layout, os.getpid())
        f.root = walk.open_root(layout.install_root)
        f.top = walk.open_below(f.root, layout.name, layout.top) if f.root is not None else None
        _find_builds(f)
        _find_state(f)
        _find_prefix(f)
        if f.unrecorded and not f.builds and f.state is None and f.prefix_kind is None:
            walk.refuse(f"{f.unrecorded[0]} holds no record of hpcstack's ({STATE_DIR}/{RECORD} naming it); "
                        "hpcstack removes only what its records say it published")
        _find_modulefile(f, out)
        _find_stage(f)
        # what goes, in order: modulefile (users stop seeing it), prefix, builds, stage dir
        if out.modulefile:
            out.removed.append(layout.modulefile)
        if f.prefix_kind:
            out.removed.append(layout.prefix)
        out.removed += [b.path for b in f.builds if b.trash != b.entry and b.path != layout.prefix]
        if f.stage_fd is not None:
            out.removed.append(layout.stage_dir)
        out.kept = [f"{p} (no record of hpcstack's names it)" for p in f.unrecorded]
        out.state_file = layout.state_file if f.state is not None else None
        if dry_run:
            return out
        try:
            _remove_found(f, out)
        except OSError as exc:
            raise HpcstackError(f"cannot remove {stack}: {describe_os_error(exc)}; "
                                "re-run the uninstall to finish") from None
    return out


@dataclass
class _Found:
    """What :func:`uninstall` found of a stack: open directory fds and the records' builds."""

    walk: "_Walk"
    layout: StackLayout
    pid: int
    root: int | None = None
    top: int | None = None
    builds: list = field(default_factory=list)
    unrecorded: list = field(default_factory=list)
    dot_builds: int | None = None
    legacy: int | None = None
    state_fd: int | None = None
    state: os.stat_result | None = None
    state_name: str = ""
    prefix_kind: str | None = None
    mf_fd: int | None = None
    mf_root: int | None = None
    mf_name: str = ""
    stage_fd: int | None = None


def _find_builds(f: _Found) -> None:
    """The builds beside the prefix (and the leftovers of an uninstall cut short), and those of
    the earlier layout, ``<top>/.builds/<version>/<id>``."""
    walk, layout, top = f.walk, f.layout, f.top

    def look(fd: int, entry: str, path: str, build_id: str, trash: str) -> None:
        shown = os.path.join(os.path.dirname(path), entry)
        build = _read_build(walk, layout, fd, entry, path, build_id, shown)
        if build is None:
            f.unrecorded.append(shown)
        else:
            build.trash = trash
            f.builds.append(build)

    for entry in sorted(os.listdir(top)) if top is not None else []:
        found = _entry_id(layout, entry)
        if found:
            build_id, is_trash = found
            look(top, entry, os.path.join(layout.top, f".{layout.version}-{build_id}"), build_id,
                 entry if is_trash else f".{layout.version}.trash-{build_id}-{f.pid}")
    if top is not None:
        f.dot_builds = walk.open_below(top, ".builds", os.path.join(layout.top, ".builds"))
        if f.dot_builds is not None:
            f.legacy = walk.open_below(f.dot_builds, layout.version, layout.legacy_builds_dir)
    for entry in sorted(os.listdir(f.legacy)) if f.legacy is not None else []:
        m = re.fullmatch(r"\.trash-(.+)-[0-9]+", entry)
        build_id = m.group(1) if m else entry
        if (m or not entry.startswith(".")) and "/" not in build_id:
            look(f.legacy, entry, os.path.join(layout.legacy_builds_dir, build_id), build_id,
                 entry if m else f".trash-{entry}-{f.pid}")


def _find_state(f: _Found) -> None:
    """The state file: a record of the stack too (root's, or refused)."""
    walk, layout = f.walk, f.layout
    if f.root is not None:
        hfd = walk.open_below(f.root, STATE_DIR, os.path.join(layout.install_root, STATE_DIR))
        f.state_fd = walk.open_below(hfd, "state", os.path.dirname(layout.state_file)) if hfd is not None else None
    f.state_name = os.path.basename(layout.state_file)
    if f.state_fd is not None:
        f.state = walk.file_at(f.state_fd, f.state_name, layout.state_file)
        if f.state is not None and not stat.S_ISREG(f.state.st_mode):
            walk.refuse(f"the state file {layout.state_file} is not a regular file")


def _find_prefix(f: _Found) -> None:
    """The prefix: a link to a recorded build, or (before staging) a recorded build itself."""
    walk, layout, top = f.walk, f.layout, f.top
    st = walk.file_at(top, layout.version, layout.prefix) if top is not None else None
    if st is not None and stat.S_ISLNK(st.st_mode):
        target = os.readlink(layout.version, dir_fd=top)
        resolved = os.path.normpath(os.path.join(layout.top, target))
        recorded = {b.path for b in f.builds if b.trash != b.entry}
        dangling = resolved not in recorded and not os.path.lexists(resolved)
        if resolved not in recorded and not (dangling and f.state is not None):
            walk.refuse(f"{layout.prefix} -> {target}: no record of hpcstack's says it published that "
                        "(only a link to a recorded build of the stack is removed)")
        f.prefix_kind = "link"
    elif st is not None:
        if not stat.S_ISDIR(st.st_mode):
            walk.refuse(f"{layout.prefix} is not a directory or a link hpcstack made")
        build = _read_build(walk, layout, top, layout.version, layout.prefix, "", layout.prefix)
        if build is None:
            walk.refuse(f"{layout.prefix} holds no record of hpcstack's ({STATE_DIR}/{RECORD} naming it); "
                        "hpcstack removes only what its records say it published")
        build.trash = f".{layout.version}.trash-{PRE_STAGING}-{f.pid}"
        f.builds.insert(0, build)
        f.prefix_kind = "directory"


def _find_modulefile(f: _Found, out: Removal) -> None:
    """The modulefile, only where a record names it."""
    walk, layout = f.walk, f.layout
    f.mf_name = os.path.basename(layout.modulefile or "")
    if not layout.modulefile:
        return
    want = os.path.normpath(layout.modulefile)
    out.recorded_modulefile = any(isinstance(b.record.get("modulefile"), str)
                                  and os.path.normpath(b.record["modulefile"]) == want for b in f.builds)
    if out.recorded_modulefile:
        rfd = f.mf_root = walk.open_root(os.path.dirname(os.path.dirname(want)))
        f.mf_fd = walk.open_below(rfd, layout.name, os.path.dirname(want)) if rfd is not None else None
        mst = walk.file_at(f.mf_fd, f.mf_name, want) if f.mf_fd is not None else None
        if mst is not None:
            if not stat.S_ISREG(mst.st_mode):
                walk.refuse(f"the modulefile {want} is not a regular file (hpcstack writes one)")
            out.modulefile = layout.modulefile
            f.mf_root = rfd


def _find_stage(f: _Found) -> None:
    """The stage dir, only where a record names its stage root."""
    walk, layout = f.walk, f.layout
    if not layout.stage_dir:
        return
    stage_root = os.path.dirname(os.path.normpath(layout.stage_dir))
    if any(isinstance(b.site.get("stage_root"), str) and os.path.normpath(b.site["stage_root"]) == stage_root
           for b in f.builds):
        sfd = walk.open_root(stage_root)
        if sfd is not None and walk.open_below(sfd, os.path.basename(layout.stage_dir),
                                               layout.stage_dir) is not None:
            f.stage_fd = sfd


def _remove_found(f: _Found, out: Removal) -> None:
    """Remove what :func:`uninstall` found, in its order (raises OSError)."""
    layout = f.layout
    if out.modulefile:
        os.unlink(f.mf_name, dir_fd=f.mf_fd)
        os.fsync(f.mf_fd)
    if f.prefix_kind == "link":
        os.unlink(layout.version, dir_fd=f.top)
        os.fsync(f.top)
    for build in f.builds:
        if build.trash != build.entry:
            image.release(build.path)  # a squashfs build's image: unmounted, deleted
        _remove_build(build)
    if f.stage_fd is not None:
        _remove_entry(f.stage_fd, os.path.basename(layout.stage_dir), layout.stage_dir)
    if f.state is not None and not f.unrecorded:
        os.unlink(f.state_name, dir_fd=f.state_fd)
    if f.legacy is not None:
        _rmdir_quiet(f.dot_builds, layout.version)
        _rmdir_quiet(f.top, ".builds")
    if f.top is not None:
        _rmdir_quiet(f.root, layout.name)  # only when empty: other versions stay
    if f.mf_fd is not None:
        _rmdir_quiet(f.mf_root, layout.name)


def _rmdir_quiet(fd: int | None, name: str) -> None:
    """Remove the empty directory ``name`` of ``fd`` (nothing when it is not empty or absent)."""
    if fd is None:
        return
    try:
        os.rmdir(name, dir_fd=fd)
    except OSError:
        pass


def marker_of(layout: StackLayout, removal: Removal) -> str | None:
    """The default marker of the stack's version (:func:`hpcstack.install.layout.default_marker`),
    only where its modulefile is the stack's own (a record names it)."""
    if not (removal.recorded_modulefile and layout.modulefile):
        return None
    return default_marker(os.path.dirname(layout.modulefile), layout.name, layout.version)


def remove_marker(layout: StackLayout, marker: str) -> bool:
    """Remove the default marker ``marker`` (a file or link in the module's directory) through
    the checked directory; never follows a link.

    Returns:
        bool: it was there and is removed.

    Raises:
        Refused: the module directory or the marker is another user's.
    """
    stack = f"{layout.name}/{layout.version}"
    with _Walk(stack) as walk:
        fd = walk.open_root(os.path.dirname(marker))
        if fd is None or walk.file_at(fd, os.path.basename(marker), marker) is None:
            return False
        try:
            os.unlink(os.path.basename(marker), dir_fd=fd)
        except OSError as exc:
            raise HpcstackError(f"cannot remove {marker}: {describe_os_error(exc)}") from None
    return True
