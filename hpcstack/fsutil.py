"""Small file-system helpers shared by every part of hpcstack: one file hash, one atomic write,
one directory flush, one user lookup.

Each exists once here so that two copies cannot disagree (a hash read in blocks in one place
and in one gulp in another, a user found by ``getpass`` in one place and ``pwd`` in another).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from pathlib import Path

#: The working directory of every process hpcstack starts: a directory of root's, never the
#: caller's. ``python -m MOD`` and ``python -c CODE`` put their working directory first on
#: ``sys.path``; in a directory another user can write to (``/tmp``, a project directory where an
#: admin ``cd``'d) that user's ``venv.py``, ``pip/`` or ``six.py`` would run as root. The dry-run
#: script ``cd``'s there first for the same reason (:meth:`hpcstack.install.plan.Plan.to_bash`);
#: docs/admin/security.md, "The working directory".
CHILD_CWD = "/"


def sha256_file(path: str | os.PathLike) -> str:
    """Return the sha256 of a file's bytes as 64 hex digits, read in 1 MiB blocks.

    Args:
        path (str | os.PathLike): the file.

    Returns:
        str: the lowercase hex digest (what ``sha256sum`` prints).

    Raises:
        OSError: the file cannot be read (missing, a directory, no permission), or is not a
            regular file (a FIFO someone put in its place would block the reader for ever, a
            device such as ``/dev/zero`` never ends): ``EINVAL``, naming the path.
    """
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def current_user() -> str:
    """Return the name of the user running hpcstack, else its uid as text.

    The password database is asked by uid (``pwd.getpwuid(os.getuid())``), never ``$USER`` or
    ``$LOGNAME``, which a ``sudo`` or a job environment may have left pointing at someone else;
    a uid with no entry (a container's user) gives the uid as text, which ``find -user`` and
    ``chown`` accept as well.

    Returns:
        str: e.g. ``"root"``, or ``"1234"`` when the uid has no name.
    """
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _fsync(path: str | os.PathLike, flags: int) -> None:
    """Open ``path`` with ``flags`` and flush it; errors are ignored (best effort). A link or a
    FIFO at ``path`` is not opened (``O_NOFOLLOW``, ``O_NONBLOCK``): nothing else is flushed, and
    nothing blocks."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def copy_fd(src: int, dst: int, hasher=None) -> None:
    """Copy what ``src`` holds from its current offset to its end into ``dst``, in 1 MiB blocks
    (every short write continued), feeding each block to ``hasher`` (e.g. a
    :func:`hashlib.sha256` object) when given: a copy between descriptors the caller opened and
    checked, never by name.

    Args:
        src (int): the source descriptor (read from its current offset).
        dst (int): the destination descriptor.
        hasher (object | None): anything with ``update(bytes)``.

    Raises:
        OSError: a read or a write failed.
    """
    while block := os.read(src, 1 << 20):
        if hasher is not None:
            hasher.update(block)
        view = memoryview(block)
        while view:
            view = view[os.write(dst, view):]


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries to disk (after a rename in it), so that a reboot keeps them.

    Errors are ignored: some filesystems refuse ``fsync`` on a directory, and the rename itself
    has already happened.

    Args:
        path (str | os.PathLike): the directory.
    """
    _fsync(path, os.O_RDONLY | os.O_DIRECTORY)


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data to disk; errors are ignored, as for :func:`fsync_dir`.

    Args:
        path (str | os.PathLike): the file.
    """
    _fsync(path, os.O_RDONLY)


def write_atomic(path: str | os.PathLike, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` so that readers see the old file or the new one, never half.

    A temporary file in the same directory (a new name, ``O_EXCL``) is written, flushed
    (``fsync``), given ``mode`` through its descriptor and renamed over ``path`` (``rename(2)`` is atomic within a filesystem); then the directory's
    entry is flushed too, so a crash keeps either the old file or the new one.

    Args:
        path (str | os.PathLike): destination; its parent directories are created.
        content (str): text, written as UTF-8.
        mode (int): permission bits, e.g. ``0o644``.

    Raises:
        OSError: the directory cannot be written (the temporary file is removed).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)     # on the file made, not on whatever holds its name now
        os.replace(tmp, path)
        fsync_dir(path.parent)          # the new name too survives a crash
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _open_dir_no_follow(path: str | os.PathLike, under: str | os.PathLike | None, create: bool) -> int:
    """Open directory ``path`` with no symbolic link followed from ``under`` down (``under``
    itself included; without ``under``, only ``path``'s last component); return its fd."""
    path = os.path.abspath(path)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    under = os.path.abspath(under) if under is not None else path
    if path != under and not path.startswith(under.rstrip(os.sep) + os.sep):
        raise ValueError(f"{path} is not under {under}")
    if create:
        os.makedirs(under, exist_ok=True)
    fd = os.open(under, flags)
    try:
        for part in [p for p in os.path.relpath(path, under).split(os.sep) if p not in ("", ".")]:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            sub = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_dir_no_follow(path: str | os.PathLike, under: str | os.PathLike) -> int:
    """Open the existing directory ``path`` with no symbolic link followed from ``under`` down
    (``under`` itself included), each component opened ``O_DIRECTORY|O_NOFOLLOW`` relative to the
    one above it; for listing and ``*at()`` calls in a directory that another user may own.

    Args:
        path (str | os.PathLike): the directory.
        under (str | os.PathLike): an ancestor (or ``path`` itself).

    Returns:
        int: a descriptor (``O_RDONLY|O_DIRECTORY``, close-on-exec); the caller closes it.

    Raises:
        OSError: a component is a symbolic link (``ELOOP``), not a directory (``ENOTDIR``) or
            missing.
        ValueError: ``path`` is not under ``under``.
    """
    return _open_dir_no_follow(path, under, create=False)


def makedirs_no_follow(path: str | os.PathLike, under: str | os.PathLike) -> None:
    """Make directory ``path`` and those between ``under`` and it, following no symbolic link.

    Args:
        path (str | os.PathLike): the directory.
        under (str | os.PathLike): an ancestor (or ``path`` itself) from which no link is
            followed, e.g. a directory that another user owns.

    Raises:
        OSError: a component is a symbolic link (``ELOOP``) or not a directory (``ENOTDIR``).
    """
    os.close(_open_dir_no_follow(path, under, create=True))


def write_no_follow(path: str | os.PathLike, content: str | bytes, mode: int = 0o644,
                    under: str | os.PathLike | None = None) -> None:
    """Write a file in a directory that another user may own, following no symbolic link.

    For files root writes into a directory handed to a user (validation outputs submitted as
    ``slurm.submit_as``): the directories from ``under`` down are opened with ``O_NOFOLLOW``
    (a planted link to ``/etc`` makes this fail with ``ELOOP``), the old name is removed (what a
    user left there, a link or a hard link to another file, is never written through) and the
    file is created anew with ``O_CREAT | O_EXCL | O_NOFOLLOW``, then given ``mode``.

    Args:
        path (str | os.PathLike): the file.
        content (str | bytes): text (UTF-8) or bytes.
        mode (int): permission bits.
        under (str | os.PathLike | None): the ancestor from which no link is followed; default
            the file's own directory.

    Raises:
        OSError: a link in the way (``ELOOP``), a name that keeps coming back (``EEXIST``: a
            user racing to plant one), no permission.
    """
    path = os.path.abspath(path)
    data = content.encode() if isinstance(content, str) else content
    dfd = _open_dir_no_follow(os.path.dirname(path), under, create=False)
    name = os.path.basename(path)
    try:
        for attempt in range(3):
            try:
                os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             mode, dir_fd=dfd)
                break
            except FileExistsError:
                if attempt == 2:
                    raise
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
    finally:
        os.close(dfd)


def read_no_follow(path: str | os.PathLike, under: str | os.PathLike, last: int | None = None) -> bytes:
    """Read a regular file below ``under`` following no symbolic link from ``under`` down.

    For files root reads back from a directory whose contents another account writes (the
    outputs of validation jobs run as ``slurm.submit_as``): the directories are opened with
    ``O_NOFOLLOW`` and the file with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO does not block), and
    anything but a regular file is refused, so a link planted there never makes root read a file
    of its own into a report.

    Args:
        path (str | os.PathLike): the file.
        under (str | os.PathLike): the ancestor from which no link is followed.
        last (int | None): read only the last ``last`` bytes.

    Returns:
        bytes: the content.

    Raises:
        OSError: a link in the way (``ELOOP``), not a regular file (``EINVAL``), missing, no
            permission; ValueError: ``path`` is not below ``under``.
    """
    path = os.path.abspath(path)
    dfd = _open_dir_no_follow(os.path.dirname(path), under, create=False)
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    finally:
        os.close(dfd)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if last is not None:
            f.seek(max(0, st.st_size - last))
        return f.read()
