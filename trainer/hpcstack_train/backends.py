"""The distributed backends behind one interface (:class:`Comm`): Horovod (``horovod.torch``,
imported only when ``--backend horovod`` asks for it, so that a stack without Horovod runs
``--backend ddp``), ``torch.distributed`` with DistributedDataParallel (NCCL on CUDA, Gloo on
the CPU), and the plain loop (one process, no wrapper), the reference of both.
"""

from __future__ import annotations

import gc
import os
import sys
import weakref
from typing import Callable, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from . import PROGRAM
from .errors import UsageError
from .launch import GpuChoice, LaunchEnv, choose_gpu, resolve_launch_env

#: DistributedDataParallel's options the trainer sets (``--ddp NAME=VALUE``), with its defaults.
#: broadcast_buffers False: Horovod does not synchronise buffers after the first broadcast
#: either (parameter_digest leaves them out), so both backends run the same computation;
#: the other defaults are measured in docs/benchmarks.md ("DDP against a plain loop and
#: Horovod"); torch's own defaults are bucket view False, static graph False, 25 MB buckets.
#: ``single_rank_hook`` is the trainer's own, not DistributedDataParallel's: at world size 1 a
#: communication hook (:func:`_identity_hook`) hands each bucket back as it is, since an
#: allreduce over one rank and its division by 1 leave every gradient bit for bit unchanged.
DDP_DEFAULTS = {"gradient_as_bucket_view": True, "broadcast_buffers": False, "static_graph": False,
                "bucket_cap_mb": 25.0, "single_rank_hook": True}


