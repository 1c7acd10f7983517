"""The real GPU sites, dry-run: every shipped site (``site-configs/*.yaml`` of the package under
test) whose Slurm jobs ask for GPUs and whose toolchain has CUDA (:data:`SITES`, conftest's
:func:`gpu_sites`), today EPCC Cirrus (the V100 nodes of the old Cirrus, until 8 December 2025), NERSC
Perlmutter, JSC JUWELS Booster and CINECA Leonardo Booster,
each as its documentation asks (the sources each site config cites): Cirrus's GPU jobs give the
tasks' shape to srun only, JUWELS Booster's modules load in its hierarchy's order, Perlmutter needs
no account and pins cudatoolkit. A new GPU site is found here by itself: its dry runs must succeed,
be valid bash and match its golden files, which :data:`REGENERATE` makes (docs/admin/new-site.md).

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

Make them for a new site, or regenerate them after an intended change, with :data:`REGENERATE`
(conftest's, one command for the golden files of every test file that finds its sites here: it
installs hpcstack from this checkout first, so the files are the checkout's output) and review the diff of
``tests/golden/``. A site without its golden files fails with that command, not with a missing
file. Besides the whole-file comparison, the key lines of the shipped sites are asserted one by
one (module loads, HOROVOD_* variables, the Lua modulefile, #SBATCH lines, srun).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import hpcstack
from hpcstack.fsutil import current_user
from conftest import REGENERATE, assert_site_golden, gpu_sites, hpcstack as run_hpcstack

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
DATA_DIR = str(Path(hpcstack.__file__).resolve().parent / "data")


SITES = gpu_sites()


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


class _Scripts(dict):
    """``scripts[site, command]``: the dry run's output, run once per site and command, when a
    test first asks for it."""

    def __missing__(self, key: tuple[str, str]) -> str:
        site, command = key
        self[key] = dry_run(command, site)
        return self[key]


@pytest.fixture(scope="module")
def scripts() -> dict[tuple[str, str], str]:
    return _Scripts()


def test_the_shipped_gpu_sites_are_found():
    """SITES comes from site-configs/ (a site without GPUs, such as localhost, is not one)."""
    assert SITES, "no shipped site has slurm.gpus_per_node > 0 and a CUDA toolchain"
    assert "localhost" not in SITES, SITES


@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("command", ["install", "validate"])
def test_matches_the_golden_file(scripts, site, command):
    got = normalise(scripts[site, command])
    assert_site_golden(GOLDEN / f"{site}-{command}.sh", got, site)


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
    # cudatoolkit pinned (the unversioned one moved to CUDA 13), NCCL from the nccl module
    assert (lines.index("module load python") < lines.index("module load cudatoolkit/12.2")
            < lines.index("module load cray-mpich") < lines.index("module load nccl/2.21.5"))
    assert "module load cudatoolkit" not in lines
    build = _build_line(script)
    for var in ("CC=cc", "CXX=CC", "FC=ftn", "HOROVOD_GPU=CUDA", "HOROVOD_GPU_OPERATIONS=NCCL",
                'HOROVOD_CUDA_HOME="${CUDA_HOME}"', 'HOROVOD_NCCL_HOME="${NCCL_DIR}"',
                "HOROVOD_BUILD_CUDA_CC_LIST=80", "HOROVOD_WITH_MPI=1"):
        assert var in build, var
    assert "stubs" not in build                       # login nodes have an A100: no CUDA stubs
    assert script.rstrip().count("2.3.1-gpu.pypi.lock") and "cu121.lock" not in script  # Python 3.11
    module = script.split("# --- step module:")[1]
    for dep in ("python", "cudatoolkit/12.2", "cray-mpich", "nccl/2.21.5"):
        assert f'depends_on("{dep}")' in module
    assert 'depends_on("cudatoolkit")' not in module and "comm_libs/nccl" not in script
    # the Slingshot interfaces for NCCL's sockets, no GPU-aware cray-mpich: for every user of the stack
    assert 'setenv("NCCL_SOCKET_IFNAME", "hsn")' in module
    assert 'setenv("MPICH_GPU_SUPPORT_ENABLED", "0")' in module
    assert "/global/common/software/PROJECT/hpcstack/modulefiles/pytorch/2.3.1-gpu.lua" in module
    assert "LD_LIBRARY_PATH" not in module


def test_juwels_booster_install(scripts):
    script = scripts["juwels-booster", "install"]
    lines = script.splitlines()
    # the hierarchy first (Python/3.11.3 is visible only under GCC/12.3.0), then the base module
    order = ["module load Stages/2024", "module load GCC/12.3.0", "module load ParaStationMPI/5.9.2-1",
             "module load Python/3.11.3", "module load CUDA/12", "module load NCCL/default-CUDA-12",
             "module load CMake/3.26.3"]
    at = [lines.index(l) for l in order]
    # the script starts its commands in `/`, as the real run does, never in the caller's directory
    assert lines[lines.index("set -euo pipefail") + 1].startswith("cd / ")
    assert at == sorted(at) and at[0] == lines.index("set -euo pipefail") + 2, at
    build = _build_line(script)
    for var in ("CC=mpicc", "CXX=mpicxx", 'HOROVOD_CUDA_HOME="${EBROOTCUDA}"', 'HOROVOD_NCCL_HOME="${EBROOTNCCL}"',
                "HOROVOD_BUILD_CUDA_CC_LIST=80", "HOROVOD_GPU_OPERATIONS=NCCL"):
        assert var in build, var
    assert "2.3.1-gpu.pypi.lock" in script and "cu121.lock" not in script
    module = script.split("# --- step module:")[1]
    deps = re.findall(r'^depends_on\("([^"]+)"\)$', module, flags=re.M)
    assert deps == ["Stages/2024", "GCC/12.3.0", "ParaStationMPI/5.9.2-1", "Python/3.11.3", "CUDA/12",
                    "NCCL/default-CUDA-12"], deps
    assert "SLURM_MPI_TYPE" not in script          # ParaStationMPI's module sets it (pspmix)
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
    # Slurm counts hardware threads there (SMT-2): 24 CPUs are a rank's 12 cores
    assert "--cpus-per-task=24" in opts
    assert re.search(r"^srun --nodes=2 --ntasks-per-node=4 --cpus-per-task=24 \S+/hpcstack-train-benchmark "
                     r"--backend ddp", script, flags=re.M)


def _module_lines(job: str) -> list[str]:
    return [l.split(" ||")[0] for l in job.splitlines() if l.startswith("module ")]


def test_juwels_booster_jobs_load_the_hierarchy_before_the_module_root(scripts):
    for job in scripts["juwels-booster", "validate"].split("# =====")[1:]:
        # Stages/2024 resets MODULEPATH: the stack's module root goes on it after the hierarchy
        assert _module_lines(job) == [
            "module load Stages/2024", "module load GCC/12.3.0", "module load ParaStationMPI/5.9.2-1",
            "module use /p/project/PROJECT/hpcstack/modulefiles", "module load pytorch/2.3.1-gpu"], job
        assert "SLURM_MPI_TYPE" not in job and "--mpi=" not in job     # pspmix comes from the MPI module


def test_cirrus_jobs_give_the_tasks_shape_to_srun_only(scripts):
    script = scripts["cirrus", "validate"]
    jobs = script.split("# =====")[1:]
    assert len(jobs) == 2
    for job, nodes in zip(jobs, (1, 2)):
        opts = _sbatch(job)
        # "submission script should not specify options such as --ntasks and --cpus-per-task"
        assert not any(o.startswith(("--ntasks", "--cpus-per-task", "--mem")) for o in opts), opts
        assert {"--partition=gpu", "--qos=gpu", "--gres=gpu:4", "--exclusive", f"--nodes={nodes}"} <= set(opts)
        steps = [l for l in job.splitlines() if l.startswith("srun ")]
        assert len(steps) == 2, job                 # horovod and ddp
        for step in steps:
            assert step.startswith(f"srun --nodes={nodes} --ntasks-per-node=4 --cpus-per-task=10 "
                                   f"--ntasks={4 * nodes} --hint=nomultithread "), step
    # a budget is required there: the job says how to give one
    assert "pass --account=BUDGET" in script


def test_cirrus_refuses_a_validation_directory_on_home():
    # /home is not available to Cirrus's batch jobs: one line naming the key, nothing written
    proc = run_hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run",
                        "--output-dir", "/home/someone/validation")
    assert proc.returncode == 2 and not proc.stdout, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --output-dir: /home/someone/validation is under /home")
    assert "slurm.login_only_paths" in lines[0]
    ok = run_hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run",
                      "--output-dir", "/work/x01/x01/someone/validation")
    assert ok.returncode == 0, ok.stderr
    # elsewhere /home is an ordinary directory
    assert run_hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "perlmutter", "--dry-run",
                        "--output-dir", "/home/someone/validation").returncode == 0


def test_perlmutter_needs_no_account(scripts):
    script = scripts["perlmutter", "validate"]
    assert "--account" not in script            # jobs go to the user's default project
    assert not any(o.startswith("--account") for o in _sbatch(script))


def test_the_working_directory_on_home_is_refused_too_and_only_below_home():
    from hpcstack.errors import ConfigError
    from hpcstack.site import load_site
    from hpcstack.validate.validation import check_visible_on_compute, validation_settings
    from hpcstack.recipe import load_recipe

    site = load_site("cirrus")
    s = validation_settings(site, load_recipe("pytorch/2.3.1-gpu", site)).slurm
    with pytest.raises(ConfigError) as info:
        check_visible_on_compute(s, "cirrus", Path("/home/x01/x01/someone"), given=False)
    (line,) = info.value.problems
    assert "the working directory; slurm.output_root is unset" in line and "under /home" in line
    for fine in ("/homework/x", "/work/x01/x01/someone", "/"):
        check_visible_on_compute(s, "cirrus", Path(fine), given=False)


def test_new_site_page_gives_the_command_that_makes_the_golden_files():
    """docs/admin/new-site.md, "Golden files", gives conftest's REGENERATE as written."""
    from conftest import REPO

    assert REGENERATE in (REPO / "docs" / "admin" / "new-site.md").read_text()
