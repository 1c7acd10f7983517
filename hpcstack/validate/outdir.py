"""The validation's directory on the shared file system: made (or taken) under the trust rule,
handed to ``slurm.submit_as``; where the Slurm jobs run, write their outputs and read their
scripts, and from which hpcstack reads the results back.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import stat
import tempfile
from pathlib import Path

from hpcstack import gate, trust
from hpcstack.errors import ConfigError, HpcstackError


def chown_tree(path: Path, user: str) -> None:
    """Give the directory ``path`` and what is under it to ``user`` (``slurm.submit_as``), by
    descriptor: the tree is walked with :func:`hpcstack.gate.walk_files` (each directory opened
    ``O_DIRECTORY|O_NOFOLLOW`` relative to its parent, so a directory swapped for a link is not
    entered) and each directory and regular file is changed through a descriptor of its own
    (``fchown``): a file opened ``O_NOFOLLOW|O_NONBLOCK`` and changed only when ``fstat`` says it
    is a regular file with one link (a hard link to another file, which a user who owns the
    directory may plant there, is left as it is). Links, devices, FIFOs and sockets are left as
    they are (the jobs need none of them), and so is anything on another file system than
    ``path``. Nothing is changed by a name that a link could redirect: the directory may be the
    user's already (``--output-dir`` given again).

    Args:
        path (Path): the validation's directory.
        user (str): the account to give it to.

    Raises:
        KeyError: no such user.
        OSError: ``path`` is a link, not a directory, or cannot be opened or changed.
    """
    pw = pwd.getpwnam(user)
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        dev = os.fstat(top).st_dev
        for fd, names in gate.walk_files(top):
            if os.fstat(fd).st_dev != dev:
                continue
            os.fchown(fd, pw.pw_uid, pw.pw_gid)
            for name in names:
                _chown_file(fd, name, dev, pw.pw_uid, pw.pw_gid)
    finally:
        os.close(top)


def _chown_file(dir_fd: int, name: str, dev: int, uid: int, gid: int) -> None:
    """``fchown`` the entry ``name`` of ``dir_fd`` when it is a regular file with one link on
    the file system ``dev``: checked with ``lstat`` first (nothing else is opened), then opened
    without following a link or blocking on a FIFO, and changed only when ``fstat`` finds the
    same file (as :func:`hpcstack.gate.fchmod` does)."""
    try:
        first = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not (stat.S_ISREG(first.st_mode) and first.st_nlink == 1 and first.st_dev == dev):
            return
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:             # a link (ELOOP), gone, or not openable: left as it is
        return
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == (first.st_dev, first.st_ino) and stat.S_ISREG(st.st_mode) \
                and st.st_nlink == 1:
            os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def output_policy(policy: trust.Policy | None, submit_as: str | None) -> trust.Policy:
    """Whom to trust with a validation's directory: the command's policy, and the account the
    jobs are submitted as (``slurm.submit_as``), to whom hpcstack hands the directory itself."""
    pol = policy or trust.Policy(uid=os.geteuid())
    if submit_as:
        try:
            pol = dataclasses.replace(pol, admin_uids=pol.admin_uids | {pwd.getpwnam(submit_as).pw_uid})
        except KeyError:
            raise HpcstackError(f"user {submit_as} (slurm.submit_as) does not exist "
                                "(localhost: scripts/localhost-slurm up creates it)") from None
    return pol


def validation_dir(label: str, output_dir: str | None, output_root: str, base: str, pol: trust.Policy) -> Path:
    """Make (or take) a validation's directory, where the jobs run, write their outputs and read
    the scripts, and from which root reads the results back.

    Without ``slurm.submit_as`` the jobs run as the account running hpcstack (root on every real
    site), in that directory: an account that could change it could swap a job script before
    sbatch reads it, or plant links that the jobs' status files are written through. So it must
    pass the trust rule (:func:`hpcstack.trust.check_dirs`: trusted owners only, no directory
    above it that another user can write without the sticky bit) before it is made and again
    after, and it is opened without following a link (a link planted at its name is refused,
    never ``chmod``-ed through). With ``submit_as`` that account is trusted with it too.

    Args:
        label (str): where the directory comes from, for the error line (``--output-dir``).
        output_dir (str | None): ``--output-dir``; None: a new ``<base>-XXXXXX`` under ``output_root``.
        output_root (str): ``slurm.output_root``, else the working directory.
        base (str): the new directory's name before its random suffix.
        pol (hpcstack.trust.Policy): whom to trust (:func:`output_policy`).

    Returns:
        Path: the directory, absolute, mode 0755.

    Raises:
        ConfigError: the directory (or one above it) can be changed by an untrusted account, or
            is a link (one line, exit status 2).
        HpcstackError: it cannot be made.
    """
    planned = os.path.abspath(output_dir) if output_dir else os.path.join(os.path.abspath(output_root), base)
    trust.check_dirs([(label, planned)], pol)         # before anything is made in it
    try:
        # made through the gate: each missing directory by mkdirat in its checked parent's
        # descriptor, never through a link put at a name meanwhile
        if output_dir:
            gate.mkdir(gate.resolved(planned, pol), 0o777, parents=True, exact=False, pol=pol)
            out = planned
        else:
            gate.mkdir(gate.resolved(os.path.abspath(output_root), pol), 0o777, parents=True, exact=False, pol=pol)
            out = tempfile.mkdtemp(prefix=base + "-", dir=os.path.abspath(output_root))
        trust.check_dirs([(label, out)], pol)         # and again: one another user made meanwhile
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError([f"{label} {planned}: cannot use it as the validation's directory: "
                           f"{exc.strerror} (give --output-dir a directory of your own)"]) from None
    except gate.GateError as exc:
        raise ConfigError([f"{label} {exc}"]) from None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISDIR(st.st_mode) and pol.trusted_uid(st.st_uid)):
            raise ConfigError([f"{label} {out}: changed while hpcstack made it; choose another directory"])
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)
    return Path(out)

