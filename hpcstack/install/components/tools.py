"""The ``StackTools`` component: the stack's own ``bin/extend-venv-activate``."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcstack.install.plan import INSTALL, SANITYCHECK, Run, WriteFile
from hpcstack.install.components.base import PlanContext


@dataclass(frozen=True)
class StackTools:
    """Install ``<prefix>/bin/extend-venv-activate``, which every stack has.

    It is rendered for this stack's module and the site's module tool (see
    :func:`hpcstack.modules.activate.render_extend_venv_activate`) and runs with the stack's
    python. The sanity check runs ``extend-venv-activate --help``. The PyTorch training program
    of the validation is a component of its own (:class:`hpcstack.install.components.trainer.Trainer`).

    Example:
        ``StackTools()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        from hpcstack.modules.activate import render_extend_venv_activate

        extend = os.path.join(ctx.bin_dir, "extend-venv-activate")
        return {
            INSTALL: [
                WriteFile(extend, render_extend_venv_activate(
                    ctx.recipe.full_name, dict(ctx.site.modules.init), ctx.python), 0o755),
            ],
            SANITYCHECK: [Run((extend, "--help"))],
        }
