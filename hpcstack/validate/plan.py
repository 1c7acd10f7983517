"""The plan of a validation, as install has its :class:`hpcstack.install.plan.Plan`: what
``hpcstack validate`` will run and how it will judge it, as data, built once by
:func:`plan_validation` from the site, the recipe and the command's options.

A :class:`ValidationPlan` holds

* the settings (:class:`~hpcstack.validate.settings.ValidationSettings`: the site's Slurm and
  ``--local`` shape, the recipe's workload, references and transport);
* the jobs: one :class:`ValidationJob` per node count, each running every backend one after the
  other, with its rendered script and each backend's argv (Slurm); or the one
  :class:`LocalRun` (``--local``);
* the transport each backend's runs must use (``nccl`` on NCCL builds);
* the judge's rules (:class:`JudgeRules`): references, figures, the record every rank writes,
  the records each backend must write, GPUs per node.

Every renderer reads it: the CLI (its dry run prints the jobs' scripts or the local commands,
``--json`` the plan's :meth:`ValidationPlan.to_dict`), the ReFrame export
(:mod:`hpcstack.export.reframe`) and the GPU benchmark (``benchmarks/gpu.py``, through
:meth:`ValidationPlan.program_argv`). The runners (:mod:`hpcstack.validate.runner`) run it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack import __version__
from hpcstack.errors import ConfigError
from hpcstack.modules import modsys
from hpcstack.validate import fingerprint
from hpcstack.validate.launchers import LAUNCHERS, get_launcher
from hpcstack.validate.scheduler import get_scheduler
from hpcstack.validate.transport import OmpiRule, TransportRule, nccl_env, ompi_env
from hpcstack.validate.settings import (SlurmSettings, ValidationSettings, stack_layout,
                                        validation_settings)



def launcher_of(settings: ValidationSettings, backend: str, site_launcher: str) -> str:
    """The launcher a backend's runs take where the site names ``site_launcher``
    (:meth:`hpcstack.install.components.backends.Backend.launcher_for`).

    Raises:
        ConfigError: the backend is unknown, or names a launcher hpcstack has not.
    """
    try:
        name = settings.spec.backend(backend).launcher_for(site_launcher)
    except ValueError as exc:
        raise ConfigError([f"backend {backend}: {exc}"]) from None
    if name not in LAUNCHERS:
        raise ConfigError([f"backend {backend}: unknown launcher {name!r} (known: {', '.join(sorted(LAUNCHERS))})"])
    return name


@dataclass(frozen=True)
class JudgeRules:
    """How the runs are judged (:func:`hpcstack.validate.judge.judge`, ``sanity_reasons``).

    Attributes:
        references (dict): the recipe's performance references (``{}`` for a named workload).
        figures (dict[str, Figure]): the figures of the validation file, in report order.
        every_rank (str | None): a record kind every rank writes.
        transports (dict[str, str | None]): backend -> the transport its runs must use.
        records (dict[str, tuple[str, ...]]): backend -> record kinds its runs must write.
        gpus_per_node (int): GPUs per node (0: no GPU binding rule).
        transport (TransportRule | None): the site's fabric, held to the jobs' NCCL logs
            (:func:`hpcstack.validate.transport.judge_nccl`); None: no NCCL log is read.
        ompi (OmpiRule | None): the CPU path's, held to Open MPI's BML lines in the output of
            each job whose runs use MPI (:func:`hpcstack.validate.transport.judge_ompi`); None
            where the jobs log NCCL instead, or run locally.
    """

    references: dict
    figures: dict
    every_rank: str | None
    transports: dict
    records: dict
    gpus_per_node: int = 0
    transport: TransportRule | None = None
    ompi: OmpiRule | None = None

    def references_at(self, site: str, partition: str, nodes: int) -> dict:
        """The references of a run on ``nodes`` nodes of ``site:partition``
        (:func:`hpcstack.validate.judge.lookup_references`): figure -> Reference."""
        from hpcstack.validate.judge import lookup_references

        return lookup_references(self.references, site, partition, nodes)

    @property
    def required_transport(self) -> str | None:
        """The transport every run must use (the same for every backend), or None."""
        return next((t for t in self.transports.values() if t), None)

    def to_dict(self) -> dict:
        """The rules as data."""
        return {"references": self.references, "every_rank": self.every_rank,
                "transports": dict(self.transports), "records": {b: list(r) for b, r in self.records.items()},
                "gpus_per_node": self.gpus_per_node,
                "transport": dataclasses.asdict(self.transport) if self.transport else None,
                "ompi": dataclasses.asdict(self.ompi) if self.ompi else None,
                "figures": {n: dataclasses.asdict(f) for n, f in self.figures.items()}}


@dataclass(frozen=True)
class LocalRun:
    """The run of ``--local``: one backend on ``ranks`` ranks of this host.

    Attributes:
        backend (str): the backend it runs.
        ranks (int): its ranks.
        launcher (str): the launcher's name.
        env (dict[str, str]): variables set for the launcher (the site's ``slurm.env`` and
            ``launcher.env``).
        module_lines (list[str]): the ``module`` commands that load the stack, for the dry run.
    """

    backend: str
    ranks: int
    launcher: str
    env: dict
    module_lines: list
    settings: ValidationSettings = field(repr=False, compare=False, default=None)
    prefix: str = ""

    def argv(self, output: str) -> list[str]:
        """The launcher's command line that runs the program, writing its records to ``output``."""
        s = self.settings.local
        alloc = get_scheduler(s.scheduler)().allocation(1, self.ranks, s.cpus_per_task)
        launcher = get_launcher(self.launcher)(mpi=s.mpi)
        return launcher.argv(local_program(self.settings, self.prefix, output, self.backend, self.ranks), alloc)

    def to_dict(self) -> dict:
        """The run as data (its argv with records in ``records.jsonl``)."""
        return {"backend": self.backend, "ranks": self.ranks, "launcher": self.launcher,
                "env": dict(self.env), "modules": list(self.module_lines), "argv": self.argv("records.jsonl")}


