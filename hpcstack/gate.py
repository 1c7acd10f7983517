"""One gate for root's file operations: a path is walked from ``/`` by descriptor, each directory
on the way is checked against the trust rule, and the operation is done on the descriptor.

The holes this closes all had one shape: *a path checked by name, then used again by name*
(``lstat`` then ``chmod``, ``exists`` then ``mkdir``, a mount matched by the name of its
directory). Between the check and the use, anyone who can write a directory on the way can put a
symbolic link or another directory at that name, and root then acts on what they chose. Here:

* every component is opened with ``O_PATH|O_NOFOLLOW|O_DIRECTORY`` relative to the descriptor of
  the one above (``openat(2)``), starting at ``/``: no link is ever followed, anywhere on the
  path, and what is checked is what is used;
* each directory is checked with :func:`hpcstack.trust.stat_problem` (the rule of
  :mod:`hpcstack.trust`: owned by a trusted account; writable by its group or others only where
  :class:`~hpcstack.trust.Policy` trusts the group, or with the sticky bit above a child that a
  trusted account owns);
* the last component is opened for what the operation needs (``O_NOFOLLOW``; ``O_EXCL`` for a new
  file), checked with ``fstat`` on the descriptor (a regular file where a file is meant), and
  changed through it (``fchmod``, ``fsync``; a rename within one directory descriptor).

A refusal is one line, :class:`GateError` (an :class:`~hpcstack.errors.HpcstackError`), naming the
path, the component and the problem. A component that does not exist, or cannot be opened for a
reason that is not a refusal (``EACCES``, ``EIO``), raises the :class:`OSError` itself, with the
component's path as its ``filename``.

Paths must be absolute and hold no ``..``. A path whose directories pass through a link that the
trust rule accepts (a root-owned ``/scratch -> /lustre/scratch``) is given to the gate resolved
(``os.path.realpath``) by callers that have checked it with :func:`hpcstack.trust.check_dirs`
(which checks the named and the resolved chain), or through :func:`resolved`, which follows only
the links that trusted accounts alone can have put there; the gate then refuses any link that
appears on the resolved path afterwards.

The operations: :func:`open_dir` (:func:`directory`), :func:`open_file` (a regular file's
descriptor), :func:`read_file` (regular files, a size cap), :func:`write_atomic`,
:func:`mkdir`; on an open directory's entries :func:`fchmod`, :func:`unlink`, :func:`rmtree`,
:func:`rename`, :func:`walk_files`; and :func:`checked_exec_path`, the path of a checked
executable, the one operation that follows a link, and only a link in a directory that passed
the rule (a venv's ``bin/python``).

Whom to trust: the ``pol`` argument, else the policy of the enclosing :func:`trusting` block
(the install service sets the run's, with the site's stack group), else root and the running
account only. Sources of the rule: OpenSSH's ``StrictModes``, sudo's checks of ``sudoers``;
openat(2), open(2) (``O_PATH``, ``O_NOFOLLOW``), rename(2) for the descriptor discipline.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from contextlib import contextmanager
from dataclasses import replace
from typing import Callable, Iterator

from hpcstack import trust
from hpcstack.errors import HpcstackError

#: A directory on the way: a handle for ``*at()`` calls only (no read permission needed).
DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: The directory an operation works in (listed, ``fsync``-ed, ``fchmod``-ed through it).
DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: A file opened to be checked and changed: never through a link, never blocking on a FIFO.
FILE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: A new file: created here, never an existing name, never through a link.
FILE_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class GateError(HpcstackError):
    """The gate refused a path: one line, ``<path>: <problem>`` (exit status 1).

    Args:
        path (str): the path asked for (or ``<directory>/<name>``).
        problem (str): what is wrong, naming the component where it is not ``path`` itself.

    Attributes:
        path (str), problem (str): as given.
    """

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


def refuse(path: str | os.PathLike, problem: str):
    """Raise :class:`GateError` for ``path``: the one way this module refuses.

    Args:
        path (str | os.PathLike): the path the operation was asked for.
        problem (str): one line, e.g. ``"/var/tmp/x: owned by alice"``.

    Raises:
        GateError: always.
    """
    raise GateError(os.fspath(path), problem)


_policies: list = []


@contextmanager
def trusting(pol):
    """Within the block, the gate's functions called without ``pol`` trust ``pol``.

    Args:
        pol (hpcstack.trust.Policy): whom to trust (e.g. the run's policy with the site's stack
            group, :meth:`hpcstack.trust.Policy.for_site_dirs`).
    """
    _policies.append(pol)
    try:
        yield pol
    finally:
        _policies.pop()


def current_policy():
    """The policy of the innermost :func:`trusting` block, else root and the running account
    (:class:`hpcstack.trust.Policy` with the effective uid)."""
    return _policies[-1] if _policies else trust.Policy(uid=os.geteuid())


# ---------------------------------------------------------------------- the walk

def _parts(path: str | os.PathLike) -> tuple[str, list[str]]:
    p = os.fspath(path)
    if not os.path.isabs(p):
        refuse(p, "not an absolute path")
    parts = [c for c in p.split("/") if c not in ("", ".")]
    if ".." in parts:
        refuse(p, "holds '..' (name the directory itself)")
    return p, parts


def _join(where: str, name: str) -> str:
    return where.rstrip("/") + "/" + name


def _fd_path(fd: int) -> str:
    """The path of a directory descriptor, for messages only."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"(directory descriptor {fd})"


