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
from hpcstack.errors import ArgumentParser, ConfigError, HpcstackError
from hpcstack.install.plan import STEP_ORDER


SITE_HELP = ("site name on the search path (--repo, HPCSTACK_PATH, built-in) or a path to a site "
             "YAML (default: localhost)")


def _add_repo_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repo", action="append", default=[], metavar="DIR",
                   help="a repository of recipes/ and site-configs/, searched before HPCSTACK_PATH "
                        "and the built-in ones (repeatable; first match wins)")
    _add_trust_args(p)


def _add_trust_args(p: argparse.ArgumentParser) -> None:
    """The options of the trust rule (:mod:`hpcstack.trust`, docs/admin/security.md)."""
    p.add_argument("--trust-writable", action="store_true",
                   help="read recipes, site configs and repositories, and write into directories, even "
                        "where accounts other than root, you and the admin group can change them")
    p.add_argument("--admin-group", metavar="GROUP",
                   help="the admin group: its members and group-writable files are trusted as root's "
                        "(default: admin_group of /etc/hpcstack/config.yaml; a site config's "
                        "permissions.admin_group does not count)")
    p.add_argument("--system-config", metavar="FILE",
                   help="hpcstack's system configuration instead of /etc/hpcstack/config.yaml (it "
                        "must be root's and writable by root alone)")


def _add_site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe as NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a path to a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root (caches too, under "
                   "DIR/.hpcstack/cache, unless the site sets cache_dir)")
    p.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")
    p.add_argument("--dry-run", action="store_true", help="print what would run, as a bash script; change nothing")


#: A name given on the command line (partition, QOS, account, workload, kernel): letters,
#: digits and ``._-``, as the site schema's Slurm names.
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,255}"


#: What jsonschema imports, when installed, to check a schema's ``format`` keywords (jupyter's
#: ``jsonschema[format-nongpl]`` brings them, and arrow and lark with them). hpcstack's schemas
#: have no ``format``, and nothing else of hpcstack imports them, so :func:`main` blocks them in
#: its own process (jsonschema expects the ImportError): ``rfc3987_syntax`` alone compiles 38 lark
#: grammars at import, 1.1-2.4 s of every command; the others cost about 60 ms of a no-op
#: re-install (docs/benchmarks.md, "The CLI runs without rfc3987_syntax").
FORMAT_MODULES = ("rfc3987_syntax", "rfc3987", "rfc3986_validator", "rfc3339_validator", "fqdn",
                  "webcolors", "uri_template", "isoduration", "jsonpointer")


