"""One stack, three deliveries, proven equal: the small ``mpi4py/4.1.2`` recipe for the localhost
site installed as modules, built as a container image from its ``hpcstack export --format docker``
(buildah, vfs storage, chroot isolation, from the minbase Debian 12 root filesystem that
scripts/fresh-machine and scripts/container-image share) and installed offline (in a network
namespace with loopback alone) from its ``hpcstack bundle`` into another prefix.

``hpcstack compare`` finds module and image, and module and bundle install, the same stack
(distributions, versions, the sha256 of every file against each side's SBOM and across; exit 0),
and so does the bundle directory itself;
a file altered afterwards is named (exit 1); ``hpcstack validate --local`` passes in all three
(inside the image with ``buildah run``).

Marked integration; slow: the image (apt inside, hpcstack's wheel, the mpi4py build) takes
minutes on 2 cores: the figures are in docs/lifecycle.md, "One stack, three deliveries". The
image's cache is a hard-linked copy of the machine's (``/var/cache/hpcstack``), as
scripts/container-image does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO, hpcstack

pytestmark = pytest.mark.integration

RECIPE = "mpi4py/4.1.2"
IMAGE = "localhost/hpcstack-mpi4py:4.1.2"
ROOT = Path(os.environ.get("HPCSTACK_DELIVERIES_ROOT", "/var/tmp/hpcstack-deliveries"))
FRESH_ROOT = Path(os.environ.get("HPCSTACK_FRESH_ROOT", "/var/tmp/hpcstack-fresh"))
STORAGE = ["--storage-driver", "vfs", "--storage-root", str(ROOT / "storage")]
BUILDAH = ["buildah", "--storage-driver", "vfs", "--root", str(ROOT / "storage"), "--runroot", "/run/hpcstack-deliveries"]


def run(cmd: list[str], timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          cwd="/tmp", **kwargs)


def timed(what: str, times: dict, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = run(cmd, **kwargs)
    times[what] = time.monotonic() - start
    assert proc.returncode == 0, f"{what}: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def build_image(tmp: Path, times: dict) -> None:
    """The build context (root filesystem tar, hpcstack's wheel, the exported Dockerfile), the
    cache, then ``buildah bud`` as scripts/container-image runs it."""
    ctx = tmp / "context"
    ctx.mkdir()
    FRESH_ROOT.mkdir(parents=True, exist_ok=True)
    common = REPO / "scripts" / "buildah-common.sh"
    rootfs = timed("root filesystem", times, ["bash", "-c", f'set -e; source "{common}"; exec 9>"$1/lock"; flock 9; '
                   'hpcstack_rootfs "$1" >&2; ln "$ROOTFS" "$2/rootfs.tar" 2>/dev/null || cp "$ROOTFS" "$2/rootfs.tar"',
                   "rootfs", str(FRESH_ROOT), str(ctx)])
    assert (ctx / "rootfs.tar").is_file(), rootfs.stderr
    uv = Path(sys.executable).with_name("uv")
    timed("context", times, [str(uv), "build", "--quiet", "--no-config", "--wheel", "--out-dir", str(ctx), str(REPO)])
    timed("export", times, [*HPCSTACK, "export", RECIPE, "--site", "localhost", "--format", "docker",
                            "-o", str(ctx / "Dockerfile")])
    # the machine's cache and the module install's (its mpi4py wheel, when the image's build key
    # is the same: the same Debian 12 compilers, MPI and Python)
    timed("cache", times, ["bash", "-c", f'source "{common}"; hpcstack_link_cache /var/cache/hpcstack "$1"; '
                           'hpcstack_link_cache "$2" "$1"', "cache", str(ROOT / "cache"),
                           str(tmp / "sw" / ".hpcstack" / "cache")])
    cas = (["--volume", "/usr/local/share/ca-certificates:/usr/local/share/ca-certificates:ro"]
           if Path("/usr/local/share/ca-certificates").is_dir() else [])
    timed("buildah bud", times, [*BUILDAH, "bud", "--quiet", "--isolation", "chroot",
                                 "--volume", f"{ROOT / 'cache'}:/var/cache/hpcstack", *cas, "-t", IMAGE, str(ctx)],
          timeout=3600)


@pytest.fixture(scope="module")
def deliveries(localhost_ready):
    """The three deliveries: (module prefix, bundle-installed prefix, image, install args, times)."""
    if os.geteuid() != 0:
        pytest.skip("needs root (buildah's chroot isolation, unshare -n)")
    missing = [t for t in ("buildah", "mmdebstrap", "unshare") if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: scripts/localhost-setup --with-test-tools installs them")
    ROOT.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="run-", dir=ROOT))
    tmp.chmod(0o755)
    times: dict[str, float] = {}
    args = ["--site", "localhost", "--prefix", str(tmp / "sw"), "--module-root", str(tmp / "mf")]
    offline_args = ["--site", "localhost", "--prefix", str(tmp / "sw-offline"), "--module-root", str(tmp / "mf-offline")]
    try:
        timed("install (modules)", times, [*HPCSTACK, "install", RECIPE, *args])
        timed("bundle", times, [*HPCSTACK, "bundle", RECIPE, "--site", "localhost", "-o", str(tmp / "bundle")])
        # no network but loopback, which Open MPI's singleton MPI_Init (the sanity check) needs up
        timed("install --from bundle (offline)", times,
              ["unshare", "-n", "--", "bash", "-c", 'ip link set lo up && exec "$@"', "offline",
               *HPCSTACK, "install", RECIPE, *offline_args, "--from", str(tmp / "bundle")])
        build_image(tmp, times)
        yield tmp / "sw" / RECIPE, tmp / "sw-offline" / RECIPE, args, offline_args, times
    finally:
        print("\n".join(f"::: {k}: {v:.0f} s" for k, v in times.items()))
        run([*BUILDAH, "rmi", "-f", IMAGE])
        shutil.rmtree(tmp, ignore_errors=True)


def test_module_and_image_are_the_same_stack(deliveries):
    module, _, _, _, times = deliveries
    start = time.monotonic()
    proc = hpcstack("compare", str(module), f"image:{IMAGE}", *STORAGE)
    times["compare module image"] = time.monotonic() - start
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the same stack" in proc.stderr and " files hashed)" in proc.stderr
    assert "lists no files" not in proc.stderr
    # the container compare made is gone
    containers = run([*BUILDAH, "containers", "--format", "{{.ContainerName}}"])
    assert not [c for c in containers.stdout.split() if c.startswith("hpcstack-compare-")], containers.stdout


def test_module_and_offline_bundle_install_are_the_same_stack(deliveries):
    module, offline, _, _, _ = deliveries
    proc = hpcstack("compare", str(module), str(offline))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the same stack" in proc.stderr
    # and the bundle itself: its wheels' RECORDs hold the module's files
    proc = hpcstack("compare", str(module), str(offline.parents[2] / "bundle"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_validate_local_passes_in_all_three(deliveries):
    _, _, args, offline_args, times = deliveries
    for what, cmd in (("modules", [*HPCSTACK, "validate", RECIPE, *args, "--local"]),
                      ("offline", [*HPCSTACK, "validate", RECIPE, *offline_args, "--local"])):
        proc = timed(f"validate --local ({what})", times, cmd, timeout=900)
        assert "PASS" in proc.stdout, proc.stdout[-3000:]
    ctr = run([*BUILDAH, "from", "--quiet", IMAGE]).stdout.strip()
    assert ctr
    try:
        entry = run([*BUILDAH, "inspect", "--type", "image", IMAGE])
        argv = json.loads(entry.stdout)["OCIv1"]["config"]["Entrypoint"]
        assert argv[:2] == ["hpcstack", "validate"] and argv[-1] == "--local", argv
        proc = timed("validate --local (image)", times, [*BUILDAH, "run", "--isolation", "chroot", ctr, "--", *argv],
                     timeout=900)
        assert "PASS" in proc.stdout, proc.stdout[-3000:]
    finally:
        run([*BUILDAH, "rm", ctr])


def test_an_altered_file_is_reported(deliveries):
    module, offline, _, _, _ = deliveries
    victim = next(offline.glob("venv/lib/python3*/site-packages/setuptools/version.py"))
    original = victim.read_bytes()
    victim.write_bytes(original + b"# altered\n")
    try:
        proc = hpcstack("compare", str(module), str(offline))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "setuptools/version.py (content)" in proc.stdout
        assert f"{offline}: files of setuptools " in proc.stdout and "differ from its SBOM" in proc.stdout
        proc = hpcstack("compare", str(offline), f"image:{IMAGE}", *STORAGE)
        assert proc.returncode == 1 and "setuptools/version.py (content)" in proc.stdout, proc.stdout + proc.stderr
    finally:
        victim.write_bytes(original)