def _not_followed(dir_fd: int, name: str, where: str, target: str, want: str):
    """After ``ELOOP``/``ENOTDIR`` opening ``name``: refuse, saying what is there instead."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        refuse(target, f"{where}: a symbolic link (no link is followed here; name the real path)"
               if where != target else "a symbolic link (no link is followed here; name the real path)")
    refuse(target, (f"{where}: " if where != target else "") + f"not a {want}")


def _open(dir_fd: int, name: str, flags: int, where: str, target: str, want: str, mode: int = 0o600) -> int:
    """``openat(dir_fd, name, flags)``, refusing a link or the wrong kind in one line."""
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _not_followed(dir_fd, name, where, target, want)
        raise OSError(exc.errno, exc.strerror, where) from None


def _judge(where: str, st: os.stat_result, pol, child_trusted: bool, target: str) -> None:
    """Refuse ``where`` (with lstat-equivalent ``st``) when an untrusted account can change it."""
    if pol.trust_writable:
        return
    problem = trust.stat_problem(st, pol, child_trusted)
    if problem:
        subject = f"{where}: {problem}" if where != target else problem
        refuse(target, f"{subject}; hpcstack works only through directories that {pol.who()} alone "
                       f"can change (docs/admin/security.md, 'The gate')")


def _walk(parts: list[str], pol, target: str, make: int | None = None,
          exact: bool = True) -> tuple[int, os.stat_result, str]:
    """Open ``/`` and each of ``parts`` in turn (``DIR_PATH``), judging each directory once its
    child is known; the last one is returned unjudged: ``(O_PATH descriptor, its fstat, its path)``.
    With ``make`` (a mode), missing directories are made (mode ``make``: exactly with ``exact``,
    else under the umask)."""
    fd = os.open("/", DIR_PATH)
    st, where = os.fstat(fd), "/"
    try:
        for name in parts:
            child_where = _join(where, name)
            try:
                child = _open(fd, name, DIR_PATH, child_where, target, "directory")
            except FileNotFoundError:
                if make is None:
                    raise
                _judge(where, st, pol, True, target)    # before anything is made in it
                child = _make(fd, name, make, exact, child_where, target)
            cst = os.fstat(child)
            try:
                _judge(where, st, pol, pol.trusted_uid(cst.st_uid), target)
            except BaseException:
                os.close(child)
                raise
            os.close(fd)
            fd, st, where = child, cst, child_where
        return fd, st, where
    except BaseException:
        os.close(fd)
        raise


def _make(dir_fd: int, name: str, mode: int, exact: bool, where: str, target: str) -> int:
    """Make directory ``name`` in ``dir_fd`` and return its ``DIR_PATH`` descriptor; with
    ``exact``, made 0700 then given ``mode`` through a descriptor (the umask does not apply)."""
    try:
        os.mkdir(name, 0o700 if exact else mode, dir_fd=dir_fd)
    except FileExistsError:     # made meanwhile by someone else: judged as found
        return _open(dir_fd, name, DIR_PATH, where, target, "directory")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None
    fd = _open(dir_fd, name, DIR_READ, where, target, "directory")
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            refuse(target, f"{where}: replaced by another account's directory while it was made")
        if exact:
            os.fchmod(fd, mode)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _reopen(fd: int, flags: int, where: str) -> int:
    """A new descriptor of the directory ``fd`` (``O_PATH``) with ``flags`` (``openat(fd, ".")``)."""
    try:
        return os.open(".", flags, dir_fd=fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None


# ---------------------------------------------------------------------- operations

def open_dir(path: str | os.PathLike, pol=None) -> int:
    """Open the directory ``path`` through the gate: every directory from ``/`` down to it
    opened without following a link and checked against the trust rule, itself included (a
    sticky world-writable directory is refused as the last component, as
    :func:`hpcstack.trust.path_problem` refuses it).

    Args:
        path (str | os.PathLike): an absolute path, no ``..``.
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).

    Returns:
        int: a descriptor (``O_RDONLY|O_DIRECTORY``, close-on-exec) for ``*at()`` calls, listing
        (``os.scandir(fd)``), ``fsync`` and ``fchmod``; the caller closes it.

    Raises:
        GateError: a link or a non-directory on the path, or a directory another account can
            change (one line).
        OSError: a component is missing or cannot be opened (its path is the ``filename``).
    """
    pol = pol or current_policy()
    target, parts = _parts(path)
    fd, st, where = _walk(parts, pol, target)
    try:
        _judge(where, st, pol, False, target)
        return _reopen(fd, DIR_READ, where)
    finally:
        os.close(fd)


@contextmanager
def directory(path: str | os.PathLike, pol=None) -> Iterator[int]:
    """:func:`open_dir` as a context manager: yields the descriptor and closes it."""
    fd = open_dir(path, pol)
    try:
        yield fd
    finally:
        os.close(fd)


def _parent(path: str | os.PathLike, pol) -> tuple[str, str, int, os.stat_result, str]:
    """``(target, last name, O_PATH fd of the directory above, its fstat, its path)``; the
    directory itself is left for the caller to judge (it knows the child)."""
    target, parts = _parts(path)
    if not parts:
        refuse(target, "the root directory is not a file")
    fd, st, where = _walk(parts[:-1], pol, target)
    return target, parts[-1], fd, st, where


def open_file(path: str | os.PathLike, pol=None) -> int:
    """Open a regular file through the gate for reading: its directories as :func:`open_dir`
    checks them, the file opened with ``O_NOFOLLOW|O_NONBLOCK`` (a FIFO does not block the
    open, a link is not followed) and checked by ``fstat`` on that descriptor: a regular file
    that only trusted accounts can change. For a file too large to read whole (a wheel, an
    image archive), read through the descriptor (``os.fdopen``); :func:`read_file` reads small
    ones.

    Args:
        path (str | os.PathLike): an absolute path, no ``..``.
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).

    Returns:
        int: a descriptor (``O_RDONLY|O_NONBLOCK``, close-on-exec; ``O_NONBLOCK`` changes nothing
        for a regular file) of the checked file; the caller closes it.

    Raises:
        GateError: a link anywhere, not a regular file, an untrusted owner or writer of the file
            or of a directory above it.
        OSError: missing or unreadable (its path is the ``filename``).

    Sources: open(2) (``O_NOFOLLOW``, ``O_NONBLOCK``), fstat(2), openat(2).
    """
    pol = pol or current_policy()
    target, name, dfd, dst, where = _parent(path, pol)
    try:
        f = _open(dfd, name, FILE_READ, target, target, "regular file")
        try:
            fst = os.fstat(f)
            _judge(where, dst, pol, pol.trusted_uid(fst.st_uid), target)
            if not stat.S_ISREG(fst.st_mode):
                refuse(target, "not a regular file")
            _judge(target, fst, pol, False, target)
            return f
        except BaseException:
            os.close(f)
            raise
    finally:
        os.close(dfd)


def read_file(path: str | os.PathLike, max_bytes: int, pol=None, *, one_link: bool = False) -> bytes:
    """Read a regular file through the gate (:func:`open_file`: its directories as
    :func:`open_dir` checks them, the file opened with ``O_NOFOLLOW|O_NONBLOCK`` and checked by
    ``fstat``: a regular file that only trusted accounts can change).

    Args:
        path (str | os.PathLike): an absolute path.
        max_bytes (int): the most bytes accepted; a larger file is refused (not read in part).
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).
        one_link (bool): refuse a file with more than one hard link (a file of another
            directory, say ``/etc/shadow``, linked into one another account owns: reading
            anyone's files without the owner rule, root would show it).

    Returns:
        bytes: the file's content.

    Raises:
        GateError: a link anywhere, not a regular file, an untrusted owner or writer, larger
            than ``max_bytes``, or (``one_link``) more than one hard link.
        OSError: missing or unreadable.
    """
    target = os.fspath(path)
    f = open_file(path, pol)
    try:
        fst = os.fstat(f)
        if fst.st_size > max_bytes:
            refuse(target, f"larger than {max_bytes} bytes ({fst.st_size})")
        if one_link and fst.st_nlink > 1:
            refuse(target, f"has {fst.st_nlink} hard links (a file that is also elsewhere is not read)")
        chunks, left = [], max_bytes + 1
        while left > 0 and (block := os.read(f, min(left, 1 << 20))):
            chunks.append(block)
            left -= len(block)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            refuse(target, f"larger than {max_bytes} bytes")
        return data
    finally:
        os.close(f)


def _fsync_dir(fd: int) -> None:
    try:
        d = os.open(".", DIR_READ, dir_fd=fd)
    except OSError:
        return
    try:
        os.fsync(d)
    except OSError:
        pass
    finally:
        os.close(d)


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o644, pol=None) -> None:
    """Replace (or create) the file ``path`` so that readers see the old content or the new,
    never a part, never writing through a link: a new temporary file (``O_CREAT|O_EXCL|
    O_NOFOLLOW``) in the directory's descriptor, written, ``fchmod``-ed to ``mode``, ``fsync``-ed,
    then renamed over ``path`` within that descriptor (rename(2) is atomic and replaces a link
    at ``path`` rather than following it), and the directory flushed.

    Args:
        path (str | os.PathLike): an absolute path; its directory must exist.
        data (str | bytes): the content (text is written as UTF-8).
        mode (int): the file's permission bits, exactly (no umask).
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).

    Raises:
        GateError: a link or an untrusted directory on the way; the temporary file replaced
            before the rename.
        OSError: the directory is missing or cannot be written (no temporary file is left).
    """
    pol = pol or current_policy()
    raw = data.encode() if isinstance(data, str) else bytes(data)
    target, name, dfd, dst, where = _parent(path, pol)
    try:
        _judge(where, dst, pol, True, target)    # the file is made by this account
        tmp = f".{name[:200]}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        f = _open(dfd, tmp, FILE_NEW, _join(where, tmp), target, "regular file")
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(f, view):]
            os.fchmod(f, mode)
            os.fsync(f)
            ours = os.fstat(f)
            now = os.stat(tmp, dir_fd=dfd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (ours.st_dev, ours.st_ino):
                refuse(target, f"{_join(where, tmp)}: replaced while it was written")
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                now = os.stat(tmp, dir_fd=dfd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (os.fstat(f).st_dev, os.fstat(f).st_ino):
                    os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        finally:
            os.close(f)
        _fsync_dir(dfd)
    finally:
        os.close(dfd)


def mkdir(path: str | os.PathLike, mode: int, *, parents: bool = False, exact: bool = True,
          pol=None) -> tuple[bool, os.stat_result]:
    """Make the directory ``path`` through the gate (the directories above it checked as
    :func:`open_dir` checks them), or find it made.

    The directory itself must be a real directory of a trusted account; its mode is the
    caller's to judge (a spool may be world-writable on purpose): the ``fstat`` returned says
    what it is. A directory made here gets ``mode`` through its descriptor.

    Args:
        path (str | os.PathLike): an absolute path.
        mode (int): the new directory's permission bits.
        parents (bool): make missing directories above it too (mode ``0755`` with ``exact``).
        exact (bool): set ``mode`` exactly (``fchmod``); False: ``mkdir(2)`` with ``mode`` under
            the umask, as ``os.makedirs`` does.
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).

    Returns:
        tuple[bool, os.stat_result]: whether it was made now, and its ``fstat``.

    Raises:
        GateError: a link or a non-directory on the way or at ``path``, an untrusted directory
            above it, or ``path`` owned by an untrusted account.
        OSError: a directory above it is missing (without ``parents``) or cannot be written.
    """
    pol = pol or current_policy()
    target, parts = _parts(path)
    if not parts:
        refuse(target, "the root directory cannot be made")
    above = 0o755 if exact else 0o777
    fd, st, where = _walk(parts[:-1], pol, target, make=above if parents else None, exact=exact)
    try:
        name, child_where = parts[-1], _join(where, parts[-1])
        made = False
        try:
            child = _open(fd, name, DIR_PATH, child_where, target, "directory")
        except FileNotFoundError:
            _judge(where, st, pol, True, target)        # before anything is made in it
            child = _make(fd, name, mode, exact, child_where, target)
            made = True
        try:
            cst = os.fstat(child)
            _judge(where, st, pol, pol.trusted_uid(cst.st_uid), target)
            if not pol.trust_writable and not pol.trusted_uid(cst.st_uid):
                refuse(target, f"owned by {trust.user_name(cst.st_uid)}")
            return made, cst
        finally:
            os.close(child)
    finally:
        os.close(fd)


def _check_name(dir_fd: int, name: str) -> str:
    """``<directory>/<name>`` for messages; refuses a name that is not one entry."""
    where = _join(_fd_path(dir_fd), name)
    if not name or "/" in name or name in (".", ".."):
        refuse(where, "not the name of one entry")
    return where


def _open_entry(dir_fd: int, name: str, where: str, is_kind: Callable[[int], bool], flags: int,
                kind: str) -> tuple[int, os.stat_result]:
    """Open the entry ``name`` of ``dir_fd`` if it is of ``kind`` (``is_kind`` of its
    ``lstat`` mode: a link is refused, never followed) and is still the entry checked once
    open (device and inode, ``fstat``); the caller closes the descriptor.

    Returns:
        tuple[int, os.stat_result]: the descriptor and its ``fstat``.

    Raises:
        GateError: a link, another kind of file, or an entry replaced between the check and the
            open (one line naming ``where``).
        OSError: it vanished or cannot be opened.
    """
    first = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not is_kind(first.st_mode):
        refuse(where, "a symbolic link (not followed)" if stat.S_ISLNK(first.st_mode) else f"not a {kind}")
    fd = _open(dir_fd, name, flags, where, where, kind)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (first.st_dev, first.st_ino) or not is_kind(st.st_mode):
            refuse(where, "replaced while it was checked")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def fchmod(dir_fd: int, name: str, mode: int | Callable[[os.stat_result], int | None]) -> os.stat_result:
    """Change the mode of the regular file ``name`` of the directory ``dir_fd`` through a
    descriptor of the file itself: checked with ``lstat`` (nothing else is opened), opened with
    ``O_RDONLY|O_NOFOLLOW|O_NONBLOCK`` (``O_PATH`` cannot ``fchmod``), checked again by
    ``fstat`` (the same inode, a regular file with one link), then ``fchmod``-ed. A link, a
    directory, a device or a file with other hard links is refused: its target stays as it was.

    Args:
        dir_fd (int): a directory descriptor (:func:`open_dir`, :func:`walk_files`).
        name (str): one entry of it.
        mode (int | Callable[[os.stat_result], int | None]): the new permission bits, or a
            function of the file's ``fstat`` returning them (None: leave the mode).

    Returns:
        os.stat_result: the file's ``fstat`` before the change.

    Raises:
        GateError: not a regular file with one link (one line, naming it).
        OSError: it vanished or cannot be opened or changed.
    """
    where = _check_name(dir_fd, name)
    f, st = _open_entry(dir_fd, name, where, stat.S_ISREG, FILE_READ, "regular file")
    try:
        if st.st_nlink != 1:
            refuse(where, f"has {st.st_nlink} hard links (a file that is also elsewhere is not changed)")
        new = mode(st) if callable(mode) else mode
        if new is not None and new != stat.S_IMODE(st.st_mode):
            os.fchmod(f, new)
        return st
    finally:
        os.close(f)


def unlink(dir_fd: int, name: str) -> None:
    """Remove the entry ``name`` (a file or a link itself, never a directory, never what a link
    points to) from the directory ``dir_fd`` (``unlinkat(2)``).

    Args:
        dir_fd (int): a directory descriptor.
        name (str): one entry of it.

    Raises:
        GateError: ``name`` is a directory or not one entry.
        OSError: it cannot be removed (``FileNotFoundError`` when it is gone).
    """
    where = _check_name(dir_fd, name)
    if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
        refuse(where, "a directory (not removed)")
    os.unlink(name, dir_fd=dir_fd)


def rmtree(dir_fd: int, name: str) -> None:
    """Remove the directory ``name`` of the directory ``dir_fd`` and everything below it, by
    descriptor, never following a link: each directory opened with ``O_DIRECTORY|O_NOFOLLOW``
    relative to its parent (``openat(2)``), its entries removed with ``unlinkat(2)`` relative to
    it, then the directory itself (``unlinkat(2)`` with ``AT_REMOVEDIR``). A link in the tree is
    removed itself, never what it points to; a directory swapped for a link while the tree is
    walked is removed as a link. A directory on another file system than ``name`` (a mount
    point, a btrfs subvolume) is not entered: refused before anything of it is removed. The same discipline as
    ``rm -r`` (fts without ``FTS_LOGICAL``) and Python's descriptor-based ``shutil.rmtree``.

    The tree may hold other accounts' files (a user's entry in a spool): removing needs only
    write access to their directory, and nothing below ``dir_fd`` is reached by a name that a
    link could redirect. Entries that vanish meanwhile are skipped.

    Args:
        dir_fd (int): a directory descriptor (:func:`open_dir`), not closed here.
        name (str): one entry of it: a directory (not a link to one).

    Raises:
        GateError: ``name`` is a link, not a directory or not one entry; a directory in the tree
            is on another file system (nothing of that directory is removed).
        OSError: an entry cannot be opened or removed (``FileNotFoundError`` when ``name`` is
            gone; ``EMFILE`` for a tree deeper than the process's descriptor limit), with the
            entry's path as its ``filename``; what was removed before stays removed.

    Sources: openat(2) (``O_DIRECTORY``, ``O_NOFOLLOW``), unlinkat(2) (``AT_REMOVEDIR``),
    fts(3) (``FTS_PHYSICAL``, ``FTS_XDEV``).
    """
    where = _check_name(dir_fd, name)
    top, st = _open_entry(dir_fd, name, where, stat.S_ISDIR, DIR_READ, "directory")
    try:
        if st.st_dev != os.fstat(dir_fd).st_dev:
            refuse(where, "a mount point (another file system; not entered)")
        _empty_tree(top, st.st_dev, where)
    finally:
        os.close(top)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None


def _empty_tree(top: int, dev: int, top_where: str) -> None:
    """Remove everything below the directory ``top`` (a ``DIR_READ`` descriptor, not closed
    here) on the file system ``dev``, depth first, one descriptor open per level."""
    stack: list[tuple[int, str, list[str]]] = [(top, top_where, _dir_names(top, top_where))]
    try:
        while stack:
            fd, where, names = stack[-1]
            if not names:                       # emptied: remove it from its parent
                stack.pop()
                if stack:
                    os.close(fd)
                    pfd = stack[-1][0]
                    try:
                        os.rmdir(os.path.basename(where), dir_fd=pfd)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        raise OSError(exc.errno, exc.strerror, where) from None
                continue
            name = names.pop()
            child_where = _join(where, name)
            try:
                child = os.open(name, DIR_READ, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise OSError(exc.errno, exc.strerror, child_where) from None
                _unlink_entry(fd, name, child_where)     # not a directory (or no longer one)
                continue
            try:
                cst = os.fstat(child)
                if cst.st_dev != dev:
                    refuse(top_where, f"{child_where}: a mount point (another file system; not entered)")
                stack.append((child, child_where, _dir_names(child, child_where)))
            except BaseException:
                os.close(child)
                raise
    finally:
        for fd, _, _ in stack[1:]:
            os.close(fd)


def _dir_names(fd: int, where: str) -> list[str]:
    try:
        return os.listdir(fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None


def _unlink_entry(dir_fd: int, name: str, where: str) -> None:
    """``unlinkat(dir_fd, name, 0)``: a file or a link removed itself; gone already is fine."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None


def rename(dir_fd: int, old: str, new: str, *, new_dir_fd: int | None = None) -> None:
    """Rename the entry ``old`` of the directory ``dir_fd`` to ``new`` in the same directory (or
    in ``new_dir_fd``), by descriptor (``renameat(2)``): no name is looked up through a path, a
    link at ``old`` is renamed itself, and a link at ``new`` is replaced, never followed.
    As rename(2): atomic, an existing file at ``new`` is replaced, an empty directory at ``new``
    is replaced by a directory ``old``, both must be on one file system.

    Args:
        dir_fd (int): a directory descriptor (:func:`open_dir`).
        old (str): one entry of ``dir_fd``.
        new (str): the new name: one entry (no ``/``, not ``.`` or ``..``).
        new_dir_fd (int | None): the directory ``new`` goes to (default ``dir_fd``), e.g. a
            cache entry made in a private directory moved into the cache.

    Raises:
        GateError: ``old`` or ``new`` is not the name of one entry.
        OSError: rename(2)'s errors (``FileNotFoundError``: no ``old``; ``EXDEV``; ``ENOTEMPTY``,
            ``EISDIR``: a directory at ``new``), with ``<directory>/<old>`` as its ``filename``.

    Sources: renameat(2), rename(2).
    """
    where = _check_name(dir_fd, old)
    to = dir_fd if new_dir_fd is None else new_dir_fd
    _check_name(to, new)
    try:
        os.rename(old, new, src_dir_fd=dir_fd, dst_dir_fd=to)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, where) from None


