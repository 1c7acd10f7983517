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
number with a unit. Every raw file is linked from the page, no raw file is empty, and a verdict
line in a raw file (``[HOLDS]`` or ``[MISSED]``) shows its rounds as ``n N`` with N at least 5.

**Figures that cite a raw file come from it.** A figure block whose provenance paragraph links raw
files cites those files; so does a sentence of prose that links one, and every sentence of the
paragraphs between a ``Command:`` paragraph that links raw files and the next heading, figure
block or provenance paragraph (the prose under that command). Every number in them
(:func:`numbers`) must be one of the numbers of the files cited (:func:`raw_numbers`) by one of
two rules (:func:`matches`), and no other:

- the same number (thousands separators aside: ``122,958`` is ``122958``; ``1.20`` is ``1.2``);
- the number rounded to fewer decimals, half up or half to even (``1.117`` gives ``1.12``,
  ``4029.4`` gives ``4,029``).

Units are not converted (``4029 MB`` in the file is not ``4.03 GB`` on the page) and nothing is
computed (a ratio the page shows is a ratio the script printed). Not numbers of a figure: dates,
times of day, version numbers (``2.3.1``), numbers in inline code and in a link, numbers joined
to a word (``H100``, ``x1``, ``2-core``) and bounds (``≤ 1.25x``). A table row with a cell that
says ``not kept`` is not checked against the files (its figures come from output that is gone;
the provenance paragraph says why). A figure block that cites raw files says in its provenance
paragraph what of their output it leaves out: ``Left out: none``, or ``Left out: WHAT (why); WHAT
(why)``, every item with its reason in parentheses.

