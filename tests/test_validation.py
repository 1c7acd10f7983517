"""``hpcstack validate``'s settings (hpcstack.validate.validation): what a ``--local`` run takes from
the site, as the Slurm jobs do (issue 11 item 3), seen in the settings and in the real command's
``--dry-run`` (no Slurm, no installed stack needed)."""

from __future__ import annotations

import shlex

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.recipe import load_recipe
from hpcstack.site import load_site
from hpcstack.validate.validation import local_program, trainer_argv, validation_settings


def settings_of(site_name: str):
    site = load_site(site_name)
    return validation_settings(site, load_recipe("pytorch/2.3.1-gpu", site))


def test_local_takes_mpi_cores_threads_and_environment_from_the_slurm_section():
    s = settings_of("cirrus")
    assert (s.local.launcher, s.local.mpi) == ("srun", None)          # slurm.mpi: null
    assert (s.local.cpus_per_task, s.local.threads) == (10, 10)       # slurm.cpus_per_task
    assert s.local.env == {"NCCL_DEBUG": "WARN"}                      # slurm.env


def test_local_program_is_the_slurm_jobs_program_with_the_sites_device():
    s = settings_of("cirrus")
    argv = local_program(s, "/p", "out.jsonl")
    assert argv[0] == "python"
    assert argv[1:] == trainer_argv(s.workload, "/p", "horovod", "out.jsonl", s.slurm.cpus_per_task)
    words = shlex.join(argv)
    assert "--device cuda" in words and "--threads 10" in words and "--model resnet50" in words


def test_launcher_env_wins_over_slurm_env(tmp_path):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["slurm"]["env"]["OMPI_ALLOW_RUN_AS_ROOT"] = "0"
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    s = validation_settings(load_site(str(path)), load_recipe("pytorch/2.3.1-gpu", load_site(str(path))))
    assert s.local.env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert s.local.env["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_a_site_without_slurm_lets_the_program_pick_threads(tmp_path):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    del data["slurm"]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    site = load_site(str(path))
    s = validation_settings(site, load_recipe("pytorch/2.3.1-gpu", site))
    assert (s.local.mpi, s.local.cpus_per_task, s.local.threads) == (None, 1, 0)
    assert s.local.env == dict(site.launcher.env)
    assert "--threads 0" in shlex.join(local_program(s, "/p", "o"))


@pytest.mark.parametrize("site, expected", [
    # issue 11: cirrus said slurm.mpi: null, device cuda and 10 cores per rank, yet --local ran
    # `srun --mpi=pmix … --cpus-per-task=1` without them
    ("cirrus", ["export NCCL_DEBUG=WARN",
                "srun --nodes=1 --ntasks-per-node=4 --cpus-per-task=10 python ",
                "--device cuda --threads 10 --output records.jsonl"]),
    ("localhost", ["export OMPI_MCA_mpi_yield_when_idle=1", "export OMPI_ALLOW_RUN_AS_ROOT=1",
                   "horovodrun -np 2 -H localhost:2 python ",
                   "--device cpu --threads 1 --output records.jsonl"]),
])
def test_dry_run_of_local_shows_the_sites_settings(site, expected):
    done = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", site, "--local", "--dry-run")
    assert done.returncode == 0, done.stderr
    for text in expected:
        assert text in done.stdout, done.stdout
    assert "--mpi=" not in done.stdout


def test_help_says_what_local_does():
    done = hpcstack("validate", "--help")
    text = " ".join(done.stdout.split())
    assert "--local no Slurm: run the Horovod backend on --ranks ranks of this host" in text
    for words in ("slurm.mpi plugin", "slurm.cpus_per_task (cores and torch threads per rank)",
                  "slurm.env (under launcher.env)", "workload for the site (model, device, sizes)"):
        assert words in text
