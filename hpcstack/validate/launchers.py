"""Launchers: how the ranks of a parallel program are started, one small class per launcher.

In the manner of ReFrame's launchers (``reframe/core/launchers/registry.py``,
``@register_launcher('srun')``): a launcher turns the shape of an allocation (nodes, tasks per
node, cores per task; an :class:`Allocation`, which the scheduler hands out) and its own options
into the command that starts the program on every rank, plus any shell lines it needs first. The
same classes serve Slurm jobs (a line of the job script) and ``hpcstack validate --local`` (an argv
run on this host), so a site's ``slurm.launcher`` and ``launcher.command`` both name one of
:data:`LAUNCHERS`.

A new launcher is one class in this file::

    @register_launcher("aprun")
    class Aprun(Launcher):
        def words(self, program, alloc):
            return ["aprun", "-n", str(alloc.ranks), "-N", str(alloc.tasks_per_node), *program]
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from hpcstack.registry import Registry

#: name -> launcher class, filled by :func:`register_launcher`.
LAUNCHERS = Registry("launcher")


class ShellWord(str):
    """A word of a command that the job's shell must expand (e.g. ``"$HOROVOD_HOSTS"``).

    It is written into a job script as is, never quoted; a command holding one cannot run
    without a shell (:meth:`Launcher.argv` refuses it).
    """


@dataclass(frozen=True)
class Allocation:
    """Where and how many ranks run: what a scheduler tells a launcher.

    Args:
        nodes (int): node count (>= 1).
        tasks_per_node (int): ranks per node.
        cpus_per_task (int): cores per rank (default 1).
        hosts (tuple[str, ...]): the host names, when known before the run (a local run:
            ``("localhost",)``); empty in a batch job, where they are known only inside it.
        hostnames_command (str | None): inside a batch job, a shell command that prints the
            job's hosts one a line (Slurm: ``scontrol show hostnames "$SLURM_JOB_NODELIST"``).
        per_node_command (tuple[str, ...]): a command prefix that starts one process on each
            node of the job (Slurm: ``srun --nodes=N --ntasks-per-node=1``), for launchers that
            start their ranks per node (``torchrun``); empty where there is one node.

    Example:
        >>> Allocation(2, 4).ranks
        8
    """

    nodes: int
    tasks_per_node: int
    cpus_per_task: int = 1
    hosts: tuple[str, ...] = ()
    hostnames_command: str | None = None
    per_node_command: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        """All ranks: ``nodes * tasks_per_node``."""
        return self.nodes * self.tasks_per_node

    def host_list(self, variable: str, slots: bool = True) -> tuple[list[str], str]:
        """Return (shell lines, value) for a ``host[:slots],…`` list, as horovodrun's ``-H`` wants.

        With known :attr:`hosts` the value is literal and no line is needed; in a batch job the
        lines set ``variable`` from :attr:`hostnames_command` and the value is ``"$variable"``.

        Raises:
            ValueError: neither hosts nor a hostnames command.
        """
        suffix = f":{self.tasks_per_node}" if slots else ""
        if self.hosts:
            return [], ",".join(f"{h}{suffix}" for h in self.hosts)
        if not self.hostnames_command:
            raise ValueError("the allocation knows neither its hosts nor how to list them")
        sed = f" | sed 's/$/{suffix}/'" if slots else ""
        return ([f"{variable}=$({self.hostnames_command}{sed} | paste -sd, -)"],
                ShellWord(f'"${variable}"'))


class Launcher:
    """Base of the launchers: subclasses give :meth:`words` and, if needed, :meth:`setup`.

    Args:
        options (Sequence[str]): extra options, placed after the launcher's own and before the
            program (e.g. ``["--oversubscribe"]`` for mpirun).
        mpi (str | None): the MPI plugin of launchers that take one (``srun --mpi=pmix``: Debian's
            Open MPI has no Slurm PMI2); None leaves the choice to the launcher's default.
            Launchers without such an option ignore it.
    """

    #: The name it is registered under (set by :func:`register_launcher`).
    name: ClassVar[str] = ""

    def __init__(self, options: Sequence[str] = (), mpi: str | None = None):
        self.options = list(options)
        self.mpi = mpi

    def words(self, program: list[str], alloc: Allocation) -> list[str]:
        """Return the launch command as words (literal strings or :class:`ShellWord`)."""
        raise NotImplementedError

    def setup(self, alloc: Allocation) -> list[str]:
        """Shell lines the command needs first (run once, in the job script); default none."""
        return []

    def command(self, program: list[str], alloc: Allocation) -> str:
        """Return the launch command as one shell line (literal words quoted).

        Args:
            program (list[str]): the program and its arguments.
            alloc (Allocation): the allocation's shape.

        Example:
            >>> get_launcher("mpirun")().command(["prog", "a b"], Allocation(2, 4))
            "mpirun -np 8 --map-by ppr:4:node --bind-to none prog 'a b'"
        """
        return " ".join(w if isinstance(w, ShellWord) else shlex.quote(w)
                        for w in self.words(program, alloc))

    def argv(self, program: list[str], alloc: Allocation) -> list[str]:
        """Return the launch command as an argv to run without a shell (a local run).

        Raises:
            ValueError: the command needs a shell (the allocation gave no concrete hosts).
        """
        words = self.words(program, alloc)
        needs_shell = [w for w in words if isinstance(w, ShellWord)]
        if needs_shell or self.setup(alloc):
            raise ValueError(f"{self.name} needs a shell here ({', '.join(needs_shell) or 'setup lines'})")
        return [str(w) for w in words]


def register_launcher(name: str) -> Callable[[type[Launcher]], type[Launcher]]:
    """Class decorator: register a :class:`Launcher` subclass under ``name`` (:data:`LAUNCHERS`).

    Raises:
        ValueError: the name is taken already.
    """
    return LAUNCHERS.register(name)


def get_launcher(name: str) -> type[Launcher]:
    """Return the launcher class registered as ``name``.

    Raises:
        ValueError: no such launcher (the message lists the known ones).
    """
    return LAUNCHERS.lookup(name)


@register_launcher("srun")
class Srun(Launcher):
    """Slurm's ``srun``: ``srun [--mpi=X] --nodes=N --ntasks-per-node=T --cpus-per-task=C prog``.

    ``--cpus-per-task`` is given explicitly: srun >= 22.05 no longer inherits it from the job
    (Slurm 22.05 release notes).
    """

    def words(self, program, alloc):
        mpi = [f"--mpi={self.mpi}"] if self.mpi else []
        return ["srun", *mpi, f"--nodes={alloc.nodes}", f"--ntasks-per-node={alloc.tasks_per_node}",
                f"--cpus-per-task={alloc.cpus_per_task}", *self.options, *program]


@register_launcher("mpirun")
class Mpirun(Launcher):
    """Open MPI's ``mpirun -np R --map-by ppr:T:node --bind-to none prog``.

    Inside a Slurm job mpirun finds the nodes itself; ``--bind-to none`` leaves the threads of a
    rank free to use the cores of its task.
    """

    def words(self, program, alloc):
        return ["mpirun", "-np", str(alloc.ranks), "--map-by", f"ppr:{alloc.tasks_per_node}:node",
                "--bind-to", "none", *self.options, *program]


@register_launcher("horovodrun")
class Horovodrun(Launcher):
    """Horovod's ``horovodrun -np R -H host:T,… prog``; in a batch job the host list is built
    first from the job's node list (``$HOROVOD_HOSTS``)."""

    def words(self, program, alloc):
        _, hosts = alloc.host_list("HOROVOD_HOSTS")
        return ["horovodrun", "-np", str(alloc.ranks), "-H", hosts, *self.options, *program]

    def setup(self, alloc):
        return alloc.host_list("HOROVOD_HOSTS")[0]


