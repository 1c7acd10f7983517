"""``hpcstack mount --stage DIR`` (:func:`hpcstack.install.image.mount_build` with ``stage``):
the image copied into a root-owned node-local directory and the copy mounted by the kernel's
squashfs on a loop device; unsafe stage directories refused with one line before anything is
copied; a failed copy or mount leaves no copy behind. The real ``mksquashfs``, ``mount`` (loop
device), tmpfs; a few seconds. The CLI option through a real install: tests/test_squashfs.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpcstack.errors import ConfigError
from hpcstack.install import image

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


@pytest.fixture
def build():
    """A build directory under /var/tmp with a packed ``venv.sqsh`` (``pyvenv.cfg`` and 256 KiB
    of incompressible data) and an empty ``venv/``; a root-owned 0700 stage directory beside it.
    Everything mounted under it is unmounted afterwards."""
    reason = _loop_missing()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="mount-stage-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    src = root / "src"
    src.mkdir()
    (src / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (src / "blob").write_bytes(os.urandom(256 << 10))
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


# ----------------------------------------------------------------------------- pruning (prune_stage)

def _sibling(build: Path, name: str) -> Path:
    """Another build directory beside ``build`` (another build of the same stack, when ``name``
    is in the same directory) with a copy of its image and an empty venv/."""
    other = build.parent / name
    (other / "venv").mkdir(parents=True)
    shutil.copy2(build / image.IMAGE_NAME, other / image.IMAGE_NAME)
    return other


def _names(stage: Path) -> list[str]:
    return sorted(p.name for p in stage.iterdir())


@pytest.mark.parametrize("unpack", [False, True], ids=["copy", "unpacked"])
def test_staging_a_new_build_removes_the_replaced_builds_copy_unless_mounted(build, unpack):
    if unpack and not shutil.which("unsquashfs"):
        pytest.skip("unsquashfs missing (apt-get install squashfs-tools)")
    old, stage = build["build"], build["stage"]
    new = _sibling(old, ".1.0-def")
    assert image.mount_build(str(old), stage=str(stage), unpack=unpack) is True
    old_stem = Path(image.staged_image_of(str(old), str(stage))).stem
    # mounted: a job may still run on it, so it stays
    report = image.prune_stage(str(stage), str(new))
    assert report and not any(e.removed for e in report), report
    assert all(e.why == f"mounted at {old / 'venv'}" for e in report), report
    image.unmount(str(old / "venv"))
    report = image.prune_stage(str(stage), str(new))
    assert [e.why for e in report] == [f"its build {old} is no longer published"] * len(report), report
    assert all(e.removed and e.bytes > 0 for e in report if not e.path.endswith(".done")), report
    assert not any(n.startswith(old_stem) for n in _names(stage)), _names(stage)
    assert image.mount_build(str(new), stage=str(stage), unpack=unpack) is True
    assert all(n.startswith(Path(image.staged_image_of(str(new), str(stage))).stem) for n in _names(stage))


def test_pruning_keeps_the_published_copy_other_stacks_and_foreign_files(build):
    b, stage, root = build["build"], build["stage"], build["root"]
    other = root / "other-stack" / ".2.0-xyz"
    (other / "venv").mkdir(parents=True)
    shutil.copy2(b / image.IMAGE_NAME, other / image.IMAGE_NAME)
    for x in (b, other):
        assert image.mount_build(str(x), stage=str(stage)) is True
        image.unmount(str(x / "venv"))
    (stage / "notes.txt").write_text("the admin's\n")
    (stage / "x-0123456789ab.sqsh.bak").write_text("not ours\n")
    before = _names(stage)
    report = image.prune_stage(str(stage), str(b))
    assert not any(e.removed for e in report), report
    assert sorted(e.why for e in report) == sorted(["the published build's copy",
                                                    f"the copy of {other}, another stack's build"])
    assert _names(stage) == before


def test_pruning_removes_copies_of_removed_builds_interrupted_stagings_and_unnamed_copies(build):
    b, stage = build["build"], build["stage"]
    gone = _sibling(b, ".0.9-old")
    assert image.mount_build(str(gone), stage=str(stage)) is True
    image.unmount(str(gone / "venv"))
    (gone / image.IMAGE_NAME).unlink()  # what removing a build does (image.release)
    (stage / "1.0-zzz-0123456789ab.sqsh.tmp").write_bytes(b"partial")
    (stage / "1.0-yyy-ba9876543210.sqsh").write_bytes(b"no record")
    link_target = build["root"] / "precious"
    link_target.write_text("keep me\n")
    (stage / "1.0-www-aaaaaaaaaaaa.sqsh").symlink_to(link_target)
    report = {Path(e.path).name: e for e in image.prune_stage(str(stage), str(b))}
    gone_copy = Path(image.staged_image_of(str(gone), str(stage))).name
    assert report[gone_copy].removed and report[gone_copy].why == f"its build {gone} is gone"
    assert report["1.0-zzz-0123456789ab.sqsh.tmp"].removed
    assert report["1.0-zzz-0123456789ab.sqsh.tmp"].why == "left by an interrupted staging"
    assert report["1.0-yyy-ba9876543210.sqsh"].why == "it names no build"
    assert report["1.0-www-aaaaaaaaaaaa.sqsh"].removed  # the link itself, never what it points at
    assert _names(stage) == []
    assert link_target.read_text() == "keep me\n"


def test_dry_run_removes_nothing_and_an_unsafe_directory_is_refused(build):
    b, stage, root = build["build"], build["stage"], build["root"]
    (stage / "1.0-zzz-0123456789ab.sqsh.tmp").write_bytes(b"partial")
    report = image.prune_stage(str(stage), str(b), dry_run=True)
    assert [e.removed for e in report] == [True] and _names(stage) == ["1.0-zzz-0123456789ab.sqsh.tmp"]
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(ConfigError) as err:
        image.prune_stage(str(shared), str(b))
    assert str(err.value).count("\n") == 0 and "writable by" in str(err.value)
