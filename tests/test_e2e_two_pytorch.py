"""Two PyTorch generations side by side on localhost, under Environment Modules and Lmod: the
README's ``pytorch/2.3.1-gpu`` (Horovod) and ``pytorch/2.14.1-gpu`` (torch.distributed only).

- ``module avail pytorch`` lists both; ``module load pytorch`` loads the default an admin set with
  ``hpcstack module set-default``, and installing the new one did not move it;
- a venv extended against 2.3.1 keeps loading 2.3.1 after the default moves to 2.14.1, and
  ``hpcstack-doctor`` in it says which stack it is on and that a newer one is the default;
- the new stack's validation passes on the local Slurm (2.3.1's runs in the README's main command);
- the ``localhost-lmod`` site's installs of both take the wheels and the Horovod build from the
  machine's cache that the ``localhost`` installs filled (no download, no compile).

The installs go to the sites' own roots, as an admin's would; the default is put back at the end.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from conftest import BASE_MODULES, hpcstack
from moduletools import require, tool_params

pytestmark = pytest.mark.e2e

OLD, NEW = "pytorch/2.3.1-gpu", "pytorch/2.14.1-gpu"
SITES = {"tcl": "localhost", "lua": "localhost-lmod"}
ROOTS = {"tcl": Path("/opt/hpcstack/software"), "lua": Path("/opt/hpcstack/software-lmod")}
MODULE_ROOTS = {"tcl": Path("/opt/hpcstack/modulefiles"), "lua": Path("/opt/hpcstack/modulefiles-lmod")}


def _install(recipe: str, site: str) -> tuple[str, float]:
    start = time.monotonic()
    proc = hpcstack("install", recipe, "--site", site, timeout=3600)
    took = time.monotonic() - start
    print(f"hpcstack install {recipe} --site {site}: {took:.0f} s\n{proc.stdout[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, took


@pytest.fixture(scope="module")
def both(installed_stack) -> dict:
    """Both stacks for both sites; ``{syntax: {recipe: (install output, seconds)}}``."""
    out = {}
    for syntax, site in SITES.items():
        out[syntax] = {OLD: _install(OLD, site)}
        out[syntax][NEW] = _install(NEW, site)
    return out


def _modulepath(syntax: str) -> str:
    return f"{BASE_MODULES}:{MODULE_ROOTS[syntax]}"


@pytest.mark.parametrize("tool", tool_params())
def test_avail_lists_both_and_the_new_install_left_the_default(tool, both):
    require(tool)
    out, _ = both[tool.syntax][NEW]
    default = hpcstack("module", "default", "pytorch", "--site", SITES[tool.syntax])
    assert default.returncode == 0, default.stderr
    assert OLD.split("/")[1] in default.stdout
    assert "the default of pytorch stays 2.3.1-gpu" in out, out  # and the install said so
    avail = tool.bash("module -t avail pytorch 2>&1", modulepath=_modulepath(tool.syntax)).stdout
    assert re.search(r"^pytorch/2\.3\.1-gpu\b", avail, re.M) and re.search(r"^pytorch/2\.14\.1-gpu\b", avail, re.M), avail
    loaded = tool.bash("module load pytorch && python -c 'import torch; print(\"TORCH\", torch.__version__)'",
                       modulepath=_modulepath(tool.syntax))
    assert "TORCH 2.3.1" in loaded.stdout, loaded.stdout + loaded.stderr


@pytest.mark.parametrize("tool", tool_params())
def test_a_venv_on_the_old_stack_stays_there_when_the_default_moves(tool, both, tmp_path):
    require(tool)
    site, mp = SITES[tool.syntax], _modulepath(tool.syntax)
    venv = tmp_path / "venv"
    made = tool.bash(f"module load {OLD} && python -m venv {venv} && extend-venv-activate {venv}", modulepath=mp)
    assert made.returncode == 0, made.stderr
    run = (f"source {venv}/bin/activate && python -c 'import torch; print(\"TORCH\", torch.__version__)' "
           "&& hpcstack-doctor; echo doctor=$?")
    moved = hpcstack("module", "set-default", NEW, "--site", site)
    assert moved.returncode == 0, moved.stderr
    try:
        new_default = tool.bash("module load pytorch && python -c 'import torch; print(\"TORCH\", torch.__version__)'",
                                modulepath=mp)
        assert "TORCH 2.14.1" in new_default.stdout, new_default.stdout + new_default.stderr
        proc = tool.bash(run, modulepath=mp, timeout=300)
        assert "TORCH 2.3.1" in proc.stdout and "doctor=0" in proc.stdout, proc.stdout + proc.stderr
        assert (f"note: on {OLD}; `module load pytorch` now loads {NEW} (the default, newer): this venv stays "
                f"on {OLD}") in proc.stdout, proc.stdout
    finally:
        back = hpcstack("module", "set-default", OLD, "--site", site)
        assert back.returncode == 0, back.stderr


def test_the_lmod_site_took_wheels_and_horovod_from_the_machine_cache(both):
    """localhost-lmod installed after localhost: the Horovod wheel came from the shared build cache."""
    logs = "\n".join(p.read_text() for p in (ROOTS["lua"] / "pytorch" / "2.3.1-gpu").rglob(".hpcstack/logs/build.log"))
    assert "reusing the wheel built before" in logs, logs[-2000:]
    assert not (ROOTS["lua"] / ".hpcstack" / "cache").exists()  # no cache of its own


def test_the_new_stack_validates_on_the_local_slurm(both):
    proc = hpcstack("validate", NEW, "--site", "localhost", "--json", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["failures"] == [], json.dumps(report, indent=1)[:3000]
    runs = {(r["backend"], r["nodes"]) for r in report["runs"]}
    assert runs == {("ddp", 1), ("ddp", 2)}, runs  # torch.distributed only: no Horovod run
