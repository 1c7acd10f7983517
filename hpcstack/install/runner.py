"""Execute a plan: steps in order, each logged, skipped when already done with the same inputs.

State lives in the build's ``.hpcstack/`` (``<stage prefix>/.hpcstack``, see
:mod:`hpcstack.install.layout`): ``steps/<name>.json`` records a completed step with the hash of its
inputs (:meth:`hpcstack.install.plan.Plan.step_hashes`), ``logs/<name>.log`` its output. A re-run whose
steps are all recorded with unchanged hashes does nothing and says so; a changed input redoes
that step and the ones after it (hashes chain). A step is recorded only once it has finished,
and the record is written atomically, so a ``kill -9`` at any moment leaves a build that the
next run resumes from the step that was cut short.

What runs at once: the steps of :data:`~hpcstack.install.plan.BACKGROUND_STEPS`
(fetch, patch: the sources) run in a background thread while venv and wheels run, and build
waits for them (:meth:`Runner.run`); inside a step, an action marked ``background`` (the sanity
check's interpreter) runs while the step's other actions do (:func:`run_actions`). Each step keeps
its own log and record, so resuming works as above.

One install at a time per stack: ``<install_root>/.hpcstack/locks/<name>-<version>.lock``
(``fcntl.flock``; the kernel drops it when the holder dies, even by ``kill -9``).

Fault injection for tests (:class:`Failpoint`): ``HPCSTACK_FAILPOINT=STEP:N`` makes the runner
kill itself with SIGKILL just before action ``N`` (0-based) of step ``STEP``, e.g. ``module:1``
between the switch of the prefix link and the writing of the modulefile; ``N`` equal to the
number of the step's actions kills once they have all finished, before the step is recorded.
``HPCSTACK_FAILPOINT=STEP:N:hold:PATH`` holds the step there instead: the runner creates
``PATH.held`` and waits as long as ``PATH`` exists, so that a test can kill or interrupt the
install from outside at a moment it knows, whatever the machine's load (no race with the step).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from hpcstack import __version__
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import open_dir_no_follow
from hpcstack.install.actions import describe_os_error, expand, walk_commands
from hpcstack.install.plan import REDO_WITH, Plan, Step

console = Console(stderr=True, highlight=False, soft_wrap=True)

#: Variables that name a compiler; the preflight check looks for their first word on PATH.
COMPILER_VARS = ("CC", "CXX", "FC", "F77", "F90", "MPICC", "MPICXX", "CUDACXX")


def _record_path(plan: Plan, step: Step) -> Path:
    return Path(plan.state_dir) / "steps" / f"{step.name}.json"


def is_done(plan: Plan, step: Step, digest: str) -> bool:
    """True if ``step`` of ``plan`` is recorded with ``digest`` and all its outputs exist."""
    try:
        rec = json.loads(_record_path(plan, step).read_text())
    except (OSError, ValueError):
        return False
    return (isinstance(rec, dict) and rec.get("hash") == digest
            and all(os.path.lexists(o) for o in step.outputs))


def pending_steps(plan: Plan, force: bool = False) -> list[str]:
    """Names of the steps a run of ``plan`` would do: the first step not done and all after it.

    A step of :data:`~hpcstack.install.plan.REDO_WITH` that has to run again (not recorded:
    never run, cut short, or its input changed) takes the step it names with it: the wheels
    step then installs into a new venv, never into one an interrupted installer left.

    Args:
        plan (Plan): the plan (its records are read from ``plan.state_dir``).
        force (bool): every step.
    """
    hashes = plan.step_hashes()
    names = [s.name for s in plan.steps]
    first = next((i for i, step in enumerate(plan.steps) if force or not is_done(plan, step, hashes[step.name])),
                 len(names))
    for i, name in enumerate(names):  # a step that runs again takes REDO_WITH's step with it
        if i >= first and REDO_WITH.get(name) in names:
            first = min(first, names.index(REDO_WITH[name]))
    return names[first:]


class Runner:
    """Runs a :class:`Plan` in a build environment.

    Args:
        plan (Plan): the plan.
        env (dict[str, str]): the build environment (site modules loaded).
        stop_after (str | None): stop after this step (EasyBuild's ``--stop``).
        force (bool): redo every step even when recorded as done.
        redactor (hpcstack.secrets.Redactor | None): the site's secret values, replaced in each
            step's log (what hpcstack and the step's commands write) and in the errors raised.

    Attributes:
        timings (dict[str, float]): seconds per step run in this invocation.
        state_dir (Path): ``<stage prefix>/.hpcstack``.
    """

    def __init__(self, plan: Plan, env: dict[str, str], stop_after: str | None = None,
                 force: bool = False, redactor=None):
        self.plan = plan
        self.redactor = redactor
        self.env = dict(env)
        self.stop_after = stop_after
        self.force = force
        self.timings: dict[str, float] = {}
        self.state_dir = Path(plan.state_dir)

    def pending(self) -> list[str]:
        """Names of the steps that a run would do."""
        return pending_steps(self.plan, self.force)

    # -- running
    def run(self) -> list[str]:
        """Run the pending steps.

        The pending steps of :data:`~hpcstack.install.plan.BACKGROUND_STEPS` (fetch, patch) run in
        a background thread while the steps between them (venv, wheels) run, and the step after
        them (build) waits for them (:meth:`Plan.overlap`); with ``stop_after`` every
        step runs in order. A failure on either side stops the run once the other side has
        finished the step it is in; the error raised is that of the earlier step in plan order.
        Each step is recorded when it finishes, so the next run resumes from the first step not
        recorded.

        Returns:
            list[str]: the steps that ran, in plan order (empty when the install was up to date).

        Raises:
            HpcstackError: the first failing step's error, with the step name and its log path.
        """
        todo = self.pending()
        if not todo:
            console.print(f"[green]{self.plan.title} is up to date[/] ({self.plan.prefix}); nothing to do")
            return []
        hashes = self.plan.step_hashes()
        try:
            (self.state_dir / "steps").mkdir(parents=True, exist_ok=True)
            (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
            names = [s.name for s in self.plan.steps]
            for name in names[names.index(todo[0]):]:  # forget this step and all after it
                _record_path(self.plan, self.plan.steps[names.index(name)]).unlink(missing_ok=True)
        except OSError as exc:
            raise HpcstackError(f"cannot prepare {self.state_dir}: {describe_os_error(exc)}") from None
        background, alongside, joined_by = ([], [], None) if self.stop_after else self.plan.overlap(todo)
        index = {name: i for i, name in enumerate(names, 1)}
        worker = None
        if background:
            console.print(f"[dim]==> {' and '.join(background)} in the background, while "
                          f"{' and '.join(alongside)} run[/]")
            worker = _Background(self, [s for s in self.plan.steps if s.name in background], index, hashes)
            worker.start()
        ran = []
        try:
            for i, step in enumerate(self.plan.steps, 1):
                if step.name not in todo:
                    console.print(f"[dim]==> [{i}/{len(names)}] {step.name}: done before, skipped[/]")
                    continue
                if step.name in background:
                    continue
                if worker and step.name == joined_by:
                    worker.finish()
                    ran += worker.ran
                    worker = None
                self._run_step(step, i, len(names), hashes[step.name])
                ran.append(step.name)
                if worker and worker.error:  # stop at once, not only when build waits
                    worker.finish()
                if step.name == self.stop_after:
                    console.print(f"stopped after step {step.name} (--stop-after)")
                    break
            if worker:
                worker.finish()
                ran += worker.ran
        except HpcstackError as exc:
            if worker:
                worker.cancel()
                worker.finish(raise_error=False)
                if worker.error and index[worker.error.step] < index.get(exc.step, len(names) + 1):
                    raise worker.error from None
            raise
        finally:  # in plan order, whichever thread finished first
            self.timings = {n: self.timings[n] for n in names if n in self.timings}
        return sorted(ran, key=index.get)

    def _open_state_file(self, sub: str, name: str, flags: int) -> int:
        """Open ``name`` in the build's state directory's ``sub`` (``logs``, ``steps``) with no
        link followed from the state directory down (:func:`hpcstack.fsutil.open_dir_no_follow`,
        then ``O_NOFOLLOW`` relative to its descriptor): where the site's stack group may write
        the build, a member's link at a log's name, or at ``logs`` itself, is refused (``ELOOP``),
        never written through.

        Args:
            sub (str): the directory below :attr:`state_dir`.
            name (str): the file's name in it.
            flags (int): :func:`os.open` flags (``O_NOFOLLOW``, ``O_CLOEXEC`` added); mode 0644.

        Returns:
            int: the file's descriptor; the caller closes it.

        Raises:
            OSError: a link on the way or at the name (``ELOOP``), or the file cannot be opened.
        """
        directory = open_dir_no_follow(self.state_dir / sub, self.state_dir)
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory)
        finally:
            os.close(directory)

    def _run_step(self, step: Step, index: int, total: int, digest: str) -> None:
        console.print(f"[bold]==> [{index}/{total}] {step.name}:[/] {step.description}")
        log_path = self.state_dir / "logs" / f"{step.name}.log"
        start = time.monotonic()
        failpoint = _failpoint(step.name)
        try:
            with os.fdopen(self._open_state_file("logs", log_path.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                           "w") as raw:
                log = self.redactor.stream(raw) if self.redactor else raw  # hpcstack.secrets, rule 1
                try:
                    ctx = StepContext(self.env, log, self.state_dir)
                    log.write(f"# hpcstack {__version__}: step {step.name} of {self.plan.title}\n")
                    log.write(f"# started {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
                    log.flush()
                    run_actions(step.actions, ctx, failpoint)
                finally:
                    if log is not raw:
                        log.close()
        except HpcstackError as exc:
            reason = diagnose(_read(log_path)) or full_filesystem(self._written_paths(step))
            if reason:
                raise HpcstackError(f"{reason} (log: {log_path})", step=step.name) from None
            tail = _tail(log_path) if "exited with status" in str(exc) else ""  # a command's own words
            raise HpcstackError(f"{exc} (log: {log_path}){tail}", step=step.name) from None
        except OSError as exc:
            raise HpcstackError(f"{describe_os_error(exc)} (log: {log_path})", step=step.name) from None
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (hpcstack.cli.install_stop_handlers)
            how = f" ({exc.args[0]})" if exc.args and str(exc.args[0]).startswith("SIG") else ""
            raise HpcstackError(f"interrupted{how}; re-run to resume from this step (log: {log_path})",
                                step=step.name) from None
        seconds = time.monotonic() - start
        self.timings[step.name] = seconds
        record = {"step": step.name, "hash": digest, "seconds": round(seconds, 1),
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hpcstack": __version__}
        path = _record_path(self.plan, step)
        tmp = path.with_suffix(".tmp")
        try:
            steps = open_dir_no_follow(path.parent, self.state_dir)
            try:
                try:
                    os.unlink(tmp.name, dir_fd=steps)       # a leftover, or a link: the name itself
                except FileNotFoundError:
                    pass
                fd = os.open(tmp.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=steps)
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(record, indent=1) + "\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp.name, path.name, src_dir_fd=steps, dst_dir_fd=steps)
                os.fsync(steps)
            finally:
                os.close(steps)
        except OSError as exc:
            raise HpcstackError(f"cannot record the step: {describe_os_error(exc)}", step=step.name) from None
        console.print(f"    {step.name} done in {seconds:.1f} s")


    def _written_paths(self, step: Step) -> list[str]:
        """Directories the step writes to: the build, and those of its actions' outputs."""
        return [self.plan.build_prefix, *(os.path.dirname(o) for a in step.actions for o in a.outputs())]