Usage: ``python3 benchmarks/check_doc.py [DOC]``; prints one line per problem, exit status 2 when
there are any, 0 otherwise.
"""

from __future__ import annotations

import argparse
import re
import sys
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
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
#: provenance fields, in the order the page writes them
FIELDS = ("Command:", "Raw:", "Left out:", "Ran:")
#: what a number of a figure looks like on the page and in a raw file (``1,203``, ``0.84``, ``5``)
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
#: units a number may be joined to (``1.2x``, ``20s``, ``64MiB``); any other word makes it a name
UNITS = re.compile(r"(?:x|s|ms|µs|us|ns|min|h|GB|MB|KB|kB|TB|GiB|MiB|KiB|img|%)(?![A-Za-z])")
#: what is masked before numbers are read: code spans, links (their text and target), dates,
#: times of day, version numbers, bounds
NOT_FIGURES = re.compile(
    r"`[^`]*`"                                   # inline code
    r"|\[[^\]]*\]\([^)]*\)"                        # a link, its text and target
    r"|\]\([^)]*\)"                                # a link target whose text began earlier
    r"|\b\d{4}-\d{2}-\d{2}\b"                      # a date
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"                # a time of day
    r"|\b\d+\.\d+\.\d+[\w.+-]*"                    # a version (2.3.1, 3.11.2)
    r"|[≤≥<>]=?\s*\d[\d,]*(?:\.\d+)?")              # a bound (≤ 1.25x)
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
    """The text of ``name`` (``Raw:``, ``Left out:``, ``Ran:``) in a provenance paragraph, up to the
    next field (:data:`FIELDS`), or None when the paragraph has no such field."""
    at = para.find(name)
    if at < 0:
        return None
    rest = para[at + len(name):]
    ends = [rest.find(f" · {other}") for other in FIELDS if other != name]
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


def numbers(text: str) -> list[tuple[int, str]]:
    """The numbers of the figures in ``text``, as the page writes them, each with its line.

    Masked first (:data:`NOT_FIGURES`): inline code, links, dates, times of day, versions and
    bounds; then a number joined to a word other than a unit (``H100``, ``x1``, ``2-core``,
    ``3rd``) is a name, not a figure.

    :param text: a sentence, a paragraph, a table or an output block; lines joined by newlines.
    :returns: ``(line index within text, number as written)``, e.g. ``(0, "1,203")``.
    """
    masked = NOT_FIGURES.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    found = []
    for m in NUMBER.finditer(masked):
        before, after = masked[m.start() - 1:m.start()], masked[m.end():m.end() + 2]
        if before and (before.isalnum() or before in "_./#'-"):
            continue  # part of a name or a path (x1, cu121, .2, a-2)
        if after[:1].isalpha() and not UNITS.match(masked, m.end()):
            continue  # 3rd, 5th, a word such as 64bit
        if after[:1] == "-" and after[1:2].isalpha():
            continue  # 2-core, 5-round
        found.append((masked.count("\n", 0, m.start()), m.group(0)))
    return found


def _canonical(number: str) -> Decimal:
    return Decimal(number.replace(",", "")).normalize()


def raw_numbers(paths: list[Path]) -> set:
    """Every number the files hold, and each rounded to fewer decimals (half up and half to even):
    what a figure citing them may be (see :func:`matches`).

    :param paths: raw files (text; undecodable bytes are replaced).
    :returns: a set of :class:`decimal.Decimal` values (normalised) and of strings, the rounded
        forms as written with their decimals (``"1.12"``, ``"4"``).
    :raises OSError: a file cannot be read.
    """
    found: set = set()
    for path in paths:
        for token in NUMBER.findall(path.read_text(errors="replace")):
            value = Decimal(token.replace(",", ""))
            found.add(value.normalize())
            decimals = -value.as_tuple().exponent
            for k in range(decimals):
                step = Decimal(1).scaleb(-k)
                found.add(str(value.quantize(step, ROUND_HALF_UP)))
                found.add(str(value.quantize(step, ROUND_HALF_EVEN)))
    return found


def matches(number: str, raw: set) -> bool:
    """Whether ``number``, as the page writes it, is one of the numbers of a raw file: the same
    value, or a value of the file rounded to the decimals the page gives.

    :param number: e.g. ``"1,203"``, ``"0.84"``.
    :param raw: what :func:`raw_numbers` returns for the files the figure cites.
    """
    plain = number.replace(",", "")
    return _canonical(plain) in raw or plain in raw


def _sentences(lines: list[str]) -> list[tuple[int, str]]:
    """The sentences of a paragraph (a list item starts a new one), each with the index of the
    line it starts on; a sentence may span lines, which stay separated by newlines."""
    items: list[tuple[int, list[str]]] = []
    for n, line in enumerate(lines):
        if not items or re.match(r"\s*(?:[-*+]|\d+\.)\s", line):
            items.append((n, [line]))
        else:
            items[-1][1].append(line)
    out = []
    for first, item in items:
        text = "\n".join(item)
        start = 0
        for m in re.finditer(r"(?<=[.!?])\s+(?=[A-Z*(\[])", text):
            out.append((first + text.count("\n", 0, start), text[start:m.start()]))
            start = m.end()
        out.append((first + text.count("\n", 0, start), text[start:]))
    return out


def _prose_part(text: str) -> str:
    """``text`` up to its first provenance field (``Command:`` or ``Raw:`` outside inline code)."""
    masked = re.sub(r"`[^`]*`", lambda m: "_" * len(m.group(0)), text)
    found = re.search(r"(?:^|(?<=\s)|(?<=\())(?:Command|Raw):", masked)
    return text if found is None else text[:found.start()]


def _split_items(text: str) -> list[str]:
    """``text`` split at the semicolons outside parentheses."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == ";" and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [i.strip() for i in items + [current] if i.strip()]


def _check_left_out(para: str, where: str) -> list[str]:
    """The ``Left out:`` field of a provenance paragraph whose figure block cites raw files."""
    value = _field(para, "Left out:")
    if value is None:
        return [f"{where}: the block cites raw output but its paragraph has no 'Left out:' "
                "('Left out: none', or each row or line left out with its reason in parentheses)"]
    value = value.strip().rstrip(".")
    if re.fullmatch(r"none\b.*", value):
        return []
    return [f"{where}: Left out: {item[:60]!r} gives no reason in parentheses"
            for item in _split_items(value) if not re.search(r"\([^)]*[A-Za-z][^)]*\)", item)]


