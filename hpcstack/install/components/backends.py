"""Validation backends: how a validation program's ranks talk to each other, one class per backend.

A recipe's validation file names the backends its program offers (``backends: [horovod, ddp]``
for the PyTorch trainer, ``[mpi]`` for an MPI stack); each name is a class registered here, in
the manner of :mod:`hpcstack.validate.launchers`. A backend says

* which launcher starts its ranks (:attr:`Backend.launcher`: None means the site's own,
  ``slurm.launcher`` in jobs and ``launcher.command`` for ``--local``);
* which shell lines a job needs before it runs (:meth:`Backend.setup`: DDP's rendezvous port);
* whether ``hpcstack validate --local`` can run it (:attr:`Backend.local`).

The backends are part of what a validation file declares, so they live beside the
:class:`~hpcstack.install.components.validation.Validation` component that reads it;
:mod:`hpcstack.validate` runs them. A new backend is one class in this file::

    @register_backend("nccl-tests")
    class NcclTests(Backend):
        local = True
"""

from __future__ import annotations

from typing import Callable, ClassVar

from hpcstack.registry import Registry

#: name -> backend class, filled by :func:`register_backend`.
BACKENDS = Registry("backend")


class Backend:
    """Base of the backends.

    Attributes:
        name (str): the name it is registered under.
        launcher (str | None): a launcher name (:data:`hpcstack.validate.launchers.LAUNCHERS`) the
            backend needs whatever the site says; None: the site's launcher.
        local (bool): ``hpcstack validate --local`` may run it on this host.
    """

    name: ClassVar[str] = ""
    launcher: ClassVar[str | None] = None
    local: ClassVar[bool] = True

    @classmethod
    def launcher_for(cls, site_launcher: str) -> str:
        """The launcher of a run where the site names ``site_launcher``: :attr:`launcher` if set,
        else the site's."""
        return cls.launcher or site_launcher

    def setup(self, job_id_variable: str | None) -> list[str]:
        """Shell lines a batch job runs once before the program (default none).

        Args:
            job_id_variable (str | None): the scheduler's job id variable (``SLURM_JOB_ID``).
        """
        return []


def register_backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    """Class decorator: register a :class:`Backend` subclass under ``name`` (:data:`BACKENDS`).

    Raises:
        ValueError: the name is taken already.
    """
    return BACKENDS.register(name)


def get_backend(name: str) -> type[Backend]:
    """Return the backend class registered as ``name``.

    Raises:
        ValueError: no such backend (the message lists the known ones).
    """
    return BACKENDS.lookup(name)


@register_backend("horovod")
class Horovod(Backend):
    """Horovod (MPI or Gloo controller; NCCL for GPU tensors where built so), under the site's
    launcher (``srun``, ``mpirun`` or ``horovodrun``)."""


@register_backend("ddp")
class Ddp(Backend):
    """torch.distributed DistributedDataParallel, one process per rank started by the site's
    launcher; its rendezvous takes ``MASTER_PORT`` from the job id, so that two jobs on one node
    do not meet. ``--local`` runs it under ``mpirun`` where the site names ``horovodrun`` (a
    stack without Horovod has none): the program takes its ranks from Open MPI's variables and
    meets on this host (the trainer's ``resolve_launch_env``)."""

    @classmethod
    def launcher_for(cls, site_launcher):
        return "mpirun" if site_launcher == "horovodrun" else site_launcher

    def setup(self, job_id_variable):
        if not job_id_variable:
            return []
        # a port per job: DDP's rendezvous of one job must not meet another's
        return [f"export MASTER_PORT=$((20000 + {job_id_variable} % 20000))"]


@register_backend("mpi")
class Mpi(Backend):
    """Plain MPI (point to point and collectives of the site's MPI), under the site's launcher;
    ``mpirun`` where the site names a framework's own launcher (``horovodrun``, ``torchrun``),
    which an MPI program's stack does not have."""

    @classmethod
    def launcher_for(cls, site_launcher):
        return "mpirun" if site_launcher in ("horovodrun", "torchrun") else site_launcher
