"""Whom hpcstack trusts: the files it runs and reads, the directories it writes and reads back.

hpcstack executes recipes (Python) and follows site configs (which say where to install and
what to remove); it writes stacks, modulefiles, caches and stage directories and later reads
them back (a cached wheel is installed, a modulefile is loaded, a stage dir is resumed). Run as
root on a login node that every user shares, it would hand root to anyone who can change one of
those files or a directory above them. So every such path, and each directory above it up to
``/`` (both as named and with its links resolved), must be changeable only by *trusted
accounts*:

* owned by root, by the account running hpcstack, or by a member of the *admin group*;
* not writable by others, and writable by its group only where that group is root's, the admin
  group or (not as root) the running account's own private group;
* a world- or group-writable directory with the sticky bit (``/tmp``) is accepted above a path
  that a trusted account owns (others cannot rename or remove it there).

The same rule as OpenSSH's ``StrictModes`` and sudo's checks of ``sudoers``.

The admin group is never named by a file under check: it comes from :data:`SYSTEM_CONFIG`
(``admin_group:``; the file itself must be root's and writable by root alone) or from the
``--admin-group`` option of whoever runs hpcstack. A site config's ``permissions.admin_group``
does not count (docs/admin/security.md).

The built-in recipes and sites are part of hpcstack's own installation and are not checked (the
path as named must lie inside hpcstack's data, not only resolve there). ``--trust-writable``
turns every check off for those who mean it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpcstack import data_root
from hpcstack.errors import ConfigError

#: The option that turns the checks off.
OVERRIDE = "--trust-writable"

#: The option that names the admin group (besides :data:`SYSTEM_CONFIG`).
ADMIN_OPTION = "--admin-group"

#: The option that names another system configuration file (for a root admin; no environment
#: variable can move it).
CONFIG_OPTION = "--system-config"

#: hpcstack's system configuration: only root writes it; it names the admin group.
SYSTEM_CONFIG = "/etc/hpcstack/config.yaml"

#: A directory of a recipe with more entries than this is refused (each entry is checked).
_MAX_FILES = 20000

_CONFIG_SCHEMA = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "admin_group": {"type": ["string", "null"], "maxLength": 256, "pattern": r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$"},
    },
}


def user_name(uid: int) -> str:
    """The account name of ``uid`` (the number itself where the password database has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


@dataclass(frozen=True)
class Policy:
    """Whom this run of hpcstack trusts (see the module's docstring for the rule).

    Build it with :func:`policy`.

    Attributes:
        uid (int): the account running hpcstack (its effective uid).
        admin_group (str | None): the admin group's name, None when there is none.
        admin_gid (int | None): its gid.
        admin_source (str): where it was named: ``--admin-group`` or the system config's path.
        admin_uids (frozenset[int]): the group's members (listed in it or with it as primary group).
        private_gids (frozenset[int]): the running account's own private group (not as root).
        trust_writable (bool): ``--trust-writable``: no check at all.
        stack_gids (frozenset[int]): groups a checked site config gives write access to its
            stacks (``permissions.group`` with a mode such as ``g+rwX``): trusted to write the
            directories of those stacks only (:meth:`for_site_dirs`), never to change inputs.
    """

    uid: int
    admin_group: str | None = None
    admin_gid: int | None = None
    admin_source: str = ""
    admin_uids: frozenset = field(default_factory=frozenset)
    private_gids: frozenset = field(default_factory=frozenset)
    trust_writable: bool = False
    stack_gids: frozenset = field(default_factory=frozenset)

    def for_site_dirs(self, group: str | None) -> "Policy":
        """This policy, with the site's stack group (``permissions.group``, from a site config
        that passed the check) trusted to write as well: for the directories of the site's
        stacks, which the site gives that group on purpose. A group this machine does not have
        adds nothing (the install names it)."""
        if not group:
            return self
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            return self
        return replace(self, stack_gids=self.stack_gids | {gid})

    def trusted_uid(self, uid: int) -> bool:
        """True for root, the running account and the admin group's members."""
        return uid in (0, self.uid) or uid in self.admin_uids

    def trusted_gid(self, gid: int) -> bool:
        """True for root's group, the admin group and the running account's private group."""
        return gid == 0 or gid == self.admin_gid or gid in self.private_gids or gid in self.stack_gids

    def who(self) -> str:
        """Whom the rule trusts, in words: ``"root"``, ``"root and group hpcadm"``, ``"root and you"``."""
        who = "root" if self.uid == 0 else f"root and you ({user_name(self.uid)})"
        return who + (f" and group {self.admin_group}" if self.admin_group else "")


def _admin_members(gid: int, name: str) -> frozenset:
    members = set()
    try:
        for user in grp.getgrgid(gid).gr_mem:
            try:
                members.add(pwd.getpwnam(user).pw_uid)
            except KeyError:
                pass
        members |= {p.pw_uid for p in pwd.getpwall() if p.pw_gid == gid}
    except KeyError:
        pass
    return frozenset(members)


def _private_gids(uid: int) -> frozenset:
    """The running account's user-private group (named as the account, no other member)."""
    if uid == 0:
        return frozenset()
    try:
        pw = pwd.getpwuid(uid)
        g = grp.getgrgid(pw.pw_gid)
    except KeyError:
        return frozenset()
    return frozenset({g.gr_gid}) if g.gr_name == pw.pw_name and set(g.gr_mem) <= {pw.pw_name} else frozenset()


def read_system_config(path: str | os.PathLike = SYSTEM_CONFIG) -> dict:
    """Read hpcstack's system configuration (``admin_group:``), checked before it is read.

    The file and every directory above it must be root's and writable by root alone (no admin
    group widens this: the file names the group). A missing file is an empty configuration.

    Args:
        path (str | os.PathLike): the file (default :data:`SYSTEM_CONFIG`; another one only
            through :data:`CONFIG_OPTION`).

    Returns:
        dict: its keys (``{}`` when there is no file).

    Raises:
        ConfigError: the file is not root's alone, or not valid (one line, exit status 2).
    """
    from hpcstack import schema

    if not os.path.lexists(path):
        return {}
    problem = path_problem(path, Policy(uid=0))
    if problem:
        where, _, what = problem.partition(": ")
        problem = what if os.path.abspath(where) == os.path.abspath(path) else problem
        raise ConfigError([f"system configuration {path}: {problem}; it names whom hpcstack trusts, so it "
                           "must be root's and writable by root alone, as every directory above it "
                           "(chown root:root and chmod 644 it)"])
    data = schema.load_yaml(path, "system configuration")
    lines = schema.value_problems(data, str(path)) or schema.problems(_CONFIG_SCHEMA, data, str(path))
    if lines:
        raise ConfigError(lines)
    return dict(data or {})


def policy(admin_group: str | None = None, config: str | os.PathLike | None = None,
           trust_writable: bool = False) -> Policy:
    """The trust policy of this run.

    Args:
        admin_group (str | None): ``--admin-group``: the admin group, as named by whoever runs
            hpcstack (it wins over the system configuration's).
        config (str | os.PathLike | None): ``--system-config``: another system configuration
            file (default :data:`SYSTEM_CONFIG`).
        trust_writable (bool): ``--trust-writable``.

    Returns:
        Policy: whom to trust.

    Raises:
        ConfigError: a system configuration that is not root's alone or not valid; a group this
            machine does not have (one line each, exit status 2).
    """
    uid = os.geteuid()
    if trust_writable:
        return Policy(uid=uid, trust_writable=True)
    if config and not os.path.lexists(config):
        raise ConfigError([f"{CONFIG_OPTION} {config}: no such file"])
    source = ADMIN_OPTION
    if not admin_group:
        admin_group = read_system_config(config or SYSTEM_CONFIG).get("admin_group")
        source = str(config or SYSTEM_CONFIG)
    elif config:
        read_system_config(config)        # still checked: a bad file is a mistake to name
    gid = None
    if admin_group:
        try:
            gid = grp.getgrnam(admin_group).gr_gid
        except KeyError:
            raise ConfigError([f"{source}: admin_group: no group {admin_group!r} on this machine"]) from None
    return Policy(uid=uid, admin_group=admin_group or None, admin_gid=gid, admin_source=source if admin_group else "",
                  admin_uids=_admin_members(gid, admin_group) if gid is not None else frozenset(),
                  private_gids=_private_gids(uid))


def _problem(st: os.stat_result, pol: Policy, child_trusted: bool) -> str | None:
    """Why a path with lstat ``st`` lets an untrusted account change what lies at or below it."""
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and child_trusted
    if not pol.trusted_uid(st.st_uid):
        return f"owned by {user_name(st.st_uid)}"
    if stat.S_ISLNK(st.st_mode) or sticky:
        return None
    if st.st_mode & 0o002:
        return "writable by every user"
    if st.st_mode & 0o020 and not pol.trusted_gid(st.st_gid):
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


def path_problem(path: str | os.PathLike, pol: Policy | None = None, missing_ok: bool = False) -> str | None:
    """Return one line naming how an untrusted account could change ``path``, or None.

    Args:
        path (str | os.PathLike): a file or directory (it and every directory above it count).
        pol (Policy | None): whom to trust (default: root and the running account only).
        missing_ok (bool): a path that does not exist yet is fine below a sticky directory (it
            is for directories hpcstack is about to make; they are checked again once made).

    Returns:
        str | None: e.g. ``"/srv/repo/recipes: writable by every user"``.
    """
    pol = pol or Policy(uid=os.geteuid())
    chain = _chain(Path(path))
    trusted: dict[Path, bool] = {}
    for p in chain:
        try:
            trusted[p] = pol.trusted_uid(os.lstat(p).st_uid)
        except OSError:
            trusted[p] = missing_ok
    for p in chain:
        try:
            st = os.lstat(p)
        except OSError:
            continue
        children = [c for c in chain if c.parent == p and c != p]
        problem = _problem(st, pol, bool(children) and all(trusted[c] for c in children))
        if problem:
            return f"{p}: {problem}"
    return None


def is_builtin(path: str | os.PathLike) -> bool:
    """True for a file of hpcstack's own data, both as named and as resolved (in a checkout,
    ``hpcstack/data/*`` are links to the top-level ``recipes/``, ``site-configs/``, …: those
    count too). A link elsewhere that points into the data is not built-in: whoever owns the
    link's directory could point it elsewhere."""
    data = Path(data_root())
    named_bases = {os.path.abspath(data)}
    real_bases = {os.path.realpath(data)}
    try:
        for entry in data.iterdir():
            named_bases.add(os.path.abspath(entry))
            real_bases.add(os.path.realpath(entry))
    except OSError:
        pass
    named_bases |= real_bases

    def under(p: str, bases: set) -> bool:
        return any(p == base or p.startswith(base + os.sep) for base in bases)

    return under(os.path.abspath(path), named_bases) and under(os.path.realpath(path), real_bases)


def _refusal(problem: str, pol: Policy) -> str:
    return (f"{problem}; hpcstack reads recipes and site configs only where {pol.who()} alone can "
            f"write (fix with chown root / chmod go-w, or pass {OVERRIDE})")


def _walk(directory: Path, pol: Policy, problems: list[str], seen: set[str]) -> None:
    """Every entry below ``directory`` (already checked with the directories above it): its own
    owner and mode; a link, by its whole chain (where it points too)."""
    count = 0
    for top, dirs, files in os.walk(directory, followlinks=False):
        for name in dirs + files:
            count += 1
            if count > _MAX_FILES:
                problems.append(f"{directory}: holds more than {_MAX_FILES} files; hpcstack checks every file of a "
                                f"recipe's directory: keep only what the recipe needs there, or pass {OVERRIDE}")
                return
            p = os.path.join(top, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                problem = path_problem(p, pol)
            else:
                problem = _problem(st, pol, True)
                problem = f"{p}: {problem}" if problem else None
            if problem and not _covered(problem, seen):
                seen.add(problem)
                problems.append(_refusal(problem, pol))


def _covered(problem: str, seen: set[str]) -> bool:
    """True when ``problem`` was said already, or lies below a path already refused (one line
    for a repository its group can write, not one more for each directory in it)."""
    where = problem.partition(": ")[0]
    return problem in seen or any(where == w or where.startswith(w.rstrip(os.sep) + os.sep)
                                  for w in (s.partition(": ")[0] for s in seen))


def check_inputs(paths: list[str | os.PathLike], pol: Policy,
                 recurse: tuple[str | os.PathLike, ...] = ()) -> None:
    """Refuse inputs (recipes, site configs, repositories) that an untrusted account can change.

    Args:
        paths (list): site configs, recipe files, repositories (each with the directories above it).
        pol (Policy): whom to trust (:func:`policy`); with ``trust_writable`` nothing is checked.
        recurse (tuple): directories whose every entry counts too (a recipe's lock files and
            patches).

    Raises:
        ConfigError: one line per refused path, naming it, whom hpcstack trusts and the override
            (exit status 2).
    """
    if pol.trust_writable:
        return
    problems: list[str] = []
    seen: set[str] = set()
    for p in paths:
        if is_builtin(p):
            continue
        problem = path_problem(p, pol)
        if problem and not _covered(problem, seen):
            seen.add(problem)
            problems.append(_refusal(problem, pol))
    for directory in recurse:
        if not is_builtin(directory) and not problems:
            _walk(Path(directory), pol, problems, seen)
    if problems:
        raise ConfigError(problems)


def dir_problem(label: str, path: str | os.PathLike, pol: Policy) -> str | None:
    """One line when a directory hpcstack writes to or reads back (an install root, a module root,
    a cache, a stage dir, a bundle, a kernels directory) can be changed by an untrusted account,
    naming whose it is and how to fix it; None when it is fine (or does not exist yet below
    trusted directories).

    Args:
        label (str): what the directory is, e.g. ``"install root"``, ``"cache_dir"``.
        path (str | os.PathLike): the directory.
        pol (Policy): whom to trust.
    """
    if pol.trust_writable:
        return None
    problem = path_problem(path, pol, missing_ok=True)
    if not problem:
        return None
    where, _, what = problem.partition(": ")
    subject = f"{label} {path}" + ("" if os.path.abspath(where) == os.path.abspath(path) else f": {where}")
    fix = (f"chown {'root' if pol.uid == 0 else user_name(pol.uid)} {where}" if what.startswith("owned by")
           else f"chmod {'o' if 'every' in what else 'g'}-w {where}")
    return (f"{subject}: {what}; hpcstack writes and reads back only directories that {pol.who()} alone can "
            f"change ({fix}, choose another path, or pass {OVERRIDE})")


def check_dirs(dirs: list[tuple[str, str | os.PathLike | None]], pol: Policy) -> None:
    """Refuse directories that hpcstack would write to or read back when an untrusted account can
    change them (:func:`dir_problem`); ``None`` entries are skipped.

    Args:
        dirs (list[tuple[str, path]]): ``(label, directory)`` pairs.
        pol (Policy): whom to trust.

    Raises:
        ConfigError: one line per refused directory (exit status 2).
    """
    problems: list[str] = []
    seen: set[str] = set()
    for label, path in dirs:
        if path is None or pol.trust_writable:
            continue
        problem = path_problem(path, pol, missing_ok=True)
        if problem and not _covered(problem, seen):     # one line for a directory above several of them
            seen.add(problem)
            problems.append(dir_problem(label, path, pol))
    if problems:
        raise ConfigError(problems)


def stat_problem(st: os.stat_result, pol: Policy, child_trusted: bool) -> str | None:
    """The rule of :func:`path_problem` for one component already opened (its ``lstat`` or the
    ``fstat`` of a descriptor that followed no link): why an untrusted account could change what
    lies at or below it, or None. For :mod:`hpcstack.gate`, which walks a path by descriptor.

    Args:
        st (os.stat_result): the component's status.
        pol (Policy): whom to trust.
        child_trusted (bool): the component below it (the next one on the path) belongs to a
            trusted account; only then does a sticky directory writable by others pass.

    Returns:
        str | None: e.g. ``"owned by alice"``, ``"writable by every user"``,
        ``"writable by group users"``.
    """
    return _problem(st, pol, child_trusted)