def full_filesystem(paths: list[str], min_free: int = 1 << 20) -> str | None:
    """Return one line naming a full filesystem among those holding ``paths``, else None.

    A tool that fails on a full disk does not always say so (``python -m venv`` reports only
    that ``ensurepip`` failed), so after a failure the runner looks at the free space itself.

    Args:
        paths (list[str]): files or directories (the nearest existing parent is checked).
        min_free (int): bytes below which a filesystem counts as full (default 1 MiB).
    """
    seen = set()
    for path in paths:
        while path and not os.path.exists(path):
            path = os.path.dirname(path)
        try:
            st = os.statvfs(path)
        except OSError:
            continue
        if st.f_fsid in seen:
            continue
        seen.add(st.f_fsid)
        free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        if size and free < min_free:
            return (f"No space left on device: the filesystem of {path} is full ({free >> 10} KiB free of "
                    f"{size >> 20} MiB); free space there, or install elsewhere with --prefix; re-running "
                    "resumes from the step that failed")
    return None


@dataclass(frozen=True)
class Failpoint:
    """Where a test stops an install (``HPCSTACK_FAILPOINT``, tests only; see the module's text).

    Attributes:
        index (int): the action (0-based) before which it acts; the number of the step's actions
            means "after the last one, before the step is recorded".
        hold (str | None): None to kill the process there with SIGKILL; else a path: the runner
            creates ``<hold>.held`` (a new file: the test knows the step is held) and waits while
            ``<hold>`` exists; the test then kills or interrupts it, or removes ``<hold>`` to let
            it go on.
    """

    index: int
    hold: str | None = None

    def reached(self, n: int) -> None:
        """Act if ``n`` is this failpoint's action index (kill, or hold until released).

        Raises:
            KeyboardInterrupt: a Ctrl-C while held (as anywhere in the step).
        """
        if n != self.index:
            return
        if self.hold is None:
            os.kill(os.getpid(), signal.SIGKILL)
            return
        fd = os.open(self.hold + ".held", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        while os.path.lexists(self.hold):
            time.sleep(0.01)


def _failpoint(step: str) -> Failpoint | None:
    """The :class:`Failpoint` of ``HPCSTACK_FAILPOINT=STEP:N[:hold:PATH]`` for this step, if set
    (tests only); None for another step or a value of another shape."""
    value = os.environ.get("HPCSTACK_FAILPOINT", "")
    name, _, rest = value.partition(":")
    index, _, hold = rest.partition(":")
    if name != step or not index.isdigit():
        return None
    if not hold:
        return Failpoint(int(index))
    kind, _, path = hold.partition(":")
    if kind == "hold" and os.path.isabs(path):
        return Failpoint(int(index), path)
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _tail(path: Path, lines: int = 15) -> str:
    text = _read(path).splitlines()[-lines:]
    return "\n  | " + "\n  | ".join(text) if text else ""


@dataclass
class StepContext:
    """What the actions of one step see (:class:`hpcstack.install.actions.ExecContext`): one per
    step, so that steps and actions running concurrently each write their own log.

    Attributes:
        env (dict[str, str]): the build environment.
        log (IO[str]): the step's log (an action running in the background writes to a
            temporary file that :func:`run_actions` appends to the step's log when it has finished).
        state_dir (Path | None): ``<stage prefix>/.hpcstack``.
    """

    env: dict[str, str]
    log: object
    state_dir: Path | None


def run_actions(actions: list, ctx: StepContext, failpoint: Failpoint | None = None) -> None:
    """Execute one step's actions in order; an action with ``background = True`` (the sanity
    check's interpreter, :class:`~hpcstack.install.components.sanity.PythonCheck`) is started in
    a thread and the actions after it run meanwhile; the step ends when all have finished.

    Its output goes to the step's log after the foreground actions' output, in one piece. The
    dry-run prints the same: the command with ``&`` and a ``wait`` at the step's end
    (:meth:`hpcstack.install.plan.Step.to_bash`).

    Args:
        actions (list): the step's actions.
        ctx (StepContext): the step's environment and log.
        failpoint (Failpoint | None): kill or hold the process at one of the actions (tests).

    Raises:
        HpcstackError: the error of the first failing action in the step's order (a background
            action's counts at its place), once every started action has finished.
    """
    started: list[tuple[int, threading.Thread, object, list]] = []
    error: tuple[int, BaseException] | None = None
    try:
        for n, action in enumerate(actions):
            if failpoint:
                failpoint.reached(n)
            if getattr(action, "background", False):
                buffer, failed = tempfile.TemporaryFile("w+", errors="replace"), []  # a real file: commands write to it
                thread = threading.Thread(target=_execute_into, daemon=True, name=f"hpcstack-action-{n}",
                                          args=(action, StepContext(ctx.env, buffer, ctx.state_dir), failed))
                thread.start()
                started.append((n, thread, buffer, failed))
                continue
            try:
                action.execute(ctx)
            except (HpcstackError, OSError) as exc:
                error = (n, exc)
                break
            ctx.log.flush()
    finally:
        for n, thread, buffer, failed in started:
            thread.join()
            with buffer:
                buffer.seek(0)
                ctx.log.write(f"# output of action {n + 1} (it ran in the background)\n" + buffer.read())
            if failed and (error is None or n < error[0]):
                error = (n, failed[0])
        ctx.log.flush()
    if error:
        raise error[1]
    if failpoint:  # every action done, the step not yet recorded (tests)
        failpoint.reached(len(actions))


def _execute_into(action, ctx: StepContext, failed: list) -> None:
    try:
        action.execute(ctx)
    except (HpcstackError, OSError) as exc:
        failed.append(exc)
    except Exception as exc:  # a bug must not look like success
        failed.append(HpcstackError(f"{type(exc).__name__}: {exc}"))


class _Background:
    """The background steps of :meth:`Runner.run`, one after the other in a thread."""

    def __init__(self, runner: Runner, steps: list[Step], index: dict[str, int], hashes: dict[str, str]):
        self.runner, self.steps, self.index, self.hashes = runner, steps, index, hashes
        self.ran: list[str] = []
        self.error: HpcstackError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, daemon=True, name="hpcstack-background")

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        """Start no further step (the one running finishes)."""
        self._stop.set()

    def _work(self) -> None:
        for step in self.steps:
            if self._stop.is_set():
                return
            try:
                self.runner._run_step(step, self.index[step.name], len(self.index), self.hashes[step.name])
            except HpcstackError as exc:
                self.error = exc
                return
            except Exception as exc:  # a bug in a step must fail the install, not hang it
                self.error = HpcstackError(f"{type(exc).__name__}: {exc}", step=step.name)
                return
            self.ran.append(step.name)

    def finish(self, raise_error: bool = True) -> None:
        """Wait for the thread; raise its step's error (unless ``raise_error`` is False)."""
        self._thread.join()
        if self.error and raise_error:
            raise self.error


