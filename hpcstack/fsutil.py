"""Files written so that readers never see half of one: the package's one atomic write.

A file is written to a temporary name in the same directory, flushed, given its mode and renamed
over the destination (``rename(2)`` replaces a name atomically within one filesystem); then the
directory's entry is flushed too, so a crash keeps either the old file or the new one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a directory's entries to disk (after a rename in it), so that a reboot keeps them.

    Args:
        path (str | PathLike): the directory; one that cannot be opened is left alone (best effort:
            some filesystems refuse ``fsync`` on a directory).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` so that readers see the old file or the new one, never half.

    Args:
        path (str | PathLike): destination; its parent directories are created.
        content (str): text, written as UTF-8.
        mode (int): permission bits of the new file (default ``0o644``).

    Raises:
        OSError: the directory or the file cannot be written; the temporary file is removed and
            the destination is left as it was.
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
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
