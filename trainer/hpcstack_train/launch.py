"""Where this rank sits in the job (DDP backend): rank, world size, local rank and size, and
rank 0's rendezvous address, from the variables torchrun, Open MPI or Slurm set; the GPU a rank
picks (:func:`choose_gpu`, also reported per rank for the judge); and the intra-op threads per
rank. No torch (tests run it without).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
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


@dataclasses.dataclass(frozen=True)
class GpuChoice:
    """The GPU a rank uses, or would use on a node with the GPUs its environment names.

    Attributes:
        cuda_visible_devices (str | None): ``CUDA_VISIBLE_DEVICES`` as the rank saw it (verbatim),
            None when unset.
        visible (int | None): GPUs the rank can address: torch's device count where CUDA works,
            else the entries of ``CUDA_VISIBLE_DEVICES``; None when neither tells (no CUDA and
            the variable unset).
        index (int | None): N of ``cuda:N``; None when no GPU can be picked (see ``problem``).
        physical (str | None): the GPU that index means on the node: the N-th entry of
            ``CUDA_VISIBLE_DEVICES`` (an index or a ``GPU-…`` UUID), or ``str(N)`` when it is unset.
        rule (str): why this index: ``one-visible``, ``per-task`` (Slurm bound the task's own
            GPUs), ``local-rank``, or ``none``.
        problem (str | None): one line when the rank has no GPU of its own (more ranks on the
            node than GPUs visible, or none visible); None otherwise.
    """

    cuda_visible_devices: str | None
    visible: int | None
    index: int | None
    physical: str | None
    rule: str
    problem: str | None = None

    @property
    def device(self) -> str | None:
        """``cuda:N``, or None without an index."""
        return None if self.index is None else f"cuda:{self.index}"


def visible_devices(value: str | None) -> list[str] | None:
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value: None when unset, ``[]`` when empty.

    Example:
        >>> visible_devices("2, 3")
        ['2', '3']
    """
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _gpus_per_task(environ: Mapping[str, str]) -> int | None:
    """``SLURM_GPUS_PER_TASK`` as a count (``1``, ``a100:1``); None when unset or unreadable.

    sbatch(1) and srun(1), OUTPUT ENVIRONMENT VARIABLES: "Requested GPU count per allocated task.
    Only set if the --gpus-per-task option is specified."
    """
    match = re.fullmatch(r"\s*(?:[A-Za-z0-9_.-]+:)?(\d+)\s*", environ.get("SLURM_GPUS_PER_TASK", ""))
    return int(match.group(1)) if match else None


def choose_gpu(local_rank: int, local_size: int, environ: Mapping[str, str],
               device_count: int | None = None) -> GpuChoice:
    """The GPU this rank takes: the one rule of :func:`~hpcstack_train.backends.pick_device` and of
    the per-rank ``gpu`` record.

    With ``V`` GPUs visible to the process (``device_count`` where CUDA works, else the entries of
    ``CUDA_VISIBLE_DEVICES``), in this order:

    1. ``V == 0``: no GPU (a problem).
    2. ``V == 1``: ``cuda:0``. Slurm bound one GPU to this task (``--gpus-per-task=1``: sbatch(1)
       says it "will implicitly set --gpu-bind=per_task:<gpus_per_task>"), or the node has one.
    3. ``SLURM_GPUS_PER_TASK`` equals ``V``: the task sees only its own GPUs; ``cuda:0``.
    4. ``local_rank < V``: ``cuda:<local_rank>``; every rank of the node sees all its GPUs
       (``--gres=gpu:4``, ``--gpus-per-node=4``, ``mpirun`` inside the allocation).
    5. otherwise a problem: more ranks on the node than GPUs it can see. No modulo share: two
       ranks on one GPU halve its throughput and NCCL refuses two ranks on one device.

    Without CUDA and without ``CUDA_VISIBLE_DEVICES`` the number visible is unknown: the rank would
    take ``cuda:<local_rank>`` (rule 4), and no problem is claimed.

    Args:
        local_rank (int): rank on this node, 0-based.
        local_size (int): ranks on this node.
        environ (Mapping[str, str]): the process environment.
        device_count (int | None): ``torch.cuda.device_count()`` where CUDA is available; None
            where it is not (a CPU-only node: the statement is what the rank *would* pick).

    Returns:
        GpuChoice: index, physical GPU and rule, or the problem.

    Example:
        >>> choose_gpu(3, 4, {"CUDA_VISIBLE_DEVICES": "3"}).device
        'cuda:0'
        >>> choose_gpu(3, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}).physical
        '3'
    """
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    entries = visible_devices(raw)
    visible = device_count if device_count is not None else (None if entries is None else len(entries))
    shown = "unset" if raw is None else repr(raw)

    def take(index: int, rule: str) -> GpuChoice:
        physical = (entries[index] if entries is not None and index < len(entries) else str(index))
        return GpuChoice(raw, visible, index, physical, rule)

    if visible is None:
        return take(local_rank, "local-rank")
    if visible == 0:
        return GpuChoice(raw, 0, None, None, "none",
                         f"local rank {local_rank} sees no GPU (CUDA_VISIBLE_DEVICES {shown})")
    if visible == 1:
        return take(0, "one-visible")
    if _gpus_per_task(environ) == visible:
        return take(0, "per-task")
    if local_rank < visible:
        return take(local_rank, "local-rank")
    return GpuChoice(raw, visible, None, None, "none",
                     f"local rank {local_rank} of {local_size} has no GPU of its own: {visible} visible "
                     f"(CUDA_VISIBLE_DEVICES {shown}); run at most {visible} rank(s) per node, or "
                     "bind one GPU per task (--gpus-per-task=1)")


def gpu_record_fields(rank: int, local_rank: int, local_size: int, choice: GpuChoice,
                      uses: str, host: str | None = None) -> dict:
    """The fields of one rank's ``gpu`` record (see the package docstring).

    Args:
        rank (int): global rank.
        local_rank, local_size (int): place on the node.
        choice (GpuChoice): from :func:`choose_gpu`.
        uses (str): the device the rank trains on (``cpu``, ``cuda:0``).
        host (str | None): the node's host name; default ``socket.gethostname()``.

    Returns:
        dict: ``rank``, ``host``, ``local_rank``, ``local_size``, ``cuda_visible_devices``,
        ``visible``, ``device`` (``cuda:N`` or None), ``physical_gpu``, ``rule``, ``problem``,
        ``uses``.
    """
    return {"rank": rank, "host": host if host is not None else socket.gethostname(),
            "local_rank": local_rank, "local_size": local_size,
            "cuda_visible_devices": choice.cuda_visible_devices, "visible": choice.visible,
            "device": choice.device, "physical_gpu": choice.physical, "rule": choice.rule,
            "problem": choice.problem, "uses": uses}


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
