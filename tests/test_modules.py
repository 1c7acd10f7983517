"""Modulefiles: golden files for both syntaxes, and the Tcl one under the real Environment Modules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import REPO, bash_modules
from hpcstack.modules import ModuleContext, modulefile_path, render_modulefile, root_variable

GOLDEN = REPO / "tests" / "golden"


def context(prefix: str = "/sw/pytorch/2.3.1-gpu") -> ModuleContext:
    return ModuleContext(
        name="pytorch", version="2.3.1-gpu", whatis="PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1",
        help_lines=["pytorch/2.3.1-gpu: PyTorch with Horovod", "", "  extend-venv-activate ~/myvenv"],
        prefix=prefix, root_variable=root_variable("pytorch"), depends_on=["python/3.12.1-gpu"],
        path_prepend=[f"{prefix}/bin", f"{prefix}/venv/bin"],
        pythonpath_prepend=[f"{prefix}/venv/lib/python3.12/site-packages"],
        recipe="pytorch/2.3.1-gpu", site="cirrus", hpcstack_version="0.1.0")


@pytest.mark.parametrize("syntax", ["tcl", "lua"])
def test_rendered_modulefile_matches_golden(syntax):
    text = render_modulefile(context(), syntax)
    golden = GOLDEN / f"pytorch-2.3.1-gpu.{syntax}"
    if os.environ.get("HPCSTACK_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("syntax, needles", [
    ("tcl", ["depends-on python/3.12.1-gpu", "conflict pytorch", "module-whatis", "proc ModulesHelp",
             "setenv HPCSTACK_PYTORCH_ROOT $root", "prepend-path PYTHONPATH"]),
    ("lua", ['depends_on("python/3.12.1-gpu")', 'family("pytorch")', "whatis(", "help([[",
             'setenv("HPCSTACK_PYTORCH_ROOT", root)', 'prepend_path("PYTHONPATH"']),
])
def test_both_syntaxes_have_the_same_blocks(syntax, needles):
    text = render_modulefile(context(), syntax)
    for needle in needles:
        assert needle in text


def test_layout_follows_the_projection():
    assert modulefile_path("/m", "pytorch", "2.3.1-gpu", "tcl") == "/m/pytorch/2.3.1-gpu"
    assert modulefile_path("/m", "pytorch", "2.3.1-gpu", "lua") == "/m/pytorch/2.3.1-gpu.lua"


def test_paths_with_spaces_and_dollars_are_quoted(tmp_path):
    text = render_modulefile(context("/odd path/$x [y]"), "tcl")
    assert 'set root "/odd path/\\$x \\[y\\]"' in text or "set root {/odd path/$x [y]}" in text


@pytest.fixture
def stack(tmp_path, localhost_ready):
    """A fake stack prefix with a python package, and its Tcl modulefile depending on the base python."""
    prefix = tmp_path / "sw" / "pytorch" / "2.3.1-gpu"
    (prefix / "bin").mkdir(parents=True)
    sp = prefix / "venv" / "lib" / "python3.11" / "site-packages"
    sp.mkdir(parents=True)
    (sp / "fakestack.py").write_text("WHERE = 'stack'\n")
    ctx = context(str(prefix))
    ctx = ModuleContext(**{**ctx.__dict__, "depends_on": ["python"], "pythonpath_prepend": [str(sp)]})
    mf = Path(modulefile_path(str(tmp_path / "mf"), "pytorch", "2.3.1-gpu", "tcl"))
    mf.parent.mkdir(parents=True)
    mf.write_text(render_modulefile(ctx, "tcl"))
    return {"prefix": prefix, "root": tmp_path / "mf"}


def test_tcl_module_loads_its_dependency_and_unloads_cleanly(stack):
    proc = bash_modules(f"""
    module use /opt/hpcstack/base-modulefiles {stack['root']}
    before=$(env | sort | grep -v -E '^(_|SHLVL|OLDPWD|LOADEDMODULES|_LMFILES_|__MODULES_[A-Z_]*)=')
    module load pytorch/2.3.1-gpu || exit 1
    echo "LOADED=$LOADEDMODULES"
    echo "ROOT=$HPCSTACK_PYTORCH_ROOT"
    echo "PYTHONPATH=$PYTHONPATH"
    python3 -c 'import fakestack; print("IMPORT", fakestack.WHERE)'
    module unload pytorch/2.3.1-gpu
    after=$(env | sort | grep -v -E '^(_|SHLVL|OLDPWD|LOADEDMODULES|_LMFILES_|__MODULES_[A-Z_]*)=')
    echo "AFTER_LOADED=$LOADEDMODULES"
    [ "$before" = "$after" ] && echo RESTORED || diff <(echo "$before") <(echo "$after")
    """)
    out = proc.stdout
    assert "python/" in out and "pytorch/2.3.1-gpu" in out, proc.stderr
    assert f"ROOT={stack['prefix']}" in out
    assert "PYTHONPATH=" + str(stack["prefix"]) in out and not out.split("PYTHONPATH=")[1].split("\n")[0].endswith(":")
    assert "IMPORT stack" in out
    assert "RESTORED" in out, out
    assert "AFTER_LOADED=\n" in out  # depends-on unloaded python again


def test_tcl_module_help_and_whatis(stack):
    proc = bash_modules(f"module use {stack['root']}; module help pytorch/2.3.1-gpu; module whatis pytorch/2.3.1-gpu")
    assert "extend-venv-activate ~/myvenv" in proc.stderr + proc.stdout
    assert "PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1" in proc.stderr + proc.stdout
