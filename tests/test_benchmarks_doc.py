"""docs/benchmarks.md: every figure has the command that printed it, and the raw output is kept.

The rule is written at the top of the page ("How the figures are made") and checked by
``benchmarks/check_doc.py``: each table and each output block has a ``Command:`` paragraph above
it naming a ``benchmarks/`` script that exists; a figure with a unit in prose stands in a paragraph
or section with such a paragraph, or, taken by hand, says ``Raw: not kept (why)`` in its own;
``Raw:`` links a kept file or says ``reproducible`` or ``not kept (why)``; ``Ran:`` has a date and
a machine; raw files are linked and their verdicts rest on at least 5 rounds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit


def _checker():
    spec = importlib.util.spec_from_file_location("check_doc", REPO / "benchmarks" / "check_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_figure_of_the_benchmarks_page_has_its_command():
    problems = _checker().check(REPO / "docs" / "benchmarks.md")
    assert problems == [], "\n".join(problems)


GOOD = """# Page

## A section

Command: `python3 benchmarks/ab.py --rounds 5 "true" "false"` · Raw: [x](benchmarks/raw/ab.txt) ·
Ran: 2026-11-25, 2-core VM, load 1

| a | b |
|---|---|
| 1.0 s | 2.0 s |

Command: none (a description)

| what | how |
|---|---|
| (a) | the Cirrus method |

```bash
python3 benchmarks/ab.py
```

The install took 20.2 s, 1.4x the floor (the target: ≤ 1.25x; `median 1.12x` in code is no figure).

## Another section, targets only, within 1.25x

A target is ≤ 1.25x; nothing measured here.

## By hand

