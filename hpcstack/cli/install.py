"""``hpcstack install``, ``lock``, ``uninstall`` and ``mount``: a stack's install and removal."""

from __future__ import annotations

import os
import sys

from hpcstack import __version__
from hpcstack.cli import options
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install.plan import STEP_ORDER


def add_install(sub) -> None:
    """The parser of ``hpcstack install``."""
    p = sub.add_parser("install", help="install a recipe for a site (or print the plan with --dry-run)")
    options.add_stack_args(p)
    p.add_argument("--stop-after", choices=STEP_ORDER, metavar="STEP",
                   help=f"stop after this step ({', '.join(STEP_ORDER)})")
    options.add_flag(p, "--force", "redo every step, even those already done")
    p.add_argument("--jobs", "-j", type=int, metavar="N", help="parallel build jobs (default: site, else cores)")
    options.add_flag(p, "--no-wait", "fail at once if another install of the stack runs")
    options.add_flag(p, "--json", "with --dry-run: print the resolved plan as JSON")
    p.add_argument("--from", dest="from_bundle", metavar="DIR",
                   help="install with no network from a bundle made by `hpcstack bundle` (every file "
                        "checked against its manifest first)")
    p.add_argument("--default", action="store_true",
                   help="once published, make it what `module load NAME` loads (as `hpcstack module "
                        "set-default`); without it an install never moves an existing default")
    options.add_flag(p, "--on-login-node", "build on this node even where the site sets build.batch_job "
                                           "(which builds in a Slurm job step on a compute node)")
    p.set_defaults(handler=cmd_install)


def _layout_note(site) -> None:
    """After a plan or a published install: the ``note:`` of a site whose stacks lie as directories
    on a parallel file system (:func:`hpcstack.install.image.layout_note`), on stderr."""
    from hpcstack.install.image import layout_note

    note = layout_note(site)
    if note:
        print(f"note: {note}", file=sys.stderr)


def cmd_install(args, session) -> int:
    """``hpcstack install``: print the plan (``--dry-run``), or build in a stage prefix and publish
    (:class:`hpcstack.install.service.InstallService` does the work; this prints)."""
    from hpcstack.install.runner import console
    from hpcstack.install.service import InstallService

    if args.json and not args.dry_run:
        raise ConfigError(["--json: only with --dry-run"])
    if args.stop_after and args.dry_run:
        raise ConfigError([f"--stop-after {args.stop_after}: not with --dry-run (the dry run prints the "
                           "whole plan; --stop-after stops a real install)"])
    if args.default and args.stop_after:
        raise ConfigError(["--default: not with --stop-after (only a published stack can be the default)"])
    from hpcstack.install import batch

    inside = batch.check_inside()       # the job step build.batch_job started: build here
    if inside:
        print(inside, file=sys.stderr, flush=True)
        batch.leave_job_environment()   # the build's processes are not ranks of this step
    if args.from_bundle:
        session.check_input_dir("bundle", args.from_bundle)
    site, recipe = session.load(caches=True)
    job = None if inside or args.on_login_node else batch.BatchJob.of(site)
    if job:
        return _install_in_batch_job(args, session, site, recipe, job)
    if args.from_bundle:
        site = _site_from_bundle(site, recipe, args.from_bundle)
    for line in session.shadowing():
        print(line, file=sys.stderr)
    service = InstallService(site, recipe, recipe.file, jobs=args.jobs, trust=session.policy)
    if args.dry_run:
        plan = service.dry_run(force=args.force)
        from hpcstack import secrets

        # the plan holds references (${MY_TOKEN}); a value that reached it anyway is replaced
        redactor = secrets.Redactor(secrets.known_values(getattr(site, "secrets", {}) or {}))
        sys.stdout.write(redactor.text(plan.to_json(__version__) if args.json else plan.to_bash(__version__)))
        if args.default and not args.json:
            print(f"# then, once published: hpcstack module set-default {recipe.full_name} --site {args.site}")
        _layout_note(site)
        return 0
    done = service.install(stop_after=args.stop_after, force=args.force, wait=not args.no_wait,
                           announce=console.print)
    plan = done.plan
    if done.ran and done.complete:
        print(f"installed {recipe.full_name}: {plan.prefix} -> {plan.build_prefix}; "
              f"modulefile {plan.modulefile}")
        print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in done.timings.items()))
    if done.removed:
        print(f"  removed earlier builds: {', '.join(done.removed)}")
    if done.complete:
        _report_default(args, site, recipe)
        _layout_note(site)
    if done.ran and not done.complete:
        print(f"build {plan.build_id or plan.build_prefix} of {recipe.full_name} stopped after "
              f"step {done.ran[-1]}; not published; re-run the install to continue")
    return 0


