"""The component contract: what every component sees (:class:`PlanContext`), the base class of
the components with its declared hooks (:class:`Component`), and the step hooks
(:func:`run_after`, :func:`run_before`) a component hangs extra actions on, in the manner of
Spack's ``@run_after("install")`` and ReFrame's ``@run_before("run")``.

Recipes import all of this from the façade, :mod:`hpcstack.recipe_api`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar

from hpcstack.install.plan import STEP_ORDER


@dataclass(frozen=True)
class PlanContext:
    """The resolved paths and settings of one install; components read it, never the raw config.

    Two paths name the stack: ``prefix``, the stable path users see (a symbolic link to the
    published build), and ``stage_prefix``, the real directory this build is made in. A venv
    cannot be moved once made, so everything the build steps write goes to the stage prefix
    (:attr:`build_prefix`, and :attr:`venv`, :attr:`python`, :attr:`bin_dir`,
    :attr:`site_packages` under it); the module step sees :meth:`published`, where those same
    properties name the stable path, so the modulefile never names one build.

    Attributes:
        site (hpcstack.site.Site): the validated site.
        recipe (hpcstack.recipe.Recipe): the recipe being installed.
        prefix (str): the stack's prefix, ``<install_root>/<name>/<version>``.
        stage_dir (str): scratch directory for sources and builds of this stack.
        cache_dir (str): download cache shared by the site's installs.
        python_version (str): ``X.Y`` of the base module's Python.
        jobs (int): parallel build jobs.
        modulefile (str): where the modulefile goes.
        stage_prefix (str): the build's real directory, ``<install_root>/<name>/.<version>-<id>``;
            ``""`` means the prefix itself.
        depends_on (tuple[str, ...]): the exact names of the profiles, hierarchy, base and runtime modules the build
            environment loaded (``python/3.11`` for a site's ``python``), which the modulefile
            ``depends-on``; empty: the site's names as they are (a dry-run that loads nothing).
    """

    site: object
    recipe: object
    prefix: str
    stage_dir: str
    cache_dir: str
    python_version: str
    jobs: int
    modulefile: str
    stage_prefix: str = ""
    depends_on: tuple = ()

    @property
    def toolchain(self):
        """The site's compilers, CUDA and NCCL (:class:`hpcstack.site.Toolchain`): the machine
        facts a component builds against; components read these, not the site's sections."""
        return self.site.toolchain

    @property
    def build_prefix(self) -> str:
        """Where this build's files go: the stage prefix (the prefix itself when none)."""
        return self.stage_prefix or self.prefix

    def published(self) -> "PlanContext":
        """This context as users see the stack: every path under the stable prefix."""
        return replace(self, stage_prefix="")

    @property
    def venv(self) -> str:
        """The stack's venv, ``<build prefix>/venv``."""
        return os.path.join(self.build_prefix, "venv")

    @property
    def python(self) -> str:
        """The venv's interpreter."""
        return os.path.join(self.venv, "bin", "python")

    @property
    def bin_dir(self) -> str:
        """The stack's own tools (``extend-venv-activate``, the training program): ``<build prefix>/bin``."""
        return os.path.join(self.build_prefix, "bin")

    @property
    def site_packages(self) -> str:
        """The venv's site-packages."""
        return os.path.join(self.venv, "lib", f"python{self.python_version}", "site-packages")

    def recipe_file(self, name: str) -> Path:
        """A file next to the recipe (a lock file, a patch under ``patches/``)."""
        return Path(self.recipe.directory) / name

    def pip(self, *args: str) -> tuple[str, ...]:
        """``<venv python> -m pip --isolated <args>``: ignores the user's pip config and PIP_* vars."""
        return (self.python, "-m", "pip", "--isolated", "--no-input", "--disable-pip-version-check", *args)


# ------------------------------------------------------------------------------ the component base

#: The attribute a step hook's function carries: ``(when, step)``, ``when`` ``"before"`` or ``"after"``.
_STEP_HOOK = "_hpcstack_step_hook"


def _step_hook(when: str, step: str) -> Callable:
    if step not in STEP_ORDER:
        raise ValueError(f"run_{when}({step!r}): no such step (steps: {', '.join(STEP_ORDER)})")

    def mark(function: Callable) -> Callable:
        setattr(function, _STEP_HOOK, (when, step))
        return function
    return mark


def run_after(step: str) -> Callable:
    """Method decorator: the method's actions run in ``step`` after the component's own.

    The method takes the :class:`PlanContext` and returns a list of actions
    (:class:`hpcstack.install.actions.Run`, :class:`~hpcstack.install.actions.WriteFile`, ...);
    they join the plan (and the dry run) after what :meth:`Component.contribute` gives ``step``.
    A subclass inherits its base's hooks; redefining the method under the same name replaces it
    (without the decorator: removes it). Modelled on Spack's ``@run_after("install")``.

    Args:
        step (str): a step name of :data:`hpcstack.install.plan.STEP_ORDER` (``INSTALL``, ...).

    Raises:
        ValueError: ``step`` is not a step name (when the class is defined).

    Example::

        class Mpi4pyBuild(SourceBuild):
            @run_after(INSTALL)
            def record_mpi_cfg(self, ctx):
                return [Run(("bash", "-c", "...", ctx.site_packages))]
    """
    return _step_hook("after", step)


def run_before(step: str) -> Callable:
    """Method decorator: the method's actions run in ``step`` before the component's own (as
    :func:`run_after`, otherwise).

    Args:
        step (str): a step name of :data:`hpcstack.install.plan.STEP_ORDER`.

    Raises:
        ValueError: ``step`` is not a step name.
    """
    return _step_hook("before", step)


class Component:
    """Base class of the recipe components (:mod:`hpcstack.install.components`).

    A component is one line of a recipe (``PipWheels(...)``, ``Modulefile()``): usually a frozen
    dataclass of its settings, whose methods turn the settings and the install's
    :class:`PlanContext` into actions of the standard steps. The hooks below are all a component
    may define; each has a default, so a component defines only those it needs:

    - :meth:`contribute` (``ctx -> {step: [action, ...]}``): its actions per step;
    - :meth:`module_environment` (``ctx -> [EnvChange, ...]``): variables the stack's
      modulefile sets (:class:`~hpcstack.modules.envchange.SetEnv`, ``PrependPath`` ...);
    - :meth:`module_help` (``ctx -> [str, ...]``): lines of ``module help``;
    - :attr:`examples`: names of the ``examples/`` directories it installs under
      ``<prefix>/examples`` (``module help`` names them);
    - step hooks: methods decorated with :func:`run_after` / :func:`run_before`, whose actions
      join a step after / before the component's own.

    The plan (:func:`hpcstack.install.resolve.resolve`) asks each component for
    :meth:`actions` (``contribute`` plus the step hooks). An object that is not a Component
    but has a ``contribute(ctx)`` method is still a component (the protocol it follows);
    :func:`hook` gives its hooks with these defaults.

    Example::

        @dataclass(frozen=True)
        class Motd(Component):
            text: str

            def contribute(self, ctx):
                return {INSTALL: [WriteFile(os.path.join(ctx.build_prefix, "motd"), self.text)]}
    """

    #: Names of directories of hpcstack's ``examples/`` the component installs under
    #: ``<prefix>/examples`` (:class:`~hpcstack.install.components.tools.StackTools`); default none.
    examples: ClassVar[tuple[str, ...]] = ()
    #: The step hooks of the class, ``(when, step, method name)`` in definition order, base
    #: classes first (set for every subclass by ``__init_subclass__``).
    step_hooks: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            names += [n for n in vars(klass) if n not in names]
        cls.step_hooks = tuple((*getattr(getattr(cls, n), _STEP_HOOK), n) for n in names
                               if callable(getattr(cls, n, None)) and hasattr(getattr(cls, n), _STEP_HOOK))

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return the component's actions per step, ``{step name: [action, ...]}`` (step names of
        :data:`hpcstack.install.plan.STEP_ORDER`). Default: none.

        Args:
            ctx (PlanContext): the install. The module step's actions are asked for again with
                :meth:`PlanContext.published` (the stable prefix users see).

        Raises:
            ValueError: a value of the site or recipe the component cannot use (the plan makes it
                one line naming the component).
        """
        return {}

    def module_environment(self, ctx: PlanContext) -> tuple:
        """Return the environment changes the stack's modulefile makes for this component, in
        order (:mod:`hpcstack.modules.envchange`: ``SetEnv``, ``PrependPath``, ``AppendPath``,
        ``UnsetEnv``); the :class:`~hpcstack.install.components.modulefile.Modulefile` component
        writes them after the stack's own ``PATH`` and ``PYTHONPATH``. Default: none.

        Args:
            ctx (PlanContext): the install as users see it (stable prefix).
        """
        return ()

    def module_help(self, ctx: PlanContext) -> list[str]:
        """Return lines the stack's ``module help`` shows for this component (after the stack's
        general text). Default: none.

        Args:
            ctx (PlanContext): the install as users see it (stable prefix).
        """
        return []

    def actions(self, ctx: PlanContext) -> dict[str, list]:
        """What the plan takes from the component: :meth:`contribute`, with the actions of each
        step hook before (:func:`run_before`) or after (:func:`run_after`) those of its step.
        Not a hook: a component defines ``contribute`` and its step hooks, not this.

        Raises:
            ValueError: a step hook returned something that is not a list (it is named).
        """
        steps = self.contribute(ctx)
        if not self.step_hooks or not isinstance(steps, dict):
            return steps
        steps = dict(steps)
        for when, step, name in self.step_hooks:
            added = getattr(self, name)(ctx)
            if not isinstance(added, list):
                raise ValueError(f"step hook {name}(ctx) returned {type(added).__name__}, not a list of actions")
            own = list(steps.get(step, []))
            steps[step] = [*added, *own] if when == "before" else [*own, *added]
        return steps


#: The hooks :func:`hook` gives, by name.
HOOKS = ("actions", "contribute", "module_environment", "module_help")


def hook(component: object, name: str) -> Callable:
    """The hook ``name`` of a recipe's component, bound to it: the component's own method, else
    the :class:`Component` default. A :class:`Component` has every hook; an object that only
    follows the protocol (a ``contribute(ctx)`` method) may lack some, and its ``actions`` is
    its ``contribute``.

    Args:
        component (object): a component of a recipe.
        name (str): one of :data:`HOOKS`.

    Raises:
        KeyError: ``name`` is not a hook.
    """
    if name not in HOOKS:
        raise KeyError(f"{name}: not a component hook (hooks: {', '.join(HOOKS)})")
    if isinstance(component, Component):
        return getattr(component, name)
    if name == "actions":
        name = "contribute"
    own = getattr(component, name, None)
    return own if callable(own) else getattr(Component(), name)


def examples_of(component: object) -> tuple[str, ...]:
    """The ``examples`` a recipe's component installs (:attr:`Component.examples`); ``()`` for
    an object that only follows the protocol and has none."""
    return tuple(getattr(component, "examples", ()) or ())
