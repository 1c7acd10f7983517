"""``hpcstack mount --stage DIR`` (:func:`hpcstack.install.image.mount_build` with ``stage``):
the image copied into a root-owned node-local directory and the copy mounted by the kernel's
squashfs on a loop device; unsafe stage directories refused with one line before anything is
copied; a failed copy or mount leaves no copy behind. Then the pruning of a node's copies
(:mod:`hpcstack.install.staged`, ``hpcstack mount --stage DIR [--prune-only]``): stale copies
removed, the published build's and every mounted (in any mount namespace) or still-read copy
kept, entries that are not the stack's or not what hpcstack makes left alone, leftovers of an
interrupted staging removed, and a copy that cannot be removed reported in one line, exit 1.
The real ``mksquashfs``, ``unsquashfs``, ``mount`` (loop device, bind), tmpfs; a few seconds.
The CLI option through a real install: tests/test_squashfs.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install import image, staged

pytestmark = pytest.mark.integration


def _loop_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (a loop device and a kernel mount)"
    if "squashfs" not in Path("/proc/filesystems").read_text():
        return "the kernel has no squashfs"
    for tool in ("mksquashfs", "mount", "umount", "losetup"):
        if not shutil.which(tool):
            return f"{tool} missing (apt-get install squashfs-tools mount)"
    free = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    if free.returncode != 0:
        return f"no free loop device ({free.stderr.strip()})"
    return None


def _mount_of(point: Path) -> tuple[str, str] | None:
    """``(fs type, source)`` of the mount at ``point`` in /proc/self/mountinfo, or None."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[4].encode().decode("unicode_escape") == str(point):
            return fields[sep + 1], fields[sep + 2]
    return None


