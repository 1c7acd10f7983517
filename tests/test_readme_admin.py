"""The "An admin without root" block (docs/admin/own-repos.md, linked from the README) runs as
written: the example repository's recipe ``tiny/1.0`` (examples/site-repo, shipped as package
data), a site ``mysite`` made from the built-in localhost one, an install into ``~/software`` and
``~/modulefiles`` and ``module load tiny/1.0``, with a temporary HOME. The block's first two lines
(installing the wheel) are left out: the ``hpcstack`` of this test environment stands for it
(tests/test_packaging.py installs the wheel)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO, bash_modules

pytestmark = pytest.mark.integration


def admin_block() -> list[str]:
    """The commands of the admin block (docs/admin/own-repos.md), continuation lines joined, the
    wheel install (``uv tool install`` and its ``# or:`` line) left out."""
    text = (REPO / "docs" / "admin" / "own-repos.md").read_text()
    section = text.split("## An admin without root", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    joined = block.replace("\\\n", " ")
    return [line for line in joined.splitlines()
            if line.strip() and not line.startswith(("uv tool install", "# or:"))]


def test_the_block_installs_the_example_recipe_and_its_module_loads(tmp_path, localhost_ready):
    commands = admin_block()
    assert any("hpcstack install tiny/1.0 --site mysite --repo ~/site-repo" in c for c in commands)
    home = tmp_path / "home"
    home.mkdir()
    script = "set -e\n" + "\n".join(commands) + "\npython -c 'import six; print(\"six\", six.__version__, six.__file__)'\n"
    env = {"HOME": str(home), "PATH": f"{Path(HPCSTACK[0]).parent}:{os.environ['PATH']}",
           "HPCSTACK_PATH": ""}
    proc = bash_modules(f"cd {home}\n{script}", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    listing = proc.stdout
    assert re.search(r"tiny/1\.0 +--repo " + re.escape(str(home / "site-repo")), listing), listing
    assert re.search(r"mysite +--repo ", listing), listing
    found = re.search(r"^six (\S+) (\S+)$", proc.stdout, re.M)
    assert found and found.group(1) == "1.17.0", proc.stdout[-2000:]           # the lock's pin
    assert Path(found.group(2)).resolve().is_relative_to((home / "software" / "tiny").resolve())
    assert (home / "modulefiles" / "tiny" / "1.0").is_file()
    assert "#!/bin/bash" in proc.stdout      # the pytorch dry run for cirrus printed its plan