def _check_figures(text: str, first_line: int, cited: list[Path], doc: Path, what: str,
                   cache: dict[Path, set]) -> list[str]:
    """Every number of ``text`` that is not among the numbers of the raw files ``cited``."""
    raw: set = set()
    for path in cited:
        if path not in cache:
            cache[path] = raw_numbers([path])
        raw |= cache[path]
    names = ", ".join(path.name for path in cited[:2]) + (f" and {len(cited) - 2} more" if len(cited) > 2 else "")
    return [f"{doc.name}:{first_line + n}: the figure {number!r} ({what}) is not in the raw output it "
            f"cites ({names}), as printed or rounded"
            for n, number in numbers(text) if not matches(number, raw)]


def _cited(text: str, doc: Path) -> list[Path]:
    """The raw files a text links that exist."""
    return [doc.parent / link for link in dict.fromkeys(LINK.findall(text)) if (doc.parent / link).is_file()]


def check(doc: Path = DOC) -> list[str]:
    """Every problem of ``doc`` against the rule, one line each (empty when it follows it).

    :param doc: the Markdown page (its raw files under ``<its directory>/benchmarks/raw``).
    :returns: the problems, each ``<page>:<line>: what`` (``<raw file>: what`` for a raw file's
        own); a figure that is not in the raw output it cites is named as written, e.g.
        ``benchmarks.md:12: the figure '1.23' (in a table) is not in the raw output it cites (…)``.
    :raises OSError: the page or a raw file cannot be read.
    """
    lines = doc.read_text().splitlines()
    blocks, problems = _blocks(lines)
    cache: dict[Path, set] = {}
    problems = [f"{doc.name}:{p}" for p in problems]
    covered_sections = {b.section for b in blocks if b.kind == "para" and provenance(b.text)}
    pending: Block | None = None      # the last Command: paragraph, not yet used by a figure block
    under: list[Path] = []            # the raw files of that paragraph, while prose follows it
    for block in blocks:
        where = f"{doc.name}:{block.line}"
        if block.kind == "heading":
            pending, under = None, []
        elif block.kind == "para":
            own = provenance(block.text)
            if own:
                problems += _check_provenance(own, where, doc)
            if block.text.startswith("Command:"):
                pending = block
            for n, sentence in _sentences(block.lines):
                prose = _prose_part(sentence)
                cited = list(dict.fromkeys((under if not own else []) + _cited(prose, doc)))
                if cited:
                    problems += _check_figures(prose, block.line + n, cited, doc, "in a sentence", cache)
            if own:
                under = _cited(own, doc) if block.text.startswith("Command:") else []
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
            else:
                own = provenance(pending.text) or ""
                cited = _cited(own, doc)
                if cited:
                    problems += _check_left_out(own, f"{doc.name}:{pending.line}")
                    first = line if block.kind == "table" else line + 1
                    for n, row in enumerate(block.lines):
                        if block.kind == "table" and (re.match(r"^\s*\|[\s:|-]+\|\s*$", row)
                                                      or re.search(r"\bnot kept\b", row)):
                            continue
                        problems += _check_figures(row, first + n, cited, doc, f"in a {kind}", cache)
            pending, under = None, []
    problems += _check_raw(doc, "\n".join(lines))
    return problems


def _check_raw(doc: Path, text: str) -> list[str]:
    """Every raw file is linked from the page and not empty; its verdicts rest on enough rounds."""
    problems = []
    raw_dir = doc.parent / RAW
    for path in sorted(raw_dir.glob("*")) if raw_dir.is_dir() else []:
        rel = f"{RAW}/{path.name}"
        if f"]({rel})" not in text:
            problems.append(f"{rel}: not linked from {doc.name}")
        if not path.read_text(errors="replace").strip():
            problems.append(f"{rel}: empty (link the output the command printed, or take out what cites it)")
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
