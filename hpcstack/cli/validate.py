"""``hpcstack validate`` (and its ``--emit``) and ``hpcstack check-build``: does the stack work."""

from __future__ import annotations

import os
import shutil

from hpcstack.cli import options
from hpcstack.errors import ConfigError, HpcstackError


def add_validate(sub) -> None:
    """The parser of ``hpcstack validate``."""
    p = sub.add_parser(
        "validate", help="run the recipe's validation on the installed stack in Slurm jobs across "
                         "nodes (or locally) and judge sanity, performance, start-up and scaling",
        description="Submit one Slurm job per node count; each loads the stack's module and runs the "
                    "recipe's validation program (declared by its validation file: the program, the "
                    "backends it offers, its workloads, figures and references) once per backend; "
                    "then check sanity (exit status, the program's result record, exact collectives, "
                    "world size, every rank's records), compare the figures with the recipe's "
                    "references and report start-up per rank and scaling (JSON, markdown, PNG in "
                    "the output directory). With --local, or for a site without a slurm section: "
                    "run on --ranks ranks of this host with the site's launcher and judge sanity "
                    "alone.")
    options.add_stack_args(p)
    p.add_argument("--nodes", metavar="N[,N...]",
                   help="node counts, one job each, e.g. 1,2,4 (default: the site's validation.nodes, else 1,2)")
    p.add_argument("--backend", metavar="NAME",
                   help="a backend of the recipe's validation file (one of its `backends`), or all "
                        "(also: both); default all, one after the other")
    p.add_argument("--partition", help="Slurm partition (default: the site's slurm.partition)")
    p.add_argument("--qos", help="Slurm QoS (default: the site's slurm.qos)")
    p.add_argument("--account", help="Slurm account / budget (default: the site's slurm.account)")
    p.add_argument("--output-dir", metavar="DIR",
                   help="directory for job scripts, job output and the report (default: a new "
                        "hpcstack-validate-* directory under the site's slurm.output_root, else here); "
                        "it must be visible on the compute nodes")
    options.add_flag(p, "--no-wait", "submit, print the job ids and return; report later with --collect DIR")
    p.add_argument("--collect", metavar="DIR",
                   help="report on the jobs of an earlier --no-wait run in DIR (waits for them)")
    p.add_argument("--local", action="store_true",
                   help="no Slurm: run the recipe's first backend that runs here on --ranks ranks of "
                        "this host (e.g. a compute node you are logged in to) with the site's "
                        "launcher.command (mpirun for a backend that cannot use the launcher the site "
                        "names, e.g. horovodrun) and, as the Slurm jobs would, its slurm.mpi plugin, "
                        "slurm.cpus_per_task (cores and threads per rank), slurm.env (under "
                        "launcher.env) and the recipe's workload for the site (its settings, e.g. "
                        "device and sizes); PASS/FAIL from sanity alone (the program's own checks, "
                        "its world size): the figures are printed, never compared with the "
                        "references; no report files")
    p.add_argument("--ranks", type=int, metavar="N", help="with --local: ranks (default: the site's launcher.ranks)")
    p.add_argument("--workload", metavar="NAME",
                   help="run a named workload of the recipe's validation file instead of its "
                        "workload for the site (its `workloads`: e.g. one judged on its accuracy, or a "
                        "negative control that must fail); on the site's device unless it names one (default: the recipe's workload for the site)")
    options.add_flag(p, "--json", "print the result (or with --dry-run the job scripts) as JSON")
    options.add_flag(p, "--then-collect", "submit the jobs, then a collector job that runs this "
                     "command with --collect DIR once they have ended (sbatch --dependency=afterany), "
                     "and return: nothing holds a node while the validation waits. A probe's "
                     "collector starts the full tier the same way (what hpcstack schedule's entries "
                     "run)")
    p.add_argument("--tier", choices=["install", "smoke", "full", "probe", "manual"],
                   help="as root, record the run in the site's validation history under this tier "
                        "(default: install for the first validation of the published build, else manual; "
                        "hpcstack status reads it); smoke, full and probe also run that tier of the "
                        "recipe's validation (its `tiers`: smoke and probe on one node with their "
                        "named workload, full as without --tier; the probe runs the full tier when "
                        "its fingerprint differs from the last OK run's) and first record the "
                        "tier's missed slots as NOT-RUN (hpcstack schedule)")
    p.add_argument("--emit", nargs=2, metavar=("FORMAT", "DIR"),
                   help="write the validation for another tool into DIR instead of running it: "
                        "reframe: a ReFrame check (the same program, options, sanity and performance "
                        "references, per --nodes and --backend) and a ReFrame site configuration "
                        "for the site; run with: reframe -C DIR/settings.py -c DIR -r")
    p.set_defaults(handler=cmd_validate)


