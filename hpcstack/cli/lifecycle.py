"""A stack over the years: ``hpcstack bundle`` (an offline install), ``hpcstack audit`` (known
vulnerabilities) and ``hpcstack module deprecate | undeprecate`` (:mod:`hpcstack.lifecycle`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hpcstack.cli import options
from hpcstack.errors import ConfigError


def add_bundle(sub) -> None:
    """The parser of ``hpcstack bundle``."""
    p = sub.add_parser(
        "bundle", help="everything a recipe's install at a site needs, in one directory, for "
                       "`hpcstack install --from DIR` without network",
        description="Download the lock's files for the site's platform and Python, the sdists "
                    "and what building them needs, copy the recipe with its locks and patches, "
                    "and add hpcstack's own wheel with its dependencies and uv; write "
                    "manifest.json with every file's sha256.")
    options.add_recipe(p)
    options.add_site_and_repo(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle directory (created)")
    p.add_argument("--tool-wheel", metavar="FILE",
                   help="hpcstack's own wheel (default: the one it was installed from, or built from its checkout)")
    p.set_defaults(handler=cmd_bundle)


def cmd_bundle(args, session) -> int:
    """``hpcstack bundle``: write a bundle (:mod:`hpcstack.lifecycle.bundle`)."""
    import time

    from hpcstack.install.resolve import build_environment, detect_python_version
    from hpcstack.lifecycle import bundle

    output = os.path.abspath(args.output)
    session.check_dirs([("bundle output", output), ("bundle output", os.path.dirname(output))])
    site, recipe = session.load(install=False, modules=False, caches=True)
    python = site.python_version or detect_python_version(build_environment(site))
    start = time.monotonic()
    manifest = bundle.make_bundle(recipe, site, recipe.file, Path(args.output),
                                  python, tool_wheel=args.tool_wheel, announce=lambda line: print(line, file=sys.stderr))
    size = sum(f["size"] for f in manifest["files"].values())
    print(f"bundle of {recipe.full_name} for site {site.name} (Python {python}): {args.output}: "
          f"{len(manifest['files'])} files, {size / 1e6:.1f} MB, id {manifest['bundle_id'][:16]}, "
          f"{time.monotonic() - start:.0f} s")
    print(f"install it with no network: hpcstack install {recipe.full_name} --site {site.ref or site.name} "
          f"--from {args.output}")
    return 0


def add_audit(sub) -> None:
    """The parser of ``hpcstack audit``."""
    p = sub.add_parser(
        "audit", help="known vulnerabilities of a recipe's pins for a site, or of an installed stack",
        description="Match every pin of the lock the site gets, and every package built from an "
                    "sdist, against OSV advisories: one line per finding (package, version, "
                    "advisory id, fixed in). Exit 0 when none, 1 when there are any, 2 for bad "
                    "input, 3 when no advisory source can be read. With --stack the result is "
                    "recorded next to the stack's SBOM (.hpcstack/audit.cdx.json, CycloneDX "
                    "vulnerabilities) and `hpcstack show` says when.")
    options.add_recipe(p, nargs="?")
    options.add_site_and_repo(p)
    p.add_argument("--stack", metavar="PREFIX", help="audit an installed stack (its SBOM) instead of a recipe")
    p.add_argument("--db", metavar="DIR",
                   help="a local OSV advisory database (e.g. a clone of github.com/pypa/advisory-database); "
                        "default: the live OSV service")
    p.add_argument("--osv-url", metavar="URL", help="the live OSV service (default https://api.osv.dev)")
    options.add_flag(p, "--json", "print the result as JSON")
    p.set_defaults(handler=cmd_audit)


def cmd_audit(args, session) -> int:
    """``hpcstack audit``: known vulnerabilities (:mod:`hpcstack.lifecycle.audit`); exit 1 when any."""
    from hpcstack.lifecycle import audit

    if bool(args.recipe) == bool(args.stack):
        raise ConfigError(["give a recipe (NAME/VERSION, with --site) or --stack PREFIX, not both"
                           if args.recipe else "give a recipe (NAME/VERSION, with --site) or --stack PREFIX"])
    if args.db and args.osv_url:
        raise ConfigError(["--db and --osv-url: give one advisory source"])
    if args.db:
        session.check_input_dir("advisory database", args.db)
    source = audit.OsvDatabase(args.db) if args.db else audit.OsvService(args.osv_url or audit.OSV_URL)
    result = _audit_stack(args, session, source) if args.stack else _audit_recipe(session, source)
    if args.json:
        sys.stdout.write(result.to_json())
    else:
        for finding in result.findings:
            print(finding.line())
        n, k = len(result.findings), len({f.package for f in result.findings})
        print(f"{n} known vulnerabilit{'y' if n == 1 else 'ies'} in {k} of {len(result.packages)} packages"
              if n else f"no known vulnerabilities in {len(result.packages)} packages",
              f"of {result.target} ({result.source})", file=sys.stderr)
        if result.recorded:
            print(f"recorded in {result.recorded}", file=sys.stderr)
        if result.note:
            print(f"note: {result.note}", file=sys.stderr)
    return 1 if result.findings else 0


def _audit_stack(args, session, source):
    """``hpcstack audit --stack PREFIX``: the installed stack's SBOM, the result recorded beside it."""
    from hpcstack.lifecycle import audit

    state = audit.stack_state_dir(args.stack)
    session.check_dirs([("stack", args.stack)])   # it reads back its SBOM, and records there
    packages = audit.stack_packages(args.stack)
    title = (json.loads((state / "provenance.json").read_text()).get("title")
             if (state / "provenance.json").is_file() else None) or args.stack
    return audit.run_audit(packages, source, f"stack {args.stack}", state_dir=state, title=title)