def _install_in_batch_job(args, session, site, recipe, job) -> int:
    """``hpcstack install`` where the site sets ``build.batch_job`` (:mod:`hpcstack.install.batch`):
    the bundle on this node (unless ``--from``), then the rest in one Slurm job step, its output
    here; returns the step's exit status. ``--dry-run`` prints both steps and runs nothing.

    Raises:
        ConfigError: run inside a Slurm job already; no srun.
        HpcstackError: srun did not start the step (one line); the bundle failed.
    """
    import json
    import shlex
    from pathlib import Path

    from hpcstack.install import batch
    from hpcstack.lifecycle import bundle as bundles
    from hpcstack.session import stack_group

    make = not args.from_bundle
    where = os.path.abspath(args.from_bundle) if args.from_bundle else batch.bundle_dir(site, recipe)
    srun = "srun" if args.dry_run else batch.find_srun(session.policy)
    argv = batch.srun_argv(job, batch.inner_argv(args, where, args.jobs or job.cpus_per_task), srun)
    if args.dry_run:
        if args.json:
            print(json.dumps({"batch_job": {"bundle": where, "make_bundle": make, "srun": argv}}, indent=1))
        else:
            sys.stdout.write(batch.dry_run_text(site, recipe, job, where, make, argv))
        return 0
    if os.environ.get("SLURM_JOB_ID"):
        raise ConfigError([f"build.batch_job: this shell is inside Slurm job {os.environ['SLURM_JOB_ID']}; run the "
                           "install from a login node's own shell, or pass --on-login-node to build here"])
    if make:
        from hpcstack.install.resolve import build_environment, detect_python_version

        batch.make_stage_dir(site, where, session.policy.for_site_dirs(stack_group(site)))
        python = site.python_version or detect_python_version(build_environment(site))
        print(f"==> build.batch_job: the bundle of {recipe.full_name}, on this node: {where}", file=sys.stderr)
        bundles.make_bundle(recipe, site, recipe.file, Path(where), python, tool=False,
                            announce=lambda line: print(line, file=sys.stderr))
    else:
        bundles.read_manifest(where)        # a directory that holds no bundle: refused here
    print(f"==> build.batch_job: the build, in one Slurm job step: {shlex.join(argv)}", file=sys.stderr, flush=True)
    return batch.run_step(argv)


def _report_default(args, site, recipe) -> None:
    """After a published install: with ``--default`` make it the module's default; else say which
    version ``module load NAME`` loads when it is another one, and how to switch."""
    from hpcstack.modules import writer

    site_args = f" --site {site.ref}" + (f" --module-root {args.module_root}" if args.module_root else "")
    if args.default:
        change = writer.set_default(site.module_root, recipe.name, recipe.version, site.modules.syntax,
                                     site.modules.tool, site=args.site)
        print(f"default of {recipe.name} is now {recipe.version} (was {change.previous or 'none'})")
        for note in change.notes:
            print(f"note: {note}")
        if change.previous and change.previous != recipe.version:
            print(f"switch back: hpcstack module set-default {recipe.name}/{change.previous}{site_args}")
        return
    module_dir = os.path.join(site.module_root, recipe.name)
    current = writer.read_defaults(module_dir)
    default = current.get(writer.DEFAULT_FILES[site.modules.syntax], next(iter(current.values()), None))
    if default and default != recipe.version:
        print(f"the default of {recipe.name} stays {default} (`module load {recipe.name}`); make this one "
              f"the default: hpcstack module set-default {recipe.full_name}{site_args}")