def ddp_options(items: Sequence[str]) -> dict:
    """:data:`DDP_DEFAULTS` updated by ``NAME=VALUE`` items (``true``/``false`` for the flags,
    a positive number of MB for ``bucket_cap_mb``).

    Raises:
        ValueError: an unknown name or a value of the wrong kind (one line naming it).
    """
    options = dict(DDP_DEFAULTS)
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in DDP_DEFAULTS:
            raise ValueError(f"{item!r}: expected NAME=VALUE with NAME one of {', '.join(DDP_DEFAULTS)}")
        if isinstance(DDP_DEFAULTS[name], bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{item!r}: {name} takes true or false")
            options[name] = value.lower() in ("true", "1")
        else:
            try:
                options[name] = float(value)
            except ValueError:
                options[name] = -1.0
            if not options[name] > 0:
                raise ValueError(f"{item!r}: {name} takes a positive number")
    return options


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

    def shutdown(self) -> bool:
        """Release the backend at the end of a run that every rank finished.

        Returns:
            bool: True when nothing of the backend is left running (its threads ended), so the
            interpreter may end the normal way; False when something is (the caller then ends
            the process with ``os._exit`` after flushing its output, see :func:`.cli.main`).
        """
        return True

    def abort(self) -> bool:
        """Release the backend after an error on this rank, without waiting for the others
        (they may be waiting in a collective that this rank never joins).

        Returns:
            bool: as :meth:`shutdown`.
        """
        return True


class HorovodComm(Comm):
    """Horovod: ``hvd.init()``, ``hvd.DistributedOptimizer``, parameter/optimizer broadcast.

    Under ``horovodrun``, ``mpirun`` or ``srun``. With CUDA each rank pins the GPU of its local
    rank, as Horovod's examples do, or its one bound GPU (:func:`pick_device`); ``--device auto``
    stays on the CPU when Horovod was built without GPU support.
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
        self.device = pick_device(device_request if gpu_build else "cpu", self.local_rank,
                                  self.local_size)
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
        """As Horovod's examples, for models in any memory format: Horovod 0.28.1 refuses
        non-contiguous tensors ("Tensor is required to be contiguous", horovod/torch/mpi_ops.py),
        and a channels-last convolution weight and its gradient are not contiguous; so those
        travel as contiguous copies and come back in their own layout (_LayoutKeeper), as DDP
        copies gradients into and out of its buckets."""
        hvd = self.hvd
        model.to(self.device)
        optimizer = hvd.DistributedOptimizer(make_optimizer(list(model.parameters())),
                                             named_parameters=model.named_parameters(),
                                             compression=_LayoutKeeper, op=hvd.Average)
        state = model.state_dict()
        copies = {name: tensor.contiguous() for name, tensor in state.items()}
        hvd.broadcast_parameters(copies, root_rank=0)
        with torch.no_grad():
            for name, tensor in state.items():
                if copies[name] is not tensor:
                    tensor.copy_(copies[name])
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
        return True

    def abort(self):
        # hvd.shutdown() coordinates with the other ranks' background threads, which may be
        # waiting in a collective: after an error the process ends without it (os._exit)
        return False


class _LayoutKeeper:
    """A Horovod ``Compression`` that changes no value: a gradient that is not contiguous (a
    channels-last convolution weight's) is reduced as a contiguous copy, and the result is copied
    back into the gradient, which keeps its layout; contiguous gradients go as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.is_contiguous():
            return tensor, None
        return tensor.contiguous(), tensor

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is None:
            return tensor
        ctx.copy_(tensor)
        return ctx


class PlainComm(Comm):
    """One process and no wrapper: the model and the optimizer as they are, world size 1.

    The reference the distributed backends are measured against (the same model, batch,
    precision and memory format; models.SETUP_RULE). Its collectives are those of a world of
    one (each result is the input), so the collectives check runs and must pass.

    Raises:
        UsageError: the launcher started more than one rank (``--backend plain`` is one process).
    """

    name = "plain"

    def __init__(self, device_request: str, environ: Mapping[str, str] = os.environ) -> None:
        super().__init__()
        self.version = torch.__version__
        try:
            launch = resolve_launch_env(environ)
        except UsageError:
            launch = None  # no launcher (one process, as it should be), or no rendezvous
        sizes = [launch.world_size] if launch is not None else []
        sizes += [int(environ[name]) for name in ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "PMI_SIZE")
                  if environ.get(name, "").isdigit()]
        if max(sizes, default=1) > 1:
            raise UsageError(f"--backend plain runs one process; the launcher started "
                             f"{max(sizes)} ranks (use --backend ddp or horovod)")
        self.launcher = launch.launcher if launch is not None else "none"
        self.device = pick_device(device_request, 0, 1, environ)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    def prepare(self, model, make_optimizer):
        model.to(self.device)
        return model, make_optimizer(list(model.parameters()))

    def allgather(self, tensor, name):
        return tensor.detach().cpu().unsqueeze(0)

    def allreduce_mean(self, tensor, name):
        return tensor.detach().cpu().clone()

    def lacks(self, collective, dtype):
        return None

    def c_allreduce(self, tensors, op, name):
        return [t.clone() for t in tensors]

    def c_allgather(self, tensor, counts, name):
        return tensor.clone()

    def c_broadcast(self, tensor, root, name):
        return tensor.clone()

    def c_alltoall(self, tensor, send, receive, name):
        return tensor.clone()

    def c_reducescatter(self, tensor, op, name):
        return tensor.clone()


class DdpComm(Comm):
    """``torch.distributed`` with DistributedDataParallel: NCCL on CUDA, Gloo on CPU.

    Rank and rendezvous come from torchrun, Open MPI or Slurm variables (resolve_launch_env).
    ``options`` are DistributedDataParallel's keyword arguments (:data:`DDP_DEFAULTS`).
    """

    name = "ddp"
    #: reduce_scatter_tensor splits the first dimension into equal parts
    equal_reducescatter = True

    def __init__(self, device_request: str, launch: LaunchEnv,
                 options: Optional[Mapping[str, object]] = None) -> None:
        super().__init__()
        import torch.distributed as dist
        self.options = dict(DDP_DEFAULTS if options is None else options)
        self.dist = dist
        self.version = torch.__version__
        self.rank, self.size = launch.rank, launch.world_size
        self.local_rank, self.local_size = launch.local_rank, launch.local_size
        self.launcher = launch.launcher
        self.device = pick_device(device_request, self.local_rank, self.local_size)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.transport = "nccl" if self.device.type == "cuda" else "gloo"
        # Tensors handed to collectives, held until shutdown: with torch 2.3 a Gloo worker thread
        # that drops the last reference to a Python-owned tensor needs the GIL, which
        # destroy_process_group() holds while it joins that thread (a deadlock at exit).
        self._keep_alive: list[torch.Tensor] = []
        # Before the process group exists: torch.distributed.nn.functional binds
        # ``group=group.WORLD`` as default arguments of its ten collectives when it is first
        # imported. With torch 2.14 DistributedDataParallel's constructor imports it (through
        # torch._dynamo, torch.distributed.fsdp and torch.distributed._shard), after
        # init_process_group: those defaults then hold the default group, destroy_process_group()
        # does not free it, and its threads (Gloo's workers and TCP loop, rank 0's TCPStore
        # server) run on into the interpreter's exit. Imported now, the defaults are None.
        _import_before_the_group()
        os.environ["MASTER_ADDR"] = launch.master_addr
        os.environ["MASTER_PORT"] = str(launch.master_port)
        dist.init_process_group(self.transport, init_method="env://",
                                rank=self.rank, world_size=self.size)
        # to tell after destroy_process_group() whether anything still holds the group
        self._group = _weak(dist.group.WORLD)

    def prepare(self, model, make_optimizer):
        from torch.nn.parallel import DistributedDataParallel
        model.to(self.device)
        options = dict(self.options)
        single_rank_hook = options.pop("single_rank_hook", True)
        # DDP broadcasts rank 0's parameters and buffers when it wraps the model.
        wrapped = DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            **options)
        if single_rank_hook and self.size == 1:
            wrapped.register_comm_hook(None, _identity_hook)
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
        self._keep_alive += outputs
        works = [self.dist.all_reduce(t, op=self._op(op), async_op=True) for t in outputs]
        # every work waited for, even after one failed: none is left in flight on an error
        failures = []
        for work in works:
            try:
                work.wait()
            except RuntimeError as err:  # torch.distributed's DistError is a RuntimeError
                failures.append(err)
        if failures:
            raise failures[0]
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
        """A final barrier, then :meth:`abort`'s release of the process group.

        The barrier waits without the GIL, so Gloo's workers can finish their last work items.
        """
        if self.dist.is_initialized():
            if self.device.type == "cuda":
                self.dist.barrier(device_ids=[self.device.index])
            else:
                self.dist.barrier()
        return self.abort()

    def abort(self):
        """Destroy the process group (no barrier: after an error the other ranks may be waiting
        in a collective; they see this rank's connections close) and check that it is gone.

        Returns:
            bool: True when nothing holds the group any more, so that its C++ threads (Gloo's
            workers and TCP loop, rank 0's TCPStore server; NCCL's watchdog) were joined here;
            False, with one line on stderr naming the threads left, when something still does.
        """
        # DDP models of the phases that a reference cycle keeps alive hold the group too
        gc.collect()
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
        self._keep_alive.clear()
        gc.collect()
        if self._group is not None and self._group() is not None:
            left = ", ".join(process_group_threads()) or "none named"
            print(f"{PROGRAM}: warning: rank {self.rank}: the process group "
                  f"outlived destroy_process_group(): something still references it (threads: "
                  f"{left}); the process ends without the interpreter's teardown",
                  file=sys.stderr, flush=True)
            return False
        return True