@dataclass(frozen=True)
class PlanOptions:
    """The command's options that shape a validation.

    Attributes:
        local (bool): plan the ``--local`` run (also for a site without a ``slurm`` section).
        nodes (list[int] | None): node counts; default the recipe's.
        backends (list[str] | None): backends of the jobs; default the recipe's.
        backend (str | None): the ``--local`` run's backend; default the first that runs locally.
        ranks (int | None): the ``--local`` run's ranks; default the site's ``launcher.ranks``.
        partition, qos, account (str | None): override the site's ``slurm`` values.
        workload (str | None): a named workload of the recipe.
        output_dir (Path | None): the validation's directory (jobs in ``<dir>/n<N>``).
    """

    local: bool = False
    nodes: list | None = None
    backends: list | None = None
    backend: str | None = None
    ranks: int | None = None
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    workload: str | None = None
    output_dir: Path | None = None


@dataclass(frozen=True)
class ValidationPlan:
    """A validation as data (see the module's docstring); built by :func:`plan_validation`.

    Attributes:
        site, recipe (str): the site's name, the stack's ``name/version``.
        mode (str): ``slurm`` or ``local``.
        settings (ValidationSettings): everything taken from the site and recipe.
        nodes (list[int]), backends (list[str]): the jobs' node counts and backends.
        prefix (str): the stack's prefix.
        rules (JudgeRules): how the runs are judged.
        jobs (list[ValidationJob]): the Slurm jobs (empty for ``local``, or without a directory).
        local (LocalRun | None): the ``--local`` run.
        output_dir (Path | None): the jobs' directory.
    """

    site: str
    recipe: str
    mode: str
    settings: ValidationSettings
    nodes: list
    backends: list
    prefix: str
    rules: JudgeRules
    jobs: list = field(default_factory=list)
    local: LocalRun | None = None
    output_dir: Path | None = None

    def program_argv(self, backend: str, output: str, *, ranks: int, nodes: int, threads: int,
                     prefix: str | None = None, workload: dict | None = None) -> list[str]:
        """The validation program's command line for one run of ``backend``, without launcher
        (:meth:`hpcstack.install.components.validation.Program.argv`).

        Args:
            backend (str): a backend of the plan's recipe.
            output (str): the JSON-lines file the program writes.
            ranks, nodes (int): the run's ranks in all and node count.
            threads (int): cores (threads) per rank.
            prefix (str | None): the stack's prefix; default the plan's.
            workload (dict | None): the workload's settings; default the plan's.
        """
        return self.settings.spec.program.argv(
            self.settings.workload if workload is None else workload, prefix=prefix or self.prefix,
            backend=backend, output=output, threads=threads, ranks=ranks, nodes=nodes)

    def setup_lines(self, job_id_variable: str | None) -> list[str]:
        """The backends' shell lines a batch job runs before the program, each once
        (:meth:`hpcstack.install.components.backends.Backend.setup_lines`)."""
        return list(dict.fromkeys(line for b in self.backends
                                  for line in self.settings.spec.backend(b).setup_lines(job_id_variable)))

    def at(self, site, recipe, output_dir: Path) -> "ValidationPlan":
        """The plan with its Slurm jobs rendered in ``output_dir`` (``<output_dir>/n<N>``).

        Raises:
            ConfigError: as :func:`plan_jobs`.
        """
        jobs = plan_jobs(site, recipe, self.nodes, self.backends, self.settings, Path(output_dir))
        return dataclasses.replace(self, jobs=jobs, output_dir=Path(output_dir))

    def to_dict(self) -> dict:
        """The plan as data (``hpcstack validate --dry-run --json``)."""
        s = self.settings
        return {"site": self.site, "recipe": self.recipe, "mode": self.mode, "prefix": self.prefix,
                "nodes": list(self.nodes), "backends": list(self.backends),
                "output_dir": str(self.output_dir) if self.output_dir else None,
                "settings": {"workload": s.workload, "workload_name": s.workload_name, "layout": s.layout,
                             "slurm": dataclasses.asdict(s.slurm) if s.slurm else None,
                             "local": dataclasses.asdict(s.local)},
                "backend_declarations": {b: s.spec.backend(b).to_dict() for b in self.backends},
                "transports": dict(self.rules.transports), "rules": self.rules.to_dict(),
                "jobs": [j.to_dict() for j in self.jobs],
                "local": self.local.to_dict() if self.local else None}


