"""The schedulers (hpcstack.validate.scheduler): the registry, the poll back-off, job scripts from the
template, parsing Slurm's answers, and real jobs on the local 2-node cluster
(scripts/localhost-slurm): completed (followed with the back-off), failed, cancelled.

The cluster tests need root and the Slurm packages (`scripts/localhost-slurm install`); they skip
otherwise. The module fixture starts the cluster (or reuses one that is already up with 2 nodes,
leaving it running) and stops what it started.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.validate.launchers import Allocation
from hpcstack.validate.scheduler import (SCHEDULERS, Backoff, BatchJob, JobScheduler, JobStep, LocalScheduler,
                                         Slurm, get_scheduler, parse_key_values, register_scheduler,
                                         render_job_script)

from conftest import two_node_cluster, user_writable_dir

pytestmark = pytest.mark.unit
TEST_USER = os.environ.get("HPCSTACK_SLURM_USER", "hpcstack-test")
MODULES_INIT = "/usr/share/modules/init/bash"


def job(**kw) -> BatchJob:
    base = dict(name="t", nodes=2, tasks_per_node=4, cpus_per_task=10, time_limit="00:20:00",
                output="/w/slurm-%j.out", workdir="/w", module_init="/usr/share/Modules/init/bash",
                partition="gpu", qos="gpu", account="y07", gpus_per_node=4, exclusive=True,
                module_use=["/work/y07/shared/cirrus-modulefiles"], module_load=["pytorch/2.3.1-gpu"],
                env={"NCCL_DEBUG": "WARN"},
                steps=[JobStep("horovod", "srun python x.py", "/w/horovod.exit")])
    base.update(kw)
    return BatchJob(**base)


# ----------------------------------------------------------------------------- rendering

def test_sbatch_options_in_order_and_only_when_set():
    assert job().sbatch_options() == [
        "--job-name=t", "--partition=gpu", "--qos=gpu", "--account=y07", "--nodes=2",
        "--ntasks-per-node=4", "--cpus-per-task=10", "--gres=gpu:4", "--exclusive", "--time=00:20:00",
        "--output=/w/slurm-%j.out", "--chdir=/w", "--export=NONE"]
    opts = job(qos=None, account=None, gpus_per_node=0, exclusive=False, export_none=False).sbatch_options()
    assert not any(o.startswith(("--qos", "--account", "--gres", "--exclusive", "--export")) for o in opts)


def test_memory_and_extra_options_follow_hpcstacks_own_lines():
    opts = job(mem_per_gpu="120G", extra_options=["--reservation=maint", "--signal=B:USR1@60"]).sbatch_options()
    assert opts[opts.index("--gres=gpu:4") + 1] == "--mem-per-gpu=120G"
    assert opts[-3:] == ["--export=NONE", "--reservation=maint", "--signal=B:USR1@60"]
    script = Slurm().render(job(mem="64000", extra_options=["--hint=nomultithread"]))
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert lines.count("#SBATCH --mem=64000") == 1 and lines[-1] == "#SBATCH --hint=nomultithread"
    assert not any(o.startswith("--mem") for o in job().sbatch_options())


@pytest.mark.parametrize("kw, words", [
    (dict(mem="64G", mem_per_cpu="4G"), "slurm.mem_per_cpu: give one of slurm.mem"),
    (dict(extra_options=["--comment=a b"]), "slurm.extra_options: '--comment=a b': an #SBATCH line cannot hold"),
])
def test_a_job_that_sbatch_would_misread_is_refused(kw, words):
    with pytest.raises(ConfigError) as err:
        job(**kw).sbatch_options()
    assert len(err.value.lines()) == 1 and words in err.value.lines()[0], err.value.lines()


def test_rendered_script_sources_module_init_and_keeps_env_for_steps():
    text = render_job_script(job(), header="a test")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and lines[1] == "# a test"
    assert "#SBATCH --gres=gpu:4" in lines
    order = [lines.index(x) for x in (
        "source /usr/share/Modules/init/bash || { echo \"hpcstack: cannot source \"/usr/share/Modules/init/bash >&2; exit 97; }",
        "module use /work/y07/shared/cirrus-modulefiles",
        "module load pytorch/2.3.1-gpu || { echo \"hpcstack: module load \"pytorch/2.3.1-gpu\" failed\" >&2; exit 98; }",
        "export SLURM_EXPORT_ENV=ALL", "export NCCL_DEBUG=WARN", "srun python x.py")]
    assert order == sorted(order), text
    # the status file is renamed into place, never written through what lies at its name
    assert "  && chmod 644 \"$hpcstack_tmp\" && mv -fT \"$hpcstack_tmp\" /w/horovod.exit" in lines
    assert lines[-1] == 'exit "$status"'
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_srun_task_options_leave_the_tasks_shape_out_of_sbatch():
    """Cirrus's GPU nodes reject #SBATCH --ntasks/--cpus-per-task (slurm.task_options: srun)."""
    opts = job(task_options="srun").sbatch_options()
    assert not any(o.startswith(("--ntasks", "--cpus-per-task")) for o in opts), opts
    assert "--nodes=2" in opts and "--gres=gpu:4" in opts and "--exclusive" in opts
    text = render_job_script(job(task_options="srun"))
    assert "#SBATCH --ntasks" not in text and "#SBATCH --cpus-per-task" not in text
    # the threads of a rank still follow its cores, from the site's value
    assert "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-10}" in text