# ------------------------------------------------------------------------- failure diagnosis

_PIP_MISMATCH = re.compile(
    r"^\s+(\S+==\S+) from (\S+?)(?:#\S*)? \(from -r (\S+) \(line (\d+)\)\):\s*\n"
    r"\s+Expected sha256 ([0-9a-f]{64})(?:\s*\n\s+or:?\s+[0-9a-f]{64})*\s*\n\s+Got\s+([0-9a-f]{64})", re.M)
_UV_MISMATCH = re.compile(
    r"Hash mismatch for `([^`]+)`.*?Expected:\s*\n\s*sha256:([0-9a-f]{64}).*?Computed:\s*\n\s*sha256:([0-9a-f]{64})",
    re.S)
_NETWORK = re.compile(r"(Failed to establish a new connection|ProxyError|Cannot connect to proxy|"
                      r"Temporary failure in name resolution|Name or service not known|"
                      r"error sending request for url|dns error|Network is unreachable|"
                      r"Connection refused|timed out|Could not fetch URL)")


#: A compiler's error line (GCC, Clang, nvcc): ``file.cc:35:10: error: …`` or ``fatal error``;
#: the first one is what a build log's hundreds of lines come down to.
_COMPILER_ERROR = re.compile(
    r"^(?:.*?\s)?(\S+\.(?:c|cc|cpp|cxx|h|hh|hpp|hxx|cu|cuh)(?:\(\d+\)|:\d+(?::\d+)?):\s+(?:fatal\s+)?error:?\s.*)$",
    re.M)
