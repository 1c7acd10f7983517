"""Recipes: ``recipes/<name>/<version>.py`` files that define ``recipe(site) -> Recipe``.

A recipe reads like a shopping list (hpccm): a docstring, then one component per line. The
components contribute actions to the standard steps (:data:`hpcstack.install.plan.STEP_ORDER`);
:func:`hpcstack.install.resolve.resolve` turns recipe + site into one plan.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack.errors import ConfigError
from hpcstack.repos import RECIPES, SearchPath, default_search_path
from hpcstack.schema import CONTROL


@dataclass
class Recipe:
    """What a recipe returns.

    Args:
        name (str): the module name, e.g. ``"pytorch"``.
        version (str): the module version, e.g. ``"2.3.1-gpu"``.
        whatis (str): one line describing the stack (``module-whatis``).
        components (list): component objects from :mod:`hpcstack.install.components`, in order.
        directory (Path | None): the recipe's directory (for lock files and patches); set by
            :func:`load_recipe`.
        ref (str): how a later command line names this recipe: ``name/version`` where the search
            path finds it without ``--repo``, else its file's absolute path; set by :func:`load_recipe`.
        keywords (tuple[str, ...]): words users search modules by (``module search`` /
            ``module keyword``), besides the stack's name and its key packages, e.g.
            ``("deep learning", "GPU")``.
        file (Path | None): the recipe file that was run; set by :func:`load_recipe`.
    """

    name: str
    version: str
    whatis: str
    components: list = field(default_factory=list)
    directory: Path | None = None
    ref: str = ""
    keywords: tuple = ()
    file: Path | None = None

    @property
    def full_name(self) -> str:
        """``name/version``, e.g. ``pytorch/2.3.1-gpu``."""
        return f"{self.name}/{self.version}"

    def components_of(self, kind: type) -> list:
        """The recipe's components of a kind (instances of ``kind`` or of its subclasses), in
        recipe order.

        Args:
            kind (type): a component class, e.g. ``PipWheels`` or ``SourceBuild`` (which finds
                ``HorovodBuild``, ``Mpi4pyBuild`` and a recipe's own subclasses too).

        Returns:
            list: possibly empty.

        Example:
            ``recipe.components_of(SourceBuild)``
        """
        return [c for c in self.components if isinstance(c, kind)]

    def component(self, kind: type):
        """The recipe's first component of a kind, or None (as :meth:`components_of`).

        Args:
            kind (type): a component class, e.g. ``PipWheels``.

        Example:
            ``wheels = recipe.component(PipWheels)``
        """
        return next((c for c in self.components if isinstance(c, kind)), None)


#: A recipe's (module's) name or version: letters, digits and ``._+-``, starting with a letter
#: or digit (``pytorch``, ``2.3.1-gpu``): it becomes a directory, a module name, a Tcl and Lua
#: word, a Python identifier's part and a file name.
RECIPE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


def check_recipe(recipe: "Recipe", where: str) -> list[str]:
    """Check what a recipe returned before anything uses it.

    Rules: ``name`` and ``version`` match :data:`RECIPE_WORD`; ``whatis`` is one line of
    printable text (:data:`hpcstack.schema.CONTROL`); ``components`` is a list of component
    objects (each with a callable ``contribute(ctx)``, as :mod:`hpcstack.install.components`'s).

    Args:
        recipe (Recipe): what ``recipe(site)`` returned.
        where (str): the recipe file, to start each line with.

    Returns:
        list[str]: one line per problem; empty when the recipe is fine.
    """
    problems = []
    for attr in ("name", "version"):
        value = getattr(recipe, attr)
        if not isinstance(value, str) or not RECIPE_WORD.fullmatch(value):
            problems.append(f"{where}: Recipe {attr} {_shown(value)}: use letters, digits and ._+- "
                            "(starting with a letter or digit, at most 64)")
    if not isinstance(recipe.whatis, str) or CONTROL.search(recipe.whatis) or len(recipe.whatis) > 1024:
        problems.append(f"{where}: Recipe whatis {_shown(recipe.whatis)}: one line of printable text "
                        "(at most 1024 characters)")
    if not isinstance(recipe.components, (list, tuple)):
        problems.append(f"{where}: Recipe components: a {type(recipe.components).__name__}, "
                        "not a list of components")
    else:
        for i, component in enumerate(recipe.components):
            if isinstance(component, type) or not callable(getattr(component, "contribute", None)):
                problems.append(f"{where}: Recipe components[{i}]: {_shown(component)} is not a "
                                "component (an object with contribute(ctx), e.g. PipWheels(...))")
    return problems


def _shown(value: object, limit: int = 60) -> str:
    """A short one-line ``repr`` of ``value`` for a message."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a recipe's own object with a broken __repr__
        text = f"<{type(value).__name__}>"
    text = CONTROL.sub("?", text)
    return text if len(text) <= limit else text[:limit] + "..."


def recipe_path(spec: str, search: SearchPath | None = None) -> Path:
    """Resolve a recipe spec: a path to a ``.py`` file, or ``name/version`` on the search path.

    Args:
        spec (str): ``pytorch/2.3.1-gpu`` or a path such as ``./recipes/tiny/1.0.py``.
        search (SearchPath | None): where to look (default: ``HPCSTACK_PATH``, then built-in).

    Raises:
        ConfigError: no such recipe; the line names the search path and the known recipes.
    """
    candidate = Path(spec)
    if candidate.suffix == ".py" and candidate.is_file():
        return candidate.resolve()
    search = search or default_search_path()
    entry = search.find(RECIPES, spec)
    if entry:
        return entry.path
    if candidate.suffix == ".py":
        raise ConfigError([f"recipe file {spec}: no such file"])
    known = ", ".join(e.name for e in search.entries(RECIPES)) or "none"
    raise ConfigError([f"unknown recipe '{spec}' (known: {known}; searched: {search.describe()})"])


def check_syntax(path: Path) -> str | None:
    """Compile a recipe file without running it (in its own namespace: no future imports inherited).

    Returns:
        str | None: one line ``"<file>:<line>: syntax error in recipe: <msg>"``, or None when it compiles.
    """
    try:
        _compile(path)
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: syntax error in recipe: {exc.msg}"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{path}: cannot read recipe: {exc}"
    return None


def _compile(path: Path):
    """The recipe's code object, compiled as a module of its own: ``dont_inherit=True`` keeps this
    file's ``from __future__ import annotations`` out of it (a recipe's annotations are evaluated
    as in any module, so ``dataclasses`` and ``typing.get_type_hints`` see real types)."""
    return compile(path.read_text(), str(path), "exec", dont_inherit=True)


def module_name(path: Path) -> str:
    """The name a recipe file is registered under in ``sys.modules``: unique per file
    (``hpcstack_recipe_<stem>_<12 hex digits of the path's sha256>``), never a real package's."""
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"hpcstack_recipe_{stem}_{digest}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _recipe_line(path: Path, tb) -> int | None:
    """The line of the recipe file in a traceback: its innermost frame in that file (the call
    into a component that raised, or the recipe's own statement), None when none is there."""
    lines = [f.lineno for f in traceback.extract_tb(tb) if f.filename == str(path)]
    return lines[-1] if lines else None


def _element_lines(path: Path, count: int) -> list[int | None]:
    """The line of each element of the recipe's ``components=[...]`` list, when the source has
    one such list literal with ``count`` elements; else a list of None."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return [None] * count
    lists = [kw.value for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords
             if kw.arg == "components" and isinstance(kw.value, ast.List)]
    if len(lists) == 1 and len(lists[0].elts) == count:
        return [e.lineno for e in lists[0].elts]
    return [None] * count


def load_recipe(spec: str, site, search: SearchPath | None = None, path: Path | None = None) -> Recipe:
    """Load a recipe file as a Python module of its own and call its ``recipe(site)``.

    The file is compiled on its own (no future imports inherited from hpcstack) and registered in
    ``sys.modules`` under :func:`module_name` (replacing an earlier load of the same file), so a
    recipe may define dataclasses, use type hints and define components of its own, as any module.

    Args:
        spec (str): ``name/version`` or a path to a recipe file.
        site (hpcstack.site.Site): the site to build for.
        search (SearchPath | None): where ``name/version`` is looked up (default: ``HPCSTACK_PATH``,
            then the built-in recipes).
        path (Path | None): the file ``spec`` names on ``search`` (:func:`recipe_path`), when the
            caller has looked it up (and checked it) already: it is not looked up again.

    Returns:
        Recipe: with ``directory`` set.

    Raises:
        ConfigError: one line naming the recipe file and its line: the file is missing, has a
            syntax error, raises anything while it loads or in ``recipe(site)``, defines no
            ``recipe(site)``, does not return a :class:`Recipe`, or lists an object that is not a
            component (it has no ``contribute(ctx)``).
    """
    path = path or recipe_path(spec, search)
    try:
        code = _compile(path)
    except SyntaxError as exc:
        raise ConfigError([f"{path}:{exc.lineno}: syntax error in recipe: {exc.msg}"])
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError([f"{path}: cannot read recipe: {_one_line(exc)}"])
    name = module_name(path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=str(path)))
    module.__file__ = str(path)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
        func = getattr(module, "recipe", None)
        if not callable(func):
            raise ConfigError([f"{path}: defines no function recipe(site)"])
        result = func(site)
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:
        line = _recipe_line(path, sys.exc_info()[2])
        where = f"{path}:{line}" if line else str(path)
        message = CONTROL.sub(" ", _one_line(f"{type(exc).__name__}: {exc}"))[:300]
        raise ConfigError([f"{where}: recipe failed: {message}"]) from None
    if not isinstance(result, Recipe):
        raise ConfigError([f"{path}: recipe(site) returned {type(result).__name__}, not a Recipe"])
    components = list(result.components)
    for index, (component, line) in enumerate(zip(components, _element_lines(path, len(components))), 1):
        if not callable(getattr(component, "contribute", None)):
            where = f"{path}:{line}" if line else str(path)
            raise ConfigError([f"{where}: component {index} of the recipe is {type(component).__name__} "
                               f"{_one_line(repr(component))[:60]}, not a component (it has no contribute(ctx))"])
    problems = check_recipe(result, str(path))
    if problems:
        raise ConfigError(problems)
    result.directory = path.parent
    result.file = path
    entry = (search or default_search_path()).find(RECIPES, spec) if Path(spec).suffix != ".py" else None
    result.ref = spec if entry and entry.repo.origin != "--repo" else str(path)
    return result