def test_module_preloads_loads_before_the_module_root():
    text = render_job_script(job(module_use=["/site/mods"], module_preloads=["Stages/2024", "GCC/12.3.0"],
                                 module_use_after=["/p/project/x/modulefiles"]))
    module_lines = [l.split(" ||")[0] for l in text.splitlines() if l.startswith("module ")]
    assert module_lines == ["module use /site/mods", "module load Stages/2024", "module load GCC/12.3.0",
                            "module use /p/project/x/modulefiles", "module load pytorch/2.3.1-gpu"]
    assert 'module load GCC/12.3.0 || { echo "hpcstack: module load "GCC/12.3.0" failed" >&2; exit 98; }' in text
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    # without a hierarchy, no line about it
    assert "hierarchy" not in render_job_script(job())


def test_values_are_shell_quoted():
    text = render_job_script(job(env={"X": "a b; rm -rf /"}, module_use=["/dir with space"]))
    assert "export X='a b; rm -rf /'" in text
    assert "module use '/dir with space'" in text


def test_slurm_allocation_lists_hosts_inside_the_job():
    alloc = Slurm().allocation(2, 4, 10)
    assert (alloc.nodes, alloc.ranks, alloc.hosts) == (2, 8, ())
    assert alloc.hostnames_command == 'scontrol show hostnames "$SLURM_JOB_NODELIST"'
    assert alloc.per_node_command == ("srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=40")


# ----------------------------------------------------------------------------- registry

def test_registry_holds_slurm_and_local():
    assert {"slurm", "local"} <= set(SCHEDULERS)
    assert get_scheduler("slurm") is Slurm and get_scheduler("local") is LocalScheduler
    with pytest.raises(ValueError, match="unknown scheduler 'pbs' \\(known: .*local.*slurm"):
        get_scheduler("pbs")


def test_local_scheduler_runs_one_node_here_and_says_what_is_missing(tmp_path):
    alloc = LocalScheduler().allocation(1, 3)
    assert alloc == Allocation(1, 3, 1, hosts=("localhost",))
    with pytest.raises(ValueError, match="one node"):
        LocalScheduler().allocation(2, 1)
    proc = LocalScheduler().run(["sh", "-c", "echo $X; pwd"], env={"X": "x1", "PATH": os.environ["PATH"]},
                                cwd=str(tmp_path))
    assert proc.stdout.split() == ["x1", str(tmp_path)]
    with pytest.raises(HpcstackError, match="no-such-launcher not found"):
        LocalScheduler().run(["no-such-launcher"], env={}, cwd=str(tmp_path))


def test_a_new_scheduler_is_one_registered_class():
    @register_scheduler("test-direct")
    class Direct(JobScheduler):
        def allocation(self, nodes, tasks_per_node, cpus_per_task=1):
            return Allocation(nodes, tasks_per_node, cpus_per_task, hosts=("h1",))

    try:
        assert get_scheduler("test-direct")().allocation(1, 2).hosts == ("h1",)
        with pytest.raises(ValueError, match="registered already"):
            register_scheduler("test-direct")(Direct)
        with pytest.raises(NotImplementedError, match="test-direct scheduler runs no batch jobs"):
            Direct().submit(Path("job.sh"))
    finally:
        del SCHEDULERS["test-direct"]


