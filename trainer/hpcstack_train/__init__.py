"""hpcstack_train: the distributed training benchmark and convergence check shipped inside the
hpcstack PyTorch stacks, run as ``<prefix>/bin/hpcstack-train-benchmark`` or ``python -m hpcstack_train``.

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
    {"record": "gpu", "rank", "host", "local_rank", "local_size", "cuda_visible_devices",
     "visible", "device", "physical_gpu", "rule", "problem", "uses"}         (one per rank)
    {"record": "collectives", "backend", "device", "ok", "checks", "ops", "dtypes", "sizes",
     "skipped", "failures", "failed_checks", "seconds"}   (unless --no-collectives-check)
    {"record": "throughput", "rank", "img_per_sec_mean", "img_per_sec_ci95",
     "img_per_sec_iters", "batch_size", "unit"}                            (one per rank)
    {"record": "throughput_total", "img_per_sec", "img_per_sec_ci95", "img_per_sec_per_rank",
     "world_size", "unit", "setup"}                     (setup: benchmark phase only, see below)
    {"record": "convergence", "initial_loss", "final_loss", "threshold", "baseline_loss",
     "steps", "loss_fell", "below_threshold", "params_identical", "param_hashes", "seconds"}
    {"record": "startup", "rank", "imports_s", "first_step_s", "unit"}    (one per rank)
    {"record": "result", "ok", "reasons", "wall_seconds"}

Every backend trains the same computation (``models.SETUP_RULE``): model, batch, precision and
memory format come from the command line alone; ``--channels-last`` puts the model's parameters
and the batches in NHWC for every backend. ``setup`` says what rank 0's benchmark steps really
ran: ``precision``, ``channels_last``, ``batch_shape``, ``batch_memory_format`` and
``logits_dtype`` as the model's forward saw them, ``param_memory_formats`` and
``grad_memory_formats`` of its 4-D parameters, ``param_dtype`` and ``parameters``.
``--backend plain`` is one process with no wrapper (world size 1), the reference the
distributed backends are measured against.

The gpu records say, per rank, which GPU it uses or would use (also on a CPU-only node, from the
node's ``CUDA_VISIBLE_DEVICES``): the host, ``CUDA_VISIBLE_DEVICES`` as the rank saw it (None when
unset), ``visible`` (GPUs it can address; None when unknown), ``device`` (``cuda:N``, None when it
has no GPU of its own), ``physical_gpu`` (the N-th entry of ``CUDA_VISIBLE_DEVICES``, or N when
unset), ``rule`` (``local-rank``, ``one-visible``, ``per-task``, ``none``), ``problem`` and
``uses`` (the device it trains on, ``cpu`` or ``cuda:N``); see :func:`.launch.choose_gpu`.

The startup records give each rank's seconds from its process start (``/proc/self/stat``) to
its imports done (torch and the backend, initialised) and to the end of its first training step.

Before both phases, unless ``--no-collectives-check``, every rank checks the backend's collectives
on the training device against exact results (CollectivesCheck: allreduce sum/average/min/max,
a fused batch, allgather of equal and unequal sizes, broadcast from the last rank, alltoall,
reducescatter; float32/16, bfloat16, float64, int32/64; 1 to 2^20 + 1 elements).

Exit status 0 only when the collectives and convergence (or classifier) checks pass, 1 when they
fail (or a rank fails), 2 on a usage error.

Only the standard library, torch, torchvision (for models other than ``tiny`` and ``digits``),
scikit-learn (for ``digits``) and, for the Horovod backend, horovod are needed (horovod is imported
only when ``--backend horovod`` asks for it): the package runs in the stack's own python, where
hpcstack is not installed, and never imports hpcstack (nor does hpcstack import it).

The modules, one concern each: :mod:`.launch` (rank and rendezvous from the launcher's variables,
threads per rank; no torch), :mod:`.backends` (Horovod, DDP and the plain loop behind one interface),
:mod:`.collective_cases` and :mod:`.collectives` (the collectives check), :mod:`.models`,
:mod:`.data` (the teacher task and the digits data set), :mod:`.phases` (benchmark, convergence,
digits training), :mod:`.timing` (start-up points, mean and spread; no torch), :mod:`.report`
(JSON-lines records, summary lines, failure reasons; no torch), :mod:`.cli` (options, the order
of the phases and records, exit status), :mod:`.errors`.

Examples, with the stack's module loaded (2 ranks on one CPU node; root needs
OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 for mpirun)::

    mpirun -np 2 hpcstack-train-benchmark --backend ddp
    torchrun --nproc-per-node 2 "$(command -v hpcstack-train-benchmark)" --backend ddp
    horovodrun -np 2 -H localhost:2 --gloo hpcstack-train-benchmark --backend horovod
    torchrun --nproc-per-node 2 "$(command -v hpcstack-train-benchmark)" --backend ddp \\
        --model digits --batch-size 32
    hpcstack-train-benchmark --backend plain
    srun --mpi=pmix -n 8 hpcstack-train-benchmark --backend horovod --model resnet50 \\
        --batch-size 32 --device cuda --precision amp --output result.jsonl

From a checkout of hpcstack, with a python that has torch: ``PYTHONPATH=trainer python -m
hpcstack_train --backend ddp`` under the same launchers.
"""

#: The program's name: its command in ``<prefix>/bin``, the prefix of its stderr lines and the
#: ``tool`` of its config record.
PROGRAM = "hpcstack-train-benchmark"
#: The ``tool_version`` of the config record.
PROGRAM_VERSION = "1.0"
#: The method the benchmark phase follows (the ``method`` of the config record).
METHOD_SOURCE = "horovod examples/pytorch/pytorch_synthetic_benchmark.py v0.28.1"