#: The linker's: a missing library (``ld: cannot find -lcudadevrt``) or symbol.
_LINKER_ERROR = re.compile(r"^\s*(\S*\bld(?:\.\w+)?: (?:cannot find|.*undefined reference).*)$", re.M)
#: CMake's configure errors: ``CMake Error at CMakeLists.txt:12 (…):`` and the message under it
#: (indented when pip relays the build's output).
_CMAKE_ERROR = re.compile(r"^[ \t]*CMake Error(?: at ([^\n]*?))?:?\s*\n\s*([^\n]+)", re.M)


def diagnose(log: str) -> str | None:
    """Return one clear line for a failure recognised in a step's log, else None.

    Recognised: a wheel whose sha256 is not the one in the lock (pip's and uv's messages; both
    hashes and the file), a full disk, no network (pip's and uv's messages), a missing compiler,
    and a compile error (the first compiler error line, else the linker's, else CMake's first
    error).

    Args:
        log (str): the text of the step's log.
    """
    m = _PIP_MISMATCH.search(log)
    if m:
        pin, url, lock, line, expected, got = m.groups()
        return (f"sha256 mismatch for {url.rsplit('/', 1)[-1]} ({pin}, {lock} line {line}): expected "
                f"{expected}, got {got}; refusing it (a tampered or corrupt download, or a lock file "
                "that needs regenerating with `hpcstack lock`)")
    m = _UV_MISMATCH.search(log)
    if m:
        pin, expected, got = m.groups()
        return (f"sha256 mismatch for {pin}: expected {expected}, got {got}; refusing it (a tampered "
                "or corrupt download, or a lock file that needs regenerating with `hpcstack lock`)")
    if "No space left on device" in log or "Disk quota exceeded" in log:
        return describe_os_error(OSError(errno.ENOSPC, "No space left on device"))
    if re.search(r"ERROR: (Could not find a version|No matching distribution)|Failed to download|"
                 r"Could not fetch URL|Failed to fetch", log) and _NETWORK.search(log):
        first = _NETWORK.search(log).group(0)
        return (f"cannot download packages ({first}): no network, or a proxy that does not answer; "
                "check the network and the https_proxy/no_proxy variables, then re-run to resume")
    m = re.search(r"error: command '([^']+)' failed: No such file or directory", log)
    if m:
        return (f"compiler {m.group(1)} not found; install it or fix the compilers in the site "
                "config (toolchain.cc/cxx/fc, build.env)")
    m = _COMPILER_ERROR.search(log)
    if m:
        return f"the build failed; the first compiler error: {m.group(1).strip()}"
    m = _LINKER_ERROR.search(log)
    if m:
        return f"the build failed; the first linker error: {m.group(1).strip()}"
    m = _CMAKE_ERROR.search(log)
    if m:
        return f"the build failed; CMake: {m.group(1).strip()} {m.group(2).strip()}".rstrip()
    return None


