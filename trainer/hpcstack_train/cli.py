"""The trainer's command line: its options, the order of its phases and records, and its exit
status (0 when every check passes, 1 when one fails or a rank fails, 2 on a usage error).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import traceback
from typing import Optional, Sequence

import torch

from . import METHOD_SOURCE, PROGRAM, PROGRAM_VERSION
from .backends import DDP_DEFAULTS, Comm, ddp_options, gpu_choice, open_comm
from .collective_cases import INJECT_AT
from .collectives import CollectivesCheck
from .errors import UsageError
from .launch import gpu_record_fields, threads_per_rank
from .models import (DIGITS_CLASSES, DIGITS_IMAGE_SIZE, DIGITS_MODEL, TINY_CONVERGENCE_STEPS, TINY_IMAGE_SIZE,
                     TINY_MODEL, TINY_NUM_CLASSES, TORCHVISION_CONVERGENCE_STEPS, TORCHVISION_IMAGE_SIZE,
                     TORCHVISION_NUM_CLASSES, check_model_name)
from .phases import run_benchmark, run_convergence, run_digits
from .report import (GPU_RECORD_BYTES, Report, classifier_reasons, collectives_summary, failure_reasons,
                     gpu_problem_lines, pack_fields, unpack_fields)
from .timing import STARTUP, mean_ci95, startup_seconds


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None ones (model-dependent; their help text says)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)


def _positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
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
        prog=PROGRAM, formatter_class=_HelpFormatter,
        description="Synthetic training benchmark (after " + METHOD_SOURCE + ") and "
                    "convergence check for Horovod or PyTorch DDP on N ranks.")
    add = parser.add_argument
    add("--backend", choices=["horovod", "ddp", "plain"], default="horovod",
        help="distributed backend: horovod (hvd.DistributedOptimizer), ddp "
             "(torch DistributedDataParallel, NCCL on CUDA, Gloo on CPU) or plain (one process, "
             "no wrapper: the reference the others are measured against)")
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
        help="model and batches in channels-last (NHWC) memory format, for every backend, what "
             "tensor cores take for convolutions; advised with --precision amp on GPUs")
    add("--ddp", dest="ddp_options", action="append", default=[], metavar="NAME=VALUE",
        help="a DistributedDataParallel option, repeatable: " + ", ".join(
            f"{name} (default {value})" for name, value in DDP_DEFAULTS.items()))
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
    try:
        args.ddp_options = ddp_options(args.ddp_options)
    except ValueError as err:
        parser.error(f"--ddp: {err}")
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
    """The versions of the config record: python, torch, torchvision (None when missing) and
    horovod (None unless it is the backend)."""
    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import torchvision
        versions["torchvision"] = torchvision.__version__
    except ImportError:
        versions["torchvision"] = None
    versions["horovod"] = getattr(comm, "version", None) if comm.name == "horovod" else None
    return versions


def report_throughput(comm: Comm, report: Report, img_secs: Sequence[float], batch_size: int,
                      kind: str, setup: Optional[dict] = None) -> None:
    """Gather every rank's img/s per iteration; write the ``throughput`` (one per rank) and
    ``throughput_total`` records and their summary lines. ``setup`` (rank 0's, from
    run_benchmark: what the steps really ran) goes into ``throughput_total`` as ``setup``."""
    gathered = comm.allgather(torch.tensor(img_secs, dtype=torch.float64), "benchmark.img_secs")
    per_rank = []
    for rank, row in enumerate(gathered.tolist()):
        mean, ci95 = mean_ci95(row)
        per_rank.append((mean, ci95))
        report.record("throughput", rank=rank, img_per_sec_mean=mean, img_per_sec_ci95=ci95,
                      img_per_sec_iters=row, batch_size=batch_size, unit="img/s")
    total = sum(mean for mean, _ in per_rank)
    total_ci95 = sum(ci95 for _, ci95 in per_rank)
    extra = {"setup": setup} if setup is not None else {}
    report.record("throughput_total", img_per_sec=total, img_per_sec_ci95=total_ci95,
                  img_per_sec_per_rank=total / comm.size, world_size=comm.size, unit="img/s",
                  **extra)
    report.say(f"Img/sec per {kind}: {per_rank[0][0]:.1f} +-{per_rank[0][1]:.1f} (rank 0); "
               + ", ".join(f"rank {r}: {m:.1f}" for r, (m, _) in enumerate(per_rank)))
    report.say(f"Total img/sec on {comm.size} {kind}(s): {total:.1f} +-{total_ci95:.1f}")


def report_startup(comm: Comm, report: Report) -> None:
    """Gather every rank's start-up seconds (:data:`STARTUP`) and write one ``startup`` record
    per rank: ``imports_s`` (process start to imports done) and ``first_step_s`` (to the end
    of the first training step); -1 where a point was not reached."""
    mine = startup_seconds(STARTUP)
    gathered = comm.allgather(torch.tensor(mine, dtype=torch.float64), "startup.seconds")
    for rank, (imports, first) in enumerate(gathered.reshape(-1, 2).tolist()):
        report.record("startup", rank=rank, imports_s=imports if imports >= 0 else None,
                      first_step_s=first if first >= 0 else None, unit="s")


def report_gpus(comm: Comm, report: Report) -> None:
    """Gather every rank's GPU choice and write one ``gpu`` record per rank: host, local rank,
    the ``CUDA_VISIBLE_DEVICES`` it saw, the ``cuda:N`` it uses or would use, the physical GPU
    that means (:func:`~hpcstack_train.launch.choose_gpu`), and the device it trains on. On a
    CPU-only node the record says what the rank would pick on a node with the GPUs its
    environment names; hpcstack's judge fails two ranks of a node on one GPU."""
    mine = gpu_record_fields(comm.rank, comm.local_rank, comm.local_size, gpu_choice(comm),
                             uses=str(comm.device))
    packed = torch.tensor(pack_fields(mine, GPU_RECORD_BYTES), dtype=torch.float64)
    rows = [unpack_fields(row) for row in comm.allgather(packed, "gpu.records").tolist()]
    for row in rows:
        report.record("gpu", **row)
    for line in gpu_problem_lines(rows):
        report.say(f"gpu: {line}")