def _scratch(prefix: str, blob: int) -> tuple[Path, Path]:
    """A root-readable directory under /var/tmp and in it ``src/``, a venv's stand-in to pack:
    ``pyvenv.cfg`` and ``blob`` bytes of incompressible data."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    os.chmod(root, 0o755)
    src = root / "src"
    src.mkdir()
    (src / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (src / "blob").write_bytes(os.urandom(blob))
    return root, src


@pytest.fixture
def build():
    """A build directory under /var/tmp with a packed ``venv.sqsh`` (``pyvenv.cfg`` and 256 KiB
    of incompressible data) and an empty ``venv/``; a root-owned 0700 stage directory beside it.
    Everything mounted under it is unmounted afterwards."""
    reason = _loop_missing()
    if reason:
        pytest.skip(reason)
    root, src = _scratch("mount-stage-", 256 << 10)
    b = root / ".1.0-abc"
    (b / "venv").mkdir(parents=True)
    subprocess.run(image.pack_argv(str(src), str(b / image.IMAGE_NAME), image.ImageSettings("lz4", 1)),
                   check=True, capture_output=True)
    stage = root / "stage"
    stage.mkdir(mode=0o700)
    try:
        yield {"root": root, "build": b, "stage": stage}
    finally:
        for point in sorted({line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                             if line.split()[4].startswith(str(root) + "/")}, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_stage_copies_the_image_and_the_kernel_mounts_the_copy(build):
    b, stage = build["build"], build["stage"]
    assert image.mount_build(str(b), stage=str(stage)) is True
    copy = Path(image.staged_image_of(str(b), str(stage)))
    assert copy.parent == stage and copy.name.startswith("1.0-abc-") and copy.suffix == ".sqsh"
    assert copy.read_bytes() == (b / image.IMAGE_NAME).read_bytes()
    assert copy.stat().st_mtime_ns == (b / image.IMAGE_NAME).stat().st_mtime_ns
    fstype, source = _mount_of(b / "venv")
    assert fstype == "squashfs" and source.startswith("/dev/loop"), (fstype, source)
    assert (b / "venv" / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    assert list(stage.glob("*.tmp")) == []
    # mounted already: nothing copied or mounted again
    inode = copy.stat().st_ino
    assert image.mount_build(str(b), stage=str(stage)) is False
    # unmounted (as removing a build does), a second mount finds the copy and reads nothing again
    image.unmount(str(b / "venv"))
    assert _mount_of(b / "venv") is None
    assert image.mount_build(str(b), stage=str(stage)) is True
    assert copy.stat().st_ino == inode and _mount_of(b / "venv")[0] == "squashfs"


def test_a_changed_image_is_staged_again(build):
    b, stage = build["build"], build["stage"]
    copy = Path(image.staged_image_of(str(b), str(stage)))
    copy.write_bytes(b"old")  # a copy left from another image of the same build path
    os.chmod(copy, 0o400)
    assert image.mount_build(str(b), stage=str(stage)) is True
    assert copy.read_bytes() == (b / image.IMAGE_NAME).read_bytes()


@pytest.mark.parametrize("kind", ["symlink", "not-root", "group-writable", "sticky-world-writable",
                                  "symlink-above", "missing", "relative"])
def test_an_unsafe_stage_directory_is_refused_with_one_line_and_nothing_copied(build, kind):
    b, root = build["build"], build["root"]
    target = root / "stage"
    if kind == "symlink":
        stage = root / "link"
        stage.symlink_to(target)
    elif kind == "not-root":
        stage = root / "theirs"
        stage.mkdir(mode=0o700)
        os.chown(stage, 65534, 65534)
    elif kind == "group-writable":
        stage = root / "gw"
        stage.mkdir()
        os.chmod(stage, 0o770)
    elif kind == "sticky-world-writable":
        stage = root / "shared"
        stage.mkdir()
        os.chmod(stage, 0o1777)  # like /tmp: an ordinary user could make entries in it
    elif kind == "symlink-above":
        (root / "up").symlink_to(root)
        stage = root / "up" / "stage"
    elif kind == "missing":
        stage = root / "nothere"
    else:
        stage = Path("stage")
    with pytest.raises(ConfigError) as err:
        image.mount_build(str(b), stage=str(stage))
    msg = str(err.value)
    assert msg.count("\n") == 0 and msg.startswith(f"--stage {stage}"), msg
    expect = {"symlink": "symbolic link", "not-root": "owned by uid 65534", "group-writable": "writable by",
              "sticky-world-writable": "writable by", "symlink-above": "symbolic link",
              "missing": "install -d", "relative": "not an absolute path"}[kind]
    assert expect in msg, msg
    assert _mount_of(b / "venv") is None
    assert list(target.iterdir()) == []


def test_a_stage_directory_too_small_leaves_nothing_behind(build):
    b, stage = build["build"], build["stage"]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(stage)], check=True)
    with pytest.raises(ConfigError) as err:
        image.mount_build(str(b), stage=str(stage))
    msg = str(err.value)
    assert msg.count("\n") == 0 and "no space left" in msg and "cannot stage" in msg, msg
    assert list(stage.iterdir()) == [] and _mount_of(b / "venv") is None


def test_a_copy_that_cannot_be_mounted_is_removed(build):
    b, stage = build["build"], build["stage"]
    (b / image.IMAGE_NAME).write_bytes(b"not a squashfs image\n" * 100)
    with pytest.raises(ConfigError) as err:
        image.mount_build(str(b), stage=str(stage))
    msg = str(err.value)
    assert msg.count("\n") == 0 and msg.startswith("cannot mount ") and str(stage) in msg, msg
    assert list(stage.iterdir()) == [] and _mount_of(b / "venv") is None


def test_unpack_binds_the_unpacked_tree_read_only_and_a_second_mount_reuses_it(build):
    if not shutil.which("unsquashfs"):
        pytest.skip("unsquashfs missing (apt-get install squashfs-tools)")
    b, stage = build["build"], build["stage"]
    assert image.mount_build(str(b), stage=str(stage), unpack=True) is True
    tree = Path(image.staged_image_of(str(b), str(stage))[: -len(".sqsh")] + ".d")
    assert sorted(p.name for p in stage.iterdir()) == sorted([tree.name, tree.name + ".done"])
    assert (b / "venv" / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    fstype, _ = _mount_of(b / "venv")
    assert fstype != "squashfs"  # plain files of the stage directory's file system
    opts = next(line.split()[5] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                if line.split()[4] == str(b / "venv"))
    assert {"ro", "nosuid", "nodev"} <= set(opts.split(",")), opts
    with pytest.raises(OSError):
        (b / "venv" / "new").write_text("x")
    inode = tree.stat().st_ino
    assert image.mount_build(str(b), stage=str(stage), unpack=True) is False
    image.unmount(str(b / "venv"))
    assert _mount_of(b / "venv") is None
    assert image.mount_build(str(b), stage=str(stage), unpack=True) is True
    assert tree.stat().st_ino == inode  # unpacked once


def test_unpack_of_a_bad_image_leaves_no_tree(build):
    if not shutil.which("unsquashfs"):
        pytest.skip("unsquashfs missing (apt-get install squashfs-tools)")
    b, stage = build["build"], build["stage"]
    (b / image.IMAGE_NAME).write_bytes(b"not a squashfs image\n" * 100)
    with pytest.raises(ConfigError) as err:
        image.mount_build(str(b), stage=str(stage), unpack=True)
    msg = str(err.value)
    assert msg.count("\n") == 0 and msg.startswith("cannot unpack ") and str(stage) in msg, msg
    assert list(stage.iterdir()) == [] and _mount_of(b / "venv") is None


# ------------------------------------------------------------------ pruning the copies of a node
#
# A stack tiny/1.0 in an install root of its own: build A (removed later, or published first),
# build C (still on disk, not published) and build B (published); the image of each a real
# squashfs image. Pruning (hpcstack.install.staged) keeps what is published or still in use and
# removes the rest of the stack's copies, and nothing else.

A, B, C = "aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc"


def _publish(sw: Path, build_id: str) -> None:
    link = sw / "tiny" / "1.0"
    tmp = sw / "tiny" / ".1.0.publish-tmp"
    tmp.symlink_to(f".1.0-{build_id}")
    os.rename(tmp, link)


@pytest.fixture
def stack():
    """``root/sw/tiny/.1.0-{A,B,C}`` each with ``venv/`` and ``venv.sqsh``, ``root/sw/tiny/1.0``
    linked to B, a root-owned 0700 ``root/stage``, and the layout. Everything mounted under
    ``root`` is unmounted afterwards."""
    from hpcstack.install.layout import StackLayout

    reason = _loop_missing()
    if reason:
        pytest.skip(reason)
    if not shutil.which("unsquashfs"):
        pytest.skip("unsquashfs missing (apt-get install squashfs-tools)")
    root, src = _scratch("mount-prune-", 64 << 10)
    packed = root / "packed.sqsh"
    subprocess.run(image.pack_argv(str(src), str(packed), image.ImageSettings("lz4", 1)), check=True,
                   capture_output=True)
    sw = root / "sw"
    builds = {}
    for build_id in (A, B, C):
        b = sw / "tiny" / f".1.0-{build_id}"
        (b / "venv").mkdir(parents=True)
        shutil.copy2(packed, b / image.IMAGE_NAME)
        builds[build_id] = b
    _publish(sw, B)
    stage = root / "stage"
    stage.mkdir(mode=0o700)
    try:
        yield {"root": root, "sw": sw, "stage": stage, "builds": builds,
               "layout": StackLayout(str(sw), "tiny", "1.0")}
    finally:
        for point in sorted({line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                             if line.split()[4].startswith(str(root) + "/")}, reverse=True):
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _copy(st, build_id: str) -> Path:
    return Path(image.staged_image_of(str(st["builds"][build_id]), str(st["stage"])))


def _tree(st, build_id: str) -> Path:
    return Path(image.staged_tree_of(str(st["builds"][build_id]), str(st["stage"])))


def _by_path(entries) -> dict[str, str]:
    return {p.path: p.why for p in entries}


def test_prune_removes_stale_copies_and_keeps_the_published_one_and_what_is_not_the_stacks(stack):
    st, stage = stack, stack["stage"]
    for build_id in (A, B, C):
        image.stage_image(str(st["builds"][build_id]), str(stage))
    image.stage_unpacked(str(st["builds"][A]), str(stage))
    # another stack whose build has the same directory name as A: same name part, another digest
    other = st["sw"] / "other" / f".1.0-{A}"
    (other / "venv").mkdir(parents=True)
    shutil.copy2(st["builds"][A] / image.IMAGE_NAME, other / image.IMAGE_NAME)
    other_copy = Path(image.stage_image(str(other), str(stage)))
    assert other_copy.name.startswith(f"1.0-{A}-") and other_copy != _copy(st, A)
    (stage / "notes.txt").write_text("an admin's file\n")
    (stage / f"1.0-{A}-0123456789ab.sqsh").write_bytes(b"x")  # hpcstack's naming, no build's digest
    (stage / f"{_copy(st, A).name}.done").write_bytes(b"x")  # not a name hpcstack makes
    shutil.rmtree(st["builds"][A])  # uninstalled: only the node's copies are left

    report = staged.prune(st["layout"], str(stage))

    removed = _by_path(report.removed)
    assert set(removed) == {str(_copy(st, A)), str(_tree(st, A)), str(_copy(st, C))}, report
    assert "was removed" in removed[str(_copy(st, A))] and "no longer published" in removed[str(_copy(st, C))]
    assert _by_path(report.kept) == {str(_copy(st, B)): f"the copy of the published build {st['builds'][B]}"}
    assert report.failed == []
    assert sorted(p.name for p in stage.iterdir()) == sorted(
        [_copy(st, B).name, other_copy.name, "notes.txt", f"1.0-{A}-0123456789ab.sqsh", f"{_copy(st, A).name}.done"])
    assert _copy(st, B).read_bytes() == (st["builds"][B] / image.IMAGE_NAME).read_bytes()
    sizes = {p.path: p.size for p in report.removed}
    assert sizes[str(_copy(st, C))] >= (st["builds"][C] / image.IMAGE_NAME).stat().st_size
    assert sizes[str(_tree(st, A))] >= 64 << 10  # the unpacked blob
    line = next(x for x in report.lines() if x.startswith(f"removed {_copy(st, C)} ("))
    assert line.endswith(f"): build {st['builds'][C]} is no longer published, and nothing here mounts this copy")
    # nothing left to do: an empty report, nothing removed
    again = staged.prune(st["layout"], str(stage))
    assert again.removed == [] and [p.path for p in again.kept] == [str(_copy(st, B))]


@pytest.mark.parametrize("unpack", [False, True], ids=["loop", "bind"])
def test_a_copy_mounted_on_the_node_is_kept_until_it_is_unmounted(stack, unpack):
    st, stage = stack, stack["stage"]
    _publish(st["sw"], A)
    assert image.mount_build(str(st["builds"][A]), stage=str(stage), unpack=unpack) is True
    entry = _tree(st, A) if unpack else _copy(st, A)
    _publish(st["sw"], B)  # a new build published; the job on A still runs

    report = staged.prune(st["layout"], str(stage))

    why = _by_path(report.kept).get(str(entry), "")
    venv = st["builds"][A] / "venv"
    assert why.startswith("bound at " if unpack else "mounted at ") and str(venv) in why, report
    assert report.removed == [] and entry.exists()
    assert (venv / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    image.unmount(str(venv))
    report = staged.prune(st["layout"], str(stage))
    assert [p.path for p in report.removed] == [str(entry)] and not entry.exists()
    assert not Path(str(entry) + ".done").exists()


@pytest.mark.parametrize("unpack", [False, True], ids=["loop", "bind"])
def test_a_copy_still_read_after_a_lazy_unmount_is_kept(stack, unpack):
    """``umount -l`` (or the kernel's own detach when a network file system finds the build
    removed) takes the mount out of every mountinfo while a job still reads from it."""
    st, stage = stack, stack["stage"]
    _publish(st["sw"], A)
    image.mount_build(str(st["builds"][A]), stage=str(stage), unpack=unpack)
    entry = _tree(st, A) if unpack else _copy(st, A)
    venv = st["builds"][A] / "venv"
    job = subprocess.Popen(["sleep", "600"], cwd=venv)  # its working directory is in the mount
    try:
        subprocess.run(["umount", "-l", str(venv)], check=True)
        assert _mount_of(venv) is None
        _publish(st["sw"], B)
        report = staged.prune(st["layout"], str(stage))
        why = _by_path(report.kept).get(str(entry), "")
        assert (f"process {job.pid} " in why) if unpack else why.startswith("backs /dev/loop"), report
        assert entry.exists() and report.removed == []
    finally:
        job.kill()
        job.wait()
    if unpack:  # the job has ended: nothing holds the tree now
        report = staged.prune(st["layout"], str(stage))
        assert [p.path for p in report.removed] == [str(entry)] and not entry.exists()


def test_entries_of_hpcstack_naming_that_hpcstack_did_not_make_are_never_followed(stack):
    st, stage = stack, stack["stage"]
    victim = st["root"] / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("not hpcstack's\n")
    tree, copy = _tree(st, A), _copy(st, A)
    tree.symlink_to(victim)  # a stale build's tree, as a link to elsewhere
    Path(str(tree) + ".done").write_text("0 0\n")
    copy.symlink_to(victim / "keep.txt")
    _copy(st, C).mkdir()  # a directory where an image belongs
    shutil.rmtree(st["builds"][A])

    report = staged.prune(st["layout"], str(stage))

    assert report.removed == [] and report.failed == []
    kept = _by_path(report.kept)
    assert "symbolic link" in kept[str(tree)] and "symbolic link" in kept[str(copy)], report
    assert "not a regular file" in kept[str(_copy(st, C))]
    assert (victim / "keep.txt").read_text() == "not hpcstack's\n" and sorted(os.listdir(victim)) == ["keep.txt"]
    assert tree.is_symlink() and copy.is_symlink() and _copy(st, C).is_dir()


def test_leftovers_of_an_interrupted_staging_are_removed_and_the_next_mount_stages_afresh(stack):
    st, stage = stack, stack["stage"]
    partial = Path(str(_copy(st, B)) + ".tmp")  # the published build's copy, cut short
    partial.write_bytes(b"hsqs" + b"\0" * 1000)
    os.chmod(partial, 0o400)
    unpacking = Path(str(_tree(st, C)) + ".tmp")  # unsquashfs cut short
    (unpacking / "lib").mkdir(parents=True)
    (unpacking / "lib" / "half.py").write_text("x = 1\n")
    no_done = _tree(st, B)  # renamed into place, its .done never written
    no_done.mkdir()
    (no_done / "pyvenv.cfg").write_text("home = /usr/bin\n")

    report = staged.prune(st["layout"], str(stage))

    removed = _by_path(report.removed)
    assert set(removed) == {str(partial), str(unpacking), str(no_done)}, report
    assert all(why == "left by an interrupted staging" for why in removed.values())
    assert list(stage.iterdir()) == []
    assert image.mount_build(str(st["builds"][B]), stage=str(stage)) is True
    assert _copy(st, B).read_bytes() == (st["builds"][B] / image.IMAGE_NAME).read_bytes()


def test_mount_stage_prunes_first_then_stages_the_published_build(stack):
    st, stage = stack, stack["stage"]
    image.stage_unpacked(str(st["builds"][A]), str(stage))
    shutil.rmtree(st["builds"][A])
    mounted, report = staged.mount_staged(st["layout"], str(stage), unpack=True)
    assert [p.path for p in report.removed] == [str(_tree(st, A))]
    assert mounted == [(str(st["builds"][B]), True)]
    assert sorted(p.name for p in stage.iterdir()) == sorted([_tree(st, B).name, _tree(st, B).name + ".done"])


def test_the_stage_lock_is_held_across_processes(stack):
    """Two prologs on one node: while one holds the stage directory's lock, the other cannot take it."""
    import fcntl

    stage = stack["stage"]
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys\nfrom hpcstack.install import image\n"
         f"with image.stage_lock({str(stage)!r}):\n    print('held', flush=True)\n    sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        fd = os.open(stage, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.stdin.close()
            assert holder.wait() == 0
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the holder
        finally:
            os.close(fd)
    finally:
        holder.kill()
        holder.wait()


