"""Validation backends declared by a recipe's validation file: a test recipe (``toyfw/1.0``, in a
repository of the test's own) declares a backend hpcstack does not know, with its launcher rule,
its setup line and the records its runs write; ``hpcstack validate --dry-run`` plans it with no
line of ``hpcstack/`` naming it. The built-in backends are such declarations too."""

from __future__ import annotations

import json
import textwrap

import pytest
import yaml

from conftest import hpcstack, site_overlay
from hpcstack.errors import ConfigError
from hpcstack.install.components.backends import DEFAULT_BACKENDS, Backend
from hpcstack.install.components.validation import Validation
from hpcstack.validate.judge import RunOutcome, sanity_reasons

pytestmark = pytest.mark.unit

RECIPE = '''
"""A toy framework: its validation program and a backend of its own."""

from hpcstack.recipe_api import Modulefile, Recipe, Validation, Venv


def recipe(site):
    return Recipe("toyfw", "1.0", whatis="toy framework", components=[
        Venv(),
        Modulefile(),
        Validation("1.0.validation.yaml"),
    ])
'''

VALIDATION = {
    "program": {"command": ["{bin}/toy-validate", "--backend", "{backend}", "--output", "{output}"],
                "interpreter": "python"},
    "nodes": [1, 2],
    "backends": [
        {"name": "toyring", "instead_of": {"srun": "mpirun", "horovodrun": "mpirun"},
         "setup": ["export TOY_PORT=$((30000 + {job_id} % 1000))"], "records": ["ring"],
         "description": "the toy framework's own ring"},
        "mpi",
    ],
    "workloads": {"cpu": {}},
    "figures": {"ring_time": {"record": "ring", "field": "time_us", "unit": "us"}},
}


@pytest.fixture
def repo(tmp_path):
    """A repository with the localhost site (loading no module) and the toyfw/1.0 recipe."""
    site_overlay(tmp_path, "localhost", roots=tmp_path / "roots")
    d = tmp_path / "recipes" / "toyfw"
    d.mkdir(parents=True)
    (d / "1.0.py").write_text(textwrap.dedent(RECIPE))
    (d / "1.0.validation.yaml").write_text(yaml.safe_dump(VALIDATION, sort_keys=False))
    return tmp_path


def test_a_declared_backend_is_planned_in_the_jobs_with_its_launcher_and_setup(repo):
    proc = hpcstack("validate", "toyfw/1.0", "--site", "localhost", "--repo", str(repo), "--nodes", "2",
                    "--dry-run")
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert "export TOY_PORT=$((30000 + SLURM_JOB_ID % 1000))" in script
    # toyring takes mpirun where the site names srun; mpi keeps the site's srun
    toy = next(line for line in script.splitlines() if "--backend toyring" in line)
    mpi = next(line for line in script.splitlines() if "--backend mpi" in line)
    assert toy.lstrip().startswith("mpirun ") and "toyring.jsonl" in toy, toy
    assert mpi.lstrip().startswith("srun "), mpi


def test_the_plan_as_json_carries_the_declaration_and_the_judges_rules(repo):
    proc = hpcstack("validate", "toyfw/1.0", "--site", "localhost", "--repo", str(repo), "--nodes", "1",
                    "--backend", "toyring", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert plan["backends"] == ["toyring"] and plan["nodes"] == [1] and plan["mode"] == "slurm"
    assert plan["backend_declarations"]["toyring"]["instead_of"] == {"srun": "mpirun", "horovodrun": "mpirun"}
    assert plan["rules"]["records"] == {"toyring": ["ring"]}


def test_local_dry_run_runs_the_first_declared_backend_under_its_launcher(repo):
    proc = hpcstack("validate", "toyfw/1.0", "--site", "localhost", "--repo", str(repo), "--local",
                    "--ranks", "2", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("mpirun ") and "--backend toyring" in last, last


def test_a_run_without_the_declared_record_fails_its_sanity():
    base = [{"record": "config", "world_size": 1}, {"record": "result", "ok": True}]
    run = RunOutcome("toyring", 1, 1, None, "COMPLETED", "0:0", 0, base)
    assert sanity_reasons(run, every_rank=None, records=("ring",)) == [
        "no ring record in its output (its backend writes one)"]
    run = RunOutcome("toyring", 1, 1, None, "COMPLETED", "0:0", 0, [*base, {"record": "ring", "time_us": 3}])
    assert sanity_reasons(run, every_rank=None, records=("ring",)) == []


@pytest.mark.parametrize("backend, expected", [
    ({"name": "x", "setup": ["echo {jobid}"]}, "backends.0.setup.0: 'echo {jobid}': unknown placeholder"),
    ({"name": "x", "lanucher": "srun"}, "backends.0"),
    ({"name": "bad name"}, "backends.0"),
])
def test_a_bad_declaration_gives_one_line_naming_the_key(tmp_path, backend, expected):
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({**VALIDATION, "backends": [backend]}))
    with pytest.raises(ConfigError) as err:
        Validation("v.yaml").load(tmp_path)
    assert any(expected in p for p in err.value.problems), err.value.problems


def test_a_backend_named_twice_is_refused(tmp_path):
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({**VALIDATION, "backends": ["mpi", {"name": "mpi"}]}))
    with pytest.raises(ConfigError) as err:
        Validation("v.yaml").load(tmp_path)
    assert any("backends.1: backend 'mpi' named twice" in p for p in err.value.problems)


def test_the_built_in_backends_are_declarations():
    assert set(DEFAULT_BACKENDS) == {"horovod", "ddp", "mpi"}
    assert all(isinstance(b, Backend) for b in DEFAULT_BACKENDS.values())
    ddp = DEFAULT_BACKENDS["ddp"]
    assert ddp.launcher_for("horovodrun") == "mpirun" and ddp.launcher_for("srun") == "srun"
    assert ddp.setup_lines("SLURM_JOB_ID") == ["export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))"]
    assert ddp.setup_lines(None) == []
    assert DEFAULT_BACKENDS["mpi"].launcher_for("torchrun") == "mpirun"
    assert DEFAULT_BACKENDS["horovod"].launcher_for("horovodrun") == "horovodrun"
