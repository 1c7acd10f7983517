"""The ``Trainer`` component: the PyTorch training program ``hpcstack validate`` runs, in the stack's ``bin/``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from hpcstack import data_root
from hpcstack.install.components.base import PlanContext
from hpcstack.install.components.sanity import PythonCheck, PythonSnippet
from hpcstack.install.plan import INSTALL, SANITYCHECK, Run

#: The program's name in ``<prefix>/bin``.
TRAINER = "hpcstack-train-benchmark"


@dataclass(frozen=True)
class Trainer:
    """Install ``<prefix>/bin/hpcstack-train-benchmark``, the PyTorch training program of the
    validation (``scripts/hpcstack-train-benchmark.py``: synthetic ResNet and digits workloads,
    ``ddp`` and ``horovod`` backends, the collectives check).

    A copy: its shebang is ``env python3``, the stack's python once the module is loaded. Its
    content is an input of the install step, so an edited trainer redoes that step. The sanity
    check imports torch and compiles the installed copy with the stack's python, in the recipe's
    one interpreter (:class:`PythonCheck`; nothing is written, no ``__pycache__``).

    A recipe whose stack has PyTorch and whose validation trains adds it; other stacks go without.

    Example:
        ``Trainer()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        source = str(data_root() / "scripts" / f"{TRAINER}.py")
        target = os.path.join(ctx.bin_dir, TRAINER)
        check = PythonSnippet("trainer", f"path = {json.dumps(target)}\n"
                                         "with open(path) as f:\n"
                                         '    compile(f.read(), path, "exec")\n'
                                         'print("compiles:", path)')
        return {
            INSTALL: [Run(("install", "-m", "0755", source, target), input_files=(source,))],
            SANITYCHECK: [PythonCheck(ctx.python, ("torch",), checks=(check,))],
        }
