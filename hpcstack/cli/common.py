"""The way in of every command to its site and recipe: one :class:`hpcstack.loader.Loader` per
command (its search path and trust policy, from ``--repo`` and the trust options of
:mod:`hpcstack.cli.options`), and the checks of the directories the command writes to."""

from __future__ import annotations

from pathlib import Path

from hpcstack.errors import ConfigError


def check_dirs(args) -> None:
    """Refuse ``--prefix``/``--module-root`` values that no venv or modulefile can hold.

    Raises:
        ConfigError: one line naming the option (exit status 2).
    """
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


def loader(args):
    """The one way in of this command (:class:`hpcstack.loader.Loader`): its search path, site and
    recipe, each checked by the trust rule before it is read (``--trust-writable`` skips it).
    Built once per command (:meth:`hpcstack.loader.Loader.from_args` keeps it with ``args``);
    ``--prefix`` and ``--module-root`` are checked first (:func:`check_dirs`).

    Args:
        args (argparse.Namespace): the parsed command line.

    Raises:
        ConfigError: a bad directory option, repository or trust setting (exit status 2).
    """
    from hpcstack.loader import Loader

    check_dirs(args)
    return Loader.from_args(args)


def load_site(args, **overrides):
    """Load ``--site`` through the command's loader (:func:`loader`); ``overrides``: the keywords
    of :meth:`hpcstack.loader.Loader.site` (``install_root``, ``module_root``)."""
    return loader(args).site(args.site, **overrides)


def load(args, **dirs):
    """Load the site and the recipe through the command's loader: the recipe's file and
    directory are checked as the site's are before the recipe runs. ``dirs`` (the keywords of
    :func:`hpcstack.loader.site_dirs`): the site's directories the command writes to or reads
    back, checked before the recipe runs (and the stack's own ones after).

    Returns:
        tuple[hpcstack.site.Site, hpcstack.recipe.Recipe]: the site (with ``--prefix`` and
        ``--module-root``) and the recipe.
    """
    site = load_site(args, install_root=getattr(args, "prefix", None),
                     module_root=getattr(args, "module_root", None))
    if dirs:
        check_site_dirs(args, site, **dirs)
    recipe = loader(args).recipe(args.recipe, site)
    if dirs:
        check_site_dirs(args, site, (recipe.name, recipe.version), **dirs)
    return site, recipe


def check_site_dirs(args, site, stack=None, **which) -> None:
    """Refuse the site's directories that this command writes to or reads back when an untrusted
    account can change them (:func:`hpcstack.loader.site_dirs`)."""
    from hpcstack.loader import site_dirs

    loader(args).check_dirs(site_dirs(site, stack, **which), site)


def stack_of(args, target: str, site) -> tuple[str, str]:
    """``(name, version)`` from ``NAME/VERSION`` or a recipe file (run through the command's
    loader, checked first).

    Raises:
        ConfigError: a target of neither form (exit status 2).
    """
    if target.endswith(".py") and Path(target).is_file():
        recipe = loader(args).recipe(target, site)
        return recipe.name, recipe.version
    parts = target.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") or p.startswith(".") for p in parts):
        raise ConfigError([f"{target!r}: expected NAME/VERSION (e.g. pytorch/2.3.1-gpu), a stack prefix "
                           "or a recipe file"])
    return parts[0], parts[1]