def logs_nccl(settings: ValidationSettings) -> bool:
    """True where the jobs run NCCL on GPUs (``slurm.gpus_per_node`` > 0 and the runs must use
    ``nccl``): they log NCCL's choices per rank and the judge reads them
    (:mod:`hpcstack.validate.transport`)."""
    return bool(settings.slurm and settings.slurm.gpus_per_node) and settings.required_transport == "nccl"


def plan_validation(site, recipe, options: PlanOptions = PlanOptions()) -> ValidationPlan:
    """Build the validation's plan: the one place that turns (site, recipe, options) into the
    jobs, their argv and scripts, the transports and the judge's rules.

    Args:
        site (hpcstack.site.Site): the site.
        recipe (hpcstack.recipe.Recipe): the recipe, with a Validation component.
        options (PlanOptions): the command's options.

    Returns:
        ValidationPlan: with ``jobs`` where the mode is ``slurm`` and ``options.output_dir`` is
        given, ``local`` where the mode is ``local``.

    Raises:
        ConfigError: a bad site or validation file, an unknown launcher or backend, no backend
            that runs locally, no ``modules.init.bash`` for Slurm jobs.
    """
    o = options
    settings = validation_settings(site, recipe, partition=o.partition, qos=o.qos, account=o.account,
                                   workload=o.workload)
    local = o.local or settings.slurm is None
    nodes = list(o.nodes or settings.nodes)
    backends = [o.backend or local_backends(settings)[0]] if local else list(o.backends or settings.backends)
    prefix = stack_layout(site, recipe).prefix
    spec = settings.spec
    unknown = [f"backend {b}: not a backend of {recipe.full_name}'s validation (known: {', '.join(spec.backends)})"
               for b in backends if b not in spec.backends]
    if unknown:
        raise ConfigError(unknown)
    rules = JudgeRules(references=settings.references, figures=spec.figures, every_rank=spec.every_rank,
                       transports={b: settings.required_transport for b in backends},
                       records={b: tuple(spec.backend(b).records) for b in backends},
                       gpus_per_node=0 if local else settings.slurm.gpus_per_node,
                       # NCCL's GPU jobs log its choices (plan_jobs), held to the site's network
                       transport=None if local or not logs_nccl(settings) else TransportRule.of_site(site),
                       # the CPU path: Open MPI says which BTL it uses per peer (plan_jobs)
                       ompi=None if local or logs_nccl(settings) else OmpiRule.of_site(site))
    plan = ValidationPlan(site.name, recipe.full_name, "local" if local else "slurm", settings, nodes,
                          backends, prefix, rules)
    if local:
        return dataclasses.replace(plan, local=_local_run(site, recipe, settings, backends[0], o.ranks, prefix))
    return plan.at(site, recipe, o.output_dir) if o.output_dir else plan


