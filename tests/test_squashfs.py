"""``layout: squashfs``: the tiny recipe installed with its venv packed into a
squashfs image and mounted at its path with squashfuse, through the real ``hpcstack``, the real
FUSE mount, Environment Modules (and Lmod for the Lua modulefile) and ``strace``.

In order: install (the image exists, the venv is its mount point), the module loads and the
package imports from the image (its metadata calls land on the image), the dry run shows the
pack and mount commands, a re-install is a no-op, unmounted the module refuses to load with one
line naming ``hpcstack mount``, which mounts it again (and again: exit 0), a new build replaces
the published one and the oldest build is unmounted and removed, ``--force`` over a packed build
in progress starts it afresh, uninstall leaves no mount and no image. About 55 s on 2 loaded
cores (five tiny builds, each packed and mounted).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, bash_modules, hpcstack, make_sdist, write_tiny_recipe
from moduletools import LMOD, _missing_cached

pytestmark = pytest.mark.integration


def _fuse_missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse missing (FUSE is not available here)"
    for tool in ("mksquashfs", "squashfuse", "fusermount3", "mountpoint", "strace"):
        if not shutil.which(tool):
            return f"{tool} missing (scripts/localhost-setup --with-test-tools installs squashfs-tools squashfuse fuse3 strace)"
    if os.geteuid() != 0 and "user_allow_other" not in Path("/etc/fuse.conf").read_text(errors="replace"):
        return "not root and no user_allow_other in /etc/fuse.conf (the image is mounted allow_other)"
    return None


def _mounts(under: Path) -> list[tuple[str, str, str]]:
    """``(mount point, fs type, source)`` of the mounts under ``under`` (/proc/self/mountinfo)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        point = fields[4].encode().decode("unicode_escape")
        if point.startswith(str(under) + "/"):
            out.append((point, fields[sep + 1], fields[sep + 2]))
    return out


@pytest.fixture(scope="module")
def sq(localhost_ready):
    """The tiny recipe installed for a copy of the localhost site with ``layout: squashfs``, in
    an install root of its own under /var/tmp (not tmpfs: FUSE over it is what a site has)."""
    reason = _fuse_missing()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="squashfs-test-", dir="/var/tmp"))
    os.chmod(root, 0o755)
    sdist = make_sdist(root)
    recipe = write_tiny_recipe(root / "recipes", sdist)
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site["layout"] = "squashfs"
    site["squashfs"] = {"compression": "lz4", "processors": 1}
    (root / "sq.yaml").write_text(yaml.safe_dump(site))
    where = ["--site", str(root / "sq.yaml"), "--prefix", str(root / "sw")]
    args = [*where, "--module-root", str(root / "mf")]
    first = hpcstack("install", str(recipe), *args)
    try:
        assert first.returncode == 0, first.stderr
        yield {"root": root, "recipe": recipe, "args": args, "where": where, "first": first,
               "prefix": root / "sw" / "tiny" / "1.0", "mf": root / "mf"}
    finally:
        hpcstack("uninstall", "tiny/1.0", *args, "--force")
        for point, _, _ in _mounts(root):
            subprocess.run(["fusermount3", "-u", "-z", point], check=False)
        shutil.rmtree(root, ignore_errors=True)


def _build(sq) -> Path:
    return Path(os.path.realpath(sq["prefix"]))


def test_install_packs_the_venv_and_mounts_the_image_at_its_path(sq):
    stderr = sq["first"].stderr
    assert re.search(r"\] permissions:.*\n(.*\n)*.*\] image:.*\n(.*\n)*.*\] module:", stderr), stderr
    build = _build(sq)
    image = build / "venv.sqsh"
    assert image.is_file() and image.read_bytes()[:4] == b"hsqs"  # squashfs magic
    assert (build / "venv", "fuse.squashfuse") in [(Path(p), t) for p, t, _ in _mounts(sq["root"])]
    assert (build / "venv" / "pyvenv.cfg").is_file()
    assert not (build / ".venv.packed").exists()
    # what later runs write (records, logs) stays a real directory beside the image
    assert (build / ".hpcstack" / "steps" / "image.json").is_file()
    with pytest.raises(OSError):  # read-only
        (build / "venv" / "new-file").write_text("x")


