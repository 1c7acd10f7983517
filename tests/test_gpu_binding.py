"""Which GPU each rank takes, what it reports, and how the judge reads it; ``gpus-per-task``; the
account/QOS check before submitting (issue 33, site twins).

- The trainer's rule (``hpcstack_train.launch.choose_gpu``, torch-free, imported from the
  checkout): ``--gres=gpu:4``/``--gpus-per-node=4`` (every rank sees 4: ``cuda:<local rank>``),
  ``--gpus-per-task=1`` (each sees its own: ``cuda:0``), more ranks than GPUs (a problem, no
  modulo share), a CPU node without ``CUDA_VISIBLE_DEVICES``.
- The ``gpu`` record's fields and their packing for the allgather.
- The judge's rule on synthetic rank records: shared GPU and invisible index fail with one line
  naming ranks, node and ``CUDA_VISIBLE_DEVICES``; distinct GPUs pass; a CPU site is unaffected.
- ``sacctmgr -nP`` text as Slurm 22.05 prints it, and sbatch's refusals, to one line each.
- ``slurm.gpu_request: gpus-per-task``: the site check, the job script (golden), ReFrame, help.
- With the installed stack's real torch (CPU): ``pick_device`` and ``gpu_choice`` under given
  environments, and a 2-rank trainer run whose ranks share one GPU, failed by the judge.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO, assert_golden, free_port, hpcstack as run_hpcstack, site_overlay, unit_site
from hpcstack.errors import ConfigError
from hpcstack.site import check_config
from hpcstack.validate import preflight
from hpcstack.validate.judge import RunOutcome, gpu_binding_reasons, judge
from hpcstack.validate.scheduler import BatchJob, gpu_options

pytestmark = pytest.mark.unit

TRAINER_DIR = REPO / "trainer"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def launch():
    """``hpcstack_train.launch`` and ``.report`` from the checkout (no torch)."""
    sys.path.insert(0, str(TRAINER_DIR))
    written, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield (importlib.import_module("hpcstack_train.launch"),
               importlib.import_module("hpcstack_train.report"))
    finally:
        sys.path.remove(str(TRAINER_DIR))
        sys.dont_write_bytecode = written
        for name in [m for m in sys.modules if m.split(".")[0] == "hpcstack_train"]:
            del sys.modules[name]


# --------------------------------------------------------------------------- the device choice

@pytest.mark.parametrize("local_rank, local_size, env, count, want", [
    # --gres=gpu:4 / --gpus-per-node=4: every rank sees the node's 4 GPUs, takes its local rank
    (3, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, ("cuda:3", "3", "local-rank", 4)),
    (2, 4, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 4, ("cuda:2", "6", "local-rank", 4)),
    # --gpus-per-task=1: Slurm binds one GPU to each task; rank 3 must take cuda:0, not cuda:3
    (3, 4, {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_PER_TASK": "1"}, None, ("cuda:0", "3", "one-visible", 1)),
    (1, 4, {"CUDA_VISIBLE_DEVICES": "GPU-1a2b"}, 1, ("cuda:0", "GPU-1a2b", "one-visible", 1)),
    # two GPUs bound to each task: its first own GPU
    (1, 2, {"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPUS_PER_TASK": "a100:2"}, None, ("cuda:0", "2", "per-task", 2)),
    # the batch step's mpirun under --gpus-per-task=1 sees the node's 4: the local rank again
    (2, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_PER_TASK": "1"}, None, ("cuda:2", "2", "local-rank", 4)),
    # a CPU node without the variable: what the rank would take, the index its physical GPU
    (1, 2, {}, None, ("cuda:1", "1", "local-rank", None)),
])
def test_choose_gpu(launch, local_rank, local_size, env, count, want):
    choice = launch[0].choose_gpu(local_rank, local_size, env, count)
    assert (choice.device, choice.physical, choice.rule, choice.visible) == want
    assert choice.problem is None
    assert choice.cuda_visible_devices == env.get("CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize("local_rank, env, count, words", [
    # 8 ranks on a node of 4 visible GPUs: ranks 4..7 have none of their own (no modulo share)
    (5, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, None, ["local rank 5 of 8", "4 visible", "'0,1,2,3'"]),
    (4, {}, 4, ["local rank 4 of 8", "4 visible", "unset"]),
    (0, {"CUDA_VISIBLE_DEVICES": ""}, None, ["sees no GPU", "''"]),
])
def test_choose_gpu_without_a_gpu_of_its_own_is_a_problem(launch, local_rank, env, count, words):
    choice = launch[0].choose_gpu(local_rank, 8, env, count)
    assert choice.index is None and choice.device is None and choice.rule == "none"
    assert all(word in choice.problem for word in words), choice.problem


def test_gpu_record_fields_and_their_packing(launch):
    lau, rep = launch
    choice = lau.choose_gpu(1, 4, {"CUDA_VISIBLE_DEVICES": "7"}, None)
    fields = lau.gpu_record_fields(5, 1, 4, choice, uses="cpu", host="n2")
    assert fields == {"rank": 5, "host": "n2", "local_rank": 1, "local_size": 4,
                      "cuda_visible_devices": "7", "visible": 1, "device": "cuda:0",
                      "physical_gpu": "7", "rule": "one-visible", "problem": None, "uses": "cpu"}
    assert lau.gpu_record_fields(0, 0, 1, choice, uses="cpu")["host"] == socket.gethostname()
    packed = rep.pack_fields(fields, 512)
    assert len(packed) == 512 and rep.unpack_fields([float(v) for v in packed]) == fields
    # a hostile, huge CUDA_VISIBLE_DEVICES is cut, and the record still fits and says so
    huge = {**fields, "cuda_visible_devices": "GPU-" + "f" * 5000}
    back = rep.unpack_fields(rep.pack_fields(huge, 1024))
    assert back["truncated"] is True and len(back["cuda_visible_devices"]) == 256
    assert rep.gpu_problem_lines([fields, {**fields, "rank": 6, "problem": "no GPU"}]) == ["rank 6 on n2: no GPU"]


# --------------------------------------------------------------------------- the judge's rule

def _gpu(rank, host, local_rank, cvd, device, physical, visible=None, problem=None):
    return {"record": "gpu", "rank": rank, "host": host, "local_rank": local_rank, "local_size": 4,
            "cuda_visible_devices": cvd, "visible": visible, "device": device,
            "physical_gpu": physical, "rule": "x", "problem": problem, "uses": "cpu"}


def _distinct(host="n1", offset=0):
    # --gpus-per-task=1, as Slurm binds it: each task its own GPU, each picks cuda:0
    return [_gpu(offset + r, host, r, str(r), "cuda:0", str(r), 1) for r in range(4)]


def test_distinct_gpus_pass():
    assert gpu_binding_reasons(_distinct("n1") + _distinct("n2", 4), 4) == []
    # every rank sees all four, each takes its local rank
    assert gpu_binding_reasons([_gpu(r, "n1", r, "0,1,2,3", f"cuda:{r}", str(r), 4) for r in range(4)], 4) == []


def test_two_ranks_of_a_node_on_one_gpu_fail_naming_ranks_node_and_visible_devices():
    # all four ranks see 0,1,2,3 and pick cuda:0 (the bug of a program that ignores the local rank)
    records = [_gpu(r, "n1", r, "0,1,2,3", "cuda:0", "0", 4) for r in range(4)] + _distinct("n2", 4)
    assert gpu_binding_reasons(records, 4) == [
        "ranks 0, 1, 2, 3 on n1 would share GPU 0 (cuda:0; CUDA_VISIBLE_DEVICES "
        "'0,1,2,3', '0,1,2,3', '0,1,2,3', '0,1,2,3')"]
    # the same physical GPU on two nodes is no sharing
    assert gpu_binding_reasons(_distinct("n1") + _distinct("n2", 4), 4) == []


def test_an_index_the_rank_cannot_see_fails():
    # bound to one GPU each, but rank 3 picks cuda:3 (cuda:local_rank under --gpus-per-task=1)
    records = _distinct()[:3] + [_gpu(3, "n1", 3, "3", "cuda:3", "3", 1)]
    assert gpu_binding_reasons(records, 4) == [
        "rank 3 on n1 (local rank 3) would pick cuda:3 but sees 1 GPU(s) (CUDA_VISIBLE_DEVICES '3')"]
    # unset CUDA_VISIBLE_DEVICES on a 4-GPU node: cuda:5 is not there
    assert gpu_binding_reasons([_gpu(5, "n1", 5, None, "cuda:5", "5")], 4) == [
        "rank 5 on n1 (local rank 5) would pick cuda:5 but the node has 4 GPU(s) "
        "(slurm.gpus_per_node; CUDA_VISIBLE_DEVICES unset)"]
    # the trainer's own problem line is passed on
    (line,) = gpu_binding_reasons([_gpu(4, "n1", 4, "0,1,2,3", None, None, 4, problem="no GPU of its own")], 4)
    assert line == "rank 4 on n1 (local rank 4) has no GPU to use: no GPU of its own (CUDA_VISIBLE_DEVICES '0,1,2,3')"


def test_the_rule_is_off_on_a_cpu_site_and_for_programs_without_gpu_records():
    shared = [_gpu(r, "n1", r, "0", "cuda:0", "0", 1) for r in range(2)]
    assert gpu_binding_reasons(shared, 0) == []
    assert gpu_binding_reasons([{"record": "throughput", "rank": 0}], 4) == []


def _run(records, ranks=2):
    base = [{"record": "config", "world_size": ranks, "transport": "gloo"}]
    base += [{"record": "throughput", "rank": r} for r in range(ranks)]
    base += [{"record": "result", "ok": True, "reasons": []}]
    return RunOutcome("ddp", 1, ranks, "7", "COMPLETED", "0:0", 0, base + records)


@pytest.mark.parametrize("gpus_per_node, ok", [(4, False), (0, True)])
def test_judge_fails_a_shared_gpu_only_on_a_gpu_site(gpus_per_node, ok):
    shared = [_gpu(r, "n1", r, "5", "cuda:0", "5", 1) for r in range(2)]
    verdict = judge([_run(shared)], site="twin", partition="gpu", recipe="pytorch/2.3.1-gpu",
                    references={}, gpus_per_node=gpus_per_node)
    assert verdict.ok is ok
    assert verdict.to_dict()["runs"][0]["gpus"][1] == {
        "rank": 1, "host": "n1", "local_rank": 1, "cuda_visible_devices": "5", "device": "cuda:0",
        "physical_gpu": "5", "uses": "cpu"}
    if not ok:
        assert verdict.failures == ["sanity: ddp on 1 node(s) (job 7): ranks 0, 1 on n1 would share GPU 5 "
                                    "(cuda:0; CUDA_VISIBLE_DEVICES '5', '5')"]


# --------------------------------------------------------------------------- sacctmgr and sbatch

#: ``sacctmgr -nP show user alice withassoc format=User,DefaultAccount,Cluster,Account,Partition,QOS,DefaultQOS``
#: as Slurm 22.05 prints it: ``|``-separated, no header, the QOS list comma-separated, an empty
#: partition for an association of every partition.
ASSOC = textwrap.dedent("""\
    alice|ec123|twin|ec123|gpu|gpu,short|gpu
    alice|ec123|twin|ec123|standard|normal|
    alice|ec123|twin|tc999||normal,regular|regular
    """)
QOS = "normal\ngpu\nshort\nregular\ndebug\n"


def test_parse_associations_reads_real_format():
    rows = preflight.parse_associations(ASSOC + "bob|||||\n")      # bob: a user without associations
    assert [(a.account, a.partition, a.qos, a.default_qos) for a in rows] == [
        ("ec123", "gpu", ("gpu", "short"), "gpu"), ("ec123", "standard", ("normal",), ""),
        ("tc999", "", ("normal", "regular"), "regular")]
    assert {a.default_account for a in rows} == {"ec123"}
    assert preflight.parse_qos_names(QOS) == {"normal", "gpu", "short", "regular", "debug"}
    assert preflight.association_command("alice")[:6] == ["sacctmgr", "-nP", "show", "user", "alice", "withassoc"]


@pytest.mark.parametrize("account, partition, qos", [
    ("ec123", "gpu", "gpu"), ("EC123", "gpu", "short"), (None, "gpu", None),   # the default account, its default QOS
    ("tc999", "gpu", "regular"), ("tc999", None, None), ("ec123", "standard", None),
])
def test_allowed_jobs_pass(account, partition, qos):
    assert preflight.check_associations("alice", account, partition, qos, ASSOC, QOS) == []


@pytest.mark.parametrize("user, account, partition, qos, line", [
    ("alice", "ec999", "gpu", None,
     "--account (slurm.account): user alice has no association with account 'ec999' "
     "(alice's accounts: ec123, tc999; default: ec123)"),
    ("carol", None, "gpu", None,
     "--account (slurm.account): user carol has no association in Slurm's accounting, so Slurm "
     "refuses every job of carol; ask the site to add carol to an account"),
    ("alice", "ec123", "booster", None,
     "--partition (slurm.partition): user alice's account 'ec123' is associated with partition(s) "
     "gpu, standard only, not 'booster'"),
    ("alice", "ec123", "gpu", "regular",
     "--qos (slurm.qos): QOS 'regular' is not allowed for user alice in account 'ec123' on partition "
     "'gpu' (allowed: gpu, short; default: gpu)"),
    ("alice", None, "gpu", "premium",
     "--qos (slurm.qos): QOS 'premium' does not exist (the cluster's QOS: debug, gpu, normal, regular, short)"),
])
def test_refused_jobs_give_one_line_naming_the_key_and_what_is_allowed(user, account, partition, qos, line):
    assert preflight.check_associations(user, account, partition, qos, ASSOC, QOS) == [line]


def test_no_qos_given_and_the_default_not_allowed():
    text = "dave|ec1|twin|ec1|gpu|gpu|\n"          # no DefaultQOS: the job would get 'normal'
    assert preflight.check_associations("dave", None, "gpu", None, text, QOS) == [
        "--qos (slurm.qos): no QOS given, and the default 'normal' is not allowed for user dave in "
        "account 'ec1' (dave's default) on partition 'gpu' (allowed: gpu); give --qos"]
    assert preflight.check_associations("dave", None, "gpu", None, "dave||twin|ec1|gpu|gpu|\n", QOS) == [
        "--account (slurm.account): no account given and user dave has no default account "
        "(dave's accounts: ec1; default: none); give --account"]


@pytest.mark.parametrize("stderr, cause", [
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified\n",
     "--account (slurm.account)"),
    ("sbatch: error: Batch job submission failed: Invalid qos specification\n", "--qos (slurm.qos)"),
    # a job_submit.lua filter's message (Cirrus refuses #SBATCH --ntasks on GPU jobs)
    ("sbatch: error: GPU jobs must give --ntasks to srun, not as #SBATCH options\n"
     "sbatch: error: Batch job submission failed: Unspecified error\n",
     "slurm.task_options / slurm.tasks_per_node / slurm.cpus_per_task"),
    ("sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification\n",
     "slurm.gpus_per_node / slurm.gpu_request"),
])
def test_sbatch_refusal_is_one_line_with_the_likely_option(stderr, cause):
    line = preflight.sbatch_refusal(stderr)
    assert "\n" not in line and "sbatch: error" not in line
    assert line.startswith("sbatch refused the job: ") and line.endswith(f"(likely cause: {cause})")
    assert preflight.sbatch_refusal("") == "sbatch refused the job: exit status 1"


def test_submit_refusal_is_that_line(tmp_path):
    from hpcstack.errors import HpcstackError
    from hpcstack.validate.scheduler import Slurm

    def refuse(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Batch job submission failed: "
                                                         "Invalid qos specification\n")

    with pytest.raises(HpcstackError) as err:
        Slurm(run=refuse).submit(tmp_path / "job.sh", content="#!/bin/bash\n")
    assert str(err.value).startswith("sbatch refused the job: Batch job submission failed: Invalid qos "
                                     "specification (likely cause: --qos (slurm.qos))")


def test_check_accounting_is_off_without_accounting_and_notes_a_missing_sacctmgr(capsys):
    from hpcstack.validate.validation import SlurmSettings, check_accounting

    s = SlurmSettings(partition="gpu", qos=None, account=None, tasks_per_node=4, cpus_per_task=1,
                      gpus_per_node=4, time_limit="00:10:00", exclusive=False, launcher="srun",
                      mpi=None, submit_as=None, env={}, accounting=False)
    never = lambda *a, **k: pytest.fail("sacctmgr asked on a site without accounting")  # noqa: E731
    check_accounting(s, None, run=never, which=never)
    import dataclasses
    check_accounting(dataclasses.replace(s, accounting=True), None, run=never, which=lambda name: None)
    assert "note: sacctmgr not found" in capsys.readouterr().err


# --------------------------------------------------------------------------- gpus-per-task

def _with_slurm(base, **slurm):
    data = unit_site(base)
    data["slurm"] = {**data["slurm"], **slurm}
    return data


def test_site_check_of_gpus_per_task():
    ok = _with_slurm("perlmutter", gpu_request="gpus-per-task")
    assert check_config(ok, "p.yaml") == []
    bad = _with_slurm("perlmutter", gpu_request="gpus-per-task", tasks_per_node=8)
    assert check_config(bad, "p.yaml") == [
        "p.yaml: slurm.gpu_request: gpus-per-task runs one task per GPU: slurm.tasks_per_node is 8, "
        "slurm.gpus_per_node 4; make them equal"]
    cirrus = _with_slurm("cirrus", gpu_request="gpus-per-task")
    assert check_config(cirrus, "c.yaml") == [
        "c.yaml: slurm.gpu_request: gpus-per-task needs the task count as #SBATCH options (sbatch: "
        "--gpus-per-task requires an explicit task count); slurm.task_options is srun"]
    assert check_config(_with_slurm("localhost", gpu_request="gpus-per-task"), "l.yaml") == [
        "l.yaml: slurm.gpu_request: gpus-per-task needs slurm.gpus_per_node > 0"]


def test_gpu_options_per_request():
    assert gpu_options("gres", 4, 2, 4) == ["--gres=gpu:4"]
    assert gpu_options("gpus-per-node", 4, 2, 4) == ["--gpus-per-node=4"]
    assert gpu_options("gpus-per-task", 4, 2, 4) == ["--ntasks=8", "--gpus-per-task=1"]
    assert gpu_options("gpus-per-task", 0, 2, 4) == []
    job = BatchJob(name="j", nodes=2, tasks_per_node=4, cpus_per_task=8, time_limit="00:10:00",
                   output="/w/slurm-%j.out", workdir="/w", module_init="/i", gpus_per_node=4,
                   gpu_request="gpus-per-task")
    opts = job.sbatch_options()
    assert opts.index("--ntasks-per-node=4") < opts.index("--ntasks=8") < opts.index("--gpus-per-task=1")
    assert not any(o.startswith(("--gres", "--gpus-per-node")) for o in opts)
    with pytest.raises(ConfigError, match="gpus-per-task needs the task count"):
        BatchJob(**{**job.__dict__, "task_options": "srun"}).sbatch_options()


def _normalise(text: str) -> str:
    import hpcstack

    text = text.replace(str(Path(hpcstack.__file__).resolve().parent / "data"), "@HPCSTACK_DATA@")
    return re.sub(r"[^\s=]*/hpcstack-validate-pytorch-2\.3\.1-gpu-\d{8}-\d{6}", "@VALIDATION_DIR@", text)


def test_gpus_per_task_job_script_golden(tmp_path):
    """Perlmutter's shape with ``gpu_request: gpus-per-task``: the one change from
    perlmutter-validate.sh is the GPU request (``--ntasks=8 --gpus-per-task=1`` for 2 nodes)."""
    repo = site_overlay(tmp_path / "repo", "perlmutter", name="perlmutter-gpt")
    path = repo / "site-configs" / "perlmutter-gpt.yaml"
    data = yaml.safe_load(path.read_text())
    data["slurm"]["gpu_request"] = "gpus-per-task"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = run_hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "perlmutter-gpt", "--repo", str(repo),
                        "--dry-run")
    assert proc.returncode == 0, proc.stderr
    got = _normalise(proc.stdout)
    assert_golden(GOLDEN / "perlmutter-gpus-per-task-validate.sh", got)
    sbatch = re.findall(r"^#SBATCH (\S+)$", got, flags=re.M)
    assert "--ntasks=8" in sbatch and "--gpus-per-task=1" in sbatch and "--ntasks-per-node=4" in sbatch
    assert not any(o.startswith(("--gpus-per-node", "--gres")) for o in sbatch)


def test_gpus_per_task_in_reframe_and_the_users_help(tmp_path):
    from hpcstack.install.components.userhelp import sbatch_options
    from hpcstack.site import load_site

    repo = site_overlay(tmp_path / "repo", "perlmutter", name="perlmutter-gpt")
    path = repo / "site-configs" / "perlmutter-gpt.yaml"
    data = yaml.safe_load(path.read_text())
    data["slurm"]["gpu_request"] = "gpus-per-task"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    site = load_site(str(path))
    opts = sbatch_options(site)
    assert "--ntasks=8" in opts and "--gpus-per-task=1" in opts and "--ntasks-per-node=4" in opts
    assert not any(o.startswith(("--gpus-per-node", "--gres")) for o in opts)
    out = tmp_path / "rfm"
    proc = run_hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "perlmutter-gpt", "--repo", str(repo),
                        "--emit", "reframe", str(out))
    assert proc.returncode == 0, proc.stderr
    settings = next(out.glob("*settings*.py")).read_text()
    assert "'--gpus-per-task=1'" in settings and "--gpus-per-node" not in settings


# --------------------------------------------------------------------------- with the real torch

PROBE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from hpcstack_train.backends import Comm, gpu_choice, pick_device
    from hpcstack_train.errors import UsageError
    cases = json.loads(sys.argv[2])
    out = []
    for local_rank, local_size, env in cases:
        comm = Comm(); comm.local_rank, comm.local_size = local_rank, local_size
        choice = gpu_choice(comm, env)
        try:
            cuda = str(pick_device("cuda", local_rank, local_size, env))
        except UsageError as err:
            cuda = "UsageError: " + str(err)
        out.append([str(pick_device("auto", local_rank, local_size, env)), choice.device,
                    choice.physical, cuda])
    print(json.dumps(out))
""")


