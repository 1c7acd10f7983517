"""The GPU path's checks that need no GPU: the toolkit must compile for the site's
compute capabilities (checked before anything is written), and a failed build says its first
compiler error."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.install.components.horovod import CudaArchCheck
from hpcstack.install.runner import diagnose

pytestmark = pytest.mark.unit

#: A CUDA 13 compiler driver, which lacks compute capability 7.0: scripts/localhost-cuda13-nvcc puts
#: it there (scripts/localhost-setup --with-test-tools runs it).
NVCC = Path("/opt/hpcstack/cuda-13.5/bin/nvcc")


def _nvcc_version() -> str:
    import re
    import subprocess

    out = subprocess.run([str(NVCC), "--version"], capture_output=True, text=True).stdout
    return re.search(r"release (\d+\.\d+)", out).group(1)


@pytest.fixture(scope="module")
def nvcc():
    if not NVCC.is_file():
        pytest.skip(f"no CUDA 13 nvcc at {NVCC}: run scripts/localhost-cuda13-nvcc "
                    "(scripts/localhost-setup --with-test-tools does)")
    return str(NVCC)


@pytest.mark.integration  # the real CUDA 13 compiler driver
def test_the_check_passes_for_capabilities_the_toolkit_offers(nvcc):
    assert CudaArchCheck(nvcc, (80, 90), _nvcc_version()).problems({"PATH": "/usr/bin:/bin"}) == []


@pytest.mark.integration
def test_a_site_asking_for_a_capability_its_toolkit_dropped_fails_before_anything_is_written(
        nvcc, localhost_ready, tmp_path):
    version = _nvcc_version()
    if int(version.split(".")[0]) < 13:
        pytest.skip(f"CUDA {version} still offers compute_70; the test needs CUDA 13 or later")
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["name"] = "v100-on-cuda13"
    data["toolchain"]["cuda"] = {"home": str(NVCC.parent.parent), "version": version, "cc_list": [70, 80]}
    site = tmp_path / "v100-on-cuda13.yaml"
    site.write_text(yaml.safe_dump(data))
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", str(site), "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"CUDA {version}" in line and "compute capability 7.0 (compute_70)" in line
    assert "8.0" not in line and "toolchain.cuda.cc_list" in line
    assert not (tmp_path / "sw").exists() and not (tmp_path / "mf").exists()


def test_the_dry_run_prints_the_same_check(tmp_path):
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert 'hpcstack_archs=$("${NVHPC_ROOT}/cuda/12.4/bin/nvcc" --list-gpu-arch)' in proc.stdout
    assert "for cc in 70; do" in proc.stdout


@pytest.mark.integration  # the real CUDA 13 compiler driver
def test_the_printed_check_fails_in_bash_as_the_preflight_does(nvcc, tmp_path):
    import subprocess

    version = _nvcc_version()
    for ccs, ok in (((80,), True), ((70,), int(version.split(".")[0]) < 13)):
        script = CudaArchCheck(nvcc, ccs, version).to_bash()
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True)
        assert (proc.returncode == 0) == ok, (ccs, proc.stderr)
        assert (CudaArchCheck(nvcc, ccs, version).problems({}) == []) == ok


@pytest.mark.parametrize("log, first", [
    # GCC 13 on Horovod 0.28.1: <string> no longer comes in transitively
    ("[ 12%] Building CXX object horovod/common/CMakeFiles/x.dir/operations.cc.o\n"
     "In file included from /stage/src/horovod-0.28.1/horovod/common/operations.cc:16:\n"
     "/stage/src/horovod-0.28.1/horovod/common/group_table.h:35:8: error: 'string' in namespace 'std' "
     "does not name a type\n"
     "/stage/src/horovod-0.28.1/horovod/common/common.h:343:14: error: 'logic_error' is not a member of 'std'\n"
     "make[2]: *** [x] Error 1\n",
     "/stage/src/horovod-0.28.1/horovod/common/group_table.h:35:8: error: 'string' in namespace 'std' "
     "does not name a type"),
    ("/usr/include/torch/csrc/api/include/torch/all.h:4:2: error: #error C++17 or later compatible "
     "compiler is required to use PyTorch.\n",
     "/usr/include/torch/csrc/api/include/torch/all.h:4:2: error: #error C++17 or later compatible "
     "compiler is required to use PyTorch."),
    ("nvcc fatal   : Unsupported gpu architecture 'compute_70'\n"
     "kernel.cu(12): error: identifier \"foo\" is undefined\n",
     "kernel.cu(12): error: identifier \"foo\" is undefined"),
])
def test_a_failed_build_names_its_first_compiler_error(log, first):
    line = diagnose("running build_ext\n-- Configuring done\n" + log)
    assert line == f"the build failed; the first compiler error: {first}"


def test_a_failed_link_names_the_linker_error():
    # CMake's check of the CUDA compiler, relayed (indented) by pip: the linker's line is the cause
    log = ("      CMake Error at /usr/share/cmake-3.25/Modules/CMakeDetermineCompilerId.cmake:739 (message):\n"
           "        Compiling the CUDA compiler identification source file\n"
           "        /usr/bin/ld: cannot find -lcudadevrt: No such file or directory\n"
           "        collect2: error: ld returned 1 exit status\n")
    assert diagnose(log) == ("the build failed; the first linker error: "
                             "/usr/bin/ld: cannot find -lcudadevrt: No such file or directory")
    assert diagnose(log.replace("/usr/bin/ld: cannot find -lcudadevrt: No such file or directory\n", "")) == (
        "the build failed; CMake: /usr/share/cmake-3.25/Modules/CMakeDetermineCompilerId.cmake:739 (message) "
        "Compiling the CUDA compiler identification source file")


def test_a_failed_cmake_names_its_error():
    log = ("CMake Error at CMakeLists.txt:1 (cmake_minimum_required):\n"
           "  Compatibility with CMake < 3.5 has been removed from CMake.\n\n-- Configuring incomplete\n")
    assert diagnose(log) == ("the build failed; CMake: CMakeLists.txt:1 (cmake_minimum_required) "
                             "Compatibility with CMake < 3.5 has been removed from CMake.")
