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

mpi4py is the one compiled part, and ``compare`` compares it by version only; its extension
modules (``mpi4py/**/*.so``) are compared here byte for byte, knowing where each delivery's
came from (its build log: the build key, and whether the wheel was built or reused): the module
install builds it (a fresh cache); the offline install builds it again from the bundle's sdist
(its own, empty cache) with the same build key (the bundle's package sources are not in the
key); the image reuses the module install's wheel when its build key is the same (the image's
cache holds the module install's builds and no other), else builds it. A delivery's ``.so`` are
the bytes of the wheel it installed; one that reused the module install's wheel has its ``.so``
bytes; one built again has the same code and data (byte-equal once the debug information, which
names the build directory, and the GNU build ID, a hash over it, are removed: ``objcopy``).

Marked integration; slow: the image (apt inside, hpcstack's wheel, the mpi4py build) takes
minutes on 2 cores: the figures are in docs/lifecycle.md, "One stack, three deliveries". The
image's cache is a hard-linked copy of the machine's (``/var/cache/hpcstack``), as
scripts/container-image does, with the source builds of the module install in place of the
machine's.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
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
    # the machine's cache, less its source builds, and the module install's (its mpi4py wheel,
    # reused when the image's build key is the same: the same Debian 12 compilers, MPI and
    # Python). ROOT/cache outlives the run: a build kept there from an earlier run, or one of the
    # machine's, would be another build of the same key (test_mpi4py_binaries_across_deliveries)
    timed("cache", times, ["bash", "-c", f'source "{common}"; hpcstack_link_cache /var/cache/hpcstack "$1"; '
                           'rm -rf "$1/builds"; hpcstack_link_cache "$2" "$1"', "cache", str(ROOT / "cache"),
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
    def module_and_image() -> None:
        timed("install (modules)", times, [*HPCSTACK, "install", RECIPE, *args])
        build_image(tmp, times)     # its cache holds the module install's builds

    def bundle_and_offline() -> None:
        timed("bundle", times, [*HPCSTACK, "bundle", RECIPE, "--site", "localhost", "-o", str(tmp / "bundle")])
        # no network but loopback, which Open MPI's singleton MPI_Init (the sanity check) needs up
        timed("install --from bundle (offline)", times,
              ["unshare", "-n", "--", "bash", "-c", 'ip link set lo up && exec "$@"', "offline",
               *HPCSTACK, "install", RECIPE, *offline_args, "--from", str(tmp / "bundle")])

    try:
        # the two chains share nothing (prefixes, caches, module roots of their own; the bundle
        # is made from the recipe, not from an install): each compiles mpi4py, on a core each
        start = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(module_and_image), pool.submit(bundle_and_offline)]:
                done.result()
        times["the deliveries, two at a time"] = time.monotonic() - start
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


# ------------------------------------------------------------ mpi4py, the one compiled part

#: The lines a source build's log starts with (hpcstack.install.components.source.CachedWheelBuild).
_KEY_LINE = re.compile(r"^# mpi4py build key ([0-9a-f]{24}); its text:$", re.M)
MPI4PY_BUILDS = Path("builds") / "mpi4py-4.1.2"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def mpi4py_build(prefix: Path) -> dict:
    """How the stack at ``prefix`` got its mpi4py wheel, from its build log: ``{"key", "text"
    (the key's text), "how": "built" | "reused", "so": {path under mpi4py/: bytes}}``."""
    log = "\n".join(p.read_text() for p in sorted(prefix.glob(".hpcstack/logs/build.log")))
    found = _KEY_LINE.search(log)
    assert found, f"{prefix}: no mpi4py build key in its build log\n{log[-3000:]}"
    key, rest = found.group(1), log[found.end() + 1:]
    text, _, after = rest.partition("\nmpi4py: ")
    reused = after.startswith("reusing the wheel built before (")
    built = after.startswith(f"no wheel with key {key} in ") and "\nstored mpi4py-4.1.2-" in after
    assert reused != built, f"{prefix}: neither reused nor built: mpi4py: {after[:500]}"
    package = next(prefix.glob("venv/lib/python3*/site-packages/mpi4py"))
    so = {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*.so"))}
    assert so, f"{package}: no extension module"
    return {"key": key, "text": text, "how": "reused" if reused else "built", "so": so}


def wheel_so(entry: Path) -> tuple[str, dict[str, bytes]]:
    """The wheel of a build-cache entry (``<cache>/builds/mpi4py-4.1.2/<key>``): its sha256 and
    its ``.so`` members (path under mpi4py/: bytes)."""
    wheels = sorted(entry.glob("mpi4py-4.1.2-*.whl"))
    assert len(wheels) == 1, (entry, wheels)
    with zipfile.ZipFile(wheels[0]) as z:
        so = {n[len("mpi4py/"):]: z.read(n) for n in z.namelist() if n.startswith("mpi4py/") and n.endswith(".so")}
    return _sha256(wheels[0].read_bytes()), so


def code_of(so: dict[str, bytes], where: Path) -> dict[str, str]:
    """sha256 of each ``.so`` without its debug information and GNU build ID (``objcopy
    --strip-debug --remove-section=.note.gnu.build-id``): what two builds of the same sources with
    the same compiler share when they ran in other directories."""
    objcopy = shutil.which("objcopy")
    assert objcopy, "objcopy missing (binutils: the compilers' own)"
    out = {}
    for name, data in so.items():
        src, dst = where / "in.so", where / "out.so"
        src.write_bytes(data)
        proc = run([objcopy, "--strip-debug", "--remove-section=.note.gnu.build-id", str(src), str(dst)], timeout=120)
        assert proc.returncode == 0, f"objcopy {name}: {proc.stderr}"
        out[name] = _sha256(dst.read_bytes())
    return out


def key_diff(a: str, b: str) -> str:
    """The lines of two build keys' texts that differ (why two builds got two keys)."""
    la, lb = a.splitlines(), b.splitlines()
    return "\n".join([f"- {x}" for x in la if x not in lb] + [f"+ {x}" for x in lb if x not in la])


def test_mpi4py_binaries_across_deliveries(deliveries, tmp_path):
    """mpi4py's extension modules, byte for byte: each delivery's are its wheel's; the module
    install built the wheel, the offline install built it again with the same key (the same code
    and data), and the image reused the module install's wheel exactly when its key is the same
    (then the same bytes), else built its own (then the same code and data, or the key says why
    not). Which one the image did is printed and asserted."""
    module, offline, _, _, _ = deliveries
    tmp = module.parents[2]
    mod = mpi4py_build(module)
    assert mod["how"] == "built", "the module install reused an mpi4py wheel: its cache was not empty"
    mod_wheel, mod_wheel_so = wheel_so(tmp / "sw" / ".hpcstack" / "cache" / MPI4PY_BUILDS / mod["key"])
    assert {n: _sha256(b) for n, b in mod["so"].items()} == {n: _sha256(b) for n, b in mod_wheel_so.items()}
    mod_code = code_of(mod["so"], tmp_path)

    off = mpi4py_build(offline)
    assert off["how"] == "built", "the offline install has a cache of its own: it cannot have reused a wheel"
    assert off["key"] == mod["key"], f"the bundle changed the build key:\n{key_diff(mod['text'], off['text'])}"
    _, off_wheel_so = wheel_so(tmp / "sw-offline" / ".hpcstack" / "cache" / MPI4PY_BUILDS / off["key"])
    assert {n: _sha256(b) for n, b in off["so"].items()} == {n: _sha256(b) for n, b in off_wheel_so.items()}
    assert code_of(off["so"], tmp_path) == mod_code, "two builds of mpi4py with the same key differ in code or data"

    from hpcstack.lifecycle.images import mounted_image, stack_prefix

    with mounted_image(IMAGE, "vfs", str(ROOT / "storage")) as (root, config):
        _, prefix = stack_prefix(root, config, IMAGE)
        img = mpi4py_build(prefix)
    print(f"::: image: mpi4py {img['how']} (key {img['key']}; the module install's: {mod['key']})")
    img_wheel, img_wheel_so = wheel_so(ROOT / "cache" / MPI4PY_BUILDS / img["key"])
    assert {n: _sha256(b) for n, b in img["so"].items()} == {n: _sha256(b) for n, b in img_wheel_so.items()}
    if img["how"] == "reused":
        # the image's cache holds the module install's builds alone: a reuse is of its wheel
        assert img["key"] == mod["key"] and img_wheel == mod_wheel, (img["key"], mod["key"])
        assert img["so"] == mod["so"]
    else:
        assert img["key"] != mod["key"], "the image built mpi4py under the module install's key, whose wheel it had"
        why = key_diff(mod["text"], img["text"])
        assert code_of(img["so"], tmp_path) == mod_code, f"the image's mpi4py differs in code or data; its key in:\n{why}"