@pytest.mark.e2e
def test_device_choice_with_the_stacks_torch_on_the_cpu(installed_stack):
    python = str(installed_stack / "venv" / "bin" / "python")
    cases = [[3, 4, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}],
             [3, 4, {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_PER_TASK": "1"}],
             [1, 2, {}]]
    done = subprocess.run([python, "-c", PROBE, str(TRAINER_DIR), json.dumps(cases)],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    # no CUDA here: every rank trains on the CPU, reports what it would pick, and --device cuda is refused
    assert [row[:3] for row in got] == [["cpu", "cuda:3", "3"], ["cpu", "cuda:0", "3"], ["cpu", "cuda:1", "1"]]
    assert all(row[3] == "UsageError: --device cuda requested but torch.cuda.is_available() is False"
               for row in got)


@pytest.mark.e2e
def test_two_ranks_bound_to_one_gpu_fail_the_judge(installed_stack, tmp_path):
    """mpirun gives both ranks the same ``CUDA_VISIBLE_DEVICES=5``: each would take cuda:0, the
    same physical GPU; on a site with GPUs the judge fails the run, naming both ranks."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun not on PATH")
    python = str(installed_stack / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")}
    env.update(CUDA_VISIBLE_DEVICES="5", MASTER_PORT=str(_free_port()))
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    output = tmp_path / "ddp.jsonl"
    done = subprocess.run([mpirun, "-np", "2", "--oversubscribe", "-x", "CUDA_VISIBLE_DEVICES", python,
                           str(TRAINER_DIR / "hpcstack-train-benchmark"), "--backend", "ddp",
                           "--no-collectives-check", "--num-warmup-batches", "1", "--num-batches-per-iter", "1",
                           "--num-iters", "2", "--output", str(output)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in output.read_text().splitlines()]
    gpus = [r for r in records if r["record"] == "gpu"]
    assert [(g["rank"], g["cuda_visible_devices"], g["device"], g["physical_gpu"], g["uses"]) for g in gpus] == [
        (0, "5", "cuda:0", "5", "cpu"), (1, "5", "cuda:0", "5", "cpu")]
    run = RunOutcome("ddp", 1, 2, "1", "COMPLETED", "0:0", 0, records)
    host = gpus[0]["host"]
    assert judge([run], site="twin", partition="gpu", recipe="pytorch/2.3.1-gpu", references={},
                 gpus_per_node=4).failures == [
        f"sanity: ddp on 1 node(s) (job 1): ranks 0, 1 on {host} would share GPU 5 (cuda:0; "
        "CUDA_VISIBLE_DEVICES '5', '5')"]
    assert judge([run], site="twin", partition="cpu", recipe="pytorch/2.3.1-gpu", references={},
                 gpus_per_node=0).ok


def _free_port() -> int:
    """A port for the rendezvous (conftest.free_port: below the ephemeral range)."""
    return free_port()


def test_jax_validate_takes_its_bound_gpu_under_gpus_per_task():
    """JAX's Slurm detection drives GPU SLURM_LOCALID of what the task sees (jax-ml/jax#28194):
    under --gpus-per-task=1 jax-validate hands it the task's one GPU instead; elsewhere JAX's choice."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("jax_validate", str(REPO / "recipes" / "jax" / "jax-validate"))
    spec = importlib.util.spec_from_loader("jax_validate", loader)
    module = importlib.util.module_from_spec(spec)
    written, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = written
    ids = module.bound_device_ids
    assert ids({"CUDA_VISIBLE_DEVICES": "3", "SLURM_LOCALID": "3"}) == [0]
    assert ids({"CUDA_VISIBLE_DEVICES": "2,3", "SLURM_GPUS_PER_TASK": "2"}) == [0]
    assert ids({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_GPUS_PER_TASK": "1"}) is None
    assert ids({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) is None and ids({}) is None
