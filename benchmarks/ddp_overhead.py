#!/usr/bin/env python3
"""DDP against the plain loop and Horovod: the same training, three ways, on this machine's CPU.

The trainer (``trainer/hpcstack_train`` from this checkout) trains the same model, batch,
precision and memory format with ``--backend plain`` (one process, no wrapper), ``ddp``
(DistributedDataParallel over Gloo) and ``horovod`` (Horovod's DistributedOptimizer), each
launched as hpcstack's Mpirun launcher does (``mpirun -np R --map-by ppr:R:node --bind-to none``,
hpcstack/validate/launchers.py), for 1 and 2 ranks (``plain`` at 1 rank only: it is one
process). Rounds alternate the runs, in an order that rotates each round, so that load on the
machine hits every backend alike. It prints, per rank count, each backend's median total img/s
with its spread, and the ratios DDP/plain and DDP/Horovod of every round (benchmarks/stats.py),
with the load average before and after. A benchmark measures; it passes or fails nothing.

``--profile`` instead times one rank count's steps phase by phase (forward, backward, optimizer
step; wall clock per step, median over the steps) for each backend and prints torch.profiler's
top operators (self CPU time) of rank 0, e.g. the DDP bucket copies and Gloo's allreduce::

    python3 benchmarks/ddp_overhead.py --python /opt/hpcstack/software/pytorch/2.3.1-gpu/venv/bin/python \\
        --rounds 5 --ranks 1,2
    python3 benchmarks/ddp_overhead.py --python ... --profile --ranks 2 --ddp static_graph=true

``--interleaved`` pairs the backends inside one launch instead: every rank opens each backend
(the plain loop at 1 rank only, DDP over Gloo, Horovod), builds the same model for each from the
same seed, and alternates blocks of ``--block`` steps between them in an order that rotates each
block (``--blocks`` blocks). A launch's ratio is the median of its per-block ratios, so the
process's own luck (where its memory landed, which host core its vCPU got: on the 2-core VM one
process of the plain loop ran 1,700 img/s and the next 2,400, while each run's iterations varied
±5 %) hits every backend of the launch alike. ``--rounds`` launches give the spread::

    python3 benchmarks/ddp_overhead.py --interleaved --rounds 5 --ranks 1,2 --threads 1 --omp 1

Run as root: Open MPI's OMPI_ALLOW_RUN_AS_ROOT variables are set for the runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
TRAINER = HERE.parent / "trainer"
#: backends ``--interleaved`` runs at 1 rank only: the plain loop is one process, and Horovod's
#: background thread keeps negotiating (MPI, every cycle) while another backend's block runs,
#: which at 2 ranks on 2 cores slowed DDP's blocks from 1,567 to 1,009 img/s per rank
#: (docs/benchmarks.md, "DDP against a plain loop and Horovod"); compare Horovod at several
#: ranks in separate launches (the default mode)
SOLO_ONLY = ("plain", "horovod")
#: profiler event names that belong to a wrapper or its communication (and the copies it makes)
WRAPPER_WORDS = ("distributed", "gloo", "c10d", "allreduce", "all_reduce", "horovod", "copy_",
                 "optimizer", "reducer", "bucket", "broadcast", "synchronize", "wait")


def parse_args(argv=None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--python", default="/opt/hpcstack/software/pytorch/2.3.1-gpu/venv/bin/python",
                   help="a python with torch and horovod.torch (the stack's)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ranks", default="1,2", help="comma-separated rank counts")
    p.add_argument("--backends", default="plain,ddp,horovod",
                   help="runs of each round; ddp+NAME=VALUE[+...] is a DDP variant (--ddp options); "
                        "+threads=N gives any run its own torch and OpenMP thread count")
    p.add_argument("--model", default="tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--precision", default="fp32", choices=["fp32", "amp"])
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--iters", type=int, default=5, help="timed iterations of 10 batches")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per rank (0: the trainer's rule, cores // ranks)")
    p.add_argument("--omp", type=int, default=0, help="OMP_NUM_THREADS per rank (0: unset)")
    p.add_argument("--ddp", action="append", default=[], metavar="NAME=VALUE",
                   help="DistributedDataParallel option for the trainer (repeatable)")
    p.add_argument("--profile", action="store_true", help="time phases and profile instead")
    p.add_argument("--steps", type=int, default=60, help="--profile: steps timed per backend")
    p.add_argument("--interleaved", action="store_true",
                   help="alternate the backends block by block inside each launch (paired)")
    p.add_argument("--blocks", type=int, default=30, help="--interleaved: blocks per backend and launch")
    p.add_argument("--block", type=int, default=10, help="--interleaved: steps per block")
    p.add_argument("--json", metavar="FILE", help="also write every run's figures as JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(TRAINER), MASTER_PORT=str(_free_port()),
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    if args.omp:
        env["OMP_NUM_THREADS"] = str(args.omp)
    return env


def _mpirun(ranks: int, args) -> list[str]:
    """hpcstack's Mpirun launcher's words (launchers.py), ``-x`` passing OMP_NUM_THREADS."""
    words = ["mpirun", "-np", str(ranks), "--map-by", f"ppr:{ranks}:node", "--bind-to", "none",
             "--oversubscribe"]
    return words + (["-x", "OMP_NUM_THREADS"] if args.omp else [])


def workload(args) -> list[str]:
    """The trainer options every backend gets (the same model, batch, precision, format)."""
    argv = ["--model", args.model, "--batch-size", str(args.batch_size), "--precision", args.precision,
            "--num-warmup-batches", "5", "--num-batches-per-iter", "10", "--num-iters", str(args.iters),
            "--convergence-steps", "1", "--loss-threshold", "100", "--no-collectives-check"]
    if args.image_size:
        argv += ["--image-size", str(args.image_size)]
    if args.channels_last:
        argv.append("--channels-last")
    if args.threads:
        argv += ["--threads", str(args.threads)]
    return argv


def run_trainer(backend: str, ranks: int, args, out: Path) -> dict:
    """One trainer run; its total img/s (None when it failed) and seconds."""
    records = out / f"{backend}-{ranks}.jsonl"
    records.unlink(missing_ok=True)
    name, *variant = backend.split("+")
    threads = [v.partition("=")[2] for v in variant if v.startswith("threads=")]
    variant = [v for v in variant if not v.startswith("threads=")]
    ddp = [w for item in [*args.ddp, *variant] for w in ("--ddp", item)] if name == "ddp" else []
    env = _env(args)
    argv = workload(args)
    if threads:  # this run's own thread count: torch's intra-op threads and OpenMP's alike
        argv = [*[w for i, w in enumerate(argv) if "--threads" not in argv[max(i - 1, 0):i + 1]],
                "--threads", threads[-1]]
        env["OMP_NUM_THREADS"] = threads[-1]
    command = [*_mpirun(ranks, args), *(["-x", "OMP_NUM_THREADS"] if threads and not args.omp else []),
               args.python, "-m", "hpcstack_train", "--backend", name, *argv, *ddp,
               "--output", str(records)]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    total = None
    if records.exists():
        for line in records.read_text().splitlines():
            record = json.loads(line)
            if record.get("record") == "throughput_total":
                total = record["img_per_sec"]
    if total is None:
        print(f"   {backend} x{ranks} failed (status {done.returncode}): {done.stderr[-400:]}", flush=True)
    return {"backend": backend, "ranks": ranks, "img_s": total, "seconds": round(seconds, 1),
            "command": command}


def compare(args) -> int:
    """The alternating rounds and their summary (see the module docstring)."""
    from stats import fmt, load_average, ratios, verdict

    ranks = [int(r) for r in args.ranks.split(",")]
    backends = args.backends.split(",")
    runs = [(b, r) for r in ranks for b in backends if not (b == "plain" and r > 1)]
    ddps = [b for b in backends if b.split("+")[0] == "ddp"]
    print(f"load average before: {load_average()}", flush=True)
    print("each run:", " ".join([*_mpirun(1, args), args.python, "-m", "hpcstack_train",
                                 "--backend", "B", *workload(args)]), flush=True)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="ddp-overhead-") as tmp:
        for index in range(args.rounds):
            order = runs[index % len(runs):] + runs[:index % len(runs)]
            for backend, count in order:
                result = run_trainer(backend, count, args, Path(tmp))
                result["round"] = index
                results.append(result)
                print(f"round {index + 1}: {backend:8} x{count} "
                      f"{result['img_s'] or 0:8.1f} img/s ({result['seconds']} s)", flush=True)
    print(f"load average after: {load_average()}")
    status = 0
    for count in ranks:
        got = {b: [x["img_s"] for x in sorted(results, key=lambda x: x["round"])
                   if x["backend"] == b and x["ranks"] == count] for b in backends}
        complete = [i for i in range(args.rounds)
                    if all(v[i] for b, v in got.items() if v)]
        print(f"\n{count} rank(s), {len(complete)} complete round(s):")
        for backend, values in got.items():
            if values:
                print(f"  {backend:8} {fmt([values[i] for i in complete], 'img/s', 1)}")
        for label in ddps:
            ddp = [got[label][i] for i in complete]
            for other in ("plain", "horovod"):
                if ddp and got.get(other):
                    theirs = [got[other][i] for i in complete]
                    print(f"  {label}/{other} {fmt(ratios(theirs, ddp), 'x', 3)}")
                    # verdict() judges ratio <= target: other/ddp <= 1/0.95 is ddp >= 0.95 x other
                    print("   ", verdict(ratios(ddp, theirs), round(1 / 0.95, 3), f"{other}/{label}"))
        status |= 0 if len(complete) == args.rounds else 1
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return status


def profile(args, argv=None) -> int:
    """Per-phase step times of each backend (see the module docstring)."""
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    status = 0
    for count in [int(r) for r in args.ranks.split(",")]:
        for backend in args.backends.split(","):
            if backend == "plain" and count > 1:
                continue
            worker = [*_mpirun(count, args), args.python, str(Path(__file__).resolve()),
                      *(sys.argv[1:] if argv is None else argv), "--worker", "--backends", backend]
            done = subprocess.run(worker, env=_env(args), capture_output=True, text=True, timeout=900)
            print(done.stdout, end="", flush=True)
            if done.returncode:
                print(f"{backend} x{count} failed: {done.stderr[-800:]}")
                status = 1
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return status


def worker(args) -> int:
    """One rank of ``--profile``: the trainer's own backend, model and step, timed by phase."""
    import torch
    import torch.nn.functional as F

    from hpcstack_train.backends import ddp_options, open_comm
    from hpcstack_train.launch import threads_per_rank
    from hpcstack_train.models import build_for, in_memory_format, logits_of
    from hpcstack_train.cli import parse_args as trainer_args
    from hpcstack_train.models import training_setup

    backend = args.backends
    targs = trainer_args(["--backend", backend, *workload(args)])
    comm = open_comm(backend, "cpu", ddp=ddp_options(args.ddp))
    threads = args.threads or threads_per_rank(comm.local_size)
    torch.set_num_threads(threads)
    setup = training_setup(targs)
    torch.manual_seed(1)
    model, optimizer = comm.prepare(build_for(setup), lambda p: torch.optim.SGD(p, lr=0.01))
    images = in_memory_format(torch.randn(setup.batch_size, 3, targs.image_size, targs.image_size),
                              setup.channels_last)
    labels = torch.randint(0, setup.num_classes, (setup.batch_size,))
    amp = dict(device_type="cpu", dtype=torch.bfloat16, enabled=setup.precision == "amp")
    phases = {"forward": [], "backward": [], "step": [], "total": []}

    def one_step(timed: bool) -> None:
        t0 = time.perf_counter()
        optimizer.zero_grad()
        with torch.autocast(**amp):
            loss = F.cross_entropy(logits_of(model(images)), labels)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        t3 = time.perf_counter()
        if timed:
            for key, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
                phases[key].append(value * 1e3)

    model.train()
    for _ in range(10):
        one_step(False)
    for _ in range(args.steps):
        one_step(True)
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            one_step(False)
    if comm.rank == 0:
        medians = {k: statistics.median(v) for k, v in phases.items()}
        print(f"{backend:8} x{comm.size} ({threads} thr, {os.environ.get('OMP_NUM_THREADS', '-')} omp)"
              f" median ms/step: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items())
              + f"  => {setup.batch_size * 1e3 / medians['total']:.0f} img/s/rank")
        events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        steps = 20
        top = ", ".join(f"{e.key} {e.self_cpu_time_total / 1e3 / steps:.2f}" for e in events[:6])
        print(f"    top self CPU, ms/step: {top}")
        wrapper = [e for e in events if any(word in e.key.lower() for word in WRAPPER_WORDS)]
        print("    wrapper and communication, ms/step (self / total): " + (", ".join(
            f"{e.key} {e.self_cpu_time_total / 1e3 / steps:.2f}/{e.cpu_time_total / 1e3 / steps:.2f}"
            for e in wrapper[:10]) or "none"), flush=True)
    comm.shutdown()
    return 0


