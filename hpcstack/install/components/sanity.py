"""The ``Imports`` component and the one-process sanity check (:class:`PythonCheck`, issue 14).

Importing torch costs about 1.5 s of CPU; ``horovodrun --check-build`` forks about 13 processes
that each import it again (6 s on 2 cores). The sanity check therefore runs every Python check
of a recipe in one interpreter: the ``Imports`` of the recipe and Horovod's build flags (read
from ``horovod.torch``'s ``mpi_built()``, ``gloo_built()``, ``nccl_built()``, … — the functions
``horovodrun --check-build`` calls) are one :class:`PythonCheck` each, and the plan merges them
into one action (:func:`merge_python_checks`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field, replace

from hpcstack.errors import HpcstackError
from hpcstack.install.actions import ActionBase, ExecContext, Run
from hpcstack.install.components.base import PlanContext
from hpcstack.install.plan import SANITYCHECK

#: The Horovod part of the check's program: the report ``horovodrun --check-build`` prints
#: (Horovod 0.28.1, ``horovod/runner/launch.py`` ``check_build``), made from the same
#: ``*_built()`` functions in this process, then the required flags (``REQUIRED``) with the rules
#: of :func:`hpcstack.validate.checkbuild.missing_flags`. A framework other than PyTorch counts
#: as built when its extension library is there (nothing of it is imported). It also imports
#: ``horovod.runner.launch``, the module ``horovodrun`` runs.
_HOROVOD = '''
import glob, os, horovod, horovod.torch as hvd, horovod.runner.launch
def _ext(fw):
    return bool(glob.glob(os.path.join(os.path.dirname(horovod.__file__), fw, "mpi_lib*.so")))
flags = {"Frameworks": {"TensorFlow": _ext("tensorflow"), "PyTorch": True, "MXNet": _ext("mxnet")},
         "Controllers": {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())},
         "Operations": {"NCCL": bool(hvd.nccl_built()), "DDL": bool(hvd.ddl_built()),
                        "CCL": bool(hvd.ccl_built()), "MPI": bool(hvd.mpi_built()),
                        "Gloo": bool(hvd.gloo_built())}}
headings = {"Frameworks": "Available Frameworks", "Controllers": "Available Controllers",
            "Operations": "Available Tensor Operations"}
print("Horovod v%s:" % horovod.__version__)
for section, names in flags.items():
    print("\\n%s:" % headings[section])
    for name, built in names.items():
        print("    [%s] %s" % ("X" if built else " ", name))
missing = []
for req in REQUIRED:
    section, _, name = req.rpartition(":")
    sections = [section] if section else [s for s in flags if name in flags[s]]
    if not sections:
        missing.append(name)
    missing += ["%s:%s" % (s, name) for s in sections if not flags.get(s, {}).get(name, False)]
if missing:
    sys.exit("horovod build flags: missing " + ", ".join("[X] " + m for m in missing))
'''


@dataclass(frozen=True)
class PythonCheck(ActionBase):
    """Import modules and check Horovod's build flags in one run of the stack's python (an action).

    Both renderings run the same program (``python -c PROGRAM``): it imports every module of
    ``imports``, and with ``horovod`` set, prints the report of ``horovodrun --check-build``
    from ``horovod.torch``'s ``*_built()`` functions and exits non-zero naming each required
    flag that is not ``[X]``. When everything passed it ends with ``os._exit(0)``, skipping the
    interpreter's teardown (0.7-0.9 s for the PyTorch stack; issue 14). :meth:`execute` also parses that report with
    :func:`hpcstack.validate.checkbuild.parse_check_build` and requires the flags again
    (fail closed: a report that does not parse fails the step), and keeps it as
    ``check-build.txt`` in the build's ``.hpcstack`` (provenance).

    Args:
        python (str): the stack's interpreter.
        imports (tuple[str, ...]): importable names, in order.
        horovod (tuple[str, ...] | None): required Horovod flags (``Name`` or ``Section:Name``,
            as for ``hpcstack check-build``); None: no Horovod check.
        prepend (dict[str, str]): path-like variables to prepend to (the CUDA stubs of a GPU
            site on a login node), as for :class:`Run`.
        background (bool): run it in the background while the step's other actions run
            (:func:`hpcstack.install.runner.run_actions`; the plan sets it for the merged check,
            issue 14); the step still fails if it fails.

    Raises:
        HpcstackError: an import fails, a required flag is missing, or the report does not parse.
    """

    python: str
    imports: tuple[str, ...] = ()
    horovod: tuple[str, ...] | None = None
    prepend: dict[str, str] = field(default_factory=dict)
    background: bool = False

    def program(self) -> str:
        """The Python program this check runs."""
        lines = ["import os, sys"]
        lines += [f"import {m}" for m in self.imports]
        if self.horovod is not None:
            lines.append(f"REQUIRED = {json.dumps(list(self.horovod))}")
            lines.append(_HOROVOD.strip("\n"))
        else:
            lines.append(f"print({('imports ok: ' + ', '.join(self.imports))!r})")
        # passed: leave without the interpreter's teardown, which unloads torch and the rest
        # module by module (0.7-0.9 s of a 3 s check on 2 cores, issue 14); output flushed first
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
        repeats; the Horovod flags of both; the prepended paths of both, this one's first.

        Raises:
            ValueError: the two checks name different interpreters.
        """
        if other.python != self.python:
            raise ValueError(f"cannot merge checks of {self.python} and {other.python}")
        horovod = None
        if self.horovod is not None or other.horovod is not None:
            horovod = tuple(dict.fromkeys((*(self.horovod or ()), *(other.horovod or ()))))
        prepend = dict(self.prepend)
        for name, value in other.prepend.items():
            parts = [p for p in prepend.get(name, "").split(":") if p]
            parts += [p for p in value.split(":") if p and p not in parts]
            prepend[name] = ":".join(parts)
        return replace(self, imports=tuple(dict.fromkeys((*self.imports, *other.imports))),
                       horovod=horovod, prepend=prepend)

    def execute(self, ctx: ExecContext) -> None:
        from hpcstack.fsutil import write_atomic
        from hpcstack.install.actions import describe_os_error
        from hpcstack.validate.checkbuild import missing_flags, parse_check_build

        run = self._run()
        env = run.command_env(ctx.env)
        ctx.log.write(f"$ {self.to_bash()}\n")
        ctx.log.flush()
        try:
            proc = subprocess.run(list(run.argv), env=env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise HpcstackError(f"cannot run {self.python}: {describe_os_error(exc)}") from None
        ctx.log.write(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            raise HpcstackError(f"sanity check in {self.python}: {last}")
        if self.horovod is None:
            return
        # the report starts at its "Horovod vX.Y.Z:" line; what an import printed before it is not ours
        starts = [m.start() for m in re.finditer(r"^Horovod v", proc.stdout, re.M)]
        report = proc.stdout[starts[-1]:] if starts else proc.stdout
        missing = missing_flags(parse_check_build(report), self.horovod)
        if missing:
            raise HpcstackError("horovod build flags: missing " + ", ".join(f"[X] {m}" for m in missing))
        state_dir = getattr(ctx, "state_dir", None)
        if state_dir is not None:  # provenance: the stack records what its Horovod was built with
            write_atomic(os.path.join(state_dir, "check-build.txt"), report)


def merge_python_checks(actions: list) -> list:
    """Return ``actions`` with every :class:`PythonCheck` of the same python merged into one
    (one interpreter start, one ``import torch``) that runs first and in the background, while
    the step's other actions (``uv pip check``, the tools' ``--help``, ``uv pip freeze``) run
    (issue 14); other actions keep their order.

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
class Imports:
    """Import each module with the stack's python, in one interpreter (sanity check).

    The plan merges it with the recipe's other Python checks (Horovod's build flags) into one
    interpreter run (:func:`merge_python_checks`).

    Args:
        modules (tuple[str, ...]): importable names, e.g. ``("torch", "horovod.torch")``.

    Example:
        ``Imports(("torch", "torchvision"))``
    """

    modules: tuple[str, ...]

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        stubs = ctx.toolchain.cuda_stubs
        prepend = {"LD_LIBRARY_PATH": stubs} if stubs else {}
        return {SANITYCHECK: [PythonCheck(ctx.python, tuple(self.modules), prepend=prepend)]}