def test_module_loads_and_the_import_reads_from_the_image(sq):
    build = _build(sq)
    trace = sq["root"] / "strace.txt"
    proc = bash_modules(f"""
    module use {sq['mf']}
    module load tiny/1.0 || exit 1
    python -c 'import tinypkg, six; assert tinypkg.PATCHED; print(tinypkg.__file__)'
    strace -f -qq -e trace=openat,newfstatat,stat,lstat,statx,readlink -o {trace} python -c 'import tinypkg, six'
    """)
    assert proc.returncode == 0, proc.stderr
    module_file = Path(proc.stdout.split()[0])
    venv = build / "venv"
    assert os.stat(module_file).st_dev == os.stat(venv).st_dev != os.stat(build).st_dev
    # the metadata calls of the import that name the stack's venv land on the image's file system
    calls = [re.search(r'"([^"]+)"', line).group(1) for line in trace.read_text().splitlines()
             if re.search(r'"([^"]+)"', line)]
    in_venv = [p for p in calls if p.startswith(str(sq["prefix"] / "venv") + "/") or p.startswith(str(venv) + "/")]
    assert len(in_venv) >= 10, calls[:50]
    devices = {os.lstat(p).st_dev for p in in_venv if os.path.lexists(p)}  # the lookup itself, links too
    assert devices == {os.stat(venv).st_dev}


def test_dry_run_prints_the_pack_and_mount_commands(sq):
    proc = hpcstack("install", str(sq["recipe"]), *sq["args"], "--dry-run", "--force")
    assert proc.returncode == 0, proc.stderr
    assert "# --- step image:" in proc.stdout
    assert re.search(r"mksquashfs \S+/venv \S+/venv\.sqsh\.tmp -noappend -comp lz4 -processors 1", proc.stdout)
    assert "squashfuse -o ro,allow_other,default_permissions" in proc.stdout
    subprocess.run(["bash", "-n"], input=proc.stdout, text=True, check=True)


def test_reinstall_up_to_date_is_a_noop(sq):
    mf = sq["mf"] / "tiny" / "1.0"
    before = (mf.stat().st_mtime_ns, os.path.realpath(sq["prefix"]))
    proc = hpcstack("install", str(sq["recipe"]), *sq["args"])
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stderr
    assert (mf.stat().st_mtime_ns, os.path.realpath(sq["prefix"])) == before


