"""The ``Imports`` component and the one-process sanity check (:class:`PythonCheck`).

Importing torch costs about 1.5 s of CPU, and a check such as ``horovodrun --check-build`` forks
about 13 processes that each import it again (6 s on 2 cores). The sanity check therefore runs
every Python check of a recipe in one interpreter: each component contributes a
:class:`PythonCheck` with its imports and its own checks (:class:`PythonSnippet`: Horovod its
build flags, :class:`hpcstack.install.components.horovod.HorovodBuild`), and the plan merges
them into one action (:func:`merge_python_checks`). This module names no package.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from dataclasses import dataclass, field, replace
from typing import Callable

from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD
from hpcstack.install.actions import ActionBase, ExecContext, Run
from hpcstack.install.components.base import Component, PlanContext
from hpcstack.install.plan import SANITYCHECK

#: The line that opens a snippet's section of the check's output: ``--- hpcstack check: <name>``.
SECTION = "--- hpcstack check: "


@dataclass(frozen=True)
class PythonSnippet:
    """A check a component adds to the one-interpreter sanity check (:class:`PythonCheck`).

    Args:
        name (str): what it checks, e.g. ``"horovod build flags"``; it opens the snippet's section
            of the output (:data:`SECTION`) and names it in failures.
        code (str): Python statements, run after every import of the check in a function of their
            own (``os`` and ``sys`` are imported); ``sys.exit("reason")`` fails the check with
            that reason.
        verify (Callable[[str], list[str]] | None): called by hpcstack with the section's output
            once the interpreter passed; returns one line per problem (empty: passed). It checks
            the printed report again, failing closed (a report that does not parse fails).
            Default None: nothing more.
        record (str): a file name under the build's ``.hpcstack`` directory where the section's
            output is kept (provenance), e.g. ``"check-build.txt"``; default ``""``: none.
        start (str): a regular expression: the report is the section's output from the last line
            it matches on (what the snippet's own imports printed before is not the report); what
            ``verify`` sees and ``record`` keeps. Default ``""``: the whole section.

    Example:
        ``PythonSnippet("mpi library", "from mpi4py import MPI; print(MPI.Get_library_version())")``
    """

    name: str
    code: str
    verify: Callable[[str], list[str]] | None = None
    record: str = ""
    start: str = ""

    def report(self, section: str) -> str:
        """The report in the section's output: from the last line matching :attr:`start` on."""
        starts = [m.start() for m in re.finditer(self.start, section, re.M)] if self.start else []
        return section[starts[-1]:] if starts else section


@dataclass(frozen=True)
class PythonCheck(ActionBase):
    """Import modules and run the components' checks in one run of the stack's python (an action).

    Both renderings run the same program (``python -c PROGRAM``): it imports every module of
    ``imports``, prints ``imports ok: …``, then runs each snippet of ``checks`` after a line
    ``--- hpcstack check: <name>``. When everything passed it ends with ``os._exit(0)``, skipping
    the interpreter's teardown (0.7-0.9 s for the PyTorch stack). :meth:`execute` then hands each
    snippet's section of the output to its ``verify`` and keeps it as its ``record`` file in the
    build's ``.hpcstack`` (provenance).

    Args:
        python (str): the stack's interpreter.
        imports (tuple[str, ...]): importable names, in order.
        checks (tuple[PythonSnippet, ...]): the components' checks, in order.
        prepend (dict[str, str]): path-like variables to prepend to (the CUDA stubs of a GPU
            site on a login node), as for :class:`Run`.
        background (bool): run it in the background while the step's other actions run
            (:func:`hpcstack.install.runner.run_actions`; the plan sets it for the merged check);
            the step still fails if it fails.

    Raises:
        HpcstackError: an import fails, a snippet fails or its ``verify`` names a problem.
    """

    python: str
    imports: tuple[str, ...] = ()
    checks: tuple[PythonSnippet, ...] = ()
    prepend: dict[str, str] = field(default_factory=dict)
    background: bool = False

    def program(self) -> str:
        """The Python program this check runs."""
        lines = ["import os, sys"]
        lines += [f"import {m}" for m in self.imports]
        # string literals in double quotes (json): the bash rendering quotes the program in single ones
        lines.append(f"print({json.dumps('imports ok: ' + ', '.join(self.imports))})")
        for index, check in enumerate(self.checks):
            function = f"_hpcstack_check_{index}"
            lines.append(f"def {function}():")
            lines.append(textwrap.indent(textwrap.dedent(check.code).strip("\n"), "    "))
            lines.append(f"print({json.dumps(SECTION + check.name)}); {function}()")
        # passed: leave without the interpreter's teardown, which unloads torch and the rest
        # module by module (0.7-0.9 s of a 3 s check on 2 cores); output flushed first
        lines.append("sys.stdout.flush(); sys.stderr.flush(); os._exit(0)")
        return "\n".join(lines)

    def _run(self) -> Run:
        return Run((self.python, "-c", self.program()), prepend=self.prepend)

    def commands(self) -> tuple[Run, ...]:
        return (self._run(),)

    def to_bash(self) -> str:
        return self._run().to_bash()

    def merged(self, other: "PythonCheck") -> "PythonCheck":
        """This check and ``other`` as one (same python): imports of both, in order, without
        repeats; the snippets of both (one of each name and code); the prepended paths of both,
        this one's first.

        Raises:
            ValueError: the two checks name different interpreters.
        """
        if other.python != self.python:
            raise ValueError(f"cannot merge checks of {self.python} and {other.python}")
        checks = list(self.checks)
        seen = {(c.name, c.code) for c in checks}
        checks += [c for c in other.checks if (c.name, c.code) not in seen]
        prepend = dict(self.prepend)
        for name, value in other.prepend.items():
            parts = [p for p in prepend.get(name, "").split(":") if p]
            parts += [p for p in value.split(":") if p and p not in parts]
            prepend[name] = ":".join(parts)
        return replace(self, imports=tuple(dict.fromkeys((*self.imports, *other.imports))),
                       checks=tuple(checks), prepend=prepend)

    def sections(self, output: str) -> dict[str, str]:
        """The output of each snippet, by name: what follows its :data:`SECTION` line up to the
        next one (what an import printed before comes first and belongs to none)."""
        found: dict[str, str] = {}
        name, lines = None, []
        for line in output.splitlines(keepends=True):
            if line.startswith(SECTION):
                if name is not None:
                    found[name] = "".join(lines)
                name, lines = line[len(SECTION):].rstrip("\n"), []
            elif name is not None:
                lines.append(line)
        if name is not None:
            found[name] = "".join(lines)
        return found

    def execute(self, ctx: ExecContext) -> None:
        from hpcstack.fsutil import write_atomic
        from hpcstack.install.actions import describe_os_error

        run = self._run()
        env = run.command_env(ctx.env)
        ctx.log.write(f"$ {self.to_bash()}\n")
        ctx.log.flush()
        try:
            proc = subprocess.run(list(run.argv), env=env, capture_output=True, text=True, cwd=CHILD_CWD,
                                  stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise HpcstackError(f"cannot run {self.python}: {describe_os_error(exc)}") from None
        ctx.log.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise HpcstackError(f"sanity check in {self.python}: {last}")
        sections = self.sections(proc.stdout)
        reports = {}
        for check in self.checks:
            if check.name not in sections:
                raise HpcstackError(f"sanity check in {self.python}: {check.name} printed no report")
            reports[check.name] = check.report(sections[check.name])
            problems = check.verify(reports[check.name]) if check.verify else []
            if problems:
                raise HpcstackError(f"{check.name}: {problems[0]}")
        state_dir = getattr(ctx, "state_dir", None)
        if state_dir is not None:  # provenance: what each check reported
            for check in self.checks:
                if check.record:
                    write_atomic(os.path.join(state_dir, check.record), reports[check.name])


def merge_python_checks(actions: list) -> list:
    """Return ``actions`` with every :class:`PythonCheck` of the same python merged into one
    (one interpreter start, one ``import torch``) that runs first and in the background, while
    the step's other actions (``uv pip check``, the tools' ``--help``, ``uv pip freeze``) run;
    other actions keep their order.

    Args:
        actions (list): the actions of the sanity check step.
    """
    out: list = []
    first: dict[str, int] = {}
    for action in actions:
        if isinstance(action, PythonCheck):
            if action.python in first:
                index = first[action.python]
                out[index] = out[index].merged(action)
                continue
            first[action.python] = len(out)
        out.append(action)
    checks = [replace(a, background=True) for a in out if isinstance(a, PythonCheck)]
    return checks + [a for a in out if not isinstance(a, PythonCheck)]


@dataclass(frozen=True)
class Imports(Component):
    """Import each module with the stack's python, in one interpreter (sanity check).

    The plan merges it with the recipe's other Python checks (those of its components) into one
    interpreter run (:func:`merge_python_checks`).

    Args:
        modules (tuple[str, ...]): importable names, e.g. ``("torch", "horovod.torch")``.
        checks (tuple[PythonSnippet, ...]): the recipe's own checks, run after the imports in the
            same interpreter; default none.

    Example:
        ``Imports(("torch", "torchvision"))``;
        ``Imports(("mpi4py.MPI",), checks=(PythonSnippet("MPI library", "from mpi4py import MPI\n"
        "print(MPI.Get_library_version())"),))``
    """

    modules: tuple[str, ...]
    checks: tuple[PythonSnippet, ...] = ()

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        stubs = ctx.toolchain.cuda_stubs
        prepend = {"LD_LIBRARY_PATH": stubs} if stubs else {}
        return {SANITYCHECK: [PythonCheck(ctx.python, tuple(self.modules), checks=tuple(self.checks),
                                          prepend=prepend)]}

