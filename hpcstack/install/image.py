"""``layout: squashfs``: a build's venv packed into one squashfs image and mounted at its path.

On a parallel file system every metadata call (``stat``, ``openat``, ``readlink``) is a round
trip to a metadata server, and ``import torch`` makes tens of thousands of them over the stack's
~40,000 files (``docs/benchmarks.md``, "Big sites"). Peers pack such environments into one
squashfs image (CSC's Tykky, LUMI's container wrapper): the parallel file system then serves
one large file, and the lookups inside it are answered by the node's own kernel and FUSE
daemon from the image's cached directory tables.

With ``layout: squashfs`` in the site config a build runs as ever in its stage
prefix, a real directory, up to and including its sanity check and permissions; then the step
``image``, before the module step publishes it:

1. ``mksquashfs <build>/venv <build>/venv.sqsh`` (written beside, renamed into place whole);
2. the venv directory is renamed aside (one atomic rename), an empty ``venv/`` made in its
   place, the aside copy removed;
3. ``squashfuse -o ro,allow_other,default_permissions <build>/venv.sqsh <build>/venv`` mounts the
   image read-only at exactly the venv's path (a venv cannot move: its scripts and
   ``pyvenv.cfg`` hold absolute paths), for every user, with the modes the ``permissions``
   step gave the files (``default_permissions``: the kernel checks them);
4. the sanity check's imports run again, now from the image.

Only the venv is packed: the build's ``bin/`` (three scripts) and ``.hpcstack/`` (step
records, logs, provenance, which later runs write) stay a real directory. Owners, groups and
modes are kept as the ``permissions`` step left them (no ``-all-root``), so a site's
``permissions.group`` and ``mode`` mean the same on the image. Everything before the image step
is baked into the image, so a change to the sanity check or the permissions builds anew
(the step chain's hashes see to that); only the module step still runs in place.

Each state the steps can be cut short in is one the next run finishes from: a venv with its
``pyvenv.cfg`` is packed (again), a venv directory without one and an image beside it is only
mounted. A mount is per node: ``hpcstack mount`` (:func:`mount_build`) mounts the published
build's image on the node it runs on (``--stage DIR [--unpack]``: copied, or unpacked, into a
node-local directory first, so that the ranks read nothing from the network; the copies of
builds no longer published are pruned there: :mod:`hpcstack.install.staged`) (a Slurm prolog,
or an fstab line / systemd mount unit from :func:`node_setup`); the modulefile refuses to load where it is not mounted
(:func:`module_check`). Removing a build unmounts it first (:func:`release`).

Apptainer cannot be installed from Debian 12 or PyPI, so there is no Apptainer path here; a
site that has it can bind the same image: ``apptainer exec --bind
<build>/venv.sqsh:<build>/venv:image-src=/ …``.

Source of the approach: CSC's Tykky (https://docs.csc.fi/computing/containers/tykky/) and
LUMI's container wrapper (https://docs.lumi-supercomputer.eu/software/installing/container-wrapper/).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shlex
import stat
import subprocess
from dataclasses import dataclass

from hpcstack import gate
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD, fsync_dir
from hpcstack.install.actions import ActionBase, ExecContext, Run, describe_os_error, run_bash

#: The image of a build's venv, inside the build directory: ``<build>/venv.sqsh``.
IMAGE_NAME = "venv.sqsh"
#: The packed directory, mounted again at the same path: ``<build>/venv``.
VENV_DIR = "venv"
#: The compression when the site names none: lz4 packs and reads fastest (docs/benchmarks.md).
DEFAULT_COMPRESSION = "lz4"
#: Mount options: read-only, readable by every user (``allow_other``; non-root needs
#: ``user_allow_other`` in ``/etc/fuse.conf``), with the image's modes checked by the kernel.
MOUNT_OPTIONS = "ro,allow_other,default_permissions"
#: Mount options of a staged copy, mounted by the kernel's squashfs on a loop device (root only):
#: read-only, no device files, no set-uid (the image's modes are checked by the kernel as for any
#: local file system).
KERNEL_MOUNT_OPTIONS = "ro,nodev,nosuid,loop"
#: The size of each read when an image is staged (``hpcstack mount --stage``): 16 MiB, as ``dd
#: bs=16M``; the network file system splits it into its own largest requests and reads ahead.
STAGE_CHUNK = 16 << 20
#: The programs the image step runs (the preflight looks for them on the build PATH).
_TOOLS = ("bash", "mountpoint", "mksquashfs", "squashfuse", "mv", "mkdir", "rm")


@dataclass(frozen=True)
class ImageSettings:
    """A site's ``squashfs`` section.

    Attributes:
        compression (str): ``mksquashfs -comp``: gzip, lz4, lzo, xz or zstd (default lz4).
        processors (int | None): ``mksquashfs -processors``; None uses every core.
    """

    compression: str = DEFAULT_COMPRESSION
    processors: int | None = None


def layout_of(site) -> str:
    """The site's layout: its ``layout`` key where it sets one; else ``squashfs`` where its
    ``filesystem`` is ``parallel`` (the stacks' install root is on Lustre, GPFS, BeeGFS or NFS
    shared by the compute nodes: every rank's imports would be round trips to its metadata
    server; docs/benchmarks.md, "Start-up at scale"), else ``directory``.

    Args:
        site (hpcstack.site.Site): the validated site (``layout`` and ``filesystem`` keys).

    Returns:
        str: ``directory`` or ``squashfs``.
    """
    raw = getattr(site, "raw", None) or {}
    if raw.get("layout"):
        return str(raw["layout"])
    return "squashfs" if raw.get("filesystem") == "parallel" else "directory"


def layout_note(site) -> str | None:
    """One line for a site whose stacks lie as directories on a parallel file system, else None.

    Such a site (``filesystem: parallel`` with an explicit ``layout: directory``, e.g. because
    its compute nodes cannot mount images yet) gets what its choice costs and the key that
    changes it; ``hpcstack install`` prints it as a ``note:`` (dry run too).

    The figures are those of ``benchmarks/startup.py`` on the local Slurm, 8 ranks and 1 ms of
    latency each way (docs/benchmarks.md, "Start-up at scale"): about 6,000 metadata requests per
    rank reach the file server from a directory, about 25 from the squashfs image.

    Args:
        site (hpcstack.site.Site): the validated site (``layout`` and ``filesystem`` keys).

    Returns:
        str | None: the note, without its ``note:`` prefix.
    """
    raw = getattr(site, "raw", None) or {}
    if raw.get("filesystem") != "parallel" or layout_of(site) != "directory":
        return None
    return (f"site {site.name}: its stacks lie as directories on a parallel file system, so every rank's "
            "imports are round trips to the metadata server (about 6,000 requests per rank against 25 "
            "from a squashfs image: docs/benchmarks.md, \"Start-up at scale\"); `layout: squashfs` "
            "packs the venv into one image once every compute node can mount it (docs/admin/sites.md)")


def settings(site) -> ImageSettings | None:
    """The site's image settings, or None where its layout (:func:`layout_of`) is ``directory``.

    Args:
        site (hpcstack.site.Site): the validated site (``layout``, ``filesystem`` and ``squashfs`` keys).
    """
    raw = getattr(site, "raw", None) or {}
    if layout_of(site) != "squashfs":
        return None
    section = raw.get("squashfs") or {}
    return ImageSettings(section.get("compression") or DEFAULT_COMPRESSION, section.get("processors"))


def image_of(build: str) -> str:
    """The image of the build directory ``build`` (``StackLayout.build_path(id)``)."""
    return os.path.join(build, IMAGE_NAME)


def mount_point_of(build: str) -> str:
    """Where the image of ``build`` is mounted: the venv's own path."""
    return os.path.join(build, VENV_DIR)


