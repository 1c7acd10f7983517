"""The ``Venv`` component: the stack's venv, on top of the site's Python module."""

from __future__ import annotations

from dataclasses import dataclass

import os

from hpcstack.install.actions import Run, WriteFile
from hpcstack.install.plan import VENV
from hpcstack.install.components.base import Component, PlanContext

#: The name of the venv's start-up file (sorted first among the ``.pth`` files, so the others
#: already see the paths it sets).
PATHS_PTH = "00-hpcstack-paths.pth"


def paths_pth(ctx: PlanContext) -> str:
    """The text of :data:`PATHS_PTH`: at the start of the stack's Python, its site-packages once,
    by its real path, where a plain venv has it (after the standard library).

    Under the module the stack's site-packages comes to ``sys.path`` through the stable prefix
    (a symbolic link to the build) and, from ``PYTHONPATH``, ahead of the standard library.
    torch resolves the real path of each of its ~700 module files (``os.path.realpath``: one
    ``lstat`` per component and one ``readlink`` per link), and every import of a standard
    module first looks in site-packages: 2,838 metadata calls more than a plain venv for
    ``import torch, horovod.torch`` (docs/benchmarks.md). With this line the modules'
    ``__file__`` are real paths, resolved once here, and ``sys.path`` is a plain venv's; a
    process keeps importing from the build it started with, even when a new build is published
    while it runs. Only the stack's own ``python`` reads it; a user's venv sees the stack
    through ``PYTHONPATH`` as before.

    Args:
        ctx (PlanContext): the install (its stage prefix is the build's real directory).

    Returns:
        str: two lines, a comment and one ``import`` line that ``site`` executes.
    """
    real = ctx.site_packages
    stable = ctx.published().site_packages
    # The comment line is part of the venv step's text and so of every installed build's step
    # hashes: a change to it makes every stack redo its venv on its next install.
    return ("# hpcstack: this stack's site-packages by its real path, after the standard library "
            "(fewer file-system calls per import, and the build a process started with)\n"
            f"import sys; sys.path[:] = [p for p in sys.path if p not in ({stable!r}, {real!r})] + [{real!r}]\n")


@dataclass(frozen=True)
class Venv(Component):
    """Create ``<stage prefix>/venv`` with the ``python3`` of the site's base module.

    The venv is made where it stays: in the build's stage prefix, which the stack's prefix
    links to once published (a venv cannot be moved: its scripts hold absolute paths).

    ``--clear`` makes a redone step start from an empty venv, so nothing of an earlier attempt
    survives (the steps after it are redone too).

    Where the site's installer is uv (``installer.backend: uv``, the default) the venv is made
    ``--without-pip``: uv installs into it from outside, and seeding pip with ``ensurepip``
    took 2.6 of a warm install's 20 s. Such a venv has no ``pip``; a user who wants
    one runs ``python -m ensurepip`` in a venv of their own (``extend-venv-activate``). With
    ``backend: pip`` the venv gets its pip, which then installs the lock.

    The venv gets one start-up file, :data:`PATHS_PTH` (see :func:`paths_pth`).

    Example:
        ``Venv()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        without_pip = ("--without-pip",) if ctx.site.installer.backend == "uv" else ()
        return {VENV: [Run(("python3", "-m", "venv", "--clear", *without_pip, ctx.venv)),
                       WriteFile(os.path.join(ctx.site_packages, PATHS_PTH), paths_pth(ctx))]}