def test_prune_only_through_the_command_line(stack):
    st, stage = stack, stack["stage"]
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site["layout"] = "squashfs"
    (st["root"] / "sq.yaml").write_text(yaml.safe_dump(site))
    where = ["tiny/1.0", "--site", str(st["root"] / "sq.yaml"), "--prefix", str(st["sw"])]
    proc = hpcstack("mount", *where, "--stage", str(stage), "--prune-only")
    assert proc.returncode == 0 and proc.stdout == f"nothing staged in {stage} for tiny/1.0\n", proc
    image.stage_image(str(st["builds"][B]), str(stage))
    image.stage_image(str(st["builds"][C]), str(stage))
    dry = hpcstack("mount", *where, "--stage", str(stage), "--prune-only", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith(f"would remove {_copy(st, C)} ("), dry
    assert _copy(st, C).exists()
    proc = hpcstack("mount", *where, "--stage", str(stage), "--prune-only")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"removed {_copy(st, C)} (") and " kB): build " in lines[0]
    assert lines[1].startswith(f"kept {_copy(st, B)} (") and lines[1].endswith(
        f"the copy of the published build {st['builds'][B]}"), lines
    assert not _copy(st, C).exists()
    image.stage_image(str(st["builds"][C]), str(stage))
    proc = hpcstack("mount", *where, "--stage", str(stage))  # a prolog: prunes, then stages and mounts
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 2, proc
    assert lines[0].startswith(f"removed {_copy(st, C)} (") and not _copy(st, C).exists()
    b = st["builds"][B]
    assert lines[1] == f"mounted: {_copy(st, B)} at {b / 'venv'} (staged from {b / image.IMAGE_NAME})", lines
    unit = hpcstack("mount", *where, "--print-unit")
    assert unit.returncode == 0 and "--stage /dev/shm/hpcstack --prune-only --quiet" in unit.stdout, unit
    for bad, words in ((["--prune-only"], "--prune-only: only with --stage DIR"),
                       (["--stage", str(stage), "--dry-run"], "--dry-run: only with --prune-only"),
                       (["--stage", str(stage), "--prune-only", "--unpack"], "--unpack: not with --prune-only"),
                       (["--stage", "/var/tmp", "--prune-only"], "writable by its group or others")):
        proc = hpcstack("mount", *where, *bad)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and words in proc.stderr, (bad, proc.stderr)
    proc = hpcstack("mount", *where, "--prune-only", "--dry-run", "--unpack")  # one line per problem
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: --unpack: only with --stage DIR (the node-local directory of the copies)",
        "error: --prune-only: only with --stage DIR (the node-local directory of the copies)",
        "error: --unpack: not with --prune-only (it prunes both kinds of copy and mounts nothing)"], proc.stderr
    assert sorted(p.name for p in stage.iterdir()) == [_copy(st, B).name]  # nothing touched on bad input


