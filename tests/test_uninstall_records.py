"""``uninstall`` removes only what the stack's own records say it published.

A stack installed under one prefix, then ``uninstall --prefix WRONG --force`` with the same
module root: the modulefile and ``.version`` belong to the stack that lives elsewhere (no build
under WRONG records them) and stay; the stack stays loadable.
"""

from __future__ import annotations

import os

import pytest

from conftest import bash_modules, hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration


def test_uninstall_with_a_wrong_prefix_leaves_the_other_stacks_modulefile(localhost_ready, tmp_path):
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    mf = tmp_path / "mf"
    res = hpcstack("install", str(recipe), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                   "--module-root", str(mf))
    assert res.returncode == 0, res.stderr
    modulefile, dot_version = mf / "tiny" / "1.0", mf / "tiny" / ".version"
    dot_version.write_text('#%Module\nset ModulesVersion "1.0"\n')
    (tmp_path / "wrong").mkdir()
    res = hpcstack("uninstall", "tiny/1.0", "--site", "localhost", "--prefix", str(tmp_path / "wrong"),
                   "--module-root", str(mf), "--force")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "tiny/1.0 is not installed" in res.stderr
    assert f"the modulefile {modulefile} is another stack's" in res.stderr and "kept" in res.stderr
    assert modulefile.is_file() and dot_version.is_file()
    proc = bash_modules(f"module use {mf}; module load tiny && python -c 'import tinypkg; print(tinypkg.PATCHED)'")
    assert proc.stdout.strip() == "True", proc.stderr
    # with its own prefix the stack goes, modulefile and default marker with it
    res = hpcstack("uninstall", "tiny/1.0", "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                   "--module-root", str(mf), "--force")
    assert res.returncode == 0, res.stderr
    assert not modulefile.exists() and not dot_version.exists()
    assert not os.path.lexists(tmp_path / "sw" / "tiny" / "1.0")
