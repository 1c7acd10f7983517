"""Components: the building blocks recipes list; each contributes actions to the standard steps.

Every component is a :class:`~hpcstack.install.components.base.Component` (its hooks:
``contribute(ctx) -> dict[str, list[Action]]``, ``module_environment``, ``module_help``, and step
hooks with :func:`~hpcstack.install.components.base.run_after`); ``Validation`` declares the
stack's validation. Recipes import these from the façade, :mod:`hpcstack.recipe_api`.
"""

from hpcstack.install.components.base import Component, PlanContext, run_after, run_before
from hpcstack.install.components.cudawheels import CudaWheelArchs
from hpcstack.install.components.horovod import HorovodBuild
from hpcstack.install.components.manifest import StackManifest
from hpcstack.install.components.modulefile import Modulefile
from hpcstack.install.components.mpi4py import Mpi4pyBuild
from hpcstack.install.components.sanity import Imports, PythonSnippet
from hpcstack.install.components.source import Patch, SourceBuild
from hpcstack.install.components.tools import StackTools
from hpcstack.install.components.trainer import Trainer
from hpcstack.install.components.validation import Validation
from hpcstack.install.components.venv import Venv
from hpcstack.install.components.wheels import Lock, PipWheels

__all__ = ["Component", "PlanContext", "run_after", "run_before", "Venv", "PipWheels", "Lock", "SourceBuild",
           "HorovodBuild", "Mpi4pyBuild", "Patch", "Imports", "CudaWheelArchs", "PythonSnippet", "StackTools", "Trainer",
           "StackManifest", "Modulefile", "Validation"]
