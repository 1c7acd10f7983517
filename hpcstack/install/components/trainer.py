"""The ``Trainer`` component: the PyTorch training program ``hpcstack validate`` runs, in the stack's ``bin/``."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpcstack import data_root
from hpcstack.install.components.base import Component, PlanContext
from hpcstack.install.components.sanity import PythonCheck, PythonSnippet
from hpcstack.install.actions import Run
from hpcstack.install.plan import INSTALL, SANITYCHECK

#: The program's name in ``<prefix>/bin``.
TRAINER = "hpcstack-train-benchmark"
#: The program's package (hpcstack's data ``trainer/hpcstack_train/``), installed as
#: ``<prefix>/lib/hpcstack-train/hpcstack_train/``.
PACKAGE = "hpcstack_train"
#: Where the package goes, relative to the prefix: the entry script finds it there.
LIBRARY_DIR = os.path.join("lib", "hpcstack-train")


def trainer_sources() -> tuple[Path, tuple[Path, ...]]:
    """Return the trainer's entry script and its package's modules in hpcstack's data.

    Returns:
        tuple[Path, tuple[Path, ...]]: ``trainer/hpcstack-train-benchmark`` and the ``*.py``
        files of ``trainer/hpcstack_train/``, sorted by name (the package is flat: no
        subpackages; bytecode caches are left out).
    """
    root = data_root() / "trainer"
    return root / TRAINER, tuple(sorted((root / PACKAGE).glob("*.py")))


@dataclass(frozen=True)
class Trainer(Component):
    """Install ``<prefix>/bin/hpcstack-train-benchmark``, the PyTorch training program of the
    validation (the package ``trainer/hpcstack_train``: synthetic ResNet and digits workloads,
    ``ddp`` and ``horovod`` backends, the collectives check).

    The package's modules are copied to ``<prefix>/lib/hpcstack-train/hpcstack_train/``, and its
    entry script (``trainer/hpcstack-train-benchmark``) to ``<prefix>/bin``; the script finds the
    package relative to itself, writes no bytecode, and its shebang is ``env python3``, the
    stack's python once the module is loaded. The package imports torch (horovod only for
    ``--backend horovod``) and nothing of hpcstack. The content of every file (sorted by name) is
    an input of the install step, so an edited trainer redoes that step. The sanity check
    compiles every installed file and imports the installed package with the stack's python, in
    the recipe's one interpreter (:class:`PythonCheck`; nothing is written, no ``__pycache__``).

    A recipe whose stack has PyTorch and whose validation trains adds it; other stacks go without.

    Example:
        ``Trainer()``
    """

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        entry, modules = trainer_sources()
        target = os.path.join(ctx.bin_dir, TRAINER)
        library = os.path.join(ctx.build_prefix, LIBRARY_DIR)
        package = os.path.join(library, PACKAGE)
        check = PythonSnippet("trainer", f"import glob\n"
                                         f"paths = [{json.dumps(target)}, *sorted(glob.glob({json.dumps(package + '/*.py')}))]\n"
                                         "for path in paths:\n"
                                         "    with open(path) as f:\n"
                                         '        compile(f.read(), path, "exec")\n'
                                         "sys.dont_write_bytecode, written = True, sys.dont_write_bytecode\n"
                                         f"sys.path.insert(0, {json.dumps(library)})\n"
                                         "try:\n"
                                         f"    import {PACKAGE}.cli\n"
                                         "finally:\n"
                                         "    sys.path.pop(0)\n"
                                         "    sys.dont_write_bytecode = written\n"
                                         f'print("compiles:", len(paths), "files; imports:", {PACKAGE}.cli.__name__)')
        sources = tuple(str(m) for m in modules)
        return {
            INSTALL: [Run(("rm", "-rf", library)),
                      Run(("install", "-d", "-m", "0755", package)),
                      Run(("install", "-m", "0644", *sources, package), input_files=sources),
                      Run(("install", "-D", "-m", "0755", str(entry), target), input_files=(str(entry),))],
            SANITYCHECK: [PythonCheck(ctx.python, ("torch",), checks=(check,))],
        }
