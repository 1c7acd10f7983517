"""``hpcstack module deprecate`` / ``undeprecate`` under both real module tools: one line at load,
a mark in ``module avail``, refused after the date with why and what instead; the undo restores the
files; ``hpcstack uninstall`` refuses a deprecated stack before its date."""

from __future__ import annotations

import datetime as dt

import pytest

from conftest import hpcstack
from moduletools import require, tool_params

pytestmark = pytest.mark.integration

SITES = {"tcl": "localhost", "lua": "localhost-lmod"}
LINE = "foo/1.0 is deprecated; use foo/2.0 instead; it cannot be loaded from {after} on (see the news)"


def _root(tmp_path, tool):
    root = tmp_path / "mf"
    tool.write_module(root, "foo/1.0", setenv={"FOO": "1"})
    tool.write_module(root, "foo/2.0", setenv={"FOO": "2"})
    return root


def _deprecate(tool, root, after):
    return hpcstack("module", "deprecate", "foo/1.0", "--site", SITES[tool.syntax], "--module-root", str(root),
                    "--replacement", "foo/2.0", "--after", after, "--message", "see the news")


@pytest.mark.parametrize("tool", tool_params())
def test_load_says_one_line_and_avail_marks_it(tool, tmp_path):
    require(tool)
    root = _root(tmp_path, tool)
    after = (dt.date.today() + dt.timedelta(days=365)).isoformat()
    made = _deprecate(tool, root, after)
    assert made.returncode == 0, made.stderr
    assert f"users now see: {LINE.format(after=after)}" in made.stdout
    proc = tool.bash("module load foo/1.0 && echo FOO=$FOO", modulepath=str(root))
    assert proc.returncode == 0 and "FOO=1" in proc.stdout, proc.stderr
    # the one line (Lmod prints LmodMessage's text as it is; Environment Modules the puts)
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert lines == [LINE.format(after=after)], proc.stderr
    avail = tool.bash("module avail foo 2>&1", modulepath=str(root)).stdout
    assert ("foo/1.0 <deprecated>" if tool.short == "modules" else "foo/1.0 (O)") in avail, avail


@pytest.mark.parametrize("tool", tool_params())
def test_after_the_date_it_cannot_be_loaded_and_says_why_and_what_instead(tool, tmp_path):
    require(tool)
    root = _root(tmp_path, tool)
    made = _deprecate(tool, root, "2020-01-01")
    assert made.returncode == 0, made.stderr
    proc = tool.bash("module load foo/1.0; echo FOO=${FOO:-unset}", modulepath=str(root))
    assert "FOO=unset" in proc.stdout
    # (Lmod wraps its error message at the terminal's width: compare with the white space folded)
    assert "foo/1.0 was retired on 2020-01-01: use foo/2.0 instead (see the news)" in " ".join(proc.stderr.split())
    assert tool.bash("module load foo/2.0 && echo FOO=$FOO", modulepath=str(root)).stdout.strip() == "FOO=2"


@pytest.mark.parametrize("tool", tool_params())
def test_undeprecate_restores_the_files(tool, tmp_path):
    require(tool)
    root = _root(tmp_path, tool)
    module = root / "foo" / ("1.0.lua" if tool.syntax == "lua" else "1.0")
    before = module.read_text()
    assert _deprecate(tool, root, "2020-01-01").returncode == 0
    assert module.read_text() != before
    undo = hpcstack("module", "undeprecate", "foo/1.0", "--site", SITES[tool.syntax], "--module-root", str(root))
    assert undo.returncode == 0, undo.stderr
    assert module.read_text().rstrip("\n") == before.rstrip("\n")
    proc = tool.bash("module load foo/1.0 && echo FOO=$FOO", modulepath=str(root))
    assert proc.stdout.strip() == "FOO=1" and "deprecated" not in proc.stderr


def test_uninstall_of_a_deprecated_stack_before_its_date_asks_for_force(tmp_path):
    from moduletools import ENVIRONMENT_MODULES

    root = _root(tmp_path, ENVIRONMENT_MODULES)
    after = (dt.date.today() + dt.timedelta(days=30)).isoformat()
    assert _deprecate(ENVIRONMENT_MODULES, root, after).returncode == 0
    proc = hpcstack("uninstall", "foo/1.0", "--site", "localhost", "--module-root", str(root),
                    "--prefix", str(tmp_path / "sw"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"error: refusing to uninstall foo/1.0: it is deprecated and its users were "
                                   f"told it stays until {after}; wait, or use --force")


@pytest.mark.parametrize("args, message", [
    (["--after", "2027-13-01"], "error: --after: '2027-13-01': expected a date YYYY-MM-DD, e.g. 2027-06-30"),
    (["--replacement", "foo"], "error: --replacement: 'foo': expected NAME/VERSION, e.g. pytorch/2.3.1-gpu "
                               "(letters, digits and ._+-)"),
    # (every argument of every command is checked for control characters first: hpcstack.cli)
    (["--message", "two\nlines"], "error: argument 9 'two\\nlines': holds a control character (newline, NUL, ...)"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, message):
    from moduletools import ENVIRONMENT_MODULES

    root = _root(tmp_path, ENVIRONMENT_MODULES)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    proc = hpcstack("module", "deprecate", "foo/1.0", "--site", "localhost", "--module-root", str(root), *args)
    assert proc.returncode == 2 and proc.stderr.strip() == message
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