def _local_run(site, recipe, settings: ValidationSettings, backend: str, ranks: int | None, prefix: str) -> LocalRun:
    """The ``--local`` run of :func:`plan_validation`."""
    from shlex import quote

    lines = [f"module use {quote(d)}" for d in site.modules.use]
    lines += [f"module load {quote(m)}" for m in site.modules.preloads]
    lines += [f"module use {quote(site.module_root)}", f"module load {recipe.full_name}"]
    return LocalRun(backend, ranks or settings.local.ranks, launcher_of(settings, backend, settings.local.launcher),
                    dict(settings.local.env), lines, settings, prefix)



def local_program(settings: ValidationSettings, prefix: str, output: str, backend: str | None = None,
                  ranks: int | None = None) -> list[str]:
    """Return the program's command line for a local run.

    The same command as a Slurm job's (:meth:`hpcstack.validate.workload.Program.argv`): the
    workload the recipe gives for this site and its Slurm partition, ``{threads}`` from
    :attr:`LocalSettings.threads`, after the program's ``interpreter`` where it names one.

    Args:
        settings (ValidationSettings): its ``spec``, ``workload`` and ``local``.
        prefix (str): the stack's prefix.
        output (str): JSON-lines file the program writes.
        backend (str | None): default the recipe's first backend that runs locally.
        ranks (int | None): default the site's ``launcher.ranks``.

    Example:
        ``["python", "<prefix>/bin/hpcstack-train-benchmark", "--backend", "horovod", "--model",
        "tiny", …, "--threads", "1", "--output", "records.jsonl"]``
    """
    program = settings.spec.program
    backend = backend or local_backends(settings)[0]
    argv = program.argv(settings.workload, prefix=prefix, backend=backend, output=output,
                        threads=settings.local.threads, ranks=ranks or settings.local.ranks, nodes=1)
    return [program.interpreter, *argv] if program.interpreter else argv


def local_backends(settings: ValidationSettings) -> list[str]:
    """The recipe's backends that ``--local`` can run.

    Raises:
        ConfigError: none can.
    """
    found = settings.spec.local_backends
    if not found:
        raise ConfigError([f"--local: none of the recipe's backends ({', '.join(settings.backends)}) "
                           "runs without a batch job"])
    return found



#: Workload settings -> options of the PyTorch trainer, as its recipe's validation file declares
#: them (``program.options``); for :func:`trainer_argv`.
_TRAINER_OPTIONS = {"model": "--model", "image_size": "--image-size", "batch_size": "--batch-size",
                    "precision": "--precision", "device": "--device",
                    "warmup_batches": "--num-warmup-batches", "batches_per_iter": "--num-batches-per-iter",
                    "iterations": "--num-iters", "convergence_steps": "--convergence-steps",
                    "loss_threshold": "--loss-threshold", "epochs": "--epochs", "lr": "--lr",
                    "accuracy_threshold": "--accuracy-threshold", "channels_last": "--channels-last"}



