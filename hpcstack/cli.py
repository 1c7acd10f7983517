"""The ``hpcstack`` command: install, validate, lock, list, show, check-build.

Every problem the user can fix is printed as one line (``error: …``) with a non-zero exit:
2 for a bad site config, recipe or command line (nothing written), 1 for a failure while running.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from . import __version__
from .errors import ConfigError, HpcstackError
from .plan import STEP_ORDER


def _add_site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe as NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a path to a recipe file")
    p.add_argument("--site", default="localhost",
                   help="site name under site-configs/ or a path to a site YAML (default: localhost)")
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

    p = sub.add_parser("validate", help="run the stack's training program on several ranks and check it")
    _add_site_args(p)
    p.add_argument("--ranks", type=int, metavar="N", help="number of ranks (default: the site's launcher.ranks)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("lock", help="regenerate a recipe's lock file with uv (hashes for every package)")
    p.add_argument("recipe")
    p.add_argument("--site", default="localhost")

    sub.add_parser("list", help="list recipes and sites")

    p = sub.add_parser("show", help="show what an installed stack records about itself")
    p.add_argument("target", help="a stack prefix, or NAME/VERSION with --site")
    p.add_argument("--site", default="localhost")
    p.add_argument("--prefix", metavar="DIR")

    p = sub.add_parser("check-build", help="run horovodrun --check-build and require flags")
    p.add_argument("--horovodrun", default="horovodrun", help="horovodrun to run (default: from PATH)")
    p.add_argument("--require", default="PyTorch", help="comma-separated flags, NAME or SECTION:NAME")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hpcstack`` console script.

    Args:
        argv (list[str] | None): arguments (default ``sys.argv[1:]``).

    Returns:
        int: exit status (0 ok, 1 failure, 2 bad input).
    """
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


def _load(args):
    from .recipe import load_recipe
    from .site import load_site

    site = load_site(args.site, install_root=getattr(args, "prefix", None),
                     module_root=getattr(args, "module_root", None))
    return site, load_recipe(args.recipe, site)


def cmd_install(args) -> int:
    """``hpcstack install``: resolve, then print (``--dry-run``) or run the plan."""
    from .resolve import build_environment, resolve
    from .runner import Runner, install_lock

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(["--jobs: must be at least 1"])
    site, recipe = _load(args)
    if args.dry_run:
        plan = resolve(recipe, site, jobs=args.jobs)
        sys.stdout.write(plan.to_bash(__version__))
        return 0
    env = build_environment(site)
    plan = resolve(recipe, site, jobs=args.jobs)
    with install_lock(site.install_root, recipe.name, recipe.version, wait=not args.no_wait):
        runner = Runner(plan, env, stop_after=args.stop_after, force=args.force)
        ran = runner.run()
        if ran:
            _record_provenance(plan, site, runner)
            print(f"installed {recipe.full_name} in {plan.prefix}; modulefile {plan.modulefile}")
            print("  " + ", ".join(f"{k} {v:.1f} s" for k, v in runner.timings.items()))
    return 0


def _record_provenance(plan, site, runner) -> None:
    """Keep the plan (as a script and as timings) and the site config as used, in ``<prefix>/.hpcstack``."""
    from .plan import write_atomic

    state = Path(plan.prefix) / ".hpcstack"
    if not state.is_dir():
        return
    write_atomic(state / "install.sh", plan.to_bash(__version__), 0o644)
    write_atomic(state / "site.yaml", site.path.read_text())
    timings = {"hpcstack": __version__, "seconds": {k: round(v, 1) for k, v in runner.timings.items()}}
    write_atomic(state / "timings.json", json.dumps(timings, indent=1) + "\n")


def cmd_validate(args) -> int:
    """``hpcstack validate``: run the training program on ranks under the loaded module."""
    from .validate import local_validation

    site, recipe = _load(args)
    return local_validation(site, recipe, ranks=args.ranks, dry_run=args.dry_run, as_json=args.json)


def cmd_lock(args) -> int:
    """``hpcstack lock``: write ``<stem>.<index>.lock`` from ``<stem>.in`` with uv."""
    from .lock import write_lock

    site, recipe = _load(args)
    path = write_lock(recipe, site)
    print(f"wrote {path}")
    return 0


def cmd_list(args) -> int:
    """``hpcstack list``: recipes and sites."""
    from .recipe import known_recipes
    from .site import known_sites

    print("recipes: " + ", ".join(known_recipes()))
    print("sites:   " + ", ".join(known_sites()))
    return 0


def cmd_show(args) -> int:
    """``hpcstack show``: print a stack's recorded timings, site config and install script."""
    prefix = Path(args.target)
    if not prefix.is_dir():
        from .site import load_site

        site = load_site(args.site, install_root=args.prefix)
        prefix = Path(site.install_root) / args.target
    state = prefix / ".hpcstack"
    if not state.is_dir():
        raise HpcstackError(f"{prefix} is not a stack installed by hpcstack (no .hpcstack/ in it)")
    for name in ("timings.json", "site.yaml", "install.sh"):
        f = state / name
        if f.is_file():
            print(f"==> {f}")
            print(f.read_text())
    steps = sorted((state / "steps").glob("*.json"))
    print("==> steps done: " + ", ".join(s.stem for s in steps))
    return 0


def cmd_check_build(args) -> int:
    """``hpcstack check-build``: require Horovod build flags."""
    from .checkbuild import check_build

    if not shutil.which(args.horovodrun):
        raise HpcstackError(f"{args.horovodrun} not found (load the stack's module first)")
    print(check_build(args.horovodrun, [r for r in args.require.split(",") if r]), end="")
    return 0


COMMANDS = {"install": cmd_install, "validate": cmd_validate, "lock": cmd_lock, "list": cmd_list,
            "show": cmd_show, "check-build": cmd_check_build}

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
