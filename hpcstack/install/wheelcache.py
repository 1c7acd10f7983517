"""The build cache's entries carry the sha256 of their wheels, checked before every reuse.

An entry of the source-build cache (``<cache_dir>/builds/<package>-<version>/<key>/``, see
:class:`hpcstack.install.components.source.CachedWheelBuild`) holds the built wheels, the key's
text (``key.txt``) and :data:`SUMS`, the wheels' sha256 in ``sha256sum``'s format, written when
the entry is stored (:func:`hpcstack.install.components.source.store_wheels`). Before a wheel is
reused, :func:`reuse` checks that the entry and its files are real directories and files of root
or of the installing user that neither group nor others can write (entries are stored 0755 and
0644), and that its wheels are exactly those of :data:`SUMS` with those hashes; otherwise the
entry is removed and the wheel built again (saying why). So a wheel replaced in the cache (by a
user who could write it, or by a disk error) never reaches a stack unnoticed. The dry-run's
script does the same with ``hpcstack action reuse-wheel`` (:class:`ReuseWheelVerb`).

Everything is done by descriptor (:mod:`hpcstack.gate`), because the cache may be one that the
site's stack group can write (0770): the cache directory is opened through the gate, the entry
and its files relative to it with ``O_NOFOLLOW`` (a FIFO never blocks: ``O_NONBLOCK``), checked
by ``fstat``, hashed and copied from the very descriptors that were checked; the stage
directory's ``dist`` is made in a descriptor of the stage directory and each wheel created
there with ``O_CREAT|O_EXCL|O_NOFOLLOW``; a refused entry is renamed aside and removed by
descriptor (:func:`hpcstack.gate.rename`, :func:`hpcstack.gate.rmtree`). A member of the group
who swaps the entry, its files or ``dist`` meanwhile makes the reuse fail or miss, never makes
root read another wheel than the one checked, or write or remove anything elsewhere.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from typing import IO

from hpcstack import gate
from hpcstack.fsutil import copy_fd
from hpcstack.errors import HpcstackError
from hpcstack.install.verbs import ACTION_VERBS

#: The file of an entry that lists its wheels' sha256 (``sha256sum *.whl`` output).
SUMS = "SHA256SUMS"
#: The largest :data:`SUMS` read (a few lines in practice).
MAX_SUMS = 1 << 20


def _split(path: str | os.PathLike, pol) -> tuple[str, str]:
    """``(the directory above path, resolved where only trusted accounts can have put links on
    the way (:func:`hpcstack.gate.resolved`), the last name of path)``."""
    named = os.path.abspath(path)
    return gate.resolved(os.path.dirname(named), pol), os.path.basename(named)


def _plain(st: os.stat_result) -> bool:
    """A regular file of root or of this account that neither group nor others can write."""
    return stat.S_ISREG(st.st_mode) and not st.st_mode & 0o022 and st.st_uid in (0, os.geteuid())


def _close(fds: dict[str, int]) -> None:
    for fd in fds.values():
        os.close(fd)


def _sha256(fd: int) -> str:
    """The sha256 of the file ``fd`` from its start (``lseek`` to 0 first)."""
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while block := os.read(fd, 1 << 20):
        h.update(block)
    return h.hexdigest()


def _read_sums(entry_fd: int) -> tuple[dict[str, str] | None, str | None]:
    """:data:`SUMS` of the entry ``entry_fd`` as ``{wheel: sha256}`` (``O_NOFOLLOW|O_NONBLOCK``,
    a plain file checked by ``fstat``, at most :data:`MAX_SUMS` bytes); ``(None, problem)``
    when it is missing or not such a file."""
    try:
        f = os.open(SUMS, gate.FILE_READ, dir_fd=entry_fd)
    except OSError:
        return None, f"no {SUMS} (stored by an earlier hpcstack, or removed)"
    try:
        st = os.fstat(f)
        if not _plain(st):
            return None, f"{SUMS} is not a plain file that only its owner can write"
        if st.st_size > MAX_SUMS:
            return None, f"{SUMS} is larger than {MAX_SUMS} bytes"
        text = os.read(f, MAX_SUMS).decode("utf-8", "replace")
    finally:
        os.close(f)
    recorded = {}
    for line in text.splitlines():
        digest, _, name = line.partition("  ")
        recorded[name] = digest
    return recorded, None


def _open_entry(root_fd: int, name: str) -> tuple[dict[str, int], str | None]:
    """Open the entry ``name`` of the cache directory ``root_fd`` and check it: a directory of
    root or of this account that neither group nor others can write (``O_DIRECTORY|O_NOFOLLOW``,
    ``fstat``), its files plain files of the same kind, its wheels those of :data:`SUMS` with
    those sha256, each hashed through the descriptor it was checked by.

    Returns:
        tuple[dict[str, int], str | None]: the open descriptors of its wheels by name (sorted;
        the caller closes them) and None; or ``({}, problem)``; ``({}, None)`` when there is no
        entry.
    """
    if not name or "/" in name or name in (".", ".."):
        return {}, "not the name of a cache entry"
    try:
        efd = os.open(name, gate.DIR_READ, dir_fd=root_fd)
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                link = stat.S_ISLNK(os.stat(name, dir_fd=root_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            return {}, "a symbolic link (not followed)" if link else "not a directory"
        return {}, f"cannot read it ({exc.strerror})"
    fds: dict[str, int] = {}
    try:
        st = os.fstat(efd)
        if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):
            return {}, "a directory that another user can write"
        names = sorted(os.listdir(efd))
        recorded, problem = _read_sums(efd)
        if problem:
            return {}, problem
        wheels = [n for n in names if n.endswith(".whl")]
        if not wheels:
            return {}, "no wheel"
        if sorted(recorded) != wheels:
            return {}, f"its wheels ({', '.join(wheels)}) are not those of {SUMS} ({', '.join(sorted(recorded))})"
        for n in names:
            if not _plain(os.stat(n, dir_fd=efd, follow_symlinks=False)):
                return {}, f"{n} is not a plain file that only its owner can write"
        for n in wheels:
            try:
                fds[n] = os.open(n, gate.FILE_READ, dir_fd=efd)
            except OSError as exc:
                return {}, f"{n} cannot be read ({exc.strerror})"
            if not _plain(os.fstat(fds[n])):
                return {}, f"{n} is not a plain file that only its owner can write"
            if _sha256(fds[n]) != recorded[n]:
                return {}, f"{n} does not have the sha256 recorded in {SUMS}"
        checked, fds = fds, {}
        return checked, None
    finally:
        _close(fds)
        os.close(efd)


def check_entry(entry: str, pol=None) -> tuple[list[str], str | None]:
    """Return the wheels of a cache entry and why they may not be reused (None when they may),
    checked by descriptor as :func:`reuse` checks them.

    Args:
        entry (str): ``<root>/<key>``.
        pol (hpcstack.trust.Policy | None): whom to trust for the cache directory ``<root>``
            (default :func:`hpcstack.gate.current_policy`: the install's, with the site's
            stack group).

    Returns:
        tuple[list[str], str | None]: the wheels' paths (``entry`` joined with each name,
        sorted) and the problem, e.g.
        ``"tinypkg-1.0-py3-none-any.whl does not have the sha256 recorded in SHA256SUMS"``;
        ``([], None)`` when there is no entry (or no cache directory).

    Raises:
        hpcstack.gate.GateError: the cache directory is refused (a link an untrusted account
            could have made on its way, a directory such an account can change).
        OSError: the cache directory cannot be opened (other than missing).
    """
    root, name = _split(entry, pol)
    try:
        root_fd = gate.open_dir(root, pol)
    except FileNotFoundError:
        return [], None
    try:
        fds, problem = _open_entry(root_fd, name)
    finally:
        os.close(root_fd)
    _close(fds)
    return [os.path.join(entry, n) for n in fds], problem


def _discard_at(root_fd: int, name: str) -> None:
    """Remove the entry ``name`` of ``root_fd``: a file or a link itself (:func:`hpcstack.gate.unlink`);
    a directory renamed aside to a new hidden name (:func:`hpcstack.gate.rename`: atomic, so no
    half-removed entry is ever found at ``name``), then removed by descriptor
    (:func:`hpcstack.gate.rmtree`: no link in it followed); what that cannot remove stays aside."""
    try:
        st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        gate.unlink(root_fd, name)
        return
    trash = f".{name[:100]}.discarded-{os.getpid()}-{secrets.token_hex(4)}"
    gate.rename(root_fd, name, trash)
    try:
        gate.rmtree(root_fd, trash)
    except (OSError, HpcstackError):
        pass


def discard(entry: str, pol=None) -> None:
    """Remove a cache entry that may not be reused, by descriptor of the cache directory
    (opened through :mod:`hpcstack.gate`): renamed aside (atomic), then deleted. A symbolic
    link is removed itself, never what it points to; nothing below the entry is reached by a
    name that a link could redirect.

    Args:
        entry (str): ``<root>/<key>``.
        pol (hpcstack.trust.Policy | None): whom to trust for ``<root>`` (default
            :func:`hpcstack.gate.current_policy`).

    Raises:
        hpcstack.gate.GateError: the cache directory is refused.
        OSError: the entry cannot be renamed or removed.
    """
    root, name = _split(entry, pol)
    with gate.directory(root, pol) as root_fd:
        _discard_at(root_fd, name)


def _copy_into(dist: str, wheels: dict[str, int], pol) -> None:
    """Make ``dist`` anew (emptied first) and copy the wheels (open descriptors) into it: the
    directory above it made or opened through the gate, the old ``dist`` removed by descriptor
    (:func:`hpcstack.gate.rmtree`, :func:`hpcstack.gate.unlink`), the new one made in that
    descriptor and opened ``O_DIRECTORY|O_NOFOLLOW`` (this account's, empty), each wheel created
    ``O_CREAT|O_EXCL|O_NOFOLLOW`` in it, mode 0644."""
    parent, name = _split(dist, pol)
    if not name or name in (".", ".."):
        gate.refuse(dist, "not the name of one directory")
    gate.mkdir(parent, 0o777, parents=True, exact=False, pol=pol)   # as os.makedirs: under the umask
    with gate.directory(parent, pol) as pfd:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            (gate.rmtree if stat.S_ISDIR(st.st_mode) else gate.unlink)(pfd, name)
        except FileNotFoundError:
            pass
        os.mkdir(name, 0o777, dir_fd=pfd)
        try:
            dfd = os.open(name, gate.DIR_READ, dir_fd=pfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                gate.refuse(dist, "replaced while it was made")
            raise
        try:
            st = os.fstat(dfd)
            if st.st_uid != os.geteuid() or os.listdir(dfd):
                gate.refuse(dist, "replaced while it was made")
            for wheel, fin in wheels.items():
                try:
                    fout = os.open(wheel, gate.FILE_NEW, 0o600, dir_fd=dfd)
                except FileExistsError:
                    gate.refuse(os.path.join(dist, wheel), "made by someone else while the wheels were "
                                                           "copied (nothing written through it)")
                try:
                    os.lseek(fin, 0, os.SEEK_SET)
                    copy_fd(fin, fout)
                    os.fchmod(fout, 0o644)
                finally:
                    os.close(fout)
        finally:
            os.close(dfd)


def reuse(name: str, entry: str, dist: str, log: IO[str], *, pol=None) -> bool:
    """Copy the wheels of a cache entry into ``dist`` when they may be reused; else say why.

    The entry is checked and copied through the same descriptors (:func:`check_entry`'s
    checks, then the copy from the checked files), ``dist`` made anew through the gate (see
    the module's docstring).

    Args:
        name (str): the package, for the messages.
        entry (str): ``<root>/<key>``.
        dist (str): where the wheels go (emptied first, on a hit).
        log (IO[str]): receives one line: the reuse, or why the entry was removed.
        pol (hpcstack.trust.Policy | None): whom to trust for the cache directory and the
            directory above ``dist`` (default :func:`hpcstack.gate.current_policy`: the
            install's, with the site's stack group).

    Returns:
        bool: True when the wheels were copied; False when there is no entry or it was refused
        (and removed): the caller builds.

    Raises:
        hpcstack.gate.GateError: the cache directory or the directory above ``dist`` is refused,
            or ``dist`` or a wheel's name in it was swapped while it was written (one line).
        OSError: ``dist`` cannot be written, or a refused entry cannot be removed.
    """
    root, key = _split(entry, pol)
    try:
        root_fd = gate.open_dir(root, pol)
    except FileNotFoundError:
        return False
    try:
        wheels, problem = _open_entry(root_fd, key)
        if problem:
            log.write(f"{name}: the cached build {entry} cannot be reused: {problem}; removing it and "
                      "building again\n")
            _discard_at(root_fd, key)
            return False
    finally:
        os.close(root_fd)
    if not wheels:
        return False
    try:
        _copy_into(dist, wheels, pol)
    finally:
        _close(wheels)
    log.write(f"{name}: reusing the wheel built before ({', '.join(wheels)}, "
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
        """Reuse the entry's wheels (trusting whom the verb's own check trusts:
        :func:`hpcstack.trust.policy`); 0 when reused, 1 when the build must run."""
        import sys

        from hpcstack import trust

        ok = reuse(args.name, args.entry, args.dist, sys.stdout, pol=trust.policy())
        sys.stdout.flush()
        return 0 if ok else 1
