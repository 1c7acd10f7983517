"""What ``hpcstack validate`` takes from the site and the recipe, read in one place
(:func:`validation_settings`): the Slurm jobs' shape (:class:`SlurmSettings`), the ``--local``
run's (:class:`LocalSettings`), and the recipe's workload, references and transport
(:class:`ValidationSettings`). :mod:`hpcstack.validate.plan` builds the validation's plan from them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from hpcstack.errors import ConfigError
from hpcstack.site import MAX_NODES, MEMORY_KEYS
from hpcstack.validate.launchers import LAUNCHERS
from hpcstack.install.components.validation import ValidationSpec, validation_of

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
        mem, mem_per_cpu, mem_per_gpu (str | None): the jobs' memory, sbatch's ``--mem`` (per node),
            ``--mem-per-cpu`` or ``--mem-per-gpu`` (``slurm.mem`` …, at most one), as text
            (``"64G"``; a bare integer is megabytes); None: the cluster's default.
        extra_options (tuple[str, ...]): more ``#SBATCH`` options, after hpcstack's own
            (``slurm.extra_options``).
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
    mem: str | None = None
    mem_per_cpu: str | None = None
    mem_per_gpu: str | None = None
    extra_options: tuple = ()


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
            login_only_paths=tuple(s.get("login_only_paths") or ()),
            # YAML reads `mem: 64000` as an integer: sbatch's text is the same digits
            **{key: None if s.get(key) is None else str(s[key]) for key in MEMORY_KEYS},
            extra_options=tuple(s.get("extra_options") or ()))
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
        required_transport=required_transport(site, recipe),
        local=local, slurm=slurm, workload_name=workload, spec=spec,
        layout=_layout_of(site))


def _layout_of(site) -> str:
    """The site's layout (:func:`hpcstack.install.image.layout_of`)."""
    from hpcstack.install.image import layout_of

    return layout_of(site)


def required_transport(site, recipe) -> str | None:
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


def installed_stack(site, recipe, policy=None):
    """The published stack, found through its layout and provenance
    (:meth:`hpcstack.install.service.InstallService.installed`).

    Args:
        policy (hpcstack.trust.Policy | None): whom to trust on the way to the stack's records: the
            command's policy (the admin group of the system config trusted); None: root and the
            running account only.

    Raises:
        HpcstackError: not installed for this site; the message says how to install it.
    """
    from hpcstack.install.service import InstallService

    return InstallService(site, recipe, trust=policy).installed()



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


def settings_record(settings: ValidationSettings) -> dict:
    """The run's settings for the report: the workload's (as the recipe gives them), the shape."""
    s = settings.slurm
    named = {"workload": settings.workload_name} if settings.workload_name else {}
    return {**named, **settings.workload, "layout": settings.layout, "launcher": s.launcher,
            "tasks_per_node": s.tasks_per_node, "cpus_per_task": s.cpus_per_task,
            "gpus_per_node": s.gpus_per_node}