#: Links followed on the way to an executable, at most (Linux's ``MAXSYMLINKS``, path_resolution(7)).
MAX_LINKS = 40


def resolved(path: str | os.PathLike, pol=None) -> str:
    """The path to give the gate's operations for ``path``: each symbolic link on the way
    resolved where only trusted accounts can have put it, the rest as named.

    The gate's walk follows no link, so a path through a link the rule accepts (a root-owned
    ``/scratch -> /lustre/scratch``) is handed to it resolved. Here a link is followed only where
    it belongs to a trusted account and every directory from ``/`` down to it passes the rule
    *without* the groups the policy trusts to write the site's directories
    (:attr:`hpcstack.trust.Policy.stack_gids`): a member of the site's stack group may write a
    cache or a stage directory, not decide where root's operations go. A link anywhere else is
    left in the path as named, for the operation to refuse (``a symbolic link``); a component
    that does not exist ends the resolution (the rest as named, for :func:`mkdir` to make).
    Under ``--trust-writable`` (:attr:`~hpcstack.trust.Policy.trust_writable`) every link is
    followed (``os.path.realpath``).

    This is not a check: what it returns is walked by the operation, which checks every
    directory and refuses any link still (or again) on the way.

    Args:
        path (str | os.PathLike): an absolute path.
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).

    Returns:
        str: an absolute path (holding ``..`` only where one follows a component left as named,
        which the gate then refuses).

    Raises:
        GateError: a relative path; more than :data:`MAX_LINKS` links followed.

    Sources: path_resolution(7), readlink(2); the rule of :mod:`hpcstack.trust`.
    """
    pol = pol or current_policy()
    p = os.fspath(path)
    if not os.path.isabs(p):
        refuse(p, "not an absolute path")
    if pol.trust_writable:
        return os.path.realpath(p)
    strict = replace(pol, stack_gids=frozenset())
    todo = [c for c in p.split("/") if c not in ("", ".")]
    done, st_done, ok, links = "/", os.lstat("/"), True, 0
    while todo:
        name = todo.pop(0)
        if name == "..":
            done = os.path.dirname(done)
            st_done = os.lstat(done)
            continue
        here = _join(done, name)
        try:
            st = os.lstat(here)
        except OSError:
            return os.path.join(here, *todo)
        passes = ok and not trust.stat_problem(st_done, strict, strict.trusted_uid(st.st_uid))
        if not stat.S_ISLNK(st.st_mode):
            done, st_done, ok = here, st, passes
            continue
        if not passes or not strict.trusted_uid(st.st_uid):
            return os.path.join(here, *todo)          # left for the operation to refuse
        links += 1
        if links > MAX_LINKS:
            refuse(p, f"more than {MAX_LINKS} symbolic links on the way")
        target = os.readlink(here)
        if target.startswith("/"):
            done, st_done = "/", os.lstat("/")
        todo[:0] = [c for c in target.split("/") if c not in ("", ".")]
    return done


