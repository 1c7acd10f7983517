"""Two real GPU sites beside cirrus: NERSC Perlmutter and JSC JUWELS Booster, dry-run.

Golden files: ``tests/golden/<site>-install.sh`` and ``<site>-validate.sh`` are the output of
``hpcstack install pytorch/2.3.1-gpu --site <site> --dry-run`` and ``hpcstack validate ... --dry-run``,
compared after normalising what differs between machines and runs:

- the build id (a standalone run of 12 hex digits, e.g. ``.2.3.1-gpu-ae937e4c6119``) -> ``@BUILD@``
  (it hashes the recipe and site, so an unrelated recipe edit would otherwise break the files);
- the installed hpcstack package's data directory (``<site-packages or checkout>/hpcstack/data``)
  -> ``@HPCSTACK_DATA@``;
- the uv binary (``<venv>/bin/uv`` or wherever uv was found, before ``pip`` or ``build``) -> ``@UV@``;
- the validation's output directory (``<cwd>/hpcstack-validate-pytorch-2.3.1-gpu-<date>-<time>``)
  -> ``@VALIDATION_DIR@``.

Regenerate after an intended change with ``HPCSTACK_UPDATE_GOLDEN=1 pytest tests/test_gpu_sites.py``
and review the diff of ``tests/golden/``. Besides the whole-file comparison, the key lines are
asserted one by one (module loads, HOROVOD_* variables, the Lua modulefile, #SBATCH lines, srun).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import hpcstack
from hpcstack.fsutil import current_user
from conftest import assert_golden, hpcstack as run_hpcstack

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
DATA_DIR = str(Path(hpcstack.__file__).resolve().parent / "data")
SITES = ["perlmutter", "juwels-booster"]


def normalise(text: str) -> str:
    text = text.replace(DATA_DIR, "@HPCSTACK_DATA@")
    text = re.sub(r"[^\s=]*/hpcstack-validate-pytorch-2\.3\.1-gpu-\d{8}-\d{6}", "@VALIDATION_DIR@", text)
    text = re.sub(r"(?<=\s)[^\s=]*/uv(?= pip | build )", "@UV@", text)
    # the permissions step hands the files of the user who installs over to the site's mode
    text = text.replace(f" -user {current_user()} ", " -user @USER@ ")
    return re.sub(r"(?<![0-9a-f])[0-9a-f]{12}(?![0-9a-f])", "@BUILD@", text)


def dry_run(command: str, site: str) -> str:
    proc = run_hpcstack(command, "pytorch/2.3.1-gpu", "--site", site, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def scripts() -> dict[tuple[str, str], str]:
    return {(site, cmd): dry_run(cmd, site) for site in SITES for cmd in ("install", "validate")}


@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("command", ["install", "validate"])
def test_matches_the_golden_file(scripts, site, command):
    got = normalise(scripts[site, command])
    path = GOLDEN / f"{site}-{command}.sh"
    assert_golden(path, got)


@pytest.mark.parametrize("site", SITES)
def test_scripts_are_valid_bash(scripts, site, tmp_path):
    for command in ("install", "validate"):
        path = tmp_path / f"{command}.sh"
        path.write_text(scripts[site, command])
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, command


def _build_line(script: str) -> str:
    return next(l for l in script.splitlines() if " --no-build-isolation" in l)


def test_perlmutter_install(scripts):
    script = scripts["perlmutter", "install"]
    lines = script.splitlines()
    assert lines.index("module load python") < lines.index("module load cudatoolkit") < lines.index("module load cray-mpich")
    build = _build_line(script)
    for var in ("CC=cc", "CXX=CC", "FC=ftn", "HOROVOD_GPU=CUDA", "HOROVOD_GPU_OPERATIONS=NCCL",
                'HOROVOD_CUDA_HOME="${CUDA_HOME}"', 'HOROVOD_NCCL_HOME="${CUDA_HOME}/../../comm_libs/nccl"',
                "HOROVOD_BUILD_CUDA_CC_LIST=80", "HOROVOD_WITH_MPI=1"):
        assert var in build, var
    assert "stubs" not in build                       # login nodes have an A100: no CUDA stubs
    assert script.rstrip().count("2.3.1-gpu.pypi.lock") and "cu121.lock" not in script  # Python 3.11
    module = script.split("# --- step module:")[1]
    for dep in ("python", "cudatoolkit", "cray-mpich"):
        assert f'depends_on("{dep}")' in module
    assert "/global/common/software/PROJECT/hpcstack/modulefiles/pytorch/2.3.1-gpu.lua" in module
    assert "LD_LIBRARY_PATH" not in module


def test_juwels_booster_install(scripts):
    script = scripts["juwels-booster", "install"]
    lines = script.splitlines()
    order = ["module load Python/3.11.3", "module load Stages/2024", "module load GCC/12.3.0",
             "module load ParaStationMPI/5.9.2-1", "module load CUDA/12", "module load NCCL/default-CUDA-12",
             "module load CMake/3.26.3"]
    assert [lines.index(l) for l in order] == sorted(lines.index(l) for l in order)
    build = _build_line(script)
    for var in ("CC=mpicc", "CXX=mpicxx", 'HOROVOD_CUDA_HOME="${EBROOTCUDA}"', 'HOROVOD_NCCL_HOME="${EBROOTNCCL}"',
                "HOROVOD_BUILD_CUDA_CC_LIST=80", "HOROVOD_GPU_OPERATIONS=NCCL"):
        assert var in build, var
    assert "2.3.1-gpu.pypi.lock" in script and "cu121.lock" not in script
    module = script.split("# --- step module:")[1]
    for dep in ("Python/3.11.3", "Stages/2024", "ParaStationMPI/5.9.2-1", "NCCL/default-CUDA-12"):
        assert f'depends_on("{dep}")' in module
    assert "CMake" not in module and "stubs" not in module
    assert "/p/project/PROJECT/hpcstack/modulefiles/pytorch/2.3.1-gpu.lua" in module


def _sbatch(script: str) -> list[str]:
    first = script.split("#!/bin/bash")[1]
    return [l.removeprefix("#SBATCH ") for l in first.splitlines() if l.startswith("#SBATCH ")]


@pytest.mark.integration
def test_perlmutter_jobs_use_a_constraint_and_gpus_per_node(scripts):
    script = scripts["perlmutter", "validate"]
    opts = _sbatch(script)
    assert "--constraint=gpu" in opts and "--gpus-per-node=4" in opts and "--qos=regular" in opts
    assert not any(o.startswith(("--partition", "--gres")) for o in opts)
    assert "--ntasks-per-node=4" in opts and "--cpus-per-task=32" in opts and "--exclusive" in opts
    assert "module use /global/common/software/PROJECT/hpcstack/modulefiles" in script
    assert re.search(r"^srun --nodes=1 --ntasks-per-node=4 --cpus-per-task=32 \S+/hpcstack-train-benchmark "
                     r"--backend horovod --model resnet50", script, flags=re.M)
    assert "perlmutter:gpu" in script


@pytest.mark.integration
def test_juwels_booster_jobs_use_the_booster_partition_and_gres(scripts):
    script = scripts["juwels-booster", "validate"]
    opts = _sbatch(script)
    assert "--partition=booster" in opts and "--gres=gpu:4" in opts
    assert not any(o.startswith(("--constraint", "--gpus-per-node", "--qos")) for o in opts)
    assert "--cpus-per-task=12" in opts
    assert re.search(r"^srun --nodes=2 --ntasks-per-node=4 --cpus-per-task=12 \S+/hpcstack-train-benchmark "
                     r"--backend ddp", script, flags=re.M)
