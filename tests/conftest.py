"""Shared fixtures: the real tools the tests need, the installed stack, and a tiny recipe that goes
through every step; the test run's policy on markers, skips and expected failures.

Levels: every test has exactly one of ``unit``, ``integration`` and ``e2e``:

* ``unit``: needs nothing outside its environment and the base system: no root, no network
  (servers a test starts on 127.0.0.1 are fine), nothing under /opt/hpcstack or the machine's
  hpcstack cache, no module tool; the real ``hpcstack`` command of this environment, bash and
  what a build key probes (the compilers' ``--version``). Seconds each.
  ``scripts/run-tests --quick`` runs these; the full run runs them as a throw-away unprivileged
  user in a sandbox that has no network and no /opt/hpcstack and hides the module tools
  (``scripts/run-tests --unit-sandbox``), so a unit test that needs more fails there. A unit test
  that plans a stack (``install --dry-run``, an export) takes a site that states its Python
  version (:func:`unit_site`, :func:`site_overlay`): planning then loads no module.
* ``integration``: real external tools (module tools, MPI, Slurm, compilers such as a CUDA
  ``nvcc``, pip/uv from PyPI), root; no installed stack.
* ``e2e``: the installed ``pytorch/2.3.1-gpu`` stack, through the :func:`installed_stack` fixture
  (added to every e2e test), or a fresh machine (marker ``fresh``).

The level is the closest one: a test's own marker overrides its class's and its module's
``pytestmark``. A test without one stops the collection, and so does a test, class or module that
carries two different levels itself (no guess at which was meant). The tests of this policy are
tests/test_conftest_policy.py.

Skips: a test that cannot find its tool skips with the reason, and a test that checks several
tools (shells, module tools) skips, naming what did not run, when one of them is missing after the
others passed: nothing is passed over in silence. The README's test command (scripts/run-tests)
installs every tool, so under ``CI=true`` a skip is a failure unless its reason starts with one of
:data:`ALLOWED_SKIPS`, each of which some test uses (test_conftest_policy checks it): "needs a GPU"
(marker ``gpu``: tests/test_gpu_horovod.py runs where ``nvidia-smi -L`` lists a GPU).

Expected failures: under ``CI=true`` an ``xfail`` (the marker, whether the test then fails or
passes, or ``pytest.xfail()``) is a failure: a known defect is fixed, or its test says why it
cannot run, but CI does not show it green.

Shipped data: tests read what the installed package holds (``hpcstack.data_root()``),
not the checkout, where the two can differ (under scripts/run-tests the installed wheel is tested).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import textwrap
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

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


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first (from /proc/PID/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                pass
    return found


def dump_stacks(pid: int) -> str:
    """The stacks of ``pid`` and its descendants, for a test whose process did not exit: each
    Python process's threads as ``py-spy dump`` prints them, and for any process the command
    line and the kernel's wait channel. Never raises."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out = []
    for p in descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            wchan = Path(f"/proc/{p}/wchan").read_text()
        except OSError:
            continue
        out.append(f"--- process {p} (wchan {wchan or '-'}): {cmd[:300]}")
        if "python" in cmd and Path(spy).is_file():
            try:
                proc = subprocess.run([spy, "dump", "--pid", str(p)], capture_output=True, text=True, timeout=30)
                out.append(proc.stdout + proc.stderr)
            except (OSError, subprocess.TimeoutExpired) as exc:
                out.append(f"(py-spy: {exc})")
    return "\n".join(out)


def free_port() -> int:
    """A TCP port free on this host for a test's rendezvous (``MASTER_PORT``), below the kernel's
    ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``): a port the kernel handed out
    for ``bind(0)`` and released again can be handed to the next ``bind(0)`` of another process
    (a Gloo or Open MPI listener of a test in the other lane) before the store binds it; a port
    below that range is handed to nobody who does not ask for it by number."""
    import random

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10000, max(10001, low))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port below the ephemeral range")