def checked_exec_path(path: str | os.PathLike, pol=None) -> str:
    """The path to run ``path`` by (``subprocess``, ``os.execv``) once it has passed the gate: a
    regular file with an execute bit that only trusted accounts can change, in directories only
    trusted accounts can change, all the way from ``/``.

    The walk is by descriptor as for the other operations (``openat(2)`` with ``O_NOFOLLOW``
    at each component), with one difference: a symbolic link is followed where the directory
    holding it has passed the rule (a venv's ``bin/python -> /usr/bin/python3``, a root-owned
    ``/bin -> usr/bin``), the walk going on from the link's target, which is checked in the
    same way (at most :data:`MAX_LINKS` links). A link in a directory another account can
    change is refused with that directory, as a sticky directory is refused above a link that
    another account owns. So what the kernel resolves when it runs the returned path is, link
    for link, what was checked, and no untrusted account can change any of it.

    The path returned is ``path`` as named (normalised), after ``stat`` of it has given the
    device and inode of the checked file's descriptor (``O_PATH|O_NOFOLLOW``): the name, not a
    ``/proc/self/fd/N`` of that descriptor, because a child started by ``subprocess`` closes the
    descriptor (``close_fds``), the kernel hands a ``#!`` script's interpreter the ``/proc``
    path that a close-on-exec descriptor no longer names, and a venv's python finds its
    ``pyvenv.cfg`` by the name it was run by. Only trusted accounts can rebind the name after
    the check: every directory of it has passed the rule.

    Args:
        path (str | os.PathLike): an absolute path, no ``..``.
        pol (hpcstack.trust.Policy | None): whom to trust (default :func:`current_policy`).

    Returns:
        str: the path to execute.

    Raises:
        GateError: a directory on the way (as named or through a link) that another account can
            change, or a link there that another account owns; too many links; not a regular
            file, no execute bit, or a file another account can change; the name no longer
            naming the checked file.
        OSError: a component is missing or cannot be opened (its path is the ``filename``).

    Sources: openat(2) (``O_PATH``, ``O_NOFOLLOW``), readlinkat(2), path_resolution(7),
    execve(2); the rule of :mod:`hpcstack.trust`.
    """
    pol = pol or current_policy()
    target, parts = _parts(path)
    if not parts:
        refuse(target, "the root directory is not a file")
    fd, fst = _resolve_file(parts, pol, target)
    try:
        if not stat.S_ISREG(fst.st_mode):
            refuse(target, "not a regular file")
        _judge(target, fst, pol, False, target)
        if not fst.st_mode & 0o111:
            refuse(target, "not executable (no execute bit)")
        named = "/" + "/".join(parts)
        try:
            now = os.stat(named)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, named) from None
        if (now.st_dev, now.st_ino) != (fst.st_dev, fst.st_ino):
            refuse(target, "replaced while it was checked (the name no longer names the checked file)")
        return named
    finally:
        os.close(fd)


