"""The compute nodes' GPU driver (``gpu.driver_version``, ``gpu.cuda_driver_api``) against the CUDA
of the wheels a site installs: NVIDIA's minimum drivers under minor version compatibility, the CUDA
a lock's pins state, and the one line an install gets, before anything is written."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from conftest import hpcstack, unit_site
from hpcstack.errors import ConfigError
from hpcstack.install import driver
from hpcstack.install.driver import cuda_of_pin, driver_problems, min_driver, min_driver_api

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("cuda, least", [
    # NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Minimum Required Driver Version for
    # CUDA Minor Version Compatibility"
    ("11.8", (450, 80, 2)), ("11.0", (450, 80, 2)),
    ("12.1", (525, 60, 13)), ("12.9", (525, 60, 13)),
    ("13.0", (580, 65, 6)),
    ("10.2", (440, 33)),               # no minor version compatibility before CUDA 11
    ("14.0", None), ("9.2", None),     # not in the table
])
def test_the_minimum_driver_per_cuda(cuda, least):
    assert min_driver(cuda) == least


def test_the_minimum_driver_api_is_the_major_from_cuda_11_on():
    assert (min_driver_api("12.1"), min_driver_api("13.0"), min_driver_api("11.8")) == ("12.0", "13.0", "11.0")
    assert min_driver_api("10.2") == "10.2"


@pytest.mark.parametrize("name, version, cuda", [
    ("torch", "2.3.1+cu121", "12.1"), ("torchvision", "0.18.1+cu118", "11.8"), ("torch", "2.9.0+cu130", "13.0"),
    ("torch", "2.3.1+cu121.with.pypi.cudnn", "12.1"),
    ("nvidia-cuda-runtime-cu12", "12.1.105", "12.1"), ("nvidia-cuda-runtime", "13.0.96", "13.0"),
    ("cuda-toolkit", "13.0.3.0", "13.0"),
    ("nvidia-cuda-nvrtc-cu12", "12.9.86", None),     # not the runtime: the runtime pin says it
    ("torch", "2.14.1", None), ("numpy", "1.26.4", None),
])
def test_the_cuda_a_pin_states(name, version, cuda):
    assert cuda_of_pin(name, version) == cuda


def test_one_line_per_key_that_cannot_run_the_newest_cuda():
    needs = [("torch==2.3.1+cu121", "12.1"), ("nvidia-cuda-runtime-cu12==12.1.105", "12.1"), ("x==1+cu118", "11.8")]
    lines, note = driver_problems("470.57.02", "11.4", needs, "the wheels of t.lock")
    assert note is None and len(lines) == 2
    assert lines[0].startswith("gpu.driver_version: driver 470.57.02 is too old for the wheels of t.lock: "
                               "torch==2.3.1+cu121, nvidia-cuda-runtime-cu12==12.1.105 are built for CUDA 12.1, "
                               "which needs driver >= 525.60.13 (")
    assert lines[1].startswith("gpu.cuda_driver_api: the driver's CUDA 11.4 is too old for the wheels of t.lock: ")
    assert "needs CUDA driver API >= 12.0" in lines[1]
    # the same CUDA 12 wheels on drivers that run them (minor version compatibility: 12.0 runs 12.1)
    assert driver_problems("525.60.13", "12.0", needs, "w") == ([], None)
    assert driver_problems("580.65.06", "13.0", needs, "w") == ([], None)       # backward compatibility
    # no key, or no pin that states a CUDA: nothing to check
    assert driver_problems(None, None, needs, "w") == ([], None)
    assert driver_problems("470.57.02", None, [], "w") == ([], None)


def test_a_cuda_the_table_does_not_know_is_a_note_not_a_refusal():
    lines, note = driver_problems("999.1", None, [("torch==9+cu140", "14.0")], "w")
    assert lines == [] and "no entry for CUDA 14.0" in note and "give gpu.cuda_driver_api" in note
    lines, _ = driver_problems("999.1", "13.5", [("torch==9+cu140", "14.0")], "w")
    assert len(lines) == 1 and lines[0].startswith("gpu.cuda_driver_api: ")


# ------------------------------------------------------------------ real site configs, the CLI

def _site(tmp_path, base: str, gpu: dict | None, python: str | None = None) -> str:
    """A copy of the shipped site ``base`` with ``gpu`` set, its roots under ``tmp_path``."""
    data = unit_site(base, name=f"{base}-drv", roots=tmp_path / "roots")
    if python:
        data["python"]["version"] = python
    if gpu is not None:
        data["gpu"] = gpu
    path = tmp_path / f"{base}-drv.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _errors(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def test_cu121_wheels_on_a_driver_too_old_are_refused_in_one_line_before_anything_is_written(tmp_path):
    site = _site(tmp_path, "cirrus", {"driver_version": "470.57.02"})
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 2, proc.stderr
    (line,) = _errors(proc)
    assert line.startswith(f"error: {site}: gpu.driver_version: driver 470.57.02 is too old for the wheels "
                           "of 2.3.1-gpu.cu121.lock: ")
    assert "torch==2.3.1+cu121" in line and "CUDA 12.1" in line and "needs driver >= 525.60.13" in line
    assert "https://docs.nvidia.com" not in line and "minor version compatibility" in line
    assert proc.stdout == ""
    assert not (tmp_path / "roots").exists()


def test_cuda_13_wheels_need_a_580_driver(tmp_path):
    site = _site(tmp_path, "perlmutter", {"driver_version": "535.104.05", "cuda_driver_api": "12.2"}, python="3.12")
    proc = hpcstack("install", "pytorch/2.14.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 2, proc.stderr
    lines = _errors(proc)
    assert len(lines) == 2, lines
    assert "gpu.driver_version: driver 535.104.05 is too old" in lines[0] and "needs driver >= 580.65.06" in lines[0]
    assert "gpu.cuda_driver_api: the driver's CUDA 12.2 is too old" in lines[1]
    assert "needs CUDA driver API >= 13.0" in lines[1] and "cuda-toolkit==13.0.3.0" in lines[1]
    assert not (tmp_path / "roots").exists()


@pytest.mark.parametrize("gpu", [{"driver_version": "580.65.06"}, {"cuda_driver_api": "13.0"},
                                 {"driver_version": "590.44.01", "cuda_driver_api": "13.1"}])
def test_a_driver_that_runs_the_wheels_passes_and_leaves_the_plan_as_it_was(tmp_path, gpu):
    """The check is no step of the plan: stating the driver does not make installed stacks out of date."""
    site = _site(tmp_path, "perlmutter", gpu, python="3.12")
    proc = hpcstack("install", "pytorch/2.14.1-gpu", "--site", site, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    without = hpcstack("install", "pytorch/2.14.1-gpu", "--site", _site(tmp_path, "perlmutter", None, python="3.12"),
                       "--dry-run", "--json")
    hashes = [[s["hash"] for s in json.loads(p.stdout)["steps"]] for p in (proc, without)]
    assert hashes[0] == hashes[1]


@pytest.mark.parametrize("recipe", ["pytorch/2.3.1-gpu", "mpi4py/4.1.2"])
def test_no_gpu_key_no_check_and_no_cuda_wheels_nothing_to_refuse(tmp_path, recipe):
    proc = hpcstack("install", recipe, "--site", _site(tmp_path, "perlmutter", None), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "GPU driver" not in proc.stdout + proc.stderr
    old = _site(tmp_path, "perlmutter", {"driver_version": "470.57.02"})
    proc = hpcstack("install", "mpi4py/4.1.2", "--site", old, "--dry-run")     # a PyPI lock without CUDA pins
    assert proc.returncode == 0, proc.stderr


def test_the_install_refuses_in_its_first_checks_before_any_directory_is_made(tmp_path):
    """The install itself (not the dry run) refuses when it resolves its plan, before the stage,
    the prefix or the module root exist. The build environment is this process's (no module tool
    here)."""
    from hpcstack.install.service import InstallService
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    # perlmutter's PyPI lock: its wheels' GPU architectures are recorded, so nothing is downloaded
    site = load_site(_site(tmp_path, "perlmutter", {"cuda_driver_api": "11.4"}))
    service = InstallService(site, load_recipe("pytorch/2.3.1-gpu", site))
    service._env = dict(os.environ)      # the modules' environment, without a module tool
    with pytest.raises(ConfigError) as err:
        service.install(announce=lambda line: None)
    (line,) = err.value.lines()
    assert line.startswith(f"{site.path}: gpu.cuda_driver_api: the driver's CUDA 11.4 is too old for the wheels of "
                           "2.3.1-gpu.pypi.lock: nvidia-cuda-runtime-cu12==12.1.105 is built for CUDA 12.1, which "
                           "needs CUDA driver API >= 12.0"), line
    assert not (tmp_path / "roots").exists()


def test_the_table_cites_its_source():
    assert "cuda-toolkit-release-notes" in (driver.__doc__ or "") + open(driver.__file__).read()