def check_args(argv: list[str], args: argparse.Namespace | None = None) -> list[str]:
    """Check command-line values before anything uses them.

    Rules: no argument holds a control character (:data:`hpcstack.schema.CONTROL`: a newline in
    ``--partition`` would become a line of a job script); ``--partition``, ``--qos``,
    ``--account`` and ``--workload`` are names (letters, digits, ``._-``); ``--jobs`` and
    ``--ranks`` are within the site schema's bounds.

    Args:
        argv (list[str]): the raw arguments.
        args (argparse.Namespace | None): the parsed ones (None: check only ``argv``).

    Returns:
        list[str]: one line per problem; empty when every value is fine.
    """
    import re

    from hpcstack.schema import CONTROL
    from hpcstack.site import MAX_JOBS, MAX_RANKS

    problems = [f"argument {i + 1} {ascii(a)[:80]}: holds a control character (newline, NUL, ...)"
                for i, a in enumerate(argv) if CONTROL.search(a)]
    if problems or args is None:
        return problems
    for opt in ("partition", "qos", "account", "workload"):
        value = getattr(args, opt, None)
        if value is not None and not re.fullmatch(_NAME, value):
            problems.append(f"--{opt}: {value!r}: use letters, digits and ._- (at most 256)")
    for opt, top in (("jobs", MAX_JOBS), ("ranks", MAX_RANKS), ("idle", 36500)):
        value = getattr(args, opt, None)
        if value is not None and not 1 <= value <= top:
            problems.append(f"--{opt}: {value}: must be from 1 to {top}")
    return problems


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``hpcstack`` command."""
    parser = ArgumentParser(
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
    p.add_argument("--from", dest="from_bundle", metavar="DIR",
                   help="install with no network from a bundle made by `hpcstack bundle` (every file "
                        "checked against its manifest first)")
    p.add_argument("--default", action="store_true",
                   help="once published, make it what `module load NAME` loads (as `hpcstack module "
                        "set-default`); without it an install never moves an existing default")

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
    _add_site_args(p)
    p.add_argument("--nodes", metavar="N[,N...]",
                   help="node counts, one job each, e.g. 1,2,4 (default: the site's validation.nodes, else 1,2)")
    p.add_argument("--backend", metavar="NAME",
                   help="a backend of the recipe's validation file (its `backends`: e.g. mpi, ddp, "
                        "horovod), or all (also: both); default all, one after the other")
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
                        "workload for the site (e.g. pytorch's digits: a small CNN judged on its test "
                        "accuracy; jax's corrupted: a negative control that must fail); on the "
                        "site's device unless it names one (default: the recipe's workload for the site)")
    p.add_argument("--json", action="store_true", help="print the result (or with --dry-run the job scripts) as JSON")
    p.add_argument("--emit", nargs=2, metavar=("FORMAT", "DIR"),
                   help="write the validation for another tool into DIR instead of running it: "
                        "reframe: a ReFrame check (the same program, options, sanity and performance "
                        "references, per --nodes and --backend) and a ReFrame site configuration "
                        "for the site; run with: reframe -C DIR/settings.py -c DIR -r")

    p = sub.add_parser("lock", help="regenerate a recipe's lock file with uv (hashes for every package)")
    p.add_argument("recipe")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    p.add_argument("--gpu-archs-from", metavar="WHEEL", nargs="+", default=None,
                   help="do not re-lock: record the GPU architectures of these wheel files (pinned by "
                        "the lock) beside the lock, for a recipe with a CudaWheelArchs component")
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
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root (caches too, under "
                   "DIR/.hpcstack/cache, unless the site sets cache_dir)")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--file", metavar="NAME",
                   help="print one recorded file, e.g. plan.json, site.yaml, recipe/<file>, logs/build.log")

    p = sub.add_parser("uninstall", help="remove a stack and its modulefile (not the default version "
                                         "unless --force)")
    p.add_argument("target", help="NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root (caches too, under "
                   "DIR/.hpcstack/cache, unless the site sets cache_dir)")
    p.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")
    p.add_argument("--force", action="store_true",
                   help="remove it even if it is the default version (its default marker goes too), "
                        "deprecated with a date to come, or loaded within --idle days")
    p.add_argument("--idle", type=int, default=30, metavar="DAYS",
                   help="refuse a stack loaded within DAYS days (the site's usage log, lifecycle.usage_log; default 30)")
    p.add_argument("--no-wait", action="store_true", help="fail at once if an install of the stack runs")
    p.add_argument("--dry-run", action="store_true", help="say what would be removed; remove nothing")

    p = sub.add_parser("mount", help="layout: squashfs: mount a stack's image on this node (idempotent)")
    p.add_argument("target", help="NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root (caches too, under "
                   "DIR/.hpcstack/cache, unless the site sets cache_dir)")
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
        kp.add_argument("--site", default=None,
                        help="site name on the search path or a path to a site YAML (default: the "
                             "site that installed the loaded module, else the one site whose module "
                             "tool is this shell's and that has the stack, else localhost)")
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
                    "(~/.local) that Python without PYTHONNOUSERSITE=1 would import, and a venv "
                    "without a pip of its own. With no venv: the user site of the stack's Python. "
                    "Exit 1 when there is a problem, 0 when clean.")
    p.add_argument("--venv", metavar="DIR", help="the venv (default: the active one, VIRTUAL_ENV; "
                                                 "none: check the user site only)")
    p.add_argument("--stack", metavar="PREFIX", action="append",
                   help="a stack prefix (repeatable; default: the loaded modules' HPCSTACK_<NAME>_ROOT)")

    p = sub.add_parser("action", help="run one action of an install's dry-run script (fetch, unpack, sbom)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("words", nargs=argparse.REMAINDER)

    _add_lifecycle_parsers(sub)

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
    _add_deprecate_parsers(msub)
    from hpcstack.lifecycle import compare, usage
    usage.add_hook_parser(msub, SITE_HELP, _add_repo_arg), usage.add_parser(sub, SITE_HELP, _add_repo_arg)
    compare.add_parser(sub, SITE_HELP, _add_repo_arg)
    return parser


def _add_deprecate_parsers(msub) -> None:
    """``module deprecate`` and ``module undeprecate`` (:mod:`hpcstack.lifecycle.deprecation`)."""
    mp = msub.add_parser(
        "deprecate", help="mark NAME/VERSION deprecated: one line at every load, marked in module "
                          "avail, not loadable from --after DATE on",
        description="Environment Modules: module-tag and module-forbid --after in the module root's "
                    ".modulerc, and a line at load from the modulefile; Lmod 8.6: the modulefile's "
                    "add_property(\"state\", \"obsolete\"), LmodMessage, and LmodError after the date.")
    mp.add_argument("target", help="NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a recipe file")
    mp.add_argument("--replacement", metavar="NAME/VERSION", help="what users should load instead")
    mp.add_argument("--after", metavar="YYYY-MM-DD", help="from this day on the module cannot be loaded")
    mp.add_argument("--message", metavar="TEXT", help="one line of your own, added to the notice")
    mp.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(mp)
    mp.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")
    mp = msub.add_parser("undeprecate", help="undo `module deprecate` for NAME/VERSION")
    mp.add_argument("target", help="NAME/VERSION (e.g. pytorch/2.3.1-gpu) or a recipe file")
    mp.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(mp)
    mp.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")


def cmd_module_deprecation(args) -> int:
    """``hpcstack module deprecate | undeprecate`` (:mod:`hpcstack.lifecycle.deprecation`)."""
    from hpcstack.lifecycle import deprecation

    site = _load_site(args, module_root=args.module_root)
    _check_site_dirs(args, site)
    if args.target.endswith(".py"):
        name, version = _stack_of(args, args.target, site)
        target = f"{name}/{version}"
    else:
        target = args.target
    _check_site_dirs(args, site, tuple(target.split("/", 1)) if target.count("/") == 1 else None)
    if args.module_command == "undeprecate":
        for path in deprecation.undeprecate(site, target):
            print(f"changed {path}")
        print(f"{target} is no longer deprecated")
        return 0
    print(_lifecycle("usage").summary(site, target))
    dep, written = deprecation.deprecate(site, target, args.replacement, args.after, args.message)
    for path in written:
        print(f"wrote {path}")
    print(f"users now see: {dep.line()}")
    print(f"undo: hpcstack module undeprecate {target} --site {args.site}"
          + (f" --module-root {args.module_root}" if args.module_root else ""))
    return 0


def _add_lifecycle_parsers(sub) -> None:
    """The commands for a stack over the years: ``audit``, ``bundle``."""
    p = sub.add_parser(
        "bundle", help="everything a recipe's install at a site needs, in one directory, for "
                       "`hpcstack install --from DIR` without network",
        description="Download the lock's files for the site's platform and Python, the sdists "
                    "and what building them needs, copy the recipe with its locks and patches, "
                    "and add hpcstack's own wheel with its dependencies and uv; write "
                    "manifest.json with every file's sha256.")
    p.add_argument("recipe", help="recipe as NAME/VERSION or a path to a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="the bundle directory (created)")
    p.add_argument("--tool-wheel", metavar="FILE",
                   help="hpcstack's own wheel (default: the one it was installed from, or built from its checkout)")

    p = sub.add_parser(
        "audit", help="known vulnerabilities of a recipe's pins for a site, or of an installed stack",
        description="Match every pin of the lock the site gets, and every package built from an "
                    "sdist, against OSV advisories: one line per finding (package, version, "
                    "advisory id, fixed in). Exit 0 when none, 1 when there are any, 2 for bad "
                    "input, 3 when no advisory source can be read. With --stack the result is "
                    "recorded next to the stack's SBOM (.hpcstack/audit.cdx.json, CycloneDX "
                    "vulnerabilities) and `hpcstack show` says when.")
    p.add_argument("recipe", nargs="?", help="recipe as NAME/VERSION or a path to a recipe file")
    p.add_argument("--site", default="localhost", help=SITE_HELP)
    _add_repo_arg(p)
    p.add_argument("--stack", metavar="PREFIX", help="audit an installed stack (its SBOM) instead of a recipe")
    p.add_argument("--db", metavar="DIR",
                   help="a local OSV advisory database (e.g. a clone of github.com/pypa/advisory-database); "
                        "default: the live OSV service")
    p.add_argument("--osv-url", metavar="URL", help="the live OSV service (default https://api.osv.dev)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hpcstack`` console script.

    Args:
        argv (list[str] | None): arguments (default ``sys.argv[1:]``).

    Returns:
        int: exit status (0 ok, 1 failure, 2 bad input).
    """
    for name in FORMAT_MODULES:
        sys.modules.setdefault(name, None)
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        problems = check_args(argv)
        if problems:
            raise ConfigError(problems)
        args = build_parser().parse_args(argv)
        problems = check_args(argv, args)
        if problems:
            raise ConfigError(problems)
        return COMMANDS[args.command](args)
    except HpcstackError as exc:
        from hpcstack.schema import CONTROL

        for line in exc.lines():      # one line each, whatever a value in it holds
            print(f"error: {CONTROL.sub(lambda m: ascii(m.group())[1:-1], line)}", file=sys.stderr)
        return exc.exit_status
    except RecursionError:
        print("error: input nested too deeply", file=sys.stderr)
        return 2
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

    from hpcstack.site import dir_problem

    for opt in ("prefix", "module_root"):
        value = getattr(args, opt, None)
        if value is not None and (not value or re.search(r"[\x00-\x20\x7f]", value)):
            raise ConfigError([f"--{opt.replace('_', '-')}: {value!r}: give a directory path without "
                               "white space or control characters"])
        problem = dir_problem(value, f"--{opt.replace('_', '-')}") if value else None
        if problem:
            raise ConfigError([problem])


