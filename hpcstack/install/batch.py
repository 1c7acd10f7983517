"""``build.batch_job``: an install that builds inside one Slurm job step, for login nodes that
limit CPU time (CINECA's Leonardo: "very short test runs (not exceeding 10 minutes of CPU
time)", https://docs.hpc.cineca.it/hpc/leonardo.html) on sites whose compute nodes have no
internet.

``hpcstack install RECIPE --site S`` on the login node, where the site sets the key:

1. does what needs the network there: the recipe's bundle (:func:`hpcstack.lifecycle.bundle.make_bundle`,
   without hpcstack's own wheel: the same hpcstack runs in the job) into a private stage
   directory, ``<stage_root>/bundle-<name>-<version>``, made through the gate
   (:func:`bundle_dir`); ``--from DIR`` skips this and sends DIR;
2. runs the rest as one job step, synchronously (:func:`srun_argv`, :func:`run_step`):
   ``srun --partition=P --nodes=1 --ntasks=1 --cpus-per-task=C --time=T [--qos=Q] [--account=A]
   [srun_options] --job-name=hpcstack-build --quit-on-interrupt --mpi=none --export=ALL,HPCSTACK_BATCH_BUILD=1
   PYTHON -I -u -m hpcstack install RECIPE ... --from BUNDLE --jobs C`` (:func:`inner_argv`), the
   step's output streamed to the terminal;
3. exits with the inner run's status. A refusal by srun before the step started (a bad
   partition, account or QOS) is one ``error:`` line naming the key; Ctrl-C cancels the step
   (``--quit-on-interrupt``: one SIGINT ends it), and SIGTERM or SIGHUP of hpcstack is passed on
   to srun as SIGINT.

The inner run sees :data:`MARKER` and does not submit again; with the marker set outside a Slurm
job (no ``SLURM_JOB_ID``) it refuses to run (:func:`check_inside`). ``--on-login-node`` runs an
install as without the key.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD

#: The variable that tells an install it runs inside the job step ``build.batch_job`` started
#: (srun sets it through ``--export``): it builds there and submits nothing.
MARKER = "HPCSTACK_BATCH_BUILD"
#: The step's job name (``squeue``, ``sacct``).
JOB_NAME = "hpcstack-build"
#: The line the inner run prints first (stderr): from it on, the step has started, and what
#: fails is the install's, not srun's.
STARTED = "note: build.batch_job: running in Slurm job {job}, step {step}, on {node}"
_STARTED = re.compile(r"^note: build\.batch_job: running in Slurm job (\S+),")
#: After a Ctrl-C, how long srun may take to end the step (Slurm's ``KillWait`` is 30 s by
#: default, slurm.conf(5)) before it is killed and the job cancelled with ``scancel``.
STOP_WAIT = 60
#: srun's lines that say it could not start the step (Slurm's ``src/srun``: "Unable to allocate
#: resources: Invalid partition name specified", "Invalid account or account/partition
#: combination specified", "Invalid qos specification"; an unknown option).
_REFUSAL = re.compile(r"^srun: (error: .*|unrecognized option .*|invalid .*|option .* requires .*)$")


@dataclass(frozen=True)
class BatchJob:
    """The site's ``build.batch_job``: where the build's job step runs.

    Attributes:
        partition (str): ``--partition``.
        time_limit (str): ``--time``, ``[D-]HH:MM:SS``.
        cpus_per_task (int): ``--cpus-per-task``, and the build's ``--jobs`` unless given.
        qos (str | None): ``--qos``; None: the partition's default.
        account (str | None): ``--account``; None: the user's default account.
        srun_options (tuple[str, ...]): more long options, after hpcstack's own (``--mem=16G``).
    """

    partition: str
    time_limit: str
    cpus_per_task: int
    qos: str | None = None
    account: str | None = None
    srun_options: tuple = ()

    @classmethod
    def of(cls, site) -> "BatchJob | None":
        """The site's ``build.batch_job`` (checked with the site), or None where it is unset."""
        raw = ((getattr(site, "raw", None) or {}).get("build") or {}).get("batch_job")
        if not raw:
            return None
        return cls(partition=raw["partition"], time_limit=raw["time_limit"], cpus_per_task=raw["cpus_per_task"],
                   qos=raw.get("qos"), account=raw.get("account"), srun_options=tuple(raw.get("srun_options") or ()))


