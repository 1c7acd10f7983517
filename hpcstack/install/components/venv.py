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

    Example:
        ``Venv()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        return {VENV: [Run(("python3", "-m", "venv", "--clear", ctx.venv))]}
