"""``hpcstack validate``: prove an installed stack by running the recipe's validation program on
it, in Slurm jobs or locally.

The recipe declares its validation (:mod:`hpcstack.validate.workload`): the program (a command
with placeholders, e.g. the PyTorch stack's ``<prefix>/bin/hpcstack-train-benchmark``), the
backends it offers (:mod:`hpcstack.validate.backends`), its workloads, the figures it reports as
JSON lines and their units, how sanity is judged, and the references.

**Slurm** (the default for a site with a ``slurm`` section): for each node count (``--nodes 1,2``)
one job script is rendered by the ``slurm`` scheduler (:mod:`hpcstack.validate.scheduler`, from
``templates/slurm-job.sh.j2``) and submitted with ``sbatch --parsable``; each job sources the module
tool's init, loads the stack's module and runs the program once per backend (the recipe's order)
with the launcher the backend needs, by default the one the site names in ``slurm.launcher``
(:mod:`hpcstack.validate.launchers`). hpcstack polls until the jobs end, reads their JSON-lines
records and judges them (:mod:`hpcstack.validate.judge`): sanity, then performance against the
site's references, scaling efficiency; the report goes to the output directory as
``report.json``, ``report.md`` and ``scaling.png`` (:mod:`hpcstack.validate.render`).

**Local** (``--local``, or a site without a ``slurm`` section): the ``local`` scheduler runs the
program on ``--ranks`` ranks of this host under the launcher the site names in
``launcher.command``, the recipe's first backend that runs locally, with what a Slurm job would take from the site: the MPI
plugin, cores and threads per rank, environment (``slurm.mpi``, ``slurm.cpus_per_task``,
``slurm.env`` under ``launcher.env``) and the recipe's workload for the site's partition (model,
device, ...); the result is PASS/FAIL from the same sanity checks as a job's.

Schedulers and launchers are picked by name from registries; every value this module takes from
the site is read in one function, :func:`validation_settings`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pwd
import re
import shlex
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpcstack import __version__
from hpcstack import trust
from hpcstack.fsutil import makedirs_no_follow, read_no_follow, write_no_follow
from hpcstack.modules import modsys
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.site import MAX_NODES
from hpcstack.install.components.backends import get_backend
from hpcstack.validate.launchers import LAUNCHERS, get_launcher
from hpcstack.validate.scheduler import check_sbatch_value, get_scheduler
from hpcstack.install.components.validation import ValidationSpec, validation_of


# --------------------------------------------------------------------------------------------
# Settings: everything taken from the site, read in one place
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmSettings:
    """The Slurm settings of a validation: the site's ``slurm`` section with command-line overrides.

    Attributes:
        partition, qos, account (str | None): where and on whose budget the jobs run.
        tasks_per_node (int): ranks per node (one per GPU on GPU sites).
        cpus_per_task (int): cores per rank (also torch's threads per rank).
        gpus_per_node (int): GPUs per node when > 0, asked for as ``gpu_request`` says.
        gpu_request (str): ``gres`` (``--gres=gpu:N``) or ``gpus-per-node`` (``--gpus-per-node=N``).
        constraint (str | None): ``--constraint`` (node features, e.g. ``gpu`` on Perlmutter).
        partition_option (bool): write ``--partition``; False where the partition only names the
            node class for references and workloads (Perlmutter: constraint and QOS select nodes).
        time_limit (str): per job, ``[D-]HH:MM:SS``.
        exclusive (bool): whole nodes.
        launcher (str): a name in :data:`hpcstack.validate.launchers.LAUNCHERS`.
        mpi (str | None): the launcher's MPI plugin (``srun --mpi=``); None: the cluster's default.
        submit_as (str | None): user that submits when hpcstack runs as root.
        env (dict[str, str]): job environment.
        account_required (bool): the site charges every job to a budget.
        output_root (str | None): where validation directories go (None: the working directory).
        scheduler (str): a name in :data:`hpcstack.validate.scheduler.SCHEDULERS`.
        accounting (bool): the cluster keeps job accounting (``sacct`` works); False on a
            cluster without slurmdbd (localhost). hpcstack's own jobs need none; a ReFrame check
            polls with ``sacct`` where there is accounting, else with ``squeue``.
        task_options (str): ``sbatch`` or ``srun``: where the tasks' shape goes
            (``slurm.task_options``; ``srun`` on Cirrus's GPU nodes).
        srun_options (tuple[str, ...]): options of every ``srun`` step (``slurm.srun_options``).
        login_only_paths (tuple[str, ...]): directories the jobs do not see (``slurm.login_only_paths``).
    """

    partition: str
    qos: str | None
    account: str | None
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    time_limit: str
    exclusive: bool
    launcher: str
    mpi: str | None
    submit_as: str | None
    env: dict
    account_required: bool = False
    output_root: str | None = None
    scheduler: str = "slurm"
    gpu_request: str = "gres"
    constraint: str | None = None
    partition_option: bool = True
    accounting: bool = True
    task_options: str = "sbatch"
    srun_options: tuple = ()
    login_only_paths: tuple = ()


@dataclass(frozen=True)
class LocalSettings:
    """The settings of a ``--local`` run: the site's ``launcher`` section, and what the Slurm jobs
    would take from its ``slurm`` section (so that a ``--local`` run on a compute node trains as a
    job would).

    Attributes:
        launcher (str): a name in :data:`hpcstack.validate.launchers.LAUNCHERS`.
        ranks (int): default rank count.
        env (dict[str, str]): variables for the launcher: the site's ``slurm.env`` (as in the jobs)
            updated with its ``launcher.env``.
        mpi (str | None): the launcher's MPI plugin: the site's ``slurm.mpi`` (None without one).
        cpus_per_task (int): cores per rank (the launcher's ``--cpus-per-task`` where it has one):
            the site's ``slurm.cpus_per_task``, 1 without a ``slurm`` section.
        threads (int): torch threads per rank (``--threads``): ``slurm.cpus_per_task`` as in the
            jobs; 0 (the training program's own choice: cores // ranks) without a ``slurm`` section.
        scheduler (str): ``local``.
    """

    launcher: str
    ranks: int
    env: dict
    mpi: str | None = None
    cpus_per_task: int = 1
    threads: int = 0
    scheduler: str = "local"


@dataclass(frozen=True)
class ValidationSettings:
    """What ``hpcstack validate`` takes from the site, built by :func:`validation_settings`.

    Attributes:
        workload (dict[str, object]): the training program's settings (``model``,
            ``image_size``, ``batch_size``, ``precision``, ``device``, iterations, convergence
            steps and loss threshold), as the site gives them.
        nodes (list[int]): default node counts of the Slurm jobs.
        backends (list[str]): default backends of the Slurm jobs.
        references (dict): performance references per ``site:partition`` and node count.
        required_transport (str | None): a transport every run must use (``nccl`` on NCCL builds).
        local (LocalSettings): the ``--local`` run.
        slurm (SlurmSettings | None): the Slurm jobs; None for a site without a ``slurm`` section.
        workload_name (str | None): the named workload (``--workload``); None: the site's own.
        spec (ValidationSpec | None): the recipe's validation: program, backends, figures, sanity.
        layout (str): the site's ``layout`` (``directory`` or ``squashfs``): where the ranks
            import the stack from, reported beside the start-up figure.
    """

    workload: dict
    nodes: list[int]
    backends: list[str]
    references: dict
    required_transport: str | None
    local: LocalSettings
    slurm: SlurmSettings | None = None
    workload_name: str | None = None
    spec: ValidationSpec | None = None
    layout: str = "directory"


def validation_settings(site, recipe, *, partition: str | None = None, qos: str | None = None,
                        account: str | None = None, workload: str | None = None) -> ValidationSettings:
    """Read the validation settings: the one place that reads the site and recipe for validation.

    From the site, the machine: ``site.launcher``, ``site.slurm`` (partition, tasks, GPUs, cores
    per task, MPI plugin, environment; the ``--local`` run takes the last four from it too, see
    :class:`LocalSettings`); from the recipe (a site describes only the machine), what to train and how to judge it: its :class:`Validation`
    component's workload for this site and partition, its references, and the transport the
    Horovod build must use (``nccl`` where it is built with NCCL GPU operations, i.e. on a site
    whose toolchain has CUDA).

    Args:
        site (hpcstack.site.Site): the site (already validated against its schema).
        recipe (hpcstack.recipe.Recipe): the recipe, with a Validation component.
        partition, qos, account (str | None): command-line values; they win over the site's.
        workload (str | None): a named workload of the recipe (``--workload digits``); None:
            the recipe's workload for the site and partition. A named workload gets no
            performance references (they are figures of the site's own workload): it is judged
            on sanity alone, its img/s reported.

    Returns:
        ValidationSettings: with ``slurm`` None when the site has no ``slurm`` section.

    Raises:
        ConfigError: ``slurm.launcher`` or ``launcher.command`` names no registered launcher; the
            recipe has no Validation component or its file is bad.
    """
    spec = validation_of(recipe)
    s = dict(site.slurm or {})
    slurm = None
    if s:
        slurm = SlurmSettings(
            partition=partition or s["partition"], qos=qos or s.get("qos"),
            account=account or s.get("account"), tasks_per_node=s.get("tasks_per_node", 1),
            cpus_per_task=s.get("cpus_per_task", 1), gpus_per_node=s.get("gpus_per_node", 0),
            time_limit=s.get("time_limit", "00:30:00"), exclusive=s.get("exclusive", False),
            launcher=s.get("launcher", "srun"), mpi=s.get("mpi"), submit_as=s.get("submit_as"),
            env=dict(s.get("env", {})), account_required=bool(s.get("account_required")),
            output_root=s.get("output_root"), gpu_request=s.get("gpu_request", "gres"),
            constraint=s.get("constraint"), partition_option=s.get("partition_option", True),
            accounting=s.get("accounting", True), task_options=s.get("task_options", "sbatch"),
            srun_options=tuple(s.get("srun_options") or ()),
            login_only_paths=tuple(s.get("login_only_paths") or ()))
    local = LocalSettings(launcher=site.launcher.command, ranks=site.launcher.ranks,
                          env={**s.get("env", {}), **site.launcher.env}, mpi=s.get("mpi"),
                          cpus_per_task=s.get("cpus_per_task", 1),
                          threads=s.get("cpus_per_task", 0) if s else 0)
    named = [("launcher.command", local.launcher)] + ([("slurm.launcher", slurm.launcher)] if slurm else [])
    unknown = [f"{site.path}: {key}: unknown launcher {name!r} (known: {', '.join(sorted(LAUNCHERS))})"
               for key, name in named if name not in LAUNCHERS]
    if unknown:
        raise ConfigError(unknown)
    return ValidationSettings(
        workload=spec.workload(site, slurm.partition if slurm else None, workload),
        nodes=list(spec.nodes), backends=list(spec.backends),
        # the references are figures of the site's own workload (its model and sizes): a named
        # workload is judged on sanity alone (for digits: its test accuracy), its img/s reported
        references=dict(spec.references) if workload is None else {},
        required_transport=_required_transport(site, recipe),
        local=local, slurm=slurm, workload_name=workload, spec=spec,
        layout=_layout_of(site))


def _layout_of(site) -> str:
    """The site's layout (:func:`hpcstack.install.image.layout_of`)."""
    from hpcstack.install.image import layout_of

    return layout_of(site)


def _required_transport(site, recipe) -> str | None:
    """The transport every run must use on this site, or None: where the site's toolchain has
    CUDA, ``nccl`` when a component of the recipe builds NCCL GPU operations (its
    ``gpu_operations`` is ``NCCL``, as Horovod's), else the validation file's
    ``sanity.cuda_transport`` (a stack that trains with a framework's own collectives, e.g.
    torch.distributed over NCCL)."""
    if not site.toolchain.has_cuda:
        return None
    builds = [c for c in recipe.components if getattr(c, "gpu_operations", None)]
    if builds:
        return "nccl" if builds[0].gpu_operations == "NCCL" else None
    return validation_of(recipe).cuda_transport


def stack_layout(site, recipe):
    """The stack's :class:`hpcstack.install.layout.StackLayout` at ``site``: every path of it."""
    from hpcstack.install.layout import StackLayout

    return StackLayout.for_site(site, recipe.name, recipe.version)


def installed_stack(site, recipe):
    """The published stack, found through its layout and provenance
    (:meth:`hpcstack.install.service.InstallService.installed`).

    Raises:
        HpcstackError: not installed for this site; the message says how to install it.
    """
    from hpcstack.install.service import InstallService

    return InstallService(site, recipe).installed()


# --------------------------------------------------------------------------------------------
# Local
# --------------------------------------------------------------------------------------------


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


def read_records(path: Path) -> list[dict]:
    """Read the JSON-lines output of the training program (lines that are not JSON are skipped)."""
    return parse_records(path.read_text())


def parse_records(text: str) -> list[dict]:
    """The records of JSON-lines text (lines that are not JSON are skipped)."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def local_validation(site, recipe, ranks: int | None = None, dry_run: bool = False,
                     as_json: bool = False, workload: str | None = None,
                     backend: str | None = None) -> int:
    """Load the stack's module, run the validation program on ``ranks`` ranks, report.

    Args:
        site (hpcstack.site.Site): the site.
        recipe (hpcstack.recipe.Recipe): the installed recipe.
        ranks (int | None): default the site's ``launcher.ranks``.
        dry_run (bool): print the commands instead.
        as_json (bool): print the records as JSON instead of a summary.
        workload (str | None): a named workload of the recipe (``digits``); None: the site's.
        backend (str | None): a backend that runs locally; default the recipe's first.

    Returns:
        int: 0 when the run passed its checks, 1 otherwise.

    Raises:
        HpcstackError: the stack is not installed, the module does not load, or the launcher fails.
    """
    all_settings = validation_settings(site, recipe, workload=workload)
    settings = all_settings.local
    ranks = ranks or settings.ranks
    backend = backend or local_backends(all_settings)[0]
    layout = stack_layout(site, recipe)
    prefix = layout.prefix
    hierarchy = list(site.modules.hierarchy)
    scheduler = get_scheduler(settings.scheduler)()
    launcher = get_launcher(get_backend(backend).launcher_for(settings.launcher))(mpi=settings.mpi)
    alloc = scheduler.allocation(1, ranks, settings.cpus_per_task)
    with tempfile.TemporaryDirectory(prefix="hpcstack-validate-") as tmp:
        output = os.path.join(tmp, "records.jsonl") if not dry_run else "records.jsonl"
        argv = launcher.argv(local_program(all_settings, prefix, output, backend, ranks), alloc)
        if dry_run:
            lines = [f"module use {shlex.quote(d)}" for d in site.modules.use]
            lines += [f"module load {shlex.quote(m)}" for m in hierarchy]
            lines += [f"module use {shlex.quote(site.module_root)}", f"module load {recipe.full_name}"]
            lines += [f"export {k}={shlex.quote(v)}" for k, v in settings.env.items()]
            print("\n".join(lines + [shlex.join(argv)]))
            return 0
        installed_stack(site, recipe)
        # the site's hierarchy first (it may reset MODULEPATH), then the module root and the stack
        env = modsys.build_environment(site.modules.tool, site.modules.command, site.modules.use, hierarchy)
        env = modsys.build_environment(site.modules.tool, site.modules.command, [site.module_root],
                                       [recipe.full_name], env=env)
        env.update(settings.env)
        print(f"==> validate {recipe.full_name}: {shlex.join(argv)}", file=sys.stderr)
        try:
            proc = scheduler.run(argv, env=env, cwd=tmp, timeout=1800)
        except HpcstackError as exc:
            raise HpcstackError(f"validate {recipe.full_name} (launcher {launcher.name}): {exc}")
        records = read_records(Path(output)) if os.path.exists(output) else []
    return report_local(records, proc.returncode, proc.stdout + proc.stderr, as_json,
                        settings=all_settings, backend=backend, ranks=ranks)


def report_local(records: list[dict], returncode: int, output: str, as_json: bool = False, *,
                 settings: ValidationSettings | None = None, backend: str = "", ranks: int | None = None) -> int:
    """Print the figures of a local run and return its exit status (0 passed, 1 failed).

    The run is judged by the sanity checks of a job's run
    (:func:`hpcstack.validate.judge.sanity_reasons`); its figures are printed, not compared with
    references (those are figures of the site's nodes).

    Args:
        records (list[dict]): JSON-lines records of the program.
        returncode (int): the launcher's exit status.
        output (str): the launcher's output (its tail is shown on failure).
        as_json (bool): print the records as one JSON document.
        settings (ValidationSettings | None): gives the recipe's figures and sanity; None: only
            the program's result record counts.
        backend (str): the backend it ran.
        ranks (int | None): ranks it ran on (None: not checked).
    """
    from hpcstack.validate.judge import (ClassifierOutcome, CollectivesOutcome, RunOutcome, fmt,
                                         sanity_reasons, startup_summary)

    spec = settings.spec if settings else None
    config = next((r for r in records if r.get("record") == "config"), {})
    run = RunOutcome(backend, 1, ranks or config.get("world_size") or 0, None, "COMPLETED", "",
                     returncode, records)
    reasons = sanity_reasons(run, every_rank=spec.every_rank if spec else None, check_ranks=ranks is not None)
    ok = not reasons
    startup = startup_summary(records)
    if as_json:
        print(json.dumps({"ok": ok, "returncode": returncode, "reasons": reasons, "startup": startup,
                          "records": records}, indent=1))
    else:
        for figure in (spec.figures.values() if spec else []):
            value = figure.value(records) if figure.record else None
            if value is not None:
                print(f"{figure.label or figure.name}: {fmt(value, figure.unit)}")
        collectives = CollectivesOutcome.from_records(records)
        if collectives.ran:
            print(f"collectives: {collectives.checks} checks ({collectives.ops} ops x {collectives.dtypes} "
                  f"dtypes x {collectives.sizes} sizes) in {collectives.seconds or 0:.1f} s: "
                  + ("PASS" if collectives.ok else "FAIL: " + "; ".join(collectives.failures)))
        classifier = ClassifierOutcome.from_records(records)
        if classifier.ran:
            print(f"digits: test accuracy {classifier.test_accuracy:.4f} (threshold {classifier.threshold}) "
                  f"after {classifier.epochs} epochs")
        for r in records:  # a training program's convergence check, where it ran one
            if r.get("record") == "convergence" and {"initial_loss", "final_loss"} <= set(r):
                print(f"loss {r['initial_loss']:.4f} -> {r['final_loss']:.4f} (threshold {r.get('threshold')}); "
                      f"parameters identical on all ranks: {r.get('params_identical')}")
            elif r.get("record") == "classifier" and "params_identical" in r:
                print(f"digits: parameters identical on all ranks: {r['params_identical']}")
        if startup:
            print(startup_line(startup))
    if not ok:
        tail = "\n  | ".join(output.strip().splitlines()[-15:])
        print(f"FAIL: exit status {returncode}: {'; '.join(reasons)}\n  | {tail}", file=sys.stderr)
        return 1
    print("PASS")
    return 0


def startup_line(startup: dict) -> str:
    """One line on the start-up times of a run's ranks (:func:`hpcstack.validate.judge.startup_summary`)."""
    imports, first = startup["imports_s"], startup["first_step_s"]
    return (f"start-up over {startup['ranks']} rank(s): imports done after {imports['median']:.2f} s "
            f"(median), {imports['max']:.2f} s (max); first measured step after "
            f"{first['median']:.2f} s (median), {first['max']:.2f} s (max)")


# --------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------

#: Workload settings -> options of the PyTorch trainer, as its recipe's validation file declares
#: them (``program.options``); for :func:`trainer_argv`.
_TRAINER_OPTIONS = {"model": "--model", "image_size": "--image-size", "batch_size": "--batch-size",
                    "precision": "--precision", "device": "--device",
                    "warmup_batches": "--num-warmup-batches", "batches_per_iter": "--num-batches-per-iter",
                    "iterations": "--num-iters", "convergence_steps": "--convergence-steps",
                    "loss_threshold": "--loss-threshold", "epochs": "--epochs", "lr": "--lr",
                    "accuracy_threshold": "--accuracy-threshold", "channels_last": "--channels-last"}


def parse_nodes(text: str) -> list[int]:
    """Parse ``--nodes`` (``"1,2,4"``) into sorted, distinct node counts.

    Raises:
        ConfigError: not a comma-separated list of integers from 1 to :data:`MAX_NODES` (no empty
            item: ``1,,2`` is a typing error).
    """
    words = text.split(",")
    nodes = sorted({int(n) for n in words if re.fullmatch(r"[0-9]{1,6}", n)})
    if (not nodes or nodes[0] < 1 or nodes[-1] > MAX_NODES or len(nodes) > 64
            or not all(re.fullmatch(r"[0-9]{1,6}", n) for n in words)):
        raise ConfigError([f"--nodes: {text!r} is not a comma-separated list of node counts from 1 "
                           f"to {MAX_NODES} (e.g. 1,2,4; at most 64 of them)"])
    return nodes


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
            launcher = get_launcher(get_backend(backend).launcher_for(s.launcher))(
                mpi=s.mpi, options=_srun_options(s, alloc))
            argv = program.argv(settings.workload, prefix=prefix, backend=backend,
                                output=str(directory / f"{backend}.jsonl"), threads=s.cpus_per_task,
                                ranks=alloc.ranks, nodes=n)
            steps.append(JobStep(backend, launcher.command(argv, alloc), str(directory / f"{backend}.exit")))
            backend_setup += get_backend(backend)().setup(scheduler.job_id_variable)
            launcher_setup += launcher.setup(alloc)
        # once each, the backends' lines (DDP's port) before the launchers' (host lists)
        setup = list(dict.fromkeys(backend_setup + launcher_setup))
        job = BatchJob(
            name=f"hpcstack-validate-{recipe.name}-n{n}", nodes=n,
            tasks_per_node=s.tasks_per_node, cpus_per_task=s.cpus_per_task,
            time_limit=s.time_limit, output=str(directory / "slurm-%j.out"),
            workdir=str(directory), module_init=init, partition=s.partition if s.partition_option else None,
            qos=s.qos, account=s.account, gpus_per_node=s.gpus_per_node,
            gpu_request=s.gpu_request, constraint=s.constraint, exclusive=s.exclusive,
            # the site's dirs, its module hierarchy (which may reset MODULEPATH), then the stack's root
            module_use=list(site.modules.use), module_hierarchy=list(site.modules.hierarchy),
            module_use_after=[site.module_root], module_load=[recipe.full_name], env=dict(s.env),
            task_options=s.task_options,
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


def check_visible_on_compute(s: SlurmSettings, site_name: str, out: Path, given: bool) -> None:
    """Refuse a validation directory the batch jobs cannot see (under ``slurm.login_only_paths``).

    Args:
        s (SlurmSettings): the site's ``login_only_paths``.
        site_name (str): for the message.
        out (Path): the validation's directory (absolute).
        given (bool): True when it came from ``--output-dir`` (else from ``slurm.output_root`` or
            the working directory).

    Raises:
        ConfigError: one line naming the directory and the site's key (Cirrus: "/home is not
            available to batch jobs", https://github.com/EPCCed/cirrus-docs).
    """
    candidates = {os.path.abspath(out), os.path.realpath(out)}
    for hidden in s.login_only_paths:
        root = os.path.abspath(hidden)
        if any(p == root or p.startswith(root.rstrip("/") + "/") for p in candidates):
            if given:
                what = f"--output-dir: {out}"
            elif s.output_root:
                what = f"slurm.output_root: {out}"
            else:
                what = f"output directory: {out} (the working directory; slurm.output_root is unset)"
            raise ConfigError([f"{what} is under {hidden}, which the batch jobs of {site_name} do not "
                               "see (slurm.login_only_paths); run from, or give --output-dir, a "
                               "directory the compute nodes mount"])


def _settings_record(settings: ValidationSettings) -> dict:
    """The run's settings for the report: the workload's (as the recipe gives them), the shape."""
    s = settings.slurm
    named = {"workload": settings.workload_name} if settings.workload_name else {}
    return {**named, **settings.workload, "layout": settings.layout, "launcher": s.launcher,
            "tasks_per_node": s.tasks_per_node, "cpus_per_task": s.cpus_per_task,
            "gpus_per_node": s.gpus_per_node}


def _chown_tree(path: Path, user: str) -> None:
    """Give ``path`` and what is under it to ``user``; links themselves, never what they name."""
    pw = pwd.getpwnam(user)
    for p in [path, *path.rglob("*")]:
        os.chown(p, pw.pw_uid, pw.pw_gid, follow_symlinks=False)


def _output_policy(policy: trust.Policy | None, submit_as: str | None) -> trust.Policy:
    """Whom to trust with a validation's directory: the command's policy, and the account the
    jobs are submitted as (``slurm.submit_as``), to whom hpcstack hands the directory itself."""
    pol = policy or trust.Policy(uid=os.geteuid())
    if submit_as:
        try:
            pol = dataclasses.replace(pol, admin_uids=pol.admin_uids | {pwd.getpwnam(submit_as).pw_uid})
        except KeyError:
            raise HpcstackError(f"user {submit_as} (slurm.submit_as) does not exist "
                                "(localhost: scripts/localhost-slurm up creates it)") from None
    return pol


def validation_dir(label: str, output_dir: str | None, output_root: str, base: str, pol: trust.Policy) -> Path:
    """Make (or take) a validation's directory, where the jobs run, write their outputs and read
    the scripts, and from which root reads the results back.

    Without ``slurm.submit_as`` the jobs run as the account running hpcstack (root on every real
    site), in that directory: an account that could change it could swap a job script before
    sbatch reads it, or plant links that the jobs' status files are written through. So it must
    pass the trust rule (:func:`hpcstack.trust.check_dirs`: trusted owners only, no directory
    above it that another user can write without the sticky bit) before it is made and again
    after, and it is opened without following a link (a link planted at its name is refused,
    never ``chmod``-ed through). With ``submit_as`` that account is trusted with it too.

    Args:
        label (str): where the directory comes from, for the error line (``--output-dir``).
        output_dir (str | None): ``--output-dir``; None: a new ``<base>-XXXXXX`` under ``output_root``.
        output_root (str): ``slurm.output_root``, else the working directory.
        base (str): the new directory's name before its random suffix.
        pol (hpcstack.trust.Policy): whom to trust (:func:`_output_policy`).

    Returns:
        Path: the directory, absolute, mode 0755.

    Raises:
        ConfigError: the directory (or one above it) can be changed by an untrusted account, or
            is a link (one line, exit status 2).
        HpcstackError: it cannot be made.
    """
    planned = os.path.abspath(output_dir) if output_dir else os.path.join(os.path.abspath(output_root), base)
    trust.check_dirs([(label, planned)], pol)         # before anything is made in it
    try:
        if output_dir:
            os.makedirs(planned, exist_ok=True)
            out = planned
        else:
            os.makedirs(output_root, exist_ok=True)
            out = tempfile.mkdtemp(prefix=base + "-", dir=os.path.abspath(output_root))
        trust.check_dirs([(label, out)], pol)         # and again: one another user made meanwhile
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError([f"{label} {planned}: cannot use it as the validation's directory: "
                           f"{exc.strerror} (give --output-dir a directory of your own)"]) from None
    try:
        st = os.fstat(fd)
        if not (stat.S_ISDIR(st.st_mode) and pol.trusted_uid(st.st_uid)):
            raise ConfigError([f"{label} {out}: changed while hpcstack made it; choose another directory"])
        os.fchmod(fd, 0o755)
    finally:
        os.close(fd)
    return Path(out)


def slurm_validation(site, recipe, *, nodes: list[int] | None = None, backends: list[str] | None = None,
                     partition: str | None = None, qos: str | None = None, account: str | None = None,
                     output_dir: str | None = None, dry_run: bool = False, no_wait: bool = False,
                     as_json: bool = False, workload: str | None = None,
                     policy: trust.Policy | None = None) -> int:
    """Validate a stack with Slurm jobs: one per node count, each running every backend.

    Args:
        site (hpcstack.site.Site): a site with a ``slurm`` section.
        recipe (hpcstack.recipe.Recipe): the installed stack.
        nodes (list[int] | None): node counts; default the site's ``validation.nodes``, else [1, 2].
        backends (list[str] | None): default the site's ``validation.backends``, else both.
        partition, qos, account (str | None): override the site's ``slurm`` values.
        output_dir (str | None): directory for job scripts, outputs and the report; default a new
            ``hpcstack-validate-…`` directory under ``slurm.output_root`` (else the working
            directory). It must be visible on the compute nodes; when jobs are submitted as
            ``slurm.submit_as`` it is handed to that user.
        dry_run (bool): print the job scripts; submit nothing, write nothing.
        no_wait (bool): submit, print the job ids, return; ``--collect DIR`` reports later.
        as_json (bool): print the report (or, with ``dry_run``, the scripts) as JSON.
        workload (str | None): a named workload of the recipe (``digits``); None: the site's.
        policy (hpcstack.trust.Policy | None): whom to trust (the command's
            :class:`hpcstack.loader.Loader`); default root and the running account. The output
            directory must pass its rule (:func:`validation_dir`).

    Returns:
        int: 0 when every job, sanity check and performance reference passed, else 1.

    Raises:
        ConfigError: no ``slurm`` section, a required account missing, bad ``--nodes``, an
            output directory an untrusted account can change (one line each, exit status 2).
        HpcstackError: the stack is not installed, or Slurm refused a job or is not running.
    """
    settings = validation_settings(site, recipe, partition=partition, qos=qos, account=account,
                                   workload=workload)
    s = settings.slurm
    if s is None:
        raise ConfigError([f"{site.path}: slurm: missing key (needed for Slurm jobs; or use --local)"])
    nodes = nodes or settings.nodes
    backends = backends or settings.backends
    if s.account_required and not s.account and not dry_run and not os.environ.get("SBATCH_ACCOUNT"):
        raise ConfigError([f"--account: site {site.name} charges jobs to a budget; give --account BUDGET "
                           "(or set slurm.account in the site config, or SBATCH_ACCOUNT)"])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"hpcstack-validate-{recipe.name}-{recipe.version}-{stamp}"
    output_root = s.output_root or os.getcwd()
    # the jobs' --output and --chdir are written into #SBATCH lines: checked before anything is made
    if output_dir:
        check_sbatch_value(os.path.abspath(output_dir), "--output-dir")
    else:
        check_sbatch_value(os.path.abspath(output_root),
                           "slurm.output_root" if s.output_root else "the working directory (the default "
                           "--output-dir is made in it)")
    check_visible_on_compute(s, site.name, Path(os.path.abspath(output_dir or output_root)), bool(output_dir))
    if dry_run:
        out = Path(os.path.abspath(output_dir or os.path.join(output_root, base)))
        jobs = plan_jobs(site, recipe, nodes, backends, settings, out)
        if as_json:
            print(json.dumps({"jobs": [{"nodes": j.nodes, "path": str(j.script_path), "script": j.script}
                                       for j in jobs]}, indent=1))
        else:
            for j in jobs:
                print(f"# ===== {j.script_path} ({j.nodes} node(s)) =====")
                print(j.script)
        return 0

    submit_as = s.submit_as if os.geteuid() == 0 else None
    label = ("--output-dir" if output_dir else "slurm.output_root" if s.output_root
             else "the validation's directory (in the working directory; slurm.output_root is unset)")
    out_policy = _output_policy(policy, submit_as)
    trust.check_dirs([(label, os.path.abspath(output_dir) if output_dir  # bad input first: one line, exit 2
                       else os.path.join(os.path.abspath(output_root), base))], out_policy)
    check_accounting(s, submit_as)
    stack = installed_stack(site, recipe)
    executable = settings.spec.program.executable(stack.prefix)
    if executable and not os.path.isfile(executable):
        raise HpcstackError(f"{recipe.full_name} at {stack.prefix} has no "
                            f"{os.path.relpath(executable, stack.prefix)}; re-install it: "
                            f"hpcstack install {recipe.ref or recipe.full_name} --site {site.ref}")
    out = validation_dir(label, output_dir, output_root, base, out_policy)
    jobs = plan_jobs(site, recipe, nodes, backends, settings, out)
    for j in jobs:  # an output directory given again may be a user's: no link is followed in it
        makedirs_no_follow(j.directory, out)
        for stale in [*j.directory.glob("*.jsonl"), *j.directory.glob("*.exit")]:
            stale.unlink()
        write_no_follow(j.script_path, j.script, 0o755, under=out)
    if submit_as:
        try:
            _chown_tree(out, submit_as)
        except KeyError:
            raise HpcstackError(f"user {submit_as} (slurm.submit_as) does not exist "
                                "(localhost: scripts/localhost-slurm up creates it)")

    scheduler = get_scheduler(s.scheduler)(submit_as=submit_as)
    submitted: list[ValidationJob] = []
    try:
        for j in jobs:
            j.job_id = scheduler.submit(j.script_path, content=j.script)  # on stdin: no path to swap
            submitted.append(j)
            print(f"==> submitted job {j.job_id}: {j.nodes} node(s), {', '.join(backends)}; "
                  f"{j.script_path}", file=sys.stderr)
    except HpcstackError:
        scheduler.cancel([j.job_id for j in submitted])
        raise
    _write_jobs_file(out, site, recipe, settings, submitted)
    if no_wait:
        ids = " ".join(j.job_id for j in submitted)
        later = (f"hpcstack validate {recipe.ref or recipe.full_name} --site {site.ref} "
                 f"--collect {out}")
        if as_json:
            print(json.dumps({"submitted": [{"job_id": j.job_id, "nodes": j.nodes} for j in submitted],
                              "output_dir": str(out), "collect": later}, indent=1))
        else:
            print(f"submitted {ids}; outputs in {out}\nreport when they end: {later}")
        return 0
    return _wait_and_report(site, recipe, settings, submitted, out, scheduler, as_json)


def check_accounting(s: SlurmSettings, submit_as: str | None,
                     run=None, which=None) -> None:
    """Before submitting, where the site keeps accounting (``slurm.accounting`` not false): the
    submitting user's associations must allow the account (given, ``SBATCH_ACCOUNT``, or the
    user's default), partition and QOS the jobs name (:func:`hpcstack.validate.preflight.preflight`).

    Args:
        s (SlurmSettings): the jobs' account, partition, QOS.
        submit_as (str | None): the user the jobs are submitted as (``slurm.submit_as`` when
            hpcstack runs as root); None: the running account.
        run, which: stand-ins for ``subprocess.run`` and ``shutil.which`` (tests).

    Raises:
        ConfigError: one line per problem, naming ``--account (slurm.account)``,
            ``--partition (slurm.partition)`` or ``--qos (slurm.qos)`` and what the user's
            associations allow (exit status 2).
    """
    from hpcstack.validate import preflight

    if not s.accounting or s.scheduler != "slurm":
        return
    user = submit_as or trust.user_name(os.geteuid())
    kwargs = {k: v for k, v in (("run", run), ("which", which)) if v is not None}
    problems, note = preflight.preflight(
        user, s.account or os.environ.get("SBATCH_ACCOUNT") or None,
        (s.partition if s.partition_option else None) or os.environ.get("SBATCH_PARTITION") or None,
        s.qos or os.environ.get("SBATCH_QOS") or None, **kwargs)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if problems:
        raise ConfigError(problems)


def _write_jobs_file(out: Path, site, recipe, settings: ValidationSettings, jobs: list[ValidationJob]) -> None:
    data = {"site": site.name, "recipe": recipe.full_name, "partition": settings.slurm.partition,
            "scheduler": settings.slurm.scheduler, "settings": _settings_record(settings),
            "jobs": [{"job_id": j.job_id, "nodes": j.nodes, "ranks": j.ranks, "backends": j.backends,
                      "directory": str(j.directory)} for j in jobs]}
    write_no_follow(out / "jobs.json", json.dumps(data, indent=1) + "\n")  # out may be submit_as's


#: ``jobs.json`` of a validation directory (:func:`_write_jobs_file`), as :func:`collect` accepts it.
JOBS_SCHEMA = {
    "type": "object",
    "required": ["site", "recipe", "jobs"],
    "properties": {
        "site": {"type": "string"},
        "recipe": {"type": "string"},
        "partition": {"type": ["string", "null"]},
        "scheduler": {"type": "string"},
        "settings": {"type": ["object", "null"]},
        "jobs": {"type": "array", "maxItems": 1000, "items": {
            "type": "object",
            "required": ["job_id", "nodes", "ranks", "backends", "directory"],
            "additionalProperties": False,
            "properties": {
                "job_id": {"type": "string", "pattern": "^[0-9]{1,20}$"},
                "nodes": {"type": "integer", "minimum": 1, "maximum": MAX_NODES},
                "ranks": {"type": "integer", "minimum": 1},
                "backends": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}},
                "directory": {"type": "string"},
            }}},
    },
}


def collect(site, recipe, directory: str, as_json: bool = False, policy: trust.Policy | None = None) -> int:
    """Report on the jobs of an earlier ``--no-wait`` validation (waits for those still running).

    The directory is a validation's that hpcstack made (:func:`validation_dir`): it must pass the
    same trust rule (with ``slurm.submit_as`` trusted too), ``jobs.json`` must be the running
    account's or root's (hpcstack wrote it) and match :data:`JOBS_SCHEMA`, and only files of each
    job's own directory ``<directory>/n<nodes>`` are read back, without following a link: no path
    from ``jobs.json`` or from Slurm (a job's ``StdOut``) outside it.

    Args:
        site (hpcstack.site.Site): the site the jobs were submitted for (its references are used).
        recipe (hpcstack.recipe.Recipe): the stack.
        directory (str): the validation's output directory (holds ``jobs.json``).
        as_json (bool): print the report as JSON.
        policy (hpcstack.trust.Policy | None): whom to trust (default root and the running account).

    Returns:
        int: 0 PASS, 1 FAIL.

    Raises:
        ConfigError: no ``jobs.json`` there, one of the wrong shape or not written by hpcstack,
            jobs of another site or stack, or a directory an untrusted account can change (one
            line each, exit status 2).
    """
    from hpcstack import schema

    out = Path(os.path.abspath(directory))
    s = validation_settings(site, recipe).slurm
    submit_as = s.submit_as if s is not None and os.geteuid() == 0 else None
    pol = _output_policy(policy, submit_as)
    trust.check_dirs([("--collect", out)], pol)
    own = policy or trust.Policy(uid=os.geteuid())
    try:
        st = os.lstat(out / "jobs.json")
        if not stat.S_ISREG(st.st_mode) or not own.trusted_uid(st.st_uid) or st.st_mode & 0o022:
            raise ConfigError([f"--collect: {out}/jobs.json: not written by hpcstack here (it must be a file "
                               f"that {own.who()} alone can change)"])
        data = json.loads(read_no_follow(out / "jobs.json", out, last=None))
    except (OSError, ValueError) as exc:
        raise ConfigError([f"--collect: {out}/jobs.json: cannot read it ({getattr(exc, 'strerror', None) or exc})"]) from None
    lines = schema.problems(JOBS_SCHEMA, data, f"--collect: {out}/jobs.json")
    if lines:
        raise ConfigError(lines)
    if data.get("site") != site.name or data.get("recipe") != recipe.full_name:
        raise ConfigError([f"--collect: {out} holds jobs of {data.get('recipe')} on {data.get('site')}, "
                           f"not {recipe.full_name} on {site.name}"])
    jobs = []
    for j in data["jobs"]:
        job_dir = out / f"n{j['nodes']}"
        if os.path.normpath(j["directory"]) != str(job_dir):
            raise ConfigError([f"--collect: {out}/jobs.json: job {j['job_id']}: directory {j['directory']!r} is "
                               f"not the job's own ({job_dir}); hpcstack reads back only what lies there"])
        jobs.append(ValidationJob(j["nodes"], job_dir, "", j["backends"], j["ranks"], j["job_id"]))
    settings = validation_settings(site, recipe, partition=data.get("partition"),
                                   workload=(data.get("settings") or {}).get("workload"))
    scheduler = get_scheduler(data.get("scheduler") or settings.slurm.scheduler)()
    return _wait_and_report(site, recipe, settings, jobs, out, scheduler, as_json,
                            recorded_settings=data.get("settings"))


def _read_back(path: Path, under: Path, last: int | None = None) -> str | None:
    """A job's file read back as text, no link followed below ``under``; None when it cannot be."""
    try:
        return read_no_follow(path, under, last=last).decode(errors="replace")
    except (OSError, ValueError):
        return None


def _wait_and_report(site, recipe, settings: ValidationSettings, jobs: list[ValidationJob], out: Path,
                     scheduler, as_json: bool, recorded_settings: dict | None = None) -> int:
    from hpcstack.validate.judge import RunOutcome, judge
    from hpcstack.validate.render import to_markdown, write_report

    by_id = {j.job_id: j for j in jobs}

    def progress(info) -> None:
        j = by_id[info.job_id]
        extra = f" (exit code {info.exit_code}, {info.elapsed})" if info.finished else ""
        print(f"    job {info.job_id} ({j.nodes} node(s)): {info.state}{extra}", file=sys.stderr)

    try:
        infos = scheduler.wait(list(by_id), on_change=progress)
    except KeyboardInterrupt:
        print(f"interrupted: cancelling jobs {' '.join(by_id)}", file=sys.stderr)
        scheduler.cancel(list(by_id))
        raise
    runs, job_records = [], []
    for j in jobs:
        info = infos[j.job_id]
        # only the job's own directory is read: Slurm's StdOut elsewhere (a job of someone else's,
        # named in a jobs.json) is never opened
        output = str(j.output_path())
        if info.stdout and os.path.dirname(os.path.normpath(info.stdout)) == str(j.directory):
            output = os.path.normpath(info.stdout)
        text = _read_back(Path(output), out, last=64 * 1024)
        lines = text.splitlines()[-25:] if text is not None else [f"(cannot read {output})"]
        job_records.append({"job_id": j.job_id, "nodes": j.nodes, "state": info.state,
                            "exit_code": info.exit_code, "elapsed": info.elapsed,
                            "nodelist": info.nodelist, "reason": info.reason, "output": output,
                            "output_tail": lines if info.state != "COMPLETED" else []})
        for backend in j.backends:
            status = _read_back(j.status_path(backend), out)
            try:
                exit_status = int(status.strip()) if status is not None else None
            except ValueError:
                exit_status = None
            text = _read_back(j.records_path(backend), out)
            records = parse_records(text) if text is not None else []
            runs.append(RunOutcome(backend, j.nodes, j.ranks, j.job_id, info.state, info.exit_code,
                                   exit_status, records, output, lines))
    verdict = judge(runs, site=site.name, partition=settings.slurm.partition, recipe=recipe.full_name,
                    references=settings.references, required_transport=settings.required_transport,
                    output_dir=str(out), jobs=job_records, figures=settings.spec.figures,
                    every_rank=settings.spec.every_rank, gpus_per_node=settings.slurm.gpus_per_node,
                    settings=recorded_settings or _settings_record(settings))
    result = verdict.to_dict()
    paths = write_report(result, out)
    result["files"] = paths
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print(to_markdown(result))
        print("report: " + ", ".join(paths.values()))
    for line in result["failures"]:
        print(f"FAIL: {line}", file=sys.stderr)
    for job in job_records:
        if job["output_tail"]:
            print(f"  last lines of job {job['job_id']} ({job['output']}):\n  | "
                  + "\n  | ".join(job["output_tail"]), file=sys.stderr)
    print("PASS" if result["ok"] else "FAIL", file=sys.stderr)
    return 0 if result["ok"] else 1
