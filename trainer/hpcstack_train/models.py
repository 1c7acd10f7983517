"""The models the trainer trains, and one training step: ``tiny`` (a small CNN for CPUs),
``digits`` (a small CNN for 8x8 images) or any torchvision classification model; memory format,
mixed precision, evaluation with batch statistics and the digest of the parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import time
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import UsageError
from .timing import STARTUP, synchronize

if TYPE_CHECKING:
    from .backends import Comm

#: The default model: a small CNN for CPUs.
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
    NVIDIA's deep learning performance guide advise it with AMP."""
    if not channels_last:
        return value
    if isinstance(value, torch.Tensor):
        return value.contiguous(memory_format=torch.channels_last) if value.dim() == 4 else value
    return value.to(memory_format=torch.channels_last)


#: The one rule of what every backend trains (plain, DDP, Horovod alike): the same model, built
#: from the same seed; the same batch per rank; the same precision (``--precision``); the same
#: memory format: with ``--channels-last`` the model's parameters *and* every batch are
#: channels-last (NHWC), for every backend. No backend decides any of these; the backends only
#: differ in how gradients are averaged (none, DDP's buckets, Horovod's fused allreduce).
SETUP_RULE = ("model, batch, precision and memory format come from the command line alone, "
              "the same for every backend; --channels-last puts model and batches in NHWC")


@dataclasses.dataclass(frozen=True)
class TrainingSetup:
    """What one rank trains, the same for every backend (:data:`SETUP_RULE`).

    Attributes:
        model (str): model name (``tiny``, ``digits`` or a torchvision name).
        num_classes (int): outputs of the model.
        image_size (int): image side in pixels.
        batch_size (int): images per batch per rank.
        precision (str): ``fp32`` or ``amp``.
        channels_last (bool): model parameters and batches in channels-last memory format.
    """

    model: str
    num_classes: int
    image_size: int
    batch_size: int
    precision: str
    channels_last: bool


def training_setup(args: argparse.Namespace, num_classes: int | None = None,
                   model: str | None = None) -> TrainingSetup:
    """The :class:`TrainingSetup` of a phase, from the parsed command line alone.

    The backend is deliberately not an argument (:data:`SETUP_RULE`): before this rule, with
    ``--channels-last`` DDP trained a channels-last model and Horovod a contiguous one (Horovod
    refuses non-contiguous tensors, which :class:`~hpcstack_train.backends.HorovodComm` now
    handles), so the two did not run the same computation.

    Args:
        args: parsed command line (model, num_classes, image_size, batch_size, precision,
            channels_last).
        num_classes: the phase's classes when not ``args.num_classes`` (convergence, digits).
        model: the phase's model when not ``args.model`` (digits).
    """
    return TrainingSetup(model=model or args.model,
                         num_classes=num_classes or args.num_classes,
                         image_size=args.image_size, batch_size=args.batch_size,
                         precision=args.precision, channels_last=bool(args.channels_last))


def memory_format_of(tensor: torch.Tensor) -> str:
    """``channels_last`` for a 4-D tensor in NHWC layout (and not also plain contiguous, as
    tensors with a unit dimension can be), ``contiguous`` for NCHW/row-major, else ``strided``."""
    if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last) \
            and not tensor.is_contiguous():
        return "channels_last"
    return "contiguous" if tensor.is_contiguous() else "strided"


def build_for(setup: TrainingSetup) -> nn.Module:
    """The setup's model, randomly initialised (seed the generator first), in its memory format."""
    return in_memory_format(build_model(setup.model, setup.num_classes), setup.channels_last)


class SetupProbe:
    """What a backend's training step really ran, seen from inside the model's first forward.

    A forward hook on the plain module records the dtype of the logits (bfloat16/float16 under
    AMP), the batch's memory format and size as the model received them; :meth:`fields` adds
    the memory format of the 4-D parameters and their gradients after the step. The
    ``throughput_total`` record carries these fields, so that runs of different backends can be
    compared (tests/test_train_benchmark.py does).

    Args:
        module (nn.Module): the plain model (``comm.unwrap(model)``), before the first step.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.seen: dict = {}
        self._handle = module.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        batch = inputs[0]
        self.seen = {"batch_shape": list(batch.shape), "batch_memory_format": memory_format_of(batch),
                     "logits_dtype": str(logits_of(output).dtype).replace("torch.", "")}
        self._handle.remove()

    def fields(self) -> dict:
        """``model``-independent fields: batch_shape, batch_memory_format, logits_dtype,
        param_memory_formats and grad_memory_formats (sorted sets over the 4-D parameters),
        param_dtype, parameters (count)."""
        params = list(self.module.parameters())
        four = [p for p in params if p.dim() == 4]
        return {**self.seen,
                "param_memory_formats": sorted({memory_format_of(p) for p in four}),
                "grad_memory_formats": sorted({memory_format_of(p.grad) for p in four
                                               if p.grad is not None}),
                "param_dtype": str(params[0].dtype).replace("torch.", "") if params else None,
                "parameters": sum(p.numel() for p in params)}


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
            synchronize(comm.device)
            STARTUP["first_step"] = time.time()
        return loss

    return step


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
