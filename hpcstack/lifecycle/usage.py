"""Who still uses a stack: module loads recorded by the module tools themselves, and the report.

A site opts in with ``lifecycle.usage_log: DIR`` (and ``lifecycle.usage_users: name | hash``).
``hpcstack module usage-hook install --site S`` makes, in that directory:

=====================  ======  =====================================================================
``spool/``             1733    root's; everyone may create files, nobody but root may list it, and
                               the sticky bit keeps users from removing or renaming others' files
``usage.log``          0600    root's: the events collected this month, one line each
``usage-YYYY-MM.log``  0600    root's: those of an earlier month (:data:`KEEP_MONTHS` in all)
``salt``               0600    root's: the salt of ``usage_users: hash``
``hooks/``             0755    ``siteconfig.tcl`` (Environment Modules) and ``SitePackage.lua``
                               (Lmod), rendered for the site's module root
=====================  ======  =====================================================================

At every load of a modulefile under the site's module root the tool's hook creates one new file
in ``spool/`` (``O_CREAT|O_EXCL``, mode 0600, a name from the time in microseconds, the pid and a
random number) holding one line::

    v1 <TAB> unix time <TAB> user <TAB> NAME/VERSION <TAB> host <TAB> SLURM_JOB_ID or - <LF>

Why a spool directory, for a login node (and not ``logger``/syslog, the choice of both tools'
own recipes, nor a setgid helper):

- nothing is started at load: creating one small file costs tens of microseconds, where
  ``exec logger`` forks a process (about 1-2 ms, the 1.1x budget is about 4 ms) and waits for a
  syslog daemon that may be absent, rate-limited (journald drops bursts) or slow;
- the user of an event is the file's owner, which the kernel sets and no user can forge: a line
  naming someone else is dropped; a syslog line or a line of a shared log file says whatever
  its writer wanted;
- users can add events but cannot read (no read bit on the directory: names cannot be listed;
  each file is 0600), rewrite or remove (sticky bit) anyone else's: the properties asked of the
  log, with plain permissions that work on every file system (``chattr +a`` does not on NFS or
  Lustre, and needs the root user to write too);
- a setgid helper would need a compiled binary on every login node, reviewed as privileged code,
  a process per load, and a file system mounted without ``nosuid``.

The costs: one inode per load until collected (``hpcstack usage`` as root moves them into
``usage.log`` and removes them: run it daily from cron), and a user may fill the spool with junk
files (their quota bounds it; junk is dropped at collection). Every line is hostile: see
:func:`parse_spool_file` and :func:`parse_line` for what is accepted.

What keeps the log bounded, whatever users write (each line is well-formed in its writer's own
name, so none of the checks above drops it): a collection logs at most :data:`MAX_USER_EVENTS`
events per user (the rest counted and named in one warning line), and none naming a module that
has no modulefile under the recorded module roots (counted, not logged); the log rotates monthly
and keeps :data:`KEEP_MONTHS` files; readers stream it line by line, newest file first, the files
of their window only, at most :data:`MAX_LOG` bytes in all.

What a collection leaves in the spool: nothing of its own, and of what users put there only the
directories (the hooks make files, never a directory) that still hold something and changed in
the last :data:`SPOOL_DIR_MAX_AGE` seconds (a day; their status change time, which no user can
set back). An empty directory is removed at once, a non-empty one at the first collection after
that bound, with everything in it. Every removal is by descriptor, relative to the spool's
(:func:`hpcstack.gate.unlink`, :func:`hpcstack.gate.rmtree`): a user's link is removed itself,
never followed, and nothing is reached by a name a user could redirect.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import pwd
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack import gate, trust
from hpcstack.errors import ConfigError, HpcstackError

SPOOL, LOG, SALT, HOOKS = "spool", "usage.log", "salt", "hooks"
HOOK_FILES = {"environment-modules": "siteconfig.tcl", "lmod": "SitePackage.lua"}
MARKER = "hpcstack module usage hook: written by hpcstack module usage-hook install; do not edit"
#: The largest spool file read (a line is under 400 bytes).
MAX_EVENT = 1024
_MODULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}(/[A-Za-z0-9][A-Za-z0-9._+-]{0,127}){1,3}$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
_JOB = re.compile(r"^(-|[0-9]{1,20})$")
_USER = re.compile(r"^([a-z_][a-z0-9_.-]{0,63}\$?|h:[0-9a-f]{16})$", re.IGNORECASE)
_ID = re.compile(r"^[0-9]{1,20}\.[0-9]{1,10}\.[0-9]{1,10}$")
#: Events before this time are refused (2020-01-01 UTC): no clock of a login node is that wrong.
EPOCH = 1577836800
#: A user's directory in the spool that still holds something is removed once its status change
#: time (``st_ctime``) is this many seconds old (a day); an empty one at once.
SPOOL_DIR_MAX_AGE = 86400
#: The most bytes the readers take from the log files together, newest first (a line is under
#: 400 bytes: about a million loads); older files past it are not read, and a warning says so.
MAX_LOG = 512 << 20
#: The most events one user adds to the log in one collection; the rest of theirs are counted,
#: dropped and named in one warning line (a daily collection: 20,000 loads a day per user).
MAX_USER_EVENTS = 20000
#: Monthly files kept: ``usage.log`` (this month's collections) and the twelve months before it
#: (``usage-YYYY-MM.log``); an older one is removed at collection.
KEEP_MONTHS = 13
#: The days the kept files surely cover (twelve full months): the longest ``--idle`` answered.
KEEP_DAYS = 365
_ROTATED = re.compile(r"^usage-([0-9]{4})-([0-9]{2})\.log$")
#: The largest salt file read.
MAX_SALT = 4096


@dataclass(frozen=True)
class UsageConfig:
    """A site's ``lifecycle`` keys.

    Attributes:
        directory (str): ``lifecycle.usage_log``: the usage log's directory.
        users (str): ``name`` or ``hash`` (``lifecycle.usage_users``).
    """

    directory: str
    users: str = "name"

    @property
    def spool(self) -> Path:
        return Path(self.directory) / SPOOL

    @property
    def log(self) -> Path:
        return Path(self.directory) / LOG


def usage_config(site) -> UsageConfig | None:
    """The site's usage log settings, or None when it records none (no ``lifecycle.usage_log``)."""
    section = (site.raw or {}).get("lifecycle") or {}
    if not section.get("usage_log"):
        return None
    return UsageConfig(os.path.abspath(section["usage_log"]), section.get("usage_users") or "name")


