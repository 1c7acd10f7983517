#!/usr/bin/env python3
"""Distributed training benchmark and convergence check shipped inside the hpcstack PyTorch stack.

The program validates an installed PyTorch + Horovod stack on N ranks in two phases:

1. Benchmark, in the manner of Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py``
   (v0.28.1): fixed random images and labels, warm-up batches, then timed iterations of N batches;
   images per second per rank and per iteration; mean +- 1.96 sigma per rank and in total.
2. Convergence: a learnable synthetic task (a fixed random "teacher" labels each image) trained
   with the distributed optimizer from a freshly broadcast model. The check passes when the loss,
   averaged over all ranks, ends below ``--loss-threshold`` and below its initial value, and when
   the sha256 digests of the parameter bytes agree on every rank.

With ``--model digits`` both phases give way to a real image classifier: a small CNN trained on
scikit-learn's bundled 8x8 handwritten digits (1,797 images; ``load_digits`` reads the copy in
the package, nothing is downloaded), split 80/20 into train and test sets by ``--seed``, the
training set sharded by rank, SGD with ``--lr`` x ranks for ``--epochs`` epochs (the img/s of
each epoch are its throughput figures); every rank then classifies the whole test set, and the
run passes when every rank's test accuracy reaches ``--accuracy-threshold`` and the parameters
agree on every rank. Its records are config, collectives, throughput, throughput_total,
``{"record": "classifier", "dataset", "train_images", "test_images", "epochs", "lr",
"batch_size", "final_train_loss", "test_accuracy", "test_accuracy_per_rank", "threshold",
"params_identical", "param_hashes", "seconds"}`` and result.

Records go out as JSON lines from rank 0 (stdout, or ``--output``), in this order; a short
summary goes to stderr. Rates are images per second (img/s), losses cross-entropy in nats::

    {"record": "config", "backend", "transport", "launcher", "world_size", "local_size",
     "device", "threads_per_rank", "model", "image_size", ..., "versions": {...}}
    {"record": "collectives", "backend", "device", "ok", "checks", "ops", "dtypes", "sizes",
     "skipped", "failures", "failed_checks", "seconds"}   (unless --no-collectives-check)
    {"record": "throughput", "rank", "img_per_sec_mean", "img_per_sec_ci95",
     "img_per_sec_iters", "batch_size", "unit"}                            (one per rank)
    {"record": "throughput_total", "img_per_sec", "img_per_sec_ci95", "img_per_sec_per_rank",
     "world_size", "unit"}
    {"record": "convergence", "initial_loss", "final_loss", "threshold", "baseline_loss",
     "steps", "loss_fell", "below_threshold", "params_identical", "param_hashes", "seconds"}
    {"record": "startup", "rank", "imports_s", "first_step_s", "unit"}    (one per rank)
    {"record": "result", "ok", "reasons", "wall_seconds"}

The startup records give each rank's seconds from its process start (``/proc/self/stat``) to
its imports done (torch and the backend, initialised) and to the end of its first training step.

Before both phases, unless ``--no-collectives-check``, every rank checks the backend's collectives
on the training device against exact results (CollectivesCheck: allreduce sum/average/min/max,
a fused batch, allgather of equal and unequal sizes, broadcast from the last rank, alltoall,
reducescatter; float32/16, bfloat16, float64, int32/64; 1 to 2^20 + 1 elements).

Exit status 0 only when the collectives and convergence (or classifier) checks pass, 1 when they
fail (or a rank fails), 2 on a usage error.

Only the standard library, torch, torchvision (for models other than ``tiny`` and ``digits``),
scikit-learn (for ``digits``) and, for the Horovod backend, horovod are needed: the script is installed on its own and never imports hpcstack.

Examples (2 ranks on one CPU node; root needs OMPI_ALLOW_RUN_AS_ROOT=1 and
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpirun)::

    mpirun -np 2 python hpcstack-train-benchmark.py --backend ddp
    torchrun --nproc-per-node 2 hpcstack-train-benchmark.py --backend ddp
    horovodrun -np 2 -H localhost:2 --gloo python hpcstack-train-benchmark.py --backend horovod
    torchrun --nproc-per-node 2 hpcstack-train-benchmark.py --backend ddp --model digits \
        --batch-size 32
    srun --mpi=pmix -n 8 python hpcstack-train-benchmark.py --backend horovod --model resnet50 \\
        --batch-size 32 --device cuda --precision amp --output result.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
from typing import Callable, Mapping, Optional, Sequence, TextIO

import torch
import torch.nn as nn
import torch.nn.functional as F

def process_start_time() -> float:
    """This process's start, in seconds since the epoch: field 22 of ``/proc/self/stat`` (clock
    ticks after boot) plus the boot time (``btime`` of ``/proc/stat``); the time of this call
    where ``/proc`` has neither (proc(5))."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


#: Start-up points of this rank, seconds since the epoch: set as the run gets there.
STARTUP = {"process_start": process_start_time(), "imports_done": None, "first_step": None}

SCRIPT_NAME = "hpcstack-train-benchmark"
SCRIPT_VERSION = "1.0"
METHOD_SOURCE = "horovod examples/pytorch/pytorch_synthetic_benchmark.py v0.28.1"
DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
TINY_MODEL = "tiny"
# Per-model defaults: a 2-core CPU node for ``tiny``; Horovod's benchmark for torchvision models.
TINY_IMAGE_SIZE = 32
TORCHVISION_IMAGE_SIZE = 224
TINY_NUM_CLASSES = 10
TORCHVISION_NUM_CLASSES = 1000
# ResNet-18 on the teacher task (batch 32, lr 0.01) is near loss 0.9 after 100 steps, 0.5 after 300.
TINY_CONVERGENCE_STEPS = 100
TORCHVISION_CONVERGENCE_STEPS = 300
# The digits workload: a small CNN on scikit-learn's bundled 8x8 handwritten digits.
DIGITS_MODEL = "digits"
DIGITS_IMAGE_SIZE = 8
DIGITS_CLASSES = 10
DIGITS_TEST_FRACTION = 0.2


class UsageError(Exception):
    """A command-line value or launch environment the program cannot run with (exit status 2)."""


# --------------------------------------------------------------------------------------------
# Launch environment (DDP backend)
# --------------------------------------------------------------------------------------------


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
# --------------------------------------------------------------------------------------------


