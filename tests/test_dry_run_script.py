"""The dry run *is* the install: its whole script, run with bash on a fresh root, publishes the same
stack as ``hpcstack install`` does there (docs/admin/install.md: the two "cannot disagree").

The tiny recipe (with its SBOM: ``StackManifest``) goes through every step, first with
``install``, then, the root moved away, with the script into the same root. Compared: the build's
id, the SBOM (all of it but its serial number and time), every file of the published build with
its sha256 (the byte-compiled caches, the logs, uv's cache stamps and the record of the run that
only ``install`` keeps aside), the modulefile, and the distributions the
stack's venv holds (name and version, as ``pip freeze`` gives them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import NEUTRAL_DIR, hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration

#: Paths under a build that differ by nature between two runs (what ran when, how long it took,
#: byte code whose header records the source's mtime).
VARIES = ("/.hpcstack/logs/", "/.hpcstack/steps/", "/__pycache__/", "/.hpcstack/timings.json", ".pyc")

#: The record of the run that ``hpcstack install`` keeps beside the stack and the script cannot
#: keep about itself (hpcstack.install.provenance): the recipe, site and plan as they ran.
RUN_RECORD = (".hpcstack/install.sh", ".hpcstack/plan.json", ".hpcstack/provenance.json", ".hpcstack/site.json",
              ".hpcstack/site.yaml", ".hpcstack/recipe/")

#: The SBOM, compared as JSON without its serial number and time (:func:`snapshot`).
SBOM = ".hpcstack/sbom.cdx.json"


def run_record(rel: str) -> bool:
    return rel in RUN_RECORD or rel.startswith(".hpcstack/recipe/")


#: ``pip freeze`` without pip (the stack's venv has none): what the venv's Python sees installed.
FREEZE = ("import importlib.metadata as m; "
          "print('\\n'.join(sorted(f\"{d.metadata['Name'].lower()}=={d.version}\" for d in m.distributions())))")


def published(root: Path) -> tuple[Path, Path]:
    """(the build the prefix link points at, the modulefile) under ``root``."""
    prefix = root / "sw" / "tiny" / "1.0"
    assert prefix.is_symlink(), f"{prefix} not published"
    return Path(os.path.realpath(prefix)), root / "mf" / "tiny" / "1.0"


def content(path: str) -> bytes:
    """A file's bytes, without what differs by nature: uv's cache stamp (a time) and its line in
    the package's RECORD."""
    data = Path(path).read_bytes()
    if path.endswith(".dist-info/RECORD"):
        data = b"".join(l for l in data.splitlines(keepends=True) if b"/uv_cache.json," not in l)
    return data


def snapshot(root: Path) -> dict:
    """What ``root`` publishes: every file and link of the published build (relative path ->
    sha256, or the link's target), the build's name, the modulefile, the SBOM and
    the venv's distributions."""
    build, modulefile = published(root)
    files = {}
    for dirpath, dirnames, filenames in os.walk(build):
        for name in [*filenames, *(d for d in dirnames if os.path.islink(os.path.join(dirpath, d)))]:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, build)
            if any(v in "/" + rel for v in VARIES) or rel.endswith("/uv_cache.json") or rel == SBOM:
                continue
            files[rel] = ("-> " + os.readlink(path) if os.path.islink(path)
                          else hashlib.sha256(content(path)).hexdigest())
    sbom = json.loads((build / ".hpcstack" / "sbom.cdx.json").read_text())
    sbom.pop("serialNumber")  # a new one each time it is written, by the standard
    sbom["metadata"].pop("timestamp")
    freeze = subprocess.run([str(build / "venv" / "bin" / "python"), "-c", FREEZE],
                            capture_output=True, text=True, check=True).stdout
    return {"build": build.name, "files": files, "modulefile": modulefile.read_text(), "sbom": sbom,
            "freeze": freeze}


def test_the_dry_run_script_publishes_the_same_stack_as_install(localhost_ready, tmp_path):
    """``install`` into a fresh root; the root moved away; the dry run's script, run with bash in
    a login shell as an admin would, into the same fresh root: the same build, byte for byte."""
    recipes = tmp_path / "recipes"
    recipe = write_tiny_recipe(recipes, make_sdist(tmp_path))
    text = recipe.read_text().replace("Imports, Modulefile,", "Imports, Modulefile, StackManifest,")
    text = re.sub(r"\n( +)StackTools\(\),", r"\n\1StackManifest(),\n\1StackTools(),", text)
    assert "StackManifest()," in text
    recipe.write_text(text)
    root = tmp_path / "root"
    args = [str(recipe), "--site", "localhost", "--prefix", str(root / "sw"), "--module-root", str(root / "mf")]

    proc = hpcstack("install", *args)
    assert proc.returncode == 0, proc.stderr
    real = snapshot(root)
    root.rename(tmp_path / "installed")
    plan = hpcstack("install", *args, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    script = tmp_path / "plan.sh"
    script.write_text(plan.stdout)
    # as an admin runs it: a login shell, where the module tool is set up
    ran = subprocess.run(["bash", "-l", str(script)], capture_output=True, text=True, cwd=NEUTRAL_DIR, timeout=900,
                         env={k: v for k, v in os.environ.items() if k != "BASH_ENV"})
    assert ran.returncode == 0, ran.stderr[-3000:]
    scripted = snapshot(root)

    assert scripted["build"] == real["build"]  # the same build id: the same inputs
    mine, theirs = real["files"], scripted["files"]
    assert {r for r in RUN_RECORD if "." in r.rsplit("/", 1)[-1]} <= set(mine), sorted(mine)[:10]
    assert not [rel for rel in theirs if run_record(rel)]
    mine = {rel: digest for rel, digest in mine.items() if not run_record(rel)}
    only = "only after install: " + " ".join(sorted(set(mine) - set(theirs))) + "; only after the script: " + \
        " ".join(sorted(set(theirs) - set(mine)))
    assert sorted(mine) == sorted(theirs), only
    differ = [rel for rel in mine if mine[rel] != theirs[rel]]
    assert differ == [], differ[:20]
    assert any(rel.endswith(".dist-info/RECORD") for rel in mine) and "bin/extend-venv-activate" in mine
    assert real["sbom"]["components"] and scripted["sbom"] == real["sbom"]
    assert scripted["modulefile"] == real["modulefile"]
    assert scripted["freeze"] == real["freeze"] and "tinypkg==1.0" in real["freeze"]