def srun_argv(job: BatchJob, inner: list[str], srun: str = "srun") -> list[str]:
    """The srun command line of the build's job step.

    Args:
        job (BatchJob): the site's ``build.batch_job``.
        inner (list[str]): the command the step runs (:func:`inner_argv`).
        srun (str): srun's path.

    Example:
        >>> srun_argv(BatchJob("boost_usr_prod", "02:00:00", 8, account="proj"), ["hpcstack"])[:7]
        ['srun', '--partition=boost_usr_prod', '--nodes=1', '--ntasks=1', '--cpus-per-task=8', '--time=02:00:00', '--account=proj']
    """
    return [srun, f"--partition={job.partition}", "--nodes=1", "--ntasks=1", f"--cpus-per-task={job.cpus_per_task}",
            f"--time={job.time_limit}", *([f"--qos={job.qos}"] if job.qos else []),
            *([f"--account={job.account}"] if job.account else []), *job.srun_options,
            f"--job-name={JOB_NAME}", "--quit-on-interrupt", "--mpi=none", f"--export=ALL,{MARKER}=1", *inner]


#: The options of ``hpcstack install`` and how the job step's command gets each: ``"path"`` (made
#: absolute: the step runs in ``/``), ``"value"``, ``"flag"``, ``"paths"`` (repeated), or None:
#: not passed on (the batch job's own, or replaced). tests/test_install_batch.py checks that
#: every option of the parser is here.
INNER_OPTIONS = {
    "site": "site", "repo": "paths", "trust_writable": "flag", "admin_group": "value", "system_config": "path",
    "prefix": "path", "module_root": "path", "stop_after": "value", "force": "flag", "no_wait": "flag",
    "default": "flag", "jobs": None, "from_bundle": None, "dry_run": None, "json": None, "on_login_node": None,
    "recipe": None, "help": None,
}


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def inner_argv(args, bundle: str, jobs: int, python: str = sys.executable) -> list[str]:
    """The command the job step runs: the same hpcstack (this Python, ``-u``: its output reaches
    the terminal as it is written) installing the same recipe with the same options, from the
    bundle, with ``--jobs``. Paths are made absolute (the step starts in ``/``).

    Args:
        args (argparse.Namespace): the parsed ``hpcstack install`` command line.
        bundle (str): the bundle's directory.
        jobs (int): ``--jobs`` of the build (``--jobs`` as given, else ``cpus_per_task``).
        python (str): the interpreter that runs hpcstack.

    Returns:
        list[str]: the argv.
    """
    recipe = args.recipe
    if recipe.endswith(".py") and os.path.isfile(recipe):
        recipe = os.path.abspath(recipe)
    out = [python, "-I", "-u", "-m", "hpcstack", "install", recipe]   # -I: no cwd or PYTHON* variables on sys.path
    for dest, how in INNER_OPTIONS.items():
        value = getattr(args, dest, None)
        if how is None or value in (None, False, [], ""):
            continue
        if how == "site":
            is_file = os.path.splitext(value)[1] in (".yaml", ".yml")
            out += ["--site", os.path.abspath(value) if is_file else value]
        elif how == "flag":
            out.append(_option(dest))
        elif how == "paths":
            for v in value:
                out += [_option(dest), os.path.abspath(v)]
        else:
            out += [_option(dest), os.path.abspath(value) if how == "path" else str(value)]
    return [*out, "--from", os.path.abspath(bundle), "--jobs", str(jobs)]


def bundle_dir(site, recipe) -> str:
    """Where an install of ``recipe`` writes its bundle: ``<stage_root>/bundle-<name>-<version>``."""
    return os.path.join(site.stage_root, f"bundle-{recipe.name}-{recipe.version}")