@pytest.mark.parametrize("unpack", [False, True], ids=["loop", "bind"])
def test_a_copy_mounted_only_in_another_mount_namespace_is_kept(stack, unpack):
    """A job in a mount namespace of its own (Slurm's ``job_container/tmpfs``, ``unshare -m``)
    mounts a stale build's copy there: this namespace has no such mount, and prune still keeps the
    copy, naming that namespace's process; once the namespace is gone the next prune removes it.
    The holder is ``unshare --mount`` (private propagation) that mounts the copy, says ``ready``
    on its output and waits for its input to close."""
    st, stage = stack, stack["stage"]
    entry = Path(image.stage_unpacked(str(st["builds"][A]), str(stage)) if unpack
                 else image.stage_image(str(st["builds"][A]), str(stage)))
    assert entry == (_tree(st, A) if unpack else _copy(st, A))
    point = st["root"] / "job-view"
    point.mkdir()
    mount = (f"mount --bind {entry} {point}" if unpack
             else f"mount -t squashfs -o ro,loop {entry} {point}")
    job = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                            f"{mount} && echo ready && {{ read -r _ || true; }}"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert job.stdout.readline() == "ready\n", job.wait()
        assert _mount_of(point) is None and list(point.iterdir()) == []  # not in this namespace

        report = staged.prune(st["layout"], str(stage))

        why = _by_path(report.kept).get(str(entry), "")
        assert f"{point} (mount namespace of pid {job.pid})" in why, report
        assert why.startswith("bound at " if unpack else "mounted at "), why
        assert report.removed == [] and report.failed == [] and entry.exists()
    finally:
        job.stdin.close()
        assert job.wait(timeout=60) == 0
    # the namespace is gone with its last process; a loop device is detached once its last
    # mount is released (autoclear), which the kernel may finish just after the process exits
    st_entry = entry.stat()
    deadline = time.monotonic() + 30
    fs = (os.major(st_entry.st_dev), os.minor(st_entry.st_dev))
    while not unpack and any(b == str(entry) or (dev, ino) == (fs, st_entry.st_ino)
                             for _, b, dev, ino in staged.loop_backings()):
        assert time.monotonic() < deadline, f"{entry} still backs a loop device"
        time.sleep(0.05)
    report = staged.prune(st["layout"], str(stage))
    assert [p.path for p in report.removed] == [str(entry)] and not entry.exists(), report


