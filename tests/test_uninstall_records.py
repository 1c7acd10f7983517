"""``uninstall`` removes only what the stack's own records say it published.

A stack installed under one prefix, then ``uninstall --prefix WRONG --force`` with the same
module root: the modulefile and ``.version`` belong to the stack that lives elsewhere (no build
under WRONG records them) and stay; the stack stays loadable.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def one_error(proc) -> str:
    """The refusal: exit status 2, one ``error:`` line (returned), no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return errors[0]


def test_a_directory_at_the_prefix_that_no_record_names_is_refused(tmp_path):
    """``uninstall`` does not remove ``<prefix>/<name>/<version>`` because it is there."""
    keep = tmp_path / "sw" / "tiny" / "1.0" / "data.txt"
    keep.parent.mkdir(parents=True)
    keep.write_text("not hpcstack's\n")
    proc = hpcstack("uninstall", "tiny/1.0", "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"), "--force")
    line = one_error(proc)
    assert f"{keep.parent} holds no record of hpcstack's" in line
    assert keep.read_text() == "not hpcstack's\n"
    # nor a link there that points where no record says hpcstack published
    elsewhere = tmp_path / "elsewhere" / "1.0"
    elsewhere.mkdir(parents=True)
    (elsewhere / "data.txt").write_text("x")
    keep.unlink()
    keep.parent.rmdir()
    os.symlink(elsewhere, keep.parent)
    line = one_error(hpcstack("uninstall", "tiny/1.0", "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                              "--module-root", str(tmp_path / "mf"), "--force"))
    assert f"{keep.parent} -> {elsewhere}: no record of hpcstack's says it published that" in line
    assert (elsewhere / "data.txt").is_file() and os.path.islink(keep.parent)


def test_a_moved_install_root_is_refused_and_an_unrecorded_build_is_kept(localhost_ready, tmp_path):
    """The records name the paths: an install root renamed since is refused as a whole (its
    records say where the stack was published); back in place, the stack goes, and a build
    directory that no record names stays, named in a note."""
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    sw, mf = tmp_path / "sw", tmp_path / "mf"
    args = ["--site", "localhost", "--module-root", str(mf)]
    res = hpcstack("install", str(recipe), "--prefix", str(sw), *args)
    assert res.returncode == 0, res.stderr
    build = Path(os.path.realpath(sw / "tiny" / "1.0"))
    os.rename(sw, tmp_path / "moved")
    line = one_error(hpcstack("uninstall", "tiny/1.0", "--prefix", str(tmp_path / "moved"), *args, "--force"))
    assert f"its record says it is a build of {str(sw / 'tiny' / '1.0')!r}" in line
    assert (tmp_path / "moved" / "tiny" / build.name / "venv").is_dir() and (mf / "tiny" / "1.0").is_file()
    os.rename(tmp_path / "moved", sw)
    stray = sw / "tiny" / ".1.0-0123456789ab"
    (stray / "kept.txt").parent.mkdir()
    (stray / "kept.txt").write_text("no record\n")
    res = hpcstack("uninstall", "tiny/1.0", "--prefix", str(sw), *args, "--force")
    assert res.returncode == 0, res.stderr
    assert f"note: kept {stray} (no record of hpcstack's names it)" in res.stderr
    assert not build.exists() and not os.path.lexists(sw / "tiny" / "1.0") and not (mf / "tiny" / "1.0").exists()
    assert (stray / "kept.txt").is_file()
    assert (sw / ".hpcstack" / "state" / "tiny-1.0.json").is_file()  # the stack's record stays with what it kept


def test_an_uninstall_cut_short_is_finished_by_the_next(localhost_ready, tmp_path):
    """A build renamed aside but not yet removed (``.1.0.trash-<id>-<pid>``, record inside)
    is recognised by its record and removed by the next uninstall; one whose record was
    forged to name another place is refused."""
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    sw = tmp_path / "sw"
    args = ["--site", "localhost", "--prefix", str(sw), "--module-root", str(tmp_path / "mf")]
    assert hpcstack("install", str(recipe), *args).returncode == 0
    build = Path(os.path.realpath(sw / "tiny" / "1.0"))
    build_id = build.name.rsplit("-", 1)[-1]
    (sw / "tiny" / "1.0").unlink()
    trash = sw / "tiny" / f".1.0.trash-{build_id}-4242"
    os.rename(build, trash)
    record = trash / ".hpcstack" / "provenance.json"
    good = record.read_text()
    record.write_text(good.replace(str(build), str(tmp_path / "elsewhere")))
    line = one_error(hpcstack("uninstall", "tiny/1.0", *args, "--force"))
    assert f"{trash}: its record says it was built at" in line and trash.is_dir()
    record.write_text(good)
    res = hpcstack("uninstall", "tiny/1.0", *args, "--force")
    assert res.returncode == 0, res.stderr
    assert not trash.exists() and not (sw / "tiny").exists()
