"""``hpcstack module`` (a module's default version) and ``hpcstack kernel`` (a Jupyter kernel of a
stack): how users reach an installed stack."""

from __future__ import annotations

import os
import sys

from hpcstack.cli import options
from hpcstack.errors import ConfigError, HpcstackError


def add_module(sub) -> None:
    """The parser of ``hpcstack module`` and its actions (``deprecate`` and ``undeprecate``:
    :func:`hpcstack.cli.lifecycle.add_deprecate_parsers`)."""
    from hpcstack.cli.lifecycle import add_deprecate_parsers, add_usage_hook_parser

    p = sub.add_parser(
        "module", help="module defaults: which version `module load NAME` picks",
        description="Show or switch the default version of a module in the site's module root "
                    "(.version for Tcl sites, .modulerc.lua for Lua sites; each file replaced "
                    "atomically). set-default prints the previous default and the one command "
                    "that switches back to it.")
    msub = p.add_subparsers(dest="module_command", required=True, metavar="ACTION")
    for action, target_help, action_help in (
            ("set-default", "the module as NAME/VERSION",
             "make NAME/VERSION what `module load NAME` loads"),
            ("default", "the module's NAME", "show the versions of NAME and which is the default"),
            ("unset-default", "the module's NAME",
             "remove hpcstack's default files (the tool then picks the highest version)")):
        mp = msub.add_parser(action, help=action_help)
        mp.add_argument("target", help=target_help)
        options.add_site_and_repo(mp)
        options.add_module_root(mp)
        mp.set_defaults(handler=cmd_module)
    add_deprecate_parsers(msub)
    add_usage_hook_parser(msub)
    msub.choices["usage-hook"].set_defaults(handler=cmd_module)


def cmd_module(args, session) -> int:
    """``hpcstack module set-default | default | unset-default``: a module's default version.

    Raises:
        ConfigError: a target of the wrong form (exit 2).
        HpcstackError: no such modulefile, or a default file hpcstack did not write (exit 1).
    """
    if args.module_command == "usage-hook":
        from hpcstack.lifecycle import usage

        return usage.cmd_usage_hook(args, session)
    import re

    from hpcstack.modules import writer

    name, _, version = args.target.partition("/")
    word = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
    if args.module_command == "set-default" and not (word.match(name) and word.match(version)):
        raise ConfigError([f"{args.target!r}: expected NAME/VERSION, e.g. pytorch/2.3.1-gpu "
                           "(letters, digits and ._+-)"])
    if args.module_command != "set-default" and (not word.match(name) or version):
        raise ConfigError([f"{args.target!r}: expected a module NAME, e.g. pytorch"])
    site = session.site
    session.check_site_dirs(site, (name, version or ""), install=False)
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
    return _show_defaults(site, name)


def _show_defaults(site, name: str) -> int:
    """``hpcstack module default NAME``: the versions of NAME, the default marked."""
    from hpcstack.modules import writer

    module_dir = os.path.join(site.module_root, name)
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


def add_kernel(sub) -> None:
    """The parser of ``hpcstack kernel install | remove``."""
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
        options.add_recipe(kp)
        kp.add_argument("--site", default=None,
                        help="site name on the search path or a path to a site YAML (default: the "
                             "site that installed the loaded module, else the one site whose module "
                             "tool is this shell's and that has the stack, else localhost)")
        options.add_repo(kp)
        where = kp.add_mutually_exclusive_group()
        where.add_argument("--user", action="store_true",
                           help="the user's Jupyter kernels (~/.local/share/jupyter/kernels, $JUPYTER_DATA_DIR)")
        where.add_argument("--prefix", metavar="DIR",
                           help="DIR/share/jupyter/kernels (e.g. a JupyterHub's environment), as "
                                "`jupyter kernelspec install --prefix`")
        kp.add_argument("--name", metavar="N", help="the kernel's name (default NAME-VERSION of the recipe)")
        if action == "install":
            kp.add_argument("--venv", metavar="DIR",
                            help="activate this venv (extended with extend-venv-activate) after "
                                 "loading the module: the user's packages on top of the stack")
            options.add_module_root(kp)
    p.set_defaults(handler=cmd_kernel)