def _loader(args):
    """The one way in of this command (:class:`hpcstack.loader.Loader`): its search path, site and
    recipe, each checked by the trust rule before it is read (``--trust-writable`` skips it)."""
    from hpcstack.loader import Loader

    _check_dirs(args)
    return Loader.from_args(args)


def _load_site(args, **overrides):
    """Load the site through the command's loader (:func:`_loader`)."""
    return _loader(args).site(args.site, **overrides)


def _load(args, **dirs):
    """Load the site and the recipe through the command's loader: the recipe's file and
    directory are checked as the site's are before the recipe runs. ``dirs`` (the keywords of
    :func:`hpcstack.loader.site_dirs`): the site's directories the command writes to or reads
    back, checked before the recipe runs (and the stack's own ones after)."""
    site = _load_site(args, install_root=getattr(args, "prefix", None),
                      module_root=getattr(args, "module_root", None))
    if dirs:
        _check_site_dirs(args, site, **dirs)
    recipe = _loader(args).recipe(args.recipe, site)
    if dirs:
        _check_site_dirs(args, site, (recipe.name, recipe.version), **dirs)
    return site, recipe


def _check_site_dirs(args, site, stack=None, **which) -> None:
    """Refuse the site's directories that this command writes to or reads back when an untrusted
    account can change them (:func:`hpcstack.loader.site_dirs`)."""
    from hpcstack.loader import site_dirs

    _loader(args).check_dirs(site_dirs(site, stack, **which), site)