def is_mounted(path: str) -> bool:
    """True if ``path`` is a mount point (its ``st_dev`` differs from its parent's, as
    ``mountpoint(1)`` decides); a FUSE mount whose daemon died counts as mounted (it must be
    unmounted before the directory can be used)."""
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def _mounts_at(path: str, resolve: bool = True) -> bool:
    """True if ``/proc/self/mountinfo`` lists a mount at ``path`` (also one whose daemon died,
    where ``stat`` fails with ENOTCONN); with ``resolve`` False, ``path`` exactly (a path taken
    from a descriptor, no link followed)."""
    target = os.path.realpath(path) if resolve else path
    return target in _mount_points().values()


def _mount_points() -> dict[str, str]:
    """``{mount id: mount point}`` of ``/proc/self/mountinfo`` (empty when unreadable)."""
    points = {}
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4:
                    points[fields[0]] = fields[4].encode().decode("unicode_escape")
    except OSError:
        pass
    return points


#: The venv's directory as it is mounted on: a handle for ``/proc/self/fd/N``, never a link.
_MOUNT_DIR = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC


@contextlib.contextmanager
def _build_dir(build: str):
    """The build directory's descriptor through the gate (:func:`hpcstack.gate.open_dir` of its
    path with the links that trusted accounts alone can have put resolved): no link on the way,
    every directory from ``/`` one that only trusted accounts (the stack group, under the
    command's :func:`hpcstack.gate.trusting`) can change.

    Raises:
        ConfigError: the build is missing; GateError: a link or an untrusted directory (one line).
    """
    try:
        fd = gate.open_dir(gate.resolved(build))
    except FileNotFoundError as exc:
        raise ConfigError([f"{build}: {describe_os_error(exc)}"]) from None
    try:
        yield fd
    finally:
        os.close(fd)


def _venv_at(bfd: int, venv: str, make: bool = False) -> int:
    """The ``O_PATH`` descriptor of the venv directory of the build ``bfd`` (opened relative to
    it, ``O_NOFOLLOW|O_DIRECTORY``); with ``make``, made (0755) where missing.

    Raises:
        ConfigError: a link or not a directory at ``venv`` (one line); FileNotFoundError: missing.
    """
    try:
        return os.open(VENV_DIR, _MOUNT_DIR, dir_fd=bfd)
    except FileNotFoundError:
        if not make:
            raise
        try:
            os.mkdir(VENV_DIR, 0o755, dir_fd=bfd)
        except FileExistsError:
            pass
        return _venv_at(bfd, venv)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = os.stat(VENV_DIR, dir_fd=bfd, follow_symlinks=False)
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise ConfigError([f"{venv}: {what}; hpcstack mounts an image only on the build's own venv directory, "
                           "never through a link (docs/admin/security.md, 'The gate')"]) from None


