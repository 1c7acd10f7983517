"""The trainer's DDP backend ends cleanly on every rank: 2 real processes over Gloo on the CPU.

The validation's Slurm step (``srun --nodes=2 --ntasks-per-node=1``) is imitated on this host:
each rank gets the variables srun gives it (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
``SLURM_NODEID``, ``SLURM_TASKS_PER_NODE``) and rank 0's address in ``MASTER_ADDR``. Every rank
must exit with the status of its run, with no ``terminate called`` (a C++ thread left joinable when
the interpreter ends: pytorch/2.14.1-gpu's 2-node DDP job aborted so, exit 134, after "result: OK")
and without the trainer's warning that the process group outlived ``destroy_process_group()``.

The interpreter is the installed pytorch/2.3.1-gpu stack's (marked e2e: the README's main command
installs it), or the one ``HPCSTACK_TRAINER_PYTHON`` names (e.g. pytorch/2.14.1-gpu's
``<prefix>/venv/bin/python``, where torch 2.14.1 kept the group alive); the end of the real
2.14.1 job on 2 Slurm nodes is tests/test_e2e_two_pytorch.py's.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from conftest import dump_stacks, free_port

pytestmark = pytest.mark.e2e

TRAINER_DIR = Path(__file__).resolve().parent.parent / "trainer"
SCRIPT = TRAINER_DIR / "hpcstack-train-benchmark"
#: A short run: one timed iteration of one batch, no collectives check; the convergence phase
#: keeps its defaults (tiny model, 100 steps: a few seconds), which pass.
SHORT = ["--backend", "ddp", "--device", "cpu", "--threads", "1", "--num-warmup-batches", "1",
         "--num-batches-per-iter", "1", "--num-iters", "1", "--no-collectives-check"]
RUN_TIMEOUT_S = 300
ABORT = "terminate called"
OUTLIVED = "outlived destroy_process_group()"

#: The trainer's main(), then the threads of a torch process group or store (named pt_gloo_*,
#: gloo_*, pt_tcpstore_*, pt_nccl_*) that this rank still runs when the interpreter is about to
#: end: each is a C++ thread, joinable until its owner is destroyed.
THEN_LIST_THREADS = textwrap.dedent("""
    import os, sys
    sys.dont_write_bytecode = True
    sys.path.insert(0, sys.argv.pop(1))
    from hpcstack_train import cli

    status = cli.main()
    names = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm") as f:
            names.append(f.read().strip())
    left = sorted(n for n in names if n.startswith(("pt_gloo", "gloo", "pt_tcpstore", "pt_nccl")))
    print(f"process group threads at exit: {left}", file=sys.stderr)
    sys.exit(status)
""")

#: The trainer with one failure injected: the last rank raises where rank 0 waits for it in a
#: collective (the allgather of the start-up records), as a rank that fails mid-run does.
FAIL_LAST_RANK = textwrap.dedent("""
    import sys
    sys.dont_write_bytecode = True
    sys.path.insert(0, sys.argv.pop(1))
    from hpcstack_train import cli

    real = cli.report_startup

    def report_startup(comm, report):
        if comm.rank == comm.size - 1:
            raise RuntimeError("injected failure on the last rank")
        return real(comm, report)

    cli.report_startup = report_startup
    sys.exit(cli.main())
""")

#: The trainer with the default process group held by a module global, as torch 2.14's
#: torch.distributed.nn.functional held it when DDP imported that module after
#: init_process_group: the trainer must see it outlive destroy_process_group().
HOLD_THE_GROUP = textwrap.dedent("""
    import sys
    sys.dont_write_bytecode = True
    sys.path.insert(0, sys.argv.pop(1))
    import torch.distributed as dist
    from hpcstack_train import cli

    held = []
    real_init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        real_init(*args, **kwargs)
        held.append(dist.group.WORLD)

    dist.init_process_group = init_process_group
    sys.exit(cli.main())
