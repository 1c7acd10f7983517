#!/usr/bin/env python3
"""Check that every figure in docs/benchmarks.md has the command that printed it.

The rule (written at the top of docs/benchmarks.md, "How the figures are made"): every **figure
block** -- a Markdown table, or a fenced block of a script's output (any fence whose language is
not ``bash``, ``sh``, ``shell``, ``console``, ``python`` or ``markdown``) -- has above it, after the previous figure block
and after the section's heading, a paragraph that starts with ``Command:`` and holds

- the command line in backticks, naming a script of ``benchmarks/`` that exists (more than one
  command may be named);
- ``Raw:`` where the output is: a link to a file under ``docs/benchmarks/raw/``, or
  ``reproducible`` (counts that the command prints again), or ``not kept`` (runs recorded before
  the rule);
- ``Ran:`` when and where (date, machine, load; ``GPU only`` for figures only a GPU gives).

A table that holds no measurement (a description) says ``Command: none`` and may then hold no
number with a unit. Every raw file is linked from the page, and a verdict line in a raw file
(``[HOLDS]`` or ``[MISSED]``) shows its rounds as ``n N`` with N at least 5.

Usage: ``python3 benchmarks/check_doc.py [DOC]``; prints one line per problem, exit status 2 when
there are any, 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "benchmarks.md"
RAW = "benchmarks/raw"
#: fences that hold commands or code, not output
CODE_FENCES = {"bash", "sh", "console", "python", "shell", "markdown"}
#: scripts of benchmarks/ that print no figure, so cannot be a figure's command
NOT_COMMANDS = {"benchmarks/stats.py", "benchmarks/check_doc.py"}
MIN_ROUNDS = 5
#: a measured figure in a table: a number with a unit
MEASURED = re.compile(r"\d(?:[.,]\d+)?\s?(?:s|ms|µs|x|%|GB|MB|GiB|MiB|img/s|min)(?![A-Za-z])")
SCRIPT = re.compile(r"\bbenchmarks/[\w./-]+\.(?:py|sh)\b")
LINK = re.compile(r"\]\((benchmarks/raw/[^)\s]+)\)")


def _check_command(para: str, line: int, block: list[str], doc: Path) -> list[str]:
    """Problems of one ``Command:`` paragraph for the figure block it stands above."""
    where = f"{doc.name}:{line}"
    if re.match(r"Command:\s*none\b", para):
        measured = [m.group(0) for row in block for m in [MEASURED.search(row)] if m]
        if measured:
            return [f"{where}: 'Command: none' above a block with measured figures ({measured[0]!r})"]
        return []
    problems = []
    commands = re.findall(r"`([^`]+)`", para)
    scripts = [s for c in commands for s in SCRIPT.findall(c) if s not in NOT_COMMANDS]
    if not scripts:
        problems.append(f"{where}: the Command: line names no benchmarks/ script in backticks")
    for script in scripts:
        if not (REPO / script).is_file():
            problems.append(f"{where}: {script} does not exist")
    for field in ("Raw:", "Ran:"):
        if field not in para:
            problems.append(f"{where}: the Command: paragraph has no '{field}'")
    for link in LINK.findall(para):
        if not (doc.parent / link).is_file():
            problems.append(f"{where}: raw output {link} does not exist")
    return problems


def check(doc: Path = DOC) -> list[str]:
    """Every problem of ``doc`` against the rule, one line each (empty when it follows it).

    :param doc: the Markdown page (its raw files under ``<its directory>/benchmarks/raw``).
    """
    lines = doc.read_text().splitlines()
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # (line, text) of the last Command: paragraph
    fence: str | None = None
    fence_start = 0
    fence_body: list[str] = []
    i = 0
    while i < len(lines):
        text = lines[i]
        stripped = text.strip()
        if fence is not None:
            if stripped.startswith("```"):
                if fence not in CODE_FENCES:
                    problems += _figure(pending, fence_start, fence_body, doc, "output block")
                    pending = None
                fence = None
            else:
                fence_body.append(text)
            i += 1
            continue
        if stripped.startswith("```"):
            fence, fence_start, fence_body = stripped[3:].strip().split(" ")[0].lower(), i + 1, []
        elif stripped.startswith("#"):
            pending = None
        elif stripped.startswith("Command:"):
            para = [stripped]
            while i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].lstrip().startswith(("|", "```")):
                i += 1
                para.append(lines[i].strip())
            pending = (i + 1 - len(para) + 1, " ".join(para))
        elif stripped.startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            start = i + 1
            block = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                block.append(lines[i])
                i += 1
            problems += _figure(pending, start, block, doc, "table")
            pending = None
            continue
        i += 1
    if fence is not None:
        problems.append(f"{doc.name}:{fence_start}: a fence that never closes")
    problems += _check_raw(doc, "\n".join(lines))
    return problems


def _figure(pending, start: int, block: list[str], doc: Path, kind: str) -> list[str]:
    if pending is None:
        return [f"{doc.name}:{start}: {kind} without a 'Command:' paragraph above it (after the "
                "previous figure block and the section's heading)"]
    return _check_command(pending[1], start, block, doc)


def _check_raw(doc: Path, text: str) -> list[str]:
    """Every raw file linked from the page; its verdicts rest on enough rounds."""
    problems = []
    raw_dir = doc.parent / RAW
    for path in sorted(raw_dir.glob("*")) if raw_dir.is_dir() else []:
        rel = f"{RAW}/{path.name}"
        if f"]({rel})" not in text:
            problems.append(f"{rel}: not linked from {doc.name}")
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "[HOLDS]" in line or "[MISSED]" in line:
                rounds = re.search(r"\bn (\d+)\)", line)
                if not rounds or int(rounds.group(1)) < MIN_ROUNDS:
                    problems.append(f"{rel}:{n}: a verdict without the spread of at least {MIN_ROUNDS} "
                                    "rounds ('n N)' missing or N too small)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Print the problems of the page given (default docs/benchmarks.md); 2 when there are any."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("doc", nargs="?", default=str(DOC), help="the page (default: %(default)s)")
    args = parser.parse_args(argv)
    doc = Path(args.doc)
    if not doc.is_file():
        print(f"check_doc: {doc}: no such file")
        return 2
    problems = check(doc)
    for p in problems:
        print(p)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