def interleaved(args, argv=None) -> int:
    """``--interleaved``: ``--rounds`` launches per rank count, each pairing the backends block by
    block (:func:`interleaved_worker`); prints each launch and the summary across launches."""
    from stats import fmt, load_average, verdict

    print(f"load average before: {load_average()}", flush=True)
    status, results = 0, []
    for count in [int(r) for r in args.ranks.split(",")]:
        launches = []
        for index in range(args.rounds):
            command = [*_mpirun(count, args), args.python, str(Path(__file__).resolve()),
                       *(sys.argv[1:] if argv is None else argv), "--worker"]
            done = subprocess.run(command, env=_env(args), capture_output=True, text=True, timeout=1800)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                print(f"launch {index + 1} x{count} failed (status {done.returncode}): "
                      f"{done.stderr[-800:]}", flush=True)
                status = 1
                continue
            launch = json.loads(lines[-1])
            launches.append(launch)
            results.append({"ranks": count, "round": index, "command": command, **launch})
            print(f"launch {index + 1} x{count}: " + ", ".join(
                f"{b} {statistics.median(v):.0f}" for b, v in launch["img_s"].items())
                + " img/s; " + ", ".join(f"{k} {v:.3f}x" for k, v in launch["ratio"].items()), flush=True)
        if not launches:
            continue
        print(f"\n{count} rank(s), {len(launches)} launch(es) of {args.blocks} blocks of {args.block} steps:")
        for backend in launches[0]["img_s"]:
            print(f"  {backend:8} {fmt([statistics.median(x['img_s'][backend]) for x in launches], 'img/s', 1)}"
                  " (launch medians of block img/s, rank 0)")
        for label in launches[0]["ratio"]:
            values = [x["ratio"][label] for x in launches]
            print(f"  {label} {fmt(values, 'x', 3)}")
            ddp, other = label.split("/")
            print("   ", verdict([1 / v for v in values], round(1 / 0.95, 3), f"{other}/{ddp}"))
    print(f"load average after: {load_average()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return status


def interleaved_worker(args) -> int:
    """One rank of ``--interleaved``: every backend in this process, alternating blocks of steps.

    Each backend gets its own model (the same seed, so the same weights), optimizer and the
    trainer's own step (``make_train_step``); a block is ``--block`` steps of one backend between
    two Gloo barriers, timed with ``time.perf_counter``. Rank 0 prints one JSON line: each
    backend's img/s per block (this rank's batch x steps / seconds) and, per DDP variant, the
    median over blocks of DDP's img/s divided by the plain loop's and Horovod's in the same
    rotation.
    """
    import torch
    import torch.distributed as dist

    from hpcstack_train.backends import ddp_options, open_comm
    from hpcstack_train.cli import parse_args as trainer_args
    from hpcstack_train.launch import threads_per_rank
    from hpcstack_train.models import build_for, make_train_step, training_setup

    names = args.backends.split(",")
    ranks = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    comms, steps, opened = {}, {}, {}
    for backend in names:
        name, *variant = backend.split("+")
        if name in SOLO_ONLY and ranks > 1:
            continue
        if name not in opened:
            opened[name] = open_comm(name, "cpu", ddp=ddp_options(args.ddp) if name == "ddp" else None)
        comm = opened[name]
        if name == "ddp":  # one process group; each variant wraps its own model with its options
            comm = copy.copy(comm)
            comm.options = ddp_options([*args.ddp, *variant])
        comms[backend] = comm
    if not dist.is_initialized():
        raise SystemExit("--interleaved needs ddp among --backends (its barriers bracket each block)")
    if dist.get_rank() == 0 and ranks > 1 and any(b.split("+")[0] in SOLO_ONLY for b in names):
        print(f"# at {ranks} ranks --interleaved leaves out {', '.join(SOLO_ONLY)} (see SOLO_ONLY)",
              file=sys.stderr, flush=True)
    size = dist.get_world_size()
    torch.set_num_threads(args.threads or threads_per_rank(size))
    targs = trainer_args(["--backend", "plain", *workload(args)])
    setup = training_setup(targs)
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    images = torch.randn(setup.batch_size, 3, targs.image_size, targs.image_size, generator=generator)
    labels = torch.randint(0, setup.num_classes, (setup.batch_size,), generator=generator)
    for backend, comm in comms.items():
        torch.manual_seed(1)
        model, optimizer = comm.prepare(build_for(setup), lambda p: torch.optim.SGD(p, lr=0.01 * size))
        model.train()
        steps[backend] = make_train_step(model, optimizer, comm, setup.precision, setup.channels_last)
        for _ in range(5):
            steps[backend](images, labels)
    order = list(steps)
    img_s: dict[str, list[float]] = {b: [] for b in order}
    for block in range(args.blocks):
        for backend in order[block % len(order):] + order[:block % len(order)]:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.block):
                steps[backend](images, labels)
            img_s[backend].append(setup.batch_size * args.block / (time.perf_counter() - start))
    dist.barrier()
    ratio = {}
    for ddp in (b for b in order if b.split("+")[0] == "ddp"):
        for other in (b for b in order if b.split("+")[0] in ("plain", "horovod") or b.startswith("ddp+")
                      and ddp == "ddp"):
            ratio[f"{ddp}/{other}"] = statistics.median(
                d / o for d, o in zip(img_s[ddp], img_s[other]))
    if dist.get_rank() == 0:
        print(json.dumps({"threads": torch.get_num_threads(), "img_s": img_s, "ratio": ratio}), flush=True)
    for name in sorted(opened, key=lambda n: n == "ddp"):  # the process group last
        opened[name].shutdown()
    return 0


def main(argv=None) -> int:
    """Dispatch to the comparison, the profile, or one profiling rank."""
    args = parse_args(argv)
    if args.worker:
        return interleaved_worker(args) if args.interleaved else worker(args)
    if args.interleaved:
        return interleaved(args, argv)
    return profile(args, argv) if args.profile else compare(args)


if __name__ == "__main__":
    sys.exit(main())