def _site_from_bundle(site, recipe, path: str):
    """The site with a verified bundle as its only package source (:func:`hpcstack.lifecycle.bundle.use_bundle`)."""
    from hpcstack.install.components.wheels import PipWheels
    from hpcstack.lifecycle import bundle

    manifest = bundle.verify_bundle(path)
    wheels = recipe.components_of(PipWheels)
    lock = None
    if wheels:
        lock = wheels[0].lock_path(recipe.directory, wheels[0].lock_for(
            site.toolchain, site.python_version or manifest.get("python"), f"site {site.name}"))
    return bundle.use_bundle(site, recipe, lock, path)


def add_lock(sub) -> None:
    """The parser of ``hpcstack lock``."""
    p = sub.add_parser("lock", help="regenerate a recipe's lock file with uv (hashes for every package)")
    p.add_argument("recipe")
    options.add_site(p)
    p.add_argument("--gpu-archs-from", metavar="WHEEL", nargs="+", default=None,
                   help="do not re-lock: record the GPU architectures of these wheel files (pinned by "
                        "the lock) beside the lock, for a recipe with a CudaWheelArchs component")
    options.add_repo(p)
    p.set_defaults(handler=cmd_lock)


def cmd_lock(args, session) -> int:
    """``hpcstack lock``: write ``<stem>.<index>.lock`` from ``<stem>.in`` with uv."""
    from hpcstack.install.lockgen import write_lock

    from hpcstack.install.components.cudawheels import CudaWheelArchs
    from hpcstack.install.lockgen import record_gpu_archs

    site, recipe = session.load(install=False, modules=False, caches=True)
    if not args.gpu_archs_from:
        path = write_lock(recipe, site)
        print(f"wrote {path}")
    cuda = recipe.component(CudaWheelArchs) is not None
    if args.gpu_archs_from or (cuda and site.toolchain.has_cuda):
        path, records = record_gpu_archs(recipe, site, args.gpu_archs_from or ())
        for rec in records:
            print(f"{path}: {rec.describe()}")
    return 0


def add_uninstall(sub) -> None:
    """The parser of ``hpcstack uninstall``."""
    p = sub.add_parser("uninstall", help="remove a stack and its modulefile (not the default version "
                                         "unless --force)")
    options.add_target(p)
    options.add_site_and_repo(p)
    options.add_prefix(p)
    options.add_module_root(p)
    options.add_flag(p, "--force", "remove it even if it is the default version (its default marker goes too), "
                                   "deprecated with a date to come, or loaded within --idle days")
    p.add_argument("--idle", type=int, default=30, metavar="DAYS",
                   help="refuse a stack loaded within DAYS days (the site's usage log, lifecycle.usage_log; default 30)")
    options.add_flag(p, "--no-wait", "fail at once if an install of the stack runs")
    options.add_flag(p, "--dry-run", "say what would be removed; remove nothing")
    p.set_defaults(handler=cmd_uninstall)


