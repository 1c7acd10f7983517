"""The import graph of ``hpcstack/`` has no cycle and no import from a lower layer back up.

Modules are the nodes, every ``import``/``from … import`` statement of the package is an edge
(also those inside functions: a lazy import is still a dependency). ``from P import n`` is an
edge to ``P.n`` when that is a module, else to ``P``; the parent packages Python imports on the
way are not edges of their own (a package's ``__init__`` re-exporting its modules is no cycle).

The layers, lowest first (a module may import its own layer and those below):

0. utilities: the package root (``data_root``), ``fsutil``, ``errors``, ``schema``, ``registry``,
   ``templates``, and ``doctor`` (the stand-alone ``hpcstack-doctor`` copied into every stack:
   it may import nothing above the utilities);
1. ``repos``, ``recipe``, ``modules`` (the search path, recipe files, modulefiles and module tools);
2. ``site`` (reads the module tools' names and syntaxes), and ``session``, the one way in to
   recipes, site configs and repositories (:func:`test_only_the_session_calls_the_raw_loaders`);
3. ``install`` (plan, actions, runner, builds, components), and ``recipe_api``, the façade that
   recipe files import (it re-exports the recipe, components, actions and step names);
4. ``validate``;
5. ``export`` (container specs, EasyBuild, ReFrame: they read installs and validations);
6. ``cli`` and ``__main__``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "hpcstack"

LAYERS = (
    ("hpcstack", "hpcstack.fsutil", "hpcstack.errors", "hpcstack.schema", "hpcstack.registry",
     "hpcstack.templates", "hpcstack.doctor", "hpcstack.secrets", "hpcstack.trust", "hpcstack.gate"),
    ("hpcstack.repos", "hpcstack.recipe", "hpcstack.modules"),
    ("hpcstack.site", "hpcstack.site_keys", "hpcstack.session"),
    ("hpcstack.install", "hpcstack.lifecycle", "hpcstack.recipe_api"),
    ("hpcstack.validate",),
    ("hpcstack.export",),
    ("hpcstack.cli", "hpcstack.__main__"),
)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``); the
    ``data`` directory (recipes, scripts shipped as data) is not code of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if "data" in parts[1:2]:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def edges(mods: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{importer: {imported: line}}`` over the package's own modules."""
    graph: dict[str, dict[str, int]] = {name: {} for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:  # `import a.b.c` of a name inside a module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def layer(name: str) -> int:
    for index, members in enumerate(LAYERS):
        if any(name == m or (m != "hpcstack" and name.startswith(m + ".")) for m in members):
            return index
    raise AssertionError(f"{name}: in no layer; add it to LAYERS in {__file__}")


def where(mods, importer: str, imported: str, line: int) -> str:
    return f"{mods[importer].relative_to(PACKAGE.parent)}:{line}: {importer} imports {imported}"


def test_every_module_has_a_layer():
    for name in modules():
        layer(name)


def test_no_import_goes_up_a_layer():
    mods = modules()
    upward = [f"{where(mods, a, b, line)} (layer {layer(a)} < {layer(b)})"
              for a, targets in edges(mods).items() for b, line in targets.items() if layer(a) < layer(b)]
    assert not upward, "imports from a lower layer back up:\n" + "\n".join(upward)


def test_the_import_graph_has_no_cycle():
    mods = modules()
    graph = edges(mods)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    shown = ["\n".join("  " + where(mods, a, b, graph[a][b]) for a, b in zip(c, c[1:])) for c in cycles]
    assert not cycles, "import cycles (each edge with its line):\n" + "\n--\n".join(shown)


#: The raw loaders of recipes, site configs and the search path, by the module that defines
#: them; only :data:`LOADER` (and these modules among themselves) may use them, so that every
#: command reads what it reads through the trust rule (hpcstack/session.py, hpcstack/trust.py).
RAW_LOADERS = {
    "hpcstack.recipe": {"load_recipe", "recipe_path"},
    "hpcstack.site": {"load_site", "site_path"},
    "hpcstack.repos": {"SearchPath", "default_search_path"},
}
LOADER = "hpcstack.session"


def raw_loader_uses(mods: dict[str, Path], base: Path = PACKAGE.parent) -> list[str]:
    """``file:line: module uses hpcstack.x.name`` for every import or attribute use of a raw
    loader outside :data:`LOADER` and the module defining it (``from m import name``,
    ``import m`` then ``m.name``, ``from hpcstack import m`` then ``m.name``)."""
    found = []
    for name, path in mods.items():
        if name == LOADER or name in RAW_LOADERS:   # the session, and the raw loaders among themselves
            continue
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}      # local name -> raw module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in RAW_LOADERS:
                        aliases[alias.asname or alias.name] = full
                    elif node.module in RAW_LOADERS and alias.name in RAW_LOADERS[node.module] \
                            and node.module != name:
                        found.append(f"{path.relative_to(base)}:{node.lineno}: {name} imports "
                                     f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in RAW_LOADERS:
                        aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                value = node.value
                dotted = value.id if isinstance(value, ast.Name) else ast.unparse(value)
                module = aliases.get(dotted, dotted)
                if module in RAW_LOADERS and module != name and node.attr in RAW_LOADERS[module]:
                    found.append(f"{path.relative_to(base)}:{node.lineno}: {name} uses "
                                 f"{module}.{node.attr}")
    return found


def test_only_the_session_calls_the_raw_loaders():
    uses = raw_loader_uses(modules())
    assert not uses, (f"read recipes, site configs and repositories through {LOADER} (the trust rule), "
                      "not the raw loaders:\n" + "\n".join(uses))


def test_the_raw_loader_rule_finds_each_form_of_use(tmp_path):
    """The check itself: each way of reaching a raw loader is found."""
    forms = {
        "a": "from hpcstack.recipe import load_recipe\n",
        "b": "import hpcstack.site\nhpcstack.site.load_site('x')\n",
        "c": "from hpcstack import repos as r\nr.SearchPath.from_args(())\n",
        "d": "from hpcstack.site import Site\n",     # not a loader: fine
    }
    mods = {}
    for stem, text in forms.items():
        (tmp_path / f"{stem}.py").write_text(text)
        mods[f"hpcstack.{stem}"] = tmp_path / f"{stem}.py"
    uses = raw_loader_uses(mods, base=tmp_path)
    assert [u.split(":")[0] for u in uses] == ["a.py", "b.py", "c.py"], uses


#: The functions of :mod:`subprocess` that start a process.
_STARTERS = ("run", "Popen", "call", "check_call", "check_output")


def processes_without_cwd(mods: dict[str, Path]) -> list[str]:
    """``file:line`` of every ``subprocess.<starter>(…)`` call without a ``cwd=`` keyword."""
    found = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _STARTERS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "subprocess"
                    and not any(k.arg == "cwd" for k in node.keywords)):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_every_process_hpcstack_starts_gets_a_working_directory_of_its_own():
    """No child inherits the caller's working directory, where ``python -m``/``-c`` would import
    a user's files as root (docs/admin/security.md, boundary 6: ``cwd=CHILD_CWD`` or a directory
    of hpcstack's own)."""
    assert processes_without_cwd(modules()) == []


def test_the_working_directory_rule_finds_a_call_without_one(tmp_path):
    (tmp_path / "m.py").write_text("import subprocess\nsubprocess.run(['x'])\nsubprocess.run(['y'], cwd='/')\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path
    try:
        assert processes_without_cwd({"m": tmp_path / "m.py"}) == [f"{tmp_path.name}/m.py:2"]
    finally:
        PACKAGE = saved
