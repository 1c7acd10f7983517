"""Shared fixtures: the real tools the tests need, the installed stack, and a tiny recipe that goes
through every step; the test run's policy on markers and skips.

Markers: every test carries exactly one of ``unit`` (no network, no root, no installed stack:
seconds each; ``scripts/run-tests --quick`` runs these), ``integration`` (real external tools:
module tools, MPI, Slurm, pip/uv from PyPI, root) and ``e2e`` (the installed ``pytorch/2.3.1-gpu``
stack, through the :func:`installed_stack` fixture, or a fresh machine). A test without one, or
with two, stops the collection.

Skips: a test that cannot find its tool skips with the reason. The README's test command
(scripts/run-tests) installs every tool, so under ``CI=true`` a skip is a failure unless its reason
starts with one of :data:`ALLOWED_SKIPS`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASE_MODULES = Path("/opt/hpcstack/base-modulefiles")
MODULES_INIT = Path("/usr/share/modules/init/bash")


#: `horovodrun --check-build` of a GPU build with NCCL (as in the Cirrus instructions), and of a CPU one.
CHECK_BUILD_NCCL = """\
Horovod v0.28.1:

Available Frameworks:
    [ ] TensorFlow
    [X] PyTorch
    [ ] MXNet

Available Controllers:
    [X] MPI
    [X] Gloo

Available Tensor Operations:
    [X] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""

CHECK_BUILD_CPU = CHECK_BUILD_NCCL.replace("[X] NCCL", "[ ] NCCL")


#: The installed ``hpcstack`` console script of this interpreter's environment (scripts/run-tests
#: installs hpcstack there from its wheel), run from a neutral directory so that nothing of the
#: checkout can be imported by accident.
HPCSTACK = [str(Path(sys.executable).with_name("hpcstack"))]
NEUTRAL_DIR = tempfile.gettempdir()


def hpcstack(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real, installed ``hpcstack`` command and capture its output."""
    return subprocess.run([*HPCSTACK, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=NEUTRAL_DIR)


def pytest_sessionstart(session):
    """Under scripts/run-tests (HPCSTACK_TEST_INSTALLED=1) the package under test must be the
    installed wheel, not this checkout; anywhere, the ``hpcstack`` command must exist."""
    import hpcstack as package

    if not Path(HPCSTACK[0]).is_file():
        pytest.exit(f"{HPCSTACK[0]} missing: install hpcstack into this environment "
                    "(scripts/run-tests does)", returncode=4)
    if os.environ.get("HPCSTACK_TEST_INSTALLED") and Path(package.__file__).resolve().is_relative_to(REPO):
        pytest.exit(f"testing the checkout ({package.__file__}), not the installed wheel: run the "
                    "tests with the environment's pytest, not python -m pytest", returncode=4)


#: The markers of the test run; every test carries exactly one.
LEVELS = ("unit", "integration", "e2e")

#: The only skips allowed under ``CI=true``, as reason prefixes: what the CI machines cannot have.
ALLOWED_SKIPS = (
    "needs a GPU",  # the CI machines have none; the GPU tests run on a lent GPU machine
)


def test_level(item) -> str | None:
    """The level of a test: the closest of :data:`LEVELS` among its markers (the test's own, then
    its class's, then its module's ``pytestmark``), or None."""
    return next((mark.name for mark in item.iter_markers() if mark.name in LEVELS), None)


def pytest_collection_modifyitems(session, config, items):
    """Every test has a level (:func:`test_level`), and only that one of :data:`LEVELS` applies:
    ``-m unit`` selects a test whose module is ``unit`` but which says ``integration`` itself only
    by its own marker. Stops the run naming the tests without one."""
    missing = [item.nodeid for item in items if test_level(item) is None]
    if missing:
        raise pytest.UsageError(f"each test needs one of the markers {', '.join(LEVELS)} "
                                "(tests/conftest.py):\n  " + "\n  ".join(missing))
    levels = {item.nodeid: test_level(item) for item in items}
    for item in items:  # keep the closest level marker only, so that -m selects by the real level
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers if m.name not in LEVELS]
        item.add_marker(levels[item.nodeid])
        # an e2e test needs the installed stack: it says so through the fixture, whatever the order
        # of the files (the fresh-machine tests build their own machine instead)
        if levels[item.nodeid] == "e2e" and not item.get_closest_marker("fresh") \
                and "installed_stack" not in item.fixturenames:
            item.fixturenames.append("installed_stack")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_skip_in_ci(report) -> None:
    """Under ``CI=true``, turn a skip whose reason is not in :data:`ALLOWED_SKIPS` into a failure."""
    if os.environ.get("CI") != "true" or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI, where nothing may skip but {ALLOWED_SKIPS} "
                           f"(tests/conftest.py ALLOWED_SKIPS): {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip_in_ci(outcome.get_result())


def assert_golden(path: Path, got: str) -> None:
    """Compare ``got`` with the golden file ``path`` (tests/golden/). With
    ``HPCSTACK_UPDATE_GOLDEN=1`` exactly, and not under ``CI=true``, rewrite the file first (review
    the diff of tests/golden/ afterwards); any other value leaves it alone."""
    if os.environ.get("HPCSTACK_UPDATE_GOLDEN") == "1" and os.environ.get("CI") != "true":
        path.write_text(got)
    assert got == path.read_text(), f"{path} differs: HPCSTACK_UPDATE_GOLDEN=1 regenerates it"


def bash_modules(script: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` in bash with Environment Modules initialised (BASH_ENV cleared: docs/notes.md)."""
    full_env = {k: v for k, v in os.environ.items() if k != "BASH_ENV"}
    full_env.update(env or {})
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", f"source {MODULES_INIT}\n{script}"],
                          capture_output=True, text=True, env=full_env, timeout=300)


