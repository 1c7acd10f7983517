"""What every component sees: the resolved paths of one install (:class:`PlanContext`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PlanContext:
    """The resolved paths and settings of one install; components read it, never the raw config.

    Attributes:
        site (hpcstack.site.Site): the validated site.
        recipe (hpcstack.recipe.Recipe): the recipe being installed.
        prefix (str): the stack's prefix, ``<install_root>/<name>/<version>``.
        stage_dir (str): scratch directory for sources and builds of this stack.
        cache_dir (str): download cache shared by the site's installs.
        python_version (str): ``X.Y`` of the base module's Python.
        jobs (int): parallel build jobs.
        modulefile (str): where the modulefile goes.
    """

    site: object
    recipe: object
    prefix: str
    stage_dir: str
    cache_dir: str
    python_version: str
    jobs: int
    modulefile: str

    @property
    def venv(self) -> str:
        """The stack's venv, ``<prefix>/venv``."""
        return os.path.join(self.prefix, "venv")

    @property
    def python(self) -> str:
        """The venv's interpreter."""
        return os.path.join(self.venv, "bin", "python")

    @property
    def bin_dir(self) -> str:
        """The stack's own tools (``extend-venv-activate``, the training program): ``<prefix>/bin``."""
        return os.path.join(self.prefix, "bin")

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
