"""The copies ``hpcstack mount --stage DIR`` leaves on a node, and their removal once no
longer needed (``hpcstack mount --stage DIR`` prunes before it stages; ``--prune-only`` from an
epilog or by hand).

A staged copy is ``DIR/<name>-<digest>.sqsh`` (the image) or ``DIR/<name>-<digest>.d`` with
``DIR/<name>-<digest>.d.done`` (the unpacked tree), where ``<name>`` is the build directory's
name without its leading dot and ``<digest>`` the first 12 hex digits of the SHA-256 of the
build's real path (:func:`hpcstack.install.image.staged_name_of`). An interrupted staging
leaves ``<name>-<digest>.sqsh.tmp`` or ``.d.tmp`` (or a ``.d`` without its ``.done``).

**Which copies belong to a stack.** No record is kept beside a copy: the name says it. For an
entry ``<name>-<digest>…`` the build it came from can only be ``<top>/.<name>`` (a build of the
stack ``<top>/<version>``, ``<name>`` being ``<version>-<id>``), ``<top>/<version>`` (a prefix
made before builds were staged) or ``<top>/.builds/<version>/<name>`` (the layout of hpcstack
0.2.0), with ``<top>`` the stack's real directory; the entry is the stack's only where the
digest of one of those paths is the one in its name. The build directory need not exist any
more (that is the point), the copies made before this module need no record either, and a
copy of another stack, or of the same version of another stack, never matches (its digest is
of another path). A build whose install root was reached through a symbolic link that has
changed since is not recognised, and its copies are kept: the rule errs on keeping.

**What stays.** The published build's copy (image and tree: either may be the one the prolog
uses); every copy a mount on this node still uses, in any mount namespace (a job may still
run on it): an image that backs a loop device (``/sys/block/loop*/loop/backing_file`` and the
device's ``LOOP_GET_STATUS64``: its file system and inode), a tree that is the source of a
bind mount (a ``/proc/<pid>/mountinfo`` line on the stage directory's file system whose root,
walked by descriptor from this namespace's mount of that file system, is the tree's own
directory by device and inode: a directory of the same name that a user binds in a namespace
of their own does not keep a copy), a tree something is mounted inside (in another namespace,
on a directory that is the tree's, by inode again), and a tree a process still has a
file of open, mapped or as its directory (``/proc/<pid>/fd``, ``maps``, ``cwd``, ``root``: a
bind unmounted lazily while a job runs is in no ``mountinfo``; a loop device keeps its image
open by itself); entries that are not what hpcstack makes (a symbolic link, a file where a
directory belongs, an owner other than root), which are reported and never followed; and every
entry whose name is not of that form, or is another stack's.

Everything runs under :func:`hpcstack.install.image.stage_lock`, as the staging does, so a
``.tmp`` found is one an interrupted run left, never one being written. The build directories
are looked up before the mounts are read: where the install root is on a network file system,
the node's kernel then finds a removed build gone and detaches, lazily, what the node had
mounted in it (``d_invalidate``, Linux 3.18 and later; not checked here: the tests have no
network file system), so the copy goes once no job uses it. Nothing here unmounts anything.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import struct
from dataclasses import dataclass, field

from hpcstack import gate
from hpcstack.errors import ConfigError
from hpcstack.install import image
from hpcstack.install.actions import describe_os_error

#: A staged entry: ``<name>-<digest>`` then ``.sqsh``, ``.sqsh.tmp``, ``.d``, ``.d.tmp`` or ``.d.done``.
ENTRY = re.compile(r"(?P<name>.+)-(?P<digest>[0-9a-f]{12})(?P<kind>\.sqsh(?:\.tmp)?|\.d(?:\.tmp|\.done)?)")
#: ``LOOP_GET_STATUS64`` (linux/loop.h) and the size of ``struct loop_info64`` it fills; its
#: first two fields are ``lo_device`` (the backing file's device, new_encode_dev) and ``lo_inode``.
LOOP_GET_STATUS64 = 0x4C05
_LOOP_INFO64_SIZE = 232
#: The kinds of entry that are files (the others are directories).
_FILE_KINDS = (".sqsh", ".sqsh.tmp", ".d.done")


@dataclass(frozen=True)
class Pruned:
    """One staged entry of a stack and what :func:`prune` did with it.

    Attributes:
        path (str): the entry, ``DIR/<name>-<digest>.<kind>`` (a tree's ``.done`` goes with it).
        size (int | None): bytes it takes, in blocks as ``du -sx`` counts them (each inode
            once); None for a copy kept whose size was not asked for (:func:`prune`).
        why (str): why it went or stayed, e.g. ``"build /sw/pytorch/.2.3.1-gpu-… was removed"``,
            ``"mounted at /sw/pytorch/.2.3.1-gpu-…/venv (a job may still use it)"``.
    """

    path: str
    size: int | None
    why: str

    def size_text(self) -> str:
        """`` (5.5 GB)``, or nothing where the size was not measured."""
        return "" if self.size is None else f" ({human_size(self.size)})"


@dataclass
class PruneReport:
    """What :func:`prune` removed, kept and could not remove.

    Attributes:
        removed (list[Pruned]): entries removed (with ``dry_run``: that would be).
        kept (list[Pruned]): the stack's entries kept, with the reason.
        failed (list[str]): one line per entry that could not be removed (``cannot remove …``).
    """

    removed: list[Pruned] = field(default_factory=list)
    kept: list[Pruned] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def lines(self, dry_run: bool = False) -> list[str]:
        """``removed PATH (SIZE): WHY`` per entry removed, then ``kept PATH (SIZE): WHY``."""
        verb = "would remove" if dry_run else "removed"
        return ([f"{verb} {p.path}{p.size_text()}: {p.why}" for p in self.removed]
                + [f"kept {p.path}{p.size_text()}: {p.why}" for p in self.kept])


def human_size(n: int) -> str:
    """``n`` bytes in decimal units as the docs give sizes: ``5.5 GB``, ``12.3 MB``, ``4.1 kB``,
    ``0 bytes``."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


# ---------------------------------------------------------------------- what is in use

@dataclass(frozen=True)
class _Mount:
    """One line of a ``mountinfo`` file (proc(5))."""

    dev: tuple[int, int]
    root: str
    point: str
    source: str
    pid: int | None  # None: this process's mount namespace
    mount_id: int = 0
    parent_id: int = 0


def _unescape(field_: bytes) -> str:
    """A mountinfo field with its octal escapes (``\\040``) undone."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8) & 0xFF]), field_))


def _read_mountinfo(path: str, pid: int | None) -> list[_Mount]:
    with open(path, "rb") as f:
        data = f.read()
    mounts = []
    for line in data.splitlines():
        fields = line.split(b" ")
        try:
            sep = fields.index(b"-", 6)
            major, minor = (int(x) for x in fields[2].split(b":"))
            mounts.append(_Mount((major, minor), _unescape(fields[3]), _unescape(fields[4]),
                                 _unescape(fields[sep + 2]), pid, int(fields[0]), int(fields[1])))
        except (ValueError, IndexError):
            continue
    return mounts


def node_mounts() -> list[_Mount]:
    """Every mount on this node: this process's mount namespace, then one ``mountinfo`` per
    other namespace (a job in a namespace of its own, e.g. Slurm's ``job_container/tmpfs``).

    Returns:
        list: the mounts; a process that ends while it is read is skipped.

    Raises:
        ConfigError: ``/proc/self/mountinfo`` cannot be read (no ``/proc``): nothing could be
            told to be unused.
    """
    try:
        mounts = _read_mountinfo("/proc/self/mountinfo", None)
    except OSError as exc:
        raise ConfigError([f"cannot read /proc/self/mountinfo ({describe_os_error(exc)}): cannot tell "
                           "which staged copies are mounted; nothing removed"]) from None
    seen = set()
    try:
        seen.add(os.stat("/proc/self/ns/mnt").st_ino)
    except OSError:
        pass
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
            if ns in seen:
                continue
            seen.add(ns)
            mounts.extend(_read_mountinfo(f"/proc/{pid}/mountinfo", pid))
        except OSError:
            continue
    return mounts


def loop_backings() -> list[tuple[str, str, tuple[int, int] | None, int | None]]:
    """The loop devices in use on this node and their backing files.

    Returns:
        list[tuple[str, str, tuple[int, int] | None, int | None]]: ``(device, backing path as
        sysfs gives it, (major, minor) of the backing file's file system, its inode)``; the last
        two None where the device node cannot be asked (``LOOP_GET_STATUS64``).
    """
    found = []
    try:
        names = sorted(n for n in os.listdir("/sys/block") if n.startswith("loop"))
    except OSError:
        return found
    for name in names:
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as f:
                backing = f.read().rstrip("\n")
        except OSError:
            continue  # not bound
        dev = ino = None
        try:
            fd = os.open(f"/dev/{name}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                info = fcntl.ioctl(fd, LOOP_GET_STATUS64, bytes(_LOOP_INFO64_SIZE))
            finally:
                os.close(fd)
            lo_device, ino = struct.unpack_from("=QQ", info)
            dev = (os.major(lo_device), os.minor(lo_device))
        except OSError:
            pass
        found.append((f"/dev/{name}", backing, dev, ino))
    return found


def _where(mount: _Mount) -> str:
    return mount.point + (f" (mount namespace of pid {mount.pid})" if mount.pid is not None else "")


def _reaches(fs_path: str, dev: tuple[int, int], key: tuple[int, int], mounts: list[_Mount]) -> bool:
    """True when the directory ``fs_path`` of the file system ``dev`` (a path inside that file
    system, as a mountinfo ``root`` field gives it) is the staged copy whose ``(st_dev, st_ino)``
    is ``key``, or lies inside it: the path is walked by descriptor, no link followed
    (:func:`hpcstack.gate.inodes_on`), from each mount of that file system in this process's
    namespace whose root lies above it, and the copy's inode must be met on the way. A directory
    elsewhere with the copy's name (a user's look-alike, bound in a namespace of their own) never
    meets it."""
    for a in mounts:
        if a.pid is not None or a.dev != dev:
            continue
        base = a.root.rstrip("/")
        if fs_path != a.root and not fs_path.startswith(base + "/"):
            continue
        full = os.path.join(a.point, fs_path[len(base):].lstrip("/"))
        if key in gate.inodes_on(full):
            return True
    return False


def _inside(m: _Mount, path: str, dev: tuple[int, int], key: tuple[int, int], mounts: list[_Mount]) -> bool:
    """True when ``m`` is mounted on a directory of the copy ``path``: in this namespace, its
    mount point is ``path`` or below it; in another, the directory it is mounted on (its parent
    mount's ``root`` plus the rest of its mount point) is the copy or inside it, by inode
    (:func:`_reaches`): a user's namespace that mounts a file system of its own where the
    stage directory is, and something on the copy's name in it, is not the copy."""
    if m.pid is None:
        return m.point == path or m.point.startswith(path + "/")
    parent = next((p for p in mounts if p.pid == m.pid and p.mount_id == m.parent_id), None)
    if parent is None or parent.dev != dev or parent is m:
        return False
    rest = os.path.relpath(m.point, parent.point)
    if rest == ".." or rest.startswith("../"):
        return False
    fs_path = os.path.normpath(os.path.join(parent.root, rest))
    return _reaches(fs_path, dev, key, mounts)


def _use_of(path: str, kind: str, st: os.stat_result, mounts: list[_Mount], loops) -> str | None:
    """Why the entry ``path`` is in use on this node, or None. A bind mount uses a tree when its
    source is the tree (or inside it) by device and inode, not by name (:func:`_reaches`)."""
    if kind.startswith(".sqsh"):
        for device, backing, dev, ino in loops:
            if backing == path or (dev == (os.major(st.st_dev), os.minor(st.st_dev)) and ino == st.st_ino):
                points = [_where(m) for m in mounts if m.source == device]
                return (f"mounted at {points[0]} from {device} (a job may still use it)" if points else
                        f"backs {device}, which no mount in sight uses (an image unmounted lazily that a job "
                        f"still reads; or a device left attached: losetup -d {device})")
        return None
    name = os.path.basename(path)
    dev = (os.major(st.st_dev), os.minor(st.st_dev))
    key = (st.st_dev, st.st_ino)
    for m in mounts:
        if m.dev == dev and name in m.root.split("/") and _reaches(m.root, dev, key, mounts):
            return f"bound at {_where(m)} (a job may still use it)"
        if (m.point == path or m.point.startswith(path + "/")) and _inside(m, path, dev, key, mounts):
            return f"{_where(m)} is mounted inside it"
    return None


# ---------------------------------------------------------------------- which are the stack's

def build_of(layout, name: str, digest: str) -> str | None:
    """The real path of the build of ``layout`` that a staged entry ``<name>-<digest>…`` was
    copied from, or None where it is not one of this stack's (see the module's docstring).

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack.
        name (str): the entry's name part (the build directory's name without its leading dot).
        digest (str): its 12 hex digits.
    """
    top = os.path.realpath(layout.top)
    candidates = []
    if layout.id_of(os.path.join(layout.top, "." + name)):
        candidates.append(os.path.join(top, "." + name))
    if name == layout.version:
        candidates.append(os.path.join(top, name))
    if name not in (".", ".."):
        candidates.append(os.path.join(os.path.realpath(layout.legacy_builds_dir), name))
    return next((c for c in candidates if image.staged_digest(c) == digest), None)


def _not_ours(st: os.stat_result, kind: str) -> str | None:
    """Why an entry of hpcstack's naming is not what hpcstack makes there, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link, which hpcstack never makes there (not followed; remove it by hand)"
    want_file = kind in _FILE_KINDS
    if want_file and not stat.S_ISREG(st.st_mode):
        return "not a regular file, as hpcstack makes it (left alone)"
    if not want_file and not stat.S_ISDIR(st.st_mode):
        return "not a directory, as hpcstack makes it (left alone)"
    if st.st_uid != 0:
        return f"owned by uid {st.st_uid}, not root as hpcstack makes it (left alone)"
    return None


def _walk(path: str) -> tuple[int, set[tuple[int, int]]]:
    """Bytes ``path`` takes (``st_blocks`` x 512 over its tree, each inode once, no link followed,
    no other file system entered: ``du -sx``), and the ``(st_dev, st_ino)`` of everything in it."""
    seen, total, todo, top_dev = set(), 0, [path], None
    while todo:
        p = todo.pop()
        try:
            st = os.lstat(p)
        except OSError:
            continue
        top_dev = st.st_dev if top_dev is None else top_dev
        if st.st_dev != top_dev:
            continue
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
        if stat.S_ISDIR(st.st_mode):
            try:
                todo.extend(e.path for e in os.scandir(p))
            except OSError:
                pass
    return total, seen


def _held_open(inodes: set[tuple[int, int]]) -> str | None:
    """Which process, if any, has one of ``inodes`` open, mapped, or as its working or root
    directory (``/proc/<pid>/fd``, ``maps``, ``cwd``, ``root``, as ``fuser`` looks): a tree whose
    bind mount was detached (``umount -l``, or the kernel's own lazy unmount when a network file
    system finds the build directory removed) while a job still runs from it."""
    devs = {dev for dev, _ in inodes}
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 6 and fields[4] != b"0":
                        major, minor = (int(x, 16) for x in fields[3].split(b":"))
                        if (os.makedev(major, minor), int(fields[4])) in inodes:
                            return f"process {pid} maps a file of it (a job may still use it)"
            links = ["cwd", "root"] + [f"fd/{n}" for n in os.listdir(f"/proc/{pid}/fd")]
        except (OSError, ValueError):
            continue
        for link in links:
            try:
                st = os.stat(f"/proc/{pid}/{link}")
            except OSError:
                continue
            if st.st_dev in devs and (st.st_dev, st.st_ino) in inodes:
                return f"process {pid} has a file of it open (a job may still use it)"
    return None


def _remove(parts: list[str]) -> None:
    """Remove a tree's ``.done`` first, then the tree (an interrupted removal leaves a tree
    without ``.done``: an interrupted staging to the next prune). :func:`shutil.rmtree` never
    follows a link (it works through directory descriptors)."""
    for p in parts:
        if stat.S_ISDIR(os.lstat(p).st_mode):
            shutil.rmtree(p)
        else:
            os.unlink(p)


# ---------------------------------------------------------------------- pruning

def prune(layout, stage_dir: str, dry_run: bool = False, measure_kept: bool = True) -> PruneReport:
    """Remove from ``stage_dir`` this node's copies of the builds of ``layout`` that no longer
    serve: those of builds other than the published one, and the leftovers of an interrupted
    staging, unless a mount still uses them (see the module's docstring for what is kept).

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack (its builds' directories need not
            exist any more).
        stage_dir (str): the node-local directory of ``hpcstack mount --stage``; refused as
            :func:`hpcstack.install.image.check_stage_dir` refuses it, before anything is read.
        dry_run (bool): say what would be removed; remove nothing.
        measure_kept (bool): measure the copies kept too (a walk over an unpacked tree's tens
            of thousands of files); False leaves their size None (what the prolog does).

    Returns:
        PruneReport: removed, kept (with the reason) and failed entries, by name.

    Raises:
        ConfigError: an unsafe or missing stage directory, or no ``/proc/self/mountinfo``; one
            line, nothing removed.
    """
    image.check_stage_dir(stage_dir)
    report = PruneReport()
    with image.stage_lock(stage_dir):
        try:
            names = set(os.listdir(stage_dir))
        except OSError as exc:
            raise ConfigError([f"--stage {stage_dir}: cannot list it: {describe_os_error(exc)}"]) from None
        found = [(n, m, b) for n in sorted(names) if (m := ENTRY.fullmatch(n))
                 and (b := build_of(layout, m["name"], m["digest"]))]
        if not found:
            return report
        # looked up first: a network file system that finds a build directory removed detaches
        # (lazily) what this node had mounted in it, before the mounts are read
        alive = {build: os.path.isdir(build) for _, _, build in found}
        mounts, loops = node_mounts(), loop_backings()
        published = layout.published()
        published = os.path.realpath(published) if published else None
        for name, m, build in found:
            kind = m["kind"]
            if kind == ".d.done" and name[: -len(".done")] in names:
                continue  # goes with its tree
            _judge(report, os.path.join(stage_dir, name), kind, build, alive[build], published, names,
                   (mounts, loops), dry_run, measure_kept)
    return report


def _judge(report: PruneReport, path: str, kind: str, build: str, alive: bool, published: str | None,
           names: set[str], in_sight: tuple, dry_run: bool, measure_kept: bool) -> None:
    """Keep or remove one staged entry of the stack (:func:`prune`), adding it to ``report``;
    ``in_sight``: :func:`node_mounts` and :func:`loop_backings`."""
    done = path + ".done"
    parts = [done, path] if kind == ".d" and os.path.basename(done) in names else [path]
    try:
        stats = [os.lstat(p) for p in parts]
    except OSError as exc:
        report.failed.append(f"cannot remove {path}: {describe_os_error(exc)}")
        return
    for p, st in zip(parts, stats):
        bad = _not_ours(st, ".d.done" if p == done else kind)
        if bad:
            report.kept.append(Pruned(path, st.st_blocks * 512, (f"{done}: " if p == done else "") + bad))
            return
    use = _use_of(path, kind, stats[-1], *in_sight)
    complete = kind == ".sqsh" or (kind == ".d" and len(parts) == 2)
    if not use and complete and build == published:
        use = f"the copy of the published build {build}"
    size, inodes = None, set()
    if not use or measure_kept:
        size = 0
        for p in parts:
            more, their = _walk(p)
            size, inodes = size + more, inodes | their
    if not use and kind.startswith(".d"):
        use = _held_open(inodes)
    if use:
        if not alive and use.startswith(("mounted at", "bound at")):
            use += (f"; its build is removed: once no job runs from it, umount {image.mount_point_of(build)} "
                    "and prune again")
        report.kept.append(Pruned(path, size, use))
        return
    if not complete:
        why = "left by an interrupted staging"
    elif alive:
        why = f"build {build} is no longer published, and nothing here mounts this copy"
    else:
        why = f"build {build} was removed"
    if not dry_run:
        try:
            _remove(parts)
        except OSError as exc:
            report.failed.append(f"cannot remove {path}: {describe_os_error(exc)}")
            return
    report.removed.append(Pruned(path, size, why))


def mount_staged(layout, stage_dir: str, unpack: bool = False) -> tuple[list[tuple[str, bool]], PruneReport]:
    """``hpcstack mount --stage DIR``: under the stage directory's lock, prune the stack's copies
    that no longer serve (:func:`prune`; first, so that their memory is free for the new copy),
    then stage and mount (:func:`hpcstack.install.image.mount_stack`).

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack.
        stage_dir (str): the node-local, root-owned directory
            (:func:`hpcstack.install.image.check_stage_dir`).
        unpack (bool): unpack the image there and bind the tree (``--unpack``).

    Returns:
        tuple: what :func:`~hpcstack.install.image.mount_stack` returns, and the prune's report
        (its ``failed`` lines do not stop the mount).

    Raises:
        ConfigError: an unsafe stage directory, nothing published (nothing pruned then), or the
            staging or mount fails; one line.
    """
    image.check_stage_dir(stage_dir)
    with image.stage_lock(stage_dir):
        report = prune(layout, stage_dir, measure_kept=False) if layout.published() else PruneReport()
        return image.mount_stack(layout, stage=stage_dir, unpack=unpack), report
