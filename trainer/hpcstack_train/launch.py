"""Where this rank sits in the job (DDP backend): rank, world size, local rank and size, and
rank 0's rendezvous address, from the variables torchrun, Open MPI or Slurm set; and the
intra-op threads per rank. No torch (tests run it without).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from typing import Callable, Mapping, Optional

from .errors import UsageError

#: ``MASTER_ADDR`` when every rank is on this node and none is set.
DEFAULT_MASTER_ADDR = "127.0.0.1"
#: ``MASTER_PORT`` when none is set (torch.distributed's usual port).
DEFAULT_MASTER_PORT = 29500


@dataclasses.dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in the job, as a launcher described it.

    Attributes:
        rank: global rank, 0 .. world_size-1.
        world_size: number of ranks.
        local_rank: rank among the ranks on this node.
        local_size: number of ranks on this node.
        master_addr: host of rank 0's rendezvous store (``MASTER_ADDR``).
        master_port: TCP port of that store (``MASTER_PORT``).
        launcher: ``torchrun``, ``openmpi`` or ``slurm``: which variables were read.
    """

    rank: int
    world_size: int
    local_rank: int
    local_size: int
    master_addr: str
    master_port: int
    launcher: str


def first_host_of_nodelist(nodelist: str) -> str:
    """First host name of a Slurm hostlist expression, without asking Slurm.

    Used when ``scontrol`` is not on PATH. Each bracket group is replaced by its first value,
    keeping zero padding.

    Args:
        nodelist: a Slurm hostlist such as ``node[01-04,07],gpu5`` (``SLURM_JOB_NODELIST``).

    Returns:
        The first host, e.g. ``node01``.

    Raises:
        UsageError: if the expression is empty.

    Example:
        >>> first_host_of_nodelist("rack[2-3]-n[007-9],x1")
        'rack2-n007'
    """
    depth = 0
    first = ""
    for char in nodelist.strip():
        if char == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(char, 0)
        first += char
    if not first:
        raise UsageError(f"empty Slurm node list {nodelist!r}")
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[-,]", m.group(1))[0], first)


def slurm_first_host(nodelist: str,
                     run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """First host of a Slurm node list: ``scontrol show hostnames`` if available, else parsed.

    Args:
        nodelist: ``SLURM_JOB_NODELIST``.
        run: ``subprocess.run`` or a stand-in (tests).

    Returns:
        The host name rank 0 of a block-distributed ``srun`` step runs on.
    """
    try:
        done = run(["scontrol", "show", "hostnames", nodelist],
                   capture_output=True, text=True, timeout=30, check=False)
        hosts = done.stdout.split() if done.returncode == 0 else []
        if hosts:
            return hosts[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return first_host_of_nodelist(nodelist)


def _tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """Number of tasks on node ``node_id`` from ``SLURM_TASKS_PER_NODE`` (e.g. ``2(x3),1``)."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise UsageError(f"cannot parse SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if not 0 <= node_id < len(counts):
        raise UsageError(f"SLURM_NODEID={node_id} outside SLURM_TASKS_PER_NODE={tasks_per_node!r}")
    return counts[node_id]


def resolve_launch_env(
        environ: Mapping[str, str],
        run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> LaunchEnv:
    """Rank, world size, local rank/size and rendezvous address for ``torch.distributed``.

    Looked up in this order (the first launcher whose variables are present wins):

    1. torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
       ``MASTER_ADDR``, ``MASTER_PORT``.
    2. Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``,
       ``_LOCAL_SIZE``. Checked before Slurm because ``mpirun`` inside an allocation leaves the
       batch step's ``SLURM_PROCID=0`` in every rank's environment.
    3. Slurm (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
       ``SLURM_TASKS_PER_NODE`` with ``SLURM_NODEID``.

    ``MASTER_ADDR`` defaults to 127.0.0.1 when all ranks are on this node; otherwise to the first
    host of ``SLURM_JOB_NODELIST`` (via ``scontrol show hostnames`` if available). ``MASTER_PORT``
    defaults to 29500.

    Args:
        environ: the process environment (``os.environ``).
        run: ``subprocess.run`` or a stand-in (tests), used for ``scontrol``.

    Returns:
        A LaunchEnv.

    Raises:
        UsageError: no launcher variables, malformed values, or a multi-node job with no way to
            find rank 0's host.
    """
    def integer(name: str) -> int:
        try:
            return int(environ[name])
        except ValueError:
            raise UsageError(f"{name}={environ[name]!r} is not an integer") from None

    if "RANK" in environ and "WORLD_SIZE" in environ:
        launcher = "torchrun"
        rank, world_size = integer("RANK"), integer("WORLD_SIZE")
        local_rank = integer("LOCAL_RANK") if "LOCAL_RANK" in environ else 0
        local_size = integer("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world_size
    elif "OMPI_COMM_WORLD_RANK" in environ and "OMPI_COMM_WORLD_SIZE" in environ:
        launcher = "openmpi"
        rank, world_size = integer("OMPI_COMM_WORLD_RANK"), integer("OMPI_COMM_WORLD_SIZE")
        local_rank = integer("OMPI_COMM_WORLD_LOCAL_RANK")
        local_size = integer("OMPI_COMM_WORLD_LOCAL_SIZE")
    elif "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        launcher = "slurm"
        rank, world_size = integer("SLURM_PROCID"), integer("SLURM_NTASKS")
        local_rank = integer("SLURM_LOCALID")
        local_size = _tasks_on_node(environ.get("SLURM_TASKS_PER_NODE", str(world_size)),
                                    integer("SLURM_NODEID") if "SLURM_NODEID" in environ else 0)
    else:
        raise UsageError("no launcher environment found for --backend ddp: run under torchrun, "
                         "srun or mpirun (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS or "
                         "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)")
    if not (0 <= rank < world_size and 0 <= local_rank < local_size <= world_size):
        raise UsageError(f"inconsistent {launcher} ranks: rank {rank} of {world_size}, "
                         f"local rank {local_rank} of {local_size}")

    master_addr = environ.get("MASTER_ADDR", "")
    if not master_addr:
        if local_size == world_size:
            master_addr = DEFAULT_MASTER_ADDR
        elif environ.get("SLURM_JOB_NODELIST"):
            master_addr = slurm_first_host(environ["SLURM_JOB_NODELIST"], run=run)
        else:
            raise UsageError("ranks span several nodes and MASTER_ADDR is not set: export it "
                             "to rank 0's host (mpirun -x MASTER_ADDR=host)")
    master_port = integer("MASTER_PORT") if environ.get("MASTER_PORT") else DEFAULT_MASTER_PORT
    return LaunchEnv(rank, world_size, local_rank, local_size, master_addr, master_port, launcher)


def threads_per_rank(local_size: int, cpu_count: Optional[int] = None,
                     affinity: Optional[int] = None) -> int:
    """Intra-op threads for one rank, so that the ranks on a node do not oversubscribe it.

    ``max(1, cores // local_size)``, further capped by the cores this process is bound to
    (``mpirun`` binds each of 2 ranks to one core by default).

    Args:
        local_size: ranks on this node.
        cpu_count: cores of the node; ``os.cpu_count()`` when None.
        affinity: cores this process may run on; ``len(os.sched_getaffinity(0))`` when None.

    Returns:
        The thread count, at least 1.
    """
    cpu_count = cpu_count or os.cpu_count() or 1
    if affinity is None:
        affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpu_count
    return max(1, min(affinity, cpu_count // max(1, local_size)))


# --------------------------------------------------------------------------------------------
# Communication backends: one small class each, same interface