def test_unmounted_the_module_refuses_to_load_and_hpcstack_mount_mounts_it(sq):
    venv = _build(sq) / "venv"
    subprocess.run(["fusermount3", "-u", str(venv)], check=True)
    assert not os.path.ismount(venv)
    load = f"module use {sq['mf']}\nmodule load tiny/1.0\n"
    proc = bash_modules(load + "echo rc=$?\nmodule display tiny/1.0 >/dev/null 2>&1 && echo display-ok")
    assert "rc=1" in proc.stdout, proc.stdout + proc.stderr
    assert "display-ok" in proc.stdout  # only a load checks
    said = " ".join(proc.stderr.split())  # the tool wraps long lines
    assert "is not mounted on this node" in said and f"hpcstack mount {sq['recipe']} --site" in said, said
    assert "while executing" not in proc.stderr  # one message, no Tcl trace
    lmod_missing = _missing_cached(LMOD)
    if not lmod_missing:  # the Lua modulefile of a squashfs site, under Lmod
        from hpcstack.install.components.modulefile import render_for_prefix
        from hpcstack.recipe import load_recipe
        from hpcstack.site import load_site

        site = load_site(str(sq["root"] / "sq.yaml"), install_root=str(sq["root"] / "sw"))
        text = render_for_prefix(site, load_recipe(str(sq["recipe"]), site), str(sq["prefix"]), "3.11", "lua")
        lua = sq["root"] / "mf-lua" / "tiny" / "1.0.lua"
        lua.parent.mkdir(parents=True)
        lua.write_text(text.replace('depends_on("python")\n', ""))
        proc = LMOD.bash(f"module use {lua.parent.parent}\nmodule load tiny/1.0; echo rc=$?\n"
                         "module show tiny/1.0 >/dev/null 2>&1 && echo show-ok", modulepath="")
        assert "rc=1" in proc.stdout and "show-ok" in proc.stdout, proc.stdout + proc.stderr
        assert "is not mounted on this node" in " ".join(proc.stderr.split())

    proc = hpcstack("mount", "tiny/1.0", *sq["where"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("mounted: ") and os.path.ismount(venv)
    again = hpcstack("mount", "tiny/1.0", *sq["where"])
    assert again.returncode == 0 and again.stdout.startswith("already mounted: "), again.stdout + again.stderr
    proc = bash_modules(load + "python -c 'import tinypkg'")
    assert proc.returncode == 0, proc.stderr
    unit = hpcstack("mount", "tiny/1.0", *sq["where"], "--print-unit")
    assert unit.returncode == 0 and f"{_build(sq)}/venv.sqsh {venv} fuse.squashfuse" in unit.stdout
    if lmod_missing:  # the Environment Modules half passed; the Lmod half is said, not passed over
        pytest.skip(f"the Lmod half did not run: {lmod_missing}")


def test_mount_stage_copies_the_image_to_the_node_and_the_kernel_mounts_it(sq):
    if "squashfs" not in Path("/proc/filesystems").read_text() or not shutil.which("losetup"):
        pytest.skip("the kernel has no squashfs or losetup is missing (hpcstack mount --stage mounts a loop device)")
    from hpcstack.install import image

    venv = _build(sq) / "venv"
    stage = sq["root"] / "stage"
    stage.mkdir(mode=0o700, exist_ok=True)
    bad = hpcstack("mount", "tiny/1.0", *sq["where"], "--stage", "/var/tmp")  # sticky, world-writable
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "writable by its group or others" in bad.stderr
    bad = hpcstack("mount", "tiny/1.0", *sq["where"], "--unpack")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "only with --stage" in bad.stderr
    image.unmount(str(venv))
    try:
        proc = hpcstack("mount", "tiny/1.0", *sq["where"], "--stage", str(stage), "--unpack")
        assert proc.returncode == 0, proc.stderr
        tree = image.staged_image_of(str(_build(sq)), str(stage))[: -len(".sqsh")] + ".d"
        assert proc.stdout.startswith(f"mounted: {tree} at {venv} (staged from "), proc.stdout
        proc = bash_modules(f"module use {sq['mf']}\nmodule load tiny/1.0\npython -c 'import tinypkg'")
        assert proc.returncode == 0, proc.stderr
        image.unmount(str(venv))
        proc = hpcstack("mount", "tiny/1.0", *sq["where"], "--stage", str(stage))
        assert proc.returncode == 0, proc.stderr
        copy = image.staged_image_of(str(_build(sq)), str(stage))
        assert proc.stdout.startswith(f"mounted: {copy} at {venv} (staged from {_build(sq)}/venv.sqsh)"), proc.stdout
        point = [(t, s) for p, t, s in _mounts(sq["root"]) if p == str(venv)]
        assert len(point) == 1 and point[0][0] == "squashfs" and point[0][1].startswith("/dev/loop"), point
        again = hpcstack("mount", "tiny/1.0", *sq["where"], "--stage", str(stage))
        assert again.returncode == 0 and again.stdout.startswith("already mounted: "), again.stdout + again.stderr
        proc = bash_modules(f"module use {sq['mf']}\nmodule load tiny/1.0\npython -c 'import tinypkg'")
        assert proc.returncode == 0, proc.stderr
        unit = hpcstack("mount", "tiny/1.0", *sq["where"], "--print-unit")
        assert "--stage /dev/shm/hpcstack --unpack --quiet" in unit.stdout
    finally:  # back to the FUSE mount the later tests expect
        image.unmount(str(venv))
        assert hpcstack("mount", "tiny/1.0", *sq["where"]).returncode == 0


def test_mount_refuses_with_one_line(sq, tmp_path):
    proc = hpcstack("mount", "nothere/1.0", *sq["where"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "not installed" in proc.stderr
    plain = yaml.safe_load((sq["root"] / "sq.yaml").read_text())
    plain["layout"] = "directory"
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(plain))
    proc = hpcstack("mount", "tiny/1.0", "--site", str(tmp_path / "plain.yaml"), "--prefix", str(sq["root"] / "sw"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "layout: directory" in proc.stderr
    plain["layout"] = "squash"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(plain))
    proc = hpcstack("install", str(sq["recipe"]), "--site", str(tmp_path / "bad.yaml"), "--dry-run")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "layout: 'squash' is not one of" in proc.stderr


def test_new_builds_replace_it_and_the_oldest_is_unmounted_and_removed(sq):
    first = _build(sq)
    proc = hpcstack("install", str(sq["recipe"]), *sq["args"], "--force")
    assert proc.returncode == 0, proc.stderr
    second = _build(sq)
    assert second != first and os.path.ismount(second / "venv")
    assert os.path.ismount(first / "venv")  # the replaced build is kept for running jobs
    proc = hpcstack("install", str(sq["recipe"]), *sq["args"], "--force")
    assert proc.returncode == 0, proc.stderr
    assert first.name in proc.stdout  # "removed earlier builds: <first>"
    assert not first.exists()
    points = {p for p, _, _ in _mounts(sq["root"])}
    assert points == {str(second / "venv"), str(_build(sq) / "venv")}


def test_force_over_a_packed_build_in_progress_starts_it_afresh(sq):
    published = _build(sq)
    proc = hpcstack("install", str(sq["recipe"]), *sq["args"], "--force", "--stop-after", "image")
    assert proc.returncode == 0, proc.stderr
    state = yaml.safe_load((sq["root"] / "sw" / ".hpcstack" / "state" / "tiny-1.0.json").read_text())
    packed = published.parent / f".1.0-{state['building']}"  # beside the prefix
    assert os.path.ismount(packed / "venv") and _build(sq) == published  # packed, not published
    proc = hpcstack("install", str(sq["recipe"]), *sq["args"], "--force")  # the venv step again
    assert proc.returncode == 0, proc.stderr
    assert _build(sq) == packed and os.path.ismount(packed / "venv")


def test_back_to_layout_directory_builds_anew_and_leaves_the_image_build_as_previous(sq):
    packed = _build(sq)
    plain = yaml.safe_load((sq["root"] / "sq.yaml").read_text())
    plain["layout"] = "directory"
    (sq["root"] / "plain.yaml").write_text(yaml.safe_dump(plain))
    args = [a if a != str(sq["root"] / "sq.yaml") else str(sq["root"] / "plain.yaml") for a in sq["args"]]
    proc = hpcstack("install", str(sq["recipe"]), *args)
    assert proc.returncode == 0, proc.stderr
    assert "new build" in proc.stderr and "] image:" not in proc.stderr
    build = _build(sq)
    assert build != packed and not os.path.ismount(build / "venv") and not (build / "venv.sqsh").exists()
    assert "is not mounted" not in (sq["mf"] / "tiny" / "1.0").read_text()
    assert os.path.ismount(packed / "venv")  # the replaced build is kept, still mounted


def test_uninstall_leaves_no_mount_and_no_image(sq):
    proc = hpcstack("uninstall", "tiny/1.0", *sq["args"], "--force")
    assert proc.returncode == 0, proc.stderr
    assert _mounts(sq["root"]) == []
    assert not list((sq["root"] / "sw").rglob("*.sqsh*"))
    assert not (sq["root"] / "sw" / "tiny").exists()
    again = hpcstack("uninstall", "tiny/1.0", *sq["args"], "--force")
    assert again.returncode != 0 and "not installed" in again.stderr
