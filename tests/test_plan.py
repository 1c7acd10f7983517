"""The resolved plan and its bash rendering (--dry-run): one plan object, two renderings."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import hpcstack
from hpcstack.install.actions import Run, bash_word, expand

pytestmark = pytest.mark.unit

CIRRUS_BUILD_VARS = [  # the variables of the Cirrus instructions' Horovod line (docs/notes.md, "The Cirrus install by hand")
    "CC=mpicc", "CXX=mpicxx", "FC=mpifort",
    'HOROVOD_CUDA_HOME="${NVHPC_ROOT}/cuda/12.4"', 'HOROVOD_NCCL_HOME="${NVHPC_ROOT}/comm_libs/nccl"',
    "HOROVOD_GPU=CUDA", "HOROVOD_BUILD_CUDA_CC_LIST=70", "HOROVOD_CPU_OPERATIONS=MPI",
    "HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_PYTORCH=1",
    'CUDA_PATH="${NVHPC_ROOT}/cuda/12.4"',
]


@pytest.fixture(scope="module")
def cirrus_script():
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_cirrus_script_is_valid_bash(cirrus_script, tmp_path):
    path = tmp_path / "install.sh"
    path.write_text(cirrus_script)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_cirrus_script_loads_the_site_modules_first(cirrus_script):
    lines = cirrus_script.splitlines()
    assert lines.index("module load python/3.12.1-gpu") < lines.index("module load cmake/3.25.2")
    assert lines.index("module load cmake/3.25.2") < next(i for i, l in enumerate(lines) if "step fetch" in l)


def test_cirrus_horovod_build_line_matches_the_instructions(cirrus_script):
    build = next(l for l in cirrus_script.splitlines() if " --no-build-isolation" in l)
    for var in CIRRUS_BUILD_VARS:
        assert var in build, var
    assert "MAKEFLAGS=-j8" in build
    assert 'LD_LIBRARY_PATH="' in build and "cuda/lib64/stubs" in build
    assert "${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" in build  # never an empty element


def test_cirrus_wheels_come_from_the_cu121_lock_with_hashes(cirrus_script):
    line = next(l for l in cirrus_script.splitlines() if "--require-hashes" in l)
    assert line.endswith("2.3.1-gpu.cu121.lock")


def test_cirrus_modulefile_has_no_build_environment(cirrus_script):
    module = cirrus_script.split("# --- step module:")[1]
    assert "depends-on python/3.12.1-gpu" in module
    assert "stubs" not in module and "LD_LIBRARY_PATH" not in module and "cmake" not in module
    assert "/work/y07/shared/cirrus-modulefiles/pytorch/2.3.1-gpu" in module


def test_cirrus_sanity_requires_nccl(cirrus_script):
    line = next(l.strip() for l in cirrus_script.splitlines() if l.strip().startswith("REQUIRED = "))
    assert line == 'REQUIRED = ["PyTorch", "MPI", "Gloo", "NCCL"]'


def test_steps_are_in_order(cirrus_script):
    steps = re.findall(r"^# --- step (\w+):", cirrus_script, flags=re.M)
    # fetch and patch run in the background while venv and wheels run (test_overlap.py)
    assert steps == ["fetch", "patch", "venv", "wheels", "build", "install", "sanitycheck",
                     "permissions", "module"]


@pytest.mark.integration
def test_dry_run_writes_nothing(localhost_ready, tmp_path):
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "localhost", "--dry-run",
                    "--prefix", str(tmp_path / "sw"), "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 0, proc.stderr
    assert "HOROVOD_WITHOUT_CUDA=1" in proc.stdout and "HOROVOD_GPU_OPERATIONS" not in proc.stdout
    assert 'REQUIRED = ["PyTorch", "MPI", "Gloo"]\n' in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_bash_word_keeps_references_live_and_quotes_the_rest():
    assert bash_word("plain") == "plain"
    assert bash_word("a b") == "'a b'"
    assert bash_word("${X}/a b$c\"") == '"${X}/a b\\$c\\""'


def test_run_expands_references_and_prepends_without_empty_elements():
    run = Run(("true",), env={"A": "${ROOT}/x"}, prepend={"LD_LIBRARY_PATH": "${ROOT}/lib"})
    env = run.command_env({"ROOT": "/r"})
    assert env["A"] == "/r/x" and env["LD_LIBRARY_PATH"] == "/r/lib"
    env = run.command_env({"ROOT": "/r", "LD_LIBRARY_PATH": "/old"})
    assert env["LD_LIBRARY_PATH"] == "/r/lib:/old"
    assert expand("${UNSET}/y", {}) == "/y"


def test_rendered_command_runs_the_same_in_bash(tmp_path):
    run = Run(("printf", "%s|", "a b", "${HOME_X}/c"), env={"HOME_X": "/h"})
    out = subprocess.run(["bash", "-c", f"HOME_X=/h; {run.to_bash()}"], capture_output=True, text=True)
    assert out.stdout == "a b|/h/c|"
