"""Two versions of one stack side by side, under both real module tools: ``module avail`` lists
both; the first install is the default and a later one does not move it unless asked (``install
--default``, ``hpcstack module set-default``); a venv extended against the old version keeps
loading it after the default moves, and ``hpcstack-doctor`` in that venv says which stack it is on
and that a newer one is the default (``hpcstack doctor`` here: the tiny stack has no
``hpcstack-doctor`` of its own, the same code). The tiny recipe at versions 1.0 and 2.0 (the same steps as
the PyTorch recipes); the two PyTorch stacks themselves are in tests/test_e2e_two_pytorch.py."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from conftest import BASE_MODULES, HPCSTACK, REPO, hpcstack, make_sdist, write_tiny_recipe
from moduletools import require, tool_params
from hpcstack import doctor
from hpcstack.modules.syntax import SYNTAXES

pytestmark = pytest.mark.integration

SITES = {"tcl": "localhost", "lua": "localhost-lmod"}


@pytest.mark.unit
def test_the_doctors_default_patterns_are_the_module_syntaxes():
    """The standalone doctor reads the default files with its own copy of the patterns."""
    assert {cls.default_file: cls.default_pattern.pattern for cls in SYNTAXES.values()} == \
        {name: p.pattern for name, p in doctor.DEFAULT_FILES.items()}


@pytest.mark.unit
def test_default_version_is_the_default_file_else_the_highest(tmp_path):
    d = tmp_path / "pytorch"
    d.mkdir()
    for v in ("2.3.1-gpu", "2.14.1-gpu"):
        (d / v).write_text("#%Module1.0\n")
    assert doctor.default_version(d) == ("2.14.1-gpu", "the highest version")  # 14 > 3, as numbers
    (d / ".version").write_text('#%Module1.0\nset ModulesVersion "2.3.1-gpu"\n')
    assert doctor.default_version(d) == ("2.3.1-gpu", "the default")


def _recipes(tmp_path: Path) -> Path:
    """``tiny/1.0`` and ``tiny/2.0`` (the same stack under a second version) in one recipe dir."""
    one = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    text = one.read_text().replace('Recipe("tiny", "1.0"', 'Recipe("tiny", "2.0"').replace(
        'PipWheels("1.0")', 'PipWheels("2.0")')
    assert 'Recipe("tiny", "2.0"' in text
    (one.parent / "2.0.py").write_text(text)
    (one.parent / "2.0.pypi.lock").write_text((one.parent / "1.0.pypi.lock").read_text())
    return one.parent.parent


def _site(tmp_path: Path, name: str) -> Path:
    data = yaml.safe_load((REPO / "site-configs" / f"{name}.yaml").read_text())
    data.update(install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"),
                cache_dir=str(tmp_path / "cache"))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("tool", tool_params())
def test_two_versions_side_by_side(tool, localhost_ready, tmp_path):
    require(tool)
    recipes, site = _recipes(tmp_path), _site(tmp_path, SITES[tool.syntax])
    mf = f"{BASE_MODULES}:{tmp_path / 'mf'}"  # the base python/X.Y module, and the stacks'

    def install(version, *extra):
        proc = hpcstack("install", str(recipes / "tiny" / f"{version}.py"), "--site", str(site), *extra)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    install("1.0")
    out = install("2.0")
    # the second install leaves the default and says how to move it
    assert f"the default of tiny stays 1.0 (`module load tiny`); make this one the default: " \
           f"hpcstack module set-default tiny/2.0 --site {site}" in out, out
    avail = tool.bash("module -t avail tiny 2>&1", modulepath=mf).stdout
    assert re.search(r"^tiny/1\.0\b", avail, re.M) and re.search(r"^tiny/2\.0\b", avail, re.M), avail

    def loaded(script=""):
        proc = tool.bash(f"{script}\nmodule load tiny && echo ROOT=$HPCSTACK_TINY_ROOT", modulepath=mf)
        m = re.search(r"^ROOT=(.*)$", proc.stdout, re.M)
        assert m, proc.stdout + proc.stderr
        return Path(m.group(1)).name

    assert loaded() == "1.0"

    # a venv extended against 1.0, then the default moves to 2.0 (install --default)
    venv = tmp_path / "venv"
    made = tool.bash(f"module load tiny/1.0 && python3 -m venv {venv} && extend-venv-activate {venv}",
                     modulepath=mf)
    assert made.returncode == 0, made.stderr
    doctor_run = f"source {venv}/bin/activate && {shlex.join(HPCSTACK)} doctor; echo doctor=$?; echo ROOT=$HPCSTACK_TINY_ROOT"
    before = tool.bash(doctor_run, modulepath=mf)
    assert "doctor=0" in before.stdout, before.stdout + before.stderr
    assert "note: on tiny/1.0, which `module load tiny` loads (the default)" in before.stdout, before.stdout

    out = install("2.0", "--default")
    assert "default of tiny is now 2.0 (was 1.0)" in out and \
           f"switch back: hpcstack module set-default tiny/1.0 --site {site}" in out, out
    assert loaded() == "2.0"
    after = tool.bash(doctor_run, modulepath=mf)
    assert "doctor=0" in after.stdout, after.stdout + after.stderr
    assert re.search(r"^ROOT=.*/tiny/1\.0$", after.stdout, re.M), after.stdout  # the venv keeps 1.0
    assert "note: on tiny/1.0; `module load tiny` now loads tiny/2.0 (the default, newer): this venv " \
           "stays on tiny/1.0" in after.stdout, after.stdout

    # and back, with the command the install printed
    back = hpcstack("module", "set-default", "tiny/1.0", "--site", str(site))
    assert back.returncode == 0, back.stderr
    assert loaded() == "1.0"
