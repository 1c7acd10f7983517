"""``hpcstack list``, ``show`` and ``doctor``: what there is, what a stack records, what a venv on
top of a stack gets wrong. They change nothing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpcstack.cli import options
from hpcstack.errors import ConfigError, HpcstackError


def add_list(sub) -> None:
    """The parser of ``hpcstack list``."""
    p = sub.add_parser("list", help="list recipes and sites, each with the repository it comes from",
                       description="List the recipes and site configs on the search path (--repo "
                                   "directories, then HPCSTACK_PATH, then the built-in ones), each "
                                   "with the repository it comes from and what it shadows.")
    options.add_repo(p)
    options.add_flag(p, "--json", "print the listing as JSON")
    p.set_defaults(handler=cmd_list)


def cmd_list(args, session) -> int:
    """``hpcstack list``: recipes and sites on the search path, with where each comes from.

    Raises:
        ConfigError: a ``--repo``/``HPCSTACK_PATH`` directory that does not exist or is no
            repository, or a recipe file with a syntax error (one line each, exit 2).
    """
    from hpcstack.recipe import check_syntax
    from hpcstack.repos import RECIPES, SITES

    search = session
    listing = {kind: search.entries(kind) for kind in (RECIPES, SITES)}
    problems = [line for e in listing[RECIPES] for line in [check_syntax(e.path)] if line]
    if args.json:
        print(json.dumps({"search_path": [{"path": str(r.path), "origin": r.origin} for r in search.search_repos],
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


def add_show(sub) -> None:
    """The parser of ``hpcstack show``."""
    p = sub.add_parser("show", help="show what an installed stack records about itself (provenance)")
    p.add_argument("target", help="a stack prefix or build directory, or NAME/VERSION (with --site)")
    options.add_site_and_repo(p)
    options.add_prefix(p)
    options.add_flag(p, "--json", "print the record as JSON")
    p.add_argument("--file", metavar="NAME",
                   help="print one recorded file, e.g. plan.json, site.yaml, recipe/<file>, logs/build.log")
    p.set_defaults(handler=cmd_show)


def _shown_build(args, session) -> tuple[Path, Path | None]:
    """``(build directory, prefix or None)`` of ``hpcstack show``'s target: a directory as given,
    else the published build of NAME/VERSION at the site (or the one being built)."""
    from hpcstack.install.layout import StackLayout

    target = Path(args.target)
    if target.is_dir():
        return Path(os.path.realpath(target)), (target if target.is_symlink() else None)
    site = session.site
    session.check_site_dirs(site, modules=False)
    name, version = session.stack_of(args.target)
    session.check_stack_dirs(site, (name, version), modules=False)
    layout = StackLayout.for_site(site, name, version)
    published = layout.published()
    building = layout.read_state()["building"]
    if published:
        return Path(published), Path(layout.prefix)
    if building and os.path.isdir(layout.build_path(building)):
        print(f"{name}/{version} is not published; build {building} is in progress", file=sys.stderr)
        return Path(layout.build_path(building)), None
    raise HpcstackError(f"{name}/{version} is not installed under {site.install_root} "
                        f"(no {layout.prefix}); install it, or give --site/--prefix")


def cmd_show(args, session) -> int:
    """``hpcstack show``: print what a stack records about itself (:mod:`hpcstack.install.provenance`)."""
    from hpcstack.install import provenance
    from hpcstack.install.actions import describe_os_error

    build, prefix = _shown_build(args, session)
    if not (build / ".hpcstack").is_dir():
        raise HpcstackError(f"{build} is not a stack installed by hpcstack (no .hpcstack/ in it)")
    info = provenance.describe(build, prefix)
    if args.file:
        path = info["files"].get(args.file)
        if not path:
            raise HpcstackError(f"{build}: no recorded file {args.file!r} "
                                f"(recorded: {', '.join(info['files']) or 'none'})")
        try:
            text = provenance.read_recorded(path)
        except OSError as exc:
            raise HpcstackError(f"{path}: cannot read: {describe_os_error(exc)}") from None
        # a terminal shows it as it is, but no escape sequence drives the terminal
        sys.stdout.write(provenance.shown(text, keep="\n\t"))
        return 0
    if args.json:
        print(json.dumps(info, indent=1))   # JSON escapes every control character
        return 0
    order = None
    plan = provenance.read_json(Path(info["files"]["plan.json"])) if "plan.json" in info["files"] else None
    if isinstance(plan, dict) and isinstance(plan.get("steps"), list):
        order = [s["name"] for s in plan["steps"] if isinstance(s, dict) and isinstance(s.get("name"), str)]
    sys.stdout.write(provenance.render(info, order))
    return 0


def add_doctor(sub) -> None:
    """The parser of ``hpcstack doctor``."""
    p = sub.add_parser(
        "doctor", help="check your venv on top of a stack: what shadows it, conflicts, ~/.local",
        description="List, one line per problem, what in a venv shadows the loaded stack (same "
                    "distribution, other version), what conflicts with the stack's constraints or "
                    "needs other versions than the stack has, and packages in the user site "
                    "(~/.local) that Python without PYTHONNOUSERSITE=1 would import, and a venv "
                    "without a pip of its own. With no venv: the user site of the stack's Python. "
                    "Exit 1 when there is a problem, 0 when clean.")
    p.add_argument("--venv", metavar="DIR", help="the venv (default: the active one, VIRTUAL_ENV; "
                                                 "none: check the user site only)")
    p.add_argument("--stack", metavar="PREFIX", action="append",
                   help="a stack prefix (repeatable; default: the loaded modules' HPCSTACK_<NAME>_ROOT)")
    p.set_defaults(handler=cmd_doctor)


def cmd_doctor(args, session) -> int:
    """``hpcstack doctor``: one line per problem of a venv on top of a stack (:mod:`hpcstack.doctor`);
    exit 1 when there is any, 0 when clean, 2 when the venv or stack cannot be found."""
    from hpcstack import doctor

    problems, header = doctor.run(args.venv, args.stack)
    return doctor.report(problems, header)
