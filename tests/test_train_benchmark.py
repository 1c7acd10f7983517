"""Tests of the trainer (the package ``trainer/hpcstack_train`` run by its entry script
``trainer/hpcstack-train-benchmark``), the training check shipped inside the stack.

The script runs for real: 2 ranks under Open MPI's ``mpirun`` for each backend (DDP over Gloo,
Horovod), on the CPU, with the defaults for a 2-core node and a shortened benchmark phase. The
interpreter is the python of the installed pytorch/2.3.1-gpu stack (conftest's ``installed_stack``,
which the README's main command installs), with torch and horovod.torch. mpirun and scikit-learn
skip, with the reason, where they are missing.
The helpers (launcher environment, threads, the collectives check's exact values) run in one
subprocess of that interpreter, importing the package from the checkout; those that need no torch
are tested without it in tests/test_trainer_package.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import free_port

pytestmark = pytest.mark.unit

TRAINER_DIR = Path(__file__).resolve().parent.parent / "trainer"
#: The entry script as the stack installs it; in the checkout it finds the package beside itself.
SCRIPT = TRAINER_DIR / "hpcstack-train-benchmark"
# A short benchmark phase; the convergence phase keeps its defaults (tiny model: 100 steps,
# threshold 1.0) where it must pass.
FAST = ["--num-warmup-batches", "2", "--num-batches-per-iter", "3", "--num-iters", "3"]
RUN_TIMEOUT_S = 180
RECORD_ORDER = ["config", "gpu", "gpu", "collectives", "throughput", "throughput", "throughput_total",
                "convergence", "startup", "startup", "result"]


def _probe(python: str, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def python(installed_stack: Path) -> str:
    """The interpreter of the installed stack (conftest's ``installed_stack``), which imports torch."""
    chosen = str(installed_stack / "venv" / "bin" / "python")
    probe = _probe(chosen, "import torch")
    assert probe.returncode == 0, f"{chosen} cannot import torch: {probe.stderr[-2000:]}"
    return chosen


@pytest.fixture(scope="module")
def mpirun() -> str:
    """Open MPI's mpirun (the DDP backend reads OMPI_COMM_WORLD_* variables)."""
    found = shutil.which("mpirun")
    if not found:
        pytest.skip("mpirun not on PATH")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    if "Open MPI" not in version.stdout + version.stderr:
        pytest.skip(f"{found} is not Open MPI")
    return found


@pytest.fixture(scope="module")
def horovod(python: str) -> None:
    probe = _probe(python, "import horovod.torch")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{python} cannot import horovod.torch: {last}")


@pytest.fixture(params=["ddp", "horovod"])
def backend(request) -> str:
    if request.param == "horovod":
        request.getfixturevalue("horovod")
    return request.param


def _free_port() -> int:
    """A port for the rendezvous (conftest.free_port: below the ephemeral range)."""
    return free_port()


def parse_records(text: str) -> list[dict]:
    """JSON-line records in ``text``; other lines (launcher messages) are ignored."""
    records = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "record" in record:
            records.append(record)
    return records


def run_two_ranks(mpirun: str, python: str, backend: str,
                  *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MASTER_PORT=str(_free_port()))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [mpirun, "-np", "2"]
    if (os.cpu_count() or 1) < 2:
        command.append("--oversubscribe")
    command += [python, str(SCRIPT), "--backend", backend, *FAST, *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=RUN_TIMEOUT_S)


def by_kind(records: list[dict], kind: str) -> list[dict]:
    return [record for record in records if record["record"] == kind]


@pytest.mark.e2e
def test_two_ranks_converge_with_identical_parameters(mpirun, python, backend):
    done = run_two_ranks(mpirun, python, backend)
    assert done.returncode == 0, done.stderr[-3000:]
    records = parse_records(done.stdout)
    assert [record["record"] for record in records] == RECORD_ORDER

    config = by_kind(records, "config")[0]
    assert (config["backend"], config["world_size"], config["device"]) == (backend, 2, "cpu")
    assert config["model"] == "tiny" and config["image_size"] == 32
    if backend == "ddp":
        assert (config["launcher"], config["transport"]) == ("openmpi", "gloo")

    throughput = by_kind(records, "throughput")
    assert sorted(record["rank"] for record in throughput) == [0, 1]
    for record in throughput:
        assert len(record["img_per_sec_iters"]) == 3
        assert all(value > 0 for value in record["img_per_sec_iters"])
        assert min(record["img_per_sec_iters"]) <= record["img_per_sec_mean"] \
            <= max(record["img_per_sec_iters"])
        assert record["img_per_sec_ci95"] >= 0
    total = by_kind(records, "throughput_total")[0]
    means = [record["img_per_sec_mean"] for record in throughput]
    assert total["world_size"] == 2
    assert total["img_per_sec"] == pytest.approx(sum(means), rel=1e-9)
    # The ranks step in lockstep (every step ends in an allreduce), so Horovod's way of
    # reporting the total (world size x rank 0's mean) must agree roughly.
    assert total["img_per_sec"] == pytest.approx(2 * means[0], rel=0.25)

    convergence = by_kind(records, "convergence")[0]
    assert convergence["loss_fell"] and convergence["below_threshold"]
    assert convergence["final_loss"] < min(convergence["initial_loss"], convergence["threshold"])
    # below the loss of predicting the label frequencies: the model learnt from its input
    assert convergence["final_loss"] < convergence["baseline_loss"] < convergence["initial_loss"]
    assert convergence["params_identical"]
    hashes = convergence["param_hashes"]
    assert len(hashes) == 2 and hashes[0] == hashes[1]
    assert len(hashes[0]) == 64 and int(hashes[0], 16) >= 0

    result = by_kind(records, "result")[0]
    assert result["ok"] is True and result["reasons"] == []
    assert "result: OK" in done.stderr

    # one gpu record per rank: on this CPU node, what each rank would pick (mpirun: local ranks
    # 0 and 1 of one host, CUDA_VISIBLE_DEVICES as the test's environment has it)
    gpus = by_kind(records, "gpu")
    assert [(g["rank"], g["local_rank"], g["local_size"], g["uses"]) for g in gpus] == [
        (0, 0, 2, "cpu"), (1, 1, 2, "cpu")]
    assert gpus[0]["host"] == gpus[1]["host"] == socket.gethostname()
    assert all(g["cuda_visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES") for g in gpus)

    collectives = by_kind(records, "collectives")[0]
    assert collectives["ok"] is True and collectives["failures"] == []
    assert collectives["failed_checks"] == 0
    assert (collectives["backend"], collectives["device"]) == (backend, "cpu")
    common = {"allreduce_sum", "allreduce_min", "allreduce_max", "allreduce_fused_sum",
              "allgather_equal", "broadcast", "alltoall", "reducescatter_sum"}
    skipped = {(item["op"], item["dtype"]): item["reason"] for item in collectives["skipped"]}
    if backend == "horovod":
        # Horovod 0.28.1 has Average (and reducescatter, alltoall, uneven allgather) on the
        # CPU, but no bfloat16 ops at all
        assert set(collectives["ops"]) == common | {"allreduce_average", "allreduce_fused_average",
                                                    "allgather_unequal", "reducescatter_average"}
        assert collectives["dtypes"] == ["float32", "float16", "float64", "int32", "int64"]
        assert "BFloat16Tensor" in skipped[("allreduce_sum", "bfloat16")]
        assert collectives["checks"] == 5 * (4 * 8 + 2 + 2 * 8 + 8 + 8 + 2 * 8)
    else:
        # Gloo has neither ReduceOp.AVG nor all_gather of unequal shapes
        assert set(collectives["ops"]) == common
        assert len(collectives["dtypes"]) == 6
        assert "ReduceOp.AVG" in skipped[("allreduce_average", "float16")]
        assert "equal shapes" in skipped[("allgather_unequal", "int64")]
        assert collectives["checks"] == 6 * (3 * 8 + 1 + 8 + 8 + 8 + 8)
    assert collectives["sizes"] == ["1", "17", "1023", "1025", "4913", "65521", "65537",
                                    "1048577", "64x1..257"]
    assert 0 < collectives["seconds"] < result["wall_seconds"]
    assert "collectives: " in done.stderr and " checks (" in done.stderr


@pytest.mark.e2e
def test_collective_mismatch_fails_naming_backend_op_dtype_size_rank_and_element(
        mpirun, python, backend, tmp_path):
    output = tmp_path / "result.jsonl"
    done = run_two_ranks(mpirun, python, backend, "--inject-collective-mismatch",
                         "--convergence-steps", "20", "--output", str(output))
    assert done.returncode == 1, done.stderr[-3000:]
    records = parse_records(output.read_text())
    assert [record["record"] for record in records] == RECORD_ORDER
    # the last rank's allreduce_sum of 4,913 float32 values is one too large in its last element
    message = (f"{backend} allreduce_sum float32 size 4913 on rank 1: element 4912 is 21, "
               "want 20 (1 of 4913 elements wrong)")
    collectives = by_kind(records, "collectives")[0]
    assert collectives["ok"] is False
    assert collectives["failures"] == [message] and collectives["failed_checks"] == 1
    result = by_kind(records, "result")[0]
    assert result["ok"] is False
    assert result["reasons"][0] == f"collectives check: 1 wrong result(s): {message}"
    assert f"rank 1: collective mismatch: {message}" in done.stderr


@pytest.mark.e2e
def test_failed_checks_exit_1(mpirun, python, backend, tmp_path):
    """An impossible threshold and a perturbed parameter on rank 1 must both be reported."""
    output = tmp_path / "result.jsonl"
    done = run_two_ranks(mpirun, python, backend, "--loss-threshold", "0",
                         "--inject-param-mismatch", "--convergence-steps", "40",
                         "--no-collectives-check", "--output", str(output))
    assert done.returncode == 1, done.stderr[-3000:]
    assert parse_records(done.stdout) == []  # --output replaces stdout
    records = parse_records(output.read_text())
    assert [record["record"] for record in records] == [
        kind for kind in RECORD_ORDER if kind != "collectives"]
    assert "collectives:" not in done.stderr

    convergence = by_kind(records, "convergence")[0]
    assert convergence["threshold"] == 0
    assert convergence["loss_fell"] and not convergence["below_threshold"]
    assert not convergence["params_identical"]
    assert len(set(convergence["param_hashes"])) == 2

    result = by_kind(records, "result")[0]
    assert result["ok"] is False
    assert any("not below threshold 0" in reason for reason in result["reasons"])
    assert any("parameters differ" in reason for reason in result["reasons"])
    assert "result: FAILED" in done.stderr


@pytest.mark.e2e
def test_ddp_without_launcher_is_a_usage_error(python):
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("OMPI_", "PMIX_", "SLURM_"))
           and name not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([python, str(SCRIPT), "--backend", "ddp"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert "no launcher environment" in done.stderr
    assert parse_records(done.stdout) == []


HELPER_CASES = textwrap.dedent("""
    import json, subprocess, sys
    sys.dont_write_bytecode = True
    sys.path.insert(0, sys.argv[1])
    from hpcstack_train import launch as tb

    def no_scontrol(*args, **kwargs):
        raise FileNotFoundError("scontrol")

    def scontrol(*args, **kwargs):
        return subprocess.CompletedProcess(args, 0, stdout="c1\\nc2\\n", stderr="")

    def launch(environ, run=no_scontrol):
        try:
            found = tb.resolve_launch_env(environ, run=run)
            return [found.rank, found.world_size, found.local_rank, found.local_size,
                    found.master_addr, found.master_port, found.launcher]
        except tb.UsageError as err:
            return "UsageError: " + str(err)

    torchrun = dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                    MASTER_ADDR="n0", MASTER_PORT="1234")
    ompi = dict(OMPI_COMM_WORLD_RANK="1", OMPI_COMM_WORLD_SIZE="2",
                OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="2")
    ompi_multi = dict(OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="8",
                      OMPI_COMM_WORLD_LOCAL_RANK="1", OMPI_COMM_WORLD_LOCAL_SIZE="4")
    slurm = dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_NODEID="1",
                 SLURM_TASKS_PER_NODE="4(x2)", SLURM_JOB_NODELIST="gpu[07-08]")
    print(json.dumps({
        "torchrun": launch(torchrun),
        "openmpi in allocation": launch({**ompi, "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}),
        "openmpi multi-node, slurm": launch({**ompi_multi, "SLURM_JOB_NODELIST": "a[3-4]"}),
        "openmpi multi-node, no master": launch(ompi_multi),
        "slurm": launch(slurm),
        "slurm, scontrol": launch(slurm, run=scontrol),
        "slurm, uneven": launch({**slurm, "SLURM_TASKS_PER_NODE": "5,3", "SLURM_PROCID": "6",
                                 "SLURM_LOCALID": "1"}),
        "nothing": launch({"PATH": "/usr/bin"}),
        "hosts": [tb.first_host_of_nodelist(text) for text in
                  ["n1", "node[01-04,07],gpu5", "rack[2-3]-n[007-9]", "x[5,1-2]"]],
        "threads": [tb.threads_per_rank(2, 2, 2), tb.threads_per_rank(2, 2, 1),
                    tb.threads_per_rank(1, 16, 16), tb.threads_per_rank(4, 16, 3),
                    tb.threads_per_rank(8, 2, 2)],
    }))
""")


@pytest.fixture(scope="module")
def helpers(python) -> dict:
    done = subprocess.run([python, "-c", HELPER_CASES, str(TRAINER_DIR)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.e2e
@pytest.mark.parametrize("case, expected", [
    ("torchrun", [3, 4, 1, 2, "n0", 1234, "torchrun"]),
    # mpirun inside an allocation leaves SLURM_PROCID=0 in every rank: Open MPI must win.
    ("openmpi in allocation", [1, 2, 1, 2, "127.0.0.1", 29500, "openmpi"]),
    ("openmpi multi-node, slurm", [5, 8, 1, 4, "a3", 29500, "openmpi"]),
    ("slurm", [5, 8, 1, 4, "gpu07", 29500, "slurm"]),
    ("slurm, scontrol", [5, 8, 1, 4, "c1", 29500, "slurm"]),
    ("slurm, uneven", [6, 8, 1, 3, "gpu07", 29500, "slurm"]),
])
def test_resolve_launch_env(helpers, case, expected):
    assert helpers[case] == expected


@pytest.mark.e2e
@pytest.mark.parametrize("case, message", [
    ("openmpi multi-node, no master", "MASTER_ADDR is not set"),
    ("nothing", "no launcher environment"),
])
def test_resolve_launch_env_refuses(helpers, case, message):
    assert helpers[case].startswith("UsageError") and message in helpers[case]


@pytest.mark.e2e
def test_first_host_of_nodelist(helpers):
    assert helpers["hosts"] == ["n1", "node01", "rack2-n007", "x5"]


@pytest.mark.e2e
def test_threads_per_rank(helpers):
    # max(1, cores // ranks per node), capped by the cores the rank is bound to
    assert helpers["threads"] == [1, 1, 16, 3, 1]


# The collectives check's expected values: closed forms against brute force over explicit
# per-rank inputs, exactness in every dtype, and the partitions of reducescatter and alltoall.
COLLECTIVE_CASES = textwrap.dedent("""
    import json, sys, types
    sys.dont_write_bytecode = True
    sys.path.insert(0, sys.argv[1])
    import torch
    from hpcstack_train import collective_cases, collectives, report
    names = {}
    for module in (collective_cases, collectives, report):
        names.update(vars(module))
    tb = types.SimpleNamespace(**names)

    out = {"closed_form_wrong": [], "inexact": [], "max_abs_partial": {}}
    for n in (1, 2, 3, 5, 16, 17):
        for dtype, limit in tb.EXACT_LIMIT.items():
            amp = tb.reduction_amplitudes(n, limit)
            if amp is None:
                continue
            base, spread = amp
            inputs = torch.stack([tb.reduction_input(r, n, 4913, base, spread) for r in range(n)])
            brute = {"sum": inputs.sum(0), "min": inputs.min(0).values,
                     "max": inputs.max(0).values}
            assert (brute["sum"] % n == 0).all()
            brute["average"] = brute["sum"] // n
            for op, want in brute.items():
                if not torch.equal(tb.reduction_expected(op, n, 4913, base, spread), want):
                    out["closed_form_wrong"].append([n, dtype, op])
            # every partial sum in any order is bounded by the sum of magnitudes
            bound = int(inputs.abs().sum(0).max())
            out["max_abs_partial"][f"{n}:{dtype}"] = [bound, limit]
            values = torch.cat([inputs.reshape(-1), brute["sum"]])
            if not torch.equal(values.to(getattr(torch, dtype)).to(torch.int64), values):
                out["inexact"].append([n, dtype])
    out["zero_in_a"] = int((tb.exact_pattern(100000, 0, 16) == 0).sum())
    out["a_range"] = [int(tb.exact_pattern(100000, 0, 16).min()),
                      int(tb.exact_pattern(100000, 0, 16).max())]
    out["slice_equals_offset"] = torch.equal(tb.exact_pattern(100, 3, 7)[40:60],
                                             tb.exact_pattern(20, 3, 7, offset=40))
    out["streams_differ"] = not torch.equal(tb.exact_pattern(64, 0, 120),
                                            tb.exact_pattern(64, 1, 120))
    out["amplitudes"] = [tb.reduction_amplitudes(2, 2 ** 8), tb.reduction_amplitudes(16, 2 ** 8),
                         tb.reduction_amplitudes(17, 2 ** 8), tb.reduction_amplitudes(300, 2 ** 8),
                         tb.reduction_amplitudes(2, 2 ** 24)]
    out["rows"] = {f"{rows}/{n}": [tb.reducescatter_rows(rows, n, r) for r in range(n)]
                   for rows, n in ((5, 2), (4913, 3), (2, 2), (7, 4))}
    out["splits"] = {f"{count}/{n}": [tb.alltoall_splits(count, n, s) for s in range(n)]
                     for count, n in ((1, 2), (17, 3))}
    got = torch.tensor([1., 2., 3., 4.])
    out["mismatch"] = [tb.first_mismatch(got, torch.tensor([1., 2., 3., 4.])),
                       tb.first_mismatch(got, torch.tensor([1., 0., 3., 0.])),
                       tb.first_mismatch(torch.tensor([1., float("nan")]), torch.tensor([1., 2.])),
                       tb.first_mismatch(got, torch.tensor([1., 2.])),
                       tb.first_mismatch(got, torch.tensor([1., 2., 3., 4.001]), 0.01)]
    out["message"] = tb.mismatch_message("horovod", "allreduce_average", "float32", 4913, 1,
                                         (1, 4912, 0.0, 7.0))
    out["skipped"] = tb.skipped_summary([
        {"op": op, "dtype": "bfloat16", "reason": "no bf16"} for op in tb.COLLECTIVES] + [
        {"op": "allreduce_average", "dtype": d, "reason": "no AVG"} for d in ("int32", "int64")])
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def collective_cases(python) -> dict:
    done = subprocess.run([python, "-c", COLLECTIVE_CASES, str(TRAINER_DIR)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.e2e
def test_reduction_closed_forms_equal_brute_force(collective_cases):
    assert collective_cases["closed_form_wrong"] == []
    assert len(collective_cases["max_abs_partial"]) >= 30


@pytest.mark.e2e
def test_reduction_values_and_partial_sums_are_exact_in_every_dtype(collective_cases):
    assert collective_cases["inexact"] == []
    for key, (bound, limit) in collective_cases["max_abs_partial"].items():
        assert bound <= limit, key


@pytest.mark.e2e
def test_patterns_are_nonzero_reproducible_and_sliceable(collective_cases):
    assert collective_cases["zero_in_a"] == 0           # a "returns 0" fault is always visible
    assert collective_cases["a_range"] == [-16, 16]
    assert collective_cases["slice_equals_offset"] and collective_cases["streams_differ"]


@pytest.mark.e2e
def test_reduction_amplitudes_fit_the_dtype(collective_cases):
    # bfloat16 (exact to 256): rank-dependent values up to 16 ranks, then a constant per
    # element, none beyond 256 ranks
    assert collective_cases["amplitudes"] == [[16, 1], [1, 1], [15, 0], None, [16, 1]]


@pytest.mark.e2e
def test_reducescatter_rows_partition_the_rows_first_ranks_get_more(collective_cases):
    rows = collective_cases["rows"]
    assert rows["5/2"] == [[0, 3], [3, 2]]              # as Horovod 0.28.1 splits them
    assert rows["2/2"] == [[0, 1], [1, 1]]
    assert rows["7/4"] == [[0, 2], [2, 2], [4, 2], [6, 1]]
    assert sum(count for _, count in rows["4913/3"]) == 4913


@pytest.mark.e2e
def test_alltoall_splits_are_unequal_and_may_be_empty(collective_cases):
    assert collective_cases["splits"]["1/2"] == [[0, 2], [1, 0]]
    assert collective_cases["splits"]["17/3"] == [[5, 7, 6], [6, 5, 7], [7, 6, 5]]


@pytest.mark.e2e
def test_first_mismatch_and_its_message(collective_cases):
    exact, two_wrong, nan, shape, tolerated = collective_cases["mismatch"]
    assert exact is None and tolerated is None
    assert two_wrong == [2, 1, 2.0, 0.0]
    assert nan[:2] == [1, 1]
    assert shape == [4, -1, 4.0, 2.0]
    assert collective_cases["message"] == (
        "horovod allreduce_average float32 size 4913 on rank 1: element 4912 is 0, want 7 "
        "(1 of 4913 elements wrong)")


@pytest.mark.e2e
def test_skipped_ops_are_summarised_per_reason(collective_cases):
    assert collective_cases["skipped"] == ["all ops on bfloat16: no bf16",
                                           "allreduce_average on int32, int64: no AVG"]


# --------------------------------------------------------------------------------------------
# The digits workload (--model digits): a real image classifier
# --------------------------------------------------------------------------------------------

DIGITS = ["--model", "digits", "--batch-size", "32", "--no-collectives-check"]
DIGITS_RECORDS = ["config", "gpu", "gpu", "throughput", "throughput", "throughput_total", "classifier", "startup", "startup",
                  "result"]


@pytest.fixture(scope="module")
def sklearn(python: str) -> None:
    """The digits data set comes with scikit-learn (in the pytorch/2.3.1-gpu lock)."""
    probe = _probe(python, "import sklearn.datasets")
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{python} cannot import sklearn (the stack predates scikit-learn in its "
                    f"lock; re-install it): {last}")


@pytest.mark.e2e
def test_digits_two_ranks_reach_the_accuracy_threshold(mpirun, python, backend, sklearn, tmp_path):
    output = tmp_path / "digits.jsonl"
    done = run_two_ranks(mpirun, python, backend, *DIGITS, "--output", str(output))
    assert done.returncode == 0, done.stderr[-3000:]
    records = parse_records(output.read_text())
    assert [record["record"] for record in records] == DIGITS_RECORDS
    config = by_kind(records, "config")[0]
    assert (config["model"], config["image_size"], config["num_classes"]) == ("digits", 8, 10)
    assert (config["epochs"], config["accuracy_threshold"]) == (20, 0.95)

    classifier = by_kind(records, "classifier")[0]
    # 1,797 images, 20 % held out; every rank evaluates the whole test set with the same model
    assert (classifier["train_images"], classifier["test_images"]) == (1438, 359)
    assert classifier["lr"] == pytest.approx(0.01 * 2)          # scaled by the ranks
    assert classifier["test_accuracy"] >= 0.95
    assert classifier["test_accuracy_per_rank"] == [classifier["test_accuracy"]] * 2
    assert classifier["params_identical"] and len(classifier["param_hashes"]) == 2
    assert classifier["final_train_loss"] < 0.3

    throughput = by_kind(records, "throughput")
    assert sorted(record["rank"] for record in throughput) == [0, 1]
    assert all(len(record["img_per_sec_iters"]) == 20 for record in throughput)   # one per epoch
    assert by_kind(records, "throughput_total")[0]["img_per_sec"] > 0
    result = by_kind(records, "result")[0]
    assert result["ok"] is True and result["reasons"] == []
    assert "digits: test accuracy" in done.stderr and "result: OK" in done.stderr


@pytest.mark.e2e
def test_digits_below_the_accuracy_threshold_fails_naming_it(mpirun, python, sklearn, tmp_path):
    output = tmp_path / "digits.jsonl"
    # one epoch cannot classify all 359 test images right
    done = run_two_ranks(mpirun, python, "ddp", *DIGITS, "--epochs", "1",
                         "--accuracy-threshold", "1.0", "--output", str(output))
    assert done.returncode == 1, done.stderr[-3000:]
    records = parse_records(output.read_text())
    classifier = by_kind(records, "classifier")[0]
    assert classifier["test_accuracy"] < 1.0 and classifier["threshold"] == 1.0
    result = by_kind(records, "result")[0]
    assert result["ok"] is False
    assert result["reasons"] == [f"test accuracy {classifier['test_accuracy']:.4f} below the "
                                 "threshold 1.0 (359 test images, 1 epoch(s))"]
    assert "result: FAILED: test accuracy" in done.stderr


@pytest.mark.e2e
def test_digits_refuses_another_image_size(python):
    done = subprocess.run([python, str(SCRIPT), "--model", "digits", "--image-size", "32"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--model digits trains on 8x8 images" in done.stderr


@pytest.mark.e2e
def test_channels_last_with_amp_trains_on_two_ranks(mpirun, python, backend):
    """--channels-last (the gpu-amp workload's): model and batches channels-last with every
    backend (Horovod reduces contiguous copies of the channels-last gradients); both must train,
    converge and keep the ranks' parameters identical (bfloat16 AMP on CPUs)."""
    done = run_two_ranks(mpirun, python, backend, "--channels-last", "--precision", "amp",
                         "--no-collectives-check")
    assert done.returncode == 0, done.stderr[-3000:]
    records = parse_records(done.stdout)
    convergence = by_kind(records, "convergence")[0]
    assert convergence["below_threshold"] and convergence["params_identical"]
    setup = by_kind(records, "throughput_total")[0]["setup"]
    assert setup["param_memory_formats"] == setup["grad_memory_formats"] == ["channels_last"]
    assert setup["batch_memory_format"] == "channels_last"


def run_one_rank(mpirun: str, python: str, backend: str, *extra: str) -> subprocess.CompletedProcess:
    """The trainer as one rank under ``mpirun -np 1 --bind-to none`` (hpcstack's Mpirun launcher's
    binding), so that every backend, the plain loop included, gets the same threads."""
    env = dict(os.environ, MASTER_PORT=str(_free_port()))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        env.pop(name, None)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [mpirun, "-np", "1", "--bind-to", "none", python, str(SCRIPT), "--backend", backend,
               *FAST, *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT_S)


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [("--channels-last", "--precision", "amp"), ()],
                         ids=["channels-last-amp", "fp32"])
def test_every_backend_trains_the_same_computation(mpirun, python, horovod, extra):
    """The one rule (models.SETUP_RULE): plain, DDP and Horovod get the same model, batch,
    precision and memory format, as the model's own forward and its parameters show them, and
    on one rank they end with bit-identical parameters (the wrappers change no value), DDP's
    identity hook at world size 1 (``single_rank_hook``) included."""
    seen = {}
    for label, backend, options in (("plain", "plain", ()), ("ddp", "ddp", ()),
                                    ("ddp-allreduce", "ddp", ("--ddp", "single_rank_hook=false")),
                                    ("horovod", "horovod", ())):
        done = run_one_rank(mpirun, python, backend, "--no-collectives-check", *extra, *options)
        assert done.returncode == 0, f"{label}: {done.stderr[-3000:]}"
        records = parse_records(done.stdout)
        config = by_kind(records, "config")[0]
        assert (config["backend"], config["world_size"]) == (backend, 1)
        if backend == "ddp":
            assert config["ddp_options"]["single_rank_hook"] is (label == "ddp")
        seen[label] = (config["threads_per_rank"], by_kind(records, "throughput_total")[0]["setup"],
                       by_kind(records, "convergence")[0]["param_hashes"])
    assert seen["plain"] == seen["ddp"] == seen["ddp-allreduce"] == seen["horovod"], seen
    threads, setup, _ = seen["plain"]
    amp = bool(extra)
    assert setup["precision"] == ("amp" if amp else "fp32")
    assert setup["logits_dtype"] == ("bfloat16" if amp else "float32")
    assert setup["param_dtype"] == "float32"
    layout = "channels_last" if amp else "contiguous"
    assert setup["batch_memory_format"] == layout
    assert setup["param_memory_formats"] == setup["grad_memory_formats"] == [layout]
    assert setup["batch_shape"] == [16, 3, 32, 32] and setup["parameters"] == 5418


@pytest.mark.e2e
def test_plain_refuses_two_ranks_and_ddp_refuses_unknown_options(mpirun, python):
    done = run_two_ranks(mpirun, python, "plain", "--no-collectives-check")
    assert done.returncode != 0
    assert "--backend plain runs one process; the launcher started 2 ranks" in done.stderr
    assert parse_records(done.stdout) == []
    done = subprocess.run([python, str(SCRIPT), "--backend", "ddp", "--ddp", "bucket_view=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--ddp: 'bucket_view=1': expected NAME=VALUE" in done.stderr


def test_workload_flags_reach_the_trainer_as_flags():
    from hpcstack.validate.validation import trainer_argv

    argv = trainer_argv({"model": "resnet50", "batch_size": 128, "precision": "amp", "channels_last": True},
                        "/p", "horovod", "out.jsonl", 4)
    assert "--channels-last" in argv and "True" not in argv
    assert argv[argv.index("--batch-size") + 1] == "128"
    assert "--channels-last" not in trainer_argv({"channels_last": False}, "/p", "ddp", "out.jsonl", 1)


@pytest.mark.e2e
def test_ddp_hands_buckets_back_at_world_size_one_and_reduces_at_two(python, tmp_path):
    """``single_rank_hook``: at world size 1 DDP runs the trainer's identity hook instead of its
    allreduce (DDP's own logging names the hook); ``single_rank_hook=false`` keeps torch's."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys, torch\n"
        "from hpcstack_train.backends import ddp_options, open_comm\n"
        "comm = open_comm('ddp', 'cpu', ddp=ddp_options(sys.argv[1:]))\n"
        "model, _ = comm.prepare(torch.nn.Linear(3, 2), lambda p: torch.optim.SGD(p, lr=0.1))\n"
        "print('hook:', model._get_ddp_logging_data().get('comm_hook'))\n"
        "comm.shutdown()\n")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1",
               PYTHONPATH=str(TRAINER_DIR))
    said = {}
    for options in ((), ("single_rank_hook=false",)):
        env["MASTER_PORT"] = str(_free_port())
        done = subprocess.run([python, str(probe), *options], capture_output=True, text=True,
                              env=env, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-2000:]
        said[options] = done.stdout.strip().splitlines()[-1]
    assert said[()] == "hook: _identity_hook"
    assert said[("single_rank_hook=false",)] != "hook: _identity_hook"
