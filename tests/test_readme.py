"""The README's every command works as written.

The README's fenced code blocks are read with a CommonMark parser (markdown-it-py, which
``rich``, a dependency of hpcstack, requires). Then:

* every ``bash`` block parses (``bash -n``);
* every ``hpcstack`` command line parses with hpcstack's own argument parser, and those that
  change nothing (``--help``, ``list``, ``--dry-run``, ``export`` into a directory of the
  test's own) run with the installed ``hpcstack`` and exit 0;
* every ``scripts/…`` it names exists, is executable and parses (``bash -n``);
* every relative link points at a file of the repository, and a ``#fragment`` at one of its
  headings.

What needs root or the installed stack (``scripts/quickstart-localhost``, ``scripts/run-tests``,
``module load …``) is parsed only: the test command runs the first itself, and the end-to-end
tests run the stack.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO

pytestmark = pytest.mark.unit

README = REPO / "README.md"


def _blocks() -> list[tuple[str, str, int]]:
    """``(info string, text, first line)`` of each fenced code block of the README."""
    from markdown_it import MarkdownIt
    tokens = MarkdownIt("commonmark").parse(README.read_text())
    return [(t.info.strip(), t.content, t.map[0] + 2) for t in tokens if t.type == "fence"]


def _commands(kind: str = "bash") -> list[tuple[str, int]]:
    """The command lines of the README's ``kind`` blocks (comments removed, continuation lines
    joined), each with its line number."""
    out = []
    for info, text, first in _blocks():
        if info != kind:
            continue
        pending, start = "", first
        for offset, line in enumerate(text.splitlines()):
            if not pending:
                start = first + offset
            pending += line
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
                continue
            words = shlex.split(pending, comments=True)
            if words:
                out.append((shlex.join(words), start))
            pending = ""
    return out


def _hpcstack_lines() -> list[tuple[list[str], int]]:
    return [(shlex.split(c)[1:], n) for c, n in _commands() if c.startswith("hpcstack ")]


def _changes_nothing(args: list[str]) -> bool:
    """A command that changes nothing and needs nothing an earlier line of its block made (a path
    under ``~/``: the admin block builds its ``~/site-repo`` first; tests/test_readme_admin.py runs
    that block whole)."""
    if any(a.startswith("~/") for a in args):
        return False
    return (args[:1] in (["--help"], ["list"], ["export"]) or "--dry-run" in args or "--help" in args)


def test_the_readme_has_the_two_commands_and_stays_short():
    commands = [c for c, _ in _commands()]
    assert "scripts/quickstart-localhost" in commands
    assert "scripts/run-tests" in commands
    assert len(README.read_text().splitlines()) <= 200


def test_every_bash_block_parses():
    blocks = [(text, n) for info, text, n in _blocks() if info == "bash"]
    assert blocks
    for text, line in blocks:
        proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert proc.returncode == 0, f"README line {line}: {proc.stderr}"


def test_every_hpcstack_command_parses_with_hpcstack_s_parser():
    from hpcstack.cli import build_parser
    lines = _hpcstack_lines()
    assert lines
    for args, line in lines:
        if "--help" in args:
            continue            # argparse prints and exits 0; it runs below
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"README line {line}: hpcstack {shlex.join(args)}: exit {exc.code}")


@pytest.mark.parametrize("args, line", [pytest.param(a, n, id=" ".join(a[:2]))
                                        for a, n in _hpcstack_lines() if _changes_nothing(a)])
def test_the_commands_that_change_nothing_run(args, line, tmp_path):
    # the README's working directory is a clone's; `-o FILE` lands in this test's directory
    env = {k: v for k, v in os.environ.items() if k != "HPCSTACK_PATH"}
    proc = subprocess.run([*HPCSTACK, *args], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert proc.returncode == 0, f"README line {line}: hpcstack {shlex.join(args)}:\n{proc.stderr[-3000:]}"
    assert proc.stdout or any(tmp_path.iterdir()), f"README line {line}: printed and wrote nothing"


def test_every_script_named_exists_runs_and_parses():
    scripts = sorted({w for c, _ in _commands() for w in shlex.split(c) if w.startswith("scripts/")})
    assert "scripts/quickstart-localhost" in scripts
    for name in scripts:
        path = REPO / name
        assert path.is_file() and os.access(path, os.X_OK), name
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"


def _anchors(markdown: str) -> set[str]:
    """The fragments of a page's headings, as MkDocs' toc extension (and GitHub) make them."""
    out = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, re.M):
        words = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
        out.add(re.sub(r"[\s-]+", "-", words))
    return out


def test_every_relative_link_points_at_a_file_and_heading():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, fragment = link.partition("#")
        target = REPO / path if path else README
        assert target.is_file(), link
        if fragment:
            assert fragment in _anchors(target.read_text()), link
