"""A site's module profiles (``modules.profiles``): modules loaded first, in order, before the
module hierarchy and the base module, wherever the hierarchy is loaded (CINECA Leonardo's
``profile/deeplrn``, https://docs.hpc.cineca.it/hpc/hpc_enviroment.html). The key's schema, the
one load order (``site.modules.preloads``) in a validation job, the modulefile's ``depends_on``,
a Jupyter kernel, a ReFrame check, and the module help naming them as the site's profiles.
Read from dry runs and rendered files: no module tool runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import hpcstack, unit_site
from hpcstack.install.components.modulefile import render_for_prefix
from hpcstack.recipe import load_recipe
from hpcstack.site import ModulesConfig, check_config, load_site

pytestmark = pytest.mark.unit

PROFILES = ["profile/base2", "profile/deeplrn"]
HIERARCHY = ["gcc/12.2.0", "openmpi/4.1.6"]


def made_up_site(tmp_path: Path, **modules) -> Path:
    """localhost (stating its Python: no module tool runs) with ``modules`` changed; returns the file."""
    data = unit_site("localhost", name="profiled", roots=tmp_path)
    data["modules"].update(modules)
    path = tmp_path / "profiled.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def help_lines(site) -> list[str]:
    """The ``module help`` text of pytorch/2.3.1-gpu's Tcl modulefile for ``site``, one line each."""
    text = render_for_prefix(site, load_recipe("pytorch/2.3.1-gpu", site), "/p/pytorch/2.3.1-gpu", "3.11", "tcl")
    return re.findall(r"^    puts stderr \{(.*)\}$", text, flags=re.M)


def module_lines(job: str) -> list[str]:
    return [line.split(" ||")[0] for line in job.splitlines() if line.startswith("module ")]


def test_the_schema_takes_a_list_of_module_names_and_nothing_else():
    data = unit_site("localhost")
    data["modules"]["profiles"] = ["profile/deeplrn"]
    assert check_config(data, "s.yaml") == []
    for bad in ("profile/deeplrn", [""], [42], ["profile deeplrn"]):
        data["modules"]["profiles"] = bad
        problems = check_config(data, "s.yaml")
        assert problems and all("modules.profiles" in line for line in problems), (bad, problems)


def test_preloads_are_the_profiles_then_the_hierarchy():
    modules = ModulesConfig("environment-modules", "tcl", "python/3.11", runtime=["cuda/12.1"],
                            profiles=PROFILES, hierarchy=HIERARCHY)
    assert modules.preloads == [*PROFILES, *HIERARCHY]
    assert modules.stack_modules() == [*PROFILES, *HIERARCHY, "python/3.11", "cuda/12.1"]
    assert ModulesConfig("lmod", "lua", "Python").preloads == []


def test_leonardo_declares_its_profile_and_no_hierarchy():
    modules = load_site("leonardo-booster").modules
    assert modules.profiles == ["profile/deeplrn"] and modules.hierarchy == []
    assert modules.stack_modules()[:2] == ["profile/deeplrn", "python/3.11.6--gcc--8.5.0"]


def test_a_job_loads_the_profiles_then_the_hierarchy_then_the_stack(tmp_path):
    site = made_up_site(tmp_path, profiles=PROFILES, hierarchy=HIERARCHY, use=["/site/mods"])
    proc = hpcstack("validate", "mpi4py/4.1.2", "--site", str(site), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    jobs = proc.stdout.split("# =====")[1:]
    assert jobs, proc.stdout
    for job in jobs:
        assert module_lines(job) == [
            "module use /site/mods", *(f"module load {m}" for m in PROFILES + HIERARCHY),
            f"module use {tmp_path / 'modulefiles'}", "module load mpi4py/4.1.2"], job
        assert "(modules.profiles, modules.hierarchy)" in job


def test_the_install_loads_them_first_and_the_modulefile_depends_on_them_first(tmp_path):
    site = made_up_site(tmp_path, profiles=PROFILES, hierarchy=HIERARCHY)
    proc = hpcstack("install", "mpi4py/4.1.2", "--site", str(site), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    loads = [line for line in proc.stdout.splitlines() if line.startswith("module load ")]
    base = load_site(str(site)).modules.base
    assert loads[:len(PROFILES + HIERARCHY) + 1] == [f"module load {m}" for m in [*PROFILES, *HIERARCHY, base]], loads
    module = proc.stdout.split("# --- step module:")[1]
    deps = re.findall(r"^depends-on (\S+)$", module, flags=re.M) or re.findall(r'^depends_on\("([^"]+)"\)$', module,
                                                                              flags=re.M)
    assert deps[:len(PROFILES + HIERARCHY) + 1] == [*PROFILES, *HIERARCHY, base], deps


def test_the_module_help_names_the_profiles_as_the_sites_profiles(tmp_path):
    site = load_site(str(made_up_site(tmp_path, profiles=PROFILES, hierarchy=HIERARCHY)))
    lines = help_lines(site)
    at = next(i for i, line in enumerate(lines) if line.startswith("    module load profile/"))
    assert lines[at] == "    module load profile/base2 profile/deeplrn   # profiled's profiles (modules.profiles), in order"
    assert lines[at + 1] == ("    module load gcc/12.2.0 openmpi/4.1.6   # profiled's module hierarchy "
                             "(modules.hierarchy), in order")
    assert lines[at + 2].startswith(f"    module use {site.module_root}   # after them")
    assert lines[at + 3] == "    module load pytorch/2.3.1-gpu"


def test_the_module_help_of_profiles_alone_says_nothing_of_a_hierarchy():
    lines = help_lines(load_site("leonardo-booster"))
    assert "    module load profile/deeplrn   # leonardo-booster's profiles (modules.profiles), in order" in lines
    assert not any("modules.hierarchy" in line or "Stages" in line for line in lines), lines


def test_kernel_and_reframe_check_load_the_profiles_first(tmp_path):
    from hpcstack.export.reframe import reframe_files
    from hpcstack.modules import kernel, writer

    path = made_up_site(tmp_path, profiles=PROFILES, hierarchy=HIERARCHY, use=["/site/mods"])
    site = load_site(str(path), module_root=str(tmp_path / "modulefiles"))
    recipe = load_recipe("mpi4py/4.1.2", site)
    stub = Path(writer.modulefile_path(str(tmp_path / "modulefiles"), recipe.name, recipe.version, site.modules.syntax))
    stub.parent.mkdir(parents=True)
    stub.write_text("#%Module\n")
    launcher = kernel.make_kernel(site, recipe, prefix=str(tmp_path / "jupyter"), command="x").launcher
    want = ["module use /site/mods", *(f"module load {m}" for m in PROFILES + HIERARCHY),
            f"module use {tmp_path / 'modulefiles'}", "module load mpi4py/4.1.2"]
    assert module_lines(launcher) == want, launcher
    settings = reframe_files(site, recipe)["settings.py"]
    at = [settings.index(f"'{line}'") for line in want[:-1]]
    assert at == sorted(at), settings
