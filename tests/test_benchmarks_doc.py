"""docs/benchmarks.md: every figure has the command that printed it, and the raw output is kept.

The rule is written at the top of the page ("How the figures are made") and checked by
``benchmarks/check_doc.py``: each table and each output block has a ``Command:`` paragraph above
it naming a ``benchmarks/`` script that exists; a figure with a unit in prose stands in a paragraph
or section with such a paragraph, or, taken by hand, says ``Raw: not kept (why)`` in its own;
``Raw:`` links a kept file or says ``reproducible`` or ``not kept (why)``; ``Ran:`` has a date and
a machine; raw files are linked, not empty, and their verdicts rest on at least 5 rounds. A
figure that cites a raw file is one of that file's numbers (as printed, or rounded), and a block
that cites raw files says what it leaves out (``Left out:``), each item with its reason.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
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
Left out: none · Ran: 2026-11-25, 2-core VM, load 1

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


RAW = ("a 1.0 s, b 2.04 s, 1,203 img/s\n"
       "[HOLDS] x <= 1.1x: median 1.0x (min-max 1-1, IQR 1-1, n 5)\n")


def _page(tmp_path: Path, text: str, raw: str | None = RAW) -> Path:
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
    (lambda t: t.replace("Raw: [x](benchmarks/raw/ab.txt) ·\nLeft out: none · Ran: 2026-11-25, 2-core VM, load 1",
                         "Raw: banana · Ran: whenever"),
     "Raw: 'banana' is neither a link"),
    (lambda t: t.replace("Raw: [x](benchmarks/raw/ab.txt) ·\nLeft out: none · Ran: 2026-11-25, 2-core VM, load 1",
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


# --- figures that cite a raw file come from it


@pytest.mark.parametrize("change, expected", [
    # a number in a table that cites the raw file, which the file does not hold
    (lambda t: t.replace("| 1.0 s | 2.0 s |", "| 1.0 s | 2.5 s |"),
     "the figure '2.5' (in a table) is not in the raw output it cites (ab.txt)"),
    # a sentence that links the raw file and quotes a number it does not hold
    (lambda t: t + "\nThe second took 2.1 s ([raw](benchmarks/raw/ab.txt)).\n",
     "the figure '2.1' (in a sentence) is not in the raw output"),
    # prose right under the Command: paragraph reads from its raw file too
    (lambda t: t.replace("Left out: none · Ran: 2026-11-25, 2-core VM, load 1\n",
                         "Left out: none · Ran: 2026-11-25, 2-core VM, load 1\n\nB took 7.5 s.\n"),
     "the figure '7.5' (in a sentence)"),
    # a thousands separator is no licence for another number
    (lambda t: t.replace("| 1.0 s | 2.0 s |", "| 1.0 s | 1,204 img/s |"), "the figure '1,204'"),
    # no Left out: field where the block cites raw output
    (lambda t: t.replace("Left out: none · Ran:", "Ran:"), "has no 'Left out:'"),
    # an item left out without its reason
    (lambda t: t.replace("Left out: none · Ran:", "Left out: the rows of B (slow); the rows of C · Ran:"),
     "Left out: 'the rows of C' gives no reason"),
])
def test_the_checker_finds_a_figure_that_is_not_in_its_raw_file(tmp_path, change, expected):
    text = change(GOOD)
    assert text != GOOD, "the change did not apply"
    problems = _checker().check(_page(tmp_path, text))
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("change", [
    # rounded to fewer decimals (2.04 gives 2.0), thousands separated, a row that says not kept
    lambda t: t.replace("| 1.0 s | 2.0 s |", "| 1.0 s | 2.0 s |\n| 1,203 img/s | 2 s |"),
    lambda t: t.replace("| 1.0 s | 2.0 s |", "| 1.0 s | 2.0 s |\n| 9.9 s (raw not kept) | 8.8 s |"),
    # a date, a time, a version, a name with a number and a bound are not figures
    lambda t: t.replace("| 1.0 s | 2.0 s |", "| 2026-11-25 07:44, torch 2.3.1 on 2-core H100 | ≤ 3.3x |"),
    # the items left out, each with its reason
    lambda t: t.replace("Left out: none · Ran:",
                        "Left out: the rows of B (slow; see below); the load (it is in Ran:) · Ran:"),
])
def test_the_checker_takes_figures_as_printed_or_rounded(tmp_path, change):
    text = change(GOOD)
    assert text != GOOD, "the change did not apply"
    assert _checker().check(_page(tmp_path, text)) == []


def test_an_empty_raw_file_fails(tmp_path):
    problems = _checker().check(_page(tmp_path, GOOD, raw="\n"))
    assert any("raw/ab.txt: empty" in p for p in problems), problems


def _real_page_copy(tmp_path: Path) -> Path:
    """docs/benchmarks.md and its raw files, copied under tmp_path."""
    shutil.copytree(REPO / "docs" / "benchmarks" / "raw", tmp_path / "benchmarks" / "raw")
    doc = tmp_path / "benchmarks.md"
    doc.write_text((REPO / "docs" / "benchmarks.md").read_text())
    return doc


def test_the_real_page_fails_when_a_figure_is_doctored(tmp_path, capsys):
    doc = _real_page_copy(tmp_path)
    assert _checker().main([str(doc)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    text = doc.read_text()
    row = "| the uv cache it hard-links from (`installer.wheel_cache`) | 26,937 |"
    assert text.count(row) == 1
    doc.write_text(text.replace(row, row.replace("26,937", "26,938")))
    assert _checker().main([str(doc)]) == 2
    out = capsys.readouterr().out
    assert "the figure '26,938' (in a table) is not in the raw output it cites (disk-2026-11-25.txt)" in out, out


def test_the_real_page_fails_when_its_raw_file_is_doctored(tmp_path, capsys):
    doc = _real_page_copy(tmp_path)
    raw = tmp_path / "benchmarks" / "raw" / "disk-2026-11-25.txt"
    assert "26,937" in raw.read_text()
    raw.write_text(raw.read_text().replace("26,937", "26,938"))
    assert _checker().main([str(doc)]) == 2
    out = capsys.readouterr().out
    assert "the figure '26,937' (in a table)" in out, out


def test_the_real_page_fails_when_a_raw_file_it_cites_is_empty(tmp_path, capsys):
    doc = _real_page_copy(tmp_path)
    (tmp_path / "benchmarks" / "raw" / "startup-unpacked5-2026-11-28.report.txt").write_text("")
    assert _checker().main([str(doc)]) == 2
    out = capsys.readouterr().out
    assert "benchmarks/raw/startup-unpacked5-2026-11-28.report.txt: empty" in out, out
    # and the figures only it holds are named: the ratios of the paired rounds
    assert "the figure '0.75' (in a table)" in out, out


def test_numbers_leave_out_names_dates_versions_code_links_and_bounds():
    numbers = _checker().numbers("On 2026-11-28 07:44 torch 2.3.1 on 2-core H100 x1 took 2.5 s "
                                 "(`n 5`, [r](benchmarks/raw/a-2.txt)) ≤ 1.25x, then 1,203 img/s and 1.2x\n3rd 4")
    assert numbers == [(0, "2.5"), (0, "1,203"), (0, "1.2"), (1, "4")], numbers


def test_matches_same_number_or_rounded():
    check_doc = _checker()
    values = set()
    for token in ("1.117", "122958", "0.845", "2.25"):
        values |= _raw_set(check_doc, token)
    for number in ("1.117", "1.12", "1.1", "1", "122,958", "0.85", "0.84", "2.2", "2.3", "1.1170"):
        assert check_doc.matches(number, values), number
    for number in ("1.13", "122,959", "0.86", "2.4", "1.11"):
        assert not check_doc.matches(number, values), number


def _raw_set(check_doc, token: str) -> set:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "raw.txt"
        path.write_text(f"x {token} y\n")
        return check_doc.raw_numbers([path])
