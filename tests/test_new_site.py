"""A new site from a YAML of machine facts alone: no code, no recipe edit.

The recipe decides what to build from the site's facts: the lock that fits its CUDA and Python,
Horovod's GPU operations and the check-build flags where it has CUDA, the compute capabilities
and CUDA/NCCL homes from its toolchain.
"""

from __future__ import annotations


import pytest
import yaml

from conftest import hpcstack

pytestmark = pytest.mark.unit


def _site(tmp_path, name: str, toolchain: dict, python: str, gpus: int) -> str:
    data = {
        "name": name,
        "description": f"{name}: a made-up cluster described by its facts only",
        "install_root": str(tmp_path / "sw"), "module_root": str(tmp_path / "mf"),
        "modules": {"tool": "lmod", "syntax": "lua", "base": f"python/{python}", "build": ["cmake/3.27"],
                    "init": {"bash": "/usr/share/lmod/lmod/init/bash"}},
        "python": {"version": python},
        "toolchain": toolchain,
        "launcher": {"command": "srun", "ranks": max(gpus, 1)},
        "slurm": {"partition": "gpu" if gpus else "standard", "gpus_per_node": gpus,
                  "tasks_per_node": max(gpus, 1), "cpus_per_task": 8, "launcher": "srun"},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _dry_run(site: str) -> str:
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.integration
def test_a_new_gpu_site_gets_the_cuda_build(tmp_path):
    site = _site(tmp_path, "a100land", {
        "cc": "mpicc", "cxx": "mpicxx",
        "cuda": {"home": "/opt/cuda/12.2", "version": "12.2", "cc_list": [80]},
        "nccl": {"home": "/opt/nccl/2.18"}}, "3.12", gpus=4)
    script = _dry_run(site)
    assert "2.3.1-gpu.cu121.lock" in script                      # CUDA >= 12.1 and Python 3.12
    assert "--index-strategy unsafe-best-match" in script
    build = next(line for line in script.splitlines() if " --no-build-isolation" in line)
    for var in ("HOROVOD_GPU=CUDA", "HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_CUDA_HOME=/opt/cuda/12.2",
                "HOROVOD_NCCL_HOME=/opt/nccl/2.18", "HOROVOD_BUILD_CUDA_CC_LIST=80"):
        assert var in build, var
    assert "HOROVOD_WITHOUT_CUDA" not in build
    assert 'REQUIRED = ["PyTorch", "MPI", "Gloo", "NCCL"]\n' in script
    # the base Python module, then the site's build modules, before anything is built
    lines = script.splitlines()
    assert lines.index("module load python/3.12") < lines.index("module load cmake/3.27") < lines.index(build), \
        "\n".join(lines[:20])
    assert "a100land" in script


@pytest.mark.integration
def test_a_new_cpu_site_gets_the_cpu_build(tmp_path):
    site = _site(tmp_path, "cpuland", {"cc": "mpicc", "cxx": "mpicxx"}, "3.11", gpus=0)
    script = _dry_run(site)
    assert "2.3.1-gpu.pypi.lock" in script and "cu121.lock" not in script
    assert "HOROVOD_WITHOUT_CUDA=1" in script and "HOROVOD_GPU_OPERATIONS" not in script
    assert 'REQUIRED = ["PyTorch", "MPI", "Gloo"]\n' in script


@pytest.mark.integration
@pytest.mark.parametrize("cuda, python", [("12.4", "3.11"), ("11.8", "3.12")])
def test_the_cu121_lock_needs_both_its_python_and_cuda(tmp_path, cuda, python):
    """The +cu121 wheels of the lock are for Python 3.12 and need CUDA >= 12.1: a site with
    either missing gets the PyPI lock (the same CUDA 12.1 build of torch, from PyPI)."""
    site = _site(tmp_path, "otherland", {"cuda": {"home": "/opt/cuda", "version": cuda}}, python, gpus=2)
    script = _dry_run(site)
    assert "2.3.1-gpu.pypi.lock" in script and "cu121.lock" not in script
