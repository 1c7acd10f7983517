"""``hpcstack export``: a recipe's plan for a site in another tool's format (:mod:`hpcstack.export`)."""

from __future__ import annotations

import os
import sys

from hpcstack.cli import options
from hpcstack.errors import ConfigError


def add_export(sub) -> None:
    """The parser of ``hpcstack export`` (its formats: :data:`hpcstack.export.EXPORTERS`)."""
    from hpcstack.export import EXPORTERS

    p = sub.add_parser(
        "export", help="write a recipe's plan for a site in another tool's format",
        description="Resolve the recipe for the site (as install --dry-run does) and write it in "
                    "the chosen format: " + "; ".join(f"{n}: {c.description}" for n, c in sorted(EXPORTERS.items())))
    options.add_recipe(p)
    options.add_site_and_repo(p)
    p.add_argument("--format", required=True, choices=sorted(EXPORTERS), help="the output format")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    p.set_defaults(handler=cmd_export)


def cmd_export(args, session) -> int:
    """``hpcstack export``: the plan in another tool's format (:mod:`hpcstack.export`)."""
    from hpcstack.export import get_exporter
    from hpcstack.fsutil import write_atomic
    from hpcstack.install.service import InstallService

    site, recipe = session.load()
    if args.output:  # no link and no directory another user can change on the way to the file
        session.check_dirs([("-o", os.path.dirname(os.path.abspath(args.output)))])
    exporter = get_exporter(args.format)()
    # an export is the install elsewhere (an image build, EasyBuild): a site whose GPUs the locked
    # wheels cannot run on is refused as its install would be, before anything is written
    plan = InstallService(site, recipe).dry_run() if getattr(exporter, "needs_plan", True) else None
    if plan is None and site.toolchain.cuda_cc_list:  # an image of the site's GPU nodes: the same GPUs
        InstallService(site, recipe).dry_run()
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
