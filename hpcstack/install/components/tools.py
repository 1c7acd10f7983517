"""The ``StackTools`` component: the stack's own ``bin/`` (extend-venv-activate, a ``pip`` that says
where packages go) and the examples installed with the stack."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcstack import data_root
from hpcstack.install.actions import Run, WriteFile
from hpcstack.install.plan import INSTALL, SANITYCHECK
from hpcstack.install.components.base import Component, PlanContext


#: The template of ``<prefix>/bin/pip`` (and ``pip3``, ``pip3.X``).
PIP_TEMPLATE = "templates/stack-pip.sh.j2"


def pip_names(python_version: str) -> tuple[str, ...]:
    """The names a user types for pip: ``pip``, ``pip3``, ``pip3.X``."""
    return ("pip", "pip3", f"pip{python_version}")


@dataclass(frozen=True)
class StackTools(Component):
    """Install the stack's tools into ``<prefix>/bin`` and its examples into ``<prefix>/examples``.

    - ``extend-venv-activate``, rendered for this stack's module and the site's module tool (see
      :func:`hpcstack.modules.activate.render_extend_venv_activate`); the sanity check runs its
      ``--help``;
    - ``pip`` (and ``pip3``, ``pip3.X`` links to it): one line on stderr saying where packages go, exit status 1
      (``templates/stack-pip.sh.j2``). The stack is read-only and the module hides the user site
      (``PYTHONNOUSERSITE=1``), so neither ``pip install`` nor ``pip install --user`` on top of
      the module could give an importable package; a venv extended with ``extend-venv-activate``
      can. Without this, ``pip`` is the operating system's (``/usr/bin/pip``). A venv whose own
      ``pip`` is on PATH first never sees it. With the site's ``installer.backend: pip`` the
      stack's venv has a pip of its own; its ``bin/pip*`` scripts are removed (``python -m pip``
      stays for the sanity check);
    - the stack's venv offers no Jupyter kernelspec of its own (ipykernel's data files name the
      build's path): ``hpcstack kernel install`` writes the stack's kernels;
    - ``examples``: directories of hpcstack's ``examples/`` copied to ``<prefix>/examples/<name>``.

    The PyTorch training program of the validation is a component of its own
    (:class:`hpcstack.install.components.trainer.Trainer`).

    Args:
        examples (tuple[str, ...]): names of directories under ``examples/`` in hpcstack's data
            (e.g. ``("digits",)``); default none.

    Example:
        ``StackTools(examples=("digits",))``
    """

    examples: tuple = ()

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        from hpcstack.modules.activate import render_extend_venv_activate
        from hpcstack.templates import render

        extend = os.path.join(ctx.bin_dir, "extend-venv-activate")
        full_name = ctx.recipe.full_name
        pip_text = render(PIP_TEMPLATE, module=full_name, fence=f"# >>> hpcstack {full_name} >>>")
        install = [
            WriteFile(extend, render_extend_venv_activate(
                full_name, dict(ctx.site.modules.init), ctx.python), 0o755),
            WriteFile(os.path.join(ctx.bin_dir, "pip"), pip_text, 0o755),
            *(Run(("ln", "-sfn", "pip", os.path.join(ctx.bin_dir, name)))
              for name in pip_names(ctx.python_version)[1:]),
            Run(("rm", "-rf", os.path.join(ctx.venv, "share", "jupyter", "kernels"))),
        ]
        if ctx.site.installer.backend == "pip":
            install.append(Run(("rm", "-f", *(os.path.join(ctx.venv, "bin", n)
                                              for n in pip_names(ctx.python_version)))))
        for name in self.examples:
            source = data_root() / "examples" / name
            files = tuple(sorted(str(p) for p in source.rglob("*") if p.is_file() and "__pycache__" not in p.parts))
            target = os.path.join(ctx.build_prefix, "examples", name)
            install += [Run(("rm", "-rf", target)), Run(("mkdir", "-p", os.path.dirname(target))),
                        Run(("cp", "-r", str(source), target), input_files=files)]
        return {INSTALL: install, SANITYCHECK: [Run((extend, "--help"))]}