""")


@pytest.fixture(scope="module")
def python(installed_stack) -> str:
    """An interpreter whose torch has torch.distributed with Gloo: the installed stack's (the
    README's main command installs it), or the one ``HPCSTACK_TRAINER_PYTHON`` names (another
    stack's, e.g. pytorch/2.14.1-gpu's ``<prefix>/venv/bin/python``). Fails when it cannot
    import torch with Gloo: the stack is there to be tested."""
    chosen = os.environ.get("HPCSTACK_TRAINER_PYTHON") or str(installed_stack / "venv" / "bin" / "python")
    probe = subprocess.run(
        [chosen, "-c", "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"],
        capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, f"{chosen} cannot import torch with torch.distributed and Gloo: {probe.stderr[-2000:]}"
    return chosen


def _free_port() -> int:
    """A port for the rendezvous (conftest.free_port: below the ephemeral range)."""
    return free_port()


def run_two_ranks(command: list[str], tmp_path: Path) -> list[subprocess.CompletedProcess]:
    """Start ``command`` as ranks 0 and 1 of a 2-node srun step; return both, in rank order."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("SLURM_", "OMPI_", "PMI_"))
           and name not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                            "MASTER_PORT")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), SLURM_NTASKS="2",
               SLURM_TASKS_PER_NODE="1(x2)", SLURM_LOCALID="0", OMP_NUM_THREADS="1",
               PYTHONDONTWRITEBYTECODE="1")
    ranks = []
    for rank in (0, 1):
        out = (tmp_path / f"rank{rank}.out").open("w+")
        err = (tmp_path / f"rank{rank}.err").open("w+")
        process = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                   cwd=tmp_path,
                                   env={**env, "SLURM_PROCID": str(rank), "SLURM_NODEID": str(rank)})
        ranks.append((process, out, err))
    done, held = [], []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for rank, (process, out, err) in enumerate(ranks):
            try:
                process.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                held.append(f"rank {rank} did not exit within {RUN_TIMEOUT_S} s; its stacks:\n"
                            + dump_stacks(process.pid))
    finally:
        for process, out, err in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
            out.seek(0)
            err.seek(0)
            done.append(subprocess.CompletedProcess(process.args, process.returncode, out.read(), err.read()))
            out.close()
            err.close()
    if held:
        pytest.fail("\n".join(held) + "\n" + _says(done))
    return done


def _says(ranks: list[subprocess.CompletedProcess]) -> str:
    return "\n".join(f"--- rank {rank}: exit {done.returncode}\n{done.stderr[-3000:]}"
                     for rank, done in enumerate(ranks))


def test_the_entry_script_under_ddp_on_two_processes_exits_0_on_every_rank(python, tmp_path):
    ranks = run_two_ranks([python, str(SCRIPT), *SHORT], tmp_path)
    assert [done.returncode for done in ranks] == [0, 0], _says(ranks)
    for done in ranks:
        assert ABORT not in done.stderr and OUTLIVED not in done.stderr, _says(ranks)
    assert "result: OK" in ranks[0].stderr, _says(ranks)
    assert '"record": "result"' in ranks[0].stdout


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc/self/task (Linux)")
def test_no_thread_of_the_process_group_is_left_when_the_interpreter_ends(python, tmp_path):
    # With torch 2.14.1 and no remedy: ['gloo_tcp_loop', 'pt_gloo_runloop', 'pt_gloo_runloop',
    # 'pt_tcpstore_uv'] on rank 0, all but the store's on rank 1, after destroy_process_group()
    ranks = run_two_ranks([python, "-c", THEN_LIST_THREADS, str(TRAINER_DIR), *SHORT], tmp_path)
    assert [done.returncode for done in ranks] == [0, 0], _says(ranks)
    for done in ranks:
        assert "process group threads at exit: []" in done.stderr, _says(ranks)
        assert ABORT not in done.stderr and OUTLIVED not in done.stderr, _says(ranks)


def test_a_failing_rank_and_its_waiting_peer_both_end_cleanly(python, tmp_path):
    # the last rank fails and destroys its group without a barrier; rank 0, waiting for it in a
    # collective, sees its connections close, fails in turn and destroys its own
    ranks = run_two_ranks([python, "-c", FAIL_LAST_RANK, str(TRAINER_DIR), *SHORT], tmp_path)
    assert [done.returncode for done in ranks] == [1, 1], _says(ranks)
    assert "injected failure on the last rank" in ranks[1].stderr, _says(ranks)
    assert "rank 0 failed" in ranks[0].stderr, _says(ranks)
    for done in ranks:
        assert ABORT not in done.stderr and OUTLIVED not in done.stderr, _says(ranks)


def test_a_group_that_outlives_its_destruction_is_named_and_the_run_still_ends_with_its_status(
        python, tmp_path):
    ranks = run_two_ranks([python, "-c", HOLD_THE_GROUP, str(TRAINER_DIR), *SHORT], tmp_path)
    assert [done.returncode for done in ranks] == [0, 0], _says(ranks)
    for rank, done in enumerate(ranks):
        assert f"rank {rank}: the process group {OUTLIVED}" in done.stderr, _says(ranks)
        assert ABORT not in done.stderr, _says(ranks)
