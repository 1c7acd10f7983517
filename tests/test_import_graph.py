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
2. ``site`` (reads the module tools' names and syntaxes);
3. ``install`` (plan, actions, runner, builds, components);
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
     "hpcstack.templates", "hpcstack.doctor", "hpcstack.secrets", "hpcstack.trust"),
    ("hpcstack.repos", "hpcstack.recipe", "hpcstack.modules"),
    ("hpcstack.site", "hpcstack.site_keys"),
    ("hpcstack.install", "hpcstack.lifecycle"),
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
