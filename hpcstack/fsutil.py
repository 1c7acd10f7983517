"""Small file-system helpers shared by every part of hpcstack: one file hash, one atomic write,
one directory flush, one user lookup.

Each exists once here so that two copies cannot disagree (a hash read in blocks in one place
and in one gulp in another, a user found by ``getpass`` in one place and ``pwd`` in another).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def sha256_file(path: str | os.PathLike) -> str:
    """Return the sha256 of a file's bytes as 64 hex digits, read in 1 MiB blocks.

    Args:
        path (str | os.PathLike): the file.

    Returns:
        str: the lowercase hex digest (what ``sha256sum`` prints).

    Raises:
        OSError: the file cannot be read (missing, a directory, no permission).
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
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
    """Open ``path`` with ``flags`` and flush it; errors are ignored (best effort)."""
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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

    A temporary file in the same directory is written, flushed (``fsync``), given ``mode`` and
    renamed over ``path`` (``rename(2)`` is atomic within a filesystem); then the directory's
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
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        fsync_dir(path.parent)          # the new name too survives a crash
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