@register_launcher("torchrun")
class Torchrun(Launcher):
    """PyTorch's ``torchrun``: one agent per node starts ``T`` ranks (torch.distributed only).

    On one node: ``torchrun --standalone --nnodes=1 --nproc-per-node=T --no-python prog``. On
    several: the scheduler's per-node command starts one agent on each node, and they meet at a
    c10d rendezvous on the first host (``$TORCHRUN_ENDPOINT``, a port derived from the job
    shell's pid so that two jobs on one node do not meet). ``--no-python`` because the program is
    an executable (or ``python …``) rather than a script path. Sources: torchrun's options
    (https://pytorch.org/docs/stable/elastic/run.html).
    """

    def words(self, program, alloc):
        common = [f"--nproc-per-node={alloc.tasks_per_node}", *self.options, "--no-python", *program]
        if alloc.nodes == 1:
            return ["torchrun", "--standalone", "--nnodes=1", *common]
        return [*alloc.per_node_command, "torchrun", f"--nnodes={alloc.nodes}", "--rdzv-backend=c10d",
                ShellWord('--rdzv-endpoint="$TORCHRUN_ENDPOINT"'), *common]

    def setup(self, alloc):
        if alloc.nodes == 1:
            return []
        if not alloc.hostnames_command or not alloc.per_node_command:
            raise ValueError("torchrun on several nodes needs a batch job (hosts and a per-node command)")
        return [f"TORCHRUN_ENDPOINT=$({alloc.hostnames_command} | head -n 1):$((29400 + $$ % 10000))"]
