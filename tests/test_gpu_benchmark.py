"""``benchmarks/gpu.py`` without a GPU: the site it writes for a GPU machine, and what it builds.

On a GPU machine the script probes the GPU, torch, ``nvcc``, NCCL and MPI, writes a site config
from them and builds Horovod with the build step's variables of ``pytorch/2.3.1-gpu`` for that
site (docs/benchmarks.md, "On a GPU"). Here the probe's facts are given as an H100 machine would
report them, with the CUDA 12.4 toolkit of ``scripts/localhost-cuda-toolkit`` as its CUDA, so
the site schema, the resolve and the toolkit preflight run for real; only the build and the
training need the GPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import REPO

TOOLKIT = Path("/opt/hpcstack/cuda-12.4")
NCCL = Path("/opt/hpcstack/nccl-2.20.5")

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not (TOOLKIT / "bin" / "nvcc").is_file() or not (NCCL / "include" / "nccl.h").is_file(),
    reason=f"no CUDA 12.4 toolkit in {TOOLKIT} or NCCL in {NCCL}: run scripts/localhost-cuda-toolkit "
           "(scripts/localhost-setup --with-test-tools does)")]


def _benchmark():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", REPO / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _facts(**changes) -> dict:
    """What ``probe()`` reports on an H100 machine, with this machine's CUDA 12.4 toolkit."""
    facts = {"gpu": "NVIDIA H100 80GB HBM3", "cc": 90, "torch": "2.3.1", "torch_cuda": "12.1",
             "cuda_home": str(TOOLKIT), "nvcc": "12.4", "nccl_dir": str(NCCL), "nccl_version": "2.20.5",
             "mpicc": "/usr/bin/mpicc", "static_cudart": False, "python": "3.11.2", "cpus": 16}
    return {**facts, **changes}


def test_the_gpu_site_builds_with_the_recipes_gpu_settings(tmp_path):
    gpu = _benchmark()
    facts = _facts()
    path = gpu.site_config(facts, tmp_path)
    build, patches, env = gpu.build_env(path, facts)
    assert env["HOROVOD_GPU"] == "CUDA" and env["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert env["HOROVOD_CPU_OPERATIONS"] == "MPI" and env["HOROVOD_WITH_MPI"] == "1"
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    assert env["HOROVOD_CUDA_HOME"] == str(TOOLKIT) and env["HOROVOD_NCCL_HOME"] == str(NCCL)
    assert env["CC"] == "mpicc" and env["MAKEFLAGS"] == "-j16"
    # a toolkit without libcudart_static.a links the shared runtime (our cuda-runtime patch)
    assert env["HOROVOD_CUDA_RUNTIME_LIBRARY"] == "Shared"
    files = [patch.file for patch in build.patches]
    assert files[-1] == "horovod-0.28.1-onerank-avg.patch"
    assert all((patches / name).is_file() for name in files)


def test_without_mpi_the_build_takes_gloo_for_cpu_tensors(tmp_path):
    gpu = _benchmark()
    facts = _facts(mpicc=None)
    _, _, env = gpu.build_env(gpu.site_config(facts, tmp_path), facts)
    assert env["CC"] == "gcc" and env["CXX"] == "g++"
    assert env["HOROVOD_WITHOUT_MPI"] == "1" and "HOROVOD_WITH_MPI" not in env
    assert env["HOROVOD_CPU_OPERATIONS"] == "Gloo"


def test_a_capability_the_toolkit_cannot_compile_stops_before_the_build(tmp_path):
    gpu = _benchmark()
    facts = _facts(cc=120)  # Blackwell (sm_120): CUDA 12.8 and later
    with pytest.raises(SystemExit, match=r"does not compile for compute capability 12\.0"):
        gpu.build_env(gpu.site_config(facts, tmp_path), facts)


def test_the_runs_train_the_recipes_gpu_workloads(tmp_path):
    from hpcstack.site import load_site

    gpu = _benchmark()
    site = load_site(str(gpu.site_config(_facts(), tmp_path)))
    fp32, amp, amp32 = (gpu.workload_of(name, site) for name in ("gpu", "gpu-amp", "gpu-amp32"))
    assert (fp32["model"], fp32["batch_size"], fp32["precision"], fp32["device"]) == ("resnet50", 32, "fp32", "cuda")
    assert (amp["batch_size"], amp["precision"], amp.get("channels_last")) == (128, "amp", True)
    assert (amp32["batch_size"], amp32["precision"], amp32.get("channels_last")) == (32, "amp", None)
