"""Pages of the documentation that list what the repository holds, checked against it, so that
they cannot go stale unseen:

* ``docs/dev/layout.md``: its block names every module and subpackage of ``hpcstack/`` and every
  module of those subpackages, every recipe (``NAME/VERSION``), every directory of the
  repository, and every file of ``scripts/``, ``templates/``, ``benchmarks/`` and
  ``requirements/``;
* ``docs/admin/sites.md``: its list of shipped sites names every file of ``site-configs/``, and
  nothing else;
* ``docs/recipe-pytorch-next.md``: its table of exports names every golden file of the recipe
  (``tests/golden/*pytorch-2.14.1-gpu*``), and every golden file a page names exists;
* the installed size the README and the getting-started page give is the one
  ``benchmarks/disk.py`` recorded (``docs/benchmarks/raw/disk-*.txt``).
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

DOCS = REPO / "docs"


def _layout() -> str:
    """The first fenced block of docs/dev/layout.md."""
    text = (DOCS / "dev" / "layout.md").read_text()
    return text.split("```\n", 2)[1]


def _entry(block: str, name: str, indent: str) -> str:
    """The text of the entry ``name`` of the layout block: its line (``indent`` + ``name``) and
    the lines after it, up to the next entry at the same or a shallower indentation."""
    lines = block.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(indent + name)), None)
    assert start is not None, f"docs/dev/layout.md has no entry {name!r}"
    out = [lines[start]]
    for line in lines[start + 1:]:
        if re.match(rf"^ {{0,{len(indent)}}}\S", line):
            break
        out.append(line)
    return "\n".join(out)


def _package_entries(path: Path) -> list[str]:
    """The modules (``x.py``) and subpackages or data directories (``x/``) directly in ``path``."""
    names = []
    for child in sorted(path.iterdir()):
        if child.name.startswith((".", "__pycache__")) or child.name == "__init__.py":
            continue
        if child.is_dir():
            names.append(child.name + "/")
        elif child.suffix == ".py":
            names.append(child.name)
    return names


def test_the_layout_names_every_module_and_subpackage_of_hpcstack():
    block = _layout()
    package = _entry(block, "hpcstack/", "")
    entries = _package_entries(REPO / "hpcstack")
    assert "install/" in entries and "trust.py" in entries and "lifecycle/" in entries, entries
    missing = [name for name in entries
               if (name.endswith("/") and not re.search(rf"^  {re.escape(name)}\s", package, re.M))
               or (name.endswith(".py") and not re.search(rf"(?<![\w/]){re.escape(name)}", package))]
    assert not missing, f"docs/dev/layout.md does not name hpcstack/{missing}"


def test_the_layout_names_every_module_of_each_subpackage():
    package = _entry(_layout(), "hpcstack/", "")
    missing = []
    for sub in sorted(p for p in (REPO / "hpcstack").iterdir() if (p / "__init__.py").is_file()):
        entry = _entry(package, f"{sub.name}/", "  ")
        for name in _package_entries(sub):
            word = name.rstrip("/").removesuffix(".py")
            if not (re.search(rf"\b{re.escape(word)}\b", entry) or f"{sub.name}/{name}" in package):
                missing.append(f"{sub.name}/{name}")
    assert not missing, f"docs/dev/layout.md does not name hpcstack/{missing}"


def test_the_layout_names_every_recipe():
    recipes = _entry(_layout(), "recipes/", "")
    found = sorted(f"{p.parent.name}/{p.stem}" for p in (REPO / "recipes").glob("*/*.py"))
    assert "pytorch/2.14.1-gpu" in found and "mpi4py/4.1.2" in found, found
    missing = [r for r in found if r not in recipes]
    assert not missing, f"docs/dev/layout.md does not name the recipes {missing}"


def _top_directories() -> list[str]:
    """The repository's directories: git's tracked ones in a checkout, else those .gitignore
    leaves (an sdist)."""
    git = shutil.which("git")
    if git and (REPO / ".git").exists():
        files = subprocess.run([git, "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                               check=True).stdout.splitlines()
        return sorted({f.split("/", 1)[0] for f in files if "/" in f})
    ignored = [line.strip().strip("/") for line in (REPO / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    return sorted(p.name for p in REPO.iterdir() if p.is_dir() and p.name != ".git"
                  and not any(fnmatch.fnmatch(p.name, pattern) for pattern in ignored))


def test_the_layout_names_every_directory_and_script():
    block = _layout()
    directories = _top_directories()
    assert "benchmarks" in directories and "hpcstack" in directories, directories
    missing = [d for d in directories if not re.search(rf"^{re.escape(d)}/\s", block, re.M)]
    for folder in ("scripts", "templates", "benchmarks", "requirements"):
        entry = _entry(block, f"{folder}/", "")
        for path in sorted(p for p in (REPO / folder).iterdir() if p.is_file()):
            name = path.stem if folder == "benchmarks" else path.name   # benchmarks: "install", "ab"
            if not re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", entry):
                missing.append(f"{folder}/{path.name}")
    assert not missing, f"docs/dev/layout.md does not name {missing}"


def test_the_sites_page_lists_every_shipped_site_and_no_other():
    text = (DOCS / "admin" / "sites.md").read_text()
    assert "The shipped sites" in text, "docs/admin/sites.md has lost its list \"The shipped sites\""
    listing = text.split("The shipped sites", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^- `([\w.-]+)`", listing, re.M)
    shipped = sorted(p.stem for p in (REPO / "site-configs").glob("*.yaml"))
    assert "localhost-lmod" in shipped, shipped
    unlisted = [name for name in shipped if name not in listed]
    assert not unlisted, "\n".join(
        f"site-configs/{name}.yaml is not on docs/admin/sites.md: add an entry for it to the list under "
        f"\"The shipped sites\", a line starting \"- `{name}`: \" that says what machine it is and what "
        "differs from the others, with the public sources its facts come from "
        "(docs/admin/new-site.md, \"The docs page entry\")" for name in unlisted)
    gone = [name for name in listed if name not in shipped]
    assert not gone, (f"docs/admin/sites.md lists {gone} under \"The shipped sites\", but site-configs/ has no "
                      f"{', '.join(n + '.yaml' for n in gone)}: remove the entry or add the file")


def test_the_recipe_page_names_every_golden_file_of_the_recipe():
    page = (DOCS / "recipe-pytorch-next.md").read_text()
    golden = sorted(p.name for p in (REPO / "tests" / "golden").glob("*pytorch-2.14.1-gpu*"))
    assert len(golden) >= 10, golden
    # a row may name one file per site: `tests/golden/pytorch-2.14.1-gpu-<site>-validate.sh`
    sites = [p.stem for p in (REPO / "site-configs").glob("*.yaml")]
    missing = [name for name in golden if f"`tests/golden/{name}`" not in page
               and not any(site in name and f"`tests/golden/{name.replace(site, '<site>')}`" in page for site in sites)]
    assert not missing, f"docs/recipe-pytorch-next.md does not name {missing}"


def test_every_golden_file_a_page_names_exists():
    named = {(page.relative_to(REPO), name) for page in [REPO / "README.md", *DOCS.rglob("*.md")]
             for name in re.findall(r"tests/golden/([\w.@<>-]+)", page.read_text())}
    assert any(page.name == "recipe-pytorch-next.md" for page, _ in named), named
    # a name with <site> stands for each site's file: at least one must exist
    missing = sorted(f"{page}: tests/golden/{name}" for page, name in named
                     if not list((REPO / "tests" / "golden").glob(name.replace("<site>", "*"))))
    assert not missing, missing


def test_the_installed_size_is_the_one_benchmarks_disk_recorded():
    raw = sorted((DOCS / "benchmarks" / "raw").glob("disk-*.txt"))[-1]
    stack_line = next(line for line in raw.read_text().splitlines() if "/software/pytorch/" in line)
    measured = stack_line.split()[-1]
    for page in (REPO / "README.md", DOCS / "getting-started.md"):
        figures = re.findall(r"a stack of ([\d.]+) GB\s+installed", page.read_text())
        assert figures, f"{page.name} gives no installed size"
        assert set(figures) == {measured}, (page.name, figures, f"{raw.name}: {measured} GB")
