"""The install machinery end to end with a tiny recipe: real venv, real pip, real patch and build,
real Environment Modules. Exercises resume, up-to-date re-runs, changed inputs and bad downloads.
(Kills, locks, full disks and bad input: test_faults.py.)"""

from __future__ import annotations

import grp
import json
import os
import re
from pathlib import Path

import pytest
import yaml

from conftest import REPO, bash_modules, hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration

#: The shared software group of the site the shared install uses (Debian's ``users``).
GROUP = "users"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, localhost_ready):
    """A tiny recipe installed once into a temporary prefix and module root, for the localhost
    site with a ``permissions`` section (group ``users``, group-writable)."""
    root = tmp_path_factory.mktemp("tiny")
    sdist = make_sdist(root)
    recipe = write_tiny_recipe(root / "recipes", sdist)
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site["permissions"] = {"group": GROUP, "mode": "g+rwX,g+s"}
    (root / "localhost.yaml").write_text(yaml.safe_dump(site))
    args = ["--site", str(root / "localhost.yaml"), "--prefix", str(root / "sw"), "--module-root", str(root / "mf")]
    proc = hpcstack("install", str(recipe), *args)
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "recipe": recipe, "args": args, "first": proc,
            "prefix": root / "sw" / "tiny" / "1.0", "modulefile": root / "mf" / "tiny" / "1.0"}


def test_install_runs_every_step_and_writes_the_modulefile(tiny):
    for step in ("fetch", "venv", "wheels", "patch", "build", "install", "sanitycheck", "permissions",
                 "module"):
        assert f"] {step}:" in tiny["first"].stderr
    text = tiny["modulefile"].read_text()
    assert "depends-on python" in text
    assert str(tiny["prefix"]) in text
    recorded = json.loads((tiny["prefix"] / ".hpcstack" / "steps" / "module.json").read_text())
    assert len(recorded["hash"]) == 64


def test_module_load_gives_the_patched_package_and_unload_restores(tiny):
    script = f"""
    module use {tiny['root'] / 'mf'}
    before=$(env | grep -v -E '^(_|OLDPWD|SHLVL)=' | sort)
    module load tiny/1.0
    python -c 'import tinypkg, six; assert tinypkg.PATCHED; print(tinypkg.__file__)'
    command -v extend-venv-activate
    module unload tiny/1.0
    module unload python
    after=$(env | grep -v -E '^(_|OLDPWD|SHLVL)=' | sort)
    diff <(echo "$before" | grep -v -E '^(LOADEDMODULES|_LMFILES_|__MODULES_)') \
         <(echo "$after" | grep -v -E '^(LOADEDMODULES|_LMFILES_|__MODULES_)') && echo SAME
    """
    proc = bash_modules(script)
    assert proc.returncode == 0, proc.stderr
    assert f"{os.path.realpath(tiny['prefix'])}/venv/" in proc.stdout  # the build's real path
    assert str(tiny["prefix"] / "bin" / "extend-venv-activate") in proc.stdout
    assert "SAME" in proc.stdout, proc.stdout


def test_the_stacks_python_has_its_site_packages_once_by_real_path_after_the_stdlib(tiny):
    """The venv's ``00-hpcstack-paths.pth`` gives the stack's python a plain
    venv's ``sys.path`` (site-packages after the standard library, once) with the build's real
    path in it, under the module (whose PYTHONPATH names the stable prefix, first) and without."""
    probe = "python -c 'import sys, json; print(\"SYSPATH\", json.dumps(sys.path))'"
    proc = bash_modules(f"""
    module use {tiny['root'] / 'mf'}
    module load tiny/1.0 || exit 1
    echo "PYTHONPATH=$PYTHONPATH"
    {probe}
    module unload tiny/1.0
    {tiny['prefix']}/venv/bin/{probe}
    """)
    assert proc.returncode == 0, proc.stderr
    assert f"PYTHONPATH={tiny['prefix']}/venv/lib/python" in proc.stdout  # the module names the stable path
    runs = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("SYSPATH ")]
    assert len(runs) == 2
    for path in runs:
        site_packages = [p for p in path if p.endswith("site-packages")]
        assert len(site_packages) == 1, path
        assert site_packages[0].startswith(os.path.realpath(tiny["prefix"]) + "/venv/lib/python"), path
        assert os.path.realpath(site_packages[0]) == site_packages[0]
        assert not any(p.startswith(f"{tiny['prefix']}/") for p in path), path  # no entry through the link
        stdlib = next(i for i, p in enumerate(path) if re.search(r"/lib/python3\.\d+$", p))
        assert path.index(site_packages[0]) > stdlib, path