@dataclass(frozen=True)
class Event:
    """One module load.

    Attributes:
        time (int): Unix time, seconds.
        user (str): the user name, or ``h:`` and 16 hex digits (salted hash).
        module (str): ``NAME/VERSION``.
        host (str): the host it was loaded on.
        job (str | None): ``SLURM_JOB_ID``, None outside a job.
        id (str): the spool file's name (unique per event; duplicates are counted once).
    """

    time: int
    user: str
    module: str
    host: str
    job: str | None
    id: str

    def log_line(self) -> str:
        return "\t".join(("v1", str(self.time), self.user, self.module, self.host, self.job or "-", self.id)) + "\n"


# ------------------------------------------------------------------------------ the hooks

def render_hooks(cfg: UsageConfig, roots: list[str], site: str) -> dict[str, str]:
    """The hook files' text: ``{file name: text}`` (``siteconfig.tcl``, ``SitePackage.lua``).

    Args:
        cfg (UsageConfig): where the spool is.
        roots (list[str]): absolute module roots whose modulefiles are recorded.
        site (str): the site's name (a comment).
    """
    import hpcstack.modules.syntax  # noqa: F401 - registers the tcl_quote and lua_quote filters
    from hpcstack.templates import render

    roots = [r.rstrip("/") for r in roots]
    return {HOOK_FILES[tool]: render(f"templates/usage/{name}.j2", marker=MARKER, spool=str(cfg.spool),
                                     roots=roots, site=site)
            for tool, name in HOOK_FILES.items()}


def _recorded_roots(hooks: str) -> list[str]:
    """The module roots recorded in ``hooks/roots.json`` (read through :mod:`hpcstack.gate`)."""
    try:
        data = json.loads(gate.read_file(os.path.join(hooks, "roots.json"), 1 << 20))
        return [r for r in data.get("roots", []) if isinstance(r, str) and r.startswith("/")]
    except (OSError, ValueError, AttributeError, HpcstackError):
        return []


def _existing_problem(st: os.stat_result, mode: int) -> str | None:
    """Why a directory of the layout that was there already is not as the layout says."""
    if st.st_uid != 0:
        return f"owned by {trust.user_name(st.st_uid)}, not root"
    if stat.S_IMODE(st.st_mode) != mode:
        return f"mode {stat.S_IMODE(st.st_mode):04o}, not {mode:04o}"
    return None


