"""What the ``hpcstack`` process imports: jsonschema checks every site config, but none of the
packages it would import to check ``format`` keywords (hpcstack's schemas have none; they cost
from 60 ms to 2.4 s of every command: :data:`hpcstack.cli.FORMAT_MODULES`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpcstack.cli import FORMAT_MODULES

pytestmark = pytest.mark.unit

PROBE = """
import json, sys
from hpcstack.cli import FORMAT_MODULES, main
rc = main(["install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run", "--json"])
loaded = [m for m in FORMAT_MODULES + ("arrow", "lark") if sys.modules.get(m) is not None]
print(json.dumps({"rc": rc, "loaded": loaded, "jsonschema": "jsonschema" in sys.modules}), file=sys.stderr)
"""


def test_a_command_validates_its_site_without_the_format_checkers():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["rc"] == 0 and json.loads(proc.stdout)["steps"], proc.stderr[-2000:]
    assert report["jsonschema"], "the site config was not checked by jsonschema"
    assert report["loaded"] == [], report


def test_the_site_schema_has_no_format_keyword():
    """The validator is made without a format checker, and no schema asks for a format."""
    from hpcstack import site
    from hpcstack.install.components import validation as workload

    for schema in (site.SCHEMA, workload.SCHEMA):
        assert '"format"' not in json.dumps(schema)
    assert "rfc3987_syntax" in FORMAT_MODULES


def _plan(pythonpath: str | None, prefix) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    proc = subprocess.run([sys.executable, "-m", "hpcstack", "install", "pytorch/2.3.1-gpu", "--site", "cirrus",
                           "--prefix", str(prefix), "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=prefix.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_copy_of_hpcstack_elsewhere_finds_the_same_builds(tmp_path):
    """Step hashes and the build id do not depend on where hpcstack itself is installed (its
    data directory enters by the files' sha256): hpcstack reinstalled in another venv, or run
    from a checkout, finds the stacks up to date instead of building each anew."""
    import shutil
    from pathlib import Path

    import hpcstack

    copy = tmp_path / "elsewhere"
    shutil.copytree(Path(hpcstack.__file__).parent, copy / "hpcstack", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    here, there = _plan(None, tmp_path / "sw"), _plan(str(copy), tmp_path / "sw")
    assert str(copy) in json.dumps(there) and str(copy) not in json.dumps(here)  # the copy ran
    assert there["build_id"] == here["build_id"]
    assert [(s["name"], s["hash"]) for s in there["steps"]] == [(s["name"], s["hash"]) for s in here["steps"]]