def _mounted_below(bfd: int) -> bool:
    """True if something is mounted on the venv of the build ``bfd``, told by descriptor: its
    entry (not followed) is on another device than the build, cannot be stat-ed (a FUSE mount
    whose daemon died: ENOTCONN), or mountinfo lists a mount at the build's path (by
    descriptor) + ``/venv`` (a bind mount of the same file system)."""
    try:
        st = os.stat(VENV_DIR, dir_fd=bfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if not stat.S_ISDIR(st.st_mode):
        return False
    if st.st_dev != os.fstat(bfd).st_dev:
        return True
    return _mounts_at(os.path.join(os.readlink(f"/proc/self/fd/{bfd}"), VENV_DIR), resolve=False)


def _open_image(build: str) -> int:
    """A descriptor of the build's image through the gate (:func:`hpcstack.gate.open_file`: no
    link, a regular file, never blocking on a FIFO); the caller closes it.

    Raises:
        ConfigError: no image (one line); GateError: a link, a FIFO, a device or an untrusted file.
    """
    try:
        return gate.open_file(image_of(gate.resolved(build)))     # the image itself: no link followed
    except FileNotFoundError as exc:
        raise ConfigError([f"{build}: no image {IMAGE_NAME} ({describe_os_error(exc)}; not installed with "
                           "layout: squashfs, or the image step has not run)"]) from None


def pack_argv(venv: str, image: str, settings: ImageSettings) -> list[str]:
    """The ``mksquashfs`` command that packs ``venv`` into ``image`` as the ``image`` step does
    (the benchmarks pack an installed stack with it too).

    Args:
        venv (str): the directory to pack.
        image (str): the image file to write (replaced whole: ``-noappend``).
        settings (ImageSettings): compression and processors.
    """
    procs = ["-processors", str(settings.processors)] if settings.processors else []
    return ["mksquashfs", venv, image, "-noappend", "-comp", settings.compression, *procs, "-quiet", "-no-progress"]


# ------------------------------------------------------------------------------- the step

@dataclass(frozen=True)
class PackAndMount(ActionBase):
    """Pack a build's venv into its image and mount the image at the venv's path.

    :meth:`execute` runs exactly :meth:`to_bash` (``bash -euo pipefail``), which may be cut
    short anywhere and run again: the venv is packed only while it still holds ``pyvenv.cfg``
    (the image is written beside and renamed into place whole), it is emptied by one rename,
    and a venv already mounted is left as it is.

    Args:
        venv (str): the build's venv, ``<build>/venv`` (:func:`mount_point_of`).
        image (str): its image, ``<build>/venv.sqsh`` (:func:`image_of`).
        compression (str): ``mksquashfs -comp`` value.
        processors (int | None): ``mksquashfs -processors``; None for every core.

    Raises:
        HpcstackError: ``mksquashfs`` or ``squashfuse`` fails (no ``/dev/fuse``, no
            ``allow_other`` for this user); the message ends with the tool's last error line.
    """

    venv: str
    image: str
    compression: str = DEFAULT_COMPRESSION
    processors: int | None = None

    def commands(self) -> tuple[Run, ...]:
        return tuple(Run((tool,)) for tool in _TOOLS)

    def outputs(self) -> tuple[str, ...]:
        return (self.image,)

    def to_bash(self) -> str:
        venv, image = shlex.quote(self.venv), shlex.quote(self.image)
        aside = shlex.quote(os.path.join(os.path.dirname(self.venv), f".{VENV_DIR}.packed"))
        tmp = shlex.quote(self.image + ".tmp")
        pack = shlex.join(pack_argv(self.venv, self.image + ".tmp",
                                    ImageSettings(self.compression, self.processors)))
        return "\n".join([
            f"if ! mountpoint -q {venv}; then",
            f"  if [ -e {venv}/pyvenv.cfg ]; then",
            f"    rm -f {tmp}",
            f"    {pack}",
            f"    mv -T {tmp} {image}",
            f"    rm -rf {aside}",
            f"    mv -T {venv} {aside}",
            "  fi",
            f"  rm -rf {aside}",
            f"  mkdir -p {venv}",
            f"  squashfuse -o {MOUNT_OPTIONS} {image} {venv}",
            "fi",
            f"mountpoint -q {venv}"])

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        ctx.log.flush()
        run_bash(self.to_bash(), ctx, f"pack {self.venv} into {self.image} and mount it")
        fsync_dir(os.path.dirname(self.image))


def image_actions(settings: ImageSettings, build: str, sanity_actions: list) -> list:
    """The actions of the ``image`` step for the build directory ``build``: pack and mount,
    then the sanity check's imports again, from the image.

    Args:
        settings (ImageSettings): the site's ``squashfs`` section.
        build (str): the build directory (the plan's stage prefix).
        sanity_actions (list): the sanity check step's actions; those that only read the stack
            (not the ``Capture`` of ``pip freeze``, already kept) run again.
    """
    from hpcstack.install.actions import Capture

    again = [a for a in sanity_actions if not isinstance(a, Capture)]
    return [PackAndMount(mount_point_of(build), image_of(build), settings.compression, settings.processors),
            *again]


# ------------------------------------------------------------------------------- nodes

def mount_argv(build: str) -> list[str]:
    """The command that mounts the image of ``build`` at its venv (as the image step does)."""
    return ["squashfuse", "-o", MOUNT_OPTIONS, image_of(build), mount_point_of(build)]


def kernel_mount_argv(image: str, venv: str) -> list[str]:
    """The command that mounts ``image`` (a staged copy on node-local storage) at ``venv`` with
    the kernel's squashfs on a loop device, as CSCS's squashfs-mount does (root only; the loop
    device is released with the mount: ``mount -o loop`` sets autoclear)."""
    return ["mount", "-t", "squashfs", "-o", KERNEL_MOUNT_OPTIONS, image, venv]


def staged_name_of(build: str) -> str:
    """The stem of the staged copies of ``build``: ``<build's name>-<digest>``, the name of the
    build directory without its leading dot and :func:`staged_digest` of its real path."""
    name = os.path.basename(os.path.normpath(build)).lstrip(".") or "build"
    return f"{name}-{staged_digest(os.path.realpath(build))}"


def staged_digest(real_path: str) -> str:
    """The first 12 hex digits of the SHA-256 of ``real_path`` (a build's real path, as
    :func:`os.path.realpath` gives it): the part of a staged copy's name that ties it to one
    build path (:mod:`hpcstack.install.staged` checks it before it removes a copy)."""
    return hashlib.sha256(os.fsencode(real_path)).hexdigest()[:12]


def staged_image_of(build: str, stage_dir: str) -> str:
    """Where ``hpcstack mount --stage DIR`` keeps the copy of the image of ``build``:
    ``DIR/<build's name>-<12 hex digits of the SHA-256 of its real path>.sqsh`` (one name per
    build, so a second mount on the node finds the copy, and two stacks never share one)."""
    return os.path.join(stage_dir, f"{staged_name_of(build)}.sqsh")


def staged_tree_of(build: str, stage_dir: str) -> str:
    """Where ``hpcstack mount --stage DIR --unpack`` unpacks the image of ``build``:
    ``DIR/<name>-<digest>.d`` (beside it ``<tree>.done`` records the image it came from)."""
    return os.path.join(stage_dir, f"{staged_name_of(build)}.d")


#: Stage directories this process holds the lock of (:func:`stage_lock`), with the depth.
_HELD_STAGE_LOCKS: dict[str, int] = {}


@contextlib.contextmanager
def stage_lock(stage_dir: str):
    """Hold the lock of a stage directory: ``flock(LOCK_EX)`` on the directory itself (no file
    is added to it), waiting for another ``hpcstack mount --stage`` on this node to finish.

    Every staging (:func:`mount_build` with ``stage``) and every prune
    (:func:`hpcstack.install.staged.prune`) runs under it, so that two prologs never write the
    same ``.tmp`` and a ``.tmp`` found under the lock is one an interrupted run left. Re-entrant
    within one process (a nested ``with`` only counts); the kernel drops it when the process ends.

    Args:
        stage_dir (str): a directory :func:`check_stage_dir` accepted.

    Raises:
        ConfigError: the directory cannot be opened (gone, or a symbolic link now); one line.
    """
    key = os.path.normpath(stage_dir)
    if key in _HELD_STAGE_LOCKS:
        _HELD_STAGE_LOCKS[key] += 1
        try:
            yield
        finally:
            _HELD_STAGE_LOCKS[key] -= 1
        return
    try:
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError([f"--stage {stage_dir}: cannot open it to lock it: {describe_os_error(exc)}"]) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _HELD_STAGE_LOCKS[key] = 1
        try:
            yield
        finally:
            del _HELD_STAGE_LOCKS[key]
    finally:
        os.close(fd)  # closing the only descriptor releases the lock


def check_stage_dir(stage_dir: str) -> None:
    """Refuse a stage directory an ordinary user could control.

    ``hpcstack mount --stage`` runs as root (a prolog) and the kernel mounts what it finds there,
    so the directory and every directory above it must be real directories (no symbolic link
    anywhere on the path) owned by root; a directory above it may be writable by others only
    with the sticky bit (``/dev/shm``, ``/tmp``: nobody can rename or replace root's entries
    there); the directory itself is writable by root alone.

    Args:
        stage_dir (str): an absolute path on node-local storage (tmpfs such as ``/dev/shm/hpcstack``,
            or a node-local disk), created beforehand by root (``install -d -m 0700 -o root DIR``).

    Raises:
        ConfigError: one line naming the first component that fails, and why.
    """
    if not os.path.isabs(stage_dir):
        raise ConfigError([f"--stage {stage_dir}: not an absolute path"])
    parts = [p for p in os.path.normpath(stage_dir).split("/") if p]
    path = "/"
    for i, part in enumerate(["", *parts]):
        path = os.path.join(path, part) if part else "/"
        last = i == len(parts)
        try:
            st = os.lstat(path)
        except OSError as exc:
            hint = " (root creates it: install -d -m 0700 -o root -g root DIR)" if last else ""
            raise ConfigError([f"--stage {stage_dir}: {path}: {describe_os_error(exc)}{hint}"]) from None
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError([f"--stage {stage_dir}: {path} is a symbolic link; name the real directory"])
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError([f"--stage {stage_dir}: {path} is not a directory"])
        if st.st_uid != 0:
            raise ConfigError([f"--stage {stage_dir}: {path} is owned by uid {st.st_uid}, not root"])
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if writable and (last or not st.st_mode & stat.S_ISVTX):
            raise ConfigError([f"--stage {stage_dir}: {path} is writable by its group or others "
                               f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod go-w it"])


def stage_image(build: str, stage_dir: str) -> str:
    """Copy the image of ``build`` into ``stage_dir`` on this node in large sequential reads
    (:data:`STAGE_CHUNK`), unless the copy there already matches it (same size and
    modification time, which the copy takes from the image).

    The copy is written to ``<copy>.tmp`` (created anew, never followed through a link), synced,
    then renamed into place whole; on any failure the partial copy is removed.

    Args:
        build (str): the build directory on the network file system.
        stage_dir (str): node-local directory (:func:`check_stage_dir`).

    Returns:
        str: the path of the copy (:func:`staged_image_of`).

    Raises:
        ConfigError: an unsafe stage directory, no image, or a read/write error (e.g. ENOSPC
            on a tmpfs too small for the image); one line.
    """
    check_stage_dir(stage_dir)
    fd_in = _open_image(build)      # a regular file, no link: a FIFO or /dev/zero is refused
    try:
        return _stage_image_from(fd_in, build, stage_dir)
    finally:
        os.close(fd_in)


def _stage_image_from(fd_in: int, build: str, stage_dir: str) -> str:
    """:func:`stage_image` from the image's descriptor ``fd_in`` (:func:`_open_image`)."""
    image, copy = image_of(build), staged_image_of(build, stage_dir)
    src = os.fstat(fd_in)
    try:
        have = os.lstat(copy)
        if (stat.S_ISREG(have.st_mode) and have.st_uid == 0 and have.st_size == src.st_size
                and have.st_mtime_ns == src.st_mtime_ns):
            return copy
    except FileNotFoundError:
        pass
    tmp = copy + ".tmp"
    try:
        for stale in (tmp, copy):
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        os.posix_fadvise(fd_in, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        fd_out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
        try:
            left = src.st_size + 1          # a file that grows meanwhile is not followed to the end
            while left > 0:
                chunk = os.read(fd_in, min(STAGE_CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd_out, view):]
            os.fsync(fd_out)
            if os.fstat(fd_out).st_size != src.st_size:
                raise OSError(f"copied {os.fstat(fd_out).st_size} of {src.st_size} bytes (the image changed?)")
            os.utime(fd_out, ns=(src.st_atime_ns, src.st_mtime_ns))
        finally:
            os.close(fd_out)
        _forget(fd_in)
        os.rename(tmp, copy)
        fsync_dir(stage_dir)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = f"no space left there for the image's {src.st_size:,} bytes (a larger tmpfs or a node-local disk)"
        else:
            why = describe_os_error(exc)
        raise ConfigError([f"cannot stage {image} into {stage_dir}: {why}"]) from None
    return copy


def _forget(fd: int) -> None:
    """Drop the node's cached pages of the network image once it is staged
    (``POSIX_FADV_DONTNEED``): the ranks read the copy, and 4 GB of the image kept in the page
    cache beside the copy pushed the ranks' own pages out (measured: docs/benchmarks.md,
    "Staged once per node")."""
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass


def _read_whole(fd: int) -> None:
    """Read the image's descriptor ``fd`` (:func:`_open_image`: a regular file) from start to
    its size at open in :data:`STAGE_CHUNK` reads, discarding the data: the file system reads
    ahead in its largest requests and the node's page cache keeps the pages for the next reader
    (``unsquashfs``)."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    size = os.fstat(fd).st_size
    done = 0
    while done < size and (chunk := os.pread(fd, min(STAGE_CHUNK, size - done), done)):
        done += len(chunk)


def _remove_tree(path: str) -> None:
    """Remove a file or directory tree inside a stage directory (never follows a link)."""
    import shutil

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def stage_unpacked(build: str, stage_dir: str) -> str:
    """Unpack the image of ``build`` into ``stage_dir`` on this node, unless it is unpacked
    there already from the same image (same size and modification time, kept in
    ``<tree>.done``).

    The image is first read whole in :data:`STAGE_CHUNK` reads (few large requests to the
    network file system; the page cache keeps it), then ``unsquashfs`` writes the tree into
    ``<tree>.tmp`` (owners and modes as in the image), renamed into place whole; on any failure
    the partial tree is removed.

    Args:
        build (str): the build directory on the network file system.
        stage_dir (str): node-local directory (:func:`check_stage_dir`), typically a tmpfs: the
            tree takes the venv's unpacked size (5.5 GB for pytorch/2.3.1-gpu against a 4.0 GB
            image) of the node's memory.

    Returns:
        str: the unpacked tree, ``<stage_dir>/<name>-<digest>.d``.

    Raises:
        ConfigError: an unsafe stage directory, no image, no ``unsquashfs``, or a read/write
            error (e.g. no space left); one line.
    """
    check_stage_dir(stage_dir)
    fd = _open_image(build)         # a regular file, no link: a FIFO or a device is refused
    try:
        return _unpack_from(fd, build, stage_dir)
    finally:
        os.close(fd)


def _unpack_from(image_fd: int, build: str, stage_dir: str) -> str:
    """:func:`stage_unpacked` from the image's descriptor (:func:`_open_image`): read and
    unpacked from ``/proc/self/fd/N`` of it, never by its name."""
    image = image_of(build)
    tree = staged_tree_of(build, stage_dir)
    done, tmp = tree + ".done", tree + ".tmp"
    src = os.fstat(image_fd)
    stamp = f"{src.st_size} {src.st_mtime_ns}\n"
    try:
        if stat.S_ISDIR(os.lstat(tree).st_mode) and stat.S_ISREG(os.lstat(done).st_mode):
            with open(done, opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as f:
                if f.read() == stamp:
                    return tree
    except FileNotFoundError:
        pass
    try:
        for stale in (done, tmp, tree):
            _remove_tree(stale)
        _read_whole(image_fd)
        proc = subprocess.run(["unsquashfs", "-q", "-n", "-d", tmp, f"/proc/self/fd/{image_fd}"],
                              capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=CHILD_CWD,
                              pass_fds=(image_fd,))
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout).strip().splitlines()
            raise OSError(lines[-1] if lines else f"unsquashfs exited with status {proc.returncode}")
        _forget(image_fd)
        os.rename(tmp, tree)
        fd = os.open(done, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
        try:
            os.write(fd, stamp.encode())
        finally:
            os.close(fd)
    except FileNotFoundError as exc:
        _remove_tree(tmp)
        if exc.filename is None and "unsquashfs" in str(exc):
            raise ConfigError(["cannot unpack the image: unsquashfs not found (apt-get install squashfs-tools)"]) from None
        raise ConfigError([f"cannot unpack {image} into {stage_dir}: {describe_os_error(exc)}"]) from None
    except OSError as exc:
        _remove_tree(tmp)
        _remove_tree(tree)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(exc)
        why = (f"no space left there for the unpacked venv (a larger tmpfs or a node-local disk)" if full
               else describe_os_error(exc))
        raise ConfigError([f"cannot unpack {image} into {stage_dir}: {why}"]) from None
    return tree


def mount_build(build: str, stage: str | None = None, unpack: bool = False) -> bool:
    """Mount the image of ``build`` at its venv on this node, unless it is mounted already.

    Without ``stage``, squashfuse reads the image where it lies (the network file system:
    every block the ranks read is a request there). With ``stage``, the image is first copied
    into that node-local directory in large sequential reads (:func:`stage_image`) and the copy
    is mounted by the kernel's squashfs on a loop device (:func:`kernel_mount_argv`; root only):
    start-up then reads nothing from the network (docs/benchmarks.md, "Start-up at scale").
    With ``unpack`` too, the image is unpacked there instead and the tree bound at the venv.

    Args:
        build (str): a build directory (``StackLayout.build_path(id)`` or ``published()``).
        stage (str | None): node-local, root-owned directory for the copy (:func:`check_stage_dir`).
        unpack (bool): with ``stage``: unpack the image into it (:func:`stage_unpacked`) and bind
            the tree read-only at the venv (``nosuid,nodev``): the ranks read plain files from
            node-local memory, nothing is decompressed while they start.

    Returns:
        bool: True if it mounted the image, False if it was mounted already.

    Raises:
        ConfigError: no image (the build is not a squashfs build, or it was removed), no
            ``squashfuse``/``mount``, an unsafe stage directory, staging fails, or the mount
            fails (its own last error line; e.g. no ``/dev/fuse``, no loop device); a link or
            a file at the build's ``venv``, or a mount that landed elsewhere (it is unmounted
            again). A copy staged by this call is removed when its mount fails.
        hpcstack.gate.GateError: a link on the way to the build, a directory on it that an
            untrusted account can change, or an image that is a link, a FIFO or a device
            (one line).

    With ``stage`` the copy and the mount are made under :func:`stage_lock`: a second
    ``hpcstack mount --stage`` on the node waits, then finds the venv mounted.
    """
    with _build_dir(build) as bfd:
        if _mounted_below(bfd):
            return False
        os.close(_open_image(build))        # there, and a regular file (refused otherwise)
        if stage is None:
            return _mount(build, bfd, None, False)
        if os.geteuid() != 0:
            raise ConfigError([f"--stage {stage}: only root can mount a staged image (a loop device or a bind mount)"])
        check_stage_dir(stage)
        with stage_lock(stage):
            if _mounted_below(bfd):         # by another prolog while this one waited
                return False
            return _mount(build, bfd, stage, unpack)


def _mount(build: str, bfd: int, stage: str | None, unpack: bool) -> bool:
    """:func:`mount_build` once its checks passed (with ``stage``: under :func:`stage_lock`), on
    the venv of the build's descriptor ``bfd``.

    The venv is opened (made where missing) relative to ``bfd`` with ``O_PATH|O_NOFOLLOW|
    O_DIRECTORY``: a link or a file at its name is refused in one line. ``mount`` (the staged
    copy, the unpacked tree) mounts on ``/proc/self/fd/N`` of that descriptor with
    ``--no-canonicalize``: the kernel mounts on the directory checked, whatever the name then
    holds. ``squashfuse`` resolves its mount point by name (libfuse's ``realpath``), so there
    the venv's device and inode are compared with the descriptor's right before it runs, and
    after it the mount must sit at the build's path (by descriptor) ``/venv``: a mount that
    appeared anywhere else meanwhile is unmounted again and the command fails.
    """
    venv = mount_point_of(build)
    vfd = _venv_at(bfd, venv, make=True)
    try:
        return _mount_on(build, bfd, vfd, stage, unpack)
    finally:
        os.close(vfd)


def _mount_on(build: str, bfd: int, vfd: int, stage: str | None, unpack: bool) -> bool:
    venv, image = mount_point_of(build), image_of(build)
    on = f"/proc/self/fd/{vfd}"
    fds = [vfd]
    if stage is not None and unpack:
        tree = stage_unpacked(build, stage)
        copy = None  # kept on a failed mount: it is a whole tree, and a re-run finds it
        argvs = [["mount", "--no-canonicalize", "--bind", tree, on],
                 ["mount", "--no-canonicalize", "-o", "remount,bind,ro,nosuid,nodev", on]]
        source, tool = tree, "mount"
    elif stage is not None:
        copy = stage_image(build, stage)
        argv = kernel_mount_argv(copy, on)
        argvs, source, tool = [[argv[0], "--no-canonicalize", *argv[1:]]], copy, "mount"
    else:
        copy = None
        ifd = _open_image(build)
        fds.append(ifd)
        argvs = [["squashfuse", "-o", MOUNT_OPTIONS, f"/proc/self/fd/{ifd}", on]]
        source, tool = image, "squashfuse"
    expected = os.path.join(os.readlink(f"/proc/self/fd/{bfd}"), VENV_DIR)
    try:
        held = os.fstat(vfd)
        before = _mount_points()
        proc = None
        now = os.stat(VENV_DIR, dir_fd=bfd, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise ConfigError([f"{venv}: replaced while it was mounted on; nothing mounted"])
        for argv in argvs:
            if argv is not argvs[0]:    # the remount: on the bind's own root, the tree by inode
                top = os.open(VENV_DIR, _MOUNT_DIR, dir_fd=bfd)
                fds.append(top)
                mine, bound = os.stat(tree), os.fstat(top)
                if (mine.st_dev, mine.st_ino) != (bound.st_dev, bound.st_ino):
                    raise OSError(errno.EBUSY, f"{venv} is not the bind of {tree} any more")
                argv = [*argv[:-1], f"/proc/self/fd/{top}"]
            proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=CHILD_CWD,
                                  pass_fds=tuple(fds))
            if proc.returncode != 0:
                break
    except FileNotFoundError:
        _drop(copy)
        raise ConfigError([f"cannot mount the image: {tool} not found (apt-get install "
                           f"{'mount' if tool == 'mount' else 'squashfuse fuse3'})"]) from None
    except OSError as exc:
        _drop(copy)
        raise ConfigError([f"cannot mount {source} at {venv}: {describe_os_error(exc)}"]) from None
    finally:
        for fd in fds[1:]:
            os.close(fd)
    new = {i: p for i, p in _mount_points().items() if i not in before}
    astray = sorted({p for p in new.values() if p != expected}, reverse=True)
    for point in astray:            # not the build's venv: undone, whatever it covers
        subprocess.run(["umount", "-l", "--no-canonicalize", point], capture_output=True,
                       stdin=subprocess.DEVNULL, cwd=CHILD_CWD)
    if astray:
        for point in [p for p in new.values() if p == expected]:
            subprocess.run(["umount", "-l", "--no-canonicalize", point], capture_output=True,
                           stdin=subprocess.DEVNULL, cwd=CHILD_CWD)
        _drop(copy)
        raise ConfigError([f"{venv}: the mount landed at {astray[0]}, not on the build's venv (its name was "
                           "replaced meanwhile); unmounted again, nothing mounted"])
    if proc.returncode != 0 or not _mounted_below(bfd):
        if proc.returncode != 0 and expected in new.values():      # the bind of a failed remount
            subprocess.run(["umount", "-l", "--no-canonicalize", expected], capture_output=True,
                           stdin=subprocess.DEVNULL, cwd=CHILD_CWD)
        _drop(copy)
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise ConfigError([f"cannot mount {source} at {venv}: "
                           f"{lines[-1] if lines else f'{tool} exited with status {proc.returncode}'}"])
    return True


def _drop(copy: str | None) -> None:
    """Remove a staged copy whose mount failed (nothing else uses it)."""
    if copy:
        try:
            os.unlink(copy)
        except OSError:
            pass


def unmount(path: str) -> None:
    """Unmount the FUSE mount at ``path`` if there is one (``fusermount3 -u``, else ``umount``).

    Raises:
        HpcstackError: it stays mounted (busy: a process still has files open there); the
            message says so, and a re-run finishes the removal.
    """
    try:
        if stat.S_ISLNK(os.lstat(path).st_mode):
            return                  # a link put at a venv's name: never what it points to
    except OSError:
        pass                        # gone, or a FUSE mount whose daemon died (ENOTCONN)
    if not (is_mounted(path) or _mounts_at(path)):
        return
    errors = []
    for argv in (["fusermount3", "-u", "-z", path], ["umount", "-l", path]):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=CHILD_CWD)
        except OSError as exc:
            errors.append(f"{argv[0]}: {describe_os_error(exc)}")
            continue
        if proc.returncode == 0 and not _mounts_at(path):
            return
        said = (proc.stderr or "").strip().splitlines()
        errors.append(f"{argv[0]}: {said[-1] if said else f'exit status {proc.returncode}'}")
    raise HpcstackError(f"cannot unmount {path} ({'; '.join(errors)}); unmount it as root, then re-run")


def release(build: str) -> None:
    """Before a build directory is removed: unmount its image (if mounted) and delete the image.

    Nothing happens for a build without an image (``layout: directory``). Lazy unmounts
    (``-z``/``-l``): a job still reading from it keeps its open files until it ends.

    Raises:
        HpcstackError: the mount cannot be undone.
    """
    unmount(mount_point_of(build))
    for path in (image_of(build), image_of(build) + ".tmp"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def module_check(prefix: str, mount_command: str) -> tuple[str, str]:
    """What the modulefile tests on load, and the line it fails with when the test fails.

    Args:
        prefix (str): the stack's stable prefix (the modulefile names nothing else).
        mount_command (str): the ``hpcstack mount …`` command line for this stack and site.

    Returns:
        tuple[str, str]: the file that exists only while the image is mounted
        (``<prefix>/venv/pyvenv.cfg``), and the error line naming ``hpcstack mount``.
    """
    return (os.path.join(prefix, VENV_DIR, "pyvenv.cfg"),
            f"the image of this stack is not mounted on this node ({mount_point_of(prefix)} is empty); "
            f"an admin mounts it with: {mount_command}")


def node_setup(build: str, mount_command: str) -> str:
    """What a site deploys on the nodes where jobs run, for the published build ``build``.

    Args:
        build (str): the published build directory.
        mount_command (str): the ``hpcstack mount …`` command line for this stack and site.

    Returns:
        str: a Slurm prolog line (follows every new build), an fstab line and a systemd mount
        unit (both name this build: write them again after each new build).
    """
    venv, image = mount_point_of(build), image_of(build)
    unit = subprocess.run(["systemd-escape", "--path", "--suffix=mount", venv], capture_output=True, cwd=CHILD_CWD,
                          text=True).stdout.strip() if _which("systemd-escape") else "<systemd-escape --path --suffix=mount VENV>"
    return "\n".join([
        "# Slurm prolog (runs as root on each node before a job; mounts the build published now):",
        f"{mount_command} --quiet || exit 1",
        "# or unpacked once per node into node-local memory (no network reads while the ranks start;",
        "# costs the venv's unpacked size in RAM: docs/benchmarks.md, \"Staged once per node\"):",
        "# install -d -m 0700 -o root -g root /dev/shm/hpcstack",
        f"# {mount_command} --stage /dev/shm/hpcstack --unpack --quiet || exit 1",
        "# (it first removes the copies there of this stack's builds that are no longer published and",
        "# not mounted; a Slurm epilog line frees them as soon as the last job on them ends:)",
        f"# {mount_command} --stage /dev/shm/hpcstack --prune-only --quiet",
        "",
        "# or /etc/fstab (this build; needs mount.fuse3 from fuse3):",
        f"{image} {venv} fuse.squashfuse {MOUNT_OPTIONS},nofail,_netdev 0 0",
        "",
        f"# or a systemd mount unit /etc/systemd/system/{unit} (this build):",
        "[Unit]",
        f"Description=hpcstack image {image}",
        "After=remote-fs.target",
        "[Mount]",
        f"What={image}",
        f"Where={venv}",
        "Type=fuse.squashfuse",
        f"Options={MOUNT_OPTIONS}",
        "[Install]",
        "WantedBy=multi-user.target",
    ])


def _which(cmd: str) -> bool:
    from shutil import which

    return which(cmd) is not None


def mount_stack(layout, stage: str | None = None, unpack: bool = False) -> list[tuple[str, bool]]:
    """Mount, on this node, the images of a stack's published build and of the build it
    replaced (kept for jobs that started before the switch); idempotent.

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack.
        stage (str | None): stage the published build's image into this node-local directory
            first (:func:`mount_build`); the previous build's is mounted where it lies (only
            jobs that started before the switch read it, and a staged copy costs the node's
            memory or disk).
        unpack (bool): with ``stage``: unpack the image there (:func:`stage_unpacked`) and bind
            the tree at the venv, instead of mounting a copy of the image.

    Returns:
        list[tuple[str, bool]]: ``(build directory, mounted now)``; False where it was mounted.

    Raises:
        ConfigError: nothing published, the published build has no image, or a mount fails.
    """
    published = layout.published()
    if not published and layout.foreign_link():
        raise ConfigError([f"{layout.prefix}: a link to {layout.foreign_link()}, not a build of "
                           f"{layout.name}/{layout.version} in {layout.top}; nothing mounted"])
    if not published:
        raise ConfigError([f"{layout.name}/{layout.version} is not installed at {layout.prefix}; "
                           "install it first (hpcstack install)"])
    builds = [published]
    previous = layout.read_state()["previous"]
    if previous and os.path.isfile(image_of(layout.build_path(previous))):
        builds.append(layout.build_path(previous))
    return [(build, mount_build(build, stage if build == published else None, unpack)) for build in builds]


def restart_packed(layout, choice) -> bool:
    """Before a resumed build runs: if steps before ``image`` are to run again on a build that
    is packed already (``--force``, or an input of the sanity check changed meanwhile), its
    venv exists only in the image, read-only; unmount and remove that build so that the resume
    starts it afresh in the same stage prefix.

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack.
        choice (hpcstack.install.layout.Choice): what :func:`~hpcstack.install.layout.choose` chose.

    Returns:
        bool: True if the build was removed (choose again).
    """
    from hpcstack.install.plan import IMAGE

    plan = choice.plan
    if choice.kind != "resume" or IMAGE not in choice.pending or choice.pending[0] == IMAGE:
        return False
    if not os.path.isfile(image_of(plan.build_prefix)):
        return False
    layout.remove_build(plan.build_id)  # unmounts and deletes the image first (release)
    return True


def unpacked_again(layout, choice, site) -> bool:
    """True if the site's layout is ``directory`` now but the published build, which would be
    updated in place, is packed: a switch back from ``layout: squashfs`` must build anew (the
    image is read-only and its venv lives only there), as the switch to it does by itself (its
    ``image`` step is not one of the in-place steps).

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack.
        choice (hpcstack.install.layout.Choice): what :func:`~hpcstack.install.layout.choose` chose.
        site (hpcstack.site.Site): the site installing it.
    """
    return (choice.kind == "in place" and settings(site) is None
            and os.path.isfile(image_of(choice.plan.build_prefix)))