def _immutable(paths: list[Path], stage: Path) -> str:
    """Make ``paths`` impossible to remove: ``chattr +i`` where the file system supports it, else
    a read-only bind mount of ``stage`` on itself. Returns how (``"chattr"`` or ``"ro-bind"``)."""
    done = []
    for p in paths:
        if subprocess.run(["chattr", "+i", str(p)], capture_output=True).returncode != 0:
            for q in done:
                subprocess.run(["chattr", "-i", str(q)], check=True)
            subprocess.run(["mount", "--bind", str(stage), str(stage)], check=True)
            subprocess.run(["mount", "-o", "remount,bind,ro", str(stage)], check=True)
            return "ro-bind"
        done.append(p)
    return "chattr"


def _removable(paths: list[Path], stage: Path, how: str) -> None:
    """Undo :func:`_immutable`."""
    if how == "chattr":
        for p in paths:
            subprocess.run(["chattr", "-i", str(p)], check=True)
    else:
        subprocess.run(["umount", str(stage)], check=True)


def test_prune_only_exits_1_with_one_line_per_copy_it_cannot_remove(stack):
    """Two stale copies that cannot be removed (immutable, or on a read-only mount): ``--prune-only``
    keeps going, prints the copy it keeps, one ``error: cannot remove COPY: …`` line per copy
    on its standard error, and exits 1; once they can be removed, the same command removes both and
    exits 0."""
    if not shutil.which("chattr"):
        pytest.skip("chattr missing (apt-get install e2fsprogs)")
    st, stage = stack, stack["stage"]
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site["layout"] = "squashfs"
    (st["root"] / "sq.yaml").write_text(yaml.safe_dump(site))
    where = ["tiny/1.0", "--site", str(st["root"] / "sq.yaml"), "--prefix", str(st["sw"]),
             "--stage", str(stage), "--prune-only"]
    image.stage_image(str(st["builds"][B]), str(stage))        # published: kept
    stale_image = Path(image.stage_image(str(st["builds"][A]), str(stage)))
    stale_tree = Path(image.stage_unpacked(str(st["builds"][C]), str(stage)))
    shutil.rmtree(st["builds"][A])
    locked = [stale_image, stale_tree, Path(f"{stale_tree}.done")]
    how = _immutable(locked, stage)
    try:
        proc = hpcstack("mount", *where)
        assert proc.returncode == 1, (how, proc)
        errors = proc.stderr.splitlines()
        assert sorted(line.split(": ", 2)[1] for line in errors) == sorted(
            [f"cannot remove {stale_image}", f"cannot remove {stale_tree}"]), (how, proc.stderr)
        assert all(line.startswith("error: cannot remove ") for line in errors), proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"kept {_copy(st, B)} (") and lines[0].endswith(
            f"): the copy of the published build {st['builds'][B]}"), proc.stdout
        assert stale_image.exists() and stale_tree.is_dir()
    finally:
        _removable(locked, stage, how)
    proc = hpcstack("mount", *where)
    assert proc.returncode == 0 and proc.stderr == "", proc
    assert not stale_image.exists() and not stale_tree.exists() and not Path(f"{stale_tree}.done").exists()
    assert sorted(p.name for p in stage.iterdir()) == [_copy(st, B).name]


