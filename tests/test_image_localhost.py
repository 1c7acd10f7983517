"""The localhost image built for real, by ``scripts/container-image``: the Dockerfile of
``hpcstack export pytorch/2.3.1-gpu --site localhost --format docker`` built with buildah (overlay
storage where the kernel mounts it, else vfs; chroot isolation) from a minbase Debian 12 root
filesystem, then in the image the runscript (the validation trainer on 2 CPU ranks) and
``horovodrun --check-build``.

It shares the end-to-end stack's caches (tests/test_e2e_pytorch.py, which runs first: file name
order), hard-linked and bind-mounted, so the image downloads no wheel twice and Horovod's wheel comes
from the build cache; the test checks that it did. Marked e2e (slow: the log says how long each
phase took; see docs/exports/containers.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO

pytestmark = [pytest.mark.e2e, pytest.mark.fresh]

SCRIPT = REPO / "scripts" / "container-image"
IMAGE_ROOT = Path(os.environ.get("HPCSTACK_IMAGE_ROOT", "/var/tmp/hpcstack-image"))
LOG = IMAGE_ROOT / "last-run.log"


@pytest.fixture(scope="module")
def image_run():
    if os.geteuid() != 0:
        pytest.skip("needs root (mmdebstrap, buildah's chroot isolation)")
    missing = [t for t in ("mmdebstrap", "buildah") if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: scripts/localhost-setup --with-test-tools installs them")
    IMAGE_ROOT.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HPCSTACK": HPCSTACK[0], "UV": str(Path(sys.executable).with_name("uv"))}
    start = time.monotonic()
    with open(LOG, "w") as log:
        proc = subprocess.run([str(SCRIPT)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=2700, cwd="/", env=env)
    seconds = time.monotonic() - start
    out = LOG.read_text(errors="replace")
    print("\n".join(line for line in out.splitlines() if line.startswith(":::")),
          f"scripts/container-image took {seconds:.0f} s (log: {LOG})", sep="\n")
    return proc.returncode, out


def test_the_image_builds_and_its_runscript_validates_on_two_ranks(image_run):
    code, out = image_run
    assert code == 0 and "::: IMAGE OK" in out, f"scripts/container-image failed (log {LOG}):\n{out[-6000:]}"
    run = out.split("::: runscript: ", 1)[1].split("\n::: runscript: ", 1)[0]
    assert run.startswith("hpcstack validate pytorch/2.3.1-gpu --site /opt/hpcstack/site-configs/localhost.yaml --local --ranks 2")
    assert re.search(r"^PASS$", run, re.M), run[-3000:]
    assert "parameters identical on all ranks: True" in run


def test_horovod_in_the_image_has_pytorch_mpi_gloo_and_came_from_the_build_cache(image_run):
    code, out = image_run
    assert code == 0, f"log {LOG}"
    check = out.split("::: horovodrun --check-build\n", 1)[1]
    for flag in ("PyTorch", "MPI", "Gloo"):
        assert f"[X] {flag}" in check, check
    line = re.search(r"^::: horovod build cache: (.*)$", out, re.M).group(1)
    assert line.startswith("horovod: reusing"), line


def test_the_image_is_labelled_with_recipe_lock_and_version(image_run):
    code, out = image_run
    assert code == 0, f"log {LOG}"
    from hpcstack import __version__

    labels = dict(re.findall(r"^::: label (\S+?)=(.*)$", out, re.M))
    assert labels["org.hpcstack.recipe"] == "pytorch/2.3.1-gpu"
    assert labels["org.hpcstack.version"] == __version__
    assert labels["org.hpcstack.lock"] == "2.3.1-gpu.pypi.lock" and len(labels["org.hpcstack.lock.sha256"]) == 64


def test_the_image_and_its_container_are_removed(image_run):
    code, out = image_run
    driver, storage = re.search(r"^::: buildah storage: (\S+) in (\S+)$", out, re.M).groups()
    assert driver in ("overlay", "vfs") and storage == str(IMAGE_ROOT / f"storage-{driver}"), (driver, storage)
    buildah = ["buildah", "--storage-driver", driver, "--root", storage, "--runroot", f"/run/hpcstack-image-{driver}"]
    images = subprocess.run([*buildah, "images", "--format", "{{.Name}}:{{.Tag}}"], capture_output=True, text=True)
    assert images.returncode == 0 and "localhost/hpcstack-pytorch:2.3.1-gpu" not in images.stdout, images.stdout
    containers = subprocess.run([*buildah, "containers", "--format", "{{.ContainerName}}"], capture_output=True, text=True)
    assert not [c for c in containers.stdout.split() if c.startswith("hpcstack-image-")], containers.stdout