def _identity_hook(_state, bucket):  # no annotations: DDP checks them against the real types
    """DistributedDataParallel's communication hook for a world of one rank: the bucket's
    gradients as they are, in a completed future (what DDP's own allreduce-and-divide gives at
    world size 1, without the Gloo or NCCL call and the division; torch's
    ``ddp_comm_hooks.debugging_hooks.noop_hook`` does the same for headroom analysis).

    Args:
        _state: unused (DDP passes the state given to ``register_comm_hook``).
        bucket (torch.distributed.GradBucket): the flattened gradients of one bucket.

    Returns:
        torch.futures.Future[torch.Tensor]: done, holding ``bucket.buffer()``.
    """
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def _import_before_the_group() -> None:
    """Import ``torch.distributed.nn`` (see :class:`DdpComm`): its collectives' default group is
    bound when the module is first imported, None while no process group exists."""
    try:
        import torch.distributed.nn  # noqa: F401
    except ImportError:
        pass  # a torch without it: nothing there to bind the group either


def _weak(group) -> Optional[weakref.ref]:
    """A weak reference to ``group`` (a torch ProcessGroup); None where the type has none."""
    try:
        return weakref.ref(group)
    except TypeError:
        return None


#: Prefixes of the names torch gives the threads of a process group and its store
#: (``pt_gloo_runloop``, ``gloo_tcp_loop``, ``pt_tcpstore_uv``, ``pt_nccl_watchdg``, ...).
PROCESS_GROUP_THREADS = ("pt_gloo", "gloo", "pt_tcpstore", "pt_nccl")