# ----------------------------------------------------------------------------- polling back-off

def test_backoff_grows_by_the_factor_up_to_the_maximum_and_resets():
    b = Backoff()
    seq = [b.next() for _ in range(60)]
    assert seq[:3] == pytest.approx([0.2, 0.22, 0.242])
    assert all(later >= earlier for earlier, later in zip(seq, seq[1:]))
    assert max(seq) == 10.0 and seq[-1] == 10.0
    first_max = seq.index(10.0)
    assert 40 <= first_max <= 43                       # 0.2 * 1.1**41 = 10.003
    b.reset()
    assert b.next() == 0.2
    with pytest.raises(ValueError, match="factor >= 1"):
        Backoff(0.2, 0.5, 10)


def test_a_twenty_minute_job_costs_about_150_squeue_calls_not_6000():
    b, t, calls = Backoff(), 0.0, 1
    while t < 1200:
        t += b.next()
        calls += 1
    assert 140 <= calls <= 160, calls
    assert calls < 1200 / 0.2 / 30


def test_wait_backs_off_between_polls_and_starts_again_when_a_job_ends():
    # job 5 ends at the 4th poll, job 6 at the 7th
    queue = iter(["5 RUNNING\n6 RUNNING\n"] * 3 + ["6 RUNNING\n"] * 3 + [""])
    slept = []

    def fake(argv, **kw):
        if argv[0] == "squeue":
            return subprocess.CompletedProcess(argv, 0, next(queue), "")
        job = argv[-1]
        return subprocess.CompletedProcess(argv, 0, f"JobId={job} JobState=COMPLETED ExitCode=0:0", "")

    slurm = Slurm(run=fake, poll_interval=1.0, poll_factor=2.0, max_poll_interval=5.0, sleep=slept.append)
    done = slurm.wait(["5", "6"])
    assert sorted(done) == ["5", "6"] and all(i.ok for i in done.values())
    assert slept == [1.0, 2.0, 4.0, 1.0, 2.0, 4.0]      # reset after job 5 left the queue
    assert slurm.squeue_calls == 7


def test_wait_never_sleeps_past_its_timeout():
    slept = []
    fake = FakeRun({"squeue": (0, "5 RUNNING\n", "")})
    slurm = Slurm(run=fake, poll_interval=100.0, sleep=slept.append)
    with pytest.raises(HpcstackError, match="jobs 5 still queued or running after 0 s"):
        slurm.wait(["5"], timeout=0.05)
    assert slept and all(s <= 0.05 for s in slept)


# ----------------------------------------------------------------------------- parsing

def test_parse_scontrol_and_jobcomp_lines():
    scontrol = ("JobId=18 JobName=my job UserId=u(1) JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 "
                "RunTime=00:10:01 NodeList=n[1-2] StdOut=/tmp/o/slurm-18.out CPUs/Task=1 AllocNode:Sid=h:1")
    f = parse_key_values(scontrol)
    assert f["JobName"] == "my job" and f["JobState"] == "TIMEOUT" and f["CPUs/Task"] == "1"
    assert f["StdOut"] == "/tmp/o/slurm-18.out" and f["AllocNode:Sid"] == "h:1"


def test_jobcomp_file_gives_the_last_entry_of_a_job(tmp_path):
    comp = tmp_path / "jobcomp.log"
    comp.write_text(
        "JobId=7 UserId=u(1) Name=a JobState=COMPLETED NodeList=n1 ExitCode=0:0 \n"
        "JobId=70 UserId=u(1) Name=b JobState=FAILED NodeList=n1 ExitCode=1:0 \n"
        "JobId=7 UserId=u(1) Name=c JobState=NODE_FAIL NodeList=n[1-2] DerivedExitCode=0:0 ExitCode=0:0 \n")
    info = Slurm().jobcomp_info("7", str(comp))
    assert (info.state, info.exit_code, info.nodelist, info.source) == ("NODE_FAIL", "0:0", "n[1-2]", "jobcomp")
    assert Slurm().jobcomp_info("8", str(comp)) is None