# ------------------------------------------------------------------------------- preflight

def preflight(plan: Plan, env: dict[str, str], steps: list[str], site_path: str = "the site config") -> None:
    """Check, before anything is written, that the commands and compilers of ``steps`` exist.

    The commands are those every action reports (:meth:`~hpcstack.install.actions.Action.commands`),
    nested ones included (the ``patch`` a cached source build runs on a cache miss). They are
    looked up on the PATH of the build environment (the site's modules loaded); compilers are
    the first word of ``CC``, ``CXX``, … set for a command. Paths inside the
    build (the venv's python, the stack's tools) are made by earlier steps and not checked.

    Args:
        plan (Plan): the plan.
        env (dict[str, str]): the build environment.
        steps (list[str]): the steps that will run.
        site_path (str): the site config, named in the messages.

    Raises:
        ConfigError: one line per missing command or compiler, with the step and what to do.
    """
    path = env.get("PATH", "")
    made_here = [plan.build_prefix, plan.prefix]
    problems: list[str] = []
    seen: set[str] = set()

    def missing(cmd: str) -> bool:
        if "/" in cmd:
            if any(cmd == d or cmd.startswith(d.rstrip("/") + "/") for d in made_here):
                return False
            return not os.access(cmd, os.X_OK)
        return shutil.which(cmd, path=path) is None

    for step in plan.steps:
        if step.name not in steps:
            continue
        for run in walk_commands(step.actions):  # nested commands too (a cached build's patch)
            cmd = expand(run.argv[0], run.command_env(env)) if run.argv else ""
            if cmd and cmd not in seen and missing(cmd):
                seen.add(cmd)
                problems.append(f"step {step.name}: command {cmd!r} not found on the PATH of the build "
                                f"environment (after loading {', '.join(plan.modules) or 'no modules'}); "
                                f"install it or load its module (modules.build in {site_path})")
            for var, value in run.env.items():
                if var not in COMPILER_VARS:
                    continue
                words = expand(value, env).split()
                if words and words[0] not in seen and missing(words[0]):
                    seen.add(words[0])
                    problems.append(f"step {step.name}: compiler {var}={words[0]} not found on the PATH of "
                                    f"the build environment; install it, load its module, or fix the "
                                    f"compilers in {site_path} (toolchain.cc/cxx/fc, build.env)")
        for action in step.actions:  # checks of an action's own (a toolkit's GPU architectures)
            check = getattr(action, "preflight", None)
            if callable(check):
                problems += [f"step {step.name}: {line} ({site_path})" for line in check(env)]
    if problems:
        raise ConfigError(problems)


