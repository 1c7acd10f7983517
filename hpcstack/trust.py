"""What root may read and run: recipes, site configs and repositories that only root can change.

hpcstack executes recipes (Python) and follows site configs (which say where to install and
what to remove). Run as root, it would hand root to anyone who can write one of those files or
a directory above it: a world-writable repository on ``HPCSTACK_PATH`` with a recipe that
shadows a built-in one, a site config in a group-writable directory. So, as root, every such
file, the directories holding it and each directory above them up to ``/`` must be owned by
root and writable by nobody else: not by others, and by the group only where that group is
root's or the site's administrators' (``permissions.admin_group`` in the site config). A
world- or group-writable directory with the sticky bit (``/tmp``) is accepted above a path
that root owns (others cannot rename or remove it there). The same rule as OpenSSH's
``StrictModes`` and sudo's checks of ``sudoers``.

The built-in recipes and sites are part of hpcstack's own installation and are not checked.
``--trust-writable`` turns the check off for those who mean it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

from hpcstack import data_root
from hpcstack.errors import ConfigError

#: The option that turns the check off.
OVERRIDE = "--trust-writable"

#: At most this many files under one recipe directory are looked at (locks, patches, data).
_MAX_FILES = 2000


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def admin_gid(name: str | None) -> int | None:
    """The gid of the site's administrators' group, None when the site names none.

    Raises:
        ConfigError: the site names a group this machine does not have.
    """
    if not name:
        return None
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ConfigError([f"permissions.admin_group: no group {name!r} on this machine"]) from None


def _problem(path: str, st: os.stat_result, admin: int | None, child_root_owned: bool) -> str | None:
    """Why ``path`` (lstat ``st``) lets a user other than root change what lies at or below it."""
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and child_root_owned
    if st.st_uid != 0:
        return f"owned by {_user(st.st_uid)}"
    if st.st_mode & 0o002 and not sticky and not stat.S_ISLNK(st.st_mode):
        return "writable by every user"
    if st.st_mode & 0o020 and st.st_gid not in (0, admin) and not sticky and not stat.S_ISLNK(st.st_mode):
        return f"writable by group {_group(st.st_gid)}"
    return None


def _chain(path: Path) -> list[Path]:
    """``path`` and every directory above it, both as named and as resolved (links followed)."""
    out: list[Path] = []
    for p in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        while True:
            if p not in out:
                out.append(p)
            if p.parent == p:
                break
            p = p.parent
    return out


def path_problem(path: str | os.PathLike, admin: int | None = None) -> str | None:
    """Return one line naming how a user other than root could change ``path``, or None.

    Args:
        path (str | os.PathLike): a file or directory (it and every directory above it count).
        admin (int | None): the gid of the site's administrators, also trusted to write.

    Returns:
        str | None: e.g. ``"/srv/repo/recipes: writable by every user"``.
    """
    chain = _chain(Path(path))
    root_owned: dict[Path, bool] = {}
    for p in chain:
        try:
            root_owned[p] = os.lstat(p).st_uid == 0
        except OSError:
            root_owned[p] = False
    for p in chain:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        children = [c for c in chain if c.parent == p and c != p]
        problem = _problem(str(p), st, admin, bool(children) and all(root_owned[c] for c in children))
        if problem:
            return f"{p}: {problem}"
    return None


def _builtin(path: Path) -> bool:
    """True for a path of hpcstack's own data (in a checkout, ``hpcstack/data/*`` are links to
    the top-level ``recipes/``, ``site-configs/``, …: those count too)."""
    data = Path(data_root())
    bases = {os.path.realpath(data)}
    try:
        bases |= {os.path.realpath(entry) for entry in data.iterdir()}
    except OSError:
        pass
    real = os.path.realpath(path)
    return any(real == base or real.startswith(base + os.sep) for base in bases)


def check_inputs(paths: list[str | os.PathLike], admin_group: str | None = None,
                 recurse: tuple[str | os.PathLike, ...] = ()) -> None:
    """As root, refuse inputs that a user other than root (or the site's admin group) can change.

    Does nothing when not run as root (a user's own files are the user's business).

    Args:
        paths (list): site configs, recipe files, repositories (each with the directories above it).
        admin_group (str | None): the site's ``permissions.admin_group``.
        recurse (tuple): directories whose files count too (a recipe's lock files and patches).

    Raises:
        ConfigError: one line per refused path, naming it and the override (exit status 2).
    """
    if os.geteuid() != 0:
        return
    admin = admin_gid(admin_group)
    todo = [Path(p) for p in paths]
    for directory in recurse:
        for n, sub in enumerate(Path(directory).rglob("*")):
            if n >= _MAX_FILES:
                break
            todo.append(sub)
    problems: list[str] = []
    seen: set[str] = set()
    for p in todo:
        if _builtin(p):
            continue
        problem = path_problem(p, admin)
        if problem and problem not in seen:
            seen.add(problem)
            problems.append(f"{problem}; as root, hpcstack reads recipes and site configs only where "
                            f"only root{' and group ' + admin_group if admin_group else ''} can write "
                            f"(fix with chown root / chmod go-w, or pass {OVERRIDE})")
    if problems:
        raise ConfigError(problems)
