"""The launchers (hpcstack.validate.launchers): the registry, the commands they write for a Slurm job
and for a local run, and real runs: mpirun and torchrun on this host, torchrun across the local
2-node Slurm cluster (scripts/localhost-slurm) with the installed stack's torch.

Real runs skip, saying why, when their tool is missing (mpirun: scripts/localhost-setup); torchrun is
the installed stack's (conftest's ``installed_stack``: the README's main command installs it).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from hpcstack.validate.launchers import (LAUNCHERS, Allocation, Launcher, ShellWord, get_launcher,
                                         register_launcher)
from hpcstack.validate.scheduler import BatchJob, JobStep, LocalScheduler, Slurm, render_job_script

from conftest import two_node_cluster, user_writable_dir

pytestmark = pytest.mark.unit

TEST_USER = os.environ.get("HPCSTACK_SLURM_USER", "hpcstack-test")
PROGRAM = ["prog", "--x", "a b"]


def slurm_alloc(nodes: int = 2) -> Allocation:
    return Slurm().allocation(nodes, 4, 10)


def local_alloc(ranks: int = 2) -> Allocation:
    return LocalScheduler().allocation(1, ranks)


@pytest.mark.integration
def test_registry_holds_the_four_launchers():
    assert {"srun", "mpirun", "horovodrun", "torchrun"} <= set(LAUNCHERS)
    assert all(get_launcher(name).name == name for name in LAUNCHERS)
    with pytest.raises(ValueError, match=r"unknown launcher 'aprun' \(known: .*horovodrun.*torchrun"):
        get_launcher("aprun")


# ----------------------------------------------------------------------------- in a Slurm job

@pytest.mark.integration
@pytest.mark.parametrize("launcher, expected", [
    ("srun", "srun --mpi=pmix --nodes=2 --ntasks-per-node=4 --cpus-per-task=10 prog --x 'a b'"),
    ("mpirun", "mpirun -np 8 --map-by ppr:4:node --bind-to none prog --x 'a b'"),
    ("horovodrun", "horovodrun -np 8 -H \"$HOROVOD_HOSTS\" prog --x 'a b'"),
    ("torchrun", "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=40 torchrun --nnodes=2 "
                 "--rdzv-backend=c10d --rdzv-endpoint=\"$TORCHRUN_ENDPOINT\" --nproc-per-node=4 --no-python "
                 "prog --x 'a b'"),
])
def test_commands_in_a_slurm_job(launcher, expected):
    assert get_launcher(launcher)(mpi="pmix").command(PROGRAM, slurm_alloc()) == expected


@pytest.mark.integration
def test_srun_without_mpi_plugin_uses_the_cluster_default_and_takes_options():
    line = get_launcher("srun")(options=["--exclusive"]).command(["p"], Slurm().allocation(1, 4, 10))
    assert line == "srun --nodes=1 --ntasks-per-node=4 --cpus-per-task=10 --exclusive p"


@pytest.mark.integration
def test_horovodrun_gets_its_host_list_from_the_allocation():
    (line,) = get_launcher("horovodrun")().setup(slurm_alloc())
    assert line == ("HOROVOD_HOSTS=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed 's/$/:4/' "
                    "| paste -sd, -)")
    assert get_launcher("srun")().setup(slurm_alloc()) == []


def test_torchrun_on_one_node_is_standalone_and_needs_no_setup():
    launcher = get_launcher("torchrun")()
    alloc = Slurm().allocation(1, 4, 10)
    assert launcher.setup(alloc) == []
    assert launcher.command(["p"], alloc) == "torchrun --standalone --nnodes=1 --nproc-per-node=4 --no-python p"


@pytest.mark.integration
@pytest.mark.parametrize("launcher", ["srun", "mpirun", "horovodrun", "torchrun"])
def test_setup_and_command_are_valid_bash(launcher):
    obj = get_launcher(launcher)(mpi="pmix")
    script = "\n".join([*obj.setup(slurm_alloc()), obj.command(PROGRAM, slurm_alloc())])
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0, script


# ----------------------------------------------------------------------------- a local run

@pytest.mark.integration
@pytest.mark.parametrize("launcher, mpi, expected", [
    ("srun", None, ["srun", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", *PROGRAM]),
    ("srun", "pmix", ["srun", "--mpi=pmix", "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1", *PROGRAM]),
    ("mpirun", None, ["mpirun", "-np", "2", "--map-by", "ppr:2:node", "--bind-to", "none", *PROGRAM]),
    ("horovodrun", None, ["horovodrun", "-np", "2", "-H", "localhost:2", *PROGRAM]),
    ("torchrun", None, ["torchrun", "--standalone", "--nnodes=1", "--nproc-per-node=2", "--no-python", *PROGRAM]),
])
def test_local_argv_needs_no_shell(launcher, mpi, expected):
    assert get_launcher(launcher)(mpi=mpi).argv(PROGRAM, local_alloc()) == expected


def test_a_command_that_needs_the_jobs_shell_is_refused_as_an_argv():
    with pytest.raises(ValueError, match="horovodrun needs a shell here"):
        get_launcher("horovodrun")().argv(PROGRAM, slurm_alloc())
    assert isinstance(get_launcher("horovodrun")().words(PROGRAM, slurm_alloc())[4], ShellWord)


def test_a_new_launcher_is_one_registered_class():
    @register_launcher("test-aprun")
    class Aprun(Launcher):
        def words(self, program, alloc):
            return ["aprun", "-n", str(alloc.ranks), "-N", str(alloc.tasks_per_node), *self.options, *program]

    try:
        assert get_launcher("test-aprun")(options=["-cc", "none"]).command(["p"], slurm_alloc()) == \
            "aprun -n 8 -N 4 -cc none p"
        with pytest.raises(ValueError, match="registered already"):
            register_launcher("test-aprun")(Aprun)
    finally:
        del LAUNCHERS["test-aprun"]


# ----------------------------------------------------------------------------- real runs

def _torchrun_bin(stack: Path) -> Path:
    """The bin directory of the installed stack's venv (``installed_stack``), which holds torchrun."""
    venv_bin = stack / "venv" / "bin"
    assert (venv_bin / "torchrun").is_file(), f"the installed stack has no {venv_bin / 'torchrun'}"
    return venv_bin