def _shadowing(args, site) -> list[str]:
    """Lines naming the recipe and site of this command where they shadow built-in ones."""
    from hpcstack.repos import RECIPES, SITES

    search, lines = _loader(args), []
    for kind, name, what in ((RECIPES, args.recipe, "recipe"), (SITES, args.site, "site")):
        entry = search.find(kind, name)
        if entry and any(r.origin == "built-in" for r in entry.shadows):
            lines.append(f"note: {what} {name} is {entry.path} from {entry.repo.describe()}; it shadows the "
                         f"built-in {what} of that name")
    return lines


def _layout_note(site) -> None:
    """After a plan or a published install: the ``note:`` of a site whose stacks lie as directories
    on a parallel file system (:func:`hpcstack.install.image.layout_note`), on stderr."""
    from hpcstack.install.image import layout_note

    note = layout_note(site)
    if note:
        print(f"note: {note}", file=sys.stderr)


def cmd_install(args) -> int:
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
    if args.from_bundle:
        _loader(args).check_input_dir("bundle", args.from_bundle)
    site, recipe = _load(args, caches=True)
    if args.from_bundle:
        site = _site_from_bundle(site, recipe, args.from_bundle)
    for line in _shadowing(args, site):
        print(line, file=sys.stderr)
    service = InstallService(site, recipe, recipe.file, jobs=args.jobs, trust=_loader(args).policy)
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


