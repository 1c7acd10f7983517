"""End-to-end tests of scripts/localhost-slurm: a real 2-node Slurm cluster on this machine.

They need root (network namespaces, daemons, /etc/slurm/slurm.conf) and the Debian packages
(`scripts/localhost-slurm install`); otherwise they are skipped.  Jobs are submitted as the
non-root user that `up` creates (hpcstack-test): root's PATH leaks into jobs and mpirun refuses
root.  The whole module takes about 15 s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import user_writable_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "localhost-slurm"
TEST_USER = os.environ.get("HPCSTACK_SLURM_USER", "hpcstack-test")
STATE_DIR = Path("/run/hpcstack-slurm")
PID_DIR = STATE_DIR / "pids"
NODES = ["n1", "n2"]

NEEDED = ["munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "srun",
          "ip", "nsenter", "unshare"]


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.access(p, os.X_OK)), None)


_missing = [b for b in NEEDED if _which(b) is None]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0,
                       reason="localhost-slurm tests need root (network namespaces, daemons)"),
    pytest.mark.skipif(bool(_missing),
                       reason=f"missing {', '.join(_missing)}; "
                              "run `scripts/localhost-slurm install` as root"),
]


# ----------------------------------------------------------------------------- helpers

def run(cmd: list[str], *, user: bool = False, cwd: str | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    if user:
        cmd = ["runuser", "-u", TEST_USER, "--", *cmd]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def script(*args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess:
    return run([str(SCRIPT), *args], check=check, timeout=timeout)


def sbatch(workdir: Path, name: str, body: str, *args: str) -> str:
    """Write a batch script into workdir and submit it as the test user; return the job id."""
    path = workdir / f"{name}.sh"
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    out = run(["sbatch", "--parsable", f"--chdir={workdir}", f"--job-name={name}",
               f"--output={workdir}/{name}.out", *args, str(path)],
              user=True, cwd=str(workdir)).stdout
    return out.strip().split(";")[0]


def wait_job(job_id: str, timeout: float = 60) -> dict[str, str]:
    """Poll `squeue -h -j ID` every 0.2 s (sbatch --wait polls slowly) and return the job
    record from `scontrol show job` once the job has left the queue."""
    deadline = time.monotonic() + timeout
    while True:
        q = run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False)
        if q.returncode == 0 and not q.stdout.strip():
            break
        if time.monotonic() > deadline:
            info = run(["scontrol", "show", "job", job_id], check=False).stdout
            pytest.fail(f"job {job_id} still queued/running after {timeout}s:\n{info}")
        time.sleep(0.2)
    return job_info(job_id)


def job_info(job_id: str) -> dict[str, str]:
    text = run(["scontrol", "show", "job", "-o", job_id]).stdout
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


def node_states() -> dict[str, str]:
    out = run(["sinfo", "-h", "-N", "-o", "%N %t"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def wait_nodes_idle(timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        states = node_states()
        if all(states.get(n) == "idle" for n in NODES) or time.monotonic() > deadline:
            return states
        time.sleep(0.2)


def recorded_processes() -> dict[str, tuple[int, str]]:
    """name -> (pid, start time) as recorded by the script."""
    result = {}
    for f in PID_DIR.glob("*"):
        pid, start = f.read_text().split()
        result[f.name] = (int(pid), start)
    return result


def process_alive(pid: int, start: str) -> bool:
    """True if pid is still the recorded process and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[19] == start and fields[0] != "Z"


def running_pids(name: str) -> set[int]:
    """Non-zombie processes with this exact command name."""
    pids = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        state = stat.rsplit(")", 1)[1].split()[0]
        if comm == name and state != "Z":
            pids.add(int(p.name))
    return pids


def hosts_has_block() -> bool:
    return "hpcstack localhost-slurm" in Path("/etc/hosts").read_text()


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def cluster():
    """`localhost-slurm up --nodes 2` for the module, `down` at the end (unless a 2-node
    cluster was already running before the tests: then it is left running)."""
    status = script("status", check=False)
    was_up = status.returncode == 0
    if was_up and not status.stdout.startswith("nodes: 2"):
        pytest.skip("a 1-node localhost-slurm cluster is running; `localhost-slurm down` first")
    t0 = time.monotonic()
    up = script("up", "--nodes", "2")
    elapsed = time.monotonic() - t0
    print(f"\nlocalhost-slurm up --nodes 2: {elapsed:.1f} s\n{up.stderr}")
    try:
        yield {"up_seconds": elapsed}
    finally:
        if not was_up:
            script("down", check=False)


@pytest.fixture(scope="module")
def workdir(cluster):
    """A directory the test user can write, visible on both 'nodes' (same filesystem)."""
    yield from user_writable_dir(TEST_USER, "hpcstack-slurm-test-")


# ----------------------------------------------------------------------------- tests