A hand-timed import took 3.1 s. Raw: not kept (by hand, no script kept) · Ran: 2026-11-23, the
2-core VM, load 1
"""


def _page(tmp_path: Path, text: str, raw: str | None = "[HOLDS] x <= 1.1x: median 1.0x (min-max 1-1, IQR 1-1, n 5)\n") -> Path:
    doc = tmp_path / "benchmarks.md"
    doc.write_text(text)
    if raw is not None:
        (tmp_path / "benchmarks" / "raw").mkdir(parents=True)
        (tmp_path / "benchmarks" / "raw" / "ab.txt").write_text(raw)
    return doc


def test_a_page_that_follows_the_rule_passes(tmp_path):
    assert _checker().check(_page(tmp_path, GOOD)) == []


@pytest.mark.parametrize("change, expected", [
    # a table with nothing above it
    (lambda t: t.replace("Command: `python3 benchmarks/ab.py", "Note: `python3 benchmarks/ab.py"),
     "table without a 'Command:' paragraph"),
    # the command names a script that is not there
    (lambda t: t.replace("benchmarks/ab.py --rounds", "benchmarks/nothere.py --rounds"),
     "benchmarks/nothere.py does not exist"),
    # no Ran: field
    (lambda t: t.replace("Ran:", "On:"), "has no 'Ran:'"),
    # a raw link to a file that is not kept
    (lambda t: t.replace("raw/ab.txt", "raw/gone.txt"), "raw/gone.txt does not exist"),
    # a description table that holds a measurement
    (lambda t: t.replace("| (a) | the Cirrus method |", "| (a) | 197.5 s |"), "'Command: none' above a block"),
    # one Command: paragraph for two blocks
    (lambda t: t.replace("Command: none (a description)\n", ""), "table without a 'Command:'"),
    # an output block without its command
    (lambda t: t + "\n```\n  ratio: 1.70x\n```\n", "output block without a 'Command:'"),
    # a heading between the command and its figure
    (lambda t: t.replace("\n| a | b |", "\n### Sub\n\n| a | b |"), "table without a 'Command:'"),
])
def test_the_checker_finds_a_figure_without_its_command(tmp_path, change, expected):
    problems = _checker().check(_page(tmp_path, change(GOOD)))
    assert any(expected in p for p in problems), problems


def test_raw_verdicts_need_five_rounds_and_raw_files_a_link(tmp_path):
    doc = _page(tmp_path, GOOD, raw="[MISSED] x <= 1.1x: median 1.3x (min-max 1.2-1.4, IQR 1.2-1.4, n 3)\n")
    (tmp_path / "benchmarks" / "raw" / "orphan.txt").write_text("1.0 s\n")
    problems = _checker().check(doc)
    assert any("raw/ab.txt:1: a verdict without the spread of at least 5" in p for p in problems), problems
    assert any("raw/orphan.txt: not linked" in p for p in problems), problems


def test_the_checker_exits_2_with_one_line_per_problem(tmp_path, capsys):
    doc = _page(tmp_path, GOOD.replace("Command: none (a description)\n", ""))
    assert _checker().main([str(doc)]) == 2
    assert len(capsys.readouterr().out.strip().splitlines()) == 1


@pytest.mark.parametrize("change, expected", [
    # Raw: and Ran: that say nothing
    (lambda t: t.replace("Raw: [x](benchmarks/raw/ab.txt) ·\nRan: 2026-11-25, 2-core VM, load 1",
                         "Raw: banana · Ran: whenever"),
     "Raw: 'banana' is neither a link"),
    (lambda t: t.replace("Raw: [x](benchmarks/raw/ab.txt) ·\nRan: 2026-11-25, 2-core VM, load 1",
                         "Raw: banana · Ran: whenever"),
     "Ran: 'whenever' has no date"),
    # a date but no machine
    (lambda t: t.replace("Ran: 2026-11-25, 2-core VM, load 1", "Ran: 2026-11-25, load 1"), "names no machine"),
    # 'not kept' without the reason
    (lambda t: t.replace("Raw: [x](benchmarks/raw/ab.txt)", "Raw: not kept"), "nor 'not kept (why)'"),
    # a figure in prose, in a section without a Command: paragraph
    (lambda t: t.replace("nothing measured here.", "nothing measured here but a load of 2.5 s."),
     "the figure '2.5 s' in prose has no 'Command:'"),
    # the same for the other units
    (lambda t: t.replace("nothing measured here.", "the stack is 5.79 GB."), "the figure '5.79 GB'"),
    (lambda t: t.replace("nothing measured here.", "it ran 1,203 img/s."), "the figure '1,203 img/s'"),
    (lambda t: t.replace("nothing measured here.", "82.6 % of it."), "the figure '82.6 %'"),
    (lambda t: t.replace("nothing measured here.", "it was 2.6x."), "the figure '2.6x'"),
    # a figure taken by hand without its own 'Raw: not kept (why)', even in a covered section
    (lambda t: t.replace("Raw: not kept (by hand, no script kept) · Ran: 2026-11-23, the\n2-core VM, load 1",
                         "(by hand)."),
     "the figure '3.1 s' was taken by hand"),
    (lambda t: t.replace("The install took 20.2 s,", "By hand the install took 20.2 s,"),
     "the figure '20.2 s' was taken by hand"),
    # a Raw: paragraph of its own must say why nothing is kept
    (lambda t: t.replace("Raw: not kept (by hand, no script kept)", "Raw: [x](benchmarks/raw/ab.txt)"),
     "must say 'not kept (why)'"),
    # a link to a raw file that does not exist, in a Raw: paragraph of its own
    (lambda t: t.replace("no script kept) · Ran:", "no script kept) [y](benchmarks/raw/none.txt) · Ran:"),
     "raw output benchmarks/raw/none.txt does not exist"),
])
def test_the_checker_finds_bad_provenance_and_figures_in_prose(tmp_path, change, expected):
    text = change(GOOD)
    assert text != GOOD, "the change did not apply"
    problems = _checker().check(_page(tmp_path, text))
    assert any(expected in p for p in problems), problems


def test_prose_figures_leave_out_code_links_and_bounds():
    figures = _checker().prose_figures("took 2.5 s\n(`median 1.12x (min-max\n0.50-1.66)`) ≤ 1.25x, "
                                       "[raw](benchmarks/raw/a-2.5x.txt) and < 2 s, then 6.1 MB")
    assert figures == [(0, "2.5 s"), (2, "6.1 MB")], figures
