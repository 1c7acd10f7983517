"""``build.batch_job`` (hpcstack/install/batch.py): an install that makes its bundle on the login
node and builds in one Slurm job step.

* unit: the key's schema and its srun options, the srun line and the job step's command built
  from a command line, the dry run (both steps shown, nothing run), ``--from``, ``--on-login-node``
  and the marker outside a job;
* integration (root, the local Slurm cluster of scripts/localhost-slurm): mpi4py/4.1.2 installed
  through a job step on localhost's ``debug`` partition, its provenance naming the job.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import hpcstack, make_sdist, two_node_cluster, unit_site, write_tiny_recipe
from hpcstack.install import batch

RECIPE = "mpi4py/4.1.2"
JOB = {"partition": "boost_usr_prod", "time_limit": "02:00:00", "cpus_per_task": 8,
       "qos": "normal", "account": "proj_a", "srun_options": ["--mem=30000M"]}


def _problems(job) -> list[str]:
    from hpcstack.site import check_config

    data = unit_site("cirrus")
    data["build"] = {**(data.get("build") or {}), "batch_job": job}
    return check_config(data, "s.yaml")


def _site_file(tmp_path: Path, job=JOB, base: str = "cirrus") -> Path:
    """A copy of the built-in ``base`` (its Python stated: a plan loads no module) with
    ``build.batch_job``, its roots under ``tmp_path``."""
    data = unit_site(base, name="batchsite", roots=tmp_path / "roots")
    data["build"] = {**(data.get("build") or {}), "batch_job": job}
    path = tmp_path / "batchsite.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------------------ the key

@pytest.mark.unit
def test_the_key_is_accepted_and_null_means_none():
    assert _problems(JOB) == []
    assert _problems(None) == []
    assert _problems({"partition": "p", "time_limit": "1-00:00:00", "cpus_per_task": 1}) == []


@pytest.mark.unit
@pytest.mark.parametrize("job, words", [
    ({"time_limit": "01:00:00", "cpus_per_task": 4}, "build.batch_job.partition: missing key"),
    ({**JOB, "time_limit": "2h"}, "build.batch_job.time_limit: '2h' does not match"),
    ({**JOB, "cpus_per_task": 0}, "build.batch_job.cpus_per_task: 0 is less than the minimum of 1"),
    ({**JOB, "partition": "a b"}, "build.batch_job.partition: 'a b' does not match"),
    ({**JOB, "srun_options": ["--mem 4G"]}, "build.batch_job.srun_options.0: '--mem 4G' does not match"),
    ({**JOB, "srun_options": ["-p"]}, "build.batch_job.srun_options.0: '-p' does not match"),
    ({**JOB, "nodes": 2}, "build.batch_job.nodes: unknown key"),
])
def test_a_bad_value_is_one_line_naming_the_key(job, words):
    lines = _problems(job)
    assert len(lines) == 1 and words in lines[0], lines


@pytest.mark.unit
@pytest.mark.parametrize("option, key", [
    ("--time=04:00:00", "use build.batch_job.time_limit"),
    ("--part=gpu", "--part (srun reads it as --partition) itself: use build.batch_job.partition"),
    ("--account=x", "use build.batch_job.account"),
    ("--export=NONE", "--export itself"),
    ("--nodes=2", "--nodes itself"),
    ("--job-name=x", "--job-name itself"),
    ("--pty", "--pty itself"),
])
def test_an_option_hpcstack_sets_itself_is_refused_with_the_key_to_use(option, key):
    lines = _problems({**JOB, "srun_options": ["--hint=nomultithread", option]})
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"s.yaml: build.batch_job.srun_options.1: {option!r}: hpcstack sets"), lines
    assert key in lines[0], lines


# ------------------------------------------------------------------------------ the command lines

def _args(*argv: str):
    from hpcstack.cli import build_parser

    return build_parser().parse_args(["install", *argv])


@pytest.mark.unit
def test_the_srun_line_names_the_partition_and_shape_then_the_sites_options_then_hpcstacks():
    job = batch.BatchJob(**{**JOB, "srun_options": tuple(JOB["srun_options"])})
    assert batch.srun_argv(job, ["INNER", "x"], "/usr/bin/srun") == [
        "/usr/bin/srun", "--partition=boost_usr_prod", "--nodes=1", "--ntasks=1", "--cpus-per-task=8",
        "--time=02:00:00", "--qos=normal", "--account=proj_a", "--mem=30000M", "--job-name=hpcstack-build",
        "--quit-on-interrupt", "--mpi=none", "--export=ALL,HPCSTACK_BATCH_BUILD=1", "INNER", "x"]
    plain = batch.BatchJob("debug", "00:10:00", 1)
    assert batch.srun_argv(plain, ["I"])[:6] == ["srun", "--partition=debug", "--nodes=1", "--ntasks=1",
                                                 "--cpus-per-task=1", "--time=00:10:00"]
    assert not any(a.startswith(("--qos", "--account")) for a in batch.srun_argv(plain, ["I"]))


@pytest.mark.unit
def test_the_job_step_runs_the_same_hpcstack_with_the_same_options_from_the_bundle(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _args(RECIPE, "--site", "here.yaml", "--repo", "repo", "--prefix", "sw", "--module-root", "/m",
                 "--force", "--no-wait", "--default", "--stop-after", "build", "--admin-group", "hpcadm",
                 "--trust-writable", "--dry-run", "--on-login-node")
    argv = batch.inner_argv(args, "bundle", 8, python="/opt/py/bin/python")
    assert argv[:7] == ["/opt/py/bin/python", "-I", "-u", "-m", "hpcstack", "install", RECIPE]
    rest = argv[6:]
    assert rest[-4:] == ["--from", str(tmp_path / "bundle"), "--jobs", "8"]
    pairs = {rest[i]: rest[i + 1] for i in range(len(rest) - 1) if not rest[i + 1].startswith("--")}
    assert pairs["--site"] == str(tmp_path / "here.yaml") and pairs["--repo"] == str(tmp_path / "repo")
    assert pairs["--prefix"] == str(tmp_path / "sw") and pairs["--module-root"] == "/m"
    assert pairs["--stop-after"] == "build" and pairs["--admin-group"] == "hpcadm"
    for flag in ("--force", "--no-wait", "--default", "--trust-writable"):
        assert flag in rest
    for dropped in ("--dry-run", "--on-login-node", "--json"):        # the batch job's own
        assert dropped not in rest
    # a site by name stays a name; --jobs given on the command line wins over cpus_per_task
    named = batch.inner_argv(_args(RECIPE, "--site", "cirrus", "--jobs", "3", "--from", "/b"), "/b", 3)
    assert named[named.index("--site") + 1] == "cirrus" and named.count("--jobs") == 1
    assert named.count("--from") == 1


@pytest.mark.unit
def test_every_option_of_install_is_passed_on_or_dropped_on_purpose():
    import argparse

    from hpcstack.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["install"]
    dests = {a.dest for a in sub._actions}
    assert dests - set(batch.INNER_OPTIONS) == set(), "an option of install that the job step would lose"


@pytest.mark.unit
def test_the_marker_outside_a_job_is_refused_and_inside_one_names_the_job():
    from hpcstack.errors import ConfigError

    assert batch.check_inside({}) is None and batch.job_record({}) is None
    with pytest.raises(ConfigError, match="SLURM_JOB_ID is unset"):
        batch.check_inside({batch.MARKER: "1"})
    env = {batch.MARKER: "1", "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_NAME": "hpcstack-build"}
    line = batch.check_inside(env)
    assert line == "note: build.batch_job: running in Slurm job 42, step 0, on n1"
    assert batch._STARTED.match(line).group(1) == "42"
    assert batch.job_record(env) == {"job_id": "42", "step_id": "0", "node": "n1", "job_name": "hpcstack-build"}


# ------------------------------------------------------------------------------ the dry run

@pytest.mark.unit
def test_the_dry_run_shows_the_bundle_step_and_the_srun_line_and_runs_nothing(tmp_path):
    site = _site_file(tmp_path)
    proc = hpcstack("install", RECIPE, "--site", str(site), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    stage = tmp_path / "roots" / "software" / ".hpcstack" / "stage" / "bundle-mpi4py-4.1.2"
    lines = proc.stdout.splitlines()
    assert f"hpcstack bundle {RECIPE} --site {site} -o {stage}" in proc.stdout
    [srun] = [line for line in lines if line.startswith("srun ")]
    assert srun.startswith("srun --partition=boost_usr_prod --nodes=1 --ntasks=1 --cpus-per-task=8 "
                           "--time=02:00:00 --qos=normal --account=proj_a --mem=30000M "
                           "--job-name=hpcstack-build --quit-on-interrupt --mpi=none --export=ALL,HPCSTACK_BATCH_BUILD=1 ")
    assert srun.endswith(f"-I -u -m hpcstack install {RECIPE} --site {site} --from {stage} --jobs 8")
    assert not (tmp_path / "roots").exists()            # nothing made, not even the stage directory
    data = json.loads(hpcstack("install", RECIPE, "--site", str(site), "--dry-run", "--json").stdout)
    assert data["batch_job"]["bundle"] == str(stage) and data["batch_job"]["make_bundle"] is True
    assert data["batch_job"]["srun"][0] == "srun" and "--jobs" in data["batch_job"]["srun"]


@pytest.mark.unit
def test_from_skips_the_bundle_step_and_sends_that_bundle(tmp_path):
    site = _site_file(tmp_path)
    given = tmp_path / "given-bundle"
    given.mkdir()
    proc = hpcstack("install", RECIPE, "--site", str(site), "--dry-run", "--from", str(given), "--jobs", "2")
    assert proc.returncode == 0, proc.stderr
    assert "hpcstack bundle" not in proc.stdout and f"the bundle {given}, as given" in proc.stdout
    [srun] = [line for line in proc.stdout.splitlines() if line.startswith("srun ")]
    assert srun.endswith(f"--from {given} --jobs 2")


@pytest.mark.unit
def test_on_login_node_plans_the_install_here_as_without_the_key(tmp_path):
    site = _site_file(tmp_path)
    proc = hpcstack("install", RECIPE, "--site", str(site), "--dry-run", "--on-login-node")
    assert proc.returncode == 0, proc.stderr
    assert "srun --partition" not in proc.stdout and "build.batch_job" not in proc.stdout
    assert "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02" in proc.stdout   # the sdist


@pytest.mark.unit
def test_the_marker_outside_a_job_is_one_error_line(tmp_path):
    site = _site_file(tmp_path)
    proc = hpcstack("install", RECIPE, "--site", str(site), "--dry-run",
                    env={batch.MARKER: "1", "SLURM_JOB_ID": ""})
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: HPCSTACK_BATCH_BUILD is set, but this is not a Slurm job"), line


@pytest.mark.unit
def test_a_site_option_hpcstack_sets_is_refused_before_anything_runs(tmp_path):
    site = _site_file(tmp_path, {**JOB, "srun_options": ["--time=9:00:00"]})
    proc = hpcstack("install", RECIPE, "--site", str(site), "--dry-run")
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert "build.batch_job.srun_options.0: '--time=9:00:00': hpcstack sets --time itself" in line


# ------------------------------------------------------------------------------ a real job step

@pytest.mark.integration
def test_an_install_builds_in_a_job_step_on_the_local_cluster(localhost_ready):
    """The tiny recipe (tests/conftest.py: a venv, pinned wheels, a patched source build, a
    module) for an overlay of localhost that sets build.batch_job on the local cluster's ``debug``
    partition: the bundle is made here, the build runs in job ``hpcstack-build`` (provenance
    records the job), the stack is published and its module file written."""
    if os.geteuid() != 0:
        pytest.skip("installs as root into a root-owned stage directory (Slurm must accept root's jobs)")
    with two_node_cluster():
        root = Path(tempfile.mkdtemp(prefix="hpcstack-batch-", dir="/var/tmp"))
        try:
            root.chmod(0o755)
            recipe = write_tiny_recipe(root / "recipes", make_sdist(root))
            site = root / "localhost-batch.yaml"
            site.write_text(yaml.safe_dump({
                "name": "localhost-batch", "extends": "localhost",
                "description": "localhost, building in a job step on the local cluster",
                "build": {"batch_job": {"partition": "debug", "time_limit": "00:30:00", "cpus_per_task": 1}}}))
            site.chmod(0o644)
            proc = hpcstack("install", str(recipe), "--site", str(site), "--prefix", str(root / "sw"),
                            "--module-root", str(root / "mf"), timeout=1800)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            assert "==> build.batch_job: the build, in one Slurm job step: " in proc.stderr
            assert "note: build.batch_job: running in Slurm job " in proc.stderr, proc.stderr[-3000:]
            bundle = root / "sw" / ".hpcstack" / "stage" / "bundle-tiny-1.0"
            assert (bundle / "manifest.json").is_file() and not (bundle / "tool").exists()
            assert bundle.stat().st_mode & 0o777 == 0o700 and bundle.stat().st_uid == 0
            records = [json.loads(p.read_text()) for p in (root / "sw").rglob("provenance.json")]
            jobs = [r["batch_job"] for r in records if "batch_job" in r]
            assert jobs and jobs[0]["job_name"] == "hpcstack-build" and jobs[0]["job_id"].isdigit(), records
            assert "--from" in records[0]["command"]
            assert (root / "mf" / "tiny" / "1.0").is_file()
        finally:
            shutil.rmtree(root, ignore_errors=True)
