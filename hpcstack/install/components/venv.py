"""The ``Venv`` component: the stack's venv, on top of the site's Python module."""

from __future__ import annotations

from dataclasses import dataclass

from hpcstack.install.plan import VENV, Run
from hpcstack.install.components.base import PlanContext


@dataclass(frozen=True)
class Venv:
    """Create ``<stage prefix>/venv`` with the ``python3`` of the site's base module.

    The venv is made where it stays: in the build's stage prefix, which the stack's prefix
    links to once published (a venv cannot be moved: its scripts hold absolute paths).

    ``--clear`` makes a redone step start from an empty venv, so nothing of an earlier attempt
    survives (the steps after it are redone too).

    Where the site's installer is uv (``installer.backend: uv``, the default) the venv is made
    ``--without-pip``: uv installs into it from outside, and seeding pip with ``ensurepip``
    took 2.6 of a warm install's 20 s (issue 14). Such a venv has no ``pip``; a user who wants
    one runs ``python -m ensurepip`` in a venv of their own (``extend-venv-activate``). With
    ``backend: pip`` the venv gets its pip, which then installs the lock.

    Example:
        ``Venv()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        without_pip = ("--without-pip",) if ctx.site.installer.backend == "uv" else ()
        return {VENV: [Run(("python3", "-m", "venv", "--clear", *without_pip, ctx.venv))]}
