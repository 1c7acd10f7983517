"""What a stack's module says and checks, read from the rendered modulefiles (no module tool):
the whatis lines and ``module help`` sections, the exact ``depends-on`` of an install, the site's
launcher variables (``modules.env``), one module root per module tool on one machine, and the
Jupyter kernel's launcher and site. The same behaviours under the real tools, as a user meets
them: tests/test_user_side.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.install.components.modulefile import render_for_prefix
from hpcstack.install.resolve import loaded_modules, resolve
from hpcstack.recipe import load_recipe
from hpcstack.site import load_site, check_config

pytestmark = pytest.mark.unit

PREFIX = "/p/pytorch/2.3.1-gpu"


def render(site_name: str, syntax: str) -> str:
    site = load_site(site_name)
    return render_for_prefix(site, load_recipe("pytorch/2.3.1-gpu", site), PREFIX, "3.11", syntax)


@pytest.mark.parametrize("syntax", ["tcl", "lua"])
def test_whatis_names_the_key_packages_their_versions_and_keywords(syntax):
    text = render("localhost", syntax)
    for word in ("Packages: torch 2.3.1, torchvision 0.18.1", "scikit-learn 1.5.1", "ipykernel 6.29.5",
                 "horovod 0.28.1", "Keywords: pytorch, torch,", "deep learning"):
        assert word in text, word
    whatis = [line for line in text.splitlines() if line.startswith(("module-whatis", "whatis("))]
    assert len(whatis) == 5, whatis
    assert not any("pip 2" in line or "setuptools" in line for line in whatis)


def test_help_says_what_is_inside_what_changes_and_how_to_launch_on_the_site():
    text = render("localhost", "tcl")
    for needle in (f"{PREFIX}/.hpcstack/pip-freeze.txt", "the CUDA build of torch runs on the CPUs here",
                   "PYTHONNOUSERSITE=1: packages in your user site", "PIP_CONSTRAINT,",
                   "SLURM_MPI_TYPE=pmix", "SLURM_EXPORT_ENV", "#SBATCH --partition=debug --nodes=2",
                   "srun python train.py", "torchrun --nnodes=$SLURM_NNODES", "horovodrun -np",
                   f"Examples: {PREFIX}/examples (digits)", "hpcstack kernel install pytorch/2.3.1-gpu --user"):
        assert needle in text, needle
    cirrus = render("cirrus", "tcl")
    assert "runs on the CPUs" not in cirrus and "Hardware: GPUs, CUDA 12." in cirrus
    assert "--gres=gpu:4" in cirrus or "--gpus-per-node=4" in cirrus, cirrus


@pytest.mark.parametrize("syntax, needle", [
    ("tcl", "setenv SLURM_MPI_TYPE pmix"), ("lua", 'setenv("SLURM_MPI_TYPE", "pmix")')])
def test_the_sites_launcher_variables_are_set_by_the_module(syntax, needle):
    assert needle in render("localhost", syntax)
    assert "SLURM_MPI_TYPE" not in render("cirrus", syntax)


def test_a_bad_variable_name_in_modules_env_is_one_line(tmp_path):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["modules"]["env"] = {"BAD NAME": "x", "OK": "1"}
    problems = check_config(data, "s.yaml")
    assert len(problems) == 1 and problems[0].startswith("s.yaml: modules.env"), problems


def test_depends_on_is_the_module_the_build_loaded():
    site = load_site("localhost")
    env = {"LOADEDMODULES": "gcc/12:python/3.11"}
    assert loaded_modules(site, env) == ("python/3.11",)
    assert loaded_modules(site, {}) == ("python",)
    plan = resolve(load_recipe("pytorch/2.3.1-gpu", site), site, python_version="3.11", depends_on=("python/3.11",))
    text = next(a.content for s in plan.steps for a in s.actions
                if getattr(a, "path", "") == plan.modulefile)
    assert "depends-on python/3.11\n" in text and "depends-on python\n" not in text


def test_the_module_refuses_a_missing_stack_and_warns_in_an_unextended_venv():
    tcl, lua = render("localhost", "tcl"), render("localhost", "lua")
    assert f"![file exists {{{PREFIX}/venv/pyvenv.cfg}}]" in tcl and "reportError" in tcl
    assert f'not isFile("{PREFIX}/venv/pyvenv.cfg")' in lua and "LmodError(" in lua
    for text in (tcl, lua):
        assert "is missing or unreadable" in text and "is not extended for this module" in text
        assert "# >>> hpcstack pytorch/2.3.1-gpu >>>" in text


def test_one_module_root_per_module_tool_on_one_machine():
    """localhost (Environment Modules) and localhost-lmod (Lmod): one name means one stack."""
    a, b = load_site("localhost"), load_site("localhost-lmod")
    assert a.module_root != b.module_root and a.install_root != b.install_root


def test_the_stack_installs_a_pip_that_says_where_packages_go_and_no_kernelspec_of_its_own():
    site = load_site("localhost")
    plan = resolve(load_recipe("pytorch/2.3.1-gpu", site), site, python_version="3.11")
    script = "\n".join(step.to_bash() for step in plan.steps)
    assert "/bin/pip\n" in script and "ln -sfn pip" in script and "takes no packages" in script
    assert "venv/share/jupyter/kernels" in script
    assert "/examples/digits" in script


def _fake_installed(tmp_path: Path) -> tuple[Path, Path]:
    """A stack prefix with the provenance an install of ``localhost`` records, and its modulefile."""
    prefix = tmp_path / "sw" / "pytorch" / "2.3.1-gpu"
    (prefix / ".hpcstack").mkdir(parents=True)
    (prefix / "venv" / "bin").mkdir(parents=True)
    mroot = tmp_path / "mf"
    (mroot / "pytorch").mkdir(parents=True)
    (mroot / "pytorch" / "2.3.1-gpu").write_text("#%Module\n")
    (prefix / ".hpcstack" / "provenance.json").write_text(json.dumps(
        {"site": {"name": "localhost", "file": str(REPO / "site-configs" / "localhost.yaml")}}))
    (prefix / ".hpcstack" / "site.json").write_text(json.dumps(
        {"install_root": str(tmp_path / "sw"), "module_root": str(mroot)}))
    return prefix, mroot


def test_a_kernel_needs_no_site_with_the_module_loaded_and_runs_the_stacks_python_by_path(tmp_path):
    prefix, _ = _fake_installed(tmp_path)
    jp = tmp_path / "jp"
    proc = hpcstack("kernel", "install", "pytorch/2.3.1-gpu", "--prefix", str(jp),
                    env={"HPCSTACK_PYTORCH_ROOT": str(prefix)})
    assert proc.returncode == 0, proc.stderr
    assert "--site" not in proc.stdout, proc.stdout
    kdir = jp / "share" / "jupyter" / "kernels" / "pytorch-2.3.1-gpu"
    launcher = (kdir / "launch").read_text()
    assert f"exec {prefix}/venv/bin/python -m ipykernel_launcher" in launcher, launcher
    assert launcher.index("unset VIRTUAL_ENV") < launcher.index("module load pytorch/2.3.1-gpu")
    assert f"module use {tmp_path / 'mf'}" in launcher
    assert json.loads((kdir / "kernel.json").read_text())["metadata"]["hpcstack"]["site"] == "localhost"


@pytest.mark.parametrize("site_name, hierarchy, what", [
    ("juwels-booster", "Stages/2024 GCC/12.3.0 ParaStationMPI/5.9.2-1", "module hierarchy (modules.hierarchy)"),
    ("leonardo-booster", "profile/deeplrn", "profiles (modules.profiles)")])
def test_help_describes_the_sites_own_hierarchy(site_name, hierarchy, what):
    """The launch lines name this site's modules.hierarchy or modules.profiles, and no other
    site's tool: a CINECA profile is not described as a JSC Stage (which sets MODULEPATH anew)."""
    text = render(site_name, "tcl")
    site = load_site(site_name)
    assert f"module load {hierarchy}   # {site_name}'s {what}, in order" in text
    assert f"module use {site.module_root}   # after them" in text
    if "Stages" not in hierarchy:
        assert "Stages" not in text and "reset" not in text, text
    lines = text.splitlines()      # in order: the hierarchy, the module root, the stack
    load = next(i for i, line in enumerate(lines) if f"    module load {hierarchy}   #" in line)
    assert "    module use " in lines[load + 1] and "    module load pytorch/2.3.1-gpu" in lines[load + 2]


def test_help_of_a_site_without_hierarchy_has_no_hierarchy_lines():
    text = render("cirrus", "tcl")
    assert "modules.hierarchy" not in text and "modules.profiles" not in text
    assert "module use " not in text.split("How to launch", 1)[1]