class Comm:
    """What the benchmark needs from a distributed backend.

    Attributes:
        name: ``horovod`` or ``ddp``.
        rank, size, local_rank, local_size: this process's place in the job.
        device: the torch.device models and data live on.
        transport: what carries the collectives (``gloo``, ``nccl``, ``mpi``, ...).
        launcher: what started the ranks, as far as the backend can tell.
    """

    name = "base"
    #: whether c_reducescatter needs a first dimension divisible by the world size
    equal_reducescatter = False

    def __init__(self) -> None:
        self.rank = 0
        self.size = 1
        self.local_rank = 0
        self.local_size = 1
        self.device = torch.device("cpu")
        self.transport = "none"
        self.launcher = "none"

    def prepare(self, model: nn.Module,
                make_optimizer: Callable[[Sequence[nn.Parameter]], torch.optim.Optimizer]
                ) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Move ``model`` to the device, make its rank-0 copy everyone's, wrap it for training.

        Returns the model to call and the optimizer to step.
        """
        raise NotImplementedError

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The plain module behind a prepared model (for evaluation and hashing)."""
        return model

    def scaled_step(self, optimizer: torch.optim.Optimizer, scaler) -> None:
        """``optimizer.step()`` through a GradScaler after ``scaler.scale(loss).backward()``."""
        scaler.step(optimizer)

    def allgather(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Stack every rank's ``tensor`` (same shape on all ranks) along a new first axis."""
        raise NotImplementedError

    def allreduce_mean(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Mean of ``tensor`` over the ranks, returned on every rank."""
        raise NotImplementedError

    # The collectives check (CollectivesCheck) calls these with tensors on ``self.device``;
    # ``op`` is one of REDUCE_OPS. Each returns the result on ``self.device``.

    def lacks(self, collective: str, dtype: torch.dtype) -> Optional[str]:
        """Why this backend cannot run ``collective`` on ``dtype`` tensors; None when it can.

        ``collective`` is a name in COLLECTIVES (``allreduce_sum``, ``allgather_unequal``, ...).
        """
        raise NotImplementedError

    def c_allreduce(self, tensors: Sequence[torch.Tensor], op: str, name: str
                    ) -> list[torch.Tensor]:
        """Allreduce every tensor with ``op``, all in flight at once (Horovod fuses them)."""
        raise NotImplementedError

    def c_allgather(self, tensor: torch.Tensor, counts: Sequence[int], name: str) -> torch.Tensor:
        """Concatenate every rank's 1-D ``tensor`` (``counts[r]`` elements on rank r)."""
        raise NotImplementedError

    def c_broadcast(self, tensor: torch.Tensor, root: int, name: str) -> torch.Tensor:
        """Rank ``root``'s ``tensor`` on every rank."""
        raise NotImplementedError

    def c_alltoall(self, tensor: torch.Tensor, send: Sequence[int], receive: Sequence[int],
                   name: str) -> torch.Tensor:
        """Send ``send[j]`` consecutive elements of ``tensor`` to rank j; receive ``receive[j]``
        from rank j, concatenated in rank order."""
        raise NotImplementedError

    def c_reducescatter(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        """Reduce ``tensor`` over the ranks with ``op``; this rank's rows of the result
        (see reducescatter_rows)."""
        raise NotImplementedError

    def c_settle(self) -> None:
        """Wait until every rank is here and the backend holds no more check tensors."""

    def shutdown(self) -> None:
        """Release the backend."""


class HorovodComm(Comm):
    """Horovod: ``hvd.init()``, ``hvd.DistributedOptimizer``, parameter/optimizer broadcast.

    Under ``horovodrun``, ``mpirun`` or ``srun``. With CUDA each rank pins the GPU of its local
    rank, as Horovod's examples do; ``--device auto`` stays on the CPU when Horovod was built
    without GPU support.
    """

    name = "horovod"

    def __init__(self, device_request: str) -> None:
        super().__init__()
        try:
            import horovod
            import horovod.torch as hvd
        except ImportError as err:
            raise UsageError(f"--backend horovod needs horovod.torch: {err}") from None
        self.hvd = hvd
        self.version = horovod.__version__
        hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        gpu_build = _call(hvd, "cuda_built") or _call(hvd, "rocm_built")
        if device_request == "cuda" and not gpu_build:
            raise UsageError("--device cuda: this Horovod was built without GPU support "
                             "(horovodrun --check-build lists its tensor operations)")
        # auto: a CPU-only Horovod cannot reduce CUDA tensors, so it trains on the CPU
        self.device = pick_device(device_request if gpu_build else "cpu", self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        controller = ("gloo" if _call(hvd, "gloo_enabled") else
                      "mpi" if _call(hvd, "mpi_enabled") else "unknown")
        self.transport = f"horovod-{controller}" + ("+nccl" if self.device.type == "cuda"
                                                    and _call(hvd, "nccl_built") else "")
        self.launcher = ("horovodrun-gloo" if controller == "gloo" else
                         "openmpi" if "OMPI_COMM_WORLD_RANK" in os.environ else
                         "slurm" if "SLURM_PROCID" in os.environ else controller)

    def prepare(self, model, make_optimizer):
        hvd = self.hvd
        model.to(self.device)
        optimizer = hvd.DistributedOptimizer(make_optimizer(list(model.parameters())),
                                             named_parameters=model.named_parameters(),
                                             op=hvd.Average)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        return model, optimizer

    def scaled_step(self, optimizer, scaler):
        # Horovod's AMP recipe: finish the allreduces, unscale, then step without a second sync.
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)

    def allgather(self, tensor, name):
        return self.hvd.allgather(tensor.detach().cpu().unsqueeze(0), name=name)

    def allreduce_mean(self, tensor, name):
        return self.hvd.allreduce(tensor.detach().cpu(), op=self.hvd.Average, name=name)

    def lacks(self, collective, dtype):
        if collective.startswith("reducescatter") and collective not in (
                "reducescatter_sum", "reducescatter_average"):
            return "horovod reducescatter supports only Sum and Average"
        # horovod.torch has one C++ function per op and tensor type; 0.28.1 has none for bfloat16
        kind = torch.empty(0, dtype=dtype, device=self.device).type().replace(".", "_")
        base = collective.split("_")[0]
        function = f"horovod_torch_{base}_async_{kind}"
        from horovod.torch.mpi_ops import mpi_lib
        if not hasattr(mpi_lib, function):
            return f"horovod {self.version} has no {function}"
        return None

    def _op(self, op):
        return {"sum": self.hvd.Sum, "average": self.hvd.Average, "min": self.hvd.Min,
                "max": self.hvd.Max}[op]

    def c_allreduce(self, tensors, op, name):
        handles = [self.hvd.allreduce_async(t, op=self._op(op), name=f"{name}.{i}")
                   for i, t in enumerate(tensors)]
        return [self.hvd.synchronize(h) for h in handles]

    def c_allgather(self, tensor, counts, name):
        return self.hvd.allgather(tensor, name=name)

    def c_broadcast(self, tensor, root, name):
        return self.hvd.broadcast(tensor, root_rank=root, name=name)

    def c_alltoall(self, tensor, send, receive, name):
        output, _ = self.hvd.alltoall(tensor, splits=torch.tensor(send, dtype=torch.int32),
                                      name=name)
        return output

    def c_reducescatter(self, tensor, op, name):
        return self.hvd.reducescatter(tensor, op=self._op(op), name=name)

    def c_settle(self):
        self.hvd.barrier()

    def shutdown(self):
        self.hvd.shutdown()


class DdpComm(Comm):
    """``torch.distributed`` with DistributedDataParallel: NCCL on CUDA, Gloo on CPU.

    Rank and rendezvous come from torchrun, Open MPI or Slurm variables (resolve_launch_env).
    """

    name = "ddp"
    #: reduce_scatter_tensor splits the first dimension into equal parts
    equal_reducescatter = True

    def __init__(self, device_request: str, launch: LaunchEnv) -> None:
        super().__init__()
        import torch.distributed as dist
        self.dist = dist
        self.version = torch.__version__
        self.rank, self.size = launch.rank, launch.world_size
        self.local_rank, self.local_size = launch.local_rank, launch.local_size
        self.launcher = launch.launcher
        self.device = pick_device(device_request, self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.transport = "nccl" if self.device.type == "cuda" else "gloo"
        # Tensors handed to collectives, held until shutdown: with torch 2.3 a Gloo worker thread
        # that drops the last reference to a Python-owned tensor needs the GIL, which
        # destroy_process_group() holds while it joins that thread (a deadlock at exit).
        self._keep_alive: list[torch.Tensor] = []
        os.environ["MASTER_ADDR"] = launch.master_addr
        os.environ["MASTER_PORT"] = str(launch.master_port)
        dist.init_process_group(self.transport, init_method="env://",
                                rank=self.rank, world_size=self.size)

    def prepare(self, model, make_optimizer):
        from torch.nn.parallel import DistributedDataParallel
        model.to(self.device)
        # DDP broadcasts rank 0's parameters and buffers when it wraps the model.
        wrapped = DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        return wrapped, make_optimizer(list(wrapped.parameters()))

    def unwrap(self, model):
        return model.module

    def allgather(self, tensor, name):
        tensor = tensor.detach().to(self.device).contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.size)]
        self.dist.all_gather(parts, tensor)
        self._keep_alive += [tensor, *parts]
        return torch.stack(parts).cpu()

    def allreduce_mean(self, tensor, name):
        tensor = tensor.detach().to(self.device).clone()
        self.dist.all_reduce(tensor)
        self._keep_alive.append(tensor)
        return (tensor / self.size).cpu()

    def lacks(self, collective, dtype):
        gloo = self.transport == "gloo"
        if gloo and collective.endswith("_average"):
            return "torch.distributed gloo has no ReduceOp.AVG"
        if gloo and collective == "allgather_unequal":
            return "torch.distributed gloo all_gather needs equal shapes"
        return None

    def _op(self, op):
        return {"sum": self.dist.ReduceOp.SUM, "average": self.dist.ReduceOp.AVG,
                "min": self.dist.ReduceOp.MIN, "max": self.dist.ReduceOp.MAX}[op]

    def c_allreduce(self, tensors, op, name):
        outputs = [t.clone() for t in tensors]
        works = [self.dist.all_reduce(t, op=self._op(op), async_op=True) for t in outputs]
        for work in works:
            work.wait()
        self._keep_alive += outputs
        return outputs

    def c_allgather(self, tensor, counts, name):
        parts = [torch.empty(count, dtype=tensor.dtype, device=tensor.device) for count in counts]
        self.dist.all_gather(parts, tensor)
        self._keep_alive += [tensor, *parts]
        return torch.cat(parts)

    def c_broadcast(self, tensor, root, name):
        tensor = tensor.clone()
        self.dist.broadcast(tensor, src=root)
        self._keep_alive.append(tensor)
        return tensor

    def c_alltoall(self, tensor, send, receive, name):
        output = torch.empty(sum(receive), dtype=tensor.dtype, device=tensor.device)
        self.dist.all_to_all_single(output, tensor, output_split_sizes=list(receive),
                                    input_split_sizes=list(send))
        self._keep_alive += [tensor, output]
        return output

    def c_reducescatter(self, tensor, op, name):
        output = torch.empty(tensor.numel() // self.size, dtype=tensor.dtype,
                             device=tensor.device)
        self.dist.reduce_scatter_tensor(output, tensor, op=self._op(op))
        self._keep_alive += [tensor, output]
        return output

    def c_settle(self):
        # see shutdown: the barrier lets Gloo's workers drop their references without the GIL
        if self.device.type == "cuda":
            self.dist.barrier(device_ids=[self.device.index])
        else:
            self.dist.barrier()
        self._keep_alive.clear()

    def shutdown(self):
        # The barrier waits without the GIL, so Gloo's workers can finish their last work items.
        if self.device.type == "cuda":
            self.dist.barrier(device_ids=[self.device.index])
        else:
            self.dist.barrier()
        self.dist.destroy_process_group()
        self._keep_alive.clear()


def _call(module, function: str) -> bool:
    """``module.function()`` if Horovod has it (builds differ), else False."""
    found = getattr(module, function, None)
    return bool(found()) if callable(found) else False


def pick_device(request: str, local_rank: int) -> torch.device:
    """The device for this rank: ``auto`` means CUDA when available, else CPU.

    Args:
        request: ``auto``, ``cpu`` or ``cuda``.
        local_rank: rank on this node; CUDA ranks use GPU ``local_rank % device_count``.

    Raises:
        UsageError: ``cuda`` requested but torch sees no GPU.
    """
    if request == "cpu" or (request == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda requested but torch.cuda.is_available() is False")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def open_comm(backend: str, device_request: str,
              environ: Mapping[str, str] = os.environ) -> Comm:
    """Initialise the requested backend (``horovod`` or ``ddp``) and return its Comm."""
    if backend == "horovod":
        return HorovodComm(device_request)
    return DdpComm(device_request, resolve_launch_env(environ))


# --------------------------------------------------------------------------------------------
# Collectives check: exact results of every collective the backend offers
# --------------------------------------------------------------------------------------------
#
# Every rank fills its tensors with small integers, computes the exact result of the collective
# in closed form (int64 on the host, then cast: every value is exactly representable in every
# dtype checked) and compares element by element. Reductions use
#     x(r, i) = a(i) + c(i) * (2r - N + 1),   a(i) != 0, c(i) in {0, spread}
# on rank r of N, so that sum = N a, average = a, min = a - c (N - 1), max = a + c (N - 1) exactly,
# and every partial sum stays within the dtype's exact integers (see reduction_amplitudes).
# Motivation: issue 11, a Horovod build whose float32 CUDA Average returned 0 in the last element
# of 4,913 while training still converged.

REDUCE_OPS = ("sum", "average", "min", "max")
#: The collectives checked, in order. ``allreduce_fused_*`` is a batch of many small allreduces
#: in flight at once (Horovod fuses them into one buffer).
COLLECTIVES = (tuple(f"allreduce_{op}" for op in REDUCE_OPS)
               + ("allreduce_fused_sum", "allreduce_fused_average", "allgather_equal",
                  "allgather_unequal", "broadcast", "alltoall", "reducescatter_sum",
                  "reducescatter_average"))
CHECK_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")
#: Largest |n| such that every integer up to it is exact: 2^(significand bits) for floats.
EXACT_LIMIT = {"float32": 2 ** 24, "float16": 2 ** 11, "bfloat16": 2 ** 8, "float64": 2 ** 53,
               "int32": 2 ** 31 - 1, "int64": 2 ** 63 - 1}
#: Element counts: 1, odd, primes, just below/above 2^10 and 2^16, 17^3 (the size of issue 11's
#: wrong Average), and 2^20 + 1 (4 MiB in float32).
CHECK_SIZES = (1, 17, 1023, 1025, 4913, 65521, 65537, 1048577)
#: Largest |a(i)| of a reduction and |value| of the other collectives.
BASE_MAX = 16
DATA_MAX = 120
#: The fused batch: FUSED_COUNT tensors of 1 + (37 k mod FUSED_SPAN) elements.
FUSED_COUNT = 64
FUSED_SPAN = 257
#: allgather and alltoall results grow with the world size: they use the sizes for which
#: world size x size stays below this many elements.
GATHER_MAX_ELEMENTS = 1 << 23
#: --inject-collective-mismatch: the last rank's result of this check gets one wrong element.
INJECT_AT = ("allreduce_sum", "float32", 4913)


def exact_pattern(count: int, stream: int, amplitude: int, offset: int = 0) -> torch.Tensor:
    """Reproducible non-zero integers in ``[-amplitude, -1] U [1, amplitude]`` (int64, host).

    Element i is a multiplicative hash of ``(offset + i, stream)``, so neighbouring elements,
    chunks and streams (ranks) differ and a slice ``[offset, offset + count)`` costs only its
    length. Results are cached (treat them as read-only).

    Args:
        count (int): elements.
        stream (int): which sequence (0 <= stream < 2^20), e.g. a rank.
        amplitude (int): largest |value|, >= 1.
        offset (int): index of the first element in the sequence.

    Returns:
        torch.Tensor: 1-D int64 tensor of ``count`` elements.

    Example:
        >>> exact_pattern(4, 0, 1).abs().tolist()
        [1, 1, 1, 1]
    """
    key = (count, stream, amplitude, offset)
    if key not in _PATTERNS:
        if len(_PATTERNS) >= PATTERN_CACHE:
            _PATTERNS.pop(next(iter(_PATTERNS)))
        _PATTERNS[key] = _hashed_pattern(count, stream, amplitude, offset)
    return _PATTERNS[key]


#: exact_pattern's results, oldest first: every dtype of a check uses the same patterns.
_PATTERNS: dict[tuple[int, int, int, int], torch.Tensor] = {}
PATTERN_CACHE = 64


def _hashed_pattern(count: int, stream: int, amplitude: int, offset: int) -> torch.Tensor:
    index = torch.arange(offset, offset + count, dtype=torch.int64)
    key = (index * 65537 + stream * 7919 + 12345) % (1 << 31)
    hashed = (key * 2654435761) % (1 << 32) >> 7
    value = hashed % (2 * amplitude) - amplitude
    return value + (value >= 0).to(torch.int64)


def reduction_amplitudes(world_size: int, limit: int) -> Optional[tuple[int, int]]:
    """``(base, spread)`` of the reduction pattern for ``world_size`` ranks and a dtype.

    Every |x(r, i)| <= base + spread (N - 1), so every partial sum of N of them stays within
    ``limit`` (``N (base + spread (N - 1)) <= limit``) and is exact in the dtype. spread is 1
    (rank-dependent values) when ``N^2 <= limit``, else 0.

    Args:
        world_size (int): N >= 1.
        limit (int): the dtype's exact-integer limit (EXACT_LIMIT).

    Returns:
        tuple[int, int] | None: None when not even base 1 fits (N > limit): the dtype cannot be
        reduced exactly on so many ranks.

    Example:
        >>> reduction_amplitudes(2, 2 ** 8), reduction_amplitudes(16, 2 ** 8)
        ((16, 1), (1, 1))
    """
    spread = 1 if world_size * world_size <= limit else 0
    base = min(BASE_MAX, limit // world_size - spread * (world_size - 1))
    return (base, spread) if base >= 1 else None


def reduction_input(rank: int, world_size: int, count: int, base: int, spread: int,
                    offset: int = 0) -> torch.Tensor:
    """Rank ``rank``'s contribution ``x(r, i) = a(i) + c(i) (2r - N + 1)`` (int64, host)."""
    a = exact_pattern(count, 0, base, offset)
    c = spread * (exact_pattern(count, 1, 1, offset) > 0).to(torch.int64)
    return a + c * (2 * rank - world_size + 1)


def reduction_expected(op: str, world_size: int, count: int, base: int, spread: int,
                       offset: int = 0) -> torch.Tensor:
    """The exact reduction over all ranks of reduction_input, in closed form (int64, host).

    Args:
        op (str): ``sum`` (N a), ``average`` (a), ``min`` (a - c (N-1)), ``max`` (a + c (N-1)).
        world_size, count, base, spread, offset: as for reduction_input.

    Raises:
        ValueError: unknown op.
    """
    a = exact_pattern(count, 0, base, offset)
    c = spread * (exact_pattern(count, 1, 1, offset) > 0).to(torch.int64)
    if op == "sum":
        return a * world_size
    if op == "average":
        return a
    if op == "min":
        return a - c * (world_size - 1)
    if op == "max":
        return a + c * (world_size - 1)
    raise ValueError(f"unknown reduction {op!r}")


def reducescatter_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(first row, row count)`` of ``rank``'s part of a reducescatter over ``rows`` rows.

    Horovod 0.28.1 gives each rank ``rows // N`` rows and the first ``rows % N`` ranks one more
    (torch's reduce_scatter_tensor needs ``rows % N == 0``, which this also covers).
    """
    share, extra = divmod(rows, world_size)
    first = rank * share + min(rank, extra)
    return first, share + (1 if rank < extra else 0)


def alltoall_splits(count: int, world_size: int, sender: int) -> list[int]:
    """Elements ``sender`` sends to each rank: ``count // N + (sender + 2 j) mod 3`` to rank j.

    Unequal (and for count < N, zero-length) chunks exercise the split bookkeeping.
    """
    return [count // world_size + (sender + 2 * j) % 3 for j in range(world_size)]


def first_mismatch(got: torch.Tensor, want: torch.Tensor, tolerance: float = 0.0
                   ) -> Optional[tuple[int, int, float, float]]:
    """``(wrong elements, first wrong index, got, want)``, or None when ``got`` equals ``want``.

    Args:
        got (torch.Tensor): the collective's result (any device; compared on the host).
        want (torch.Tensor): the exact result, same dtype.
        tolerance (float): allowed absolute difference (0: exact; NaN is always wrong).

    Returns:
        tuple | None: a shape mismatch reports index -1 with the element counts as got/want.
    """
    got = got.detach().reshape(-1).cpu()
    want = want.reshape(-1)
    if got.numel() != want.numel():
        return (max(got.numel(), want.numel()), -1, float(got.numel()), float(want.numel()))
    if tolerance:
        wrong = ~((got.double() - want.double()).abs() <= tolerance)
    else:
        wrong = got != want
    count = int(wrong.sum())
    if not count:
        return None
    index = int(wrong.nonzero()[0, 0])
    return count, index, float(got[index]), float(want[index])


def _number(value: float) -> str:
    return str(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


def mismatch_message(backend: str, collective: str, dtype: str, size, rank: int,
                     found: tuple[int, int, float, float]) -> str:
    """One line naming backend, op, dtype, size, rank and the first wrong index with got/want.

    Example:
        >>> mismatch_message("horovod", "allreduce_sum", "float32", 4913, 1, (1, 4912, 3.0, 2.0))
        'horovod allreduce_sum float32 size 4913 on rank 1: element 4912 is 3, want 2 (1 of 4913 elements wrong)'
    """
    count, index, got, want = found
    where = f"{backend} {collective} {dtype} size {size} on rank {rank}"
    if index < 0:
        return f"{where}: {int(got)} elements, want {int(want)}"
    total = size if isinstance(size, int) else "?"
    return (f"{where}: element {index} is {_number(got)}, want {_number(want)} "
            f"({count} of {total} elements wrong)")


class CollectivesCheck:
    """Run every collective of COLLECTIVES x CHECK_DTYPES x CHECK_SIZES the backend offers on
    its training device and compare each rank's result with the exact one.

    Results are exact, except for a float Average on a world size that is not a power of two,
    where a backend may scale each input by 1/N (NCCL does): it may differ by N ulps of the
    largest input.

    Args:
        comm (Comm): the initialised backend.
        inject (bool): testing aid: the last rank's result of INJECT_AT gets +1 in its last
            element (before the comparison).
        sizes (Sequence[int]): element counts to check.

    Example:
        ``CollectivesCheck(comm).run()`` -> the fields of the ``collectives`` record.
    """

    def __init__(self, comm: Comm, inject: bool = False,
                 sizes: Sequence[int] = CHECK_SIZES) -> None:
        self.comm = comm
        self.inject = inject
        self.sizes = tuple(sizes)
        self.failures: list[str] = []
        self.checked: list[tuple[str, str, str]] = []
        self.skipped: dict[tuple[str, str], str] = {}

    # -- one comparison --------------------------------------------------------------------

    def _compare(self, collective: str, dtype: torch.dtype, size, got: torch.Tensor,
                 want: torch.Tensor, tolerance: float = 0.0) -> None:
        comm = self.comm
        name = str(dtype).replace("torch.", "")
        if (self.inject and comm.rank == comm.size - 1 and (collective, name, size) == INJECT_AT):
            got = got.clone()
            got.view(-1)[-1] += 1
        self.checked.append((collective, name, str(size)))
        found = first_mismatch(got, want.to(dtype), tolerance)
        if found:
            self.failures.append(mismatch_message(comm.name, collective, name, size, comm.rank,
                                                  found))

    def _put(self, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return values.to(dtype).to(self.comm.device)

    # -- the collectives -------------------------------------------------------------------

    def _allreduce(self, op: str, dtype: torch.dtype, fused: bool) -> None:
        comm, n = self.comm, self.comm.size
        base, spread = reduction_amplitudes(n, EXACT_LIMIT[_dtype_name(dtype)])
        if fused:
            shapes = [(1 + (37 * k) % FUSED_SPAN, k * FUSED_SPAN) for k in range(FUSED_COUNT)]
            size = f"{FUSED_COUNT}x1..{FUSED_SPAN}"
        else:
            shapes = [(count, 0) for count in self.sizes]
        inputs = [self._put(reduction_input(comm.rank, n, count, base, spread, offset), dtype)
                  for count, offset in shapes]
        tolerance = 0.0
        if op == "average" and dtype.is_floating_point and n & (n - 1):
            tolerance = n * torch.finfo(dtype).eps * (base + spread * (n - 1))
        collective = "allreduce_fused_" + op if fused else "allreduce_" + op
        if fused:
            results = comm.c_allreduce(inputs, op, f"check.{collective}.{dtype}")
            got = torch.cat([r.reshape(-1) for r in results])
            want = torch.cat([reduction_expected(op, n, count, base, spread, offset)
                              for count, offset in shapes])
            self._compare(collective, dtype, size, got, want, tolerance)
            return
        for (count, _), tensor in zip(shapes, inputs):
            got = comm.c_allreduce([tensor], op, f"check.{collective}.{dtype}.{count}")[0]
            self._compare(collective, dtype, count, got,
                          reduction_expected(op, n, count, base, spread), tolerance)

    def _allgather(self, dtype: torch.dtype, equal: bool) -> None:
        comm, n = self.comm, self.comm.size
        collective = "allgather_equal" if equal else "allgather_unequal"
        for size in self._gather_sizes():
            counts = [size if equal else size + (r % 3) for r in range(n)]
            tensor = self._put(exact_pattern(counts[comm.rank], comm.rank, DATA_MAX), dtype)
            got = comm.c_allgather(tensor, counts, f"check.{collective}.{dtype}.{size}")
            want = torch.cat([exact_pattern(counts[r], r, DATA_MAX) for r in range(n)])
            self._compare(collective, dtype, size, got, want)

    def _broadcast(self, dtype: torch.dtype) -> None:
        comm = self.comm
        root = comm.size - 1  # non-zero whenever there are two ranks or more
        for size in self.sizes:
            tensor = self._put(exact_pattern(size, comm.rank, DATA_MAX), dtype)
            got = comm.c_broadcast(tensor, root, f"check.broadcast.{dtype}.{size}")
            self._compare("broadcast", dtype, size, got, exact_pattern(size, root, DATA_MAX))

    def _alltoall(self, dtype: torch.dtype) -> None:
        comm, n = self.comm, self.comm.size

        def chunk(sender: int, receiver: int, size: int) -> torch.Tensor:
            return exact_pattern(alltoall_splits(size, n, sender)[receiver],
                                 sender * n + receiver, DATA_MAX)

        for size in self._gather_sizes():
            send = alltoall_splits(size, n, comm.rank)
            receive = [alltoall_splits(size, n, r)[comm.rank] for r in range(n)]
            tensor = self._put(torch.cat([chunk(comm.rank, j, size) for j in range(n)]), dtype)
            got = comm.c_alltoall(tensor, send, receive, f"check.alltoall.{dtype}.{size}")
            want = torch.cat([chunk(r, comm.rank, size) for r in range(n)])
            self._compare("alltoall", dtype, size, got, want)

    def _reducescatter(self, op: str, dtype: torch.dtype) -> None:
        comm, n = self.comm, self.comm.size
        base, spread = reduction_amplitudes(n, EXACT_LIMIT[_dtype_name(dtype)])
        tolerance = 0.0
        if op == "average" and dtype.is_floating_point and n & (n - 1):
            tolerance = n * torch.finfo(dtype).eps * (base + spread * (n - 1))
        for size in self._gather_sizes():
            rows = -(-size // n) * n if comm.equal_reducescatter else max(size, n)
            tensor = self._put(reduction_input(comm.rank, n, rows, base, spread), dtype)
            got = comm.c_reducescatter(tensor, op, f"check.reducescatter_{op}.{dtype}.{size}")
            first, count = reducescatter_rows(rows, n, comm.rank)
            want = reduction_expected(op, n, count, base, spread, offset=first)
            self._compare("reducescatter_" + op, dtype, size, got, want, tolerance)

    def _gather_sizes(self) -> list[int]:
        return [size for size in self.sizes if size * self.comm.size <= GATHER_MAX_ELEMENTS]

    # -- driver ----------------------------------------------------------------------------

    def run(self) -> dict:
        """Run every check; gather every rank's failures to every rank.

        Returns:
            dict: the fields of the ``collectives`` record: ``ok``, ``checks`` (op x dtype x
            size combinations compared on each rank), ``ops``, ``dtypes``, ``sizes`` (those
            checked), ``skipped`` (``{"op", "dtype", "reason"}`` for each op the backend lacks),
            ``failures`` (one message per failing rank: its first mismatch), ``failed_checks``
            (over all ranks), ``device`` and ``seconds``.
        """
        comm = self.comm
        started = time.perf_counter()
        for dtype_name in CHECK_DTYPES:
            dtype = getattr(torch, dtype_name)
            for collective in COLLECTIVES:
                reason = comm.lacks(collective, dtype)
                if reason is None and collective.startswith(("allreduce", "reducescatter")) \
                        and reduction_amplitudes(comm.size, EXACT_LIMIT[dtype_name]) is None:
                    reason = f"{comm.size} ranks: sums of {dtype_name} cannot stay exact"
                if reason:
                    self.skipped[(collective, dtype_name)] = reason
                    continue
                kind, _, op = collective.partition("_")
                if kind == "allreduce":
                    fused = op.startswith("fused_")
                    self._allreduce(op.replace("fused_", ""), dtype, fused)
                elif kind == "allgather":
                    self._allgather(dtype, equal=op == "equal")
                elif kind == "broadcast":
                    self._broadcast(dtype)
                elif kind == "alltoall":
                    self._alltoall(dtype)
                else:
                    self._reducescatter(op, dtype)
            comm.c_settle()
        _synchronize(comm.device)
        _PATTERNS.clear()
        seconds = time.perf_counter() - started
        for message in self.failures[:20]:
            print(f"{SCRIPT_NAME}: rank {comm.rank}: collective mismatch: {message}",
                  file=sys.stderr, flush=True)
        first = (self.failures[0] if self.failures else "").encode()[:MESSAGE_BYTES]
        encoded = torch.zeros(MESSAGE_BYTES + 1, dtype=torch.int64)
        encoded[0] = len(self.failures)
        encoded[1:1 + len(first)] = torch.tensor(list(first), dtype=torch.int64)
        gathered = comm.allgather(encoded, "check.failures")
        failures = [bytes(row[1:].tolist()).rstrip(b"\0").decode(errors="replace")
                    for row in gathered if int(row[0])]
        seconds_all = comm.allgather(torch.tensor([seconds], dtype=torch.float64),
                                     "check.seconds")
        return {
            "backend": comm.name,
            "device": comm.device.type,
            "ok": not failures,
            "checks": len(self.checked),
            "ops": sorted({c for c, _, _ in self.checked}, key=COLLECTIVES.index),
            "dtypes": [d for d in CHECK_DTYPES if any(x == d for _, x, _ in self.checked)],
            "sizes": sorted({s for _, _, s in self.checked}, key=_size_key),
            "skipped": [{"op": c, "dtype": d, "reason": r} for (c, d), r in self.skipped.items()],
            "failures": failures,
            "failed_checks": int(sum(int(row[0]) for row in gathered)),
            "seconds": float(seconds_all.max()),
        }


#: Bytes of a failure message gathered from each rank.
MESSAGE_BYTES = 400


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _size_key(size: str) -> tuple[int, str]:
    return (int(size), "") if size.isdigit() else (1 << 62, size)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def build_model(name: str, num_classes: int) -> nn.Module:
    """A randomly initialised classifier for 3-channel images (1-channel 8x8 for ``digits``).

    Args:
        name: ``tiny`` (two 3x3 convolutions, ~5k parameters, a few ms per batch of 16 32x32
            images on one CPU core), ``digits`` (two 3x3 convolutions and two linear layers,
            ~150k parameters, for 1 x 8 x 8 images) or any torchvision classification model name
            (``resnet50``, ``vgg16``, ...), built with ``weights=None``.
        num_classes: outputs of the last layer.

    Raises:
        UsageError: unknown model name.
    """
    check_model_name(name)
    if name == DIGITS_MODEL:
        # 1 x 8 x 8 -> 32 x 8 x 8 -> 64 x 4 x 4 -> 128 -> 10 (~150k parameters)
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(inplace=True),
            nn.Linear(128, num_classes))
    if name == TINY_MODEL:
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))
    import torchvision.models as models
    return models.get_model(name, weights=None, num_classes=num_classes)


def check_model_name(name: str) -> None:
    """Raise UsageError unless ``name`` is ``tiny``, ``digits`` or a torchvision classification
    model (``digits`` needs scikit-learn, for its bundled data set)."""
    if name == DIGITS_MODEL:
        try:
            import sklearn.datasets  # noqa: F401
        except ImportError as err:
            raise UsageError(f"--model {DIGITS_MODEL} needs scikit-learn (its bundled digits "
                             f"data set; in the stack's lock from pytorch/2.3.1-gpu on): {err}") from None
        return
    if name == TINY_MODEL:
        return
    try:
        import torchvision.models as models
    except ImportError as err:
        raise UsageError(f"--model {name} needs torchvision: {err}") from None
    if name not in models.list_models(module=models):
        raise UsageError(f"unknown model {name!r}: use {TINY_MODEL} or a torchvision "
                         "classification model (resnet50, vgg16, ...)")


def logits_of(output) -> torch.Tensor:
    """Main logits of a model output (inception_v3 and googlenet return named tuples)."""
    return getattr(output, "logits", output)


def in_memory_format(value, channels_last: bool):
    """A model or a 4-D batch in channels-last (NHWC) memory format when ``channels_last``, else
    unchanged. Tensor cores take NHWC for convolutions: PyTorch's channels-last tutorial and
    NVIDIA's deep learning performance guide advise it with AMP (issue 10)."""
    if not channels_last:
        return value
    if isinstance(value, torch.Tensor):
        return value.contiguous(memory_format=torch.channels_last) if value.dim() == 4 else value
    return value.to(memory_format=torch.channels_last)


def model_channels_last(comm: Comm, args: argparse.Namespace) -> bool:
    """Whether the model's parameters go channels-last too: with DDP, yes; with Horovod 0.28.1,
    no: its broadcast and allreduce refuse non-contiguous tensors ("Tensor is required to be
    contiguous", ``horovod/torch/mpi_ops.py``), and a channels-last convolution weight and its
    gradient are not contiguous. The batches still are, and the convolutions follow them."""
    return args.channels_last and comm.name != "horovod"


def make_train_step(model: nn.Module, optimizer: torch.optim.Optimizer, comm: Comm,
                    precision: str, channels_last: bool = False
                    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One forward/backward/step on a batch, as in Horovod's ``benchmark_step``.

    Args:
        model, optimizer: as returned by Comm.prepare.
        comm: the backend (its AMP step differs for Horovod).
        precision: ``fp32``, or ``amp``: autocast to float16 with a GradScaler on CUDA, to
            bfloat16 (no scaler) on CPU.
        channels_last: feed the batch in channels-last memory format (the model must be too).

    Returns:
        ``step(images, labels) -> loss`` (a 0-dim tensor, not synchronised).
    """
    device_type = comm.device.type
    use_amp = precision == "amp"
    amp_dtype = torch.float16 if device_type == "cuda" else torch.bfloat16
    scaler = None
    if use_amp and device_type == "cuda":
        scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") \
            else torch.cuda.amp.GradScaler()

    def step(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad()
        with torch.autocast(device_type, dtype=amp_dtype, enabled=use_amp):
            loss = F.cross_entropy(logits_of(model(in_memory_format(images, channels_last))), labels)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            comm.scaled_step(optimizer, scaler)
            scaler.update()
        if STARTUP["first_step"] is None:
            _synchronize(comm.device)
            STARTUP["first_step"] = time.time()
        return loss

    return step


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------
# Phase 1: throughput
# --------------------------------------------------------------------------------------------


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 1.96 x population standard deviation, as Horovod's benchmark reports them.

    (``np.mean`` and ``1.96 * np.std`` in pytorch_synthetic_benchmark.py v0.28.1.)
    """
    return statistics.fmean(values), 1.96 * statistics.pstdev(values)


def run_benchmark(comm: Comm, args: argparse.Namespace) -> list[float]:
    """Throughput of synthetic training on this rank, in images per second per iteration.

    Method of Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py`` (v0.28.1): a model
    with random weights, broadcast from rank 0; SGD with lr 0.01 x world size wrapped by the
    distributed optimizer; one fixed batch of random images (N(0,1), 3 x image_size^2) and random
    labels; ``num_warmup_batches`` untimed steps; then ``num_iters`` timed iterations of
    ``num_batches_per_iter`` steps, each giving ``batch_size * num_batches_per_iter / seconds``.
    Differences: on CUDA the device is synchronised before each clock reading; the model is
    torchvision's default build (no SyncBatchNorm); data and model are seeded from ``--seed``.

    Args:
        comm: the initialised backend.
        args: parsed command line (model, num_classes, image_size, batch_size, precision,
            num_warmup_batches, num_batches_per_iter, num_iters, seed).

    Returns:
        Images per second of this rank, one value per timed iteration.
    """
    torch.manual_seed(derive_seed(args.seed, "benchmark-model", 0))
    model, optimizer = comm.prepare(
        in_memory_format(build_model(args.model, args.num_classes), model_channels_last(comm, args)),
        lambda params: torch.optim.SGD(params, lr=0.01 * comm.size))
    generator = torch.Generator().manual_seed(derive_seed(args.seed, "benchmark-data", comm.rank))
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                         generator=generator).to(comm.device)
    labels = torch.randint(0, args.num_classes, (args.batch_size,),
                           generator=generator).to(comm.device)
    step = make_train_step(model, optimizer, comm, args.precision, args.channels_last)
    model.train()
    for _ in range(args.num_warmup_batches):
        step(images, labels)
    img_secs = []
    for _ in range(args.num_iters):
        _synchronize(comm.device)
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step(images, labels)
        _synchronize(comm.device)
        img_secs.append(args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start))
    return img_secs


# --------------------------------------------------------------------------------------------
# Phase 2: convergence on a learnable synthetic task
# --------------------------------------------------------------------------------------------


def derive_seed(seed: int, purpose: str, rank: int) -> int:
    """A 63-bit seed for one purpose and rank, derived from ``--seed`` by sha256."""
    digest = hashlib.sha256(f"{seed}:{purpose}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


class ChannelMeanTeacher:
    """A fixed random labelling that any convolutional classifier can learn.

    Images are N(0,1) pixel noise plus a random N(0,1) offset per image and channel. The label is
    ``argmax(W @ m)``, where ``m`` is the image's per-channel mean (3 values) and ``W`` a fixed
    random ``num_classes x 3`` matrix drawn from ``--seed`` alone, so every rank holds the same
    teacher while drawing its own images. Channel means survive global pooling, so a student
    must learn a function of its input; predicting the label frequencies alone leaves the loss
    near their entropy (baseline_loss: 1.71 nats for 10 classes and the default seed).
    """

    def __init__(self, num_classes: int, seed: int, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(derive_seed(seed, "teacher", 0))
        self.weight = torch.randn(num_classes, 3, generator=generator).to(device)
        self.device = device

    def sample(self, count: int, image_size: int,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` images (count x 3 x image_size x image_size) and their labels."""
        noise = torch.randn(count, 3, image_size, image_size, generator=generator,
                            device=self.device)
        offset = torch.randn(count, 3, 1, 1, generator=generator, device=self.device)
        images = noise + offset
        labels = (images.mean(dim=(2, 3)) @ self.weight.t()).argmax(dim=1)
        return images, labels


@contextlib.contextmanager
def batch_statistics_eval(model: nn.Module):
    """Evaluation mode, except that batch-norm layers normalise with the batch's statistics.

    For the first few hundred steps the running statistics lag the weights (momentum 0.1), which
    makes eval-mode losses of BatchNorm models meaningless (ResNet-18: 18.7 after 20 steps).
    Dropout is off as in eval mode; the buffers are restored on exit, so evaluation leaves the
    model as it was (in train mode).
    """
    saved = [buffer.clone() for buffer in model.buffers()]
    model.eval()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train()
    try:
        yield model
    finally:
        with torch.no_grad():
            for buffer, value in zip(model.buffers(), saved):
                buffer.copy_(value)
        model.train()


def parameter_digest(model: nn.Module) -> bytes:
    """sha256 of the concatenated bytes of ``model.parameters()`` (in order, on the host).

    Buffers (BatchNorm running statistics) are left out: Horovod does not synchronise them.
    """
    digest = hashlib.sha256()
    for param in model.parameters():
        data = param.detach().reshape(-1).contiguous().cpu()
        digest.update(data.view(torch.uint8).numpy().tobytes())
    return digest.digest()


def run_convergence(comm: Comm, args: argparse.Namespace) -> dict:
    """Train a fresh model on the teacher task with the distributed optimizer; check the result.

    A model is built and broadcast from rank 0; SGD (momentum 0.9, lr ``--convergence-lr``, not
    scaled with world size) wrapped by the backend trains for ``--convergence-steps`` steps of
    ``--batch-size`` images per rank, each rank drawing different images. The loss is measured
    before and after on a held-out set of 4 batches per rank, in eval mode, and averaged over the
    ranks (batch-norm layers use batch statistics, see batch_statistics_eval). Then each rank
    hashes its parameters (parameter_digest) and the digests are gathered to every rank.

    Args:
        comm: the initialised backend.
        args: parsed command line.

    Returns:
        The fields of the ``convergence`` record: initial_loss, final_loss, threshold,
        baseline_loss (nats: the entropy of the held-out labels' frequencies, i.e. the loss of a
        model that ignores its input), steps,
        loss_fell (final < initial), below_threshold (final < threshold), params_identical,
        param_hashes (hex, by rank), seconds.
    """
    started = time.perf_counter()
    torch.manual_seed(derive_seed(args.seed, "convergence-model", 0))
    model, optimizer = comm.prepare(
        in_memory_format(build_model(args.model, args.convergence_classes), model_channels_last(comm, args)),
        lambda params: torch.optim.SGD(params, lr=args.convergence_lr, momentum=0.9))
    plain = comm.unwrap(model)
    teacher = ChannelMeanTeacher(args.convergence_classes, args.seed, comm.device)

    def generator(purpose: str) -> torch.Generator:
        return torch.Generator(device=comm.device).manual_seed(
            derive_seed(args.seed, purpose, comm.rank))

    eval_generator = generator("convergence-eval")
    eval_set = [teacher.sample(args.batch_size, args.image_size, eval_generator) for _ in range(4)]
    autocast = dict(device_type=comm.device.type, enabled=args.precision == "amp",
                    dtype=torch.float16 if comm.device.type == "cuda" else torch.bfloat16)

    def mean_eval_loss(name: str) -> float:
        with torch.no_grad(), batch_statistics_eval(plain), torch.autocast(**autocast):
            losses = [F.cross_entropy(logits_of(plain(in_memory_format(x, args.channels_last))), y).float()
                      for x, y in eval_set]
        return float(comm.allreduce_mean(torch.stack(losses).mean().cpu(), name))

    counts = torch.bincount(torch.cat([y for _, y in eval_set]).cpu(),
                            minlength=args.convergence_classes).double()
    frequencies = comm.allreduce_mean(counts, "convergence.label_counts")
    frequencies = frequencies[frequencies > 0] / frequencies.sum()
    baseline_loss = float(-(frequencies * frequencies.log()).sum())
    initial_loss = mean_eval_loss("convergence.initial_loss")
    step = make_train_step(model, optimizer, comm, args.precision, args.channels_last)
    train_generator = generator("convergence-train")
    for _ in range(args.convergence_steps):
        step(*teacher.sample(args.batch_size, args.image_size, train_generator))
    final_loss = mean_eval_loss("convergence.final_loss")

    if args.inject_param_mismatch and comm.rank == comm.size - 1 and comm.size > 1:
        with torch.no_grad():
            next(plain.parameters()).view(-1)[0] += 1.0
    digest = torch.tensor(list(parameter_digest(plain)), dtype=torch.int64)
    hashes = [bytes(row.tolist()).hex()
              for row in comm.allgather(digest, "convergence.param_digest")]
    return {
        "initial_loss": initial_loss,
        "final_loss": final_loss,
        "threshold": args.loss_threshold,
        "baseline_loss": baseline_loss,
        "steps": args.convergence_steps,
        "loss_fell": final_loss < initial_loss,
        "below_threshold": final_loss < args.loss_threshold,
        "params_identical": len(set(hashes)) == 1,
        "param_hashes": hashes,
        "seconds": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------------------------
# The digits workload: a real image classifier (--model digits)
# --------------------------------------------------------------------------------------------


def load_digits_split(seed: int, test_fraction: float = DIGITS_TEST_FRACTION
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled 8x8 handwritten digits, split into train and test sets.

    ``sklearn.datasets.load_digits`` reads the copy inside the scikit-learn package (1,797
    images of 8x8 pixels, values 0-16, 10 classes); nothing is downloaded. Pixels are scaled to
    [0, 1]. The split is a permutation drawn from ``seed`` alone, so every rank holds the same
    train and test sets (``round(1797 * test_fraction)`` test images: 359 for 0.2).

    Returns:
        ``(train_images, train_labels, test_images, test_labels)`` on the CPU; images are
        float32 ``N x 1 x 8 x 8``, labels int64.

    Raises:
        UsageError: scikit-learn is not installed.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:
        raise UsageError(f"--model {DIGITS_MODEL} needs scikit-learn (its bundled digits data "
                         f"set): {err}") from None
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(
        derive_seed(seed, "digits-split", 0)))
    test_count = round(len(labels) * test_fraction)
    test, train = order[:test_count], order[test_count:]
    return images[train], labels[train], images[test], labels[test]


def shard_indices(count: int, rank: int, size: int, epoch: int, seed: int) -> torch.Tensor:
    """This rank's training images of one epoch: a shuffle shared by all ranks (drawn from
    ``seed`` and ``epoch``), every ``size``-th index from ``rank`` on, cut to ``count // size``
    so that every rank takes the same number of steps (as ``DistributedSampler(drop_last=True)``)."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(
        derive_seed(seed, f"digits-epoch-{epoch}", 0)))
    return order[rank::size][:count // size]


def run_digits(comm: Comm, args: argparse.Namespace) -> tuple[list[float], dict]:
    """Train the digits CNN on the training set sharded by rank; evaluate on the whole test set.

    A model is built from ``--seed`` and broadcast from rank 0; SGD (momentum 0.9, learning rate
    ``--lr`` x world size, Horovod's rule for a global batch that grows with the ranks) wrapped
    by the backend trains ``--epochs`` epochs of ``--batch-size`` images per rank and step. Each
    epoch's training rate (img/s on this rank) is measured. Afterwards every rank classifies
    the whole test set; the accuracies and parameter digests of all ranks are gathered.

    Args:
        comm: the initialised backend.
        args: parsed command line (seed, epochs, lr, batch_size, precision, accuracy_threshold).

    Returns:
        ``(img_secs, classifier)``: this rank's img/s per epoch (the first included: the data
        set is small and already in memory), and the fields of the ``classifier`` record:
        dataset, train_images, test_images, epochs, lr, batch_size, final_train_loss,
        test_accuracy (rank 0's), test_accuracy_per_rank, threshold, params_identical,
        param_hashes, seconds.
    """
    started = time.perf_counter()
    train_x, train_y, test_x, test_y = load_digits_split(args.seed)
    train_x, train_y = train_x.to(comm.device), train_y.to(comm.device)
    test_x, test_y = test_x.to(comm.device), test_y.to(comm.device)
    torch.manual_seed(derive_seed(args.seed, "digits-model", 0))
    lr = args.lr * comm.size
    model, optimizer = comm.prepare(
        in_memory_format(build_model(DIGITS_MODEL, DIGITS_CLASSES), model_channels_last(comm, args)),
        lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9))
    plain = comm.unwrap(model)
    step = make_train_step(model, optimizer, comm, args.precision, args.channels_last)
    model.train()
    img_secs, losses = [], []
    for epoch in range(args.epochs):
        shard = shard_indices(len(train_y), comm.rank, comm.size, epoch, args.seed).to(comm.device)
        _synchronize(comm.device)
        start = time.perf_counter()
        for first in range(0, len(shard), args.batch_size):
            batch = shard[first:first + args.batch_size]
            losses.append(step(train_x[batch], train_y[batch]).detach())
        _synchronize(comm.device)
        img_secs.append(len(shard) / (time.perf_counter() - start))
    steps_per_epoch = math.ceil(len(train_y) // comm.size / args.batch_size)
    final_loss = float(comm.allreduce_mean(
        torch.stack(losses[-steps_per_epoch:]).float().mean().cpu(), "digits.final_loss"))
    plain.eval()
    with torch.no_grad():
        correct = sum(int((logits_of(plain(test_x[i:i + 512])).argmax(dim=1)
                           == test_y[i:i + 512]).sum()) for i in range(0, len(test_y), 512))
    plain.train()
    accuracy = correct / len(test_y)
    accuracies = comm.allgather(torch.tensor(accuracy, dtype=torch.float64),
                                "digits.test_accuracy").reshape(-1).tolist()
    digest = torch.tensor(list(parameter_digest(plain)), dtype=torch.int64)
    hashes = [bytes(row.tolist()).hex() for row in comm.allgather(digest, "digits.param_digest")]
    return img_secs, {
        "dataset": "sklearn.datasets.load_digits (8x8, 10 classes)",
        "train_images": len(train_y),
        "test_images": len(test_y),
        "epochs": args.epochs,
        "lr": lr,
        "batch_size": args.batch_size,
        "final_train_loss": final_loss,
        "test_accuracy": accuracies[0],
        "test_accuracy_per_rank": accuracies,
        "threshold": args.accuracy_threshold,
        "params_identical": len(set(hashes)) == 1,
        "param_hashes": hashes,
        "seconds": time.perf_counter() - started,
    }


def classifier_reasons(classifier: dict) -> list[str]:
    """Why the ``classifier`` record fails (empty when it passes): a test accuracy below the
    threshold (on any rank), or parameters that differ between ranks."""
    reasons = []
    worst = min(classifier["test_accuracy_per_rank"])
    if not worst >= classifier["threshold"]:
        reasons.append(f"test accuracy {worst:.4f} below the threshold {classifier['threshold']} "
                       f"({classifier['test_images']} test images, {classifier['epochs']} epoch(s))")
    if not classifier["params_identical"]:
        reasons.append(f"parameters differ between ranks: {len(set(classifier['param_hashes']))} "
                       f"distinct sha256 digests on {len(classifier['param_hashes'])} ranks")
    return reasons


def collectives_summary(record: dict) -> str:
    """The stderr line of a ``collectives`` record, e.g. ``collectives: 356 checks (11 ops x 5
    dtypes x 9 sizes) on cpu in 2.1 s: OK; skipped: ...``."""
    line = (f"collectives: {record['checks']} checks ({len(record['ops'])} ops x "
            f"{len(record['dtypes'])} dtypes x {len(record['sizes'])} sizes) on "
            f"{record['device']} in {record['seconds']:.1f} s: "
            + ("OK" if record["ok"] else "FAILED: " + "; ".join(record["failures"])))
    return line + "".join(f"; skipped {what}" for what in skipped_summary(record["skipped"]))


def skipped_summary(skipped: Sequence[dict]) -> list[str]:
    """One phrase per distinct reason of the ``skipped`` list: ``"<ops> on <dtypes>: <reason>"``
    (``all ops`` when every op of COLLECTIVES is skipped for those dtypes)."""
    by_reason: dict[str, tuple[list[str], list[str]]] = {}
    for item in skipped:
        ops, dtypes = by_reason.setdefault(item["reason"], ([], []))
        ops += [item["op"]] if item["op"] not in ops else []
        dtypes += [item["dtype"]] if item["dtype"] not in dtypes else []
    return [("all ops" if len(ops) == len(COLLECTIVES) else ", ".join(ops))
            + f" on {', '.join(dtypes)}: {reason}" for reason, (ops, dtypes) in by_reason.items()]


def failure_reasons(convergence: dict) -> list[str]:
    """Human-readable reasons the convergence record fails its checks (empty when it passes)."""
    reasons = []
    if not math.isfinite(convergence["final_loss"]):
        reasons.append(f"final loss is {convergence['final_loss']}")
    if not convergence["loss_fell"]:
        reasons.append(f"loss did not fall: {convergence['initial_loss']:.4f} -> "
                       f"{convergence['final_loss']:.4f}")
    if not convergence["below_threshold"]:
        reasons.append(f"final loss {convergence['final_loss']:.4f} not below threshold "
                       f"{convergence['threshold']}")
    if not convergence["params_identical"]:
        distinct = len(set(convergence["param_hashes"]))
        reasons.append(f"parameters differ between ranks: {distinct} distinct sha256 digests "
                       f"on {len(convergence['param_hashes'])} ranks")
    return reasons


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


class Report:
    """JSON lines (one object per record) and a stderr summary, written by rank 0 only.

    Args:
        enabled: True on rank 0.
        path: JSON-lines file to write (truncated), or None for stdout.
    """

    def __init__(self, enabled: bool, path: Optional[str]) -> None:
        self.enabled = enabled
        self.stream: Optional[TextIO] = None
        if enabled:
            self.stream = open(path, "w", encoding="utf-8") if path else sys.stdout

    def record(self, kind: str, **fields) -> None:
        """Write ``{"record": kind, **fields}`` as one line."""
        if self.enabled:
            self.stream.write(json.dumps({"record": kind, **fields}, sort_keys=False) + "\n")
            self.stream.flush()

    def say(self, text: str) -> None:
        """One line of the human-readable summary on stderr."""
        if self.enabled:
            print(f"{SCRIPT_NAME}: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.stream is not None and self.stream is not sys.stdout:
            self.stream.close()


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None ones (model-dependent; their help text says)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Parse the command line; fill the model-dependent defaults (image size, classes).

    Defaults suit a 2-core CPU node (``tiny``, 32x32 images, batch 16 per rank, 100 convergence
    steps): 2 ranks finish in a few seconds. For a GPU node use e.g. ``--model resnet50
    --batch-size 32``, which takes Horovod's benchmark settings (224x224 images, 1000 classes)
    and 300 convergence steps.
    """
    parser = argparse.ArgumentParser(
        prog=SCRIPT_NAME, formatter_class=_HelpFormatter,
        description="Synthetic training benchmark (after " + METHOD_SOURCE + ") and "
                    "convergence check for Horovod or PyTorch DDP on N ranks.")
    add = parser.add_argument
    add("--backend", choices=["horovod", "ddp"], default="horovod",
        help="distributed backend: horovod (hvd.DistributedOptimizer) or ddp "
             "(torch DistributedDataParallel, NCCL on CUDA, Gloo on CPU)")
    add("--model", default=TINY_MODEL,
        help=f"'{TINY_MODEL}' (small CNN for CPUs) or a torchvision model name, e.g. resnet50: "
             f"synthetic benchmark and convergence check; '{DIGITS_MODEL}': a small CNN trained "
             "on scikit-learn's bundled 8x8 handwritten digits (real images), judged on its "
             "test accuracy (--epochs, --lr, --accuracy-threshold)")
    add("--image-size", type=_positive, default=None,
        help=f"image side in pixels (default {TINY_IMAGE_SIZE} for {TINY_MODEL}, "
             f"{TORCHVISION_IMAGE_SIZE} otherwise)")
    add("--num-classes", type=_positive, default=None,
        help=f"classes of the benchmark model (default {TINY_NUM_CLASSES} for {TINY_MODEL}, "
             f"{TORCHVISION_NUM_CLASSES} otherwise, as in Horovod's benchmark)")
    add("--batch-size", type=_positive, default=16, help="images per batch per rank")
    add("--num-warmup-batches", type=int, default=10,
        help="untimed batches before the benchmark")
    add("--num-batches-per-iter", type=_positive, default=10,
        help="batches per timed iteration")
    add("--num-iters", type=_positive, default=10, help="timed iterations")
    add("--precision", choices=["fp32", "amp"], default="fp32",
        help="amp: autocast float16 + GradScaler on CUDA, bfloat16 on CPU")
    add("--channels-last", action="store_true",
        help="batches (and, with ddp, the model) in channels-last (NHWC) memory format, what "
             "tensor cores take for convolutions; advised with --precision amp on GPUs")
    add("--device", choices=["auto", "cpu", "cuda"], default="auto",
        help="auto: CUDA (GPU = local rank) when available, else CPU")
    add("--threads", type=int, default=0,
        help="torch intra-op threads per rank; 0: max(1, cores // ranks per node), capped by "
             "the cores the rank is bound to")
    add("--convergence-steps", type=_positive, default=None,
        help=f"training steps of the convergence check (default {TINY_CONVERGENCE_STEPS} for "
             f"{TINY_MODEL}, {TORCHVISION_CONVERGENCE_STEPS} otherwise)")
    add("--convergence-classes", type=_positive, default=10,
        help="classes of the synthetic teacher task")
    add("--convergence-lr", type=float, default=0.01,
        help="SGD learning rate (momentum 0.9) of the convergence check, not scaled by ranks")
    add("--loss-threshold", type=float, default=1.0,
        help="the mean held-out cross-entropy (nats) must end below this; it starts near "
             "ln(classes) = 2.30 for 10 classes, and predicting the label frequencies alone "
             "gives about 1.7 (baseline_loss in the record)")
    add("--epochs", type=_positive, default=20,
        help=f"--model {DIGITS_MODEL}: training epochs over the training set (sharded by rank)")
    add("--lr", type=float, default=0.01,
        help=f"--model {DIGITS_MODEL}: SGD learning rate (momentum 0.9) per rank; the optimizer "
             "uses lr x ranks, as the global batch grows with the ranks")
    add("--accuracy-threshold", type=float, default=0.95,
        help=f"--model {DIGITS_MODEL}: the test accuracy (fraction of the 359 held-out images "
             "classified right, on every rank) must reach this")
    add("--output", default=None,
        help="JSON-lines file written by rank 0 (default: stdout of rank 0)")
    add("--seed", type=int, default=42, help="seed of models, data and teacher")
    add("--inject-param-mismatch", action="store_true",
        help="testing aid: the last rank perturbs a parameter before hashing, so the "
             "identical-parameters check must fail")
    add("--no-collectives-check", dest="collectives_check", action="store_false",
        help="skip the collectives check (exact results of allreduce, allgather, broadcast, "
             "alltoall and reducescatter, run before training), e.g. for benchmarking alone")
    add("--inject-collective-mismatch", action="store_true",
        help="testing aid: the last rank's result of one collective (%s %s size %d) gets one "
             "wrong element, so the collectives check must fail" % INJECT_AT)
    args = parser.parse_args(argv)
    if args.num_warmup_batches < 0:
        parser.error("--num-warmup-batches must be >= 0")
    if args.threads < 0:
        parser.error("--threads must be >= 0")
    if not 0 <= args.accuracy_threshold <= 1:
        parser.error("--accuracy-threshold must be between 0 and 1")
    if args.model == DIGITS_MODEL:
        if args.image_size not in (None, DIGITS_IMAGE_SIZE):
            parser.error(f"--model {DIGITS_MODEL} trains on {DIGITS_IMAGE_SIZE}x{DIGITS_IMAGE_SIZE} "
                         f"images; --image-size {args.image_size} does not apply")
        args.image_size, args.num_classes = DIGITS_IMAGE_SIZE, DIGITS_CLASSES
    tiny = args.model == TINY_MODEL
    if args.image_size is None:
        args.image_size = TINY_IMAGE_SIZE if tiny else TORCHVISION_IMAGE_SIZE
    if args.num_classes is None:
        args.num_classes = TINY_NUM_CLASSES if tiny else TORCHVISION_NUM_CLASSES
    if args.convergence_steps is None:
        args.convergence_steps = TINY_CONVERGENCE_STEPS if tiny else TORCHVISION_CONVERGENCE_STEPS
    return args


def _versions(comm: Comm) -> dict:
    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import torchvision
        versions["torchvision"] = torchvision.__version__
    except ImportError:
        versions["torchvision"] = None
    versions["horovod"] = getattr(comm, "version", None) if comm.name == "horovod" else None
    return versions


def report_throughput(comm: Comm, report: Report, img_secs: Sequence[float], batch_size: int,
                      kind: str) -> None:
    """Gather every rank's img/s per iteration; write the ``throughput`` (one per rank) and
    ``throughput_total`` records and their summary lines."""
    gathered = comm.allgather(torch.tensor(img_secs, dtype=torch.float64), "benchmark.img_secs")
    per_rank = []
    for rank, row in enumerate(gathered.tolist()):
        mean, ci95 = mean_ci95(row)
        per_rank.append((mean, ci95))
        report.record("throughput", rank=rank, img_per_sec_mean=mean, img_per_sec_ci95=ci95,
                      img_per_sec_iters=row, batch_size=batch_size, unit="img/s")
    total = sum(mean for mean, _ in per_rank)
    total_ci95 = sum(ci95 for _, ci95 in per_rank)
    report.record("throughput_total", img_per_sec=total, img_per_sec_ci95=total_ci95,
                  img_per_sec_per_rank=total / comm.size, world_size=comm.size, unit="img/s")
    report.say(f"Img/sec per {kind}: {per_rank[0][0]:.1f} +-{per_rank[0][1]:.1f} (rank 0); "
               + ", ".join(f"rank {r}: {m:.1f}" for r, (m, _) in enumerate(per_rank)))
    report.say(f"Total img/sec on {comm.size} {kind}(s): {total:.1f} +-{total_ci95:.1f}")


def report_startup(comm: Comm, report: Report) -> None:
    """Gather every rank's start-up seconds (:data:`STARTUP`) and write one ``startup`` record
    per rank: ``imports_s`` (process start to imports done) and ``first_step_s`` (to the end
    of the first training step); -1 where a point was not reached."""
    start = STARTUP["process_start"]
    mine = [(STARTUP[key] - start) if STARTUP[key] is not None else -1.0
            for key in ("imports_done", "first_step")]
    gathered = comm.allgather(torch.tensor(mine, dtype=torch.float64), "startup.seconds")
    for rank, (imports, first) in enumerate(gathered.reshape(-1, 2).tolist()):
        report.record("startup", rank=rank, imports_s=imports if imports >= 0 else None,
                      first_step_s=first if first >= 0 else None, unit="s")


def run_phases(comm: Comm, args: argparse.Namespace, report: Report, threads: int,
               started: float) -> int:
    """Write the config record, run both phases, write their records; return 0 or 1."""
    kind = "GPU" if comm.device.type == "cuda" else "CPU"
    report.record(
        "config", tool=SCRIPT_NAME, tool_version=SCRIPT_VERSION, method=METHOD_SOURCE,
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        backend=comm.name, transport=comm.transport, launcher=comm.launcher,
        world_size=comm.size, local_size=comm.local_size, device=kind.lower(),
        device_name=(torch.cuda.get_device_name(comm.device) if kind == "GPU" else None),
        threads_per_rank=threads, model=args.model, image_size=args.image_size,
        num_classes=args.num_classes, batch_size=args.batch_size,
        num_warmup_batches=args.num_warmup_batches,
        num_batches_per_iter=args.num_batches_per_iter, num_iters=args.num_iters,
        precision=args.precision, convergence_steps=args.convergence_steps,
        epochs=args.epochs, lr=args.lr, accuracy_threshold=args.accuracy_threshold,
        convergence_classes=args.convergence_classes, convergence_lr=args.convergence_lr,
        loss_threshold=args.loss_threshold, seed=args.seed, versions=_versions(comm))
    report.say(f"backend {comm.name} ({comm.transport}), {comm.size} {kind} rank(s), "
               f"model {args.model}, batch {args.batch_size}, {args.image_size}px, "
               f"{args.precision}, {threads} thread(s) per rank")

    collectives = None
    if args.collectives_check:
        collectives = CollectivesCheck(comm, inject=args.inject_collective_mismatch).run()
        report.record("collectives", **collectives)
        report.say(collectives_summary(collectives))

    if args.model == DIGITS_MODEL:
        img_secs, classifier = run_digits(comm, args)
        report_throughput(comm, report, img_secs, args.batch_size, kind)
        report.record("classifier", **classifier)
        report.say(f"digits: test accuracy {classifier['test_accuracy']:.4f} (threshold "
                   f"{classifier['threshold']}) on {classifier['test_images']} test images after "
                   f"{classifier['epochs']} epochs of {classifier['train_images']} training images "
                   f"over {comm.size} rank(s), lr {classifier['lr']:g}, "
                   f"{classifier['seconds']:.1f} s; parameters "
                   + ("identical" if classifier["params_identical"] else "DIFFER"))
        reasons = classifier_reasons(classifier)
    else:
        img_secs = run_benchmark(comm, args)
        report_throughput(comm, report, img_secs, args.batch_size, kind)
        convergence = run_convergence(comm, args)
        report.record("convergence", **convergence)
        report.say(f"convergence: loss {convergence['initial_loss']:.4f} -> "
                   f"{convergence['final_loss']:.4f} (threshold {args.loss_threshold}) in "
                   f"{args.convergence_steps} steps, {convergence['seconds']:.1f} s; parameters "
                   + ("identical" if convergence["params_identical"] else "DIFFER")
                   + f" on {comm.size} rank(s) (sha256 {convergence['param_hashes'][0][:16]}...)")
        if args.loss_threshold >= convergence["baseline_loss"]:
            report.say(f"warning: threshold {args.loss_threshold} is not below the loss of "
                       f"predicting the label frequencies ({convergence['baseline_loss']:.4f}): "
                       "passing it does not show that the model learnt from its input")
        reasons = failure_reasons(convergence)
    if collectives is not None and not collectives["ok"]:
        reasons.insert(0, f"collectives check: {collectives['failed_checks']} wrong result(s): "
                          + "; ".join(collectives["failures"]))
    report_startup(comm, report)
    wall = time.perf_counter() - started
    report.record("result", ok=not reasons, reasons=reasons, wall_seconds=wall)
    report.say(f"result: OK in {wall:.1f} s" if not reasons
               else "result: FAILED: " + "; ".join(reasons))
    return 1 if reasons else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run both phases and report; return the exit status (0 ok, 1 checks failed, 2 usage).

    After an error inside the phases the process ends at once with ``os._exit`` (status 2 for a
    UsageError, 1 otherwise) instead of shutting the backend down: the other ranks may be waiting
    in a collective, and the launcher ends them when one rank exits.
    """
    started = time.perf_counter()
    args = parse_args(argv)
    try:
        check_model_name(args.model)
        comm = open_comm(args.backend, args.device)
        STARTUP["imports_done"] = time.time()
    except UsageError as err:
        print(f"{SCRIPT_NAME}: error: {err}", file=sys.stderr)
        return 2
    threads = args.threads or threads_per_rank(comm.local_size)
    torch.set_num_threads(threads)
    if comm.device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    report = Report(comm.rank == 0, args.output)
    try:
        status = run_phases(comm, args, report, threads, started)
    except UsageError as err:
        report.say(f"error: {err}")
        status = 2
    except Exception:  # noqa: BLE001 - report, then leave without waiting for the peers
        print(f"{SCRIPT_NAME}: rank {comm.rank} failed:\n{traceback.format_exc()}",
              file=sys.stderr)
        status = 1
    else:
        report.close()
        comm.shutdown()
        return status
    report.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