def run_phases(comm: Comm, args: argparse.Namespace, report: Report, threads: int,
               started: float) -> int:
    """Write the config record, run both phases, write their records; return 0 or 1."""
    kind = "GPU" if comm.device.type == "cuda" else "CPU"
    report.record(
        "config", tool=PROGRAM, tool_version=PROGRAM_VERSION, method=METHOD_SOURCE,
        timestamp=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        backend=comm.name, transport=comm.transport, launcher=comm.launcher,
        world_size=comm.size, local_size=comm.local_size, device=kind.lower(),
        device_name=(torch.cuda.get_device_name(comm.device) if kind == "GPU" else None),
        threads_per_rank=threads, model=args.model, image_size=args.image_size,
        num_classes=args.num_classes, batch_size=args.batch_size,
        num_warmup_batches=args.num_warmup_batches,
        num_batches_per_iter=args.num_batches_per_iter, num_iters=args.num_iters,
        precision=args.precision, channels_last=args.channels_last,
        ddp_options=getattr(comm, "options", None), convergence_steps=args.convergence_steps,
        epochs=args.epochs, lr=args.lr, accuracy_threshold=args.accuracy_threshold,
        convergence_classes=args.convergence_classes, convergence_lr=args.convergence_lr,
        loss_threshold=args.loss_threshold, seed=args.seed, versions=_versions(comm))
    report.say(f"backend {comm.name} ({comm.transport}), {comm.size} {kind} rank(s), "
               f"model {args.model}, batch {args.batch_size}, {args.image_size}px, "
               f"{args.precision}, {threads} thread(s) per rank")
    report_gpus(comm, report)

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
        img_secs, setup = run_benchmark(comm, args)
        report_throughput(comm, report, img_secs, args.batch_size, kind, setup)
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


def _release(comm: Comm, failed: bool) -> Optional[bool]:
    """``comm.abort()`` after an error on this rank, else ``comm.shutdown()``; None, with the
    traceback on stderr, when that raised."""
    try:
        return comm.abort() if failed else comm.shutdown()
    except Exception:  # noqa: BLE001 - said, and the caller ends the process
        print(f"{PROGRAM}: rank {comm.rank}: releasing the {comm.name} backend failed:\n"
              f"{traceback.format_exc()}", file=sys.stderr)
        return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run both phases and report; return the exit status (0 ok, 1 checks failed, 2 usage).

    On every way out of the phases the backend is released before the interpreter ends: after a
    run that every rank finished with :meth:`~.backends.Comm.shutdown` (DDP: a final barrier,
    then ``destroy_process_group()``); after an error on this rank (status 2 for a UsageError,
    1 otherwise) with :meth:`~.backends.Comm.abort`, which waits for no other rank (they may be
    waiting in a collective: DDP destroys the group, so that they see its connections close and
    fail in turn). Where the backend cannot be released that way (Horovod after an error) or
    something of it is left running (a process group that outlived its destruction), the
    process ends with ``os._exit`` after flushing its output: the interpreter's teardown never
    runs beside the backend's threads. A shutdown that fails (a peer gone during the final
    barrier) gives way to abort, and the status becomes 1 if it was 0.

    Args:
        argv (Sequence[str] | None): the options; ``sys.argv[1:]`` when None.

    Returns:
        int: the exit status, when the process ends the normal way.
    """
    started = time.perf_counter()
    args = parse_args(argv)
    try:
        check_model_name(args.model)
        comm = open_comm(args.backend, args.device, ddp=args.ddp_options)
        STARTUP["imports_done"] = time.time()
    except UsageError as err:
        print(f"{PROGRAM}: error: {err}", file=sys.stderr)
        return 2
    report: Optional[Report] = None
    failed = True
    try:
        threads = args.threads or threads_per_rank(comm.local_size)
        torch.set_num_threads(threads)
        if comm.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        report = Report(comm.rank == 0, args.output)
        status = run_phases(comm, args, report, threads, started)
        failed = False
    except UsageError as err:
        if report is not None:
            report.say(f"error: {err}")
        else:
            print(f"{PROGRAM}: error: {err}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:
        print(f"{PROGRAM}: rank {comm.rank} interrupted", file=sys.stderr)
        status = 130
    except Exception:  # noqa: BLE001 - report, then release the backend without the peers
        print(f"{PROGRAM}: rank {comm.rank} failed:\n{traceback.format_exc()}",
              file=sys.stderr)
        status = 1
    if report is not None:
        report.close()
    released = _release(comm, failed)
    if released is None:  # the release failed: a peer gone during the final barrier, say
        status, released = status or 1, _release(comm, failed=True)
    if released:
        return status
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
