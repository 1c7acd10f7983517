"""mpi4py built from its sdist against the site's MPI: :class:`Mpi4pyBuild`, a small
specialisation of the generic :class:`hpcstack.install.components.source.SourceBuild` that every
recipe with mpi4py shares (``recipes/mpi4py``, and any stack that adds mpi4py to its own packages).
"""

from __future__ import annotations

import os

from hpcstack.install.actions import Run
from hpcstack.install.components.base import PlanContext, run_after
from hpcstack.install.components.source import SourceBuild
from hpcstack.install.plan import INSTALL


class Mpi4pyBuild(SourceBuild):
    """mpi4py compiled with the site's MPI compiler wrapper.

    What it adds to :class:`~hpcstack.install.components.source.SourceBuild`:

    - ``MPICC`` is the site's wrapper (``toolchain.cc`` of the site config), the variable
      mpi4py's build reads (mpi4py docs, "Installation": "Using pip" with ``MPICC``);
    - the wrapper's ``-show`` and version (the MPI library it compiles and links against) enter
      the build-cache key, so a stack on another MPI never reuses this build;
    - after the install, ``<site-packages>/mpi4py/mpi.cfg`` names the wrapper the build found on
      ``PATH``: mpi4py >= 4 reads its build's MPI from an ``mpi.cfg`` that downstream packagers
      provide (``mpi4py.get_config``'s docstring), and a sanity check can compare it.

    A recipe gives it the sdist like any SourceBuild (``Mpi4pyBuild("mpi4py", "4.1.2", url=...,
    sha256=...)``) and may subclass it for a sanity check of its own (``sanity_actions``), as
    ``recipes/mpi4py/4.1.2.py`` does.
    """

    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        """SourceBuild's build environment with ``MPICC`` set to the site's wrapper."""
        return {**super().build_env(ctx), "MPICC": ctx.site.toolchain.cc}

    def key_probes(self, ctx: PlanContext) -> tuple[tuple[str, str], ...]:
        """SourceBuild's key probes plus ``MPI``: what the wrapper says it runs (``-show``) and its
        version (Open MPI's ``--showme:version``, else ``-v`` as MPICH's wrappers take)."""
        cc = ctx.site.toolchain.cc
        return (*super().key_probes(ctx), ("MPI", f"{cc} -show 2>&1; {cc} --showme:version 2>&1 || {cc} -v 2>&1"))

    @run_after(INSTALL)
    def record_mpi_cfg(self, ctx: PlanContext) -> list[Run]:
        """Write ``mpi4py/mpi.cfg`` (``[mpi]`` / ``mpicc = <the wrapper's path on PATH>``)."""
        cfg = os.path.join(ctx.site_packages, "mpi4py", "mpi.cfg")
        return [Run(("bash", "-c", 'printf "[mpi]\\nmpicc = %s\\n" "$(command -v "$1")" > "$2"', "mpi.cfg",
                     ctx.site.toolchain.cc, cfg))]
