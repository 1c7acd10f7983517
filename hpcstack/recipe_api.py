"""The recipe API: everything a recipe file uses, from one module (as Spack's ``spack.package``).

A recipe starts with one import::

    from hpcstack.recipe_api import Imports, Modulefile, PipWheels, Recipe, Validation, Venv

and never imports from ``hpcstack``'s other modules, whose layout may change under it; what is
here stays. ``from hpcstack.recipe_api import *`` brings exactly :data:`__all__`.

What it holds (each documented where it is defined; docs/recipes.md walks through them):

- the recipe: :class:`~hpcstack.recipe.Recipe`;
- the components a recipe lists: :class:`~hpcstack.install.components.venv.Venv`,
  :class:`~hpcstack.install.components.wheels.PipWheels` with its
  :class:`~hpcstack.install.components.wheels.Lock` entries (and :data:`PYPI`, PyPI's index),
  :class:`~hpcstack.install.components.source.SourceBuild` with
  :class:`~hpcstack.install.components.source.Patch`,
  :class:`~hpcstack.install.components.horovod.HorovodBuild`,
  :class:`~hpcstack.install.components.mpi4py.Mpi4pyBuild`,
  :class:`~hpcstack.install.components.cudawheels.CudaWheelArchs`,
  :class:`~hpcstack.install.components.sanity.Imports`,
  :class:`~hpcstack.install.components.tools.StackTools`,
  :class:`~hpcstack.install.components.trainer.Trainer`,
  :class:`~hpcstack.install.components.manifest.StackManifest`,
  :class:`~hpcstack.install.components.modulefile.Modulefile` and
  :class:`~hpcstack.install.components.validation.Validation`;
- what a component of the recipe's own needs: the base class
  :class:`~hpcstack.install.components.base.Component` with its hooks, the step hooks
  :func:`~hpcstack.install.components.base.run_after` and
  :func:`~hpcstack.install.components.base.run_before`, the
  :class:`~hpcstack.install.components.base.PlanContext` every hook receives, the step names
  (:data:`FETCH` ... :data:`MODULE`, in :data:`STEP_ORDER`), the actions a step is made of
  (:class:`~hpcstack.install.actions.Run`, :class:`~hpcstack.install.actions.WriteFile`,
  :class:`~hpcstack.install.actions.Fetch`, :class:`~hpcstack.install.actions.VerifySha256`,
  :class:`~hpcstack.install.actions.Unpack`, :class:`~hpcstack.install.actions.Capture`), the
  environment changes a modulefile makes (:class:`~hpcstack.modules.envchange.SetEnv`,
  ``PrependPath``, ``AppendPath``, ``UnsetEnv``) and the sanity check's
  :class:`~hpcstack.install.components.sanity.PythonSnippet`.

Why ``recipe_api`` and not ``package`` (Spack's name): in hpcstack a "package" is a Python
distribution a stack installs (``PipWheels``' pins, ``SourceBuild(package, ...)``, the key
packages of ``module help``), so ``hpcstack.package`` would read as one of those; the module is
named for who uses it, recipe authors. It is not :mod:`hpcstack.recipe` itself, which loads
recipe files and sits below the install layer (tests/test_import_graph.py): this module is at
the install layer, above everything it re-exports.
"""

from hpcstack.install.actions import Capture, Fetch, Run, Unpack, VerifySha256, WriteFile
from hpcstack.install.components import (CudaWheelArchs, HorovodBuild, Imports, Lock, Modulefile, Mpi4pyBuild, Patch,
                                         PipWheels,
                                         PythonSnippet, SourceBuild, StackManifest, StackTools, Trainer, Validation,
                                         Venv)
from hpcstack.install.components.base import Component, PlanContext, run_after, run_before
from hpcstack.install.components.wheels import PYPI
from hpcstack.install.plan import (BUILD, FETCH, INSTALL, MODULE, PATCH, PERMISSIONS, SANITYCHECK, STEP_ORDER, VENV,
                                   WHEELS)
from hpcstack.modules.envchange import AppendPath, PrependPath, SetEnv, UnsetEnv
from hpcstack.recipe import Recipe

__all__ = [
    # the recipe
    "Recipe",
    # the components
    "Venv", "PipWheels", "Lock", "PYPI", "SourceBuild", "Patch", "HorovodBuild", "Mpi4pyBuild", "CudaWheelArchs",
    "Imports",
    "StackTools", "Trainer", "StackManifest", "Modulefile", "Validation",
    # a component of the recipe's own: the base, its hooks and what they return
    "Component", "PlanContext", "run_after", "run_before",
    "FETCH", "VENV", "WHEELS", "PATCH", "BUILD", "INSTALL", "SANITYCHECK", "PERMISSIONS", "MODULE", "STEP_ORDER",
    "Run", "WriteFile", "Fetch", "VerifySha256", "Unpack", "Capture",
    "SetEnv", "PrependPath", "AppendPath", "UnsetEnv", "PythonSnippet",
]
