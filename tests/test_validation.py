"""``hpcstack validate``'s settings (hpcstack.validate.validation): what a ``--local`` run takes from
the site, as the Slurm jobs do, seen in the settings and in the real command's
``--dry-run`` (no Slurm, no installed stack needed)."""

from __future__ import annotations

import shlex

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.recipe import load_recipe
from hpcstack.site import load_site
from hpcstack.validate.validation import local_program, trainer_argv, validation_settings

pytestmark = pytest.mark.unit


def settings_of(site_name: str):
    site = load_site(site_name)
    return validation_settings(site, load_recipe("pytorch/2.3.1-gpu", site))


@pytest.mark.integration
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


@pytest.mark.integration
@pytest.mark.parametrize("site, expected", [
    # cirrus said slurm.mpi: null, device cuda and 10 cores per rank, yet --local ran
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
    assert "--local no Slurm: run the recipe's first backend that runs here on --ranks ranks of this host" in text
    for words in ("slurm.mpi plugin", "slurm.cpus_per_task (cores and threads per rank)",
                  "slurm.env (under launcher.env)", "workload for the site (its settings, e.g. device and sizes)",
                  "never compared with the references"):
        assert words in text
    # generic: the recipes' frameworks are named only as examples, not as what validate is for
    assert "torch threads" not in text and "Horovod; DDP" not in text


# --------------------------------------------------------------------------------------------
# --workload digits: the real image classifier as a validation workload
# --------------------------------------------------------------------------------------------

DIGITS_OPTIONS = "--model digits --batch-size 32 --device {device} --epochs 20 --lr 0.01 --accuracy-threshold 0.95"


@pytest.mark.integration
@pytest.mark.parametrize("site, device, launch", [
    ("localhost", "cpu", "srun --mpi=pmix --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 "),
    ("cirrus", "cuda", "srun --nodes=2 --ntasks-per-node=4 --cpus-per-task=10 "),
])
def test_dry_run_of_the_digits_workload_shows_the_trainer_command(site, device, launch):
    done = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", site, "--workload", "digits",
                    "--nodes", "2", "--dry-run")
    assert done.returncode == 0, done.stderr
    for backend in ("horovod", "ddp"):
        line = next(x for x in done.stdout.splitlines() if f"--backend {backend} " in x)
        assert line.startswith(launch), line
        assert f"bin/hpcstack-train-benchmark --backend {backend} {DIGITS_OPTIONS.format(device=device)} " in line
    assert "--model tiny" not in done.stdout and "--model resnet50" not in done.stdout


def test_local_dry_run_of_the_digits_workload():
    done = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "localhost", "--workload", "digits",
                    "--local", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert DIGITS_OPTIONS.format(device="cpu") + " --threads 1" in done.stdout


def test_without_workload_the_site_keeps_its_own():
    done = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "localhost", "--dry-run")
    assert "--model tiny" in done.stdout and "--model digits" not in done.stdout


def test_an_unknown_workload_names_the_known_ones():
    done = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "localhost", "--workload", "mnist",
                    "--dry-run")
    assert done.returncode != 0
    assert "--workload mnist: no such workload in the recipe's validation (known: cpu, digits, gpu, gpu-amp, smoke)" \
        in done.stderr


def test_named_workload_takes_the_sites_device_unless_it_names_one():
    site = load_site("cirrus")
    recipe = load_recipe("pytorch/2.3.1-gpu", site)
    s = validation_settings(site, recipe, workload="digits")
    assert s.workload == {"model": "digits", "batch_size": 32, "epochs": 20, "lr": 0.01,
                          "accuracy_threshold": 0.95, "device": "cuda"}
    assert s.workload_name == "digits"


def test_schema_checks_the_accuracy_threshold(tmp_path):
    from hpcstack.errors import ConfigError
    from hpcstack.install.components.validation import Validation

    data = yaml.safe_load((REPO / "recipes" / "pytorch" / "2.3.1-gpu.validation.yaml").read_text())
    data["workloads"]["digits"]["accuracy_threshold"] = 95
    (tmp_path / "v.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:
        Validation("v.yaml").load(tmp_path)
    assert "accuracy_threshold" in str(err.value)


def test_a_named_workload_is_not_judged_against_the_sites_img_s_references():
    # cirrus's references are ResNet-50 figures (367 img/s per V100, +15 % at most): the digits
    # CNN runs far faster, which must not read as a performance failure
    site = load_site("cirrus")
    recipe = load_recipe("pytorch/2.3.1-gpu", site)
    assert validation_settings(site, recipe).references["cirrus:gpu"]
    assert validation_settings(site, recipe, workload="digits").references == {}
