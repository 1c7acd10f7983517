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

Schedulers and launchers are picked by name from registries; every value taken from the site is
read in one function, :func:`hpcstack.validate.settings.validation_settings`. This module drives
the command: it builds the :class:`~hpcstack.validate.plan.ValidationPlan` once
(:func:`hpcstack.validate.plan.plan_validation`), hands it to the runners
(:mod:`hpcstack.validate.runner`, which print nothing), judges their outcomes with the plan's
rules (:mod:`hpcstack.validate.judge`) and has :mod:`hpcstack.validate.render` print.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path

from hpcstack import trust
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.validate import render
from hpcstack.validate.outdir import chown_tree, output_policy, validation_dir
from hpcstack.validate.plan import (JudgeRules, LocalRun, PlanOptions, ValidationJob, ValidationPlan,  # noqa: F401
                                    launcher_of, local_backends, local_program, plan_jobs, plan_validation,
                                    trainer_argv)
from hpcstack.validate.runner import (JOBS_SCHEMA, parse_records, read_back, read_jobs_file,  # noqa: F401
                                      read_records, run_local, submit_jobs, wait_jobs, write_jobs,
                                      write_jobs_file)
from hpcstack.validate.scheduler import check_sbatch_value, get_scheduler
from hpcstack.validate.settings import (LocalSettings, SlurmSettings, ValidationSettings,  # noqa: F401
                                        check_visible_on_compute, installed_stack, parse_nodes,
                                        required_transport, settings_record, stack_layout,
                                        validation_settings)
from hpcstack.validate.render import startup_line  # noqa: F401  (its earlier home)

# --------------------------------------------------------------------------------------------
# Local
# --------------------------------------------------------------------------------------------


def local_validation(site, recipe, ranks: int | None = None, dry_run: bool = False,
                     as_json: bool = False, workload: str | None = None,
                     backend: str | None = None, policy: trust.Policy | None = None) -> int:
    """Load the stack's module, run the validation program on ``ranks`` ranks, report.

    Args:
        site (hpcstack.site.Site): the site.
        recipe (hpcstack.recipe.Recipe): the installed recipe.
        ranks (int | None): default the site's ``launcher.ranks``.
        dry_run (bool): print the commands instead.
        as_json (bool): print the records as JSON instead of a summary.
        workload (str | None): a named workload of the recipe (``digits``); None: the site's.
        backend (str | None): a backend that runs locally; default the recipe's first.
        policy (hpcstack.trust.Policy | None): whom to trust on the way to the stack's records
            (the command's); None: root and the running account only.

    Returns:
        int: 0 when the run passed its checks, 1 otherwise.

    Raises:
        HpcstackError: the stack is not installed, the module does not load, or the launcher fails.
    """
    plan = plan_validation(site, recipe, PlanOptions(local=True, ranks=ranks, workload=workload, backend=backend))
    if dry_run:
        render.print_local_dry_run(plan.local)
        return 0
    installed_stack(site, recipe, policy)
    outcome = run_local(site, recipe, plan, on_start=lambda argv: render.print_local_start(recipe.full_name, argv))
    return report_local(outcome.records, outcome.returncode, outcome.output, as_json,
                        settings=plan.settings, backend=plan.local.backend, ranks=plan.local.ranks)


def report_local(records: list[dict], returncode: int, output: str, as_json: bool = False, *,
                 settings: ValidationSettings | None = None, backend: str = "", ranks: int | None = None) -> int:
    """Judge a local run, print its figures and return its exit status (0 passed, 1 failed).

    The run is judged by the sanity checks of a job's run
    (:func:`hpcstack.validate.judge.sanity_reasons`); its figures are printed, not compared with
    references (those are figures of the site's nodes).

    Args:
        records (list[dict]): JSON-lines records of the program.
        returncode (int): the launcher's exit status.
        output (str): the launcher's output (its tail is shown on failure).
        as_json (bool): print the records as one JSON document.
        settings (ValidationSettings | None): gives the recipe's figures, sanity and backends;
            None: only the program's result record counts.
        backend (str): the backend it ran.
        ranks (int | None): ranks it ran on (None: not checked).
    """
    from hpcstack.validate.judge import RunOutcome, sanity_reasons, startup_summary

    spec = settings.spec if settings else None
    config = next((r for r in records if r.get("record") == "config"), {})
    run = RunOutcome(backend, 1, ranks or config.get("world_size") or 0, None, "COMPLETED", "",
                     returncode, records)
    needed = tuple(spec.backend(backend).records) if spec and backend else ()
    reasons = sanity_reasons(run, every_rank=spec.every_rank if spec else None, check_ranks=ranks is not None,
                             records=needed)
    ok = not reasons
    startup = startup_summary(records)
    if as_json:
        render.print_json({"ok": ok, "returncode": returncode, "reasons": reasons, "startup": startup,
                           "records": records})
    else:
        render.print_local_figures(records, spec, startup)
    render.print_local_verdict(ok, reasons, returncode, output)
    return 0 if ok else 1