def trainer_argv(workload: dict, prefix: str, backend: str, output: str, threads: int) -> list[str]:
    """Return the PyTorch trainer's command line for one backend in a Slurm job, as the PyTorch
    recipe's validation file declares it (the generic path is
    :meth:`hpcstack.validate.workload.Program.argv`; this one is kept for the trainer's tests).

    Args:
        workload (dict): :attr:`ValidationSettings.workload`: model, sizes, precision, device,
            iterations and the convergence check's steps and loss threshold (only those given
            become options).
        prefix (str): the stack's prefix (the program is ``<prefix>/bin/hpcstack-train-benchmark``).
        backend (str): ``horovod`` or ``ddp``.
        output (str): JSON-lines file rank 0 writes.
        threads (int): torch threads per rank (the job's cpus per task).
    """
    argv = [os.path.join(prefix, "bin", "hpcstack-train-benchmark"), "--backend", backend]
    for key, option in _TRAINER_OPTIONS.items():
        if isinstance(workload.get(key), bool):  # a flag: given when true
            argv += [option] if workload[key] else []
        elif key in workload:
            argv += [option, str(workload[key])]
    return argv + ["--threads", str(threads), "--output", output]



@dataclass
class ValidationJob:
    """One Slurm job of a validation: N nodes, every backend one after another.

    Attributes:
        nodes (int): node count.
        directory (Path): its directory (job script, output, records).
        script (str): the rendered job script.
        backends (list[str]): the backends it runs.
        ranks (int): nodes x tasks per node.
        job_id (str | None): once submitted.
    """

    nodes: int
    directory: Path
    script: str
    backends: list[str]
    ranks: int
    job_id: str | None = None

    @property
    def script_path(self) -> Path:
        """The job script, ``<directory>/job.sh``."""
        return self.directory / "job.sh"

    def records_path(self, backend: str) -> Path:
        """The JSON-lines records of one backend's run, ``<directory>/<backend>.jsonl``."""
        return self.directory / f"{backend}.jsonl"

    def status_path(self, backend: str) -> Path:
        """The file the job script writes one backend's exit status into."""
        return self.directory / f"{backend}.exit"

    def to_dict(self) -> dict:
        """The job as data: node count, ranks, backends, directory, script path and text."""
        return {"nodes": self.nodes, "ranks": self.ranks, "backends": list(self.backends),
                "directory": str(self.directory), "path": str(self.script_path), "script": self.script,
                "job_id": self.job_id}

    def output_path(self) -> Path:
        """The job's output file (stdout and stderr), ``<directory>/slurm-<job id>.out``."""
        return self.directory / f"slurm-{self.job_id or '%j'}.out"



