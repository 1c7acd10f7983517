"""The ``hpcstack`` command: install, validate, lock, list, show, uninstall, check-build.

Every problem the user can fix is printed as one line (``error: …``) with a non-zero exit:
2 for a bad site config, recipe or command line (nothing written), 1 for a failure while running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from hpcstack import __version__
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install.plan import STEP_ORDER


SITE_HELP = ("site name on the search path (--repo, HPCSTACK_PATH, built-in) or a path to a site "
             "YAML (default: localhost)")


def _add_repo_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", action="append", default=[], metavar="DIR",
                   help="a repository of recipes/ and site-configs/, searched before HPCSTACK_PATH "
                        "and the built-in ones (repeatable; first match wins)")


def _add_site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe as NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a path to a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root")
    p.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")
    p.add_argument("--dry-run", action="store_true", help="print what would run, as a bash script; change nothing")


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``hpcstack`` command."""
    parser = argparse.ArgumentParser(
        prog="hpcstack", description="Install module-based HPC software stacks from recipes, per site.")
    parser.add_argument("--version", action="version", version=f"hpcstack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("install", help="install a recipe for a site (or print the plan with --dry-run)")
    _add_site_args(p)
    p.add_argument("--stop-after", choices=STEP_ORDER, metavar="STEP",
                   help=f"stop after this step ({', '.join(STEP_ORDER)})")
    p.add_argument("--force", action="store_true", help="redo every step, even those already done")
    p.add_argument("--jobs", "-j", type=int, metavar="N", help="parallel build jobs (default: site, else cores)")
    p.add_argument("--no-wait", action="store_true", help="fail at once if another install of the stack runs")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the resolved plan as JSON")

    p = sub.add_parser(
        "validate", help="run the recipe's validation on the installed stack in Slurm jobs across "
                         "nodes (or locally) and judge sanity, performance, start-up and scaling",
        description="Submit one Slurm job per node count; each loads the stack's module and runs the "
                    "recipe's validation program with every backend it offers (PyTorch: Horovod, "
                    "then torch.distributed DDP; mpi4py: MPI); then check sanity, compare the "
                    "figures with the recipe's references and report start-up per rank and scaling "
                    "(JSON, markdown, PNG in the output directory). With --local, or for a site "
                    "without a slurm section: run on --ranks ranks of this host with the site's launcher.")
    _add_site_args(p)
    p.add_argument("--nodes", metavar="N[,N...]",
                   help="node counts, one job each, e.g. 1,2,4 (default: the site's validation.nodes, else 1,2)")
    p.add_argument("--backend", metavar="NAME",
                   help="a backend of the recipe's validation (pytorch: horovod, ddp), or all (also: "
                        "both); default all, one after the other")
    p.add_argument("--partition", help="Slurm partition (default: the site's slurm.partition)")
    p.add_argument("--qos", help="Slurm QoS (default: the site's slurm.qos)")
    p.add_argument("--account", help="Slurm account / budget (default: the site's slurm.account)")
    p.add_argument("--output-dir", metavar="DIR",
                   help="directory for job scripts, job output and the report (default: a new "
                        "hpcstack-validate-* directory under the site's slurm.output_root, else here); "
                        "it must be visible on the compute nodes")
    p.add_argument("--no-wait", action="store_true",
                   help="submit, print the job ids and return; report later with --collect DIR")
    p.add_argument("--collect", metavar="DIR",
                   help="report on the jobs of an earlier --no-wait run in DIR (waits for them)")
    p.add_argument("--local", action="store_true",
                   help="no Slurm: run the Horovod backend on --ranks ranks of this host (e.g. a "
                        "compute node you are logged in to) with the site's launcher.command and, "
                        "as the Slurm jobs would, its slurm.mpi plugin, slurm.cpus_per_task (cores "
                        "and torch threads per rank), slurm.env (under launcher.env) and the "
                        "recipe's workload for the site (model, device, sizes); PASS/FAIL from the "
                        "training program's own checks (collectives, convergence), no report files")
    p.add_argument("--ranks", type=int, metavar="N", help="with --local: ranks (default: the site's launcher.ranks)")
    p.add_argument("--workload", metavar="NAME",
                   help="train a named workload of the recipe's validation file instead of its "
                        "workload for the site, e.g. digits: a small CNN on scikit-learn's 8x8 "
                        "handwritten digits, judged on its test accuracy (reported next to img/s); "
                        "on the site's device (default: the recipe's workload for the site)")
    p.add_argument("--json", action="store_true", help="print the result (or with --dry-run the job scripts) as JSON")
    p.add_argument("--emit", nargs=2, metavar=("FORMAT", "DIR"),
                   help="write the validation for another tool into DIR instead of running it: "
                        "reframe: a ReFrame check (the same trainer, options, sanity and performance "
                        "references, per --nodes and --backend) and a ReFrame site configuration "
                        "for the site; run with: reframe -C DIR/settings.py -c DIR -r")

    p = sub.add_parser("lock", help="regenerate a recipe's lock file with uv (hashes for every package)")
    p.add_argument("recipe")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)

    p = sub.add_parser("list", help="list recipes and sites, each with the repository it comes from",
                       description="List the recipes and site configs on the search path (--repo "
                                   "directories, then HPCSTACK_PATH, then the built-in ones), each "
                                   "with the repository it comes from and what it shadows.")
    _add_repo_arg(p)
    p.add_argument("--json", action="store_true", help="print the listing as JSON")

    p = sub.add_parser("show", help="show what an installed stack records about itself (provenance)")
    p.add_argument("target", help="a stack prefix or build directory, or NAME/VERSION (with --site)")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--file", metavar="NAME",
                   help="print one recorded file, e.g. plan.json, site.yaml, recipe/<file>, logs/build.log")

    p = sub.add_parser("uninstall", help="remove a stack and its modulefile (not the default version "
                                         "unless --force)")
    p.add_argument("target", help="NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root")
    p.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")
    p.add_argument("--force", action="store_true",
                   help="remove it even if it is the default version (its default marker goes too)")
    p.add_argument("--no-wait", action="store_true", help="fail at once if an install of the stack runs")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")

    p = sub.add_parser("mount", help="layout: squashfs: mount a stack's image on this node (idempotent)")
    p.add_argument("target", help="NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root")
    p.add_argument("--print-unit", action="store_true",
                   help="mount nothing; print what a site deploys on its nodes (Slurm prolog, fstab, systemd)")
    p.add_argument("--quiet", action="store_true", help="print nothing when it succeeds")

    from hpcstack.export import EXPORTERS

    p = sub.add_parser(
        "export", help="write a recipe's plan for a site in another tool's format",
        description="Resolve the recipe for the site (as install --dry-run does) and write it in "
                    "the chosen format: " + "; ".join(f"{n}: {c.description}" for n, c in sorted(EXPORTERS.items())))
    p.add_argument("recipe", help="recipe as NAME/VERSION or a path to a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--format", required=True, choices=sorted(EXPORTERS), help="the output format")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")

    p = sub.add_parser(
        "kernel", help="a Jupyter kernel that runs in an installed stack (loads its module)",
        description="Write (install) or remove a Jupyter kernelspec for an installed stack: kernel.json "
                    "and a launcher that loads the stack's module with the site's module tool (and "
                    "with --venv activates a venv extended with extend-venv-activate), then runs "
                    "the stack's ipykernel. Default place: the system's Jupyter kernels directory, "
                    "as `jupyter kernelspec install`.")
    ksub = p.add_subparsers(dest="kernel_command", required=True, metavar="ACTION")
    for action, action_help in (("install", "write the kernelspec (replaces one hpcstack wrote)"),
                                ("remove", "remove a kernelspec hpcstack wrote")):
        kp = ksub.add_parser(action, help=action_help)
        kp.add_argument("recipe", help="recipe as NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a path to a recipe file")
        kp.add_argument("--site", default="localhost", help=SITE_HELP)
        _add_repo_arg(kp)
        where = kp.add_mutually_exclusive_group()
        where.add_argument("--user", action="store_true",
                           help="the user's Jupyter kernels (~/.local/share/jupyter/kernels, $JUPYTER_DATA_DIR)")
        where.add_argument("--prefix", metavar="DIR",
                           help="DIR/share/jupyter/kernels (e.g. a JupyterHub's environment), as "
                                "`jupyter kernelspec install --prefix`")
        kp.add_argument("--name", metavar="N", help="the kernel's name (default NAME-VERSION, e.g. pytorch-2.3.1-gpu)")
        if action == "install":
            kp.add_argument("--venv", metavar="DIR",
                            help="activate this venv (extended with extend-venv-activate) after "
                                 "loading the module: the user's packages on top of the stack")
            kp.add_argument("--module-root", metavar="DIR",
                            help="modulefile root, instead of the site's module_root")

    p = sub.add_parser("check-build", help="run horovodrun --check-build and require flags")
    p.add_argument("--horovodrun", default="horovodrun", help="horovodrun to run (default: from PATH)")
    p.add_argument("--require", default="PyTorch", help="comma-separated flags, NAME or SECTION:NAME")

    p = sub.add_parser(
        "doctor", help="check your venv on top of a stack: what shadows it, conflicts, ~/.local",
        description="List, one line per problem, what in a venv shadows the loaded stack (same "
                    "distribution, other version), what conflicts with the stack's constraints or "
                    "needs other versions than the stack has, and packages in the user site "
                    "(~/.local) that Python without PYTHONNOUSERSITE=1 would import. Exit 1 when "
                    "there is a problem, 0 when the venv is clean.")
    p.add_argument("--venv", metavar="DIR", help="the venv (default: the active one, VIRTUAL_ENV)")
    p.add_argument("--stack", metavar="PREFIX", action="append",
                   help="a stack prefix (repeatable; default: the loaded modules' HPCSTACK_<NAME>_ROOT)")

    p = sub.add_parser("action", help="run one action of an install's dry-run script (fetch, unpack, sbom)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("words", nargs=argparse.REMAINDER)

    p = sub.add_parser(
        "module", help="module defaults: which version `module load NAME` picks",
        description="Show or switch the default version of a module in the site's module root "
                    "(.version for Tcl sites, .modulerc.lua for Lua sites; each file replaced "
                    "atomically). set-default prints the previous default and the one command "
                    "that switches back to it.")
    msub = p.add_subparsers(dest="module_command", required=True, metavar="ACTION")
    for action, target_help, action_help in (
            ("set-default", "NAME/VERSION, e.g. pytorch/2.3.1-gpu",
             "make NAME/VERSION what `module load NAME` loads"),
            ("default", "NAME, e.g. pytorch", "show the versions of NAME and which is the default"),
            ("unset-default", "NAME, e.g. pytorch",
             "remove hpcstack's default files (the tool then picks the highest version)")):
        mp = msub.add_parser(action, help=action_help)
        mp.add_argument("target", help=target_help)
        mp.add_argument("--site", default="localhost", help=SITE_HELP)
        _add_repo_arg(mp)
        mp.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hpcstack`` console script.

    Args:
        argv (list[str] | None): arguments (default ``sys.argv[1:]``).

    Returns:
        int: exit status (0 ok, 1 failure, 2 bad input).
    """
    # jsonschema imports rfc3987_syntax when it is installed (jupyter's jsonschema[format-nongpl]
    # brings it), which compiles 38 lark grammars at import: 1.1-2.4 s of every command, 3-5x a
    # no-op re-install (issue 14). hpcstack's schemas check no IRI format; jsonschema runs
    # without it (an ImportError it expects), in this process only.
    sys.modules.setdefault("rfc3987_syntax", None)
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except HpcstackError as exc:
        for line in exc.lines():
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpcstack … | head`: the reader has gone; nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:  # a full disk, a permission problem: what, where, what to do
        from hpcstack.install.plan import describe_os_error

        print(f"error: {describe_os_error(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, never a traceback
        if os.environ.get("HPCSTACK_DEBUG"):
            raise
        print(f"error: internal error: {type(exc).__name__}: {exc} (a bug in hpcstack; "
              "HPCSTACK_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 70


def _check_dirs(args) -> None:
    """Refuse ``--prefix``/``--module-root`` values that no venv or modulefile can hold."""
    import re

    for opt in ("prefix", "module_root"):
        value = getattr(args, opt, None)
        if value is not None and (not value or re.search(r"[\x00-\x20\x7f]", value)):
            raise ConfigError([f"--{opt.replace('_', '-')}: {value!r}: give a directory path without "
                               "white space or control characters"])


def _search(args):
    """The search path of recipes and site configs: ``--repo``, ``HPCSTACK_PATH``, built-in."""
    from hpcstack.repos import SearchPath

    return SearchPath.from_args(getattr(args, "repo", None) or ())


def _load_site(args, **overrides):
    from hpcstack.site import load_site

    _check_dirs(args)
    return load_site(args.site, search=_search(args), **overrides)


def _load(args):
    from hpcstack.recipe import load_recipe

    site = _load_site(args, install_root=getattr(args, "prefix", None),
                      module_root=getattr(args, "module_root", None))
    return site, load_recipe(args.recipe, site, _search(args))


def cmd_install(args) -> int:
    """``hpcstack install``: print the plan (``--dry-run``), or build in a stage prefix and publish
    (:class:`hpcstack.install.service.InstallService` does the work; this prints)."""
    from hpcstack.install.runner import console
    from hpcstack.install.service import InstallService
    from hpcstack.recipe import recipe_path

    if args.json and not args.dry_run:
        raise ConfigError(["--json: only with --dry-run"])
    site, recipe = _load(args)
    service = InstallService(site, recipe, recipe_path(args.recipe, _search(args)), jobs=args.jobs)
    if args.dry_run:
        plan = service.dry_run(force=args.force)
        sys.stdout.write(plan.to_json(__version__) if args.json else plan.to_bash(__version__))
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
    if done.ran and not done.complete:
        print(f"build {plan.build_id or plan.build_prefix} of {recipe.full_name} stopped after "
              f"step {done.ran[-1]}; not published; re-run the install to continue")
    return 0


def cmd_validate(args) -> int:
    """``hpcstack validate``: the recipe's validation in Slurm jobs across nodes (default), or on
    this host (``--local``); :class:`hpcstack.validate.service.ValidationService` does the work."""
    from hpcstack.validate.service import ValidationRequest, ValidationService

    site, recipe = _load(args)
    if args.emit:
        return _emit_validation(args, site, recipe)
    return ValidationService(site, recipe).run(ValidationRequest(
        nodes=args.nodes, backend=args.backend, partition=args.partition, qos=args.qos,
        account=args.account, output_dir=args.output_dir, no_wait=args.no_wait, collect=args.collect,
        local=args.local, ranks=args.ranks, workload=args.workload, dry_run=args.dry_run,
        as_json=args.json))


def _emit_validation(args, site, recipe) -> int:
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
        ("--collect", args.collect), ("--output-dir", args.output_dir), ("--json", args.json)) if value]
    if problems:
        raise ConfigError(problems)
    backends = requested_backends(recipe, args.backend)
    paths = emit_reframe(site, recipe, directory, nodes=parse_nodes(args.nodes) if args.nodes else None,
                         backends=backends, partition=args.partition, qos=args.qos, account=args.account,
                         workload=args.workload)
    for path in paths:
        print(f"wrote {path}")
    print(f"run it: {reframe_command(paths, site)}")
    return 0


def cmd_lock(args) -> int:
    """``hpcstack lock``: write ``<stem>.<index>.lock`` from ``<stem>.in`` with uv."""
    from hpcstack.install.lock import write_lock

    site, recipe = _load(args)
    path = write_lock(recipe, site)
    print(f"wrote {path}")
    return 0


def cmd_list(args) -> int:
    """``hpcstack list``: recipes and sites on the search path, with where each comes from.

    Raises:
        ConfigError: a ``--repo``/``HPCSTACK_PATH`` directory that does not exist or is no
            repository, or a recipe file with a syntax error (one line each, exit 2).
    """
    from hpcstack.recipe import check_syntax
    from hpcstack.repos import RECIPES, SITES

    search = _search(args)
    listing = {kind: search.entries(kind) for kind in (RECIPES, SITES)}
    problems = [line for e in listing[RECIPES] for line in [check_syntax(e.path)] if line]
    if args.json:
        print(json.dumps({"search_path": [{"path": str(r.path), "origin": r.origin} for r in search.repos],
                          **{kind: [{"name": e.name, "path": str(e.path), "origin": e.repo.origin,
                                     "repo": str(e.repo.path),
                                     "shadows": [str(r.path) for r in e.shadows]} for e in entries]
                             for kind, entries in listing.items()}}, indent=1))
    else:
        print("search path: " + search.describe())
        for kind, title in ((RECIPES, "recipes"), (SITES, "sites")):
            print(f"{title}:")
            width = max((len(e.name) for e in listing[kind]), default=0)
            for e in listing[kind]:
                shadow = "".join(f"; shadows {r.describe()}" for r in e.shadows)
                print(f"  {e.name:<{width}}  {e.repo.describe() if e.repo.origin != 'built-in' else 'built-in'}"
                      f"{shadow}")
    if problems:
        raise ConfigError(problems)
    return 0


def _stack_of(target: str, site) -> tuple[str, str]:
    """``(name, version)`` from ``NAME/VERSION`` or a recipe file."""
    if target.endswith(".py") and Path(target).is_file():
        from hpcstack.recipe import load_recipe

        recipe = load_recipe(target, site)
        return recipe.name, recipe.version
    parts = target.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") or p.startswith(".") for p in parts):
        raise ConfigError([f"{target!r}: expected NAME/VERSION (e.g. pytorch/2.3.1-gpu), a stack prefix "
                           "or a recipe file"])
    return parts[0], parts[1]


def cmd_show(args) -> int:
    """``hpcstack show``: print what a stack records about itself (:mod:`hpcstack.provenance`)."""
    from hpcstack.install import provenance
    from hpcstack.install.builds import StackLayout

    target = Path(args.target)
    if target.is_dir():
        build, prefix = Path(os.path.realpath(target)), (target if target.is_symlink() else None)
    else:
        site = _load_site(args, install_root=args.prefix)
        name, version = _stack_of(args.target, site)
        layout = StackLayout.for_site(site, name, version)
        published = layout.published()
        building = layout.read_state()["building"]
        if published:
            build, prefix = Path(published), Path(layout.prefix)
        elif building and os.path.isdir(layout.build_path(building)):
            print(f"{name}/{version} is not published; build {building} is in progress", file=sys.stderr)
            build, prefix = Path(layout.build_path(building)), None
        else:
            raise HpcstackError(f"{name}/{version} is not installed under {site.install_root} "
                                f"(no {layout.prefix}); install it, or give --site/--prefix")
    if not (build / ".hpcstack").is_dir():
        raise HpcstackError(f"{build} is not a stack installed by hpcstack (no .hpcstack/ in it)")
    info = provenance.describe(build, prefix)
    if args.file:
        path = info["files"].get(args.file)
        if not path:
            raise HpcstackError(f"{build}: no recorded file {args.file!r} "
                                f"(recorded: {', '.join(info['files']) or 'none'})")
        sys.stdout.write(Path(path).read_text(errors="replace"))
        return 0
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    order = None
    try:
        order = [s["name"] for s in json.loads(Path(info["files"]["plan.json"]).read_text())["steps"]]
    except (KeyError, OSError, ValueError, TypeError):
        pass
    sys.stdout.write(provenance.render(info, order))
    return 0


def cmd_uninstall(args) -> int:
    """``hpcstack uninstall``: remove a stack's modulefile, then its prefix and builds.

    Refuses the default version of the module (a ``.version``, ``default`` link or
    ``.modulerc`` naming it) unless ``--force``, which removes that marker too.
    """
    from types import SimpleNamespace

    from hpcstack.install.service import InstallService

    site = _load_site(args, install_root=args.prefix, module_root=args.module_root)
    name, version = _stack_of(args.target, site)
    service = InstallService(site, SimpleNamespace(name=name, version=version))
    removed = service.uninstall(force=args.force, wait=not args.no_wait, dry_run=args.dry_run)
    if args.dry_run:
        for p in removed:
            print(f"would remove {p}")
        return 0
    for p in removed:
        print(f"removed {p}")
    print(f"uninstalled {name}/{version}")
    return 0


def cmd_mount(args) -> int:
    """``hpcstack mount``: mount the published build's image (``layout: squashfs``) on this node,
    and the previous build's; exit 0 when already mounted, 2 with one line when it cannot
    (:func:`hpcstack.install.image.mount_stack`). ``--print-unit`` prints what nodes need."""
    from hpcstack.install import image
    from hpcstack.install.builds import StackLayout

    site = _load_site(args, install_root=args.prefix)
    name, version = _stack_of(args.target, site)
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
    for build, mounted in image.mount_stack(layout):
        if not args.quiet:
            print(f"{'mounted' if mounted else 'already mounted'}: {image.image_of(build)} at "
                  f"{image.mount_point_of(build)}")
    return 0


def cmd_export(args) -> int:
    """``hpcstack export``: the plan in another tool's format (:mod:`hpcstack.export`)."""
    from hpcstack.export import get_exporter
    from hpcstack.fsutil import write_atomic
    from hpcstack.install.service import InstallService

    site, recipe = _load(args)
    exporter = get_exporter(args.format)()
    plan = InstallService(site, recipe).dry_run() if getattr(exporter, "needs_plan", True) else None
    text = exporter.render(recipe, site, plan)
    # files the format wants next to the output (an easyconfig's patches), name -> source
    extra = exporter.extra_files(recipe, site, plan) if hasattr(exporter, "extra_files") else {}
    if extra and not args.output:
        raise ConfigError([f"--format {args.format}: give -o FILE (its {', '.join(extra)} go next to it)"])
    if args.output:
        directory = os.path.dirname(os.path.abspath(args.output))
        for name, source in extra.items():
            with open(source, encoding="utf-8", newline="") as f:     # byte for byte: its sha256
                write_atomic(os.path.join(directory, name), f.read(), 0o644)
            print(f"wrote {os.path.join(directory, name)}", file=sys.stderr)
        write_atomic(args.output, text, 0o644)
        print(f"wrote {args.output} ({args.format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_kernel(args) -> int:
    """``hpcstack kernel install | remove``: a Jupyter kernel of an installed stack
    (:mod:`hpcstack.modules.kernel`).

    Raises:
        ConfigError: bad kernel name, stack not installed, venv not extended, a kernel hpcstack did
            not write (exit 2).
        HpcstackError: no such kernel to remove (exit 1).
    """
    from hpcstack.modules import kernel
    from hpcstack.recipe import load_recipe

    site = _load_site(args, module_root=getattr(args, "module_root", None))
    recipe = load_recipe(args.recipe, site, _search(args))
    if args.kernel_command == "remove":
        name = args.name or kernel.default_kernel_name(recipe.name, recipe.version)
        removed = kernel.remove_kernel(name, user=args.user, prefix=args.prefix)
        print(f"removed kernel {name} ({removed})")
        return 0
    import shlex

    command = "hpcstack kernel install " + " ".join(shlex.quote(a) for a in sys.argv[3:]) \
        if sys.argv[1:3] == ["kernel", "install"] else ""
    spec = kernel.make_kernel(site, recipe, name=args.name, user=args.user, prefix=args.prefix,
                              venv=args.venv, command=command)
    try:
        path = kernel.install_kernel(spec)
    except PermissionError as exc:
        raise HpcstackError(f"cannot write {exc.filename or spec.directory.parent}: permission denied "
                            "(the system's Jupyter kernels need root: give --user, or --prefix DIR)") from None
    print(f"installed kernel {spec.name} ({spec.display_name}) in {path}")
    print(f"  Jupyter lists it as {spec.display_name!r}; `jupyter kernelspec list` shows it "
          f"where that directory is on Jupyter's path; remove it with: hpcstack kernel remove "
          f"{recipe.full_name} --site {args.site}"
          + (" --user" if args.user else f" --prefix {args.prefix}" if args.prefix else "")
          + (f" --name {args.name}" if args.name else ""))
    return 0


def cmd_check_build(args) -> int:
    """``hpcstack check-build``: require Horovod build flags."""
    from hpcstack.validate.checkbuild import check_build

    if not shutil.which(args.horovodrun):
        raise HpcstackError(f"{args.horovodrun} not found (load the stack's module first)")
    print(check_build(args.horovodrun, [r for r in args.require.split(",") if r]), end="")
    return 0


def cmd_action(args) -> int:
    """``hpcstack action VERB …``: the dry-run script's fetch and unpack lines, run with the code
    of the real run (:func:`hpcstack.install.actions.cli`)."""
    from hpcstack.install.actions import cli

    return cli(args.words)


def cmd_doctor(args) -> int:
    """``hpcstack doctor``: one line per problem of a venv on top of a stack (:mod:`hpcstack.doctor`);
    exit 1 when there is any, 0 when clean, 2 when the venv or stack cannot be found."""
    from hpcstack import doctor

    problems, header = doctor.run(args.venv, args.stack)
    for line in problems:
        print(line)
    if not problems:
        print(f"ok: {header[0]}: nothing shadows or conflicts with the stack, no user-site packages")
        return 0
    print(f"{len(problems)} problem(s): {header[0]}", file=sys.stderr)
    return 1


def cmd_module(args) -> int:
    """``hpcstack module set-default | default | unset-default``: a module's default version.

    Raises:
        ConfigError: a target of the wrong form (exit 2).
        HpcstackError: no such modulefile, or a default file hpcstack did not write (exit 1).
    """
    import re

    from hpcstack.modules import writer as modules

    name, _, version = args.target.partition("/")
    word = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
    if args.module_command == "set-default" and not (word.match(name) and word.match(version)):
        raise ConfigError([f"{args.target!r}: expected NAME/VERSION, e.g. pytorch/2.3.1-gpu "
                           "(letters, digits and ._+-)"])
    if args.module_command != "set-default" and (not word.match(name) or version):
        raise ConfigError([f"{args.target!r}: expected a module NAME, e.g. pytorch"])
    site = _load_site(args, module_root=args.module_root)
    module_dir = os.path.join(site.module_root, name)
    site_args = f" --site {args.site}" + (f" --module-root {args.module_root}" if args.module_root else "")
    if args.module_command == "set-default":
        change = modules.set_default(site.module_root, name, version, site.modules.syntax,
                                     site.modules.tool, site=args.site)
        was = change.previous or "none: the tool picked the highest version"
        print(f"default of {name} is now {version} (was {was}); wrote {', '.join(change.written)}")
        for note in change.notes:
            print(f"note: {note}")
        if change.previous and change.previous != version:
            print(f"switch back: hpcstack module set-default {name}/{change.previous}{site_args}")
        elif not change.previous:
            print(f"switch back: hpcstack module unset-default {name}{site_args}")
        return 0
    if args.module_command == "unset-default":
        removed = modules.unset_default(site.module_root, name)
        print("\n".join(f"removed {p}" for p in removed) or f"{name} has no default written by hpcstack")
        return 0
    versions = modules.available_versions(module_dir, site.modules.tool)
    if not versions:
        raise HpcstackError(f"no modulefiles of {name} for {site.modules.tool} in {site.module_root}")
    defaults = modules.read_defaults(module_dir)
    chosen = defaults.get(modules.DEFAULT_FILES[site.modules.syntax], next(iter(defaults.values()), None))
    for v in versions:
        print(f"{name}/{v}" + (" (default)" if v == chosen else ""))
    for path in modules.foreign_defaults(module_dir):
        print(f"note: {path} was not written by hpcstack and may set the default too")
    if chosen is None:
        print(f"no default set by hpcstack: `module load {name}` picks the highest version")
    return 0


COMMANDS = {"module": cmd_module, "install": cmd_install, "validate": cmd_validate, "lock": cmd_lock, "list": cmd_list,
            "show": cmd_show, "uninstall": cmd_uninstall, "check-build": cmd_check_build,
            "action": cmd_action, "export": cmd_export, "doctor": cmd_doctor,
            "kernel": cmd_kernel, "mount": cmd_mount}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