# --------------------------------------------------------------------------------------------
# Slurm
# --------------------------------------------------------------------------------------------


def slurm_validation(site, recipe, *, nodes: list[int] | None = None, backends: list[str] | None = None,
                     partition: str | None = None, qos: str | None = None, account: str | None = None,
                     output_dir: str | None = None, dry_run: bool = False, no_wait: bool = False,
                     as_json: bool = False, workload: str | None = None,
                     policy: trust.Policy | None = None, tier: str | None = None,
                     then_collect: list[str] | None = None) -> int:
    """Validate a stack with Slurm jobs: one per node count, each running every backend.

    Args:
        site (hpcstack.site.Site): a site with a ``slurm`` section.
        recipe (hpcstack.recipe.Recipe): the installed stack.
        nodes (list[int] | None): node counts; default the recipe's validation ``nodes``.
        backends (list[str] | None): default the recipe's validation ``backends``.
        partition, qos, account (str | None): override the site's ``slurm`` values.
        output_dir (str | None): directory for job scripts, outputs and the report; default a new
            ``hpcstack-validate-…`` directory under ``slurm.output_root`` (else the working
            directory). It must be visible on the compute nodes; when jobs are submitted as
            ``slurm.submit_as`` it is handed to that user.
        dry_run (bool): print the job scripts; submit nothing, write nothing.
        no_wait (bool): submit, print the job ids, return; ``--collect DIR`` reports later.
        then_collect (list[str] | None): submit, then submit a collector job (:func:`submit_collector`)
            that runs this command followed by ``--collect DIR`` once the jobs have ended, and
            return: nothing holds a node while the validation waits (``hpcstack schedule``'s
            entries).
        as_json (bool): print the report (or, with ``dry_run``, the scripts) as JSON.
        workload (str | None): a named workload of the recipe (``digits``); None: the site's.
        policy (hpcstack.trust.Policy | None): whom to trust (the command's
            :class:`hpcstack.session.Session`); default root and the running account. The output
            directory must pass its rule (:func:`hpcstack.validate.outdir.validation_dir`).
        tier (str | None): the history's tier of the run (:func:`hpcstack.validate.history.record_validation`).

    Returns:
        int: 0 when every job, sanity check and performance reference passed, else 1.

    Raises:
        ConfigError: no ``slurm`` section, a required account missing, bad ``--nodes``, an
            output directory an untrusted account can change (one line each, exit status 2).
        HpcstackError: the stack is not installed, or Slurm refused a job or is not running.
    """
    if not site.slurm:
        raise ConfigError([f"{site.path}: slurm: missing key (needed for Slurm jobs; or use --local)"])
    plan = plan_validation(site, recipe, PlanOptions(nodes=nodes, backends=backends, partition=partition,
                                                     qos=qos, account=account, workload=workload))
    s = plan.settings.slurm
    if s.account_required and not s.account and not dry_run and not os.environ.get("SBATCH_ACCOUNT"):
        raise ConfigError([f"--account: site {site.name} charges jobs to a budget; give --account BUDGET "
                           "(or set slurm.account in the site config, or SBATCH_ACCOUNT)"])
    base = f"hpcstack-validate-{recipe.name}-{recipe.version}-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    output_root = s.output_root or os.getcwd()
    _check_output_dir(s, site.name, output_dir, output_root)
    if dry_run:
        plan = plan.at(site, recipe, Path(os.path.abspath(output_dir or os.path.join(output_root, base))))
        render.print_jobs_dry_run(plan, as_json)
        return 0
    submit_as = s.submit_as if os.geteuid() == 0 else None
    label = ("--output-dir" if output_dir else "slurm.output_root" if s.output_root
             else "the validation's directory (in the working directory; slurm.output_root is unset)")
    out_policy = output_policy(policy, submit_as)
    trust.check_dirs([(label, os.path.abspath(output_dir) if output_dir  # bad input first: one line, exit 2
                       else os.path.join(os.path.abspath(output_root), base))], out_policy)
    check_accounting(s, submit_as)
    _check_program(site, recipe, plan, policy)
    plan = plan.at(site, recipe, validation_dir(label, output_dir, output_root, base, out_policy))
    return _submit(site, recipe, plan, submit_as, no_wait, as_json, tier, then_collect, policy)