PRINT_RANKS = ["sh", "-c", 'echo "rank ${RANK:-$OMPI_COMM_WORLD_RANK} of ${WORLD_SIZE:-$OMPI_COMM_WORLD_SIZE} '
                           'on $(hostname)"']


@pytest.mark.integration
def test_mpirun_starts_every_local_rank(tmp_path):
    if not shutil.which("mpirun"):
        pytest.skip("mpirun missing; run scripts/localhost-setup")
    argv = get_launcher("mpirun")().argv(PRINT_RANKS, local_alloc(2))
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    proc = LocalScheduler().run(argv, env=env, cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split(" on ")[0] for line in proc.stdout.splitlines()) == ["rank 0 of 2", "rank 1 of 2"]


@pytest.mark.e2e
def test_torchrun_starts_every_local_rank(tmp_path, installed_stack):
    venv_bin = _torchrun_bin(installed_stack)
    argv = get_launcher("torchrun")().argv(PRINT_RANKS, local_alloc(2))
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    proc = LocalScheduler().run(argv, env=env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(line.split(" on ")[0] for line in proc.stdout.splitlines()) == ["rank 0 of 2", "rank 1 of 2"]


@pytest.fixture(scope="module")
def cluster():
    """The local 2-node Slurm cluster (conftest.two_node_cluster)."""
    with two_node_cluster():
        yield


@pytest.mark.e2e
def test_torchrun_across_two_slurm_nodes_meets_at_one_rendezvous(cluster, installed_stack):
    venv_bin = _torchrun_bin(installed_stack)
    workdir = next(user_writable_dir(TEST_USER, "hpcstack-launch-test-"))
    try:
        slurm = Slurm(submit_as=TEST_USER)
        alloc = slurm.allocation(2, 1, 1)
        launcher = get_launcher("torchrun")()
        script = workdir / "job.sh"
        script.write_text(render_job_script(BatchJob(
            name="torchrun-test", nodes=2, tasks_per_node=1, cpus_per_task=1, time_limit="00:05:00",
            output=str(workdir / "slurm-%j.out"), workdir=str(workdir),
            module_init="/usr/share/modules/init/bash", partition="debug",
            setup=[f"export PATH={venv_bin}:$PATH", *launcher.setup(alloc)],
            steps=[JobStep("torchrun", launcher.command(PRINT_RANKS, alloc), str(workdir / "torchrun.exit"))])))
        os.chown(script, pwd.getpwnam(TEST_USER).pw_uid, -1)
        job_id = slurm.submit(script)
        info = slurm.wait([job_id], timeout=300)[job_id]
        out = (workdir / f"slurm-{job_id}.out").read_text()
        assert info.ok, out
        ranks = sorted(line for line in out.splitlines() if line.startswith("rank "))
        assert [r.split(" on ")[0] for r in ranks] == ["rank 0 of 2", "rank 1 of 2"], out
        assert {r.split(" on ")[1] for r in ranks} == {"n1", "n2"}, out
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