def cmd_uninstall(args, session) -> int:
    """``hpcstack uninstall``: remove a stack's modulefile, then its prefix and builds, as the
    stack's own records name them (:mod:`hpcstack.install.records`): never a path computed
    from the arguments alone, never through a link or a directory another user owns.

    Refuses the default version of the module (a ``.version``, ``default`` link or
    ``.modulerc`` naming it) unless ``--force``, which removes that marker too.
    """
    from types import SimpleNamespace

    from hpcstack.install.service import InstallService

    site = session.site
    session.check_site_dirs(site, caches=True)           # before a recipe file given as target runs
    name, version = session.stack_of(args.target)
    session.check_stack_dirs(site, (name, version), caches=True)
    from hpcstack.lifecycle.deprecation import uninstall_refusal

    refusal = None if args.force else uninstall_refusal(site, f"{name}/{version}")
    if refusal is None and not args.force:
        from hpcstack.lifecycle.usage import idle_refusal

        refusal = idle_refusal(site, f"{name}/{version}", args.idle)
    if refusal:
        raise HpcstackError(refusal)
    service = InstallService(site, SimpleNamespace(name=name, version=version))
    removed = service.uninstall(force=args.force, wait=not args.no_wait, dry_run=args.dry_run)
    for line in service.kept:
        print(f"note: kept {line}", file=sys.stderr)
    if args.dry_run:
        for p in removed:
            print(f"would remove {p}")
        return 0
    for p in removed:
        print(f"removed {p}")
    from hpcstack.validate.schedule import remove_stack

    try:                                  # its re-validation entries go with it (hpcstack schedule)
        for line in remove_stack(site, f"{name}/{version}", pol=session.policy):
            print(f"removed {line}")
    except HpcstackError as exc:
        print(f"warning: its scrontab entries were not removed ({exc}): hpcstack schedule remove "
              f"{name}/{version} --site {site.name}", file=sys.stderr)
    from hpcstack.lifecycle.deprecation import write_retired

    stand_in = write_retired(site, f"{name}/{version}")
    if stand_in:
        print(f"wrote {stand_in}: loading {name}/{version} now fails, naming its replacement "
              f"(hpcstack module undeprecate {name}/{version} removes it)")
    print(f"uninstalled {name}/{version}")
    return 0


def add_mount(sub) -> None:
    """The parser of ``hpcstack mount``."""
    p = sub.add_parser("mount", help="layout: squashfs: mount a stack's image on this node (idempotent)")
    options.add_target(p)
    options.add_site_and_repo(p)
    options.add_prefix(p)
    p.add_argument("--print-unit", action="store_true",
                   help="mount nothing; print what a site deploys on its nodes (Slurm prolog, fstab, systemd)")
    p.add_argument("--stage", metavar="DIR",
                   help="root: copy the image into DIR on this node first (node-local: a root-owned "
                        "directory on tmpfs or local disk, mode go-w, no symbolic links on its path) in large "
                        "sequential reads, and mount the copy with the kernel's squashfs on a loop device; the "
                        "ranks then read nothing from the network file system (docs/benchmarks.md, "
                        "\"Start-up at scale\")")
    p.add_argument("--unpack", action="store_true",
                   help="with --stage: unpack the image into DIR (unsquashfs; the venv's full size) and bind the "
                        "tree read-only at the venv, instead of mounting a copy of the image: nothing is "
                        "decompressed while the ranks start")
    p.add_argument("--prune-only", action="store_true",
                   help="with --stage: mount nothing; remove from DIR this stack's copies of builds other than "
                        "the published one, and the leftovers of an interrupted staging, unless a mount on this "
                        "node still uses them (a Slurm epilog; every --stage run does it before it stages); one "
                        "line per copy removed or kept, with its size and why")
    options.add_flag(p, "--dry-run", "with --prune-only: say what would be removed; remove nothing")
    p.add_argument("--quiet", action="store_true", help="print nothing when it succeeds")
    p.set_defaults(handler=cmd_mount)