def wait_or_dump(proc: subprocess.Popen, timeout: float) -> int:
    """``proc.wait(timeout)``; on a timeout, fail the test with the held processes' stacks
    (:func:`dump_stacks`), after killing ``proc``'s process group.

    Returns:
        int: the exit status (negative: the signal that ended it).
    """
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = dump_stacks(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.wait()
        pytest.fail(f"process {proc.pid} did not exit within {timeout} s; its stacks:\n{stacks}")


def pytest_report_header(config):
    """What the run covers beyond its defaults, in the header every run prints."""
    try:
        from twins import pytorch_twins
    except ImportError:          # a copy of this conftest without tests/twins.py (test_conftest_policy)
        return []
    return [f"site twins with pytorch/2.3.1-gpu installed and validated (tests/test_twin_e2e.py): "
            f"{', '.join(pytorch_twins()) or 'none'} (HPCSTACK_TWIN_E2E=SITE,... or all adds others)"]


def _item_timeout(item) -> float:
    """The pytest-timeout limit of ``item`` in seconds (its ``timeout`` marker, else setup.cfg's
    ``timeout``); 0 when none."""
    marker = item.get_closest_marker("timeout")
    if marker and marker.args:
        return float(marker.args[0])
    try:
        return float(item.config.getini("timeout") or 0)
    except ValueError:
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Shortly before pytest-timeout stops a test (setup, call and teardown together, as
    pytest-timeout counts them), print the stacks of every process the test started that is still
    running (:func:`dump_stacks`), so that a hang in a child shows where the child is held, not
    only where the test waits for it."""
    import threading

    timeout = _item_timeout(item)
    timer = None
    if timeout > 0:
        def dump():
            children = descendants(os.getpid())[1:]
            if not children:
                return
            print(f"\n=== {item.nodeid}: still running {timeout * 0.95:.0f} s in; the stacks of its processes ===",
                  file=sys.__stderr__)
            direct = [c for c in children if _parent(c) == os.getpid()]
            for child in direct:
                print(dump_stacks(child), file=sys.__stderr__, flush=True)

        timer = threading.Timer(timeout * 0.95, dump)
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer:
            timer.cancel()


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def hpcstack(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the real, installed ``hpcstack`` command and capture its output."""
    return subprocess.run([*HPCSTACK, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=NEUTRAL_DIR)


def pytest_sessionstart(session):
    """Under scripts/run-tests (HPCSTACK_TEST_INSTALLED=1) the package under test must be the
    installed wheel, not this checkout; anywhere, the ``hpcstack`` command must exist.

    Ctrl-C reaches what the tests start, as it does from a terminal: a non-interactive shell
    starts a background command with SIGINT ignored (POSIX, "Shell Command Language", 2.11), and
    a CI runner that starts the suite so would pass that on to every process a test sends SIGINT
    to (each would ignore it and hold). A handled signal is reset to its default in a child
    (execve(2)), so this process handles it again before starting any."""
    import hpcstack as package

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

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


def _doubled_levels(item) -> list[str]:
    """``"node: level, level"`` for each node of the test (itself with its parameters' marks, its
    class, its module) that carries two different ones of :data:`LEVELS`."""
    found = []
    for node in item.listchain():
        names = sorted({m.name for m in node.own_markers if m.name in LEVELS})
        if len(names) > 1:
            found.append(f"{node.nodeid or node.name}: {', '.join(names)}")
    return found


@pytest.hookimpl(tryfirst=True)  # before -m selects and before xdist reads the groups
def pytest_collection_modifyitems(session, config, items):
    """Every test has a level (:func:`test_level`), and only that one of :data:`LEVELS` applies:
    ``-m unit`` selects a test whose module is ``unit`` but which says ``integration`` itself only
    by its own marker. Stops the run (a usage error, before any test runs) naming the tests
    without a level, and those where one node says two levels (:func:`_doubled_levels`): which of
    them the test meant is not for the collection to guess."""
    missing = [item.nodeid for item in items if test_level(item) is None]
    if missing:
        raise pytest.UsageError(f"each test needs one of the markers {', '.join(LEVELS)} "
                                "(tests/conftest.py):\n  " + "\n  ".join(missing))
    doubled = sorted({line for item in items for line in _doubled_levels(item)})
    if doubled:
        raise pytest.UsageError(f"a test, class or module carries two of the markers {', '.join(LEVELS)}; "
                                "give it one (tests/conftest.py):\n  " + "\n  ".join(doubled))
    _group_twin_tests(items)
    _mark_lanes(config, items)
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


#: The suite's second lane under pytest-xdist (scripts/run-tests: ``-n 2 --dist loadgroup``):
#: the tests that build in a root file system or image of their own (apt, PyPI, compilers inside
#: buildah, or a separate prefix and cache), and those that only read the installed stack (its
#: interpreter under mpirun, its wheels) or the checkout (the docs site); none touches the local
#: Slurm, the site twins, the login shells' module setup or the default stack. Every other test is
#: in the first lane, in file order, so the tests that share the machine's state never run at the
#: same time; the lanes overlap downloads and apt with compiles and job waits, and are about as
#: long as each other (design.md, "Tests and time"; the durations of a run: .ci/artifacts).
BUILD_LANE = ("test_fresh_machine.py", "test_image_localhost.py", "test_three_deliveries.py", "test_gpu_build.py",
              "test_horovod_compilers.py", "test_train_benchmark.py", "test_docs_site.py",
              "test_gpuarch_wheels.py", "test_bundle.py", "test_faults.py")


#: The builds lane's niceness (``os.nice``, inherited by its compilers, pip and buildah): the
#: first lane's Slurm jobs then get the CPU where both lanes want it (CFS weights 1024 against
#: 110), so a validation's throughput measures the stack, not the other lane's compile. A fresh
#: CI run's ``test_revalidation`` read a full run 72 % slower than the install's baseline (taken
#: by the README's command, alone on the machine) while the other lane compiled: DEGRADED where
#: nothing had changed. The builds lane has the slack to give (its tests sum to about 200 s less).
BUILD_LANE_NICE = 10
_niced = False


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """In the pytest-xdist worker that runs the builds lane, lower its priority once
    (:data:`BUILD_LANE_NICE`) before its first test."""
    global _niced
    if _niced or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any("builds" in (*m.args, m.kwargs.get("name")) for m in item.iter_markers("xdist_group")):
        os.nice(BUILD_LANE_NICE)
        _niced = True


def _mark_lanes(config, items) -> None:
    """Under pytest-xdist, put each test in its lane (:data:`BUILD_LANE`) as an ``xdist_group``
    (``--dist loadgroup`` gives each group to one worker)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        lane = "builds" if item.path.name in BUILD_LANE else "machine"
        item.add_marker(pytest.mark.xdist_group(name=lane))


def _group_twin_tests(items) -> None:
    """Run the tests that need a site twin (the ``twins`` fixture) one after the other, grouped
    by site in the order of :data:`twins.SITES` (tests of no one site last), each group in
    collection order, where the first of them was: each twin then comes up once per run
    (:class:`twins.Twins`), whichever file its tests are in."""
    at = [i for i, item in enumerate(items) if "twins" in item.fixturenames]
    if not at:
        return
    from twins import SITES
    group = [items[i] for i in at]

    def site_of(item) -> int:
        site = getattr(item.cls, "site", None) if item.cls else None
        return SITES.index(site) if site in SITES else len(SITES)

    group.sort(key=site_of)  # stable: collection order within a site
    rest = [item for i, item in enumerate(items) if i not in set(at)]
    items[:] = rest[:at[0]] + group + rest[at[0]:]


@pytest.fixture(scope="session")
def twins(request):
    """The site twins' manager (:class:`twins.Twins`) for the whole run: one twin up at a time,
    localhost's Slurm down meanwhile; closed (the twin down, localhost's Slurm back as it was)
    after the last test that needs it (:func:`pytest_runtest_teardown`). Skips, saying why,
    when not root or when a twin's binaries are missing."""
    from twins import BINARIES, Twins

    if os.geteuid() != 0:
        pytest.skip("needs root: the twins start Slurm, MariaDB and namespaces")
    missing = [b for b in BINARIES if which_sbin(b) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}; run `scripts/site-twin install` as root")
    manager = Twins(localhost_slurm)
    request.config._hpcstack_twins = manager
    try:
        yield manager
    finally:
        manager.close()


def pytest_runtest_teardown(item, nextitem):
    """After the last test of a run of tests that need a twin, close the twins' manager (the
    twin down, localhost's Slurm back) before the next test, which may need localhost's Slurm."""
    manager = getattr(item.config, "_hpcstack_twins", None)
    if manager is not None and "twins" in item.fixturenames and (nextitem is None or "twins" not in nextitem.fixturenames):
        manager.close()


@pytest.fixture(scope="session")
def ordinary_user() -> str:
    """An ordinary login account, ``hpcstack-user`` (bash, a home), made once for the whole run
    by whichever test needs it first, and kept (later runs reuse it): tests run login shells and
    jobs as it. Skips, saying why, when not root or without runuser."""
    import pwd

    if os.geteuid() != 0:
        pytest.skip("running shells as another user needs root (runuser)")
    if not shutil.which("runuser"):
        pytest.skip("runuser missing (util-linux)")
    try:
        pwd.getpwnam(ORDINARY_USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--comment",
                        "hpcstack user (tests)", ORDINARY_USER], check=True)
    return ORDINARY_USER


