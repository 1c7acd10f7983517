"""Execute a plan: steps in order, each logged, skipped when already done with the same inputs.

State lives in ``<prefix>/.hpcstack/``: ``steps/<name>.json`` records a completed step with the
hash of its inputs (:meth:`hpcstack.plan.Plan.step_hashes`), ``logs/<name>.log`` its output. A
re-run whose steps are all recorded with unchanged hashes does nothing and says so; a changed
input redoes that step and the ones after it (hashes chain). One install at a time per prefix:
``<install_root>/.hpcstack/locks/<name>-<version>.lock`` (``fcntl.flock``).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from . import __version__
from .errors import HpcstackError
from .plan import Plan, Step

console = Console(stderr=True, highlight=False)


class Runner:
    """Runs a :class:`Plan` in a build environment.

    Args:
        plan (Plan): the plan.
        env (dict[str, str]): the build environment (site modules loaded).
        stop_after (str | None): stop after this step (EasyBuild's ``--stop``).
        force (bool): redo every step even when recorded as done.

    Attributes:
        timings (dict[str, float]): seconds per step run in this invocation.
    """

    def __init__(self, plan: Plan, env: dict[str, str], stop_after: str | None = None,
                 force: bool = False):
        self.plan = plan
        self.env = {**env, **plan.env}
        self.stop_after = stop_after
        self.force = force
        self.dry_run = False
        self.log = None
        self.timings: dict[str, float] = {}
        self.state_dir = Path(plan.prefix) / ".hpcstack"

    # -- state
    def _record(self, step: Step) -> Path:
        return self.state_dir / "steps" / f"{step.name}.json"

    def is_done(self, step: Step, digest: str) -> bool:
        """True if ``step`` is recorded with ``digest`` and all its outputs exist."""
        try:
            rec = json.loads(self._record(step).read_text())
        except (OSError, ValueError):
            return False
        return rec.get("hash") == digest and all(os.path.exists(o) for o in step.outputs)

    def pending(self) -> list[str]:
        """Names of the steps that a run would do."""
        hashes = self.plan.step_hashes()
        out, redo = [], self.force
        for step in self.plan.steps:
            redo = redo or not self.is_done(step, hashes[step.name])
            if redo:
                out.append(step.name)
        return out

    # -- running
    def run(self) -> list[str]:
        """Run the pending steps.

        Returns:
            list[str]: the steps that ran (empty when the install was up to date).

        Raises:
            HpcstackError: the first failing step's error, with the step name and its log path.
        """
        todo = self.pending()
        if not todo:
            console.print(f"[green]{self.plan.title} is up to date[/] ({self.plan.prefix}); nothing to do")
            return []
        hashes = self.plan.step_hashes()
        (self.state_dir / "steps").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        names = [s.name for s in self.plan.steps]
        for name in names[names.index(todo[0]):]:  # forget this step and all after it
            self._record(self.plan.steps[names.index(name)]).unlink(missing_ok=True)
        ran = []
        for i, step in enumerate(self.plan.steps, 1):
            if step.name not in todo:
                console.print(f"[dim]==> [{i}/{len(names)}] {step.name}: done before, skipped[/]")
                continue
            self._run_step(step, i, len(names), hashes[step.name])
            ran.append(step.name)
            if step.name == self.stop_after:
                console.print(f"stopped after step {step.name} (--stop-after)")
                break
        return ran

    def _run_step(self, step: Step, index: int, total: int, digest: str) -> None:
        console.print(f"[bold]==> [{index}/{total}] {step.name}:[/] {step.description}")
        log_path = self.state_dir / "logs" / f"{step.name}.log"
        start = time.monotonic()
        with open(log_path, "w") as self.log:
            self.log.write(f"# hpcstack {__version__}: step {step.name} of {self.plan.title}\n")
            try:
                for action in step.actions:
                    action.execute(self)
            except HpcstackError as exc:
                tail = _tail(log_path)
                raise HpcstackError(f"{exc} (log: {log_path}){tail}", step=step.name) from None
            except KeyboardInterrupt:
                raise HpcstackError(f"interrupted; re-run to resume from this step (log: {log_path})",
                                    step=step.name) from None
        seconds = time.monotonic() - start
        self.timings[step.name] = seconds
        record = {"step": step.name, "hash": digest, "seconds": round(seconds, 1),
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hpcstack": __version__}
        tmp = self._record(step).with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(tmp, self._record(step))
        console.print(f"    {step.name} done in {seconds:.1f} s")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "\n  | " + "\n  | ".join(text) if text else ""


@contextmanager
def install_lock(install_root: str, name: str, version: str, wait: bool = True):
    """Hold the lock of one stack (one install at a time per prefix).

    Args:
        install_root (str): the site's install root.
        name, version (str): the stack.
        wait (bool): wait for another install to finish (with a message) or fail at once.

    Raises:
        HpcstackError: ``wait`` is False and another install holds the lock.
    """
    lock_dir = Path(install_root) / ".hpcstack" / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_dir / f"{name}-{version}.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                raise HpcstackError(f"another install of {name}/{version} is running (lock {path}); "
                                    "try again later")
            console.print(f"waiting for another install of {name}/{version} to finish (lock {path}) …")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
