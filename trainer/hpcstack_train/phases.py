"""The trainer's phases, each on this rank with the initialised backend: the synthetic
benchmark (img/s per iteration), the convergence check on the teacher task, and the digits
classifier (``--model digits``).
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from .backends import Comm
from .data import ChannelMeanTeacher, derive_seed, load_digits_split, shard_indices
from .models import (DIGITS_CLASSES, DIGITS_MODEL, SetupProbe, batch_statistics_eval, build_for,
                     in_memory_format, logits_of, make_train_step, parameter_digest, training_setup)
from .timing import synchronize


def run_benchmark(comm: Comm, args: argparse.Namespace) -> tuple[list[float], dict]:
    """Throughput of synthetic training on this rank, in images per second per iteration.

    Method of Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py`` (v0.28.1): a model
    with random weights, broadcast from rank 0; SGD with lr 0.01 x world size wrapped by the
    distributed optimizer; one fixed batch of random images (N(0,1), 3 x image_size^2) and random
    labels; ``num_warmup_batches`` untimed steps; then ``num_iters`` timed iterations of
    ``num_batches_per_iter`` steps, each giving ``batch_size * num_batches_per_iter / seconds``.
    Differences: on CUDA the device is synchronised before each clock reading; the model is
    torchvision's default build (no SyncBatchNorm); data and model are seeded from ``--seed``;
    model, batch, precision and memory format follow :func:`~hpcstack_train.models.training_setup`,
    the same for every backend.

    Args:
        comm: the initialised backend.
        args: parsed command line (model, num_classes, image_size, batch_size, precision,
            channels_last, num_warmup_batches, num_batches_per_iter, num_iters, seed).

    Returns:
        ``(img_secs, setup)``: images per second of this rank, one value per timed iteration;
        what the steps really ran (:meth:`~hpcstack_train.models.SetupProbe.fields` plus
        ``precision`` and ``channels_last``).
    """
    setup = training_setup(args)
    torch.manual_seed(derive_seed(args.seed, "benchmark-model", 0))
    model, optimizer = comm.prepare(build_for(setup),
                                    lambda params: torch.optim.SGD(params, lr=0.01 * comm.size))
    probe = SetupProbe(comm.unwrap(model))
    generator = torch.Generator().manual_seed(derive_seed(args.seed, "benchmark-data", comm.rank))
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size,
                         generator=generator).to(comm.device)
    labels = torch.randint(0, args.num_classes, (args.batch_size,),
                           generator=generator).to(comm.device)
    step = make_train_step(model, optimizer, comm, setup.precision, setup.channels_last)
    model.train()
    for _ in range(args.num_warmup_batches):
        step(images, labels)
    img_secs = []
    for _ in range(args.num_iters):
        synchronize(comm.device)
        start = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            step(images, labels)
        synchronize(comm.device)
        img_secs.append(args.batch_size * args.num_batches_per_iter / (time.perf_counter() - start))
    return img_secs, {"precision": setup.precision, "channels_last": setup.channels_last,
                      **probe.fields()}


# --------------------------------------------------------------------------------------------
# Phase 2: convergence on a learnable synthetic task
# --------------------------------------------------------------------------------------------


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
    setup = training_setup(args, num_classes=args.convergence_classes)
    torch.manual_seed(derive_seed(args.seed, "convergence-model", 0))
    model, optimizer = comm.prepare(
        build_for(setup), lambda params: torch.optim.SGD(params, lr=args.convergence_lr, momentum=0.9))
    plain = comm.unwrap(model)
    teacher = ChannelMeanTeacher(args.convergence_classes, args.seed, comm.device)

    def generator(purpose: str) -> torch.Generator:
        return torch.Generator(device=comm.device).manual_seed(
            derive_seed(args.seed, purpose, comm.rank))

    eval_generator = generator("convergence-eval")
    eval_set = [teacher.sample(args.batch_size, args.image_size, eval_generator) for _ in range(4)]
    autocast = dict(device_type=comm.device.type, enabled=setup.precision == "amp",
                    dtype=torch.float16 if comm.device.type == "cuda" else torch.bfloat16)

    def mean_eval_loss(name: str) -> float:
        with torch.no_grad(), batch_statistics_eval(plain), torch.autocast(**autocast):
            losses = [F.cross_entropy(logits_of(plain(in_memory_format(x, setup.channels_last))), y).float()
                      for x, y in eval_set]
        return float(comm.allreduce_mean(torch.stack(losses).mean().cpu(), name))

    counts = torch.bincount(torch.cat([y for _, y in eval_set]).cpu(),
                            minlength=args.convergence_classes).double()
    frequencies = comm.allreduce_mean(counts, "convergence.label_counts")
    frequencies = frequencies[frequencies > 0] / frequencies.sum()
    baseline_loss = float(-(frequencies * frequencies.log()).sum())
    initial_loss = mean_eval_loss("convergence.initial_loss")
    step = make_train_step(model, optimizer, comm, setup.precision, setup.channels_last)
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
    setup = training_setup(args, num_classes=DIGITS_CLASSES, model=DIGITS_MODEL)
    model, optimizer = comm.prepare(
        build_for(setup), lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9))
    plain = comm.unwrap(model)
    step = make_train_step(model, optimizer, comm, setup.precision, setup.channels_last)
    model.train()
    img_secs, losses = [], []
    for epoch in range(args.epochs):
        shard = shard_indices(len(train_y), comm.rank, comm.size, epoch, args.seed).to(comm.device)
        synchronize(comm.device)
        start = time.perf_counter()
        for first in range(0, len(shard), args.batch_size):
            batch = shard[first:first + args.batch_size]
            losses.append(step(train_x[batch], train_y[batch]).detach())
        synchronize(comm.device)
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
