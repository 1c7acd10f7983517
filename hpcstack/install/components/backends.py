"""Validation backends: how a validation program's ranks are started and meet, declared as data.

A recipe's validation file names the backends its program offers (``backends: [horovod, ddp]``
for the PyTorch trainer, ``[mpi]`` for an MPI stack) and may declare backends of its own, as
mappings in the same list; a new framework then needs no line in ``hpcstack/``::

    backends:
      - mpi                               # a default backend, by name
      - name: gloo                        # one of the recipe's own
        instead_of: {horovodrun: mpirun}  # site launcher -> the launcher this backend takes
        setup: ["export MASTER_PORT=$((20000 + {job_id} % 20000))"]
        records: [config, ring]           # record kinds every run of it must write

A backend says

* which launcher starts its ranks (:meth:`Backend.launcher_for`: ``launcher`` whatever the site
  names, else the site's launcher after ``instead_of``; the site's is ``slurm.launcher`` in jobs
  and ``launcher.command`` for ``--local``);
* which shell lines a batch job runs before the program (:meth:`Backend.setup_lines`: DDP's
  rendezvous port; ``{job_id}`` is the scheduler's job id variable, a line with it is left out
  where the scheduler has none);
* whether ``hpcstack validate --local`` can run it (:attr:`Backend.local`);
* which records its runs must write besides ``result`` (:attr:`Backend.records`; the judge fails
  a run that lacks one).

The three built-in backends, ``horovod``, ``ddp`` and ``mpi``, are such declarations
(:data:`DEFAULT_BACKENDS`), as a recipe would write them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hpcstack.registry import Registry

#: JSON schema (draft 2020-12) of a backend declared in a validation file.
BACKEND_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
    "description": {"type": "string"},
    "launcher": {"type": "string", "minLength": 1},
    "instead_of": {"type": "object", "additionalProperties": {"type": "string", "minLength": 1}},
    "local": {"type": "boolean"},
    "setup": {"type": "array", "items": {"type": "string", "minLength": 1}},
    "records": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}},
}}

#: Placeholders a backend's setup line may hold.
SETUP_PLACEHOLDERS = ("job_id",)


@dataclass(frozen=True)
class Backend:
    """A validation backend, as a validation file (or :data:`DEFAULT_BACKENDS`) declares it.

    Attributes:
        name (str): what the file's ``backends`` and ``--backend`` call it; also the run's
            ``{backend}`` placeholder and its records file (``<name>.jsonl``).
        launcher (str | None): a launcher (:data:`hpcstack.validate.launchers.LAUNCHERS`) the
            backend needs whatever the site names; None: the site's, after ``instead_of``.
        instead_of (dict[str, str]): site launcher -> launcher for this backend (``ddp`` takes
            ``mpirun`` where the site names ``horovodrun``).
        local (bool): ``hpcstack validate --local`` may run it on this host.
        setup (tuple[str, ...]): shell lines a batch job runs once before the program.
        records (tuple[str, ...]): record kinds (``"record": KIND``) every run must write,
            besides ``result``.
        description (str): one line for people.

    Example:
        ``Backend("ddp", instead_of={"horovodrun": "mpirun"}).launcher_for("horovodrun")``
        gives ``"mpirun"``.
    """

    name: str
    launcher: str | None = None
    instead_of: dict = field(default_factory=dict)
    local: bool = True
    setup: tuple = ()
    records: tuple = ()
    description: str = ""

    def launcher_for(self, site_launcher: str) -> str:
        """The launcher of a run where the site names ``site_launcher``."""
        return self.launcher or self.instead_of.get(site_launcher, site_launcher)

    def setup_lines(self, job_id_variable: str | None) -> list[str]:
        """The shell lines a batch job runs before the program.

        Args:
            job_id_variable (str | None): the scheduler's job id variable (``SLURM_JOB_ID``);
                None: lines naming ``{job_id}`` are left out.
        """
        return [line.format(job_id=job_id_variable) for line in self.setup
                if job_id_variable or "{job_id}" not in line]

    def to_dict(self) -> dict:
        """The declaration, as a validation file writes it."""
        return {"name": self.name, "launcher": self.launcher, "instead_of": dict(self.instead_of),
                "local": self.local, "setup": list(self.setup), "records": list(self.records),
                "description": self.description}

    @classmethod
    def from_data(cls, data: dict) -> "Backend":
        """A backend from a validation file's mapping (checked against :data:`BACKEND_SCHEMA`)."""
        return cls(name=data["name"], launcher=data.get("launcher"), instead_of=dict(data.get("instead_of") or {}),
                   local=bool(data.get("local", True)), setup=tuple(data.get("setup") or ()),
                   records=tuple(data.get("records") or ()), description=data.get("description", ""))


def setup_problems(backend: Backend, where: str) -> list[str]:
    """What is wrong with a backend's setup lines: unknown placeholders (one line each)."""
    problems = []
    for i, line in enumerate(backend.setup):
        try:
            line.format(**{k: "" for k in SETUP_PLACEHOLDERS})
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"{where}.setup.{i}: {line!r}: unknown placeholder {exc} (known: "
                            + ", ".join("{" + k + "}" for k in SETUP_PLACEHOLDERS) + ")")
        if re.search(r"[\r\n]", line):
            problems.append(f"{where}.setup.{i}: one shell line each, no line break")
    return problems


#: The built-in backends, declared as a validation file would declare them: Horovod under the
#: site's launcher (``srun``, ``mpirun`` or ``horovodrun``); torch.distributed DDP, whose
#: rendezvous takes ``MASTER_PORT`` from the job id so that two jobs on one node do not meet, and
#: which runs under ``mpirun`` where the site names ``horovodrun`` (a stack without Horovod has
#: none: the program takes its ranks from Open MPI's variables); plain MPI under the site's
#: launcher, ``mpirun`` where the site names a framework's own (``horovodrun``, ``torchrun``).
DEFAULT_BACKENDS = {b.name: b for b in (
    Backend("horovod", description="Horovod (MPI or Gloo controller; NCCL for GPU tensors where built so)"),
    Backend("ddp", instead_of={"horovodrun": "mpirun"},
            setup=("export MASTER_PORT=$((20000 + {job_id} % 20000))",),
            description="torch.distributed DistributedDataParallel, one process per rank"),
    Backend("mpi", instead_of={"horovodrun": "mpirun", "torchrun": "mpirun"},
            description="plain MPI: point to point and collectives of the site's MPI"),
)}

#: name -> backend: the defaults, and any a program registers with :func:`register_backend`.
BACKENDS = Registry("backend")
BACKENDS.update(DEFAULT_BACKENDS)


def register_backend(backend: Backend) -> Backend:
    """Add a backend to :data:`BACKENDS` for every recipe (a recipe's own go in its file).

    Raises:
        ValueError: the name is taken already.
    """
    if backend.name in BACKENDS:
        raise ValueError(f"backend {backend.name!r} is registered already")
    BACKENDS[backend.name] = backend
    return backend


def get_backend(name: str, declared: dict | None = None) -> Backend:
    """The backend called ``name``: the recipe's own declaration (``declared``) first, else a
    default one.

    Raises:
        ValueError: no such backend (the message lists the known ones).
    """
    if declared and name in declared:
        return declared[name]
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (known: {', '.join(sorted({*BACKENDS, *(declared or {})}))})")
    return BACKENDS[name]