def install_hooks(cfg: UsageConfig, module_root: str, site: str) -> list[str]:
    """Make the usage directory (:mod:`module docstring <hpcstack.lifecycle.usage>`) and write the
    hooks for ``module_root`` and the roots recorded there before (several sites may share one
    usage log). Run again, it rewrites the hooks; it never removes events.

    Every directory and file is reached through :mod:`hpcstack.gate` (from ``/``, by descriptor,
    no link followed, each directory on the way root's alone; the directories above the usage
    directory resolved first, as the site's check resolved them). A directory of the layout is
    given its mode only when made here; one that was there already is never changed: its owner
    must be root and its mode the layout's (``0755``, ``spool`` ``1733``), else it is refused in
    one line (an admin's ``0700`` spool is not opened to every user behind their back).

    Args:
        cfg (UsageConfig): the site's usage settings.
        module_root (str): the site's module root (absolute).
        site (str): the site's name.

    Returns:
        list[str]: what was made or written.

    Raises:
        HpcstackError: not root (the spool must be root's); a path of the layout is a link, not
            a directory, another account's, or (made before) not of the layout's mode; a
            directory above it that another account can change (:class:`hpcstack.gate.GateError`).
    """
    if os.geteuid() != 0:
        raise HpcstackError("the usage log's spool must belong to root: run `hpcstack module usage-hook "
                            "install` as root")
    top = Path(cfg.directory)
    real = os.path.join(os.path.realpath(top.parent), top.name)
    made = []
    for path, where, mode in ((top, real, 0o755), (cfg.spool, os.path.join(real, SPOOL), 0o1733),
                              (top / HOOKS, os.path.join(real, HOOKS), 0o755)):
        created, st = gate.mkdir(where, mode, parents=path == top)
        if created:
            made.append(f"{path}/")
            continue
        problem = _existing_problem(st, mode)
        if problem:
            raise HpcstackError(f"{path}: {problem}; hpcstack changes no directory it did not make: "
                                f"chown root and chmod {mode:04o} it, or choose another lifecycle.usage_log")
    with gate.directory(real) as fd:
        try:
            os.stat(SALT, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            gate.write_atomic(os.path.join(real, SALT), secrets.token_hex(32) + "\n", 0o600)
            made.append(str(top / SALT))
        try:
            os.stat(LOG, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            os.close(os.open(LOG, gate.FILE_NEW, 0o600, dir_fd=fd))
            made.append(str(cfg.log))
    hooks = os.path.join(real, HOOKS)
    roots = sorted(set(_recorded_roots(hooks)) | {os.path.abspath(module_root)})
    gate.write_atomic(os.path.join(hooks, "roots.json"), json.dumps({"roots": roots}, indent=1) + "\n", 0o644)
    for name, text in render_hooks(cfg, roots, site).items():
        gate.write_atomic(os.path.join(hooks, name), text, 0o644)
        made.append(str(top / HOOKS / name))
    return made


def wiring(cfg: UsageConfig, tool: str) -> list[str]:
    """How a site turns the hook on, for ``tool`` (lines for the admin)."""
    hooks = Path(cfg.directory) / HOOKS
    if tool == "lmod":
        return [f"Lmod: export LMOD_PACKAGE_PATH={hooks} in every login shell (e.g. /etc/profile.d/), or "
                f"copy {hooks / 'SitePackage.lua'} over Lmod's libexec/SitePackage.lua; a site with a "
                "load hook of its own calls hpcstack_usage_load(t) from it"]
    return [f"Environment Modules: add `source {hooks / 'siteconfig.tcl'}` to /etc/environment-modules/"
            f"siteconfig.tcl (or export MODULES_SITECONFIG={hooks / 'siteconfig.tcl'})"]


# -------------------------------------------------------------------------- reading events

def _name_of(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def parse_line(text: str, owner: str | None = None, now: float | None = None) -> tuple | None:
    """Check one event line (a spool file's or ``usage.log``'s) and return its fields, or None.

    Accepted: ``v1``, a time from 2020 to five minutes from now, a user name (equal to ``owner``
    when given: the spool file's owner), a ``NAME/VERSION`` of letters, digits and ``._+-``, a
    host name, ``-`` or a job number, and in ``usage.log`` an event id; nothing else, no control
    character. Anything else is a hostile or broken line: None.

    Args:
        text (str): the line, with its newline.
        owner (str | None): the spool file owner's name (None: a line of ``usage.log``, 7 fields).
        now (float | None): the current Unix time (default: now).

    Returns:
        tuple | None: ``(time, user, module, host, job or None[, id])``.
    """
    if not text.endswith("\n") or text.count("\n") != 1 or len(text) > MAX_EVENT:
        return None
    fields = text[:-1].split("\t")
    if len(fields) != (6 if owner is not None else 7) or fields[0] != "v1":
        return None
    _, when, user, module, host, job, *rest = fields
    if not re.fullmatch(r"[0-9]{10}", when):
        return None
    t = int(when)
    if not EPOCH <= t <= (now or time.time()) + 300:
        return None
    if owner is not None and user != owner:
        return None     # a line naming someone else: the file's owner is who loaded it
    if not (_USER.match(user) and _MODULE.match(module) and _HOST.match(host) and _JOB.match(job)):
        return None
    if rest and not _ID.match(rest[0]):
        return None
    return (t, user, module, host, None if job == "-" else job, *rest)


def salted(user: str, salt: str) -> str:
    """``h:`` and the first 16 hex digits of SHA-256(salt NUL user): the same user, the same hash."""
    return "h:" + hashlib.sha256(f"{salt}\0{user}".encode()).hexdigest()[:16]


@dataclass
class Collected:
    """What :func:`collect` did.

    Attributes:
        moved (int): events moved into ``usage.log``.
        dropped (int): files removed that held no valid event (hostile or broken).
        kept (int): users' directories left in the spool (not empty, changed within
            :data:`SPOOL_DIR_MAX_AGE`, or not removable now).
        swept (int): users' directories removed, with what was in them.
        capped (dict[str, int]): per user, the valid events past :data:`MAX_USER_EVENTS` in this
            collection: removed, not logged.
        unknown (int): valid events naming a module that has no modulefile under the module roots
            the hooks record (``hooks/roots.json``): counted here, removed, not logged (a user may
            write any name; only a module that exists is believed).
        rotated (list[str]): monthly files made (``usage-YYYY-MM.log``) or removed (too old).
    """

    moved: int = 0
    dropped: int = 0
    kept: int = 0
    swept: int = 0
    capped: dict = field(default_factory=dict)
    unknown: int = 0
    rotated: list = field(default_factory=list)


def parse_spool_file(dir_fd: int, name: str, now: float | None = None) -> Event | None:
    """Read one spool file safely (as root, in a directory every user writes to): no link
    followed (``O_NOFOLLOW``), no FIFO waited on (``O_NONBLOCK``), a regular file with one link
    only, at most :data:`MAX_EVENT` bytes read, its line checked by :func:`parse_line` against
    the file's owner. None for anything else."""
    if not _ID.match(name):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > MAX_EVENT:
            return None
        data = os.read(fd, MAX_EVENT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    owner = _name_of(st.st_uid)
    try:
        fields = parse_line(data.decode("utf-8"), owner or "", now) if owner else None
    except UnicodeDecodeError:
        return None
    return Event(*fields, id=name) if fields else None


def _usage_dir(cfg: UsageConfig) -> str:
    """The usage directory with the directories above it resolved (as the site's check resolved
    them: a root-owned ``/var/log -> /srv/log`` is fine); the directory itself is not followed."""
    top = Path(cfg.directory)
    return os.path.join(os.path.realpath(top.parent), top.name)


def _roots_directory(dir_fd: int, name: str, shown: Path) -> int:
    """Open the directory ``name`` of ``dir_fd`` (``O_DIRECTORY|O_NOFOLLOW``) and make sure it is
    root's; a link or anything else there is refused.

    Raises:
        HpcstackError: not root's directory (one line naming ``shown``).
        FileNotFoundError: it does not exist.
    """
    try:
        fd = os.open(name, gate.DIR_READ, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise HpcstackError(f"{shown}: not root's directory: the usage log cannot be trusted") from None
        raise OSError(exc.errno, exc.strerror, str(shown)) from None
    if os.fstat(fd).st_uid != 0:
        os.close(fd)
        raise HpcstackError(f"{shown}: not root's directory: the usage log cannot be trusted")
    return fd


def _append_log(top_fd: int, shown: Path, events: list[Event]) -> None:
    """Append ``events`` to ``usage.log`` of the usage directory ``top_fd``: opened (or made,
    0600) there without following a link, and written only when it is root's regular file."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 0o600, dir_fd=top_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
            raise HpcstackError(f"{shown}: not root's file: the usage log cannot be trusted")
        os.write(fd, "".join(e.log_line() for e in events).encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _month(t: float) -> int:
    """The UTC month of the Unix time ``t``, as ``year * 12 + month - 1``."""
    d = _dt.datetime.fromtimestamp(t, _dt.timezone.utc)
    return d.year * 12 + d.month - 1


def _rotated_month(name: str) -> int | None:
    """The month of a rotated file's name (``usage-2024-05.log``), or None: not one."""
    m = _ROTATED.match(name)
    return int(m.group(1)) * 12 + int(m.group(2)) - 1 if m and 1 <= int(m.group(2)) <= 12 else None


def _rotate(top_fd: int, now: float) -> list[str]:
    """Monthly rotation in the usage directory ``top_fd``: a ``usage.log`` last written in an
    earlier month than ``now``'s is renamed ``usage-YYYY-MM.log`` (that month; by descriptor,
    :func:`hpcstack.gate.rename`); rotated files of :data:`KEEP_MONTHS` months ago or older are
    removed (:func:`hpcstack.gate.unlink`). Returns the names made or removed."""
    out = []
    try:
        st = os.stat(LOG, dir_fd=top_fd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode) and st.st_size and _month(st.st_mtime) < _month(now):
        m = _month(st.st_mtime)
        name = f"usage-{m // 12:04d}-{m % 12 + 1:02d}.log"
        try:
            os.stat(name, dir_fd=top_fd, follow_symlinks=False)
        except FileNotFoundError:           # never over a month's file (the clock set back): kept growing
            gate.rename(top_fd, LOG, name)
            out.append(name)
    for name in sorted(os.listdir(top_fd)):
        m = _rotated_month(name)
        if m is not None and m <= _month(now) - KEEP_MONTHS:
            gate.unlink(top_fd, name)
            out.append(f"-{name}")
    return out


def _module_known(roots: list[str], module: str, cache: dict) -> bool:
    """``module`` (``NAME/VERSION``) has a modulefile (or ``.lua``) under one of ``roots``; True
    when no root is recorded (nothing to check against). ``lstat`` only: nothing is opened."""
    if not roots:
        return True
    if module not in cache:
        cache[module] = any(os.path.lexists(os.path.join(r, module + ext)) for r in roots for ext in ("", ".lua"))
    return cache[module]


def _sweep_directory(spool_fd: int, name: str, now: float) -> bool:
    """Remove a user's directory ``name`` from the spool (``spool_fd``) when it is empty, or when
    its status changed more than :data:`SPOOL_DIR_MAX_AGE` seconds before ``now`` (with what is
    in it, :func:`hpcstack.gate.rmtree`: by descriptor, no link followed, no other file system
    entered). True when it is gone."""
    try:
        st = os.stat(name, dir_fd=spool_fd, follow_symlinks=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        if not stat.S_ISDIR(st.st_mode):        # swapped for a file or a link meanwhile: removed itself
            gate.unlink(spool_fd, name)
            return True
        try:
            os.rmdir(name, dir_fd=spool_fd)     # unlinkat(AT_REMOVEDIR): an empty directory only
            return True
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if now - st.st_ctime < SPOOL_DIR_MAX_AGE:
            return False
        gate.rmtree(spool_fd, name)
        return True
    except FileNotFoundError:
        return True
    except (OSError, HpcstackError):            # a mount in it, a tree too deep: kept, tried again next time
        return False


def collect(cfg: UsageConfig, now: float | None = None, pol=None) -> Collected:
    """Move the spool's events into ``usage.log`` (names or salted hashes, as the site chose) and
    remove their files; drop (remove) files that hold no valid event; remove the directories that
    users made in the spool once empty or older than :data:`SPOOL_DIR_MAX_AGE` (the module's
    docstring). Root only; a non-root caller collects nothing.

    Everything is reached by descriptor: the usage directory through the gate
    (:func:`hpcstack.gate.open_dir`: from ``/``, no link followed, each directory on the way
    under the trust rule), the spool, ``salt`` and ``usage.log`` relative to it, each spool entry
    relative to the spool, and removed there (:func:`hpcstack.gate.unlink`,
    :func:`hpcstack.gate.rmtree`).

    Args:
        cfg (UsageConfig): the site's usage settings.
        now (float | None): the current Unix time (default: now).
        pol (hpcstack.trust.Policy | None): whom to trust above the usage directory (default
            :func:`hpcstack.gate.current_policy`).

    Returns:
        Collected: what was moved, dropped, kept and swept.

    Raises:
        HpcstackError: the usage directory or the spool is not root's, a link, or below a
            directory another account can change; ``usage.log`` cannot be written or is not
            root's file; no salt where the site hashes user names.
    """
    done = Collected()
    if os.geteuid() != 0:
        return done
    now = time.time() if now is None else now
    real = _usage_dir(cfg)
    try:
        top_fd = gate.open_dir(real, pol)
    except FileNotFoundError:
        return done
    try:
        if os.fstat(top_fd).st_uid != 0:
            raise HpcstackError(f"{cfg.directory}: not root's directory: the usage log cannot be trusted")
        try:
            spool_fd = _roots_directory(top_fd, SPOOL, cfg.spool)
        except FileNotFoundError:
            return done
        try:
            _collect_spool(cfg, real, top_fd, spool_fd, now, pol, done)
        finally:
            os.close(spool_fd)
    finally:
        os.close(top_fd)
    return done


def _collect_spool(cfg: UsageConfig, real: str, top_fd: int, spool_fd: int, now: float, pol,
                   done: Collected) -> None:
    """:func:`collect` once the usage directory and its spool are open and root's."""
    salt = ""
    if cfg.users == "hash":
        try:
            salt = gate.read_file(os.path.join(real, SALT), MAX_SALT, pol).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            pass
        if not salt:
            raise HpcstackError(f"{Path(cfg.directory) / SALT}: no salt (run hpcstack module usage-hook install)")
    events, done_names, drop, directories = [], [], [], []
    per_user: dict[str, int] = {}
    roots, known = _recorded_roots(os.path.join(real, HOOKS)), {}
    for name in sorted(os.listdir(spool_fd)):
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=spool_fd, follow_symlinks=False).st_mode):
                directories.append(name)
                continue
        except OSError:
            continue
        event = parse_spool_file(spool_fd, name, now)
        if event is None:
            drop.append(name)
            continue
        per_user[event.user] = per_user.get(event.user, 0) + 1
        if per_user[event.user] > MAX_USER_EVENTS:
            done.capped[event.user] = per_user[event.user] - MAX_USER_EVENTS
            done_names.append(name)
            continue
        if not _module_known(roots, event.module, known):
            done.unknown += 1
            done_names.append(name)
            continue
        if cfg.users == "hash":
            event = Event(event.time, salted(event.user, salt), event.module, event.host, event.job, event.id)
        events.append(event)
        done_names.append(name)
    done.rotated = _rotate(top_fd, now)
    if events:
        _append_log(top_fd, cfg.log, events)
    for user, n in sorted(done.capped.items()):
        print(f"warning: usage: {user} wrote {n + MAX_USER_EVENTS} events in one collection: the "
              f"{n} past {MAX_USER_EVENTS} were dropped", file=sys.stderr)
    if done.unknown:
        print(f"note: usage: {done.unknown} events named a module with no modulefile under the module roots: "
              "counted, not logged", file=sys.stderr)
    for name in done_names + drop:
        try:
            gate.unlink(spool_fd, name)         # unlinkat: the entry itself, never a directory
        except (OSError, HpcstackError):        # gone meanwhile, or swapped for a directory: next time
            continue
    for name in directories:
        if _sweep_directory(spool_fd, name, now):
            done.swept += 1
        else:
            done.kept += 1
    done.moved, done.dropped = len(events), len(drop)


def read_lines(fh, budget: list[int]):
    """The lines of the binary stream ``fh``, one at a time (``readline`` of at most
    :data:`MAX_EVENT` + 1 bytes: memory stays bounded whatever the file holds): each as text, or
    None for a line longer than an event (skipped in pieces, never held whole) or not UTF-8.
    ``budget[0]`` is the bytes still allowed (:data:`MAX_LOG`, shared by the files of one read);
    it stops when spent."""
    while budget[0] > 0:
        line = fh.readline(MAX_EVENT + 1)
        if not line:
            return
        budget[0] -= len(line)
        if len(line) > MAX_EVENT and not line.endswith(b"\n"):
            while budget[0] > 0:            # the rest of an overlong line, in pieces
                rest = fh.readline(MAX_EVENT + 1)
                budget[0] -= len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            yield None
            continue
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            yield None


def log_files(cfg: UsageConfig, since: float | None = None, pol=None) -> list[str]:
    """The log's files to read, newest first: ``usage.log``, then the rotated ``usage-YYYY-MM.log``
    whose month does not end before ``since`` (a file holds what was collected in its month)."""
    with gate.directory(_usage_dir(cfg), pol) as fd:
        names = os.listdir(fd)
    first = None if since is None else _month(since)
    rotated = sorted((n for n in names if _rotated_month(n) is not None
                      and (first is None or _rotated_month(n) >= first)), reverse=True)
    return ([LOG] if LOG in names else []) + rotated


def iter_log(cfg: UsageConfig, now: float | None = None, pol=None, since: float | None = None, bad: list | None = None):
    """The events of the log (:func:`log_files`), one at a time, each id once, those before
    ``since`` left out; ``bad[0]`` counts the lines that were not valid events.

    Each file is opened through the gate (:func:`hpcstack.gate.open_file`: no link followed from
    ``/``, each directory on the way under the trust rule, a regular file) and read line by line
    (:func:`read_lines`); together at most :data:`MAX_LOG` bytes, newest file first: what is past
    it is not read, with one warning line.

    Raises:
        HpcstackError: the log cannot be read (not root: it is root's alone), or the gate refuses
            it (a link, a directory another account can change).
    """
    bad = [0] if bad is None else bad
    budget, seen = [MAX_LOG], set()
    try:
        names = log_files(cfg, since, pol)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HpcstackError(f"cannot read the usage log {cfg.log}: {exc.strerror} (it is root's: run as root)") from None
    for name in names:
        if budget[0] <= 0:
            print(f"warning: usage: read {MAX_LOG >> 20} MiB of {cfg.directory}; {name} and older files not read",
                  file=sys.stderr)
            return
        try:
            fd = gate.open_file(os.path.join(_usage_dir(cfg), name), pol)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise HpcstackError(f"cannot read the usage log {Path(cfg.directory) / name}: {exc.strerror} "
                                "(it is root's: run as root)") from None
        with os.fdopen(fd, "rb") as fh:
            for line in read_lines(fh, budget):
                fields = parse_line(line, None, now) if line is not None else None
                if not fields:
                    bad[0] += 1
                    continue
                if fields[-1] in seen or (since is not None and fields[0] < since):
                    continue
                seen.add(fields[-1])
                yield Event(*fields[:5], id=fields[5])


def read_log(cfg: UsageConfig, now: float | None = None, pol=None, since: float | None = None) -> tuple[list[Event], int]:
    """The events of the log from ``since`` on (each id once) and how many lines were not valid
    events: :func:`iter_log` into a list.

    Raises:
        HpcstackError: as :func:`iter_log`.
    """
    bad = [0]
    events = list(iter_log(cfg, now, pol, since, bad))
    return events, bad[0]


# ------------------------------------------------------------------------------ the report

@dataclass
class StackUsage:
    """What the log says of one module.

    Attributes:
        module (str): ``NAME/VERSION``.
        users (set[str]): distinct users (names or hashes).
        loads (int): loads.
        jobs (set[str]): distinct Slurm job ids it was loaded in.
        first (int), last (int): Unix times of the first and last load.
    """

    module: str
    users: set = field(default_factory=set)
    loads: int = 0
    jobs: set = field(default_factory=set)
    first: int = 0
    last: int = 0

    def to_json(self) -> dict:
        return {"stack": self.module, "users": len(self.users), "loads": self.loads, "jobs": len(self.jobs),
                "first": _iso(self.first), "last": _iso(self.last)}


def _iso(t: int) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_since(value: str, now: float | None = None) -> float:
    """``--since``: ``90d``, ``12w``, ``48h`` or a date ``YYYY-MM-DD`` -> Unix time.

    Raises:
        ConfigError: any other form.
    """
    now = time.time() if now is None else now
    m = re.fullmatch(r"([0-9]{1,5})([hdw])", value)
    if m:
        return now - int(m.group(1)) * {"h": 3600, "d": 86400, "w": 7 * 86400}[m.group(2)]
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
            return _dt.datetime.fromisoformat(value).replace(tzinfo=_dt.timezone.utc).timestamp()
    except ValueError:
        pass
    raise ConfigError([f"--since: {value!r}: give days, weeks or hours (90d, 12w, 48h) or a date YYYY-MM-DD"])


def matches(module: str, stack: str | None) -> bool:
    """``module`` is ``stack`` (``NAME/VERSION``) or a version of it (``NAME``); None matches all."""
    return stack is None or module == stack or module.startswith(stack.rstrip("/") + "/")


def report(events: list[Event], stack: str | None = None, since: float | None = None) -> list[StackUsage]:
    """Per module, from ``events``: users, loads, jobs, first and last load, sorted by module.

    Args:
        events (list[Event]): the log's events.
        stack (str | None): ``NAME/VERSION`` or ``NAME``; None: every module.
        since (float | None): only loads from this Unix time on.
    """
    out: dict[str, StackUsage] = {}
    for e in events:
        if (since is not None and e.time < since) or not matches(e.module, stack):
            continue
        u = out.setdefault(e.module, StackUsage(e.module, first=e.time, last=e.time))
        u.users.add(e.user)
        u.loads += 1
        if e.job:
            u.jobs.add(f"{e.job}")
        u.first, u.last = min(u.first, e.time), max(u.last, e.time)
    return [out[k] for k in sorted(out)]


def render_table(rows: list[StackUsage]) -> str:
    """The report as an aligned text table (one row per stack)."""
    head = ("STACK", "USERS", "LOADS", "JOBS", "FIRST", "LAST")
    lines = [head] + [(r.module, str(len(r.users)), str(r.loads), str(len(r.jobs)), _iso(r.first), _iso(r.last))
                      for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines) + "\n"


def site_events(site, now: float | None = None, since: float | None = None) -> tuple[list[Event], Collected, int]:
    """Collect (as root) and read a site's events (from ``since`` on: only the files and events
    of that window are kept, :func:`read_log`).

    Returns:
        tuple: the events, what collection did, and the count of bad lines in ``usage.log``.

    Raises:
        HpcstackError: the site records no usage (no ``lifecycle.usage_log``), or the log
            cannot be read.
    """
    cfg = usage_config(site)
    if cfg is None:
        raise HpcstackError(f"site {site.name} records no module usage: set lifecycle.usage_log in its config "
                            "and run hpcstack module usage-hook install (docs/lifecycle.md)")
    collected = collect(cfg, now)
    events, bad = read_log(cfg, now, since=since)
    return events, collected, bad


def summary(site, module: str, days: float = 90, now: float | None = None) -> str:
    """One line on the use of ``module`` over the last ``days`` days, for ``module deprecate``
    (it never raises: a site without a usage log, or a log it cannot read, is said so)."""
    now = time.time() if now is None else now
    try:
        events, _, _ = site_events(site, now, now - days * 86400)
    except HpcstackError as exc:
        return f"usage of {module}: unknown ({exc})"
    rows = report(events, module, now - days * 86400)
    if not rows:
        return f"usage of {module}: no loads in the last {days:g} days"
    r = rows[0]
    return (f"usage of {module} in the last {days:g} days: {len(r.users)} users, {r.loads} loads, "
            f"{len(r.jobs)} jobs, last on {_iso(r.last)}")


def idle_refusal(site, module: str, idle_days: int, now: float | None = None) -> str | None:
    """Why ``hpcstack uninstall`` (retiring a stack) must not remove ``module`` now: it was loaded
    in the last ``idle_days`` days, or its use cannot be read. None when the site records no
    usage or the module has been idle long enough."""
    if usage_config(site) is None:
        return None
    if idle_days > KEEP_DAYS:
        return (f"refusing to uninstall {module}: the usage log keeps {KEEP_DAYS} days, not --idle {idle_days}; "
                f"give --idle {KEEP_DAYS} or less, or use --force")
    now = time.time() if now is None else now
    try:
        events, _, _ = site_events(site, now, now - idle_days * 86400)
    except HpcstackError as exc:
        return f"refusing to uninstall {module}: cannot tell whether it is in use ({exc}); use --force"
    rows = report(events, module, now - idle_days * 86400)
    if not rows:
        return None
    r = rows[0]
    return (f"refusing to uninstall {module}: {len(r.users)} user{'s' if len(r.users) != 1 else ''} loaded it "
            f"in the last {idle_days} days ({r.loads} loads, last on {_iso(r.last)}); wait, or use --force")


# ---------------------------------------------------------------------------- command line

def cmd_usage(args, session) -> int:
    """``hpcstack usage``: the report (:func:`report`); 0 when printed.

    Args:
        args (argparse.Namespace): the command line.
        session (hpcstack.session.Session): the command's session (its site and policy).
    """
    if args.stack is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)?",
                                                   args.stack):
        raise ConfigError([f"{args.stack!r}: expected NAME/VERSION or NAME, e.g. pytorch/2.3.1-gpu"])
    since = parse_since(args.since)
    site = session.site
    cfg = usage_config(site)
    if cfg is not None:   # root reads the log and writes it (collect): checked like an install root
        session.check_dirs([("lifecycle.usage_log", cfg.directory),
                            ("lifecycle.usage_log", os.path.join(cfg.directory, HOOKS))])
    with session.gate.trusting():     # the command's policy (admin group) in every read of the log
        events, collected, bad = site_events(site, since=since)
    rows = report(events, args.stack, since)
    if args.json:
        print(json.dumps({"site": site.name, "since": _iso(int(since)), "stacks": [r.to_json() for r in rows],
                          "ignored_lines": bad + collected.dropped}, indent=1))
    else:
        sys.stdout.write(render_table(rows) if rows else f"no loads of {args.stack or 'any stack'} since {_iso(int(since))}\n")
    if collected.dropped or bad:
        print(f"note: ignored {collected.dropped + bad} entries that were not valid events", file=sys.stderr)
    return 0


def cmd_usage_hook(args, session) -> int:
    """``hpcstack module usage-hook install``: :func:`install_hooks`, then how to wire them.

    Args:
        args (argparse.Namespace): the command line.
        session (hpcstack.session.Session): the command's session (its site, with
            ``--module-root``, and its policy).
    """
    site = session.site
    cfg = usage_config(site)
    if cfg is None:
        raise ConfigError([f"site {site.name}: lifecycle.usage_log is not set: the site records no module usage"])
    with session.gate.trusting():     # the command's trust policy (admin group, --trust-writable)
        written = install_hooks(cfg, site.module_root, site.name)
    for path in written:
        print(f"wrote {path}")
    for line in wiring(cfg, site.modules.tool):
        print(f"turn it on: {line}")
    print(f"collect and report (as root, e.g. daily from cron): hpcstack usage --site {site.ref or site.name}")
    return 0