def plan_jobs(site, recipe, nodes: list[int], backends: list[str], settings: ValidationSettings,
              output_dir: Path) -> list[ValidationJob]:
    """Render one job script per node count, with the scheduler and launcher the settings name.

    Args:
        site (hpcstack.site.Site): the site (module tool, its init and module roots).
        recipe (hpcstack.recipe.Recipe): the stack.
        nodes (list[int]): node counts.
        backends (list[str]): backends each job runs, in order.
        settings (ValidationSettings): with ``slurm`` set (partition, shape, launcher, ...).
        output_dir (Path): the validation's directory; job N uses ``<output_dir>/n<N>/``.

    Returns:
        list[ValidationJob]: not yet written nor submitted.

    Raises:
        ConfigError: the site gives no bash init for its module tool.
    """
    from hpcstack.validate.scheduler import BatchJob, JobStep

    s = settings.slurm
    init = site.modules.init.get("bash")
    if not init:
        raise ConfigError([f"{site.path}: modules.init.bash: missing key (Slurm jobs source it to get `module`)"])
    scheduler = get_scheduler(s.scheduler)()
    program = settings.spec.program
    prefix = stack_layout(site, recipe).prefix
    comments = [f"Written by hpcstack {__version__}: hpcstack validate {recipe.full_name} --site {site.name}.",
                "Submit with: sbatch job.sh. Its directory (--chdir, --output) must exist first and "
                "be writable on the compute nodes; hpcstack validate creates it."]
    if not s.account and s.account_required:
        comments.append("No account given, and this site charges jobs to a budget: pass --account=BUDGET "
                        "to hpcstack, add #SBATCH --account=BUDGET, or export SBATCH_ACCOUNT=BUDGET before sbatch.")
    jobs = []
    for n in nodes:
        directory = output_dir / f"n{n}"
        alloc = scheduler.allocation(n, s.tasks_per_node, s.cpus_per_task)
        steps, backend_setup, launcher_setup = [], [], []
        for backend in backends:
            launcher = get_launcher(launcher_of(settings, backend, s.launcher))(
                mpi=s.mpi, options=_srun_options(s, alloc))
            argv = program.argv(settings.workload, prefix=prefix, backend=backend,
                                output=str(directory / f"{backend}.jsonl"), threads=s.cpus_per_task,
                                ranks=alloc.ranks, nodes=n)
            steps.append(JobStep(backend, launcher.command(argv, alloc), str(directory / f"{backend}.exit")))
            backend_setup += settings.spec.backend(backend).setup_lines(scheduler.job_id_variable)
            launcher_setup += launcher.setup(alloc)
        # once each, the backends' lines (DDP's port) before the launchers' (host lists); then the
        # environment's fingerprint into the job's directory (the history keeps it: fingerprint.py)
        setup = list(dict.fromkeys(backend_setup + launcher_setup))
        setup.append(fingerprint.job_line(directory / fingerprint.FILENAME))
        job = BatchJob(
            name=f"hpcstack-validate-{recipe.name}-n{n}", nodes=n,
            tasks_per_node=s.tasks_per_node, cpus_per_task=s.cpus_per_task,
            time_limit=s.time_limit, output=str(directory / "slurm-%j.out"),
            workdir=str(directory), module_init=init, partition=s.partition if s.partition_option else None,
            qos=s.qos, account=s.account, gpus_per_node=s.gpus_per_node,
            gpu_request=s.gpu_request, constraint=s.constraint, exclusive=s.exclusive,
            # the site's dirs, its profiles and module hierarchy (which may reset MODULEPATH), then the stack's root
            module_use=list(site.modules.use), module_preloads=site.modules.preloads,
            module_use_after=[site.module_root], module_load=[recipe.full_name],
            # NCCL's GPU jobs: every rank writes NCCL's choices to <directory>/nccl-%h-%p.log (transport.py)
            # the CPU path's jobs: Open MPI's BML names each peer's BTL in the job's output
            env={**s.env, **(nccl_env(str(directory)) if logs_nccl(settings)
                             else ompi_env() if OmpiRule.of_site(site) else {})},
            task_options=s.task_options, mem=s.mem, mem_per_cpu=s.mem_per_cpu, mem_per_gpu=s.mem_per_gpu,
            extra_options=list(s.extra_options),
            setup=setup,
            steps=steps, comments=comments,
            unset_bash_env=modsys.get_tool(site.modules.tool).job_unsets_bash_env)
        header = (f"hpcstack validation of {recipe.full_name} on {site.name}:{s.partition}, "
                  f"{n} node(s) x {s.tasks_per_node} rank(s): {', '.join(backends)}")
        jobs.append(ValidationJob(n, directory, scheduler.render(job, header), list(backends),
                                  alloc.ranks))
    return jobs


def _srun_options(s: SlurmSettings, alloc) -> list[str]:
    """Options for an ``srun`` launcher after its own: the job's task count where the tasks' shape
    is given to srun alone (``slurm.task_options: srun``, as Cirrus's GPU examples write
    ``srun --ntasks=8 --tasks-per-node=4``), then the site's ``slurm.srun_options``; none for
    other launchers (they ignore the site's srun options)."""
    if s.launcher != "srun":
        return []
    return ([f"--ntasks={alloc.ranks}"] if s.task_options == "srun" else []) + list(s.srun_options)