def _audit_recipe(session, source):
    """``hpcstack audit NAME/VERSION``: the pins of the lock the site gets; a note when the stack
    is installed (its own SBOM is then the better target)."""
    from hpcstack.install.layout import StackLayout
    from hpcstack.lifecycle import audit

    site, recipe = session.load()
    packages, lock = audit.recipe_packages(recipe, site)
    result = audit.run_audit(packages, source, f"{recipe.full_name} for site {site.name}"
                             + (f" ({os.path.basename(lock)})" if lock else ""))
    layout = StackLayout.for_site(site, recipe.name, recipe.version)
    if layout.published():
        result.note = result.note or (f"{recipe.full_name} is installed at {layout.prefix}: audit what it "
                                      f"holds, and record it, with --stack {layout.prefix}")
    return result


def add_deprecate_parsers(msub) -> None:
    """``module deprecate`` and ``module undeprecate`` (:mod:`hpcstack.lifecycle.deprecation`)."""
    mp = msub.add_parser(
        "deprecate", help="mark NAME/VERSION deprecated: one line at every load, marked in module "
                          "avail, not loadable from --after DATE on",
        description="Environment Modules: module-tag and module-forbid --after in the module root's "
                    ".modulerc, and a line at load from the modulefile; Lmod 8.6: the modulefile's "
                    "add_property(\"state\", \"obsolete\"), LmodMessage, and LmodError after the date.")
    options.add_target(mp)
    mp.add_argument("--replacement", metavar="NAME/VERSION", help="what users should load instead")
    mp.add_argument("--after", metavar="YYYY-MM-DD", help="from this day on the module cannot be loaded")
    mp.add_argument("--message", metavar="TEXT", help="one line of your own, added to the notice")
    options.add_site_and_repo(mp)
    options.add_module_root(mp)
    mp.set_defaults(handler=cmd_module_deprecation)
    mp = msub.add_parser("undeprecate", help="undo `module deprecate` for NAME/VERSION")
    options.add_target(mp)
    options.add_site_and_repo(mp)
    options.add_module_root(mp)
    mp.set_defaults(handler=cmd_module_deprecation)


def cmd_module_deprecation(args, session) -> int:
    """``hpcstack module deprecate | undeprecate`` (:mod:`hpcstack.lifecycle.deprecation`)."""
    from hpcstack.lifecycle import deprecation

    site = session.site
    session.check_site_dirs(site)
    if args.target.endswith(".py"):
        name, version = session.stack_of(args.target)
        target = f"{name}/{version}"
    else:
        target = args.target
    if target.count("/") == 1:
        session.check_stack_dirs(site, tuple(target.split("/", 1)))
    if args.module_command == "undeprecate":
        for path in deprecation.undeprecate(site, target):
            print(f"changed {path}")
        print(f"{target} is no longer deprecated")
        return 0
    from hpcstack.lifecycle import usage

    print(usage.summary(site, target))
    dep, written = deprecation.deprecate(site, target, args.replacement, args.after, args.message)
    for path in written:
        print(f"wrote {path}")
    print(f"users now see: {dep.line()}")
    print(f"undo: hpcstack module undeprecate {target} --site {args.site}"
          + (f" --module-root {args.module_root}" if args.module_root else ""))
    return 0