def make_stage_dir(site, path: str, pol) -> None:
    """Make the bundle's directory through the gate: the stage root (and the directories above
    it, 0755, where missing) and the directory itself, the installing account's, 0700 (0770 where
    the site's group installs, as hpcstack's other stage directories); one found there already
    must be a trusted account's real directory (a link is refused), and is given that mode.

    Raises:
        GateError: a link or an untrusted directory on the way.
    """
    from hpcstack import gate
    from hpcstack.install.permissions import stack_umask

    mode = 0o770 if stack_umask(site) == 0o002 else 0o700
    gate.mkdir(site.stage_root, mode, parents=True, pol=pol)
    made, st = gate.mkdir(path, mode, pol=pol)
    if not made and st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
        with gate.directory(path, pol) as fd:       # through its descriptor: a link is not followed
            os.fchmod(fd, mode)


def check_inside(environ=os.environ) -> str | None:
    """In the job step: the line that says so (:data:`STARTED`), printed first; None when
    :data:`MARKER` is unset (an ordinary install).

    Raises:
        ConfigError: the marker is set outside a Slurm job (no ``SLURM_JOB_ID``).
    """
    if not environ.get(MARKER):
        return None
    if not environ.get("SLURM_JOB_ID"):
        raise ConfigError([f"{MARKER} is set, but this is not a Slurm job (SLURM_JOB_ID is unset): it marks "
                           "the install build.batch_job runs in a job step; unset it"])
    return STARTED.format(job=environ["SLURM_JOB_ID"], step=environ.get("SLURM_STEP_ID", "?"),
                          node=environ.get("SLURMD_NODENAME") or socket.gethostname())


#: The job step's record, kept by :func:`leave_job_environment` when it clears the variables
_RECORD: dict | None = None

#: Prefixes of the variables a job step's processes inherit from Slurm and its MPI plugin: the
#: build's own processes (compilers, the sanity check's MPI programs) must not see them, or an MPI
#: program started as a singleton takes itself for a rank of the build's step and aborts ("Local
#: abort before MPI_INIT completed", Open MPI 4.1 under srun's PMIx). The site's build.env and
#: launcher variables are set by each step from the site config, after this.
JOB_VARIABLES = ("SLURM_", "SLURMD_", "PMI_", "PMIX_", "OMPI_", "PRTE_", "ORTE_")


def job_record(environ=os.environ) -> dict | None:
    """What provenance records of the job step an install ran in (:data:`MARKER` set), or None;
    after :func:`leave_job_environment`, the record it kept."""
    if _RECORD is not None:
        return _RECORD
    if not environ.get(MARKER) or not environ.get("SLURM_JOB_ID"):
        return None
    return {"job_id": environ["SLURM_JOB_ID"], "step_id": environ.get("SLURM_STEP_ID"),
            "node": environ.get("SLURMD_NODENAME") or socket.gethostname(), "job_name": environ.get("SLURM_JOB_NAME")}


def leave_job_environment(environ=os.environ) -> list[str]:
    """Inside the build's job step: keep the step's record (:func:`job_record`), then remove the
    variables of :data:`JOB_VARIABLES` from ``environ``, so that the build runs as it would on a
    login node.

    Returns:
        list[str]: the names removed, sorted.
    """
    global _RECORD
    _RECORD = job_record(environ)
    gone = sorted(k for k in environ if k.startswith(JOB_VARIABLES))
    for key in gone:
        del environ[key]
    return gone


def find_srun(pol) -> str:
    """srun's path, checked by the gate (:func:`hpcstack.gate.checked_exec_path`).

    Raises:
        ConfigError: no srun on PATH.
    """
    from hpcstack import gate

    found = shutil.which("srun")
    if not found:
        raise ConfigError(["build.batch_job: no srun on PATH: run on a login node of the site's Slurm, or "
                           "pass --on-login-node to build here"])
    return gate.checked_exec_path(os.path.abspath(found), pol)


