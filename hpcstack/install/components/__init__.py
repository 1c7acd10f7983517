"""Components: the building blocks recipes list; each contributes actions to the standard steps.

Every component has ``contribute(ctx: PlanContext) -> dict[str, list[Action]]``.
"""

from hpcstack.install.components.base import PlanContext
from hpcstack.install.components.cudawheels import CudaWheelArchs
from hpcstack.install.components.horovod import HorovodBuild
from hpcstack.install.components.manifest import StackManifest
from hpcstack.install.components.modulefile import Modulefile
from hpcstack.install.components.sanity import Imports, PythonSnippet
from hpcstack.install.components.source import Patch, SourceBuild
from hpcstack.install.components.tools import StackTools
from hpcstack.install.components.trainer import Trainer
from hpcstack.install.components.venv import Venv
from hpcstack.install.components.wheels import Lock, PipWheels

__all__ = ["PlanContext", "Venv", "PipWheels", "Lock", "SourceBuild", "HorovodBuild", "Patch", "Imports",
           "CudaWheelArchs",
           "PythonSnippet", "StackTools", "Trainer", "StackManifest", "Modulefile"]