@pytest.fixture(scope="session")
def modules_tool():
    """Environment Modules, installed by scripts/localhost-setup."""
    if not MODULES_INIT.is_file():
        pytest.skip(f"Environment Modules missing ({MODULES_INIT}); run scripts/localhost-setup")


@pytest.fixture(scope="session")
def localhost_ready(modules_tool):
    """The localhost site's prerequisites: base python module, MPI compilers, cmake."""
    if not any(BASE_MODULES.glob("python/*")):
        pytest.skip(f"no base python module in {BASE_MODULES}; run scripts/localhost-setup")
    for tool in ("mpicc", "mpirun", "cmake", "patch"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing; run scripts/localhost-setup")


#: Where the README's main command (scripts/quickstart-localhost) installs ``pytorch/2.3.1-gpu`` for
#: the site ``localhost``: the machine's own install and module roots. The tests that need the real
#: stack use this one on purpose, read only, through :func:`installed_stack` (one real install per
#: test run, as the test command runs the main command first).
STACK_TOP = Path("/opt/hpcstack")
STACK_RECIPE = "pytorch/2.3.1-gpu"
STACK_PREFIX = STACK_TOP / "software" / "pytorch" / "2.3.1-gpu"
STACK_MODULES = STACK_TOP / "modulefiles"


@pytest.fixture(scope="session")
def installed_stack(localhost_ready) -> Path:
    """The published ``pytorch/2.3.1-gpu`` of the site ``localhost`` (its prefix, a Path).

    Runs the README's install command, ``hpcstack install pytorch/2.3.1-gpu --site localhost``:
    after the main command it only finds the stack up to date; on a machine without the stack it
    installs it (as root: about 8 minutes and 2.8 GB of downloads). Skips, saying why, when the
    stack is missing and this is not root.
    """
    published = (STACK_MODULES / "pytorch" / "2.3.1-gpu").is_file() and (STACK_PREFIX / "venv" / "bin" / "python").exists()
    if not published and os.geteuid() != 0:
        pytest.skip(f"{STACK_RECIPE} is not installed under {STACK_TOP} and installing it needs root: "
                    "run scripts/quickstart-localhost")
    proc = hpcstack("install", STACK_RECIPE, "--site", "localhost", timeout=3600)
    assert proc.returncode == 0, f"hpcstack install {STACK_RECIPE} --site localhost: {proc.stderr[-3000:]}"
    return STACK_PREFIX


def make_sdist(dest: Path, name: str = "tinypkg", version: str = "1.0", hold: Path | None = None) -> Path:
    """Write a tiny sdist (a setuptools package with one module) and return its path.

    Args:
        dest (Path): the directory of the sdist.
        name (str), version (str): the package.
        hold (Path | None): a failpoint inside the build command (tests/test_faults.py): whenever
            ``hold`` exists as its ``setup.py`` runs, it creates ``<hold>.held`` and waits until
            ``hold`` is removed, so that a test kills the build while it runs, at a moment it knows.
    """
    src = dest / f"{name}-{version}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text("GREETING = 'hello'\n")
    wait = "" if hold is None else textwrap.dedent(f"""\
        import os, time
        if os.path.exists({str(hold)!r}):
            open({str(hold) + ".held"!r}, "w").close()
            while os.path.exists({str(hold)!r}):
                time.sleep(0.01)
        """)
    (src / "setup.py").write_text(wait + textwrap.dedent(f"""\
        from setuptools import setup
        setup(name={name!r}, version={version!r}, packages=[{name!r}])
        """))
    archive = dest / f"{name}-{version}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    shutil.rmtree(src)
    return archive


TINY_PATCH = """\
--- a/tinypkg/__init__.py
+++ b/tinypkg/__init__.py
@@ -1 +1,2 @@
 GREETING = 'hello'
+PATCHED = True
"""

TINY_LOCK = """\
--index-url https://pypi.org/simple
six==1.16.0 \\
    --hash=sha256:1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926 \\
    --hash=sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254
wheel==0.43.0 \\
    --hash=sha256:465ef92c69fa5c5da2d1cf8ac40559a8c940886afcef87dcf14b9470862f1d85 \\
    --hash=sha256:55c570405f142630c6b9f72fe09d9b67cf1477fcf543ae5b8dcb1f5b7377da81
setuptools==72.1.0 \\
    --hash=sha256:5a03e1860cf56bb6ef48ce186b0e557fdba433237481a9a625176c2831be15d1 \\
    --hash=sha256:8d243eff56d095e5817f796ede6ae32941278f542e0f941867cc05ae52b162ec
"""


def write_tiny_recipe(root: Path, sdist: Path, patch_text: str = TINY_PATCH) -> Path:
    """Write ``root/tiny/1.0.py`` (+ lock, patch): Venv, PipWheels, SourceBuild, tools, Imports, Modulefile.

    It goes through the same steps as the PyTorch recipe, with tiny wheels and a tiny source build.
    """
    import hashlib

    rdir = root / "tiny"
    (rdir / "patches").mkdir(parents=True)
    (rdir / "patches" / "tiny.patch").write_text(patch_text)
    (rdir / "1.0.pypi.lock").write_text(TINY_LOCK)
    sdist_sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    patch_sha = hashlib.sha256(patch_text.encode()).hexdigest()
    path = rdir / "1.0.py"
    path.write_text(textwrap.dedent(f'''\
        """A tiny stack for tests: the steps of the PyTorch recipe with tiny inputs."""
        from hpcstack.install.components import (Imports, Modulefile, Patch, PipWheels, SourceBuild, StackTools,
                                          Venv)
        from hpcstack.recipe import Recipe

        def recipe(site):
            return Recipe("tiny", "1.0", whatis="a tiny test stack", components=[
                Venv(),
                PipWheels("1.0"),
                SourceBuild("tinypkg", "1.0", url={sdist.as_uri()!r}, sha256={sdist_sha!r},
                            patches=(Patch("tiny.patch", {patch_sha!r}),)),
                StackTools(),
                Imports(("six", "tinypkg")),
                Modulefile(),
            ])
        '''))
    return path


SLURM_SCRIPT = REPO / "scripts" / "localhost-slurm"
SLURM_BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "ip", "nsenter")


