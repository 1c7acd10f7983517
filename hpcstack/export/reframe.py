"""``hpcstack validate … --emit reframe DIR``: the validation as a ReFrame check, for sites that
test their stacks with ReFrame (nightly, after maintenance) rather than with hpcstack.

Two files are written into DIR, both rendered from jinja2 templates
(``templates/reframe-check.py.j2``, ``templates/reframe-settings.py.j2``):

* ``<name>_<version>_check.py`` — a ``rfm.RunOnlyRegressionTest`` that runs the recipe's
  validation program (e.g. ``<prefix>/bin/hpcstack-train-benchmark``) with exactly the command
  line of ``hpcstack validate``'s Slurm jobs (the validation's plan,
  :func:`hpcstack.validate.plan.plan_validation`: :meth:`~hpcstack.validate.plan.ValidationPlan.program_argv`,
  its backends' setup lines and its judge's rules), one test per node
  count and backend (ReFrame ``parameter``\\ s); a ``@sanity_function`` asserting what
  :func:`hpcstack.validate.judge.sanity_reasons` asserts (the result record is ok, no collective
  was wrong, the program ran on every rank, NCCL where the build requires it);
  a ``@performance_function`` per figure of the validation file (its unit; a scaling efficiency,
  for N > 1 nodes, against the 1-node test of the same backend, a ReFrame test dependency); and the recipe's performance references ``(value, lower, upper, unit)`` per
  node count (:func:`hpcstack.validate.judge.lookup_references`) as ReFrame's ``reference``.
  The test's module carries its module root (ReFrame's ``{'name': …, 'path': …}`` form).
  ``-S references_file=FILE`` takes the references from the YAML of ``hpcstack status
  --reframe-refs FILE`` instead (:func:`hpcstack.validate.verdict.reframe_references`: the
  site's validation history), so a site that runs ReFrame keeps one source.
* ``settings.py`` — a ReFrame site configuration for the site: one system with the validation's
  partition, the Slurm scheduler (ReFrame's ``slurm``, which polls with ``sacct``; ``squeue`` where
  the site's ``slurm.accounting`` is false), the site's launcher (``srun`` …), its module system
  (``envmod`` for Environment Modules, ``lmod``), the module tool's init, ``module use`` of the
  site's module roots (``modules.use``), ``module load`` of its profiles and module
  hierarchy (``modules.profiles``, ``modules.hierarchy``, which may reset MODULEPATH) and ``module use`` of the stack's module
  root, in that order, as ``prepare_cmds`` of the jobs; the site's ``slurm.srun_options`` go to
  the ``srun`` launcher's options; and
  ``--partition``/``--qos``/``--account``/``--constraint``, the memory option (``slurm.mem``,
  ``mem_per_cpu`` or ``mem_per_gpu``) and the site's ``slurm.extra_options`` as the partition's
  ``access`` (ReFrame writes each as an ``#SBATCH`` line); GPUs as a
  ``gpu`` resource; and ``general: resolve_module_conflicts: False`` for the system. By default
  ReFrame loads a test's modules in its own process before it submits (``module show`` and
  ``load``, to resolve conflicts), which needs every module root (the stack's, its base
  module's) on the caller's ``MODULEPATH``: a cron job, a CI runner or a non-login shell has
  none. ReFrame's configuration has no key for module paths (only the command line's
  ``--module-path``); with the resolution off, the job script alone loads the module, after
  ``prepare_cmds`` put the site's roots on its ``MODULEPATH``, so the check runs from any shell.

Sources: ReFrame's regression test API and configuration reference
(https://reframe-hpc.readthedocs.io/en/stable/regression_test_api.html,
https://reframe-hpc.readthedocs.io/en/stable/config_reference.html).

Emitting needs no ReFrame; running the check does (``pip install reframe-hpc``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hpcstack import __version__, gate
from hpcstack.errors import ConfigError

#: Formats of ``hpcstack validate --emit FORMAT DIR``.
EMIT_FORMATS = ("reframe",)

#: hpcstack launcher name -> ReFrame launcher name (ReFrame's ``launcher`` config key).
REFRAME_LAUNCHERS = {"srun": "srun", "mpirun": "mpirun"}

#: hpcstack module tool -> ReFrame ``modules_system``.
REFRAME_MODULE_SYSTEMS = {"environment-modules": "envmod", "lmod": "lmod"}

#: The file the trainer writes its JSON-lines records to, in the test's stage directory.
RECORDS = "records.jsonl"


def _duration(time_limit: str) -> str:
    """``[D-]HH:MM:SS`` (Slurm) -> ReFrame's duration form, e.g. ``"00:20:00"`` -> ``"20m"``."""
    days, _, hms = time_limit.rpartition("-")
    parts = [int(p) for p in hms.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts
    h += 24 * int(days or 0)
    return "".join(f"{v}{u}" for v, u in ((h, "h"), (m, "m"), (s, "s")) if v) or "0s"


def class_name(recipe) -> str:
    """The check's class name, e.g. ``HpcstackPytorch_2_3_1_gpu`` for ``pytorch/2.3.1-gpu``."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", f"{recipe.name}_{recipe.version}").strip("_")
    return "Hpcstack" + words[:1].upper() + words[1:]


def reframe_files(site, recipe, *, nodes: list[int] | None = None, backends: list[str] | None = None,
                  partition: str | None = None, qos: str | None = None, account: str | None = None,
                  workload: str | None = None) -> dict[str, str]:
    """Render the ReFrame check and the ReFrame site configuration from the validation's plan
    (:func:`hpcstack.validate.plan.plan_validation`).

    Args:
        site (hpcstack.site.Site): a site with a ``slurm`` section.
        recipe (hpcstack.recipe.Recipe): the stack, with a Validation component.
        nodes (list[int] | None): node counts (one test each); default the recipe's.
        backends (list[str] | None): ``horovod``/``ddp``; default the recipe's.
        partition, qos, account (str | None): override the site's ``slurm`` values, as for
            ``hpcstack validate``.
        workload (str | None): a named workload of the recipe (``digits``); None: the site's.

    Returns:
        dict[str, str]: file name -> text (``<check>.py`` and ``settings.py``).

    Raises:
        ConfigError: the site has no ``slurm`` section, or names a launcher or module tool
            ReFrame has no counterpart for; the recipe's validation file is bad.
    """
    from hpcstack.validate.plan import PlanOptions, plan_validation

    if not site.slurm:
        raise ConfigError([f"{site.path}: slurm: missing key (the ReFrame check runs Slurm jobs)"])
    plan = plan_validation(site, recipe, PlanOptions(nodes=nodes, backends=backends, partition=partition,
                                                     qos=qos, account=account, workload=workload))
    s = plan.settings.slurm
    problems = []
    if s.launcher not in REFRAME_LAUNCHERS:
        problems.append(f"{site.path}: slurm.launcher: {s.launcher!r} has no ReFrame launcher "
                        f"(ReFrame's: {', '.join(sorted(REFRAME_LAUNCHERS))})")
    if site.modules.tool not in REFRAME_MODULE_SYSTEMS:
        problems.append(f"{site.path}: modules.tool: {site.modules.tool!r} has no ReFrame modules system")
    if not site.modules.init.get("bash"):
        problems.append(f"{site.path}: modules.init.bash: missing key (the jobs source it to get `module`)")
    if problems:
        raise ConfigError(problems)
    placeholders = [w for w in plan.settings.spec.program.command if "{ranks}" in w or "{nodes}" in w]
    if placeholders:
        raise ConfigError([f"--emit reframe: the program's command uses {', '.join(placeholders)}: a "
                           "ReFrame test is one command line for every node count"])
    command = (f"hpcstack validate {recipe.ref or recipe.full_name} --site {site.ref or site.name} "
               f"--emit reframe DIR")
    check_file = re.sub(r"[^A-Za-z0-9]+", "_", f"{recipe.name}_{recipe.version}").strip("_") + "_check.py"
    return {check_file: _check(site, recipe, plan, command, check_file),
            "settings.py": _settings(site, plan, command)}


def _check(site, recipe, plan, command: str, check_file: str) -> str:
    """The ReFrame check of :func:`reframe_files`: the plan's argv, setup lines, figures, rules."""
    from hpcstack.templates import render, sh_quote
    from hpcstack.validate.scheduler import get_scheduler

    s, rules = plan.settings.slurm, plan.rules
    argv = {b: plan.program_argv(b, RECORDS, threads=s.cpus_per_task, ranks=0, nodes=0) for b in plan.backends}
    references = {n: {name: (ref.value, ref.lower, ref.upper, ref.unit)
                      for name, ref in rules.references_at(site.name, s.partition, n).items()}
                  for n in plan.nodes}
    env = {"OMP_NUM_THREADS": str(s.cpus_per_task), "SRUN_CPUS_PER_TASK": str(s.cpus_per_task),
           # sbatch --export=NONE sets SLURM_EXPORT_ENV=NONE, which srun would pass to its steps
           "SLURM_EXPORT_ENV": "ALL", **s.env}
    # ReFrame writes env_vars into the job script as `export NAME=VALUE`, as they are: quote them
    env = {name: sh_quote(value) for name, value in env.items()}
    return render(
        "templates/reframe-check.py.j2", check_file=check_file, module_root=site.module_root, hpcstack_version=__version__, command=command,
        class_name=class_name(recipe), recipe=recipe.full_name, site=site.name, system=f"{site.name}:{s.partition}",
        module=recipe.full_name, nodes=plan.nodes, backends=plan.backends, argv=argv, references=references,
        tasks_per_node=s.tasks_per_node, cpus_per_task=s.cpus_per_task, gpus_per_node=s.gpus_per_node,
        time_limit=_duration(s.time_limit), exclusive=s.exclusive,
        launcher_options=([f"--mpi={s.mpi}"] if s.mpi else []) + (list(s.srun_options) if s.launcher == "srun" else []),
        env=env, setup=plan.setup_lines(get_scheduler(s.scheduler).job_id_variable),
        figures=rules.figures, every_rank=rules.every_rank, tags=sorted({"hpcstack", recipe.name}),
        required_transport=rules.required_transport, records=RECORDS,
        account_hint=bool(s.account_required and not s.account), workload=plan.settings.workload)


def _settings(site, plan, command: str) -> str:
    """The ReFrame site configuration of :func:`reframe_files`."""
    from hpcstack.modules import modsys
    from hpcstack.templates import render, sh_quote

    s = plan.settings.slurm
    access = [f"--partition={s.partition}"] if s.partition_option else []
    access += [f"--{k}={v}" for k, v in (("qos", s.qos), ("account", s.account), ("constraint", s.constraint)) if v]
    # the site's memory option and extra #SBATCH options, as hpcstack's own jobs write them
    access += [f"--{k.replace('_', '-')}={v}" for k, v in (("mem", s.mem), ("mem_per_cpu", s.mem_per_cpu),
                                                            ("mem_per_gpu", s.mem_per_gpu)) if v is not None]
    access += list(s.extra_options)
    # ReFrame's check writes --ntasks itself (num_tasks), which --gpus-per-task needs
    gpu_option = {"gres": "--gres=gpu:{num_gpus_per_node}", "gpus-per-node": "--gpus-per-node={num_gpus_per_node}",
                  "gpus-per-task": "--gpus-per-task=1"}[s.gpu_request]
    prepare = []
    if modsys.get_tool(site.modules.tool).job_unsets_bash_env:
        prepare.append("unset BASH_ENV")
    prepare.append(f"source {sh_quote(site.modules.init['bash'])}")
    prepare += [f"module use {sh_quote(d)}" for d in site.modules.use]
    # the site's profiles and module hierarchy (which may reset MODULEPATH), then the stack's module root
    prepare += [f"module load {sh_quote(m)}" for m in site.modules.preloads]
    prepare.append(f"module use {sh_quote(site.module_root)}")
    return render(
        "templates/reframe-settings.py.j2", hpcstack_version=__version__, command=command,
        site=site.name, description=site.description or site.name, partition=s.partition,
        scheduler="slurm" if s.accounting else "squeue",
        modules_system=REFRAME_MODULE_SYSTEMS[site.modules.tool], launcher=REFRAME_LAUNCHERS[s.launcher],
        access=access, prepare_cmds=prepare, gpu_option=gpu_option,
        max_jobs=max(4, 2 * len(plan.nodes) * len(plan.backends)),
        cc=site.toolchain.cc, cxx=site.toolchain.cxx, ftn=getattr(site.toolchain, "fc", None))


def emit_reframe(site, recipe, directory: str, *, pol=None, **options) -> list[str]:
    """Write the files of :func:`reframe_files` into ``directory`` (each atomically), through
    the gate (:mod:`hpcstack.gate`): ``directory`` and the directories above it are made or
    found with :func:`hpcstack.gate.mkdir` and each file is written with
    :func:`hpcstack.gate.write_atomic` (a new ``O_EXCL|O_NOFOLLOW`` file in the directory's
    descriptor, ``fchmod``-ed there, renamed over the name), all walked from ``/`` without
    following a link. Links on the way are resolved first only where trusted accounts alone
    can have put them (:func:`hpcstack.gate.resolved`: a root-owned ``/scratch ->
    /lustre/scratch``). So a directory on the way that an account ``pol`` does not trust can
    change, or a link that such an account could have put there, is refused in one line
    before anything is written.

    Args:
        site, recipe: as for :func:`reframe_files`.
        directory (str): where to write (created if missing, with the directories above it).
        pol (hpcstack.trust.Policy | None): whom to trust (the command's
            :attr:`hpcstack.session.Session.policy`; default :func:`hpcstack.gate.current_policy`).
        **options: ``nodes``, ``backends``, ``partition``, ``qos``, ``account``, ``workload``.

    Returns:
        list[str]: the paths written (``directory`` as given, joined with each file's name).

    Raises:
        ConfigError: as :func:`reframe_files` (nothing is written); ``directory`` is not a
            directory, is a link or lies below one that is refused, or an untrusted account can
            change it or a directory above it (one line, from :class:`hpcstack.gate.GateError`).
        OSError: a directory cannot be made or a file written (permissions, space).
    """
    files = reframe_files(site, recipe, **options)       # every problem before any write
    paths = []
    try:
        real = gate.resolved(os.path.abspath(directory), pol)
        gate.mkdir(real, 0o777, parents=True, exact=False, pol=pol)   # as os.makedirs: under the umask
        for name, text in files.items():
            gate.write_atomic(os.path.join(real, name), text, 0o644, pol=pol)
            paths.append(str(Path(directory) / name))
    except gate.GateError as exc:
        raise ConfigError([f"--emit reframe: {exc}"]) from None
    return paths


def reframe_command(paths: list[str], site) -> str:
    """The command that runs the written check, ``reframe -C DIR/settings.py -c DIR/<check>.py -r``,
    from any shell: the check names its module's root, the configuration the site's module roots."""
    config = next(p for p in paths if os.path.basename(p) == "settings.py")
    check = next(p for p in paths if p != config)
    return f"reframe -C {config} -c {check} -r"
