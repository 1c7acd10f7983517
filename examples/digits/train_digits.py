#!/usr/bin/env python3
"""Train a small CNN on handwritten digits with Horovod: on CPUs first, then on GPUs, unchanged.

A copy-and-adapt example for the pytorch/2.3.1-gpu stack (``module load pytorch/2.3.1-gpu``
provides torch, Horovod and scikit-learn). The images are scikit-learn's bundled 8x8 handwritten
digits (1,797 images, 10 classes): ``load_digits()`` reads the copy inside the package, nothing
is downloaded, so it runs on compute nodes without internet access.

What makes it distributed, Horovod's usual five steps:

1. ``hvd.init()``; on GPUs, one GPU per rank (``hvd.local_rank()``);
2. every rank holds the same train/test split (a fixed seed) and trains on its own shard of the
   training set (every ``hvd.size()``-th image from ``hvd.rank()`` on);
3. the learning rate is scaled by ``hvd.size()`` (the global batch grows with the ranks);
4. ``hvd.DistributedOptimizer`` averages the gradients across ranks at every step;
5. rank 0's initial parameters and optimizer state are broadcast to all ranks.

At the end every rank classifies the whole test set; rank 0 prints the accuracy, and the program
exits 1 when it is below ``--accuracy-threshold``.

Run it (2 ranks on this machine; as root Open MPI also needs OMPI_ALLOW_RUN_AS_ROOT=1 and
OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)::

    module load pytorch/2.3.1-gpu
    horovodrun -np 2 -H localhost:2 python train_digits.py               # CPUs
    srun python train_digits.py --device cuda                            # GPUs, in a Slurm job

The same model, data and settings are the ``digits`` workload of ``hpcstack validate --workload
digits``, which runs them with Horovod and with PyTorch DDP through the stack's
``hpcstack-train-benchmark --model digits``.
"""

import argparse
import sys
import time

import horovod.torch as hvd
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: one GPU per rank (the rank's local rank)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    parser.add_argument("--batch-size", type=int, default=32, help="images per step per rank")
    parser.add_argument("--lr", type=float, default=0.01,
                        help="learning rate per rank; SGD uses lr x ranks")
    parser.add_argument("--accuracy-threshold", type=float, default=0.95,
                        help="exit 1 when the test accuracy is below this")
    parser.add_argument("--seed", type=int, default=42, help="split, shuffles and initial weights")
    return parser.parse_args()


def digits_split(seed):
    """The same 80/20 train/test split on every rank: images N x 1 x 8 x 8 in [0, 1]."""
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    test, train = order[:len(labels) // 5], order[len(labels) // 5:]
    return images[train], labels[train], images[test], labels[test]


class DigitsNet(nn.Module):
    """1 x 8 x 8 -> two 3x3 convolutions -> 64 x 4 x 4 -> 128 -> 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def main():
    args = parse_args()
    hvd.init()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("train_digits.py: --device cuda, but torch sees no GPU")
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, torch.get_num_threads() // hvd.local_size()))

    train_x, train_y, test_x, test_y = (t.to(device) for t in digits_split(args.seed))
    torch.manual_seed(args.seed)
    model = DigitsNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # every rank takes the same number of images per epoch (a step is a collective)
    per_rank = len(train_y) // hvd.size()
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(args.seed + epoch))
        shard = order[hvd.rank()::hvd.size()][:per_rank].to(device)
        total = 0.0
        for first in range(0, per_rank, args.batch_size):
            batch = shard[first:first + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[batch]), train_y[batch])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        mean_loss = hvd.allreduce(torch.tensor(total / per_rank), name="loss").item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1:2d}/{args.epochs}: training loss {mean_loss:.4f}", flush=True)
    seconds = time.perf_counter() - started

    model.eval()
    with torch.no_grad():
        correct = (model(test_x).argmax(dim=1) == test_y).sum().item()
    accuracy = correct / len(test_y)
    lowest = hvd.allreduce(torch.tensor(accuracy), op=hvd.Min, name="accuracy").item()
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f} ({correct}/{len(test_y)} images) after "
              f"{args.epochs} epochs on {hvd.size()} {device.type.upper()} rank(s) in {seconds:.1f} s"
              f" ({args.epochs * per_rank * hvd.size() / seconds:.0f} img/s in all)", flush=True)
    ok = lowest >= args.accuracy_threshold
    if hvd.rank() == 0 and not ok:
        print(f"FAILED: test accuracy {lowest:.4f} is below the threshold "
              f"{args.accuracy_threshold}", file=sys.stderr, flush=True)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
