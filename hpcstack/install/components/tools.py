"""The ``StackTools`` component: the stack's own ``bin/``: extend-venv-activate and the trainer."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcstack import data_root
from hpcstack.install.plan import INSTALL, SANITYCHECK, Run, WriteFile
from hpcstack.install.components.base import PlanContext

TRAINER = "hpcstack-train-benchmark"


@dataclass(frozen=True)
class StackTools:
    """Install ``<prefix>/bin/extend-venv-activate`` and ``<prefix>/bin/hpcstack-train-benchmark``.

    ``extend-venv-activate`` is rendered for this stack's module and the site's module tool (see
    :func:`hpcstack.activate.render_extend_venv_activate`); the training program is the one
    ``hpcstack validate`` runs (``scripts/hpcstack-train-benchmark.py``). Both run with the stack's
    python (the trainer through ``python3`` on PATH, i.e. under the module). The sanity check runs
    ``extend-venv-activate --help``.

    Example:
        ``StackTools()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        from hpcstack.modules.activate import render_extend_venv_activate

        extend = os.path.join(ctx.bin_dir, "extend-venv-activate")
        trainer = str(data_root() / "scripts" / f"{TRAINER}.py")
        return {
            INSTALL: [
                WriteFile(extend, render_extend_venv_activate(
                    ctx.recipe.full_name, dict(ctx.site.modules.init), ctx.python), 0o755),
                # a copy (its shebang is `env python3`: the stack's python once the module is loaded);
                # its content is an input of the step, so an edited trainer redoes the install step
                Run(("install", "-m", "0755", trainer, os.path.join(ctx.bin_dir, TRAINER)),
                    input_files=(trainer,)),
            ],
            SANITYCHECK: [Run((extend, "--help"))],
        }
