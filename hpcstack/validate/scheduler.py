"""Schedulers of ``hpcstack validate``: a registry of small classes, ``slurm`` and ``local``.

In the manner of ReFrame's schedulers (``reframe/core/schedulers/__init__.py``,
``@register_scheduler('slurm')``): each scheduler is one class registered by name
(:func:`register_scheduler`, :data:`SCHEDULERS`). A scheduler hands the launchers
(:mod:`hpcstack.validate.launchers`) an :class:`~hpcstack.validate.launchers.Allocation` (how
many ranks where, how to list the hosts), and either runs a command here (``local``) or renders,
submits and follows batch jobs (``slurm``).

**Slurm** (ReFrame's Slurm backend, ``reframe/core/schedulers/slurm.py``): the job script is
rendered from ``templates/slurm-job.sh.j2`` (jinja2, ``trim_blocks``/``lstrip_blocks``) from a
:class:`BatchJob`, submitted with ``sbatch --parsable``, and followed by polling
``squeue -h -j ID`` with a back-off (:class:`Backoff`: 0.2 s, then x1.1 a poll up to 10 s, back to
0.2 s whenever a job ends, as ReFrame's ``_PollController`` in
``reframe/frontend/executors/policies.py``): about 150 ``squeue`` calls for a 20-minute job rather
than 6,000 at a fixed 0.2 s. Once a job has left the queue its final state and exit code come from
``scontrol show job`` (kept for ``MinJobAge`` seconds) or, after that, from the
``jobcomp/filetxt`` file (there is no ``sacct`` without slurmdbd).

When hpcstack runs as root and a submit user is given (the localhost site: ``hpcstack-test``),
jobs are submitted with ``runuser -u USER -- sbatch``: root's PATH leaks into jobs and Open MPI's
``mpirun`` refuses root to run (its ``--allow-run-as-root`` documentation).

A new batch scheduler is one class in this file: ``@register_scheduler("pbs")`` on a
:class:`JobScheduler` subclass that gives :meth:`~JobScheduler.allocation`,
:meth:`~JobScheduler.render`, :meth:`~JobScheduler.submit`, :meth:`~JobScheduler.wait` and
:meth:`~JobScheduler.cancel` (and its job template under ``scripts/``).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

from hpcstack import templates
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD
from hpcstack.registry import Registry
from hpcstack.site import SBATCH_UNSAFE as _SITE_SBATCH_UNSAFE
from hpcstack.validate.launchers import Allocation
from hpcstack.validate.preflight import sbatch_refusal

#: name -> scheduler class, filled by :func:`register_scheduler`.
SCHEDULERS = Registry("scheduler")

#: The job script template, under the data root.
TEMPLATE = "templates/slurm-job.sh.j2"

#: States in which a job is still in the queue (``squeue`` lists it).
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                 "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "REQUEUE_HOLD",
                 "REQUEUE_FED", "SPECIAL_EXIT")

#: What an ``#SBATCH`` line's value may not hold (white space, quotes, ``\\``, ``#``, control
#: characters): the site config's rule (:data:`hpcstack.site.SBATCH_UNSAFE`, which checks
#: ``slurm.extra_options`` with it), here for the values the job scripts write.
SBATCH_UNSAFE = _SITE_SBATCH_UNSAFE


def check_sbatch_value(value: str, what: str, pattern: bool = True) -> str:
    """Return ``value`` if it can stand in an ``#SBATCH`` line as it is.

    Args:
        value (str): the option's value (a directory, a name).
        what (str): where it comes from (``--output-dir``), for the error line.
        pattern (bool): refuse ``%`` too: in ``--output`` and ``--chdir`` Slurm reads ``%j``,
            ``%u``, … as a file name pattern (``sbatch(1)``, "filename pattern").

    Raises:
        ConfigError: a character of :data:`SBATCH_UNSAFE` (or ``%``); one line.
    """
    bad = SBATCH_UNSAFE.search(value) or (pattern and "%" in value)
    if bad:
        raise ConfigError([f"{what}: {value[:80]!r}: an #SBATCH line cannot hold white space, quotes, "
                           "backslashes, # or control characters" + (", nor % (Slurm's file name patterns)"
                                                                    if pattern else "")
                           + "; give a path without them"])
    return value


_SLURM_HINT = ("is Slurm running? (localhost: scripts/localhost-slurm install && "
               "scripts/localhost-slurm up; or validate with --local)")


@dataclass(frozen=True)
class JobStep:
    """One command of a job script, run after the previous one whatever its exit status.

    Args:
        name (str): a label (e.g. the backend, ``horovod``).
        command (str): the shell command line (already quoted).
        status_file (str): file the script writes the step's exit status into.
    """

    name: str
    command: str
    status_file: str


@dataclass(frozen=True)
class BatchJob:
    """Everything a Slurm job script asks for and runs.

    Args:
        name (str): ``--job-name``.
        nodes (int): ``--nodes``.
        tasks_per_node (int): ``--ntasks-per-node`` (one rank per GPU on GPU nodes).
        cpus_per_task (int): ``--cpus-per-task``; also ``OMP_NUM_THREADS`` and
            ``SRUN_CPUS_PER_TASK`` (srun >= 22.05 does not inherit ``--cpus-per-task``).
        time_limit (str): ``--time``, ``[D-]HH:MM:SS``.
        output (str): ``--output`` path (``%j`` is the job id); stdout and stderr both go there.
        workdir (str): ``--chdir``.
        module_init (str): the module tool's bash init script, sourced by the job: with
            ``--export=NONE`` the job does not inherit the ``module`` function.
        partition, qos, account (str | None): as for sbatch; None leaves the option out.
        gpus_per_node (int): GPUs per node, when > 0: ``--gres=gpu:N``, or ``--gpus-per-node=N``
            where ``gpu_request`` is ``gpus-per-node`` (as NERSC's Perlmutter documents it), or
            ``--gpus-per-task=1`` where it is ``gpus-per-task`` (see :func:`gpu_options`).
        gpu_request (str): ``gres``, ``gpus-per-node`` or ``gpus-per-task``.
        constraint (str | None): ``--constraint`` (node features; Perlmutter's ``-C gpu``).
        exclusive (bool): ``--exclusive`` (whole nodes: no other job disturbs the figures).
        export_none (bool): ``--export=NONE``: the job starts from a clean environment, not the
            submitter's; the script then exports ``SLURM_EXPORT_ENV=ALL`` so that ``srun`` steps
            see the loaded modules.
        module_use (list[str]): directories for ``module use``, before the preloads (where the
            site's modules are found).
        module_preloads (list[str]): the site's profiles and module hierarchy
            (:attr:`hpcstack.site.ModulesConfig.preloads`), loaded in this order after ``module_use``.
        module_use_after (list[str]): directories for ``module use`` after the preloads (the
            stack's module root: a hierarchy module such as JSC's ``Stages`` resets MODULEPATH).
        module_load (list[str]): modules to load, last.
        task_options (str): ``sbatch`` (default): ``--ntasks-per-node`` and ``--cpus-per-task`` are
            ``#SBATCH`` options; ``srun``: only the steps' ``srun`` gets them (Cirrus's GPU nodes
            reject a job that gives them to sbatch, https://github.com/EPCCed/cirrus-docs,
            ``docs/user-guide/gpu.md`` before its GPU pages were removed on 13 October 2025; the
            old Cirrus closed on 8 December 2025).
        env (dict[str, str]): variables to export after loading the modules (the template quotes them).
        setup (list[str]): shell lines run before the steps (e.g. the host list for horovodrun).
        steps (list[JobStep]): the commands, run in order.
        comments (list[str]): lines for the header comment.
        unset_bash_env (bool): ``unset BASH_ENV`` before the module init, so that a site's Lmod
            ``BASH_ENV`` (set by Lmod's ``/etc/profile.d/lmod.sh``) does not replace Environment
            Modules in child shells.
        mem, mem_per_cpu, mem_per_gpu (str | None): ``--mem`` (per node), ``--mem-per-cpu``,
            ``--mem-per-gpu``, in sbatch's syntax (an integer, megabytes unless a suffix K, M, G
            or T says otherwise: ``"64G"``); at most one (sbatch(1): "mutually exclusive",
            https://slurm.schedmd.com/sbatch.html); None leaves the option out.
        extra_options (list[str]): the site's ``slurm.extra_options``, long options written as
            they are after hpcstack's own (``--reservation=maint``); :func:`hpcstack.site.extra_option_problem`
            has refused those hpcstack sets itself when the site was loaded.
    """

    name: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    time_limit: str
    output: str
    workdir: str
    module_init: str
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    gpus_per_node: int = 0
    gpu_request: str = "gres"
    constraint: str | None = None
    exclusive: bool = False
    export_none: bool = True
    module_use: list[str] = field(default_factory=list)
    module_load: list[str] = field(default_factory=list)
    module_preloads: list[str] = field(default_factory=list)
    module_use_after: list[str] = field(default_factory=list)
    task_options: str = "sbatch"
    env: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)
    steps: list[JobStep] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    unset_bash_env: bool = False
    mem: str | None = None
    mem_per_cpu: str | None = None
    mem_per_gpu: str | None = None
    extra_options: list[str] = field(default_factory=list)

    def memory_options(self) -> list[str]:
        """The memory option (``--mem=64G``, ``--mem-per-cpu=…`` or ``--mem-per-gpu=…``), or none.

        Raises:
            ConfigError: more than one of them is set (sbatch: mutually exclusive).
        """
        given = [(key, value) for key, value in (("mem", self.mem), ("mem-per-cpu", self.mem_per_cpu),
                                                 ("mem-per-gpu", self.mem_per_gpu)) if value is not None]
        if len(given) > 1:
            raise ConfigError([f"slurm.{given[1][0].replace('-', '_')}: give one of slurm.mem, slurm.mem_per_cpu, "
                               "slurm.mem_per_gpu (sbatch: --mem, --mem-per-cpu and --mem-per-gpu are mutually "
                               "exclusive, https://slurm.schedmd.com/sbatch.html)"])
        return [f"--{key}={value}" for key, value in given]

    def sbatch_options(self) -> list[str]:
        """Return the ``#SBATCH`` options, in the order they appear in the script: hpcstack's own,
        then the site's :attr:`extra_options`.

        Raises:
            ConfigError: a value an ``#SBATCH`` line cannot hold (:func:`check_sbatch_value`);
                more than one memory option (:meth:`memory_options`).
        """
        for what, value in (("the job's name", self.name), ("--output-dir", self.workdir),
                            ("--partition", self.partition), ("--qos", self.qos), ("--account", self.account),
                            ("slurm.constraint", self.constraint), ("slurm.mem", self.mem),
                            ("slurm.mem_per_cpu", self.mem_per_cpu), ("slurm.mem_per_gpu", self.mem_per_gpu),
                            *(("slurm.extra_options", o) for o in self.extra_options)):
            if value:
                check_sbatch_value(str(value), what, pattern=what == "--output-dir")
        check_sbatch_value(os.path.dirname(self.output), "--output-dir")
        opts = [f"--job-name={self.name}"]
        opts += [f"--partition={self.partition}"] if self.partition else []
        opts += [f"--qos={self.qos}"] if self.qos else []
        opts += [f"--account={self.account}"] if self.account else []
        opts += [f"--nodes={self.nodes}"]
        if self.task_options != "srun":
            opts += [f"--ntasks-per-node={self.tasks_per_node}", f"--cpus-per-task={self.cpus_per_task}"]
        opts += [f"--constraint={self.constraint}"] if self.constraint else []
        if self.gpus_per_node:
            if self.gpu_request == "gpus-per-task" and self.task_options == "srun":
                raise ConfigError(["slurm.gpu_request: gpus-per-task needs the task count as #SBATCH "
                                   "options; slurm.task_options is srun"])
            opts += gpu_options(self.gpu_request, self.gpus_per_node, self.nodes, self.tasks_per_node)
        opts += self.memory_options()
        opts += ["--exclusive"] if self.exclusive else []
        opts += [f"--time={self.time_limit}", f"--output={self.output}", f"--chdir={self.workdir}"]
        opts += ["--export=NONE"] if self.export_none else []
        return opts + list(self.extra_options)


def gpu_options(gpu_request: str, gpus_per_node: int, nodes: int, tasks_per_node: int) -> list[str]:
    """The sbatch options that ask for the GPUs (none when ``gpus_per_node`` is 0).

    * ``gres``: ``--gres=gpu:N``; every task of a node sees all N GPUs.
    * ``gpus-per-node``: ``--gpus-per-node=N`` (NERSC's Perlmutter examples); the same binding.
    * ``gpus-per-task``: ``--ntasks=<nodes x tasks_per_node>`` and ``--gpus-per-task=1``. sbatch(1)
      (Slurm 22.05 and later, https://slurm.schedmd.com/sbatch.html#OPT_gpus-per-task): it
      "requires an explicit task count, e.g. -n, --ntasks" and "will implicitly set
      --gpu-bind=per_task:<gpus_per_task>": each task sees only its own GPU, as ``cuda:0``
      (``CUDA_VISIBLE_DEVICES`` holds that one GPU). The site keeps ``tasks_per_node`` equal to
      ``gpus_per_node`` (checked with the site config).

    Args:
        gpu_request (str): ``gres``, ``gpus-per-node`` or ``gpus-per-task``.
        gpus_per_node (int): GPUs per node.
        nodes (int): the job's node count.
        tasks_per_node (int): ranks per node.

    Returns:
        list[str]: the options, in the order they appear in the script.

    Example:
        >>> gpu_options("gpus-per-task", 4, 2, 4)
        ['--ntasks=8', '--gpus-per-task=1']
    """
    if not gpus_per_node:
        return []
    if gpu_request == "gpus-per-task":
        return [f"--ntasks={nodes * tasks_per_node}", "--gpus-per-task=1"]
    if gpu_request == "gpus-per-node":
        return [f"--gpus-per-node={gpus_per_node}"]
    return [f"--gres=gpu:{gpus_per_node}"]


def render_job_script(job: BatchJob, header: str = "") -> str:
    """Render the job script for ``job`` from :data:`TEMPLATE`.

    Args:
        job (BatchJob): what to ask for and run.
        header (str): first comment line (what the job is for).

    Returns:
        str: the bash job script.
    """
    env = templates.environment()
    return env.get_template(TEMPLATE).render(
        header=header, comments=job.comments, options=job.sbatch_options(),
        module_init=job.module_init, unset_bash_env=job.unset_bash_env,
        module_use=list(job.module_use), module_load=list(job.module_load),
        module_preloads=list(job.module_preloads), module_use_after=list(job.module_use_after),
        export_none=job.export_none, cpus_per_task=job.cpus_per_task,
        env=list(job.env.items()), setup=job.setup,
        steps=[{"name": s.name, "command": s.command, "status_file": s.status_file} for s in job.steps])


@dataclass(frozen=True)
class JobInfo:
    """A job's state as Slurm reports it.

    Attributes:
        job_id (str): the id.
        state (str): ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``,
            ``TIMEOUT``, ``CANCELLED``, ``NODE_FAIL``, …; ``UNKNOWN`` when Slurm no longer knows it).
        exit_code (str): ``ExitCode`` as ``status:signal`` (``"1:0"``; ``"0:15"`` after SIGTERM).
        nodelist (str): nodes it ran on.
        elapsed (str): ``RunTime``, ``[D-]HH:MM:SS``.
        reason (str): ``Reason`` (why pending, or why it failed).
        stdout (str | None): its output file.
        source (str): where this came from: ``squeue``, ``scontrol`` or ``jobcomp``.
    """

    job_id: str
    state: str
    exit_code: str = ""
    nodelist: str = ""
    elapsed: str = ""
    reason: str = ""
    stdout: str | None = None
    source: str = ""

    @property
    def finished(self) -> bool:
        """True when the job has left the queue."""
        return self.state not in ACTIVE_STATES

    @property
    def ok(self) -> bool:
        """True when the job ended COMPLETED with exit code 0."""
        return self.state == "COMPLETED" and self.exit_code in ("0:0", "")


def parse_key_values(text: str) -> dict[str, str]:
    """Parse Slurm's ``Key=Value Key2=Value two …`` lines (``scontrol show job -o``, jobcomp).

    Values may contain spaces; a new key starts at a space followed by ``Name=``.

    Example:
        >>> parse_key_values("JobId=7 JobName=a b JobState=FAILED ExitCode=3:0")["JobName"]
        'a b'
    """
    pairs = re.finditer(r"(?:^|\s)([A-Za-z][\w:/.]*)=(.*?)(?=\s+[A-Za-z][\w:/.]*=|\s*$)", text.strip())
    return {m.group(1): m.group(2) for m in pairs}


def info_from_fields(job_id: str, fields: dict[str, str], source: str) -> JobInfo:
    """Build a :class:`JobInfo` from parsed ``scontrol``/jobcomp fields."""
    return JobInfo(job_id=job_id, state=(fields.get("JobState") or "UNKNOWN").split()[0],
                   exit_code=fields.get("ExitCode", ""), nodelist=fields.get("NodeList", ""),
                   elapsed=fields.get("RunTime", ""), reason=fields.get("Reason", ""),
                   stdout=fields.get("StdOut"), source=source)


@dataclass
class Backoff:
    """Poll intervals that grow: ``start``, then times ``factor`` a poll, at most ``maximum``.

    As ReFrame's ``_PollController`` (``reframe/frontend/executors/policies.py``: ``SLEEP_MIN``,
    ``SLEEP_INC_RATE``, ``SLEEP_MAX``, reset when a job finishes): quick answers for short jobs,
    few scheduler calls for long ones.

    Args:
        start (float): first interval, seconds (> 0; default 0.2).
        factor (float): growth per poll (>= 1; default 1.1).
        maximum (float): longest interval, seconds (>= start; default 10).

    Raises:
        ValueError: the bounds above are broken.

    Example:
        >>> b = Backoff(0.2, 2.0, 1.0)
        >>> [b.next() for _ in range(5)]
        [0.2, 0.4, 0.8, 1.0, 1.0]
    """

    start: float = 0.2
    factor: float = 1.1
    maximum: float = 10.0

    def __post_init__(self):
        if not (self.start > 0 and self.factor >= 1 and self.maximum >= self.start):
            raise ValueError(f"poll back-off needs start > 0, factor >= 1, maximum >= start "
                             f"(got {self.start}, {self.factor}, {self.maximum})")
        self._next = self.start

    def next(self) -> float:
        """Return the interval to sleep now (seconds) and grow the next one."""
        value = self._next
        self._next = min(value * self.factor, self.maximum)
        return value

    def reset(self) -> None:
        """Start again from ``start`` (a job ended: others may be ending too)."""
        self._next = self.start


class JobScheduler:
    """Base of the schedulers; subclasses are registered with :func:`register_scheduler`.

    Every scheduler gives :meth:`allocation`. A *batch* scheduler (``slurm``) also renders job
    scripts and submits, follows and cancels jobs (:meth:`render`, :meth:`submit`,
    :meth:`wait`, :meth:`cancel`) and is built with ``submit_as`` (the user to submit as when
    hpcstack runs as root; None otherwise); a *direct* one (``local``) runs a command here
    (:meth:`run`). The base methods raise :class:`NotImplementedError`.
    """

    #: The name it is registered under (set by :func:`register_scheduler`).
    name: ClassVar[str] = ""
    #: Shell variable that holds the job's id inside a batch job (None for direct schedulers).
    job_id_variable: ClassVar[str | None] = None

    def allocation(self, nodes: int, tasks_per_node: int, cpus_per_task: int = 1) -> Allocation:
        """Return what a launcher needs to start ``nodes x tasks_per_node`` ranks here."""
        raise NotImplementedError

    def render(self, job: "BatchJob", header: str = "") -> str:
        """Return the job script of ``job``."""
        raise NotImplementedError(f"the {self.name} scheduler runs no batch jobs")

    def submit(self, script: Path, cwd: str | None = None, content: str | None = None) -> str:
        """Submit a job script (``content``: its text, handed over without a path); return the job id."""
        raise NotImplementedError(f"the {self.name} scheduler runs no batch jobs")

    def wait(self, job_ids: list[str], timeout: float | None = None,
             on_change: Callable[["JobInfo"], None] | None = None) -> dict[str, "JobInfo"]:
        """Wait until the jobs end; return their final :class:`JobInfo`."""
        raise NotImplementedError(f"the {self.name} scheduler runs no batch jobs")

    def cancel(self, job_ids: list[str]) -> None:
        """Cancel the jobs."""
        raise NotImplementedError(f"the {self.name} scheduler runs no batch jobs")

    def run(self, argv: list[str], env: dict[str, str], cwd: str,
            timeout: float) -> subprocess.CompletedProcess:
        """Run a command here and capture its output."""
        raise NotImplementedError(f"the {self.name} scheduler runs batch jobs only")


def register_scheduler(name: str) -> Callable[[type[JobScheduler]], type[JobScheduler]]:
    """Class decorator: register a :class:`JobScheduler` subclass under ``name`` (:data:`SCHEDULERS`).

    Raises:
        ValueError: the name is taken already.
    """
    return SCHEDULERS.register(name)


def get_scheduler(name: str) -> type[JobScheduler]:
    """Return the scheduler class registered as ``name``.

    Raises:
        ValueError: no such scheduler (the message lists the known ones).
    """
    return SCHEDULERS.lookup(name)


@register_scheduler("local")
class LocalScheduler(JobScheduler):
    """Runs on this host, without a queue: ``hpcstack validate --local``.

    Its allocation is one node, ``localhost``, with concrete hosts, so every launcher's command
    runs without a shell.

    Args:
        run (Callable): ``subprocess.run`` or a stand-in.
    """

    def __init__(self, run: Callable[..., subprocess.CompletedProcess] = subprocess.run):
        self._run = run

    def allocation(self, nodes: int, tasks_per_node: int, cpus_per_task: int = 1) -> Allocation:
        """One node, this host.

        Raises:
            ValueError: ``nodes != 1``.
        """
        if nodes != 1:
            raise ValueError(f"the local scheduler runs on one node, not {nodes}")
        return Allocation(1, tasks_per_node, cpus_per_task, hosts=("localhost",))

    def run(self, argv: list[str], env: dict[str, str], cwd: str,
            timeout: float = 1800) -> subprocess.CompletedProcess:
        """Run ``argv`` here, its output captured, stdin closed.

        Args:
            argv (list[str]): the command.
            env (dict[str, str]): its whole environment.
            cwd (str): its working directory.
            timeout (float): seconds (default 30 minutes).

        Raises:
            HpcstackError: the command is not found, or it ran past ``timeout`` (it is killed).
        """
        try:
            return self._run(argv, env=env, cwd=cwd or CHILD_CWD, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=timeout)
        except FileNotFoundError:
            raise HpcstackError(f"{argv[0]} not found (is it on PATH after loading the modules?)")
        except subprocess.TimeoutExpired:
            raise HpcstackError(f"{argv[0]} ran more than {timeout / 60:.0f} minutes; stopped")


@register_scheduler("slurm")
class Slurm(JobScheduler):
    """Submit and follow jobs with the Slurm client commands.

    Args:
        submit_as (str | None): when running as root, submit as this user
            (``runuser -u USER -- sbatch``); ignored for other users.
        poll_interval (float): first interval between ``squeue`` calls, seconds (default 0.2).
        max_poll_interval (float): longest interval, seconds (default 10).
        poll_factor (float): growth of the interval per poll (default 1.1); see :class:`Backoff`.
        run (Callable): ``subprocess.run`` or a stand-in (tests).
        sleep (Callable[[float], None]): ``time.sleep`` or a stand-in (tests).

    Attributes:
        squeue_calls (int): ``squeue`` calls made so far (the load this puts on the controller).

    Example:
        >>> slurm = Slurm(submit_as="hpcstack-test")            # doctest: +SKIP
        >>> job_id = slurm.submit(Path("/tmp/v/n1/job.sh"))     # doctest: +SKIP
        >>> slurm.wait([job_id])[job_id].state                  # doctest: +SKIP
        'COMPLETED'
    """

    job_id_variable = "SLURM_JOB_ID"
    #: Prints the job's hosts one a line, inside the job.
    HOSTNAMES = 'scontrol show hostnames "$SLURM_JOB_NODELIST"'

    def __init__(self, submit_as: str | None = None, poll_interval: float = 0.2,
                 run: Callable[..., subprocess.CompletedProcess] = subprocess.run, *,
                 max_poll_interval: float = 10.0, poll_factor: float = 1.1,
                 sleep: Callable[[float], None] = time.sleep):
        self.submit_as = submit_as if os.geteuid() == 0 else None
        self.backoff = Backoff(poll_interval, poll_factor, max(max_poll_interval, poll_interval))
        self.squeue_calls = 0
        self._run = run
        self._sleep = sleep
        self._jobcomp: str | None | bool = False  # False: not looked up yet

    def allocation(self, nodes: int, tasks_per_node: int, cpus_per_task: int = 1) -> Allocation:
        """The allocation inside a job: hosts from ``$SLURM_JOB_NODELIST``; one task per node, with
        the cores of all its ranks, by ``srun --nodes=N --ntasks-per-node=1 --cpus-per-task=T*C``."""
        return Allocation(nodes, tasks_per_node, cpus_per_task, hostnames_command=self.HOSTNAMES,
                          per_node_command=("srun", f"--nodes={nodes}", "--ntasks-per-node=1",
                                            f"--cpus-per-task={tasks_per_node * cpus_per_task}"))

    def render(self, job: BatchJob, header: str = "") -> str:
        """The job script, from :func:`render_job_script`."""
        return render_job_script(job, header)

    def _call(self, argv: list[str], cwd: str | None = None, timeout: float = 60,
              input: str | None = None) -> subprocess.CompletedProcess:
        io = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
        try:
            return self._run(argv, cwd=cwd or CHILD_CWD, capture_output=True, text=True, timeout=timeout, **io)
        except FileNotFoundError:
            raise HpcstackError(f"{argv[0]} not found; {_SLURM_HINT}")
        except subprocess.TimeoutExpired:
            raise HpcstackError(f"{shlex.join(argv)} did not answer in {timeout:.0f} s; {_SLURM_HINT}")

    def submit(self, script: Path, cwd: str | None = None, content: str | None = None) -> str:
        """Submit a job script with ``sbatch --parsable``.

        With ``content`` the script is handed to sbatch on its standard input (sbatch reads a
        script from there when it is given no file, https://slurm.schedmd.com/sbatch.html), so
        what is submitted is what hpcstack rendered, whoever can reach the file afterwards: a
        path is read by sbatch later, and a user who can rename in its directory could put
        another script there in between (docs/admin/security.md).

        Args:
            script (Path): the job script (readable by the submit user); with ``content``, only
                the name shown in messages.
            cwd (str | None): where to run sbatch (default :data:`~hpcstack.fsutil.CHILD_CWD`;
                the job's own directory is its ``--chdir``).
            content (str | None): the script's text, given to sbatch on stdin.

        Returns:
            str: the job id.

        Raises:
            HpcstackError: sbatch missing, or it refused the job: one line, ``sbatch refused the
                job: <Slurm's message> (likely cause: <option>)``
                (:func:`hpcstack.validate.preflight.sbatch_refusal`).
        """
        argv = ["sbatch", "--parsable"] + ([] if content is not None else [str(script)])
        if self.submit_as:
            argv = ["runuser", "-u", self.submit_as, "--", *argv]
        proc = self._call(argv, cwd=cwd, input=content)
        if proc.returncode != 0:
            msg = " ".join(proc.stderr.split()) or f"exit status {proc.returncode}"
            down = ("contact", "connect", "configuration source", "slurm.conf", "timed out")
            if any(word in msg.lower() for word in down):
                raise HpcstackError(f"sbatch could not submit {script}: {msg}; {_SLURM_HINT}")
            # one line: Slurm's own words and the option that is the likely cause (an account,
            # a QOS, what a site's job_submit filter refuses), not sbatch's text alone
            raise HpcstackError(sbatch_refusal(proc.stderr, proc.returncode) + f" ({script})")
        job_id = proc.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise HpcstackError(f"sbatch --parsable printed {proc.stdout.strip()!r}, not a job id")
        return job_id

    def queued(self, job_ids: list[str]) -> dict[str, str]:
        """Return ``{job id: state}`` for the jobs ``squeue`` still lists (counts the call)."""
        self.squeue_calls += 1
        proc = self._call(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%i %T"])
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:  # all purged already
                return {}
            raise HpcstackError(f"squeue failed: {' '.join(proc.stderr.split())}; {_SLURM_HINT}")
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1]
        return states

    def info(self, job_id: str) -> JobInfo:
        """Return a job's state: ``scontrol show job``, else the jobcomp file, else UNKNOWN."""
        proc = self._call(["scontrol", "show", "job", "-o", job_id])
        if proc.returncode == 0 and proc.stdout.strip():
            return info_from_fields(job_id, parse_key_values(proc.stdout), "scontrol")
        found = self.jobcomp_info(job_id)
        return found or JobInfo(job_id, "UNKNOWN", reason="not known to scontrol nor in the jobcomp file")

    def jobcomp_location(self) -> str | None:
        """Return the ``jobcomp/filetxt`` file of the cluster (``scontrol show config``), if any."""
        if self._jobcomp is False:
            self._jobcomp = None
            proc = self._call(["scontrol", "show", "config"])
            conf = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", proc.stdout, re.M)) if proc.returncode == 0 else {}
            if conf.get("JobCompType") == "jobcomp/filetxt" and conf.get("JobCompLoc"):
                self._jobcomp = conf["JobCompLoc"]
        return self._jobcomp or None

    def jobcomp_info(self, job_id: str, path: str | None = None) -> JobInfo | None:
        """Find a finished job in a ``jobcomp/filetxt`` file (its last entry for ``job_id``).

        Args:
            job_id (str): the job.
            path (str | None): the file; default from :meth:`jobcomp_location`.
        """
        path = path or self.jobcomp_location()
        if not path:
            return None
        try:
            lines = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            if line.startswith(f"JobId={job_id} "):
                return info_from_fields(job_id, parse_key_values(line), "jobcomp")
        return None

    def wait(self, job_ids: list[str], timeout: float | None = None,
             on_change: Callable[[JobInfo], None] | None = None) -> dict[str, JobInfo]:
        """Poll ``squeue`` until every job has left the queue; return their final states.

        The interval between polls backs off (:attr:`backoff`) and starts again when a job ends.

        Args:
            job_ids (list[str]): the jobs.
            timeout (float | None): seconds; None waits as long as it takes.
            on_change (Callable | None): called with a :class:`JobInfo` (source ``squeue``) when a
                job changes state, and with the final one when it ends.

        Returns:
            dict[str, JobInfo]: job id -> final state.

        Raises:
            HpcstackError: timeout (the jobs are left alone; their ids are named).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        last: dict[str, str] = {}
        done: dict[str, JobInfo] = {}
        pending = list(job_ids)
        while pending:
            states = self.queued(pending)
            for job_id in list(pending):
                state = states.get(job_id)
                if state is None:
                    done[job_id] = info = self.info(job_id)
                    pending.remove(job_id)
                    self.backoff.reset()
                    if on_change:
                        on_change(info)
                elif state != last.get(job_id):
                    last[job_id] = state
                    if on_change:
                        on_change(JobInfo(job_id, state, source="squeue"))
            if not pending:
                break
            interval = self.backoff.next()
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HpcstackError(f"jobs {', '.join(pending)} still queued or running after "
                                        f"{timeout:.0f} s (scancel {' '.join(pending)} to stop them)")
                interval = min(interval, left)
            self._sleep(interval)
        self.backoff.reset()
        return done

    def cancel(self, job_ids: list[str]) -> None:
        """``scancel`` the jobs (as root directly; Slurm lets root cancel any job)."""
        if job_ids:
            proc = self._call(["scancel", *job_ids])
            if proc.returncode != 0:
                print(f"warning: scancel {' '.join(job_ids)}: {proc.stderr.strip()}", file=sys.stderr)
