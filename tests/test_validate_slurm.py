"""``hpcstack validate`` through Slurm: Cirrus job scripts (dry run), command-line checks, and real
jobs on the local 2-node cluster that train on the installed localhost stack.

The stack-dependent tests (``e2e``) use the installed stack of the README's main command under
/opt/hpcstack (conftest's ``installed_stack`` fixture). They skip, saying why, when not root, or when
Slurm is missing (`scripts/localhost-slurm install`). The module fixture starts
the local cluster (reusing one already up with 2 nodes, and leaving that one running).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import STACK_TOP, REPO, hpcstack, two_node_cluster

pytestmark = pytest.mark.unit

RECIPE = "pytorch/2.3.1-gpu"


#: The install and module roots of the installed stack (conftest's ``installed_stack``).
STACK = STACK_TOP
STACK_ARGS = ["--prefix", str(STACK / "software"), "--module-root", str(STACK / "modulefiles")]


def scripts_of(stdout: str) -> dict[int, str]:
    """Split a dry run's output into {nodes: job script}."""
    jobs = {}
    for chunk in stdout.split("# ===== ")[1:]:
        head, script = chunk.split("\n", 1)
        nodes = int(head.split("(")[1].split()[0])
        jobs[nodes] = script
    return jobs


def sbatch_options(script: str) -> list[str]:
    return [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


# ----------------------------------------------------------------------------- Cirrus job scripts

@pytest.fixture(scope="module")
def cirrus_scripts():
    proc = hpcstack("validate", RECIPE, "--site", "cirrus", "--nodes", "1,2,4", "--account", "y07", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return scripts_of(proc.stdout)


def test_cirrus_dry_run_prints_one_job_script_per_node_count(cirrus_scripts):
    assert sorted(cirrus_scripts) == [1, 2, 4]
    for nodes, script in cirrus_scripts.items():
        assert script.startswith("#!/bin/bash\n")
        assert f"--nodes={nodes}" in sbatch_options(script)
        assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


@pytest.mark.integration
@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_cirrus_job_script_follows_cirrus_conventions(cirrus_scripts, nodes):
    script = cirrus_scripts[nodes]
    opts = sbatch_options(script)
    for expected in ("--partition=gpu", "--qos=gpu", "--account=y07", "--gres=gpu:4",
                     "--exclusive", "--time=00:20:00", "--export=NONE"):
        assert expected in opts, (expected, opts)
    # Cirrus's GPU nodes reject --ntasks/--cpus-per-task as #SBATCH options: they go to srun
    assert not any(o.startswith(("--ntasks", "--cpus-per-task", "--mem")) for o in opts), opts
    assert "source /usr/share/Modules/init/bash" in script
    assert "module use /work/y07/shared/cirrus-modulefiles" in script
    assert "module load pytorch/2.3.1-gpu" in script
    # NCCL's transport is judged from its INFO log, one file per rank in the job's directory
    # (hpcstack/validate/transport.py): the site's NCCL_DEBUG=WARN is overridden there
    assert "export NCCL_DEBUG=INFO" in script and "export NCCL_DEBUG_FILE=" in script and "nccl-%h-%p.log" in script
    launches = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(launches) == 2, launches                      # horovod, then ddp
    for backend, line in zip(("horovod", "ddp"), launches):
        assert line.startswith(f"srun --nodes={nodes} --ntasks-per-node=4 --cpus-per-task=10 "
                               f"--ntasks={4 * nodes} --hint=nomultithread "
                               "/work/y07/shared/cirrus-software/pytorch/2.3.1-gpu/bin/hpcstack-train-benchmark")
        assert f"--backend {backend} " in line
        assert "--model resnet50 --image-size 224 --batch-size 32 --precision fp32 --device cuda" in line


def test_cirrus_account_and_qos_from_the_command_line_or_sbatch_account():
    proc = hpcstack("validate", RECIPE, "--site", "cirrus", "--nodes", "2", "--qos", "short", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    opts = sbatch_options(proc.stdout)
    assert "--qos=short" in opts and not any(o.startswith("--account") for o in opts)
    assert "SBATCH_ACCOUNT" in proc.stdout                   # the script says how to give one


def test_cirrus_submission_without_account_is_refused_before_anything_happens(tmp_path):
    proc = hpcstack("validate", RECIPE, "--site", "cirrus", "--output-dir", str(tmp_path / "out"),
                    env={"SBATCH_ACCOUNT": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --account: site cirrus charges jobs to a budget")
    assert not (tmp_path / "out").exists()


def test_dry_run_json_gives_the_scripts():
    proc = hpcstack("validate", RECIPE, "--site", "cirrus", "--nodes", "2", "--dry-run", "--json")
    jobs = json.loads(proc.stdout)["jobs"]
    assert [j["nodes"] for j in jobs] == [2] and jobs[0]["path"].endswith("/n2/job.sh")
    assert "#SBATCH --gres=gpu:4" in jobs[0]["script"]


@pytest.mark.integration
def test_localhost_dry_run_uses_srun_pmix_and_the_base_modules():
    proc = hpcstack("validate", RECIPE, "--site", "localhost", "--backend", "ddp", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    jobs = scripts_of(proc.stdout)
    assert sorted(jobs) == [1, 2]                            # the site's validation.nodes
    script = jobs[2]
    assert "module use /opt/hpcstack/base-modulefiles" in script
    assert not any(o.startswith("--gres") for o in sbatch_options(script))
    (launch,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert launch.startswith("srun --mpi=pmix --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 ")
    assert "--backend ddp --model tiny" in launch and "--device cpu --threads 1" in launch


@pytest.mark.parametrize("args, message", [
    (["--nodes", "1,x"], "--nodes: '1,x' is not a comma-separated list"),
    (["--nodes", "0"], "--nodes: '0' is not"),
    (["--ranks", "2"], "--ranks: only with --local"),
    (["--local", "--nodes", "2"], "--nodes: not used with --local"),
    (["--local", "--backend", "mpi"], "--backend mpi: the local launcher runs the horovod, ddp backend only"),
    (["--collect", "/nonexistent", "--dry-run"], "--dry-run: not used with --collect"),
    (["--collect", "/nonexistent"], "--collect: /nonexistent/jobs.json: cannot read it"),
])
def test_bad_command_lines_exit_2_with_one_line(args, message):
    proc = hpcstack("validate", RECIPE, "--site", "localhost", *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_local_dry_run_still_prints_the_local_launcher():
    proc = hpcstack("validate", RECIPE, "--site", "localhost", "--local", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "horovodrun -np 2 -H localhost:2" in proc.stdout


@pytest.mark.integration
def test_settings_are_read_from_the_site_in_one_place():
    from hpcstack.site import load_site
    from hpcstack.validate.validation import validation_settings

    from hpcstack.recipe import load_recipe

    def settings(name, **kw):
        site = load_site(name)
        return validation_settings(site, load_recipe(RECIPE, site), **kw)

    cirrus = settings("cirrus", qos="short")
    assert cirrus.slurm.qos == "short" and cirrus.slurm.partition == "gpu" and cirrus.slurm.account_required
    assert (cirrus.local.launcher, cirrus.local.mpi, cirrus.local.scheduler) == ("srun", None, "local")
    assert cirrus.required_transport == "nccl" and cirrus.nodes == [1, 2]
    assert "nodes" not in cirrus.workload and cirrus.workload["model"] == "resnet50"
    assert "cirrus:gpu" in cirrus.references
    local = settings("localhost")
    assert local.required_transport is None and local.local.mpi == "pmix" and local.slurm.scheduler == "slurm"


@pytest.mark.integration
def test_local_srun_follows_the_sites_mpi_plugin_not_a_hard_coded_one():
    # Cirrus says slurm.mpi: null, so its --local srun must not ask for pmix
    proc = hpcstack("validate", RECIPE, "--site", "cirrus", "--local", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    (launch,) = [line for line in proc.stdout.splitlines() if line.startswith("srun ")]
    # the site's cpus per task (10 of 40 cores per V100 rank), as in its Slurm jobs
    assert launch.startswith("srun --nodes=1 --ntasks-per-node=4 --cpus-per-task=10 python "), launch
    assert "--mpi" not in launch


@pytest.mark.integration
@pytest.mark.parametrize("launcher, mpi, expected", [
    ("srun", "pmix", "srun --mpi=pmix --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 python "),
    ("srun", None, "srun --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 python "),
    ("mpirun", "pmix", "mpirun -np 2 --map-by ppr:2:node --bind-to none python "),
])
def test_local_run_uses_the_launcher_the_site_names(tmp_path, launcher, mpi, expected):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["launcher"]["command"] = launcher
    data["slurm"]["mpi"] = mpi
    site = tmp_path / "localhost-launcher.yaml"
    site.write_text(yaml.safe_dump(data))
    proc = hpcstack("validate", RECIPE, "--site", str(site), "--local", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith(expected), proc.stdout


def test_slurm_jobs_use_the_launcher_the_site_names(tmp_path):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["slurm"]["launcher"] = "horovodrun"
    site = tmp_path / "localhost-horovodrun.yaml"
    site.write_text(yaml.safe_dump(data))
    proc = hpcstack("validate", RECIPE, "--site", str(site), "--nodes", "2", "--backend", "horovod", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.startswith("HOROVOD_HOSTS=$(scontrol show hostnames") for line in lines), proc.stdout
    assert any(line.startswith('horovodrun -np 2 -H "$HOROVOD_HOSTS" ') for line in lines), proc.stdout


# ----------------------------------------------------------------------------- real jobs

@pytest.fixture(scope="module")
def cluster():
    """The local 2-node Slurm cluster, as in test_localhost_slurm.py (reused if already up)."""
    with two_node_cluster():
        yield


@pytest.fixture(scope="module")
def stack(cluster, installed_stack):
    """The roots of the installed stack, with the local cluster up."""
    return STACK


@pytest.fixture
def outdir():
    """A directory under /tmp that the job user can reach (pytest's tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="hpcstack-validate-test-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def recipe_repo(directory: Path, **workload) -> list[str]:
    """A repository holding a copy of the recipe whose ``cpu`` workload has some keys changed
    (the workload is the recipe's); returns the ``--repo`` options that put it first."""
    source = REPO / "recipes" / "pytorch"
    target = directory / "repo" / "recipes" / "pytorch"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    path = target / "2.3.1-gpu.validation.yaml"
    data = yaml.safe_load(path.read_text())
    data["workloads"]["cpu"].update(workload)
    path.write_text(yaml.safe_dump(data))
    for p in [directory / "repo", *(directory / "repo").rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return ["--repo", str(directory / "repo")]


def main_command_validation(recipe: str) -> Path | None:
    """The directory of the README's main command's Slurm validation of ``recipe`` in this test run,
    or None: the newest ``hpcstack-validate-*`` directory under localhost's ``slurm.output_root``
    (/tmp) made since scripts/run-tests started (``HPCSTACK_TEST_SINCE``, seconds since the epoch),
    owned by root, whose ``jobs.json`` holds the localhost jobs on 1 and 2 nodes with both backends
    (what ``hpcstack validate RECIPE --site localhost`` submits)."""
    since = os.environ.get("HPCSTACK_TEST_SINCE")
    if not since:
        return None
    found = []
    for d in Path("/tmp").glob(f"hpcstack-validate-{recipe.replace('/', '-')}-*"):
        jobs_file = d / "jobs.json"
        try:
            st = jobs_file.lstat()
            jobs = json.loads(jobs_file.read_text())
        except (OSError, ValueError):
            continue
        if (stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_mtime >= float(since)
                and jobs.get("site") == "localhost" and jobs.get("recipe") == recipe
                and sorted((j["nodes"], sorted(j["backends"])) for j in jobs.get("jobs", []))
                == [(1, ["ddp", "horovod"]), (2, ["ddp", "horovod"])]):
            found.append((st.st_mtime, d))
    return max(found)[1] if found else None


@pytest.fixture(scope="module")
def two_node_report(stack):
    """The report on the jobs of 1 and 2 nodes, both backends: the README's main command submitted
    them in this run (scripts/run-tests), so the jobs are collected and judged again with
    ``--collect`` (the report files rewritten); else (a partial run) submitted here."""
    main = main_command_validation(RECIPE)
    d = Path(tempfile.mkdtemp(prefix="hpcstack-validate-test-", dir="/tmp"))
    d.chmod(0o755)
    if main is not None:
        print(f"the main command's validation, collected again: {main}")
        out = main
        proc = hpcstack("validate", RECIPE, "--site", "localhost", *STACK_ARGS, "--collect", str(out), "--json",
                        timeout=900)
    else:
        out = d / "v"
        proc = hpcstack("validate", RECIPE, "--site", "localhost", *STACK_ARGS, "--nodes", "1,2",
                        "--backend", "both", "--output-dir", str(out), "--json", timeout=900)
    print(proc.stderr[-4000:])
    yield proc, out
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.e2e
def test_two_node_job_passes_sanity_and_references_with_both_backends(two_node_report):
    proc, out = two_node_report
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["failures"] == []
    assert report["system"] == "localhost:debug"
    runs = {(r["backend"], r["nodes"]): r for r in report["runs"]}
    assert sorted(runs) == [("ddp", 1), ("ddp", 2), ("horovod", 1), ("horovod", 2)]
    for (backend, nodes), run in runs.items():
        assert run["sanity"] == [] and run["exit_status"] == 0 and run["ranks"] == nodes
        assert run["figures"]["throughput_total"]["value"] > 0
        assert run["figures"]["throughput_per_rank"]["ok"] is True      # a reference applies
        print(f"{backend} {nodes} node(s): {run['figures']['throughput_total']['value']:.1f} img/s, "
              f"efficiency {run['figures']['scaling_efficiency']['value']:.3f}")
    assert runs[("horovod", 2)]["transport"].startswith("horovod-mpi")
    assert runs[("ddp", 2)]["transport"] == "gloo"
    for backend in ("horovod", "ddp"):
        eff = runs[(backend, 2)]["figures"]["scaling_efficiency"]
        assert eff["value"] is not None and eff["ok"] is True
        assert eff["value"] == pytest.approx(report["scaling"][backend]["2"]["img_per_sec"]
                                             / (2 * report["scaling"][backend]["1"]["img_per_sec"]))


@pytest.mark.e2e
def test_two_node_job_ran_on_both_nodes_and_wrote_the_report_files(two_node_report):
    proc, out = two_node_report
    report = json.loads((out / "report.json").read_text())
    job2 = next(j for j in report["jobs"] if j["nodes"] == 2)
    assert job2["state"] == "COMPLETED" and job2["nodelist"] == "n[1-2]"
    output = Path(job2["output"]).read_text()
    assert "==> hpcstack: step horovod: exit status 0" in output
    assert "==> hpcstack: step ddp: exit status 0" in output
    md = (out / "report.md").read_text()
    assert "| backend | nodes | ranks | job |" in md and md.rstrip().endswith("**PASS**")
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "n2" / "job.sh").read_text().startswith("#!/bin/bash")
    assert json.loads((out / "jobs.json").read_text())["jobs"][1]["job_id"] == job2["job_id"]


@pytest.mark.e2e
def test_impossible_loss_threshold_fails_with_job_id_state_and_reason(stack, outdir):
    repo = recipe_repo(outdir, loss_threshold=0.0001, convergence_steps=5)
    proc = hpcstack("validate", RECIPE, "--site", "localhost", *repo, *STACK_ARGS, "--nodes", "1", "--backend", "ddp",
                    "--output-dir", str(outdir / "v"), timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads((outdir / "v" / "report.json").read_text())
    (job,) = report["jobs"]
    assert job["state"] == "FAILED" and job["exit_code"] == "1:0"
    assert f"FAIL: job {job['job_id']} (1 node(s)) ended FAILED with exit code 1:0" in proc.stderr
    assert f"FAIL: sanity: ddp on 1 node(s) (job {job['job_id']}): final loss" in proc.stderr
    assert "not below threshold 0.0001" in proc.stderr
    assert f"last lines of job {job['job_id']}" in proc.stderr and "step ddp: exit status 1" in proc.stderr
    assert proc.stderr.rstrip().endswith("FAIL")


@pytest.mark.e2e
def test_no_wait_then_cancelled_job_is_collected_as_a_fail(stack, outdir):
    # a run that is long enough to cancel: many timed iterations
    repo = recipe_repo(outdir, iterations=100000)
    proc = hpcstack("validate", RECIPE, "--site", "localhost", *repo, *STACK_ARGS, "--nodes", "1", "--backend", "horovod",
                    "--output-dir", str(outdir / "v"), "--no-wait")
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads((outdir / "v" / "jobs.json").read_text())["jobs"][0]["job_id"]
    assert f"submitted {job_id}" in proc.stdout and "--collect" in proc.stdout
    subprocess.run(["scancel", job_id], check=True)
    proc = hpcstack("validate", RECIPE, "--site", "localhost", *repo, *STACK_ARGS, "--collect", str(outdir / "v"),
                    "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["jobs"][0]["state"] == "CANCELLED"
    (reason,) = report["runs"][0]["sanity"]
    assert reason.startswith(f"did not finish: job {job_id} ended CANCELLED (exit code ")
    assert f"FAIL: job {job_id} (1 node(s)) ended CANCELLED" in proc.stderr
