"""The models the trainer trains, and one training step: ``tiny`` (a small CNN for CPUs),
``digits`` (a small CNN for 8x8 images) or any torchvision classification model; memory format,
mixed precision, evaluation with batch statistics and the digest of the parameters.
"""

from __future__ import annotations

import argparse
import contextlib
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
