"""The validation's runners without a scheduler: reading back what ended jobs left in their own
directories (records, exit statuses, output tails), and ``jobs.json`` as ``--collect`` reads it."""

from __future__ import annotations

import json
import os

import pytest

from hpcstack import trust
from hpcstack.errors import ConfigError
from hpcstack.validate.plan import ValidationJob
from hpcstack.validate.runner import read_back, read_jobs_file
from hpcstack.validate.scheduler import JobInfo

pytestmark = pytest.mark.unit


class _Named:
    def __init__(self, name, full_name=None):
        self.name, self.full_name = name, full_name or name


def test_read_back_takes_each_backends_records_and_status_from_the_jobs_directory(tmp_path):
    d = tmp_path / "n2"
    d.mkdir()
    (d / "mpi.jsonl").write_text('{"record": "config", "world_size": 4}\nnot json\n{"record": "result", "ok": true}\n')
    (d / "mpi.exit").write_text("0\n")
    (d / "toy.exit").write_text("garbage\n")
    (d / "slurm-17.out").write_text("".join(f"line {i}\n" for i in range(40)))
    job = ValidationJob(2, d, "", ["mpi", "toy"], 4, "17")
    outside = tmp_path.parent / "elsewhere.out"      # a StdOut outside the job's directory: never read
    infos = {"17": JobInfo("17", "FAILED", "1:0", stdout=str(outside))}
    got = read_back([job], infos, tmp_path)
    mpi, toy = got.runs
    assert (mpi.backend, mpi.exit_status, [r["record"] for r in mpi.records]) == ("mpi", 0, ["config", "result"])
    assert (toy.backend, toy.exit_status, toy.records) == ("toy", None, [])
    (record,) = got.jobs
    assert record["output"] == str(d / "slurm-17.out")
    assert record["output_tail"] == [f"line {i}" for i in range(15, 40)]


def _jobs_file(out, **change):
    data = {"site": "s", "recipe": "r/1", "partition": "p", "scheduler": "slurm",
            "jobs": [{"job_id": "5", "nodes": 1, "ranks": 2, "backends": ["mpi"], "directory": str(out / "n1")}]}
    data.update(change)
    (out / "jobs.json").write_text(json.dumps(data))
    os.chmod(out / "jobs.json", 0o644)


def test_jobs_file_read_back_as_jobs(tmp_path):
    _jobs_file(tmp_path)
    data, (job,) = read_jobs_file(_Named("s"), _Named("r", "r/1"), tmp_path, trust.Policy(uid=os.geteuid()))
    assert data["partition"] == "p" and (job.nodes, job.ranks, job.job_id, job.directory) == (1, 2, "5", tmp_path / "n1")


@pytest.mark.parametrize("change, message", [
    ({"site": "other"}, "holds jobs of r/1 on other, not r/1 on s"),
    ({"jobs": [{"job_id": "5", "nodes": 1, "ranks": 2, "backends": ["mpi"], "directory": "/etc"}]},
     "is not the job's own"),
    ({"jobs": [{"job_id": "x;rm", "nodes": 1, "ranks": 2, "backends": ["mpi"], "directory": "/etc"}]}, "job_id"),
])
def test_a_jobs_file_that_is_not_this_validations_is_refused(tmp_path, change, message):
    _jobs_file(tmp_path, **change)
    with pytest.raises(ConfigError) as err:
        read_jobs_file(_Named("s"), _Named("r", "r/1"), tmp_path, trust.Policy(uid=os.geteuid()))
    assert any(message in p for p in err.value.problems), err.value.problems