def cmd_validate(args) -> int:
    """``hpcstack validate``: the recipe's validation in Slurm jobs across nodes (default), or on
    this host (``--local``); :class:`hpcstack.validate.service.ValidationService` does the work."""
    from hpcstack.validate.service import ValidationRequest, ValidationService

    site, recipe = _load(args, **({} if args.emit else {"install": True}))  # the stack it runs
    if args.emit:
        return _emit_validation(args, site, recipe)
    return ValidationService(site, recipe, _loader(args).policy).run(ValidationRequest(
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
    from hpcstack.install.lockgen import write_lock

    from hpcstack.install.components.cudawheels import CudaWheelArchs
    from hpcstack.install.lockgen import record_gpu_archs

    site, recipe = _load(args, install=False, modules=False, caches=True)
    if not args.gpu_archs_from:
        path = write_lock(recipe, site)
        print(f"wrote {path}")
    cuda = any(isinstance(c, CudaWheelArchs) for c in recipe.components)
    if args.gpu_archs_from or (cuda and site.toolchain.has_cuda):
        path, records = record_gpu_archs(recipe, site, args.gpu_archs_from or ())
        for rec in records:
            print(f"{path}: {rec.describe()}")
    return 0


def cmd_list(args) -> int:
    """``hpcstack list``: recipes and sites on the search path, with where each comes from.

    Raises:
        ConfigError: a ``--repo``/``HPCSTACK_PATH`` directory that does not exist or is no
            repository, or a recipe file with a syntax error (one line each, exit 2).
    """
    from hpcstack.recipe import check_syntax
    from hpcstack.repos import RECIPES, SITES

    search = _loader(args)
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


def _stack_of(args, target: str, site) -> tuple[str, str]:
    """``(name, version)`` from ``NAME/VERSION`` or a recipe file (run through the command's
    loader, checked first)."""
    if target.endswith(".py") and Path(target).is_file():
        recipe = _loader(args).recipe(target, site)
        return recipe.name, recipe.version
    parts = target.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") or p.startswith(".") for p in parts):
        raise ConfigError([f"{target!r}: expected NAME/VERSION (e.g. pytorch/2.3.1-gpu), a stack prefix "
                           "or a recipe file"])
    return parts[0], parts[1]


def cmd_show(args) -> int:
    """``hpcstack show``: print what a stack records about itself (:mod:`hpcstack.install.provenance`)."""
    from hpcstack.install import provenance
    from hpcstack.install.layout import StackLayout
    from hpcstack.install.plan import describe_os_error

    target = Path(args.target)
    if target.is_dir():
        build, prefix = Path(os.path.realpath(target)), (target if target.is_symlink() else None)
    else:
        site = _load_site(args, install_root=args.prefix)
        _check_site_dirs(args, site, modules=False)
        name, version = _stack_of(args, args.target, site)
        _check_site_dirs(args, site, (name, version), modules=False)
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


def cmd_uninstall(args) -> int:
    """``hpcstack uninstall``: remove a stack's modulefile, then its prefix and builds, as the
    stack's own records name them (:mod:`hpcstack.install.records`): never a path computed
    from the arguments alone, never through a link or a directory another user owns.

    Refuses the default version of the module (a ``.version``, ``default`` link or
    ``.modulerc`` naming it) unless ``--force``, which removes that marker too.
    """
    from types import SimpleNamespace

    from hpcstack.install.service import InstallService

    site = _load_site(args, install_root=args.prefix, module_root=args.module_root)
    _check_site_dirs(args, site, caches=True)
    name, version = _stack_of(args, args.target, site)
    _check_site_dirs(args, site, (name, version), caches=True)
    from hpcstack.lifecycle.deprecation import uninstall_refusal

    refusal = None if args.force else uninstall_refusal(site, f"{name}/{version}")
    refusal = refusal or (None if args.force else _lifecycle("usage").idle_refusal(site, f"{name}/{version}", args.idle))
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
    from hpcstack.lifecycle.deprecation import write_retired

    stand_in = write_retired(site, f"{name}/{version}")
    if stand_in:
        print(f"wrote {stand_in}: loading {name}/{version} now fails, naming its replacement "
              f"(hpcstack module undeprecate {name}/{version} removes it)")
    print(f"uninstalled {name}/{version}")
    return 0


def cmd_mount(args) -> int:
    """``hpcstack mount``: mount the published build's image (``layout: squashfs``) on this node,
    and the previous build's; exit 0 when already mounted, 2 with one line when it cannot
    (:func:`hpcstack.install.image.mount_stack`). ``--print-unit`` prints what nodes need."""
    from hpcstack.install import image
    from hpcstack.install.layout import StackLayout

    site = _load_site(args, install_root=args.prefix)
    _check_site_dirs(args, site, modules=False)
    name, version = _stack_of(args, args.target, site)
    _check_site_dirs(args, site, (name, version), modules=False)
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
    if args.output:  # no link and no directory another user can change on the way to the file
        _loader(args).check_dirs([("-o", os.path.dirname(os.path.abspath(args.output)))])
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


def _infer_site(args) -> tuple[str, dict]:
    """The site of ``hpcstack kernel`` when ``--site`` is not given, and its root overrides.

    1. The stack's module is loaded (``HPCSTACK_<NAME>_ROOT``): the site its install recorded
       (``.hpcstack/provenance.json``), with the install and module roots it used
       (``.hpcstack/site.json``).
    2. Else the one known site whose module tool is this shell's (``$LMOD_CMD``: Lmod, else
       Environment Modules) and whose module root has the stack's modulefile.
    3. Else ``localhost``.

    Returns:
        tuple[str, dict]: the site (name or path) and ``load_site`` keyword overrides.
    """
    from hpcstack.modules.writer import modulefile_path, root_variable
    from hpcstack.repos import SITES

    def known_sites(search) -> list[str]:
        return [entry.name for entry in search.entries(SITES)]

    spec = args.recipe
    if spec.endswith(".py") or spec.count("/") != 1:
        return "localhost", {}
    name, version = spec.split("/")
    root = os.environ.get(root_variable(name), "")
    state = os.path.join(root, ".hpcstack")
    if root and os.path.basename(os.path.normpath(root)) == version:
        try:
            with open(os.path.join(state, "provenance.json")) as f:
                recorded = json.load(f)["site"]
            with open(os.path.join(state, "site.json")) as f:
                used = json.load(f)
            site = recorded["name"] if recorded["name"] in known_sites(_loader(args)) else recorded["file"]
            return site, {"install_root": used.get("install_root"), "module_root": used.get("module_root")}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    tool = "lmod" if os.environ.get("LMOD_CMD") else "environment-modules"
    found = []
    for candidate in known_sites(_loader(args)):
        try:
            site = _loader(args).site(candidate)
        except HpcstackError:
            continue
        if site.modules.tool == tool and os.path.isfile(
                modulefile_path(site.module_root, name, version, site.modules.syntax)):
            found.append(candidate)
    return (found[0] if len(found) == 1 else "localhost"), {}


def _check_venv(args, venv: str) -> None:
    """``kernel install --venv``: the kernel runs the venv's python in everyone who starts it, so
    the venv must be changeable only by accounts the trust rule trusts (:mod:`hpcstack.trust`).

    Raises:
        ConfigError: one line naming whose the venv is and what to do instead (exit status 2).
    """
    from hpcstack import trust

    pol = _loader(args).policy
    path = os.path.abspath(os.path.expanduser(venv))
    problem = None if pol.trust_writable else trust.path_problem(os.path.join(path, "bin", "python"), pol)
    if problem:
        raise ConfigError([f"--venv {venv}: {problem}; the kernel would run that venv's python in everyone "
                           f"who starts it, and {pol.who()} alone may change what hpcstack hands on: let its "
                           f"owner install the kernel (--user), or pass {trust.OVERRIDE}"])


def cmd_kernel(args) -> int:
    """``hpcstack kernel install | remove``: a Jupyter kernel of an installed stack
    (:mod:`hpcstack.modules.kernel`).

    Raises:
        ConfigError: bad kernel name, stack not installed, venv not extended, a kernel hpcstack did
            not write (exit 2).
        HpcstackError: no such kernel to remove (exit 1).
    """
    from hpcstack.modules import kernel

    overrides = {}
    if args.site is None:
        args.site, overrides = _infer_site(args)
    if getattr(args, "module_root", None):
        overrides["module_root"] = args.module_root
    from hpcstack.loader import site_dirs

    site = _load_site(args, **overrides)
    kernels = ("kernels directory", kernel.kernels_dir(args.user, args.prefix))
    if args.kernel_command == "remove":
        _loader(args).check_dirs([kernels])
    else:
        _loader(args).check_dirs(site_dirs(site), site)
        _loader(args).check_dirs([kernels])
        if args.venv:
            _check_venv(args, args.venv)
    recipe = _loader(args).recipe(args.recipe, site)
    if args.kernel_command == "remove":
        name = args.name or kernel.default_kernel_name(recipe.name, recipe.version)
        removed = kernel.remove_kernel(name, user=args.user, prefix=args.prefix)
        print(f"removed kernel {name} ({removed})")
        return 0
    import shlex

    command = "hpcstack kernel install " + " ".join(shlex.quote(a) for a in sys.argv[3:]) \
        if sys.argv[1:3] == ["kernel", "install"] else ""
    _loader(args).check_dirs(site_dirs(site, (recipe.name, recipe.version)), site)
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
          f"{recipe.full_name}" + (f" --site {site.ref or args.site}" if args.site != "localhost" else "")
          + (" --user" if args.user else f" --prefix {args.prefix}" if args.prefix else "")
          + (f" --name {args.name}" if args.name else ""))
    return 0


def cmd_check_build(args) -> int:
    """``hpcstack check-build``: require Horovod build flags."""
    from hpcstack.install.components.checkbuild import check_build

    if not shutil.which(args.horovodrun):
        raise HpcstackError(f"{args.horovodrun} not found (load the stack's module first)")
    print(check_build(args.horovodrun, [r for r in args.require.split(",") if r]), end="")
    return 0


def cmd_action(args) -> int:
    """``hpcstack action VERB …``: the dry-run script's fetch, unpack and components' lines, run
    with the code of the real run (:func:`hpcstack.install.actions.cli`)."""
    import hpcstack.install.components  # noqa: F401  (the components register their verbs)
    from hpcstack.install.actions import cli

    return cli(args.words)


def cmd_doctor(args) -> int:
    """``hpcstack doctor``: one line per problem of a venv on top of a stack (:mod:`hpcstack.doctor`);
    exit 1 when there is any, 0 when clean, 2 when the venv or stack cannot be found."""
    from hpcstack import doctor

    problems, header = doctor.run(args.venv, args.stack)
    return doctor.report(problems, header)


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


def cmd_module(args) -> int:
    """``hpcstack module set-default | default | unset-default``: a module's default version.

    Raises:
        ConfigError: a target of the wrong form (exit 2).
        HpcstackError: no such modulefile, or a default file hpcstack did not write (exit 1).
    """
    import re

    from hpcstack.modules import writer

    if args.module_command == "usage-hook":
        from hpcstack.lifecycle import usage
        return usage.cmd_usage_hook(args, lambda a: _load_site(a, module_root=a.module_root))
    if args.module_command in ("deprecate", "undeprecate"):
        return cmd_module_deprecation(args)
    name, _, version = args.target.partition("/")
    word = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
    if args.module_command == "set-default" and not (word.match(name) and word.match(version)):
        raise ConfigError([f"{args.target!r}: expected NAME/VERSION, e.g. pytorch/2.3.1-gpu "
                           "(letters, digits and ._+-)"])
    if args.module_command != "set-default" and (not word.match(name) or version):
        raise ConfigError([f"{args.target!r}: expected a module NAME, e.g. pytorch"])
    site = _load_site(args, module_root=args.module_root)
    _check_site_dirs(args, site, (name, version or ""), install=False)
    module_dir = os.path.join(site.module_root, name)
    site_args = f" --site {args.site}" + (f" --module-root {args.module_root}" if args.module_root else "")
    if args.module_command == "set-default":
        change = writer.set_default(site.module_root, name, version, site.modules.syntax,
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
        removed = writer.unset_default(site.module_root, name)
        print("\n".join(f"removed {p}" for p in removed) or f"{name} has no default written by hpcstack")
        return 0
    versions = writer.available_versions(module_dir, site.modules.tool)
    if not versions:
        raise HpcstackError(f"no modulefiles of {name} for {site.modules.tool} in {site.module_root}")
    defaults = writer.read_defaults(module_dir)
    chosen = defaults.get(writer.DEFAULT_FILES[site.modules.syntax], next(iter(defaults.values()), None))
    for v in versions:
        print(f"{name}/{v}" + (" (default)" if v == chosen else ""))
    for path in writer.foreign_defaults(module_dir):
        print(f"note: {path} was not written by hpcstack and may set the default too")
    if chosen is None:
        print(f"no default set by hpcstack: `module load {name}` picks the highest version")
    return 0


def _site_from_bundle(site, recipe, path: str):
    """The site with a verified bundle as its only package source (:func:`hpcstack.lifecycle.bundle.use_bundle`)."""
    from hpcstack.install.components.wheels import PipWheels
    from hpcstack.lifecycle import bundle

    manifest = bundle.verify_bundle(path)
    wheels = [c for c in recipe.components if isinstance(c, PipWheels)]
    lock = None
    if wheels:
        lock = wheels[0].lock_path(recipe.directory, wheels[0].lock_for(
            site.toolchain, site.python_version or manifest.get("python"), f"site {site.name}"))
    return bundle.use_bundle(site, recipe, lock, path)


def cmd_bundle(args) -> int:
    """``hpcstack bundle``: write a bundle (:mod:`hpcstack.lifecycle.bundle`)."""
    import time

    from hpcstack.install.resolve import build_environment, detect_python_version
    from hpcstack.lifecycle import bundle

    output = os.path.abspath(args.output)
    _loader(args).check_dirs([("bundle output", output), ("bundle output", os.path.dirname(output))])
    site, recipe = _load(args, install=False, modules=False, caches=True)
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


def cmd_audit(args) -> int:
    """``hpcstack audit``: known vulnerabilities (:mod:`hpcstack.lifecycle.audit`); exit 1 when any."""
    from hpcstack.lifecycle import audit

    if bool(args.recipe) == bool(args.stack):
        raise ConfigError(["give a recipe (NAME/VERSION, with --site) or --stack PREFIX, not both"
                           if args.recipe else "give a recipe (NAME/VERSION, with --site) or --stack PREFIX"])
    if args.db and args.osv_url:
        raise ConfigError(["--db and --osv-url: give one advisory source"])
    if args.db:
        _loader(args).check_input_dir("advisory database", args.db)
    source = audit.OsvDatabase(args.db) if args.db else audit.OsvService(args.osv_url or audit.OSV_URL)
    note = None
    if args.stack:
        state = audit.stack_state_dir(args.stack)
        _loader(args).check_dirs([("stack", args.stack)])   # it reads back its SBOM, and records there
        packages = audit.stack_packages(args.stack)
        title = (json.loads((state / "provenance.json").read_text()).get("title")
                 if (state / "provenance.json").is_file() else None) or args.stack
        result = audit.run_audit(packages, source, f"stack {args.stack}", state_dir=state, title=title)
    else:
        site, recipe = _load(args)
        packages, lock = audit.recipe_packages(recipe, site)
        result = audit.run_audit(packages, source, f"{recipe.full_name} for site {site.name}"
                                 + (f" ({os.path.basename(lock)})" if lock else ""))
        from hpcstack.install.layout import StackLayout

        layout = StackLayout.for_site(site, recipe.name, recipe.version)
        if layout.published():
            note = (f"{recipe.full_name} is installed at {layout.prefix}: audit what it holds, "
                    f"and record it, with --stack {layout.prefix}")
    result.note = result.note or note
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


COMMANDS = {"module": cmd_module, "install": cmd_install, "validate": cmd_validate, "lock": cmd_lock, "list": cmd_list,
            "show": cmd_show, "uninstall": cmd_uninstall, "check-build": cmd_check_build,
            "action": cmd_action, "export": cmd_export, "doctor": cmd_doctor,
            "kernel": cmd_kernel, "mount": cmd_mount}
COMMANDS.update(audit=cmd_audit, bundle=cmd_bundle)
COMMANDS.update(usage=lambda a: _lifecycle("usage").cmd_usage(a, _load_site),
                compare=lambda a: _lifecycle("compare").cmd_compare(a, _load_site))


def _lifecycle(name: str):
    """The module ``hpcstack.lifecycle.<name>`` (imported when its command runs)."""
    import importlib

    return importlib.import_module(f"hpcstack.lifecycle.{name}")

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
