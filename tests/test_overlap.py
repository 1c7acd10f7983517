"""What runs concurrently in an install: the sanity check's interpreter beside the step's
other checks, and the sources (fetch, unpack, patch) beside the venv and the wheels.

The runner's two renderings agree (the dry-run's ``&`` and ``wait`` against :func:`run_actions`),
a failure on either side stops the install with one line naming its step, and the next run
resumes. The tiny recipe's installs take about 10 s in all.
"""

from __future__ import annotations

import io
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import HPCSTACK, hpcstack, make_sdist, write_tiny_recipe
from hpcstack.errors import HpcstackError
from hpcstack.install.actions import Run, Unpack
from hpcstack.install.components.source import PrepareAhead
from hpcstack.install.plan import Step
from hpcstack.install.runner import StepContext, run_actions

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class BackgroundRun(Run):
    """A command that runs in the background of its step (as the sanity check's interpreter does)."""

    background: bool = True


def _run_both(actions: list, tmp_path: Path) -> tuple[str | None, str | None, str]:
    """Run ``actions`` with :func:`run_actions` and as the step's dry-run bash, each with its own
    directory in ``$D`` (commands run in ``/``, never the caller's directory: they ``cd "$D"``);
    return (the runner's error, the bash's stderr when it failed, the runner's log)."""
    step = Step("sanitycheck", "test", actions)
    runner_dir, bash_dir = tmp_path / "runner", tmp_path / "bash"
    runner_dir.mkdir()
    bash_dir.mkdir()
    log = open(tmp_path / "step.log", "w+")
    error = None
    try:
        run_actions(step.actions, StepContext({**os.environ, "D": str(runner_dir)}, log, None))
    except HpcstackError as exc:
        error = str(exc)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", step.to_bash()], env={**os.environ, "D": str(bash_dir)},
                          capture_output=True, text=True, timeout=60)
    log.close()
    return error, (proc.stderr or "failed") if proc.returncode else None, (tmp_path / "step.log").read_text()


def test_a_background_action_runs_beside_the_next_ones_and_the_step_waits_for_it(tmp_path):
    # the foreground check runs while the background one still sleeps: it sees no "done" yet
    actions = [BackgroundRun(("sh", "-c", 'cd "$D"; sleep 1; echo from-the-background; touch done')),
               Run(("sh", "-c", 'cd "$D"; test ! -e done && touch checked-before'))]
    error, bash_error, log = _run_both(actions, tmp_path)
    assert error is None and bash_error is None
    for side in ("runner", "bash"):
        assert (tmp_path / side / "done").is_file() and (tmp_path / side / "checked-before").is_file()
    assert "from-the-background" in log and "ran in the background" in log


def test_a_failing_background_action_fails_the_step_after_the_others_finished(tmp_path):
    actions = [BackgroundRun(("sh", "-c", "exit 3")), Run(("sh", "-c", 'cd "$D"; sleep 0.5; touch after'))]
    error, bash_error, _ = _run_both(actions, tmp_path)
    assert error and "exited with status 3" in error
    assert bash_error
    assert (tmp_path / "runner" / "after").is_file()  # the foreground finished first


def test_the_background_action_errs_first_when_both_fail(tmp_path):
    actions = [BackgroundRun(("sh", "-c", "sleep 0.3; exit 3")), Run(("sh", "-c", "exit 4"))]
    error, _, _ = _run_both(actions, tmp_path)
    assert error and "status 3" in error


def _sdist(tmp_path: Path) -> Path:
    return make_sdist(tmp_path)


@pytest.mark.parametrize("cached", [False, True])
def test_prepare_ahead_unpacks_only_when_no_wheel_is_cached_in_bash_as_in_python(tmp_path, cached):
    sdist = _sdist(tmp_path)
    trees = {}
    for side in ("python", "bash"):
        root = tmp_path / side / "cache"
        if cached:
            (root / "k").mkdir(parents=True)
            (root / "k" / "tinypkg-1.0-py3-none-any.whl").write_bytes(b"")
        src = tmp_path / side / "src"
        action = PrepareAhead(str(root), str(src / ".tinypkg-1.0.prepared"), (Unpack(str(sdist), str(src)),),
                              ("hpcstack build key v2", "package tinypkg 1.0"))
        if side == "python":
            action.execute(StepContext({}, io.StringIO(), None))
        else:
            env = {**os.environ, "PATH": f"{os.path.dirname(HPCSTACK[0])}:{os.environ['PATH']}"}
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", action.to_bash()], env=env,
                                  capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
        trees[side] = sorted(str(p.relative_to(src)) for p in src.rglob("*")) if src.exists() else None
        if not cached:
            assert (src / ".tinypkg-1.0.prepared").read_text().strip() == action.digest
    assert trees["python"] == trees["bash"]
    assert (trees["python"] is None) == cached


# --------------------------------------------------------------------------- real installs

def _args(root: Path) -> list[str]:
    return ["--site", "localhost", "--prefix", str(root / "sw"), "--module-root", str(root / "mf")]


@pytest.mark.integration
def test_the_dry_run_shows_the_sources_in_the_background(localhost_ready, tmp_path):
    recipe = write_tiny_recipe(tmp_path / "recipes", _sdist(tmp_path))
    proc = hpcstack("install", str(recipe), *_args(tmp_path), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    start, wait = script.index("\n(\n# --- step fetch:"), script.index('wait "$hpcstack_background"')
    assert script.index("# --- step patch:") < script.index("# --- end of the background\n) &\nhpcstack_background=$!")
    assert start < script.index("# --- step venv:") < script.index("# --- step wheels:") < wait
    assert wait < script.index("# --- step build:")
    assert "&\nhpcstack_sanitycheck_1=$!" in script and 'wait "$hpcstack_sanitycheck_1"' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.integration
def test_a_failed_fetch_in_the_background_stops_the_install_and_the_next_run_resumes(localhost_ready, tmp_path):
    sdist = _sdist(tmp_path)
    recipe = write_tiny_recipe(tmp_path / "recipes", sdist)
    away = sdist.rename(tmp_path / "elsewhere.tar.gz")  # the download fails while the venv is made
    proc = hpcstack("install", str(recipe), *_args(tmp_path))
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "step fetch:" in errors[0] and "cannot download" in errors[0], proc.stderr
    assert "fetch and patch in the background, while venv and wheels run" in proc.stderr
    assert "] build:" not in proc.stderr  # build waits for the sources: it never started
    assert not (tmp_path / "mf" / "tiny" / "1.0").exists()
    assert not os.path.lexists(tmp_path / "sw" / "tiny" / "1.0")
    away.rename(sdist)
    proc = hpcstack("install", str(recipe), *_args(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "mf" / "tiny" / "1.0").is_file()
    prefix = tmp_path / "sw" / "tiny" / "1.0"
    build_log = (prefix / ".hpcstack" / "logs" / "build.log").read_text()
    assert "unpacked and patched by the patch step" in build_log  # the tree the patch step made
    for step in ("fetch", "venv", "wheels", "patch", "build", "module"):
        assert (prefix / ".hpcstack" / "steps" / f"{step}.json").is_file()
    check = subprocess.run([str(prefix / "venv" / "bin" / "python"), "-c", "import tinypkg; assert tinypkg.PATCHED"])
    assert check.returncode == 0