#: The ordinary account of :func:`ordinary_user`.
ORDINARY_USER = "hpcstack-user"


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _in_ci() -> bool:
    return os.environ.get("CI") == "true"


def _fail_skip_in_ci(report) -> None:
    """Under ``CI=true``, turn a skip whose reason is not in :data:`ALLOWED_SKIPS` into a failure."""
    if not _in_ci() or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if not reason.startswith(ALLOWED_SKIPS):
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI, where nothing may skip but {ALLOWED_SKIPS} "
                           f"(tests/conftest.py ALLOWED_SKIPS): {reason}")


def _fail_xfail_in_ci(report, call) -> None:
    """Under ``CI=true``, turn an expected failure into a failure: an ``xfail`` marker whose test
    fails (XFAIL) or passes (XPASS), and a ``pytest.xfail()`` call. A known defect is fixed, or
    its test is removed with the reason in the commit; CI does not carry it as green."""
    if not _in_ci() or not hasattr(report, "wasxfail"):
        return
    reason = report.wasxfail
    del report.wasxfail  # else the terminal reports it as XFAIL/XPASS whatever the outcome
    called = call.excinfo is not None and call.excinfo.errisinstance(pytest.xfail.Exception)
    state = "called pytest.xfail()" if called else "passed" if report.passed else "failed"
    report.outcome = "failed"
    report.longrepr = (f"xfail in CI, where an expected failure is a failure (tests/conftest.py): "
                       f"the test {state}; xfail reason: {reason or '(none given)'}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    _fail_xfail_in_ci(report, call)
    _fail_skip_in_ci(report)


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


#: The Python (X.Y) of the interpreter that runs the tests: the one the localhost sites' base
#: module gives (scripts/localhost-setup writes python/X.Y for the machine's Python, and
#: scripts/run-tests runs the tests in an environment of that Python). A unit test's site states
#: it (``python: {version: X.Y}``), so that planning (``install --dry-run``, the exports) loads no
#: module and needs neither a module tool nor /opt/hpcstack/base-modulefiles.
TEST_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def unit_site(base: str = "localhost", *, name: str | None = None, roots: Path | None = None,
              **changes) -> dict:
    """A unit test's copy of the installed package's site config ``base`` (a dict): it states its
    Python version (:data:`TEST_PYTHON`, unless ``base`` states one), so that a plan of it loads
    no module.

    Args:
        base (str): a built-in site config (``site-configs/<base>.yaml`` of the installed data).
        name (str | None): the copy's ``name`` (default: ``base``).
        roots (Path | None): its install and module roots go to ``roots/software`` and
            ``roots/modulefiles``, so that stacks the machine holds do not change what it sees.
        **changes: top-level keys to set.

    Raises:
        FileNotFoundError: no such built-in site.
    """
    from hpcstack import data_root

    data = yaml.safe_load((data_root() / "site-configs" / f"{base}.yaml").read_text())
    data["name"] = name or base
    data.setdefault("python", {}).setdefault("version", TEST_PYTHON)
    if roots is not None:
        data["install_root"] = str(roots / "software")
        data["module_root"] = str(roots / "modulefiles")
    data.update(changes)
    return data


def site_overlay(repo: Path, base: str = "localhost", **kwargs) -> Path:
    """A repository (for ``--repo`` or ``HPCSTACK_PATH``) at ``repo`` holding the
    :func:`unit_site` copy of ``base`` under the same name, so that ``--site <name>`` means the
    copy, which loads no module. Returns ``repo``; keyword arguments go to :func:`unit_site`."""
    data = unit_site(base, **kwargs)
    (repo / "site-configs").mkdir(parents=True, exist_ok=True)
    (repo / "site-configs" / f"{data['name']}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return repo


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


def gpu_sites() -> list[str]:
    """The shipped sites with GPU jobs: each ``site-configs/<name>.yaml`` of the package under test
    (``hpcstack.data_root()``, what ``--site <name>`` finds) whose ``slurm.gpus_per_node`` is above
    0 and whose toolchain has CUDA, by name. A config that does not load is left out here:
    tests/test_site.py names its problems. The tests of the GPU recipes' dry runs and golden files
    (tests/test_gpu_sites.py, test_jax.py, test_mpi4py.py, test_pytorch_next_exports.py) take their
    sites from here, so a new site needs no line in them (docs/admin/new-site.md, "Golden files")."""
    from hpcstack import data_root
    from hpcstack.site import load_site

    names = []
    for path in sorted((Path(data_root()) / "site-configs").glob("*.yaml")):
        try:
            site = load_site(path.stem)
        except Exception:   # noqa: BLE001 - reported by tests/test_site.py, not at collection
            continue
        if site.toolchain.has_cuda and int((site.slurm or {}).get("gpus_per_node") or 0) > 0:
            names.append(path.stem)
    return names


@functools.lru_cache(maxsize=None)
def preflight_refusal(recipe: str, site: str) -> tuple[str, ...]:
    """What hpcstack says, before anything is written, against installing ``recipe`` on the
    shipped site ``site``: the lines of the refusal of ``install --dry-run`` (the GPU
    architectures of the locked wheels against ``toolchain.cuda.cc_list``, the CUDA they need
    against ``gpu.driver_version``), without ``error: ``; empty when the site fits the wheels.
    Asked in this process (the same :meth:`InstallService.dry_run` the command runs), so that a
    test can split the sites by the answer at collection."""
    from hpcstack.errors import ConfigError
    from hpcstack.install.service import InstallService
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    s = load_site(site)
    r = load_recipe(recipe, s)
    try:
        InstallService(s, r, r.file).dry_run()
    except ConfigError as exc:
        return tuple(exc.problems)
    return ()


#: The test files whose golden files are made per shipped GPU site (:func:`gpu_sites`), and the one
#: documented command that makes every golden file of a new site (docs/admin/new-site.md, "Golden
#: files"): it installs hpcstack from this checkout first, so the files are the checkout's output.
SITE_GOLDEN_TESTS = ("tests/test_gpu_sites.py", "tests/test_mpi4py.py", "tests/test_jax.py",
                     "tests/test_pytorch_next_exports.py")
REGENERATE = "HPCSTACK_UPDATE_GOLDEN=1 scripts/run-tests --quick " + " ".join(SITE_GOLDEN_TESTS)


def assert_site_golden(path: Path, got: str, site: str) -> None:
    """:func:`assert_golden` for a golden file of a shipped site: where the file is missing (a new
    site) and golden files are not being written, fail with :data:`REGENERATE` instead."""
    updating = os.environ.get("HPCSTACK_UPDATE_GOLDEN") == "1" and os.environ.get("CI") != "true"
    if not path.is_file() and not updating:
        pytest.fail(f"tests/golden/{path.name} is missing: site {site} (site-configs/{site}.yaml) has no "
                    f"golden file here yet. Make its golden files with `{REGENERATE}`, review them and commit "
                    "them with the site (docs/admin/new-site.md, \"Golden files\").", pytrace=False)
    assert_golden(path, got)