def _resolve_file(parts: list[str], pol, target: str) -> tuple[int, os.stat_result]:
    """Walk ``parts`` from ``/`` for :func:`checked_exec_path`, following a link only in a
    directory that passed the rule; ``(O_PATH descriptor of the last component, its fstat)``."""
    root = os.open("/", DIR_PATH)
    chain: list[tuple[int, os.stat_result, str]] = [(root, os.fstat(root), "/")]
    todo, links = list(parts), 0
    try:
        while True:
            fd, st, where = chain[-1]
            name = todo.pop(0)
            if name == "..":                    # only from a link's target
                if len(chain) > 1:
                    os.close(chain.pop()[0])
                continue
            child_where = _join(where, name)
            try:
                lst = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError as exc:
                raise OSError(exc.errno, exc.strerror, child_where) from None
            if stat.S_ISLNK(lst.st_mode):
                _judge(where, st, pol, pol.trusted_uid(lst.st_uid), target)    # who could make it
                links += 1
                if links > MAX_LINKS:
                    refuse(target, f"more than {MAX_LINKS} symbolic links on the way")
                link = os.readlink(name, dir_fd=fd)
                if link.startswith("/"):
                    while len(chain) > 1:
                        os.close(chain.pop()[0])
                todo[:0] = [c for c in link.split("/") if c not in ("", ".")]
                if not todo:                    # a link to "/"
                    refuse(target, f"{child_where}: a link to the root directory, not a file")
                continue
            if not todo:
                f = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    fst = os.fstat(f)
                    if (fst.st_dev, fst.st_ino) != (lst.st_dev, lst.st_ino):
                        refuse(target, f"{child_where}: replaced while it was checked")
                    _judge(where, st, pol, pol.trusted_uid(fst.st_uid), target)
                    return f, fst
                except BaseException:
                    os.close(f)
                    raise
            child = _open(fd, name, DIR_PATH, child_where, target, "directory")
            cst = os.fstat(child)
            try:
                _judge(where, st, pol, pol.trusted_uid(cst.st_uid), target)
            except BaseException:
                os.close(child)
                raise
            chain.append((child, cst, child_where))
    finally:
        for fd, _, _ in chain:
            os.close(fd)