def run_step(argv: list[str], *, popen=subprocess.Popen, err=sys.stderr) -> int:
    """Run the job step: srun's stdout goes to the terminal as it is; its stderr line by line
    through this process, which learns from it whether the step started (:data:`STARTED`).

    Returns:
        int: the inner install's exit status (srun's; 128+N where srun died of signal N).

    Raises:
        HpcstackError: srun ended, non-zero, before the step started: one line with srun's
            own reason, naming ``build.batch_job``.
        KeyboardInterrupt: Ctrl-C, SIGTERM or SIGHUP, once the step has ended (srun got SIGINT
            and ``--quit-on-interrupt`` ends the step; after :data:`STOP_WAIT` seconds srun is
            killed and the job cancelled).
    """
    proc = popen(argv, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=CHILD_CWD,
                 text=True, errors="replace", bufsize=1)
    seen: dict = {"started": None, "held": []}

    def relay():
        for line in proc.stderr:
            match = _STARTED.match(line)
            if match and seen["started"] is None:
                seen["started"] = match.group(1)
                _flush_held(seen, err)
            if seen["started"] is None and _REFUSAL.match(line.rstrip("\n")):
                seen["held"].append(line)       # srun's refusal: one line, below, unless the step starts
                continue
            err.write(line)
            err.flush()

    reader = threading.Thread(target=relay, name="srun-stderr", daemon=True)
    reader.start()
    try:
        status = proc.wait()
    except KeyboardInterrupt:
        _stop(proc, seen)
        reader.join(5)
        raise
    reader.join(30)
    if status and seen["started"] is None:
        why = ("; ".join(line.strip()[len("srun: "):] for line in seen["held"])
               or f"srun exited with status {status} before the step started")
        raise HpcstackError(f"build.batch_job: srun did not start the build's job step: {why} (check "
                            "build.batch_job: partition, account, qos, srun_options; or pass --on-login-node "
                            "to build on this node)")
    _flush_held(seen, err)
    return 128 - status if status < 0 else status


def _flush_held(seen: dict, err) -> None:
    """Write srun's error lines held back while the step had not started (it started after all)."""
    for line in seen["held"]:
        err.write(line)
    seen["held"] = []
    err.flush()


def _stop(proc, seen) -> None:
    """After Ctrl-C (or SIGTERM, SIGHUP) of hpcstack: SIGINT to srun (with ``--quit-on-interrupt``
    it ends the step), then wait :data:`STOP_WAIT` seconds; a srun still running is killed, and
    the job it started is cancelled (``scancel``), so that nothing is left behind or hangs."""
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(STOP_WAIT)
        return
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass
    except OSError:
        return
    proc.kill()
    proc.wait()
    if seen["started"] and shutil.which("scancel"):
        subprocess.run(["scancel", seen["started"]], cwd=CHILD_CWD, check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
    print(f"note: build.batch_job: srun did not end within {STOP_WAIT} s of the interrupt; killed"
          + (f", job {seen['started']} cancelled" if seen["started"] else ""), file=sys.stderr)


def dry_run_text(site, recipe, job: BatchJob, bundle: str, make: bool, argv: list[str]) -> str:
    """What ``--dry-run`` prints with ``build.batch_job``: the bundle step on this node and the
    srun line of the job step, as a bash script; nothing runs.

    Args:
        site, recipe: the loaded site and recipe.
        job (BatchJob): the site's key.
        bundle (str): the bundle's directory.
        make (bool): True where the install makes the bundle (no ``--from``).
        argv (list[str]): :func:`srun_argv`.
    """
    import shlex

    lines = [f"# hpcstack install {recipe.full_name} for site {site.name}: build.batch_job is set, so the build "
             f"runs in one Slurm job step on partition {job.partition}",
             "# 1. on this node (the network): the bundle of what the install needs"]
    if make:
        lines += [f"#    a private stage directory, 0700, made through the gate: {bundle}",
                  f"hpcstack bundle {shlex.quote(recipe.ref or recipe.full_name)} --site "
                  f"{shlex.quote(site.ref or site.name)} -o {shlex.quote(bundle)}   # without hpcstack's own wheel"]
    else:
        lines.append(f"#    --from: the bundle {bundle}, as given (checked again in the job)")
    lines += [f"# 2. the rest, in the job step: no network; its output here; its exit status is the install's "
              f"(hpcstack install --on-login-node builds on this node instead)",
              shlex.join(argv), ""]
    return "\n".join(lines)
