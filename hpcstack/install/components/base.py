"""What every component sees: the resolved paths of one install (:class:`PlanContext`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path


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
        depends_on (tuple[str, ...]): the exact names of the hierarchy, base and runtime modules the build
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
