"""Site twins' module systems (scripts/twin-modules, issue 33 item 3) with the real tools.

Per twin: `twin-modules up SITE`; the login shell runs the site's module tool with the site's
default MODULEPATH and names; `hpcstack install mpi4py/4.1.2 --site SITE-twin --repo twins` as
root from a login shell builds against the stand-in MPI (into roots of the test's own, so the
site's real roots and what the twins' e2e installs there are untouched); an ordinary user's fresh
login shell loads the stack's module (after the site's hierarchy, as the stack's `module help`
says) and imports mpi4py, and `module avail`/`spider` find it; `pytorch/2.3.1-gpu` plans cleanly;
then `down`, after which localhost's module setup is exactly as before.

Needs root, Lmod and Environment Modules (scripts/localhost-setup --with-test-tools) and the
user hpcstack-user; skips, saying why, otherwise, and when a twin is up already (another run's).
The first run builds mpi4py per twin (about 6 minutes each on 2 cores); later runs reuse the
machine cache's build.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO
from moduletools import ENVIRONMENT_MODULES, LMOD, require

pytestmark = pytest.mark.integration

SCRIPT = REPO / "scripts" / "twin-modules"
TWINS = REPO / "twins"
USER = "hpcstack-user"
PROFILE = Path("/etc/profile.d/zz-hpcstack-twin.sh")


def login(user: str, script: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``script`` in a fresh login shell of ``user`` (root: a login shell that keeps this
    process's environment, so the network's certificates reach uv)."""
    if user == "root":
        argv = ["bash", "-l", "-c", script]
    else:
        argv = ["runuser", "-l", user, "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def twin(verb: str, site: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys_python(), str(SCRIPT), verb, site], capture_output=True, text=True, timeout=120)


def sys_python() -> str:
    return "/usr/bin/python3"


def localhost_state() -> tuple[str, str]:
    """What a localhost login shell shows: its MODULEPATH and module tool, and `module avail`."""
    proc = login(USER, 'echo "$MODULEPATH|$MODULES_CMD|${LMOD_CMD:-}|${BASH_ENV:-}"; module avail 2>&1')
    return proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def ready():
    if os.geteuid() != 0:
        pytest.skip("twin-modules writes under / and /etc/profile.d: run the tests as root")
    require(LMOD)
    require(ENVIRONMENT_MODULES)
    try:
        pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no user {USER} (scripts/localhost-setup --with-test-tools makes it)")
    if PROFILE.exists():
        pytest.skip(f"a site twin is up ({PROFILE}): bring it down first")
    return localhost_state()


@pytest.fixture
def roots():
    top = Path(tempfile.mkdtemp(prefix="twin-modules-", dir="/var/tmp"))
    os.chmod(top, 0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def _install_and_use(site: str, roots: Path, user_setup: str) -> str:
    """Install mpi4py/4.1.2 on ``site``-twin into ``roots`` from root's login shell, then load it
    as the ordinary user; returns the user's output."""
    prefix, modroot = roots / "sw", roots / "mf"
    hpc = shlex.join(HPCSTACK)
    common = f"--site {site}-twin --repo {shlex.quote(str(TWINS))}"
    install = login("root", f"{hpc} install mpi4py/4.1.2 {common} --prefix {prefix} --module-root {modroot}")
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    plan = login("root", f"{hpc} install pytorch/2.3.1-gpu {common} --dry-run --prefix {prefix} --module-root {modroot}",
                 timeout=600)
    assert plan.returncode == 0, plan.stderr[-3000:]
    use = login(USER, f"{user_setup}\nmodule use {modroot}\n"
                      "module load mpi4py/4.1.2 || exit 9\n"
                      "python -c 'import mpi4py, mpi4py.MPI; print(\"MPI4PY\", mpi4py.__file__, mpi4py.MPI.Get_library_version()[:8])'\n"
                      "echo LOADED=$LOADEDMODULES\necho CUDA=${CRAY_CUDATOOLKIT_VERSION:-}\necho MPITYPE=${SLURM_MPI_TYPE:-}\n"
                      "module avail 2>&1 | tr -s ' ' '\\n' | grep -c '^mpi4py/4.1.2' || true\n")
    assert use.returncode == 0, use.stdout + use.stderr
    assert f"MPI4PY {prefix}/mpi4py/" in use.stdout and "Open MPI" in use.stdout, use.stdout + use.stderr
    return use.stdout


def _down_restores(site: str, before: tuple[str, str]) -> None:
    down = twin("down", site)
    assert down.returncode == 0, down.stderr
    assert not PROFILE.exists()
    assert twin("status", site).returncode == 3
    assert localhost_state() == before


def test_cirrus_twin_environment_modules_with_the_sites_names(ready, roots):
    up = twin("up", "cirrus")
    assert up.returncode == 0, up.stderr
    try:
        shell = login(USER, 'echo "MP=$MODULEPATH"; echo "CMD=$MODULES_CMD"; module avail 2>&1; '
                            'module load python/3.12.1-gpu && command -v python3 mpicc && python3 -c "import sys; print(sys.version_info[:2])"')
        assert "MP=/work/y07/shared/cirrus-modulefiles\n" in shell.stdout, shell.stdout
        assert "CMD=" in shell.stdout and "modulecmd.tcl" in shell.stdout
        for name in ("python/3.12.1-gpu", "cmake/3.25.2"):
            assert name in shell.stdout, shell.stdout
        assert "/work/y07/shared/cirrus-software/python/3.12.1-gpu/bin/python3" in shell.stdout
        assert "/work/y07/shared/cirrus-software/openmpi/4.1.6-cuda-12.4/bin/mpicc" in shell.stdout
        assert Path("/usr/share/Modules/init/bash").is_file()       # the site's init path
        out = _install_and_use("cirrus", roots, "")
        assert "LOADED=openmpi/4.1.6-cuda-12.4:python/3.12.1-gpu:mpi4py/4.1.2" in out, out
        assert int(out.strip().splitlines()[-1]) >= 1, out            # module avail finds it
    finally:
        _down_restores("cirrus", ready)
    assert not Path("/work/y07/shared/cirrus-modulefiles/python/3.12.1-gpu").exists()


def test_juwels_booster_twin_lmod_hierarchy_as_jscs_stages(ready, roots):
    up = twin("up", "juwels-booster")
    assert up.returncode == 0, up.stderr
    try:
        # the default MODULEPATH shows the Stages only; a Stage resets it and shows the compilers
        shell = login(USER, 'echo "MP=$MODULEPATH"; module -t avail 2>&1; module load Python/3.11.3 2>&1 && echo BAD;'
                            'module load Stages/2024; echo "MP2=$MODULEPATH"; module -t avail 2>&1;'
                            'module load GCC/12.3.0 ParaStationMPI/5.9.2-1; module -t avail 2>&1; '
                            'echo "TYPE=$SLURM_MPI_TYPE"; command -v mpicc python3')
        out = shell.stdout
        assert "MP=/p/software/juwelsbooster/stagesmodules\n" in out, out
        assert "Stages/2024" in out and "Stages/2025" in out and "BAD" not in out
        assert "MP2=/p/software/juwelsbooster/stages/2024/modules/all/Core:/p/software/juwelsbooster/stagesmodules" in out
        for name in ("GCC/12.3.0", "ParaStationMPI/5.9.2-1", "Python/3.11.3", "CMake/3.26.3", "CUDA/12",
                     "NCCL/default-CUDA-12", "mpi-settings/CUDA"):
            assert name in out, (name, out)
        assert "TYPE=pmix" in out
        assert "/p/software/juwelsbooster/stages/2024/software/psmpi/5.9.2-1-GCC-12.3.0/bin/mpicc" in out
        from hpcstack.site import load_site
        hierarchy = " ".join(load_site("juwels-booster").modules.hierarchy)
        out = _install_and_use("juwels-booster", roots, f"module load {hierarchy}")
        assert "MPITYPE=pmix" in out
        loaded = out.split("LOADED=", 1)[1].splitlines()[0].split(":")
        assert loaded[:3] == ["Stages/2024", "GCC/12.3.0", "ParaStationMPI/5.9.2-1"] and loaded[-1] == "mpi4py/4.1.2", loaded
        spider = login(USER, f"module use {roots / 'mf'}; module spider mpi4py/4.1.2 2>&1")
        assert "mpi4py/4.1.2" in spider.stdout and spider.returncode == 0, spider.stdout
    finally:
        _down_restores("juwels-booster", ready)


def test_perlmutter_twin_lmod_with_cray_pe_like_modules(ready, roots):
    up = twin("up", "perlmutter")
    assert up.returncode == 0, up.stderr
    try:
        shell = login(USER, 'echo "LOADED=$LOADEDMODULES"; echo "CUDA=$CRAY_CUDATOOLKIT_VERSION"; module -t avail 2>&1;'
                            'command -v cc CC ftn')
        out = shell.stdout
        assert "LOADED=gcc-native/12.3:PrgEnv-gnu/8.5.0:cray-mpich/8.1.28:cudatoolkit/13.0:gpu/1.0" in out, out
        assert "CUDA=13.0" in out            # the unversioned default moved: why the site pins 12.2
        for name in ("PrgEnv-gnu/8.5.0", "cray-mpich/8.1.28", "cudatoolkit/12.2", "cudatoolkit/13.0",
                     "nccl/2.21.5", "python/3.11"):
            assert name in out, (name, out)
        assert "/opt/cray/pe/mpich/8.1.28/ofi/gnu/12.3/bin/cc" in out
        out = _install_and_use("perlmutter", roots, "")
        assert "CUDA=12.2" in out, out      # the stack's pinned cudatoolkit replaced the default
        spider = login(USER, f"module use {roots / 'mf'}; module spider mpi4py/4.1.2 2>&1")
        assert "mpi4py/4.1.2" in spider.stdout and spider.returncode == 0, spider.stdout
    finally:
        _down_restores("perlmutter", ready)


def test_one_twin_at_a_time_and_down_of_a_twin_that_is_not_up(ready):
    assert twin("up", "cirrus").returncode == 0
    try:
        again = twin("up", "perlmutter")
        assert again.returncode == 2 and again.stderr.count("\n") == 1
        assert "twin cirrus is up: one twin at a time" in again.stderr
        assert not Path("/opt/cray/pe/lmod").exists()
    finally:
        _down_restores("cirrus", ready)
    nothing = twin("down", "cirrus")
    assert nothing.returncode == 0 and "not up" in nothing.stdout