def _check_output_dir(s: SlurmSettings, site_name: str, output_dir: str | None, output_root: str) -> None:
    """The jobs' --output and --chdir are written into #SBATCH lines, and the jobs must see the
    directory: both checked before anything is made."""
    if output_dir:
        check_sbatch_value(os.path.abspath(output_dir), "--output-dir")
    else:
        check_sbatch_value(os.path.abspath(output_root),
                           "slurm.output_root" if s.output_root else "the working directory (the default "
                           "--output-dir is made in it)")
    check_visible_on_compute(s, site_name, Path(os.path.abspath(output_dir or output_root)), bool(output_dir))


def _check_program(site, recipe, plan: ValidationPlan, policy: trust.Policy | None = None) -> None:
    """The stack is installed and holds the validation program it starts with (its records read
    under the command's ``policy``: the admin group's install root is trusted)."""
    stack = installed_stack(site, recipe, policy)
    executable = plan.settings.spec.program.executable(stack.prefix)
    if executable and not os.path.isfile(executable):
        raise HpcstackError(f"{recipe.full_name} at {stack.prefix} has no "
                            f"{os.path.relpath(executable, stack.prefix)}; re-install it: "
                            f"hpcstack install {recipe.ref or recipe.full_name} --site {site.ref}")


def _submit(site, recipe, plan: ValidationPlan, submit_as: str | None, no_wait: bool, as_json: bool,
            tier: str | None = None, then_collect: list[str] | None = None,
            policy: trust.Policy | None = None) -> int:
    """Write the plan's jobs, hand the directory to ``submit_as``, submit, and wait and report
    (or, with ``no_wait``, say how to report later; with ``then_collect``, submit the job that
    will)."""
    out = plan.output_dir
    write_jobs(plan)
    if submit_as:
        try:
            chown_tree(out, submit_as)
        except KeyError:
            raise HpcstackError(f"user {submit_as} (slurm.submit_as) does not exist "
                                "(localhost: scripts/localhost-slurm up creates it)")
    scheduler = get_scheduler(plan.settings.slurm.scheduler)(submit_as=submit_as)
    submitted = submit_jobs(plan.jobs, scheduler, on_submit=lambda j: render.print_submitted(j, plan.backends))
    write_jobs_file(out, site, recipe, plan.settings, submitted)
    if then_collect is not None:
        job = submit_collector(site, out, [j.job_id for j in submitted], then_collect, plan.settings.slurm, policy)
        print(f"collector job {job}: {' '.join(then_collect)} --collect {out}, after jobs "
              f"{', '.join(j.job_id for j in submitted)} end")
        return 0
    if no_wait:
        later = f"hpcstack validate {recipe.ref or recipe.full_name} --site {site.ref} --collect {out}"
        render.print_no_wait(submitted, out, later, as_json)
        return 0
    return _wait_and_report(plan, submitted, scheduler, as_json, stack=(site, recipe, tier))