def walk_files(dir_fd: int, skip_dir: Callable[[str], bool] | None = None) -> Iterator[tuple[int, list[str]]]:
    """The tree below the directory ``dir_fd``, by descriptor: each subdirectory opened with
    ``O_DIRECTORY|O_NOFOLLOW`` relative to its parent (a directory swapped for a link is not
    entered), depth first.

    Args:
        dir_fd (int): the top directory (not closed here).
        skip_dir (Callable[[str], bool] | None): a subdirectory whose name it accepts is not
            entered.

    Yields:
        tuple[int, list[str]]: a directory's descriptor (valid until the next item) and the
        names of its entries that are not directories.
    """
    todo = [os.dup(dir_fd)]
    try:
        while todo:
            fd = todo.pop()
            try:
                try:
                    with os.scandir(fd) as it:
                        entries = list(it)
                except OSError:
                    continue
                dirs = []
                for e in entries:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            dirs.append(e.name)
                    except OSError:
                        pass
                names = set(dirs)
                yield fd, [e.name for e in entries if e.name not in names]
                for name in dirs:
                    if skip_dir and skip_dir(name):
                        continue
                    try:
                        todo.append(os.open(name, DIR_READ, dir_fd=fd))
                    except OSError:
                        pass
            finally:
                os.close(fd)
    finally:
        for fd in todo:
            os.close(fd)


def inodes_on(path: str | os.PathLike) -> Iterator[tuple[int, int]]:
    """``(st_dev, st_ino)`` of ``/`` and of each directory of ``path`` in turn, each opened
    ``O_PATH|O_NOFOLLOW|O_DIRECTORY`` relative to the one before (no trust rule: for telling what
    a path is, not for using it); stops, without error, at a component that is missing, a link
    or not a directory. What :mod:`hpcstack.install.staged` compares a mount's source with.

    Args:
        path (str | os.PathLike): an absolute path (a relative one yields nothing).
    """
    p = os.fspath(path)
    if not os.path.isabs(p):
        return
    fd = os.open("/", DIR_PATH)
    try:
        st = os.fstat(fd)
        yield st.st_dev, st.st_ino
        for name in (c for c in p.split("/") if c not in ("", ".")):
            try:
                child = os.open(name, DIR_PATH, dir_fd=fd)
            except OSError:
                return
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            yield st.st_dev, st.st_ino
    finally:
        os.close(fd)
