"""Fault injection on the tiny recipe (real venv, pip, patch, build, Environment Modules).

``kill -9`` at each step in turn and resume; the published stack and its module untouched while
a new build runs and dies; two installs at once; a tampered wheel; a full disk; bad input and
bad luck (missing module, missing compiler, no network, bad recipe, unknown site, wrong types).
Throughout, a watcher thread reads the modulefile every few milliseconds: whenever it exists,
the prefix it names must be a complete build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import HPCSTACK, NEUTRAL_DIR, REPO, bash_modules, hpcstack, make_sdist, wait_or_dump, write_tiny_recipe
from hpcstack.install.plan import STEP_ORDER

pytestmark = pytest.mark.integration

#: Steps killed from outside (SIGKILL to the whole process group, as a dropped session does),
#: each while held at a known moment: the build inside its build command (the tiny sdist's
#: ``setup.py`` waits, :func:`conftest.make_sdist`), the others at the runner's holding failpoint
#: (``HPCSTACK_FAILPOINT=STEP:N:hold:PATH``). The other steps are killed by the runner itself.
#: Nothing here waits for a log and hopes the step is still running: a held step cannot move on.
KILLED_FROM_OUTSIDE = ("venv", "wheels", "build")
#: Interrupted instead, held the same way: Ctrl-C (SIGINT to the process group, as a terminal
#: sends it) in the sanity check, and SIGTERM to the install alone (``kill PID``, ``timeout``, Slurm
#: at a job's time limit) in the install step; each ends with one line that says how to go on.
INTERRUPTED = {"sanitycheck": signal.SIGINT, "install": signal.SIGTERM}


class Tiny:
    """The tiny recipe in a temporary root: install it, start it in the background, load it."""

    def __init__(self, root: Path, site: str = "localhost", url: str | None = None):
        self.root = root
        #: the build's own failpoint: while this file exists, the sdist's build command holds
        self.build_hold = Hold(root / "hold-build")
        self.sdist = make_sdist(root, hold=self.build_hold.path)
        self.recipe = write_tiny_recipe(root / "recipes", self.sdist)
        if url:
            self.recipe.write_text(self.recipe.read_text().replace(self.sdist.as_uri(), url))
        self.args = ["--site", site, "--prefix", str(root / "sw"), "--module-root", str(root / "mf")]
        self.prefix = root / "sw" / "tiny" / "1.0"
        self.builds = root / "sw" / "tiny"  # the builds are .1.0-<id> beside the prefix
        self.state = root / "sw" / ".hpcstack" / "state" / "tiny-1.0.json"
        self.modulefile = root / "mf" / "tiny" / "1.0"
        self.patch = self.recipe.parent / "patches" / "tiny.patch"

    def install(self, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return hpcstack("install", str(self.recipe), *self.args, *extra, env=env)

    def start(self, *extra: str, env: dict | None = None, name: str = "run") -> subprocess.Popen:
        """Start an install in its own session; output goes to ``<root>/<name>.out`` / ``.err``."""
        out = open(self.root / f"{name}.out", "w")
        err = open(self.root / f"{name}.err", "w")
        return subprocess.Popen([*HPCSTACK, "install", str(self.recipe), *self.args, *extra],
                                stdout=out, stderr=err, cwd=NEUTRAL_DIR, env={**os.environ, **(env or {})},
                                start_new_session=True)

    def err(self, name: str = "run") -> str:
        return (self.root / f"{name}.err").read_text()

    def building(self) -> str | None:
        try:
            return json.loads(self.state.read_text())["building"]
        except (OSError, ValueError, KeyError):
            return None

    def set_patch(self, value: str) -> None:
        """Make the patch add ``PATCHED = <value>`` (and the recipe name its new sha256)."""
        old = hashlib.sha256(self.patch.read_bytes()).hexdigest()
        self.patch.write_text(re.sub(r"PATCHED = .*", f"PATCHED = {value}", self.patch.read_text()))
        new = hashlib.sha256(self.patch.read_bytes()).hexdigest()
        self.recipe.write_text(self.recipe.read_text().replace(old, new))

    def patched(self) -> str:
        """``tinypkg.PATCHED`` as the module gives it (a real ``module load``)."""
        proc = bash_modules(f"module use {self.root / 'mf'}; module load tiny/1.0 && "
                            "python -c 'import tinypkg; print(tinypkg.PATCHED)'")
        return proc.stdout.strip() or proc.stderr


class ModuleWatch(threading.Thread):
    """Reads the modulefile every 2 ms; whenever it exists, the prefix it names must resolve to a
    complete build (all steps before the module step recorded, the venv and tools there)."""

    def __init__(self, tiny: Tiny):
        super().__init__(daemon=True)
        self.tiny = tiny
        self.halt = threading.Event()
        self.seen = 0
        self.violations: list[str] = []

    def run(self) -> None:
        while not self.halt.is_set():
            self.check()
            time.sleep(0.002)

    def check(self) -> None:
        try:
            text = self.tiny.modulefile.read_text()
        except FileNotFoundError:
            return
        self.seen += 1
        if "/.1.0-" in text or str(self.tiny.prefix) not in text:
            self.violations.append(f"modulefile names something else than the prefix:\n{text}")
            return
        build = Path(os.path.realpath(self.tiny.prefix))
        needed = [build / ".hpcstack" / "steps" / "permissions.json", build / "venv" / "bin" / "python",
                  build / "bin" / "extend-venv-activate"]
        missing = [str(p) for p in needed if not p.exists()]
        if missing:
            self.violations.append(f"modulefile exists but {build} is incomplete: missing {missing}")

    def stop(self) -> "ModuleWatch":
        self.halt.set()
        self.join()
        return self


class Hold:
    """A failpoint that holds an install at a known moment until the test acts.

    ``arm()`` creates the file ``path``; the install, on reaching the moment (the runner's
    ``HPCSTACK_FAILPOINT=STEP:N:hold:PATH``, or the tiny sdist's build command), creates
    ``<path>.held`` and waits while ``path`` exists. ``held(proc)`` returns once it does (the
    install can no longer move on: the kill that follows lands there, on any machine load);
    ``release()`` removes both files.
    """

    def __init__(self, path: Path):
        self.path = path
        self.marker = path.with_name(path.name + ".held")

    def env(self, step: str, action: int) -> dict:
        """The runner's failpoint that holds ``step`` before its action ``action``."""
        return {"HPCSTACK_FAILPOINT": f"{step}:{action}:hold:{self.path}"}

    def arm(self) -> "Hold":
        self.release()
        self.path.touch()
        return self

    def held(self, proc: subprocess.Popen, what: str, err: str = "") -> None:
        """Return once the install ``proc`` is held; fail if it ended first (the 600 s are a
        safety net for a hung machine, not a guess at how long the step takes)."""
        _wait_for(lambda: self.marker.exists() or proc.poll() is not None, timeout=600, what=what)
        assert self.marker.exists() and proc.poll() is None, f"{what}: ended (exit {proc.poll()}) before it\n{err}"

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
        self.marker.unlink(missing_ok=True)


def _wait_for(predicate, timeout: float = 120, what: str = "") -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def _failpoint_index(tiny: Tiny) -> dict[str, int]:
    """Per step, the action before which the failpoint kills: the second one (after the
    prefix switch in the module step), or the only one."""
    proc = tiny.install("--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    return {s["name"]: min(1, len(s["actions"]) - 1) for s in json.loads(proc.stdout)["steps"]}


# --------------------------------------------------------------------------------- kill -9

def test_kill_9_at_each_step_in_turn_then_resume(localhost_ready, tmp_path):
    """One install, killed in each step in turn (Ctrl-C in the sanity check), each re-run
    resuming the last; then a run that completes. The modulefile is watched throughout."""
    tiny = Tiny(tmp_path)
    index = _failpoint_index(tiny)
    assert [s for s in STEP_ORDER if s in index] == list(index)
    watch = ModuleWatch(tiny)
    watch.start()
    killed_mid_step = []
    hold = Hold(tmp_path / "hold-step")
    for step in index:
        if step in (*KILLED_FROM_OUTSIDE, *INTERRUPTED):
            if step == "build":  # inside the build command itself
                held = tiny.build_hold.arm()
                proc = tiny.start(name=step)
            else:
                held = hold.arm()
                proc = tiny.start(name=step, env=hold.env(step, index[step]))
            held.held(proc, f"step {step} held", tiny.err(step))
            if INTERRUPTED.get(step) == signal.SIGTERM:
                os.kill(proc.pid, signal.SIGTERM)
            else:
                os.killpg(proc.pid, INTERRUPTED.get(step, signal.SIGKILL))
        else:
            proc = tiny.start(name=step, env={"HPCSTACK_FAILPOINT": f"{step}:{index[step]}"})
        if step in INTERRUPTED:  # one line that says how to go on
            how = "" if INTERRUPTED[step] == signal.SIGINT else f" ({INTERRUPTED[step].name})"
            assert wait_or_dump(proc, 300) == 1, tiny.err(step)
            assert f"error: step {step}: interrupted{how}; re-run to resume from this step" in tiny.err(step)
        else:
            assert wait_or_dump(proc, 300) == -signal.SIGKILL, tiny.err(step)
        hold.release()
        tiny.build_hold.release()
        build = tiny.builds / f".1.0-{tiny.building()}"
        if not (build / ".hpcstack" / "steps" / f"{step}.json").exists():
            killed_mid_step.append(step)
        if step != "module":
            assert not os.path.lexists(tiny.prefix), f"published before the module step (killed in {step})"
            assert not tiny.modulefile.exists()
        assert "Traceback" not in tiny.err(step)
    # the module step was killed after switching the prefix link, before writing the modulefile
    assert os.path.realpath(tiny.prefix) == str(build) and not tiny.modulefile.exists()
    assert {*KILLED_FROM_OUTSIDE, *INTERRUPTED} <= set(killed_mid_step), killed_mid_step
    assert "module" in killed_mid_step
    final = tiny.install()
    watch.stop()
    assert final.returncode == 0, final.stderr
    for step in index:
        if step != "module":
            assert f"] {step}: done before, skipped" in final.stderr
    assert "] module: publish" in final.stderr
    assert tiny.patched() == "True"
    assert watch.violations == [] and watch.seen > 0, watch.violations[:3]
    assert json.loads(tiny.state.read_text())["building"] is None


def test_a_new_build_leaves_the_published_stack_alone_until_it_is_complete(localhost_ready, tmp_path):
    tiny = Tiny(tmp_path)
    assert tiny.install().returncode == 0
    first = os.path.realpath(tiny.prefix)
    watch = ModuleWatch(tiny)
    watch.start()
    # a changed patch needs a new build; kill it inside its build command
    tiny.set_patch("2")
    tiny.build_hold.arm()
    proc = tiny.start()
    tiny.build_hold.held(proc, "the new build's build command", tiny.err())
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    tiny.build_hold.release()
    new = tiny.builds / f".1.0-{tiny.building()}"
    assert str(new) != first and os.path.realpath(tiny.prefix) == first
    assert tiny.patched() == "True"  # the published stack and its module, untouched and usable
    # change the input again while the build is unfinished: that step and the later ones only
    tiny.set_patch("3")
    res = tiny.install()
    assert res.returncode == 0, res.stderr
    assert f"resuming build {new.name.removeprefix('.1.0-')}" in res.stderr
    for step in ("fetch", "venv", "wheels"):
        assert f"] {step}: done before, skipped" in res.stderr
    assert "] patch: " in res.stderr and "] build: " in res.stderr
    assert os.path.realpath(tiny.prefix) == str(new) and tiny.patched() == "3"
    assert os.path.isdir(first)  # the build it replaced is kept (running jobs, rollback); see test_layout
    watch.stop()
    assert watch.violations == [] and watch.seen > 100, watch.violations[:3]


# ---------------------------------------------------------------------------------- locking

def test_two_concurrent_installs_one_waits_one_fails_at_once(localhost_ready, tmp_path):
    tiny = Tiny(tmp_path)
    # the first install is held in its venv step, holding its lock, until both others have
    # come (the hold is its only difference: all three make the same plan)
    hold = Hold(tmp_path / "hold-first").arm()
    first = tiny.start(name="first", env=hold.env("venv", 0))
    hold.held(first, "the first install", tiny.err("first"))
    busy = tiny.install("--no-wait")
    assert busy.returncode == 1
    assert f"another install of tiny/1.0 is running (process {first.pid})" in busy.stderr
    second = tiny.start(name="second")
    _wait_for(lambda: "waiting for another install" in tiny.err("second") or second.poll() is not None,
              timeout=600, what="the second install to wait")
    assert second.poll() is None, tiny.err("second")
    hold.release()
    assert first.wait(timeout=300) == 0, tiny.err("first")
    assert second.wait(timeout=300) == 0, tiny.err("second")
    assert "up to date" in tiny.err("second")
    assert tiny.patched() == "True"


# -------------------------------------------------------------------------------- integrity

def test_a_tampered_wheel_is_refused_with_both_hashes(localhost_ready, tmp_path):
    tiny = Tiny(tmp_path)
    lock = tiny.recipe.parent / "1.0.pypi.lock"
    text = lock.read_text()
    good = "1e61c37477a1626458e36f7b1d82aa5c9b094fa4802892072e49de9c60c4c926"
    bad = "0" * 64
    # six: one hash, not its wheel's (as if the file on the index had been replaced)
    text = re.sub(r"six==1\.16\.0 \\\n(\s+--hash=\S+ \\\n)*\s+--hash=\S+\n", f"six==1.16.0 \\\\\n    --hash=sha256:{bad}\n", text)
    assert bad in text and good not in text
    lock.write_text(text)
    res = tiny.install()
    assert res.returncode == 1
    line = next(l for l in res.stderr.splitlines() if l.startswith("error:"))
    assert "step wheels: sha256 mismatch for six" in line and bad in line
    assert re.search(r"got [0-9a-f]{64}", line) and "refusing it" in line, line
    assert not os.path.lexists(tiny.prefix) and not tiny.modulefile.exists()


# ------------------------------------------------------------------------------- full disk

@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs (root only): less than the tiny stack needs (about 12 MiB with its uv cache,
    which it hard-links from: a uv site's venv has no pip)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_a_full_disk_gives_one_clear_line_and_publishes_nothing(localhost_ready, tmp_path, small_tmpfs):
    tiny = Tiny(tmp_path)
    args = ["--prefix", str(small_tmpfs / "sw")]
    res = hpcstack("install", str(tiny.recipe), "--site", "localhost", *args, "--module-root", str(tmp_path / "mf"))
    assert res.returncode == 1, res.stderr
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr
    assert "No space left on device" in errors[0] and "free space" in errors[0] and "--prefix" in errors[0]
    assert re.match(r"error: step \w+: ", errors[0]), errors[0]
    assert not (tmp_path / "mf" / "tiny").exists()
    assert not os.path.lexists(small_tmpfs / "sw" / "tiny" / "1.0")


# ------------------------------------------------------------------------ bad input, bad luck

def _site(tmp_path: Path, change) -> str:
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    change(data)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _set(path: str, value):
    def change(data):
        node = data
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return change


BAD = {
    # name: (site change, recipe tweak, expected exit status, text of the one line)
    "missing base module": (_set("modules.base", "nonexistent/0.0"), None, 1, "module load nonexistent/0.0 failed"),
    "missing compiler": (_set("build.env", {"CC": "nonexistent-cc"}), None, 2, "compiler CC=nonexistent-cc not found"),
    "wrong types": (_set("build.jobs", "two"), None, 2, "build.jobs: 'two' is not of type"),
    "world-writable mode": (_set("permissions", {"group": None, "mode": "o+w"}), None, 2,
                            "permissions.mode: 'o+w' makes the stack world-writable"),
    "unknown group": (_set("permissions", {"group": "no-such-group-x", "mode": None}), None, 2,
                      "permissions.group: no group 'no-such-group-x' on this machine"),
    "no network": (None, "url", 1, "step fetch: cannot download http://127.0.0.1:9/tinypkg-1.0.tar.gz"),
    "recipe syntax error": (None, "syntax", 2, "syntax error in recipe"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_and_bad_luck_give_one_clear_line_and_write_nothing(localhost_ready, tmp_path, case):
    change, tweak, status, text = BAD[case]
    tiny = Tiny(tmp_path, url="http://127.0.0.1:9/tinypkg-1.0.tar.gz" if tweak == "url" else None)
    if tweak == "syntax":
        tiny.recipe.write_text(tiny.recipe.read_text().replace("def recipe(site):", "def recipe(site)"))
    site = _site(tmp_path, change) if change else "localhost"
    res = hpcstack("install", str(tiny.recipe), "--site", site, "--prefix", str(tmp_path / "sw"),
                   "--module-root", str(tmp_path / "mf"))
    assert res.returncode == status, res.stderr
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and text in errors[0], res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "mf").exists()
    if status == 2 or case == "missing base module":  # refused before anything was written
        assert not (tmp_path / "sw").exists()
    else:  # a failed step: the build is kept for a resume, nothing published
        assert not os.path.lexists(tmp_path / "sw" / "tiny" / "1.0")


def test_a_missing_horovod_compiler_is_named_before_anything_is_fetched(localhost_ready, tmp_path):
    site = _site(tmp_path, _set("toolchain.cc", "nonexistent-cc"))
    res = hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--prefix", str(tmp_path / "sw"),
                   "--module-root", str(tmp_path / "mf"))
    assert res.returncode == 2, res.stderr
    assert "step build: compiler CC=nonexistent-cc not found" in res.stderr and "toolchain.cc" in res.stderr
    assert not (tmp_path / "sw").exists() and not (tmp_path / "mf").exists()


def test_a_missing_patch_inside_the_cached_build_is_named_before_anything_is_written(localhost_ready, tmp_path):
    """``patch`` runs only nested: in the patch step's unpack ahead (no wheel cached)
    and inside the cached source build (on a cache miss); the preflight sees nested commands, so
    an install on a machine without it stops at once, exit 2, one line naming the first step."""
    shadow = tmp_path / "bin"  # the machine's commands, but no patch
    shadow.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory) or os.path.realpath(directory) == str(shadow):
            continue
        for name in os.listdir(directory):
            target = os.path.join(directory, name)
            if name != "patch" and not (shadow / name).exists() and os.access(target, os.X_OK):
                (shadow / name).symlink_to(target)
    tiny = Tiny(tmp_path)
    res = tiny.install(env={"PATH": str(shadow)})
    assert res.returncode == 2, res.stderr
    errors = [l for l in res.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and "step patch: command 'patch' not found" in errors[0], res.stderr
    assert not (tmp_path / "sw").exists() and not (tmp_path / "mf").exists()


def test_an_unknown_site_is_one_line(tmp_path):
    res = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "nowhere", "--prefix", str(tmp_path / "sw"))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and "unknown site 'nowhere'" in res.stderr
    assert not (tmp_path / "sw").exists()


# ------------------------------------------------------------ kill -9 at many moments of each step

class SlowServer:
    """Serves one file over HTTP on loopback. Armed (:meth:`arm`), it sends half of the body,
    says so (``sent_half``) and holds the rest until :meth:`release`: a download that a kill cuts
    short at a moment the test knows."""

    def __init__(self, path: Path):
        import http.server

        data, outer = path.read_bytes(), self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server interface
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                if outer.armed.is_set():
                    outer.sent_half.set()
                    outer.released.wait(600)
                try:
                    self.wfile.write(data[len(data) // 2:])
                except OSError:  # the client was killed meanwhile
                    pass

            def log_message(self, *args):
                pass

        self.armed, self.sent_half, self.released = threading.Event(), threading.Event(), threading.Event()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/{path.name}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def arm(self) -> None:
        self.released.clear()
        self.sent_half.clear()
        self.armed.set()

    def release(self) -> None:
        self.armed.clear()
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()


def _root_glob(tiny: Tiny, pattern: str) -> list[Path]:
    return list((tiny.root / "sw").glob(pattern))


def _missing_record_files(build: Path) -> list[str]:
    """Files that the venv's installed packages list in their RECORD but that are not there."""
    missing = []
    for sp in build.glob("venv/lib/python3*/site-packages"):
        for record in sp.glob("*.dist-info/RECORD"):
            for line in record.read_text().splitlines():
                name = line.split(",")[0]
                if name and not name.endswith(".pyc") and not os.path.lexists(sp / name):
                    missing.append(f"{record.parent.name}: {name}")
    return missing


def _remove_a_recorded_file(sp: Path, package: str) -> None:
    """Remove one ``.py`` file that ``package``'s RECORD lists (``six.py`` for six: ``import six``
    then fails), as a kill between its ``.dist-info`` and its files leaves it."""
    for record in sorted(sp.glob(f"{package}-*.dist-info/RECORD")):
        for line in record.read_text().splitlines():
            name = line.split(",")[0]
            if name.endswith(".py") and ".dist-info/" not in name and (sp / name).exists():
                (sp / name).unlink()
                return


#: Per step, the moment of a kill from outside (SIGKILL to the process group), each held until
#: the kill: the download with half its body sent (:class:`SlowServer`), the build inside its
#: build command (the sdist's ``setup.py``), and wheels and install after their last action, before
#: the step is recorded, where the test then removes one file of a package whose ``.dist-info``
#: stays: the state a kill inside uv leaves, between a ``.dist-info`` and its files.
OUTSIDE = {
    "fetch": "a partial download",
    "wheels": "a package's .dist-info without all its files",
    "build": "the source build running",
    "install": "the built package's .dist-info without all its files",
}


def _moments(step: str, actions: int) -> list[tuple[str, str | int]]:
    """Three or more moments to kill ``step``: from outside, held at the moment of :data:`OUTSIDE`
    (where it has one), before its first action, between two actions, and after its
    last action but before the step is recorded."""
    out: list[tuple[str, str | int]] = [("outside", step)] if step in OUTSIDE else []  # first: a real first try
    out.append(("failpoint", 0))
    if actions > 1:
        out.append(("failpoint", 1))
    out.append(("failpoint", actions))  # all done, not recorded
    return out


def test_kill_9_at_three_moments_of_every_step_then_a_plain_rerun_gives_a_correct_stack(localhost_ready, tmp_path):
    """Each step is killed at three or more moments in turn (one run per moment, each resuming
    the last), among them a download cut in half and a source build killed inside its command,
    each held there until the kill, and the state a kill inside uv leaves (a package's
    ``.dist-info`` without all its files); then a plain re-run. The stack must be complete and correct: every file that the
    venv's packages record is there, the imports work, the module loads."""
    tiny = Tiny(tmp_path)
    server = SlowServer(tiny.sdist)  # the recipe's own sdist, served slowly
    tiny.recipe.write_text(tiny.recipe.read_text().replace(tiny.sdist.as_uri(), server.url))
    try:
        steps = {s["name"]: len(s["actions"]) for s in json.loads(tiny.install("--dry-run", "--json").stdout)["steps"]}
        hits = []
        hold = Hold(tmp_path / "hold-moment")
        for step, actions in steps.items():
            for kind, where in _moments(step, actions):
                if kind == "failpoint":
                    proc = tiny.start(name="moment", env={"HPCSTACK_FAILPOINT": f"{step}:{where}"})
                else:
                    label = OUTSIDE[step]
                    if step == "fetch":  # the source cache is re-used: make the run download again
                        for cached in (tmp_path / "sw" / ".hpcstack" / "cache" / "sources").glob("*.tar.gz"):
                            cached.unlink()
                        server.arm()
                        proc = tiny.start(name="moment")
                        _wait_for(lambda: server.sent_half.is_set() or proc.poll() is not None, timeout=600,
                                  what=label)
                        # the client waits for the rest, its partial file open (it writes whole chunks)
                        _wait_for(lambda: _root_glob(tiny, ".hpcstack/cache/sources/.part-*") or proc.poll() is not None,
                                  timeout=600, what=label)
                        assert proc.poll() is None, f"{label}: the install ended\n{tiny.err('moment')}"
                    elif step == "build":
                        tiny.build_hold.arm()
                        proc = tiny.start(name="moment")
                        tiny.build_hold.held(proc, label, tiny.err("moment"))
                    else:
                        hold.arm()
                        proc = tiny.start(name="moment", env=hold.env(step, actions))
                        hold.held(proc, label, tiny.err("moment"))
                    os.killpg(proc.pid, signal.SIGKILL)
                rc = proc.wait(timeout=300)
                server.release()
                hold.release()
                tiny.build_hold.release()
                assert rc == -signal.SIGKILL, f"{step} {kind} {where}: exit {rc}\n{tiny.err('moment')}"
                build = tiny.builds / f".1.0-{tiny.building()}"
                recorded = (build / ".hpcstack" / "steps" / f"{step}.json").exists()
                assert kind == "failpoint" or not recorded, f"{step}: recorded although killed while held"
                if step in ("wheels", "install") and kind == "outside":
                    # the state uv leaves when a kill falls between a .dist-info and its files
                    # (six.py is what `import six` needs; tinypkg's __init__.py, `import tinypkg`)
                    sp = next(build.glob("venv/lib/python3*/site-packages"))
                    _remove_a_recorded_file(sp, "tinypkg" if step == "install" else "six")
                    assert _missing_record_files(build), "no package half-installed to resume from"
                if not recorded:
                    hits.append(f"{step}:{where}")
                if step != "module":
                    assert not os.path.lexists(tiny.prefix) and not tiny.modulefile.exists(), f"{step}:{where}"
                assert "Traceback" not in tiny.err("moment")
        final = tiny.install()
        assert final.returncode == 0, final.stderr
    finally:
        server.close()
    build = Path(os.path.realpath(tiny.prefix))
    assert _missing_record_files(build) == []
    assert tiny.patched() == "True"
    proc = bash_modules(f"module use {tmp_path / 'mf'}; module load tiny/1.0 && python -c 'import six, setuptools, wheel'")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(tiny.state.read_text())["building"] is None
    # every step was cut short at least three times (the moment after its last action included)
    for step in steps:
        assert sum(h.startswith(step + ":") for h in hits) >= 3, (step, hits)
    print(f"moments killed: {len(hits)}")