def test_rerun_is_up_to_date_and_changes_nothing(tiny):
    mf = tiny["modulefile"]
    before = (mf.stat().st_mtime_ns, mf.read_text())
    proc = hpcstack("install", str(tiny["recipe"]), *tiny["args"])
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stderr
    assert (mf.stat().st_mtime_ns, mf.read_text()) == before


def test_nothing_world_writable_everything_readable_and_the_group_may_write(tiny):
    gid = grp.getgrnam(GROUP).gr_gid
    build = Path(os.path.realpath(tiny["prefix"]))
    assert build.parent == tiny["root"] / "sw" / "tiny"  # the build beside the prefix
    paths = [build, *build.rglob("*"), build.parent]
    for path in paths:
        if path.is_symlink():
            continue
        st = path.stat()
        assert not st.st_mode & 0o002, path
        assert st.st_mode & 0o004, path
        assert st.st_gid == gid, path
        # hpcstack's own records written after the step (step records, timings) are 0644 in the
        # group's setgid directories; everything the stack is made of is group-writable
        if ".hpcstack" not in path.parts:
            assert st.st_mode & 0o020, path
        if path.is_dir():
            assert st.st_mode & 0o001 and st.st_mode & 0o2000, path  # searchable; setgid keeps the group


def test_tampered_sdist_is_refused_and_nothing_is_published(localhost_ready, tmp_path):
    sdist = make_sdist(tmp_path)
    recipe = write_tiny_recipe(tmp_path / "recipes", sdist)
    with open(sdist, "ab") as f:
        f.write(b"tampered")
    proc = hpcstack("install", str(recipe), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 1
    assert "sha256 mismatch" in proc.stderr and "expected" in proc.stderr and "got" in proc.stderr
    assert "step fetch" in proc.stderr
    assert not (tmp_path / "mf" / "tiny" / "1.0").exists()
    assert not os.path.lexists(tmp_path / "sw" / "tiny" / "1.0")  # nothing published


def test_tampered_patch_is_refused(localhost_ready, tmp_path):
    sdist = make_sdist(tmp_path)
    recipe = write_tiny_recipe(tmp_path / "recipes", sdist)
    patch = recipe.parent / "patches" / "tiny.patch"
    patch.write_text(patch.read_text() + "\n")
    proc = hpcstack("install", str(recipe), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"), "--stop-after", "patch")
    assert proc.returncode == 1
    assert "sha256 mismatch" in proc.stderr and str(patch) in proc.stderr
    assert "step patch" in proc.stderr
    assert not os.path.lexists(tmp_path / "sw" / "tiny" / "1.0")  # nothing published


def test_stop_after_leaves_no_modulefile_and_resume_finishes(localhost_ready, tmp_path):
    sdist = make_sdist(tmp_path)
    recipe = write_tiny_recipe(tmp_path / "recipes", sdist)
    args = ["--site", "localhost", "--prefix", str(tmp_path / "sw"), "--module-root", str(tmp_path / "mf")]
    proc = hpcstack("install", str(recipe), *args, "--stop-after", "wheels")
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "mf" / "tiny" / "1.0").exists()
    proc = hpcstack("install", str(recipe), *args)
    assert proc.returncode == 0, proc.stderr
    assert "wheels: done before, skipped" in proc.stderr
    assert (tmp_path / "mf" / "tiny" / "1.0").is_file()


def test_changed_patch_on_a_published_stack_builds_anew_beside_it(tiny):
    """Last of the tests on the shared install: it edits the recipe's patch in place.

    A published venv cannot be changed without touching what users run, so a changed input
    of a published stack means a new build in a new stage prefix (the wheels come from the
    cache); the switch happens in the module step. (A changed input of an unfinished build
    redoes that step and the later ones only: test_faults.py.)"""
    import hashlib

    old_build = os.path.realpath(tiny["prefix"])
    patch = Path(tiny["recipe"]).parent / "patches" / "tiny.patch"
    old_sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    patch.write_text(patch.read_text().replace("PATCHED = True", "PATCHED = 2"))
    new_sha = hashlib.sha256(patch.read_bytes()).hexdigest()
    recipe = Path(tiny["recipe"])
    recipe.write_text(recipe.read_text().replace(old_sha, new_sha))
    proc = hpcstack("install", str(recipe), *tiny["args"])
    assert proc.returncode == 0, proc.stderr
    assert "new build" in proc.stderr and "done before, skipped" not in proc.stderr
    new_build = os.path.realpath(tiny["prefix"])
    assert new_build != old_build and os.path.isdir(old_build)  # the one it replaced is kept
    check = bash_modules(f"module use {tiny['root'] / 'mf'}; module load tiny/1.0; "
                         "python -c 'import tinypkg; print(tinypkg.PATCHED)'")
    assert check.stdout.strip() == "2", check.stderr