def test_sinfo_shows_two_idle_nodes(cluster):
    states = wait_nodes_idle()
    assert states == {"n1": "idle", "n2": "idle"}, states
    part = run(["sinfo", "-h", "-o", "%P %a %D"]).stdout.split()
    assert part == ["debug*", "up", "2"], part


def test_up_again_says_already_up(cluster):
    daemons = ("slurmctld", "slurmd", "munged")
    before = {name: running_pids(name) for name in daemons}
    again = script("up", "--nodes", "2")
    assert "already up" in again.stderr
    assert {name: running_pids(name) for name in daemons} == before  # nothing restarted


def test_batch_job_runs_on_both_nodes(cluster, workdir):
    job = sbatch(workdir, "hostnames", 'echo "user=$(id -un)"\nsrun hostname\n',
                 "-N2", "--ntasks-per-node=1")
    info = wait_job(job)
    out = (workdir / "hostnames.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, out)
    assert info["ExitCode"] == "0:0"
    lines = out.split()
    assert f"user={TEST_USER}" in lines, out
    assert sorted(line for line in lines if not line.startswith("user=")) == NODES, out


MPI_HELLO_C = r"""
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, len, sum = 0;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %d\n", rank, size, name, sum);
    MPI_Finalize();
    return 0;
}
"""

MPI_HELLO_PY = """\
from mpi4py import MPI
c = MPI.COMM_WORLD
s = c.allreduce(c.Get_rank())
print(f"rank {c.Get_rank()} of {c.Get_size()} on {MPI.Get_processor_name()} sum {s}", flush=True)
"""


def _mpi_program(workdir: Path) -> str:
    if shutil.which("mpicc"):
        src = workdir / "mpi_hello.c"
        src.write_text(MPI_HELLO_C)
        run(["mpicc", "-o", str(workdir / "mpi_hello"), str(src)], user=True, cwd=str(workdir))
        return "./mpi_hello"
    if run(["python3", "-c", "import mpi4py"], check=False).returncode == 0:
        (workdir / "mpi_hello.py").write_text(MPI_HELLO_PY)
        return "python3 mpi_hello.py"
    pytest.skip("neither mpicc (libopenmpi-dev) nor mpi4py is installed")


def test_mpi_pmix_ranks_on_different_nodes(cluster, workdir):
    prog = _mpi_program(workdir)
    job = sbatch(workdir, "mpi", f"srun --mpi=pmix -N2 -n2 {prog}\n",
                 "-N2", "--ntasks-per-node=1")
    info = wait_job(job)
    out = (workdir / "mpi.out").read_text()
    assert info["JobState"] == "COMPLETED", (info, out)
    ranks = {int(r): (int(n), host, int(s)) for r, n, host, s in
             re.findall(r"^rank (\d+) of (\d+) on (\S+) sum (\d+)$", out, re.M)}
    assert sorted(ranks) == [0, 1], out
    assert all(size == 2 and total == 1 for size, _, total in ranks.values()), out
    assert {host for _, host, _ in ranks.values()} == set(NODES), out


def test_failing_job_ends_failed_with_exit_code(cluster, workdir):
    job = sbatch(workdir, "fail", "exit 3\n")
    info = wait_job(job)
    assert info["JobState"] == "FAILED", info
    assert info["ExitCode"] == "3:0", info
    text = run(["scontrol", "show", "job", job]).stdout
    assert "JobState=FAILED" in text and "ExitCode=3:0" in text


def test_down_stops_its_processes_then_up_again(cluster, workdir):
    before = recorded_processes()
    assert {"slurmctld", "slurmd-n1", "slurmd-n2"} <= set(before), before
    assert all(process_alive(pid, st) for pid, st in before.values()), before

    script("down")

    alive = {name: pid for name, (pid, st) in before.items() if process_alive(pid, st)}
    assert not alive, f"processes started by up survived down: {alive}"
    ours = {pid for pid, _ in before.values()}
    assert not (running_pids("slurmd") | running_pids("slurmctld")) & ours
    assert not PID_DIR.exists()
    netns = run(["ip", "netns", "list"]).stdout
    assert "hpcstack-" not in netns, netns
    assert run(["ip", "link", "show", "hpcs-br0"], check=False).returncode != 0
    assert not hosts_has_block()
    conf = Path("/etc/slurm/slurm.conf")
    assert not conf.exists() or "hpcstack" not in conf.read_text()
    assert script("status", check=False).returncode != 0
    # down is idempotent
    script("down")

    t0 = time.monotonic()
    script("up", "--nodes", "2")
    print(f"\nsecond localhost-slurm up --nodes 2: {time.monotonic() - t0:.1f} s")
    assert wait_nodes_idle() == {"n1": "idle", "n2": "idle"}
    assert hosts_has_block()
    out = run(["srun", "-N2", "--ntasks-per-node=1", "hostname"], user=True,
              cwd=str(workdir), timeout=60).stdout
    assert sorted(out.split()) == NODES, out
