#!/usr/bin/env python3
"""Check that every figure in docs/benchmarks.md has the command that printed it.

The rule (written at the top of docs/benchmarks.md, "How the figures are made"):

- every **figure block** -- a Markdown table, or a fenced block of a script's output (any fence
  whose language is not ``bash``, ``sh``, ``shell``, ``console``, ``python`` or ``markdown``:
  :data:`CODE_FENCES`) -- has above it, after the previous figure block and after
  the section's heading, a paragraph that starts with ``Command:``;
- every **figure in prose** -- a number with a unit (s, ms, µs, min, h, GB, MB, KB, GiB, MiB,
  KiB, img/s, an ``x`` ratio, %) outside a table, a fence, an inline code span and a heading --
  sits in a paragraph that holds ``Command:`` or ``Raw: not kept (…)``, or in a section (the text
  between two headings) that has such a paragraph. A bound written with ``≤``, ``≥``, ``<`` or
  ``>`` before it (a target, "≤ 1.25x") is not a measurement and needs none;
- every such **provenance paragraph** holds

  - after ``Command:``, the command line in backticks, naming a script of ``benchmarks/`` that
    exists (more than one command may be named); a paragraph that starts with ``Raw:`` names no
    command and must then say ``not kept (why)``: figures that nothing reproduces any more;
  - ``Raw:`` where the output is: a link to a file that exists under ``docs/benchmarks/raw/``, or
    ``reproducible`` (counts that the command prints again), or ``not kept (why)`` with the
    reason in the parentheses (runs recorded before the rule, machines that are gone);
  - ``Ran:`` when and where: a date (``YYYY-MM-DD``) and a machine (a word such as ``VM``,
    ``machine``, ``node``, ``host``, ``cores``, ``GPU``); ``GPU only`` for figures only a GPU
    gives.

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
#: fences that hold commands or code, not a script's output
CODE_FENCES = {"bash", "sh", "console", "python", "shell", "markdown"}
#: scripts of benchmarks/ that print no figure, so cannot be a figure's command
NOT_COMMANDS = {"benchmarks/stats.py", "benchmarks/check_doc.py"}
MIN_ROUNDS = 5
#: a measured figure: a number with a unit (``1.25x``, ``5.79 GB``, ``1,203 img/s``, ``82.6 %``)
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?"
                      r"(?:ms|µs|s|min|minutes?|seconds?|hours?|h|GB|MB|KB|kB|TB|GiB|MiB|KiB|img/s|x|%)"
                      r"(?![\w/])")
#: what before a figure makes it a bound (a target), not a measurement
BOUND = re.compile(r"[≤≥<>]\s*$")
SCRIPT = re.compile(r"\bbenchmarks/[\w./-]+\.(?:py|sh)\b")
LINK = re.compile(r"\]\((benchmarks/raw/[^)\s]+)\)")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
MACHINE = re.compile(r"\b(?:VM|machines?|nodes?|host|server|cluster|cores?|GPUs?|container|"
                     r"laptop|workstation|H100|A100|V100)\b", re.IGNORECASE)
NOT_KEPT = re.compile(r"\bnot kept\s*\(([^)]*[A-Za-z][^)]*)\)")
#: words that say a figure was not printed by a script
BY_HAND = re.compile(r"\bby hand\b|\bno script kept\b", re.IGNORECASE)


class Block:
    """One block of the page: ``heading``, ``fence`` (with its language), ``table`` or ``para``.

    :param kind: which of the four.
    :param line: the 1-based line of its first line.
    :param lines: its lines (a fence's without the fence lines).
    :param section: how many headings came before it (the section it belongs to).
    :param lang: a fence's language, lower case.
    """

    def __init__(self, kind: str, line: int, lines: list[str] | None = None, section: int = 0,
                 lang: str = ""):
        self.kind, self.line, self.lines, self.section, self.lang = kind, line, lines or [], section, lang

    @property
    def text(self) -> str:
        return " ".join(line.strip() for line in self.lines)


def _blocks(lines: list[str]) -> tuple[list[Block], list[str]]:
    """The page as blocks, and the problems of its structure (a fence that never closes)."""
    blocks: list[Block] = []
    section = 0
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped:
            i += 1
        elif stripped.startswith("```"):
            block = Block("fence", i + 1, [], section, stripped[3:].strip().split(" ")[0].lower())
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.lines.append(lines[i])
                i += 1
            if i == len(lines):
                return blocks, [f"{block.line}: a fence that never closes"]
            blocks.append(block)
            i += 1
        elif stripped.startswith("#"):
            section += 1
            blocks.append(Block("heading", i + 1, [lines[i]], section))
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            block = Block("table", i + 1, [], section)
            while i < len(lines) and lines[i].strip().startswith("|"):
                block.lines.append(lines[i])
                i += 1
            blocks.append(block)
        else:
            block = Block("para", i + 1, [], section)
            while (i < len(lines) and lines[i].strip() and not lines[i].strip().startswith(("```", "#"))
                   and not (lines[i].strip().startswith("|") and i + 1 < len(lines)
                            and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]))):
                block.lines.append(lines[i])
                i += 1
            blocks.append(block)
    return blocks, []


def _field(para: str, name: str) -> str | None:
    """The text of ``name`` (``Raw:``, ``Ran:``) in a provenance paragraph, up to the next field."""
    at = para.find(name)
    if at < 0:
        return None
    rest = para[at + len(name):]
    ends = [rest.find(f" · {other}") for other in ("Command:", "Raw:", "Ran:") if other != name]
    ends = [e for e in ends if e >= 0]
    return rest[:min(ends)] if ends else rest


def _check_provenance(para: str, where: str, doc: Path) -> list[str]:
    """Problems of the provenance fields of one paragraph (from its ``Command:`` or ``Raw:`` on)."""
    problems = []
    if para.startswith("Command:"):
        commands = re.findall(r"`([^`]+)`", para.split(" · Raw:")[0])
        scripts = [s for c in commands for s in SCRIPT.findall(c) if s not in NOT_COMMANDS]
        if not scripts:
            problems.append(f"{where}: the Command: line names no benchmarks/ script in backticks")
        for script in scripts:
            if not (REPO / script).is_file():
                problems.append(f"{where}: {script} does not exist")
    raw, ran = _field(para, "Raw:"), _field(para, "Ran:")
    for name, value in (("Raw:", raw), ("Ran:", ran)):
        if value is None:
            problems.append(f"{where}: the {'Command:' if para.startswith('Command:') else 'Raw:'} "
                            f"paragraph has no '{name}'")
    for link in LINK.findall(para):
        if not (doc.parent / link).is_file():
            problems.append(f"{where}: raw output {link} does not exist")
    if raw is not None:
        linked = [link for link in LINK.findall(raw) if (doc.parent / link).is_file()]
        if para.startswith("Raw:") and not NOT_KEPT.search(raw):
            problems.append(f"{where}: a Raw: paragraph without a command must say 'not kept (why)'")
        elif not (linked or "reproducible" in raw or NOT_KEPT.search(raw)):
            problems.append(f"{where}: Raw: {raw.strip()[:60]!r} is neither a link to a file under "
                            f"docs/{RAW}/, nor 'reproducible', nor 'not kept (why)'")
    if ran is not None:
        if not DATE.search(ran):
            problems.append(f"{where}: Ran: {ran.strip()[:60]!r} has no date (YYYY-MM-DD)")
        if not MACHINE.search(DATE.sub("", ran)):
            problems.append(f"{where}: Ran: {ran.strip()[:60]!r} names no machine (e.g. 'the 2-core VM')")
    return problems


def provenance(text: str) -> str | None:
    """The provenance fields of a paragraph: its text from the first ``Command:`` or ``Raw:``
    outside an inline code span, or None when it has none (``Command: none`` included).

    :param text: a paragraph, its lines joined by spaces.
    :returns: e.g. ``"Command: `python3 benchmarks/ab.py …` · Raw: … · Ran: …"``.
    """
    masked = re.sub(r"`[^`]*`", lambda m: "_" * len(m.group(0)), text)
    found = re.search(r"(?:^|(?<=\s))(?:Command|Raw):", masked)
    if found is None or re.match(r"Command:\s*none\b", text[found.start():]):
        return None
    return text[found.start():]


def _is_none(block: Block) -> bool:
    return block.kind == "para" and re.match(r"Command:\s*none\b", block.text) is not None


def prose_figures(text: str) -> list[tuple[int, str]]:
    """The measured figures of a paragraph: inline code, link targets and bounds left out.

    :param text: the paragraph's lines joined by newlines (a code span may cross a line).
    :returns: ``(line index within the paragraph, figure as written)``, e.g. ``(2, "5.79 GB")``.
    """
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731  (keeps the line breaks)
    text = re.sub(r"`[^`]*`", blank, text)
    text = re.sub(r"\]\([^)]*\)", blank, text)
    return [(text.count("\n", 0, m.start()), m.group(0)) for m in MEASURED.finditer(text)
            if not BOUND.search(text[:m.start()])]


def check(doc: Path = DOC) -> list[str]:
    """Every problem of ``doc`` against the rule, one line each (empty when it follows it).

    :param doc: the Markdown page (its raw files under ``<its directory>/benchmarks/raw``).
    :returns: the problems, each ``<page>:<line>: what``.
    """
    lines = doc.read_text().splitlines()
    blocks, problems = _blocks(lines)
    problems = [f"{doc.name}:{p}" for p in problems]
    covered_sections = {b.section for b in blocks if b.kind == "para" and provenance(b.text)}
    pending: Block | None = None      # the last Command: paragraph, not yet used by a figure block
    for block in blocks:
        where = f"{doc.name}:{block.line}"
        if block.kind == "heading":
            pending = None
        elif block.kind == "para":
            own = provenance(block.text)
            if own:
                problems += _check_provenance(own, where, doc)
            if block.text.startswith("Command:"):
                pending = block
            figures = prose_figures("\n".join(block.lines))
            if not figures:
                continue
            n, figure = figures[0]
            if BY_HAND.search(block.text) and not (own and NOT_KEPT.search(own)):
                problems.append(f"{doc.name}:{block.line + n}: the figure {figure!r} was taken by hand: "
                                "its paragraph must say 'Raw: not kept (why) · Ran: DATE, MACHINE'")
            elif not own and block.section not in covered_sections:
                problems.append(f"{doc.name}:{block.line + n}: the figure {figure!r} in prose has no "
                                "'Command:' (or 'Raw: not kept (why)') paragraph in its paragraph or section")
        elif block.kind == "table" or (block.kind == "fence" and block.lang not in CODE_FENCES):
            kind = "table" if block.kind == "table" else "output block"
            line = block.line
            if pending is None:
                problems.append(f"{doc.name}:{line}: {kind} without a 'Command:' paragraph above it "
                                "(after the previous figure block and the section's heading)")
            elif _is_none(pending):
                measured = [m.group(0) for row in block.lines for m in [MEASURED.search(row)] if m]
                if measured:
                    problems.append(f"{doc.name}:{line}: 'Command: none' above a block with measured "
                                    f"figures ({measured[0]!r})")
            pending = None
    problems += _check_raw(doc, "\n".join(lines))
    return problems


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