# ------------------------------------------------------------------------------ the venv by descriptor

@pytest.mark.parametrize("how", ["squashfuse", "stage", "unpack"])
def test_a_link_at_the_venv_is_refused_and_nothing_is_mounted_where_it_points(build, how):
    """A stack-group member swaps ``<build>/venv`` for a link to a directory of root's (``/etc``
    in the finding; a stand-in here): ``hpcstack mount`` refuses in one line and mounts nothing
    anywhere. Positive control: the mount by name (``squashfuse IMAGE <build>/venv``, as the
    code before the fix ran it) covers the link's target."""
    if how == "squashfuse" and not shutil.which("squashfuse"):
        pytest.skip("squashfuse missing")
    b, stage = build["build"], build["stage"]
    etc = build["root"] / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root's\n")
    (b / "venv").rmdir()
    (b / "venv").symlink_to(etc)
    if how == "squashfuse":           # the positive control
        subprocess.run(image.mount_argv(str(b)), check=True, capture_output=True)
        try:
            assert _mount_of(etc) is not None and not (etc / "passwd").exists()
        finally:
            subprocess.run(["umount", "-l", str(etc)], check=True)
    stage_arg = None if how == "squashfuse" else str(stage)
    with pytest.raises(ConfigError) as info:
        image.mount_build(str(b), stage=stage_arg, unpack=how == "unpack")
    line = str(info.value)
    assert "\n" not in line and f"{b}/venv: a symbolic link" in line, line
    assert _mount_of(etc) is None and (etc / "passwd").read_text() == "root's\n"
    # a file at the name: refused as well
    (b / "venv").unlink()
    (b / "venv").write_text("")
    with pytest.raises(ConfigError, match="venv: not a directory"):
        image.mount_build(str(b), stage=stage_arg, unpack=how == "unpack")