def cmd_validate(args, session) -> int:
    """``hpcstack validate``: the recipe's validation in Slurm jobs across nodes (default), or on
    this host (``--local``); :class:`hpcstack.validate.service.ValidationService` does the work."""
    from hpcstack.validate.service import ValidationRequest, ValidationService

    site, recipe = session.load(**({} if args.emit else {"install": True}))  # the stack it runs
    if args.emit:
        return _emit_validation(args, session, site, recipe)
    nodes, workload = args.nodes, args.workload
    if args.tier in ("smoke", "full", "probe") and not args.collect:
        from hpcstack.validate import schedule
        from hpcstack.validate.settings import validation_settings

        tier = schedule.tiers_of(validation_settings(site, recipe).spec, site)[args.tier]
        nodes = nodes or (",".join(str(n) for n in tier.nodes) if tier.nodes and not args.local else None)
        workload = workload or tier.workload
        if not args.dry_run:
            for line in schedule.record_missed_for_site(site, pol=session.policy,
                                                        only=(recipe.full_name, args.tier)):
                print(line)

    def collector(tier) -> list[str] | None:
        """The collector job's command (``--then-collect``): this one for ``tier``, isolated."""
        if not args.then_collect:
            return None
        from hpcstack.validate.schedule import hpcstack_command, repo_args

        return [*hpcstack_command(), "validate", recipe.full_name, "--site", site.name,
                *(["--tier", tier] if tier else []), "--then-collect", *repo_args(session)]

    def run(tier, nodes, workload, collect=None) -> int:
        return ValidationService(site, recipe, session.policy).run(ValidationRequest(
            nodes=nodes, backend=args.backend, partition=args.partition, qos=args.qos,
            account=args.account, output_dir=args.output_dir if not collect else None,
            no_wait=args.no_wait, collect=collect, local=args.local, ranks=args.ranks, workload=workload,
            dry_run=args.dry_run, as_json=args.json, tier=tier,
            then_collect=None if collect else collector(tier)))

    rc = run(args.tier, nodes, workload, args.collect)
    # a probe decides once its run is recorded: after waiting, or in its collector job
    decided = args.collect or not args.then_collect
    if args.tier == "probe" and decided and not (args.dry_run or args.no_wait):
        full = _probe_wants_full(site, recipe, session.policy)
        if full:
            print(f"probe: {'; '.join(full)}: running the full tier")
            return run("full", args.nodes, None)
    return rc


def _probe_wants_full(site, recipe, policy) -> list[str]:
    """After a probe run (recorded as root): why the full tier must run (the probe's fingerprint
    against the last OK run's, :func:`hpcstack.validate.schedule.probe_decision`); ``[]``: it
    need not (nothing changed, or nothing recorded to compare: not root)."""
    from hpcstack.validate import history, schedule

    stack_runs = [r for r in history.read_runs(history.history_path(site), policy) if r.stack == recipe.full_name]
    probes = [r for r in stack_runs if r.tier == "probe" and r.state != "NOT-RUN"]
    if not probes:
        return []
    changed, lines = schedule.probe_decision(stack_runs, probes[-1])
    return lines if changed else []


def _emit_validation(args, session, site, recipe) -> int:
    """``hpcstack validate … --emit FORMAT DIR`` (:mod:`hpcstack.export.reframe`).

    Raises:
        ConfigError: an unknown format, or options that only apply to running a validation.
    """
    from hpcstack.export.reframe import EMIT_FORMATS, emit_reframe, reframe_command
    from hpcstack.validate.service import requested_backends
    from hpcstack.validate.validation import parse_nodes

    fmt, directory = args.emit
    problems = [] if fmt in EMIT_FORMATS else [f"--emit {fmt}: unknown format (known: {', '.join(EMIT_FORMATS)})"]
    problems += [f"{opt}: not used with --emit" for opt, value in (
        ("--local", args.local), ("--ranks", args.ranks), ("--dry-run", args.dry_run), ("--no-wait", args.no_wait),
        ("--collect", args.collect), ("--then-collect", args.then_collect), ("--output-dir", args.output_dir),
        ("--json", args.json)) if value]
    if problems:
        raise ConfigError(problems)
    backends = requested_backends(recipe, args.backend)
    session.check_dirs([("--emit reframe", os.path.abspath(directory))])
    paths = emit_reframe(site, recipe, directory, pol=session.policy,
                         nodes=parse_nodes(args.nodes) if args.nodes else None,
                         backends=backends, partition=args.partition, qos=args.qos, account=args.account,
                         workload=args.workload)
    for path in paths:
        print(f"wrote {path}")
    print(f"run it: {reframe_command(paths, site)}")
    return 0


def add_check_build(sub) -> None:
    """The parser of ``hpcstack check-build``."""
    p = sub.add_parser("check-build", help="run horovodrun --check-build and require flags")
    p.add_argument("--horovodrun", default="horovodrun", help="horovodrun to run (default: from PATH)")
    p.add_argument("--require", default="PyTorch", help="comma-separated flags, NAME or SECTION:NAME")
    p.set_defaults(handler=cmd_check_build)


def cmd_check_build(args, session) -> int:
    """``hpcstack check-build``: require Horovod build flags."""
    from hpcstack.install.components.checkbuild import check_build

    if not shutil.which(args.horovodrun):
        raise HpcstackError(f"{args.horovodrun} not found (load the stack's module first)")
    print(check_build(args.horovodrun, [r for r in args.require.split(",") if r]), end="")
    return 0
