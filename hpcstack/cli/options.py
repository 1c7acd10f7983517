"""The options several commands share, each declared once (as Spack's ``cmd/common/arguments.py``).

Each function adds one option (or one group) to a command's parser where the command declares
it, so that the options keep their place in the command's ``--help``; the help texts name no
recipe: a command's own help says what is special to it.
"""

from __future__ import annotations

import argparse

#: ``--site``: where the site comes from.
SITE_HELP = ("site name on the search path (--repo, HPCSTACK_PATH, built-in) or a path to a site "
             "YAML (default: localhost)")
#: The positional recipe of the commands that read one.
RECIPE_HELP = "recipe as NAME/VERSION or a path to a recipe file"
#: The positional stack of the commands that act on an installed one.
TARGET_HELP = "NAME/VERSION or a recipe file"


def add_recipe(p: argparse.ArgumentParser, **kwargs) -> None:
    """The positional ``recipe`` (``kwargs``: e.g. ``nargs="?"``)."""
    p.add_argument("recipe", help=RECIPE_HELP, **kwargs)


def add_target(p: argparse.ArgumentParser) -> None:
    """The positional ``target``: an installed stack as NAME/VERSION, or its recipe file."""
    p.add_argument("target", help=TARGET_HELP)


def add_site(p: argparse.ArgumentParser) -> None:
    """``--site NAME|FILE`` (default ``localhost``)."""
    p.add_argument("--site", default="localhost", help=SITE_HELP)


def add_repo(p: argparse.ArgumentParser) -> None:
    """``--repo DIR`` (repeatable) and the options of the trust rule (:func:`add_trust`): what
    builds the command's :class:`hpcstack.session.Session`."""
    p.add_argument("--repo", action="append", default=[], metavar="DIR",
                   help="a repository of recipes/ and site-configs/, searched before HPCSTACK_PATH "
                        "and the built-in ones (repeatable; first match wins)")
    add_trust(p)


def add_trust(p: argparse.ArgumentParser) -> None:
    """The options of the trust rule (:mod:`hpcstack.trust`, docs/admin/security.md):
    ``--trust-writable``, ``--admin-group``, ``--system-config``."""
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


def add_prefix(p: argparse.ArgumentParser) -> None:
    """``--prefix DIR``: the install root instead of the site's."""
    p.add_argument("--prefix", metavar="DIR", help="install root, instead of the site's install_root (caches too, under "
                   "DIR/.hpcstack/cache, unless the site sets cache_dir)")


def add_module_root(p: argparse.ArgumentParser) -> None:
    """``--module-root DIR``: the modulefile root instead of the site's."""
    p.add_argument("--module-root", metavar="DIR", help="modulefile root, instead of the site's module_root")


def add_flag(p: argparse.ArgumentParser, option: str, help: str) -> None:
    """A flag the commands share with help of their own (``--json``, ``--dry-run``, ``--force``,
    ``--no-wait``): ``store_true``, default False."""
    p.add_argument(option, action="store_true", help=help)


def add_stack_args(p: argparse.ArgumentParser) -> None:
    """What every command that resolves a recipe for a site takes first: the recipe, ``--site``,
    ``--repo`` (and the trust options), ``--prefix``, ``--module-root``, ``--dry-run``."""
    add_recipe(p)
    add_site(p)
    add_repo(p)
    add_prefix(p)
    add_module_root(p)
    add_flag(p, "--dry-run", "print what would run, as a bash script; change nothing")


def add_site_and_repo(p: argparse.ArgumentParser) -> None:
    """``--site`` then ``--repo`` and the trust options (:func:`add_site`, :func:`add_repo`)."""
    add_site(p)
    add_repo(p)