class FakeRun:
    """Stands in for subprocess.run: records argv, answers from a table."""

    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        for prefix, (rc, out, err) in self.answers.items():
            if " ".join(argv).startswith(prefix):
                return subprocess.CompletedProcess(argv, rc, out, err)
        raise FileNotFoundError(argv[0])


def test_submit_parses_parsable_output_and_uses_runuser_as_root(tmp_path):
    fake = FakeRun({"runuser": (0, "4242;cluster\n", ""), "sbatch": (0, "4242\n", "")})
    assert Slurm(submit_as="someone", run=fake).submit(tmp_path / "job.sh") == "4242"
    if os.geteuid() == 0:
        assert fake.calls[-1][:4] == ["runuser", "-u", "someone", "--"]
    else:
        assert fake.calls[-1][0] == "sbatch"


def test_a_script_given_as_text_goes_to_sbatch_on_stdin_not_by_its_path(tmp_path):
    """What is submitted is what hpcstack rendered: no path for sbatch to read later (a user who
    can rename in its directory could swap the file in between), and sbatch runs in ``/``."""
    calls = []

    def fake(argv, **kw):
        calls.append((argv, kw))
        return subprocess.CompletedProcess(argv, 0, "77\n", "")

    assert Slurm(run=fake).submit(tmp_path / "job.sh", content="#!/bin/bash\ntrue\n") == "77"
    argv, kw = calls[-1]
    assert str(tmp_path / "job.sh") not in argv and argv[-1] == "--parsable"
    assert kw["input"] == "#!/bin/bash\ntrue\n" and kw["cwd"] == "/"


def test_refused_submission_shows_sbatchs_message(tmp_path):
    fake = FakeRun({"sbatch": (1, "", "sbatch: error: Batch job submission failed: Invalid account\n")})
    with pytest.raises(HpcstackError, match="sbatch refused .*Invalid account"):
        Slurm(run=fake).submit(tmp_path / "job.sh")


def test_slurm_not_running_says_how_to_start_it(tmp_path):
    fake = FakeRun({"sbatch": (1, "", "sbatch: error: _establish_config_source: failed to fetch config\n"
                                      "sbatch: fatal: Could not establish a configuration source\n")})
    with pytest.raises(HpcstackError, match="configuration source; is Slurm running.*localhost-slurm up"):
        Slurm(run=fake).submit(tmp_path / "job.sh")


def test_missing_sbatch_says_how_to_get_slurm(tmp_path):
    with pytest.raises(HpcstackError, match="sbatch not found.*localhost-slurm"):
        Slurm(run=FakeRun({})).submit(tmp_path / "job.sh")


def test_wait_polls_until_the_job_leaves_the_queue():
    answers = iter([(0, "5 PENDING\n", ""), (0, "5 RUNNING\n", ""), (0, "", "")])
    seen = []

    def fake(argv, **kw):
        if argv[0] == "squeue":
            rc, out, err = next(answers)
            return subprocess.CompletedProcess(argv, rc, out, err)
        return subprocess.CompletedProcess(argv, 0, "JobId=5 JobState=COMPLETED ExitCode=0:0 RunTime=00:00:03", "")

    done = Slurm(run=fake, poll_interval=0.01).wait(["5"], on_change=lambda i: seen.append(i.state))
    assert seen == ["PENDING", "RUNNING", "COMPLETED"]
    assert done["5"].ok and done["5"].source == "scontrol"


# ----------------------------------------------------------------------------- real Slurm

@pytest.fixture(scope="module")
def cluster():
    """The local 2-node Slurm cluster (conftest.two_node_cluster)."""
    with two_node_cluster():
        yield


@pytest.fixture
def workdir(cluster):
    yield from user_writable_dir(TEST_USER, "hpcstack-sched-test-")


def submit(workdir: Path, steps: list[JobStep], nodes: int = 2) -> tuple[Slurm, str]:
    script = workdir / "job.sh"
    script.write_text(render_job_script(job(
        nodes=nodes, tasks_per_node=1, cpus_per_task=1, partition="debug", qos=None, account=None,
        gpus_per_node=0, time_limit="00:02:00", output=str(workdir / "slurm-%j.out"), workdir=str(workdir),
        module_init=MODULES_INIT, module_use=[], module_load=[], env={"GREETING": "hello there"},
        steps=steps)))
    os.chown(script, pwd.getpwnam(TEST_USER).pw_uid, -1)
    slurm = Slurm(submit_as=TEST_USER)
    return slurm, slurm.submit(script)