#: The collector job's time limit: it reads the ended jobs back and records the run (a probe's
#: may submit the full tier's jobs and their collector).
COLLECT_TIME = "00:30:00"
#: The collector job's PATH where the running one cannot be passed in ``--export`` (a comma).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def submit_collector(site, out: Path, job_ids: list[str], command: list[str], slurm: SlurmSettings,
                     policy: trust.Policy | None = None, run=None) -> str:
    """Submit, as the running account (root for a schedule), the job that reports on a
    validation once its jobs have ended: ``sbatch --dependency=afterany:ID:ID
    --kill-on-invalid-dep=yes``, running ``COMMAND --collect OUT`` (``--wrap``, every word
    shell-quoted), on the site's partition, QOS, account and constraint, with ``--chdir`` and ``--output`` in
    root's schedule log directory (:func:`hpcstack.validate.schedule.make_log_dir`, through the
    gate) and only ``PATH`` exported. A job that waits holds a node; this one starts when there
    is nothing left to wait for (Slurm's dependencies, https://slurm.schedmd.com/sbatch.html).

    Args:
        site: the site; out (Path): the validation's directory; job_ids (list[str]): its jobs.
        command (list[str]): the collector's argv before ``--collect`` (``python -I -m hpcstack
            validate STACK --site S --tier T --then-collect``, its ``--repo`` options).
        slurm (SlurmSettings): the jobs' partition, QOS, account.
        policy: whom the gate trusts; run: a stand-in for ``subprocess.run`` (tests).

    Returns:
        str: the collector's job id.

    Raises:
        HpcstackError: sbatch refused it (its message).
    """
    import shlex
    import subprocess

    from hpcstack.fsutil import CHILD_CWD
    from hpcstack.validate import schedule

    logs = schedule.make_log_dir(site, policy)
    path = os.environ.get("PATH") or DEFAULT_PATH
    opts = [f"--dependency=afterany:{':'.join(job_ids)}", "--kill-on-invalid-dep=yes",
            "--job-name=hpcstack-collect", f"--time={COLLECT_TIME}", f"--chdir={logs}",
            f"--output={logs}/hpcstack-collect-%j.out",
            f"--export={'PATH=' + path if ',' not in path else 'PATH=' + DEFAULT_PATH}"]
    opts += [f"--{key}={value}" for key, value in (("partition", slurm.partition if slurm.partition_option else None),
                                                   ("qos", slurm.qos), ("account", slurm.account),
                                                   ("constraint", slurm.constraint)) if value]
    argv = ["sbatch", "--parsable", *opts, "--wrap", shlex.join([*command, "--collect", str(out)])]
    try:
        proc = (run or subprocess.run)(argv, capture_output=True, text=True, cwd=CHILD_CWD, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HpcstackError(f"sbatch of the collector job: {exc}") from None
    if proc.returncode != 0:
        raise HpcstackError(f"sbatch of the collector job failed: {(proc.stderr or '').strip() or proc.returncode}")
    return proc.stdout.strip().split(";")[0]


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
        render.print_note(note)
    if problems:
        raise ConfigError(problems)



def collect(site, recipe, directory: str, as_json: bool = False, policy: trust.Policy | None = None,
            tier: str | None = None) -> int:
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
        tier (str | None): the history's tier of the run (:func:`hpcstack.validate.history.record_validation`).

    Returns:
        int: 0 PASS, 1 FAIL.

    Raises:
        ConfigError: no ``jobs.json`` there, one of the wrong shape or not written by hpcstack,
            jobs of another site or stack, or a directory an untrusted account can change (one
            line each, exit status 2).
    """
    out = Path(os.path.abspath(directory))
    s = validation_settings(site, recipe).slurm
    submit_as = s.submit_as if s is not None and os.geteuid() == 0 else None
    trust.check_dirs([("--collect", out)], output_policy(policy, submit_as))
    data, jobs = read_jobs_file(site, recipe, out, policy or trust.Policy(uid=os.geteuid()))
    backends = list(dict.fromkeys(b for j in jobs for b in j.backends))
    plan = plan_validation(site, recipe, PlanOptions(
        backends=backends or None, partition=data.get("partition"),
        workload=(data.get("settings") or {}).get("workload")))
    plan = dataclasses.replace(plan, output_dir=out)
    scheduler = get_scheduler(data.get("scheduler") or plan.settings.slurm.scheduler)()
    return _wait_and_report(plan, jobs, scheduler, as_json, recorded_settings=data.get("settings"),
                            stack=(site, recipe, tier), started=data.get("submitted"))


def check_transports(rule, jobs: list[ValidationJob], job_records: list[dict], out: Path,
                     ompi=None, runs: list | None = None) -> dict:
    """Each job's NCCL logs (``<job dir>/nccl-*.log``), held to the site's fabric
    (:func:`hpcstack.validate.transport.judge_nccl`); a job that completed must have left some.

    Args:
        rule (TransportRule | None): the plan's :attr:`JudgeRules.transport`; None: no check.
        jobs (list[ValidationJob]): the ended jobs; job_records (list[dict]): their states.
        out (Path): the validation's directory (no link followed below it).

    Returns:
        dict: job id -> :class:`~hpcstack.validate.transport.TransportVerdict`.
    """
    from hpcstack.validate import transport
    from hpcstack.validate.runner import read_logs

    if rule is None:
        return check_ompi(ompi, jobs, job_records, out, runs or [])
    states = {j.get("job_id"): j.get("state") for j in job_records}
    return {j.job_id: transport.judge_nccl(
        read_logs(j.directory, out, transport.NCCL_LOG_PREFIX, transport.NCCL_LOG_SUFFIX), rule,
        nodes=j.nodes, require_logs=states.get(j.job_id) == "COMPLETED") for j in jobs}


def check_ompi(rule, jobs: list[ValidationJob], job_records: list[dict], out: Path, runs: list) -> dict:
    """The CPU path (:class:`~hpcstack.validate.transport.OmpiRule`): the output of each job
    that completed and ran an MPI transport (a run's ``config`` record says ``…mpi…``) on two
    ranks or more, held to shared memory within a node and the rule's BTL between nodes.

    Returns:
        dict: job id -> :class:`~hpcstack.validate.transport.OmpiVerdict`.
    """
    from hpcstack.validate import transport
    from hpcstack.validate.runner import read_logs

    if rule is None:
        return {}
    states = {j.get("job_id"): j.get("state") for j in job_records}
    out_verdicts = {}
    for job in jobs:
        mpi = [r for r in runs if r.nodes == job.nodes and "mpi" in str(
            next((x.get("transport") for x in r.records if x.get("record") == "config"), ""))]
        if states.get(job.job_id) != "COMPLETED" or job.ranks < 2 or not mpi:
            continue
        logs = read_logs(job.directory, out, "slurm-", ".out")
        out_verdicts[job.job_id] = transport.OmpiVerdict(
            rule, transport.parse_ompi(logs), transport.judge_ompi(logs, between=rule.between))
    return out_verdicts


def _wait_and_report(plan: ValidationPlan, jobs: list[ValidationJob], scheduler, as_json: bool,
                     recorded_settings: dict | None = None, stack: tuple | None = None,
                     started: str | None = None) -> int:
    """Wait for the jobs, read them back, judge them by the plan's rules, write and print the report;
    as root, record it in the site's history (``stack``: the site, recipe and tier), as started
    at ``started`` (a collected run: when its jobs were submitted; else now)."""
    from hpcstack.validate.actions import after_recorded
    from hpcstack.validate.history import now_iso, record_validation
    from hpcstack.validate.judge import judge

    started = started if isinstance(started, str) and len(started) <= 64 else now_iso()
    infos = wait_jobs(jobs, scheduler, on_change=render.print_job_state, on_interrupt=render.print_interrupted)
    outcome = read_back(jobs, infos, plan.output_dir)
    rules, settings = plan.rules, plan.settings
    verdict = judge(outcome.runs, site=plan.site, partition=settings.slurm.partition, recipe=plan.recipe,
                    references=rules.references, required_transport=rules.required_transport,
                    output_dir=str(plan.output_dir), jobs=outcome.jobs, figures=rules.figures,
                    every_rank=rules.every_rank, gpus_per_node=rules.gpus_per_node, records=rules.records,
                    settings=recorded_settings or settings_record(settings),
                    transports=check_transports(rules.transport, jobs, outcome.jobs, plan.output_dir,
                                                rules.ompi, outcome.runs))
    result = verdict.to_dict()
    result["files"] = render.write_report(result, plan.output_dir)
    render.print_slurm_report(result, outcome.jobs, as_json)
    if stack is not None:     # a failure to record is a warning line, never a failed validation
        record_validation(stack[0], stack[1], result, after_recorded=after_recorded, runs_outcome=outcome.runs,
                          tier=stack[2], started=started, job_dirs=[j.directory for j in jobs],
                          output_dir=plan.output_dir)
    return 0 if result["ok"] else 1