def _infer_site(args, session) -> tuple[str, dict]:
    """The site of ``hpcstack kernel`` when ``--site`` is not given, and its root overrides.

    1. The stack's module is loaded (``HPCSTACK_<NAME>_ROOT``): the site its install recorded
       (``.hpcstack/provenance.json``), with the install and module roots it used
       (``.hpcstack/site.json``).
    2. Else the one known site whose module tool is this shell's (``$LMOD_CMD``: Lmod, else
       Environment Modules) and whose module root has the stack's modulefile.
    3. Else ``localhost``.

    The files of 1. are named by the environment: they are read only when they pass the
    command's trust rule, through the file gate (:func:`hpcstack.modules.kernel.recorded_site`).

    Args:
        args (argparse.Namespace): ``hpcstack kernel``'s command line.
        session (hpcstack.session.Session): the command's session.

    Returns:
        tuple[str, dict]: the site (name or path) and ``load_site`` keyword overrides.

    Raises:
        ConfigError: the loaded stack's records are refused by the trust rule (one line naming
            the variable and the problem, exit status 2).
    """
    from hpcstack.modules.kernel import recorded_site
    from hpcstack.modules.writer import modulefile_path, root_variable
    from hpcstack.session import SITES

    spec = args.recipe
    if spec.endswith(".py") or spec.count("/") != 1:
        return "localhost", {}
    search = session
    known_sites = [entry.name for entry in search.entries(SITES)]
    name, version = spec.split("/")
    recorded = recorded_site(root_variable(name), os.environ.get(root_variable(name), ""), version, known_sites,
                             session.policy)
    if recorded is not None:
        return recorded
    tool = "lmod" if os.environ.get("LMOD_CMD") else "environment-modules"
    found = []
    for candidate in known_sites:
        try:
            site = search.load_site(candidate)
        except HpcstackError:
            continue
        if site.modules.tool == tool and os.path.isfile(
                modulefile_path(site.module_root, name, version, site.modules.syntax)):
            found.append(candidate)
    return (found[0] if len(found) == 1 else "localhost"), {}


def _check_venv(pol, venv: str) -> None:
    """``kernel install --venv``: the kernel runs the venv's python in everyone who starts it, so
    the venv must be changeable only by accounts the trust rule trusts (:mod:`hpcstack.trust`).

    Args:
        pol (hpcstack.trust.Policy): the command's trust policy.
        venv (str): the ``--venv`` directory.

    Raises:
        ConfigError: one line naming whose the venv is and what to do instead (exit status 2).
    """
    from hpcstack import trust

    path = os.path.abspath(os.path.expanduser(venv))
    problem = None if pol.trust_writable else trust.path_problem(os.path.join(path, "bin", "python"), pol)
    if problem:
        raise ConfigError([f"--venv {venv}: {problem}; the kernel would run that venv's python in everyone "
                           f"who starts it, and {pol.who()} alone may change what hpcstack hands on: let its "
                           f"owner install the kernel (--user), or pass {trust.OVERRIDE}"])


def cmd_kernel(args, session) -> int:
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
        args.site, overrides = _infer_site(args, session)
    if getattr(args, "module_root", None):
        overrides["module_root"] = args.module_root
    search = session
    site = search.load_site(args.site, **overrides)   # --prefix is the kernels' here, not an install root
    search.check_dirs([("kernels directory", kernel.kernels_dir(args.user, args.prefix))])
    if args.kernel_command != "remove":
        search.check_site_dirs(site)                # before any code of the recipe runs
        if args.venv:
            _check_venv(search.policy, args.venv)
    recipe = search.load_recipe(args.recipe, site)
    if args.kernel_command == "remove":
        name = args.name or kernel.default_kernel_name(recipe.name, recipe.version)
        removed = kernel.remove_kernel(name, user=args.user, prefix=args.prefix)
        print(f"removed kernel {name} ({removed})")
        return 0
    import shlex

    command = "hpcstack kernel install " + " ".join(shlex.quote(a) for a in sys.argv[3:]) \
        if sys.argv[1:3] == ["kernel", "install"] else ""
    search.check_stack_dirs(site, (recipe.name, recipe.version))
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