def plan_checks(plan: Plan, site_path: str = "the site config") -> None:
    """The checks of the preflight that need no build environment, for ``--dry-run``: every
    action's ``dry_run_check()`` (the GPU architectures of a locked wheel,
    :class:`hpcstack.install.components.cudawheels.WheelArchCheck`).

    Raises:
        ConfigError: one line per problem, as :func:`preflight` words them.
    """
    problems: list[str] = []
    for step in plan.steps:
        for action in step.actions:
            check = getattr(action, "dry_run_check", None)
            if callable(check):
                problems += [f"step {step.name}: {line} ({site_path})" for line in check()]
    if problems:
        raise ConfigError(problems)


# ----------------------------------------------------------------------------------- lock

@contextmanager
def install_lock(layout, wait: bool = True, mode: int = 0o600):
    """Hold the lock of one stack (one install or uninstall at a time per stack).

    The lock file is opened without following a symbolic link and given ``mode`` (0600: a user
    who could open it could hold a shared lock on it and block every install).

    Args:
        layout (hpcstack.install.layout.StackLayout): the stack; its ``lock_file`` is the lock.
        wait (bool): wait for another install to finish (with a message) or fail at once.
        mode (int): the lock file's permission bits (0600; 0660 for a site whose group installs).

    Raises:
        HpcstackError: ``wait`` is False and another install holds the lock, or the lock file
            cannot be made (e.g. no permission on the install root).
    """
    name, version = layout.name, layout.version
    path = Path(layout.lock_file)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            st = os.fstat(fd)
            if st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
                os.fchmod(fd, mode)  # a lock file of an earlier hpcstack (0644)
        except OSError:
            os.close(fd)
            raise
        f = os.fdopen(fd, "r+")
    except OSError as exc:
        raise HpcstackError(f"cannot take the install lock {path}: {describe_os_error(exc)}") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                raise HpcstackError(f"another install of {name}/{version} is running{holder} (lock {path}); "
                                    "try again when it has finished, or leave out --no-wait to wait")
            console.print(f"waiting for another install of {name}/{version}{holder} to finish (lock {path}) …")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
        except OSError:
            pass  # the pid is only informative (a full disk must not stop the lock)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _lock_holder(path: Path) -> str:
    pid = _read(path).strip()
    return f" (process {pid})" if pid.isdigit() else ""