def test_the_venv_is_mounted_on_the_directory_held_not_the_name(build):
    """``mount`` gets ``/proc/self/fd/N`` of the venv's descriptor (``--no-canonicalize``): the
    venv made where missing, the kernel's mount lands exactly at ``<build>/venv``."""
    b, stage = build["build"], build["stage"]
    (b / "venv").rmdir()
    assert image.mount_build(str(b), stage=str(stage)) is True
    assert _mount_of(b / "venv")[0] == "squashfs" and (b / "venv" / "pyvenv.cfg").exists()
    assert image.mount_build(str(b), stage=str(stage)) is False


def test_squashfuse_mounts_the_image_by_descriptor_at_the_venv(build):
    """Without ``--stage``: squashfuse reads the image from ``/proc/self/fd/N`` of the gate's
    descriptor and the mount sits at exactly ``<build>/venv`` (checked in mountinfo after)."""
    if not shutil.which("squashfuse") or not os.path.exists("/dev/fuse"):
        pytest.skip("squashfuse or /dev/fuse missing")
    b = build["build"]
    assert image.mount_build(str(b)) is True
    assert _mount_of(b / "venv")[0] == "fuse.squashfuse"
    assert (b / "venv" / "pyvenv.cfg").read_text() == "home = /usr/bin\n"
    assert image.mount_build(str(b)) is False
    image.unmount(str(b / "venv"))
    assert _mount_of(b / "venv") is None