def process_group_threads(task_dir: str = "/proc/self/task") -> list[str]:
    """Names of this process's threads that a torch process group or its store started, read
    from ``/proc/self/task/*/comm`` (Linux; elsewhere an empty list).

    Args:
        task_dir (str): the process's task directory (tests pass another).

    Returns:
        list[str]: the thread names that start with one of :data:`PROCESS_GROUP_THREADS`, sorted.
    """
    names = []
    try:
        tasks = os.listdir(task_dir)
    except OSError:
        return []
    for task in tasks:
        try:
            with open(os.path.join(task_dir, task, "comm")) as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended meanwhile
        if name.startswith(PROCESS_GROUP_THREADS):
            names.append(name)
    return sorted(names)


def _call(module, function: str) -> bool:
    """``module.function()`` if Horovod has it (builds differ), else False."""
    found = getattr(module, function, None)
    return bool(found()) if callable(found) else False


def pick_device(request: str, local_rank: int, local_size: int = 1,
                environ: Mapping[str, str] = os.environ) -> torch.device:
    """The device for this rank: ``auto`` means CUDA when available, else CPU.

    The GPU follows :func:`~hpcstack_train.launch.choose_gpu` (the rule the per-rank ``gpu``
    record reports): ``cuda:<local_rank>`` when every rank of the node sees all its GPUs
    (``--gres=gpu:4``, ``--gpus-per-node=4``), ``cuda:0`` when Slurm bound the task's own GPU
    (``--gpus-per-task=1``), and an error when the node has more ranks than visible GPUs.

    Args:
        request (str): ``auto``, ``cpu`` or ``cuda``.
        local_rank (int): rank on this node.
        local_size (int): ranks on this node.
        environ (Mapping[str, str]): the environment (``CUDA_VISIBLE_DEVICES``,
            ``SLURM_GPUS_PER_TASK``).

    Raises:
        UsageError: ``cuda`` requested but torch sees no GPU; or this rank has no GPU of its own
            (one line naming the local rank and ``CUDA_VISIBLE_DEVICES``).
    """
    if request == "cpu" or (request == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UsageError("--device cuda requested but torch.cuda.is_available() is False")
    choice = choose_gpu(local_rank, local_size, environ, torch.cuda.device_count())
    if choice.problem:
        raise UsageError(choice.problem)
    return torch.device("cuda", choice.index)


def gpu_choice(comm: Comm, environ: Mapping[str, str] = os.environ) -> GpuChoice:
    """What GPU this rank uses, or would use given its node's GPUs (on a CPU-only node, from
    ``CUDA_VISIBLE_DEVICES`` alone): :func:`~hpcstack_train.launch.choose_gpu` with torch's device
    count where CUDA is available."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else None
    return choose_gpu(comm.local_rank, comm.local_size, environ, count)


def open_comm(backend: str, device_request: str,
              environ: Mapping[str, str] = os.environ,
              ddp: Optional[Mapping[str, object]] = None) -> Comm:
    """Initialise the requested backend (``horovod``, ``ddp`` or ``plain``) and return its Comm.

    ``ddp``: DistributedDataParallel's options (:func:`ddp_options`), for ``ddp`` only.

    Raises:
        UsageError: the backend cannot start (no launcher for ddp, plain under several ranks,
            horovod missing, no GPU where one was asked for).
    """
    if backend == "horovod":
        return HorovodComm(device_request)
    if backend == "plain":
        return PlainComm(device_request, environ)
    return DdpComm(device_request, resolve_launch_env(environ), ddp)


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
