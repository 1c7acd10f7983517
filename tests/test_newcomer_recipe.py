"""scipy/1.17.1-mpi, the recipe of tests/data/newcomer-repo: a framework added from the docs alone
(docs/recipes.md, "A new recipe, step by step") with 0 lines under hpcstack/; planned as written.

Its real install and ``hpcstack validate --local --ranks 2`` (PASS, and FAIL for its ``corrupted``
workload) are the steps of that section; here: the façade alone, the locked wheels with their
hashes, the install plan (mpi4py built with the site's wrapper, its mpi.cfg after the install
step, the validation program installed) and the validation file as ``validate --dry-run`` reads it.
"""

from __future__ import annotations

import ast
import os

import pytest

from conftest import REPO, hpcstack, site_overlay
from hpcstack.recipe import load_recipe
from hpcstack.recipe_api import BUILD, INSTALL, PipWheels, Run, SourceBuild, Validation
from hpcstack.install.resolve import resolve
from hpcstack.site import load_site

pytestmark = pytest.mark.unit

NEWCOMER_REPO = REPO / "tests" / "data" / "newcomer-repo"
RECIPE_DIR = NEWCOMER_REPO / "recipes" / "scipy"
NAME = "scipy/1.17.1-mpi"


def test_the_recipe_imports_from_the_facade_alone():
    tree = ast.parse((RECIPE_DIR / "1.17.1-mpi.py").read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {m for m in modules if m.split(".")[0] == "hpcstack"} == {"hpcstack.recipe_api"}


def test_the_lock_pins_every_wheel_with_its_hash():
    lock = (RECIPE_DIR / "1.17.1-mpi.pypi.lock").read_text()
    pins = [line.split()[0] for line in lock.splitlines() if "==" in line and not line.startswith((" ", "#"))]
    assert "scipy==1.17.1" in pins and any(p.startswith("cython==") for p in pins), pins
    blocks = lock.split("\n")
    assert lock.count("--hash=sha256:") >= len(pins), "a pin without its hash"
    assert not any(line.startswith("mpi4py") for line in blocks), "mpi4py is built, not locked"


def test_the_install_plan_builds_mpi4py_with_the_sites_wrapper(tmp_path):
    site = load_site("localhost", install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"))
    recipe = load_recipe(str(RECIPE_DIR / "1.17.1-mpi.py"), site)
    assert recipe.component(PipWheels).min_python == "3.11"
    build = recipe.component(SourceBuild)
    assert type(build).__name__ == "Mpi4pyBuild" and build.package == "mpi4py"  # recipe_api's, not a copy
    assert build.build_env(_ctx(recipe, site))["MPICC"] == site.toolchain.cc
    plan = resolve(recipe, site, python_version="3.11", stage_prefix=str(tmp_path / "sw" / "scipy" / ".test"))
    steps = {s.name: s.actions for s in plan.steps}
    assert steps[BUILD], "no build step"
    cfg = os.path.join(plan.stage_prefix, "venv", "lib", "python3.11", "site-packages", "mpi4py", "mpi.cfg")
    assert [a for a in steps[INSTALL] if isinstance(a, Run) and a.argv[-1:] == (cfg,)], "no mpi.cfg"
    script = "\n".join(a.to_bash() for a in steps[INSTALL])
    assert "scipy-validate" in script, "the validation program is not installed"
    assert isinstance(recipe.component(Validation), Validation)


def _ctx(recipe, site):
    from hpcstack.recipe_api import PlanContext
    return PlanContext(site=site, recipe=recipe, prefix="/p", stage_dir="", cache_dir=site.cache_dir,
                       python_version="3.11", jobs=1, modulefile="/m")


def test_the_install_dry_run_prints_the_whole_plan(tmp_path):
    overlay = site_overlay(tmp_path / "repo", roots=tmp_path / "roots")  # localhost stating its Python: no module loads
    proc = hpcstack("install", NAME, "--repo", str(overlay), "--repo", str(NEWCOMER_REPO), "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "mpi4py-4.1.2.tar.gz" in proc.stdout and "1.17.1-mpi.pypi.lock" in proc.stdout
    assert str(tmp_path / "mf" / "scipy" / "1.17.1-mpi") in proc.stdout
    assert not (tmp_path / "sw").exists(), "a dry run wrote the prefix"


@pytest.mark.parametrize("workload, corrupt", [(None, False), ("corrupted", True)])
def test_the_local_validation_plan_and_its_negative_control(tmp_path, workload, corrupt):
    args = ["validate", NAME, "--repo", str(NEWCOMER_REPO), "--prefix", str(tmp_path / "sw"),
            "--module-root", str(tmp_path / "mf"), "--local", "--ranks", "2", "--dry-run"]
    proc = hpcstack(*args, *(["--workload", workload] if workload else []))
    assert proc.returncode == 0, proc.stderr
    run = proc.stdout.strip().splitlines()[-1].split()
    assert run[:3] == ["mpirun", "-np", "2"], proc.stdout
    program = str(tmp_path / "sw" / "scipy" / "1.17.1-mpi" / "bin" / "scipy-validate")
    assert run[run.index(program) + 1:] == ["--n", "2000", "--tolerance", "1e-06", *(["--corrupt"] if corrupt else []),
                                           "--output", "records.jsonl"], run