@pytest.mark.parametrize("kind", ["fifo", "device link"])
def test_an_image_that_is_a_fifo_or_a_device_is_refused_without_blocking(build, kind):
    """A FIFO at ``venv.sqsh`` used to hang the prolog (``open`` blocks), a link to /dev/zero
    filled the stage directory: both refused in one line, at once, nothing staged."""
    b, stage = build["build"], build["stage"]
    img = b / image.IMAGE_NAME
    img.unlink()
    if kind == "fifo":
        os.mkfifo(img)
    else:
        img.symlink_to("/dev/zero")
    for call in (lambda: image.stage_image(str(b), str(stage)), lambda: image.stage_unpacked(str(b), str(stage)),
                 lambda: image.mount_build(str(b), stage=str(stage))):
        with pytest.raises(HpcstackError) as info:
            call()
        assert "\n" not in str(info.value) and str(img) in str(info.value), str(info.value)
        assert ("not a regular file" if kind == "fifo" else "a symbolic link") in str(info.value)
    assert list(stage.iterdir()) == []


def test_a_published_link_out_of_the_install_root_is_not_mounted(tmp_path):
    """The prefix of a stack is a link to anything but one of its builds (``/etc``, another
    stack's build): nothing is published there, ``mount`` says so in one line."""
    from hpcstack.install.layout import StackLayout

    layout = StackLayout(str(tmp_path), "tiny", "1.0")
    os.makedirs(layout.top)
    os.symlink("/etc", layout.prefix)
    assert layout.published() is None and layout.foreign_link() == "/etc"
    with pytest.raises(ConfigError, match=r"tiny/1.0: a link to /etc, not a build of tiny/1.0"):
        image.mount_stack(layout)
    os.unlink(layout.prefix)
    os.makedirs(os.path.join(layout.top, ".1.0-0123456789ab"))
    os.symlink(".1.0-0123456789ab", layout.prefix)
    assert layout.published() == os.path.join(layout.top, ".1.0-0123456789ab") and layout.foreign_link() is None