def cmd_mount(args, session) -> int:
    """``hpcstack mount``: mount the published build's image (``layout: squashfs``) on this node,
    and the previous build's; exit 0 when already mounted, 2 with one line when it cannot
    (:func:`hpcstack.install.image.mount_stack`). ``--print-unit`` prints what nodes need. With
    ``--stage DIR`` it first prunes the stack's copies there that no longer serve, printing one
    line per copy removed (:func:`hpcstack.install.staged.mount_staged`); ``--prune-only`` only
    prunes (:func:`_prune_only`)."""
    from hpcstack.install import image
    from hpcstack.install.layout import StackLayout

    site = session.site
    session.check_site_dirs(site, modules=False)
    name, version = session.stack_of(args.target)
    session.check_stack_dirs(site, (name, version), modules=False)
    if image.settings(site) is None:
        raise ConfigError([f"{site.path}: layout: the site's stacks are directories (layout: directory); "
                           "there is no image to mount"])
    layout = StackLayout.for_site(site, name, version)
    if args.print_unit:
        build = layout.published()
        if not build:
            raise ConfigError([f"{name}/{version} is not installed at {layout.prefix}; install it first"])
        print(image.node_setup(build, f"hpcstack mount {name}/{version} --site {site.ref or site.name}"
                                      + (f" --prefix {site.install_root}" if args.prefix else "")))
        return 0
    _check_mount_options(args)
    from hpcstack import gate
    from hpcstack.session import stack_group

    # the build, its venv and its image through the gate, trusting the site's stack group there
    with gate.trusting(session.policy.for_site_dirs(stack_group(site))):
        return _mount_images(args, layout)


def _mount_images(args, layout) -> int:
    """``hpcstack mount`` once its checks passed: mount (and with ``--stage``, prune first)."""
    from hpcstack.install import image

    if args.stage is None:
        results = image.mount_stack(layout)
    else:
        from hpcstack.install import staged

        image.check_stage_dir(args.stage)  # refused even where the image is mounted already
        if args.prune_only:
            return _prune_only(args, layout)
        results, report = staged.mount_staged(layout, args.stage, unpack=args.unpack)
        for line in [] if args.quiet else report.lines()[: len(report.removed)]:
            print(line)
        for line in report.failed:
            print(f"warning: {line}", file=sys.stderr)
    for build, mounted in results:
        if not args.quiet:
            staged_now = args.stage is not None and build == layout.published() and mounted
            copy = ((image.staged_tree_of if args.unpack else image.staged_image_of)(build, args.stage)
                    if staged_now else image.image_of(build))
            print(f"{'mounted' if mounted else 'already mounted'}: {copy} at {image.mount_point_of(build)}"
                  + (f" (staged from {image.image_of(build)})" if staged_now else ""))
    return 0


def _check_mount_options(args) -> None:
    """Refuse ``hpcstack mount`` options that do not go together.

    Raises:
        ConfigError: one line per problem (exit status 2).
    """
    problems = []
    if args.stage is not None and os.geteuid() != 0:
        problems.append(f"--stage {args.stage}: only root can stage and mount an image with the kernel "
                        "(a loop device) or prune the staged copies; run it as root, e.g. in a Slurm "
                        "prolog or epilog")
    for flag, given in (("--unpack", args.unpack), ("--prune-only", args.prune_only)):
        if given and args.stage is None:
            problems.append(f"{flag}: only with --stage DIR (the node-local directory of the copies)")
    if args.prune_only and args.unpack:
        problems.append("--unpack: not with --prune-only (it prunes both kinds of copy and mounts nothing)")
    if args.dry_run and not args.prune_only:
        problems.append("--dry-run: only with --prune-only (the mount itself has no dry run)")
    if problems:
        raise ConfigError(problems)


def _prune_only(args, layout) -> int:
    """``hpcstack mount --stage DIR --prune-only``: prune the stack's staged copies on this node
    (:func:`hpcstack.install.staged.prune`) and print one line per copy removed or kept; exit 0,
    also when there is nothing to do, 1 where a copy could not be removed (one line each)."""
    from hpcstack.install import staged

    report = staged.prune(layout, args.stage, dry_run=args.dry_run)
    if not args.quiet:
        for line in report.lines(args.dry_run) or [f"nothing staged in {args.stage} for "
                                                   f"{layout.name}/{layout.version}"]:
            print(line)
    for line in report.failed:
        print(f"error: {line}", file=sys.stderr)
    return 1 if report.failed else 0