@pytest.mark.integration
def test_job_runs_steps_on_both_nodes_as_the_test_user(workdir):
    slurm, job_id = submit(workdir, [
        JobStep("hosts", "srun --mpi=pmix bash -c 'echo \"$(hostname) $(id -un) $GREETING $OMP_NUM_THREADS\"'",
                str(workdir / "hosts.exit"))])
    t0 = time.monotonic()
    info = slurm.wait([job_id], timeout=60)[job_id]
    print(f"2-node job {job_id} took {time.monotonic() - t0:.1f} s from submission")
    out = (workdir / f"slurm-{job_id}.out").read_text()
    assert info.ok and info.state == "COMPLETED" and info.exit_code == "0:0", (info, out)
    assert info.stdout == str(workdir / f"slurm-{job_id}.out")
    assert sorted(line for line in out.splitlines() if line.endswith(" 1")) == [
        f"n1 {TEST_USER} hello there 1", f"n2 {TEST_USER} hello there 1"], out
    assert (workdir / "hosts.exit").read_text().strip() == "0"


@pytest.mark.integration
def test_job_followed_with_back_off_completes_and_is_collected(workdir):
    slurm, job_id = submit(workdir, [
        JobStep("slow", "sleep 6 && srun --mpi=pmix hostname", str(workdir / "slow.exit"))])
    t0 = time.monotonic()
    info = slurm.wait([job_id], timeout=90)[job_id]
    elapsed = time.monotonic() - t0
    out = (workdir / f"slurm-{job_id}.out").read_text()
    assert info.ok and info.stdout == str(workdir / f"slurm-{job_id}.out"), (info, out)
    assert sorted(line for line in out.splitlines() if line in ("n1", "n2")) == ["n1", "n2"], out
    assert (workdir / "slow.exit").read_text().strip() == "0"
    # the back-off allows at most this many polls in the time it took (one more for the last)
    b, t, allowed = Backoff(), 0.0, 1
    while t <= elapsed:
        t += b.next()
        allowed += 1
    print(f"job {job_id}: {elapsed:.1f} s, {slurm.squeue_calls} squeue calls "
          f"(a fixed 0.2 s would make {int(elapsed / 0.2) + 1})")
    # (a bound that a busy machine only makes easier to meet: slow squeue calls mean fewer polls)
    assert 2 <= slurm.squeue_calls <= allowed


@pytest.mark.integration
def test_failing_step_fails_the_job_with_its_exit_code_after_running_the_rest(workdir):
    slurm, job_id = submit(workdir, [JobStep("bad", "bash -c 'exit 3'", str(workdir / "bad.exit")),
                                     JobStep("good", "true", str(workdir / "good.exit"))], nodes=1)
    info = slurm.wait([job_id], timeout=60)[job_id]
    assert (info.state, info.exit_code, info.ok) == ("FAILED", "3:0", False)
    assert (workdir / "bad.exit").read_text().strip() == "3"
    assert (workdir / "good.exit").read_text().strip() == "0"
    # the jobcomp file knows it too (scontrol forgets a job after MinJobAge)
    comp = slurm.jobcomp_info(job_id)
    assert comp is not None and comp.state == "FAILED" and comp.exit_code == "3:0"


@pytest.mark.integration
def test_cancelled_job_is_reported_cancelled(workdir):
    slurm, job_id = submit(workdir, [JobStep("sleep", "sleep 120", str(workdir / "sleep.exit"))], nodes=1)
    deadline = time.monotonic() + 30
    while slurm.queued([job_id]).get(job_id) != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
    slurm.cancel([job_id])
    info = slurm.wait([job_id], timeout=60)[job_id]
    assert info.state == "CANCELLED" and not info.ok
    assert not (workdir / "sleep.exit").exists()


def test_constraint_and_gpus_per_node_replace_gres_where_the_site_asks():
    opts = job(constraint="gpu", gpu_request="gpus-per-node", partition=None).sbatch_options()
    assert "--constraint=gpu" in opts and "--gpus-per-node=4" in opts
    assert not any(o.startswith(("--gres", "--partition")) for o in opts)
    assert opts.index("--constraint=gpu") < opts.index("--gpus-per-node=4") < opts.index("--exclusive")