def add_usage(sub) -> None:
    """The parser of ``hpcstack usage`` (:mod:`hpcstack.lifecycle.usage`)."""
    p = sub.add_parser(
        "usage", help="who loads the site's stacks: users, loads, jobs, first and last use",
        description="Read the site's module usage log (lifecycle.usage_log, written by the module tools' "
                    "hooks: hpcstack module usage-hook install); as root, first move the spool's new "
                    "events into usage.log. Per stack: distinct users, loads, Slurm jobs, first and last "
                    "load. Lines that are not valid events are ignored (and counted).")
    p.add_argument("stack", nargs="?", help="NAME/VERSION or NAME (default: every stack)")
    p.add_argument("--since", default="90d", metavar="WHEN", help="only loads since: 90d, 12w, 48h or YYYY-MM-DD (default 90d)")
    options.add_site_and_repo(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=cmd_usage)


def cmd_usage(args, session) -> int:
    """``hpcstack usage`` (:func:`hpcstack.lifecycle.usage.cmd_usage`)."""
    from hpcstack.lifecycle import usage

    return usage.cmd_usage(args, session)


def add_compare(sub) -> None:
    """The parser of ``hpcstack compare`` (:mod:`hpcstack.lifecycle.compare`)."""
    p = sub.add_parser(
        "compare", help="compare two stacks (installed, an image, or a bundle): distributions, versions, file hashes",
        description="Print every difference between A and B: distributions and versions of their SBOMs "
                    "(and whether each SBOM lists every distribution of its venv), the sha256 of every "
                    "file of each distribution at the same version on both sides, what they were built "
                    "for (Python, CUDA, MPI) and their validation figures. Exit 1 when anything differs. "
                    "A and B: a stack prefix, NAME/VERSION installed at --site, a bundle directory, or a "
                    "container image of hpcstack export (image:REF as buildah from takes it, e.g. "
                    "image:localhost/hpcstack-mpi4py:4.1.2, or an OCI archive's path), read with buildah mount.")
    p.add_argument("a", metavar="A")
    p.add_argument("b", metavar="B")
    options.add_site_and_repo(p)
    p.add_argument("--prefix", metavar="DIR", help="install root for NAME/VERSION, instead of the site's install_root")
    files = p.add_mutually_exclusive_group()
    files.add_argument("--files", dest="files", action="store_true", default=None,
                       help="hash and compare files (the default unless both are NAME/VERSION)")
    files.add_argument("--no-files", dest="files", action="store_false", help="compare distributions and versions only")
    p.add_argument("--report", action="append", metavar="FILE", default=[],
                   help="a validation report.json of A, then of B (default: .hpcstack/validation.json of each)")
    p.add_argument("--storage-driver", metavar="DRIVER",
                   help="buildah's storage driver for an image (default: $STORAGE_DRIVER, else buildah's own; vfs "
                        "where overlay is not available)")
    p.add_argument("--storage-root", metavar="DIR", help="buildah's storage directory for an image (its --root)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_compare)


def cmd_compare(args, session) -> int:
    """``hpcstack compare`` (:func:`hpcstack.lifecycle.compare.cmd_compare`)."""
    from hpcstack.lifecycle import compare

    return compare.cmd_compare(args, session)


def add_usage_hook_parser(msub) -> None:
    """``hpcstack module usage-hook install`` (:func:`hpcstack.lifecycle.usage.cmd_usage_hook`);
    ``hpcstack module`` dispatches it."""
    mp = msub.add_parser("usage-hook", help="write the module tools' hooks that record module loads "
                                            "(lifecycle.usage_log)")
    mp.add_argument("action", choices=["install"], help="install: make the usage directory and write the hooks")
    options.add_site_and_repo(mp)
    options.add_module_root(mp)
