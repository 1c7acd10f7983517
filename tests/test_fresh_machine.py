"""The newcomer's path on a fresh machine: the README's main command in a container made
from a fresh Debian 12 root filesystem, by ``scripts/fresh-machine``.

In a minbase Debian 12 (``mmdebstrap``; ``buildah`` with vfs storage and chroot isolation), as root,
with only ``git`` and ``ca-certificates`` installed by hand: clone this checkout's committed HEAD,
``scripts/quickstart-localhost --local`` (setup, ``hpcstack install pytorch/2.3.1-gpu --site
localhost``, ``hpcstack validate … --local``), then ``cd / && hpcstack --version && hpcstack list``,
and as a new user in a login shell ``module load pytorch/2.3.1-gpu``, the imports and
``horovodrun --check-build``. Slurm does not run inside: chroot isolation shares the host's
network namespace and drops CAP_NET_ADMIN and CAP_SYS_ADMIN, so ``scripts/localhost-slurm up`` can
make neither its node namespaces nor its bridge; tests/test_validate_slurm.py covers Slurm on the host.

The wheel and build caches come from the machine's cache (/var/cache/hpcstack), which the README's
main command filled before the tests, hard-linked, so the container downloads no wheel twice. The root
filesystem tar and the cache stay in $HPCSTACK_FRESH_ROOT (default /var/tmp/hpcstack-fresh) for
the next run; the working container is removed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.fresh]

SCRIPT = REPO / "scripts" / "fresh-machine"
FRESH_ROOT = Path(os.environ.get("HPCSTACK_FRESH_ROOT", "/var/tmp/hpcstack-fresh"))
LOG = FRESH_ROOT / "last-run.log"


def committed_version() -> str:
    """``__version__`` of the committed tree (what the container clones)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", "HEAD:hpcstack/__init__.py"],
                          capture_output=True, text=True, check=True).stdout
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


@pytest.fixture(scope="module")
def fresh_run():
    if os.geteuid() != 0:
        pytest.skip("needs root (mmdebstrap, buildah's chroot isolation, the quickstart inside)")
    missing = [t for t in ("mmdebstrap", "buildah", "git") if not shutil.which(t)]
    if missing:
        pytest.skip(f"{', '.join(missing)} missing: scripts/localhost-setup --with-test-tools installs them")
    if not (REPO / ".git").exists():
        pytest.skip(f"{REPO} is not a git checkout: the container clones its HEAD")
    FRESH_ROOT.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(LOG, "w") as log:
        proc = subprocess.run([str(SCRIPT)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=2700, cwd="/")
    seconds = time.monotonic() - start
    out = LOG.read_text(errors="replace")
    summary = [line for line in out.splitlines() if line.startswith(":::") or " done in " in line]
    print("\n".join(summary), f"scripts/fresh-machine took {seconds:.0f} s (log: {LOG})", sep="\n")
    return proc.returncode, out


def phase(out: str, start: str) -> str:
    """The output between the ``::: <start>`` line and the next ``::: `` line."""
    part = out.split(f"::: {start}\n", 1)[1]
    return part.split("\n::: ", 1)[0]


def test_quickstart_runs_from_a_fresh_clone(fresh_run):
    code, out = fresh_run
    assert code == 0 and "::: FRESH MACHINE OK" in out, f"scripts/fresh-machine failed (log {LOG}):\n{out[-6000:]}"
    assert "::: cloned " in out
    quick = phase(out, "scripts/quickstart-localhost --local")
    assert re.search(r"^installed pytorch/2\.3\.1-gpu: /opt/hpcstack/software/pytorch/2\.3\.1-gpu ", quick, re.M) \
        or "up to date" in quick, quick[-3000:]
    validate = quick.split("==> validate pytorch/2.3.1-gpu", 1)[1]
    assert re.search(r"^PASS$", validate, re.M), validate[-3000:]
    assert "parameters identical on all ranks: True" in validate


def test_hpcstack_runs_from_root_dir_with_the_committed_version(fresh_run):
    code, out = fresh_run
    assert code == 0, f"log {LOG}"
    cmd = phase(out, "cd / && hpcstack --version && hpcstack list")
    assert "HPCSTACK=/usr/local/bin/hpcstack" in cmd
    assert re.search(rf"^hpcstack {re.escape(committed_version())}$", cmd, re.M), cmd
    assert re.search(r"^\s+pytorch/2\.3\.1-gpu\s", cmd, re.M), cmd
    assert re.search(r"^\s+localhost\s", cmd, re.M), cmd


def test_a_user_loads_the_module_in_a_login_shell(fresh_run):
    code, out = fresh_run
    assert code == 0, f"log {LOG}"
    user = phase(out, "as a new user, in a login shell: module load pytorch/2.3.1-gpu")
    assert "IMPORTS OK 2.3.1" in user, user
    for flag in ("PyTorch", "MPI", "Gloo"):
        assert f"[X] {flag}" in user, user


def test_the_working_container_is_removed(fresh_run):
    code, out = fresh_run
    name = re.search(r"^::: container (\S+) from ", out, re.M).group(1)
    listed = subprocess.run(["buildah", "--storage-driver", "vfs", "--root", str(FRESH_ROOT / "storage"),
                             "--runroot", "/run/hpcstack-fresh", "containers", "--format", "{{.ContainerName}}"],
                            capture_output=True, text=True)
    assert name not in listed.stdout.split(), listed.stdout
    software = FRESH_ROOT / "software"
    assert sorted(p.name for p in software.iterdir()) == []  # the cache is beside it, in FRESH_ROOT/cache
    assert (FRESH_ROOT / "cache" / "uv").is_dir()
