"""The build cache's entries carry the sha256 of their wheels, checked before every reuse.

An entry of the source-build cache (``<cache_dir>/builds/<package>-<version>/<key>/``, see
:class:`hpcstack.install.components.source.CachedWheelBuild`) holds the built wheels, the key's
text (``key.txt``) and :data:`SUMS`, the wheels' sha256 in ``sha256sum``'s format, written when
the entry is stored. Before a wheel is reused, :func:`reuse` checks that the entry and its files
are real directories and files of root or of the installing user that neither group nor others
can write (entries are stored 0755 and 0644), and that its wheels are exactly those of
:data:`SUMS` with those hashes; otherwise the entry is removed and the wheel built again (saying
why). So a wheel replaced in the cache (by a user who could write it, or by a disk error) never
reaches a stack unnoticed. The dry-run's script does the same with ``hpcstack action
reuse-wheel`` (:class:`ReuseWheelVerb`).
"""

from __future__ import annotations

import os
import shutil
import stat
from typing import IO

from hpcstack.fsutil import sha256_file
from hpcstack.install.verbs import ACTION_VERBS

#: The file of an entry that lists its wheels' sha256 (``sha256sum *.whl`` output).
SUMS = "SHA256SUMS"


def write_sums(directory: str) -> str:
    """Write :data:`SUMS` for the ``*.whl`` files of ``directory`` and return its text.

    Args:
        directory (str): a cache entry being stored (not yet renamed into place).

    Raises:
        OSError: the directory cannot be read or written.
    """
    wheels = sorted(n for n in os.listdir(directory) if n.endswith(".whl"))
    text = "".join(f"{sha256_file(os.path.join(directory, n))}  {n}\n" for n in wheels)
    with open(os.path.join(directory, SUMS), "w") as f:
        f.write(text)
    for name in [*wheels, SUMS]:
        os.chmod(os.path.join(directory, name), 0o644)
    return text


def check_entry(entry: str) -> tuple[list[str], str | None]:
    """Return the wheels of a cache entry and why they may not be reused (None when they may).

    Args:
        entry (str): ``<root>/<key>``.

    Returns:
        tuple[list[str], str | None]: the wheels' paths (sorted) and the problem, e.g.
        ``"tinypkg-1.0-py3-none-any.whl does not have the sha256 recorded in SHA256SUMS"``;
        ``([], None)`` when there is no entry.
    """
    try:
        st = os.lstat(entry)
    except FileNotFoundError:
        return [], None
    except OSError as exc:
        return [], f"cannot read it ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return [], "not a directory"
    if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
        return [], "a directory that another user can write"
    try:
        names = sorted(os.listdir(entry))
        with open(os.path.join(entry, SUMS)) as f:
            recorded = {}
            for line in f:
                digest, _, name = line.rstrip("\n").partition("  ")
                recorded[name] = digest
    except OSError:
        return [], f"no {SUMS} (stored by an earlier hpcstack, or removed)"
    wheels = [n for n in names if n.endswith(".whl")]
    if not wheels:
        return [], "no wheel"
    if sorted(recorded) != wheels:
        return [], f"its wheels ({', '.join(wheels)}) are not those of {SUMS} ({', '.join(sorted(recorded))})"
    for name in names:
        st = os.lstat(os.path.join(entry, name))
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
            return [], f"{name} is not a plain file that only its owner can write"
    for name in wheels:
        if sha256_file(os.path.join(entry, name)) != recorded[name]:
            return [], f"{name} does not have the sha256 recorded in {SUMS}"
    return [os.path.join(entry, n) for n in wheels], None


def discard(entry: str) -> None:
    """Remove a cache entry that may not be reused: renamed aside (atomic), then deleted.

    A symbolic link is removed itself, never what it points to.
    """
    if os.path.islink(entry) or not os.path.isdir(entry):
        os.unlink(entry)
        return
    trash = f"{entry}.discarded-{os.getpid()}"
    os.rename(entry, trash)
    shutil.rmtree(trash, ignore_errors=True)


def reuse(name: str, entry: str, dist: str, log: IO[str]) -> bool:
    """Copy the wheels of a cache entry into ``dist`` when they may be reused; else say why.

    Args:
        name (str): the package, for the messages.
        entry (str): ``<root>/<key>``.
        dist (str): where the wheels go (emptied first, on a hit).
        log (IO[str]): receives one line: the reuse, or why the entry was removed.

    Returns:
        bool: True when the wheels were copied; False when there is no entry or it was refused
        (and removed): the caller builds.

    Raises:
        OSError: ``dist`` cannot be written, or a refused entry cannot be removed.
    """
    wheels, problem = check_entry(entry)
    if problem:
        log.write(f"{name}: the cached build {entry} cannot be reused: {problem}; removing it and "
                  "building again\n")
        discard(entry)
        return False
    if not wheels:
        return False
    shutil.rmtree(dist, ignore_errors=True)
    os.makedirs(dist)
    for wheel in wheels:
        shutil.copy(wheel, dist)
    log.write(f"{name}: reusing the wheel built before ({', '.join(os.path.basename(w) for w in wheels)}, "
              f"sha256 checked against {SUMS}): {entry}\n")
    return True


@ACTION_VERBS.register("reuse-wheel")
class ReuseWheelVerb:
    """``hpcstack action reuse-wheel NAME ENTRY DIST``: the dry-run's line for a build-cache hit
    (:func:`reuse`); exit status 0 when the wheels were copied, 1 when the build must run."""

    help = ("copy the wheels of a build-cache ENTRY into DIST when their sha256 are those recorded "
            "(exit 0); else remove the entry (exit 1)")
    #: What it reads back and writes (checked by the trust rule before it runs).
    written = ("entry", "dist")

    @staticmethod
    def add_arguments(parser) -> None:
        """The verb's arguments: ``NAME ENTRY DIST``."""
        parser.add_argument("name", help="the package, for the messages")
        parser.add_argument("entry", help="the cache entry, <root>/<key>")
        parser.add_argument("dist", help="where the wheels go (emptied first, on a hit)")

    @staticmethod
    def run(args) -> int:
        """Reuse the entry's wheels; 0 when reused, 1 when the build must run."""
        import sys

        ok = reuse(args.name, args.entry, args.dist, sys.stdout)
        sys.stdout.flush()
        return 0 if ok else 1
