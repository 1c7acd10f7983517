"""Components: the building blocks recipes list; each contributes actions to the standard steps.

Every component has ``contribute(ctx: PlanContext) -> dict[str, list[Action]]``.
"""

from .base import PlanContext
from .horovod import HorovodBuild, Patch, SourceBuild
from .modulefile import Modulefile
from .sanity import Imports
from .tools import StackTools
from .venv import Venv
from .wheels import PipWheels

__all__ = ["PlanContext", "Venv", "PipWheels", "SourceBuild", "HorovodBuild", "Patch", "Imports",
           "StackTools", "Modulefile"]