def which_sbin(name: str) -> str | None:
    """``shutil.which``, also looking in /usr/sbin (root's daemons are there, off a user's PATH)."""
    return shutil.which(name) or (f"/usr/sbin/{name}" if os.access(f"/usr/sbin/{name}", os.X_OK) else None)


def localhost_slurm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``scripts/localhost-slurm ARGS``; with ``check``, fail the test on a non-zero exit."""
    proc = subprocess.run([str(SLURM_SCRIPT), *args], capture_output=True, text=True, timeout=180)
    if check and proc.returncode:
        raise AssertionError(f"localhost-slurm {' '.join(args)}: {proc.returncode}\n{proc.stderr}")
    return proc


@contextmanager
def two_node_cluster():
    """The local 2-node Slurm cluster: ``up --nodes 2`` on entry and ``down`` on exit, unless a
    2-node cluster was already up (then it is reused and left running). Skips, saying why, when
    not root or when Slurm's binaries are missing."""
    if os.geteuid() != 0:
        pytest.skip("the 2-node local Slurm cluster needs root")
    missing = [b for b in SLURM_BINARIES if which_sbin(b) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}; run `scripts/localhost-slurm install` as root")
    status = localhost_slurm("status", check=False)
    was_up = status.returncode == 0
    if was_up and not status.stdout.startswith("nodes: 2"):
        pytest.skip("a 1-node localhost-slurm cluster is running; `localhost-slurm down` first")
    localhost_slurm("up", "--nodes", "2")
    try:
        yield
    finally:
        if not was_up:
            localhost_slurm("down", check=False)


def user_writable_dir(user: str, prefix: str):
    """Yield a fresh directory under /tmp owned by ``user`` (visible on both local Slurm 'nodes',
    which share the filesystem); it is removed afterwards."""
    import pwd

    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    pw = pwd.getpwnam(user)
    os.chown(d, pw.pw_uid, pw.pw_gid)
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
