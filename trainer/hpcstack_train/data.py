"""The trainer's data: seeds derived from ``--seed``, the synthetic teacher task of the
convergence check, and scikit-learn's bundled 8x8 digits for ``--model digits``.
"""

from __future__ import annotations

import hashlib

import torch

from .errors import UsageError
from .models import DIGITS_MODEL

#: The share of the digits held out as the test set (359 of 1,797 images).
DIGITS_TEST_FRACTION = 0.2


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
