"""The recipe's GPU Horovod built and checked on a real GPU: ``benchmarks/gpu.py`` (docs/benchmarks.md,
"On a GPU") with the installed stack's torch.

Where ``nvidia-smi -L`` lists a GPU, the script probes the machine (the GPU's compute capability,
the CUDA 12.4 toolkit of ``scripts/localhost-cuda-toolkit``, NCCL from the ``nvidia-nccl-cu12``
wheel beside the stack's torch), writes and loads its site config, builds Horovod from the
recipe's sdist (the one the stack's install fetched into the site's cache) and patches with the
build step's variables for that site (``HOROVOD_GPU_OPERATIONS=NCCL``), requires the recipe's
``horovodrun --check-build`` flags (``[X] NCCL`` among them), and trains the recipe's ``gpu``
workload once per backend (Horovod, DDP) on one GPU rank: the collectives check first (exact
results of every collective over NCCL), then the benchmark and the convergence check, judged as
``hpcstack validate`` judges.

Elsewhere it skips with a reason that starts "needs a GPU" (conftest.ALLOWED_SKIPS: the CI machines
have none). The script runs in this environment's Python (hpcstack, pip) with the stack's
site-packages first on ``PYTHONPATH`` (torch and its NCCL), as on the lent GPU machines, where
the machine's Python holds torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

RECIPE = "pytorch/2.3.1-gpu"
#: The CUDA toolkit of torch 2.3.1's major version (12): scripts/localhost-cuda-toolkit.
TOOLKIT = Path("/opt/hpcstack/cuda-12.4")


def _gpus() -> tuple[list[str], str]:
    """The lines of ``nvidia-smi -L`` that name a GPU, and what was seen (for the skip reason)."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return [], "no nvidia-smi on PATH"
    except subprocess.TimeoutExpired:
        return [], "nvidia-smi -L did not answer in 60 s"
    gpus = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    seen = f"nvidia-smi -L exited {proc.returncode}: {(proc.stdout + proc.stderr).strip()[:200]}"
    return gpus, seen


GPUS, SEEN = _gpus()

pytestmark = [pytest.mark.e2e, pytest.mark.gpu,
              pytest.mark.skipif(not GPUS, reason=f"needs a GPU: nvidia-smi -L lists none ({SEEN})")]


def test_gpu_py_builds_horovod_with_nccl_and_its_collectives_are_exact(installed_stack, tmp_path):
    from hpcstack.install.components.horovod import HorovodBuild
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    if not (TOOLKIT / "bin" / "nvcc").is_file():
        pytest.skip(f"no CUDA 12.4 toolkit in {TOOLKIT}: run scripts/localhost-cuda-toolkit "
                    "(scripts/localhost-setup --with-test-tools does)")
    site = load_site("localhost")
    build = next(c for c in load_recipe(RECIPE, site).components if isinstance(c, HorovodBuild))
    sdist = Path(site.cache_dir) / "sources" / os.path.basename(build.url)
    assert sdist.is_file(), f"{sdist}: the install of {RECIPE} fetches it into the site's cache"
    # the stack's site-packages, for this very interpreter (both are the machine's Python)
    xy = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stack_site = installed_stack / "venv" / "lib" / xy / "site-packages"
    assert stack_site.is_dir(), f"the stack's venv has no {xy}: its Python is not this one"
    out = tmp_path / "gpu"
    env = {**os.environ, "PYTHONPATH": str(stack_site), "PATH": f"{TOOLKIT / 'bin'}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--sdist", str(sdist),
                           "--out", str(out), "--runs", "horovod:gpu,ddp:gpu"],
                          capture_output=True, text=True, env=env, timeout=3600)
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    facts = summary["machine"]
    assert facts["gpu"] and facts["gpu"] in "\n".join(GPUS), (facts["gpu"], GPUS)  # torch's GPU 0
    assert summary["build_env"]["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert summary["build_env"]["HOROVOD_BUILD_CUDA_CC_LIST"] == str(facts["cc"])
    assert summary["build"]["ok"] is True, summary["build"]
    assert summary["check_build"]["ok"] is True and "[X] NCCL" in summary["check_build"]["text"], \
        summary["check_build"]
    runs = {run["backend"]: run for run in summary["runs"]}
    assert sorted(runs) == ["ddp", "horovod"]
    for backend, run in runs.items():
        assert run["exit_status"] == 0, (backend, run["tail"])
        assert run["transport"] is not None and "nccl" in run["transport"], (backend, run["transport"])
        # the collectives check: every collective's result exact, none skipped for a failure
        assert run["collectives_ok"] is True and run["collectives_failed"] == 0, \
            (backend, run["collectives_failures"])
        assert run["collectives_checks"] > 0
        assert run["reasons"] == [], (backend, run["reasons"])   # the validation's judge
        assert run["figures"]["throughput_total"] > 0
