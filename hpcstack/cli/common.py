"""What the commands share: the options of the search path and the trust rule, and the way in to
the site and the recipe (one :class:`hpcstack.loader.Loader` per command)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hpcstack.errors import ConfigError

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
