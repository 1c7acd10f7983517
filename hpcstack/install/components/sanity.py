"""The ``Imports`` component: the sanity check that the stack's packages import."""

from __future__ import annotations

from dataclasses import dataclass

from hpcstack.install.plan import SANITYCHECK, Run
from hpcstack.install.components.base import PlanContext


@dataclass(frozen=True)
class Imports:
    """Import each module with the stack's python, in one interpreter (sanity check).

    Args:
        modules (tuple[str, ...]): importable names, e.g. ``("torch", "horovod.torch")``.
        env (dict[str, str]): variables for the check (e.g. none; see HorovodBuild for stubs).

    Example:
        ``Imports(("torch", "torchvision"))``
    """

    modules: tuple[str, ...]

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        code = "; ".join(f"import {m}" for m in self.modules) + "; print('imports ok')"
        stubs = ctx.toolchain.cuda_stubs
        prepend = {"LD_LIBRARY_PATH": stubs} if stubs else {}
        return {SANITYCHECK: [Run((ctx.python, "-c", code), prepend=prepend)]}
