"""Recipes: ``recipes/<name>/<version>.py`` files that define ``recipe(site) -> Recipe``.

A recipe reads like a shopping list (hpccm): a docstring, then one component per line. The
components contribute actions to the standard steps (:data:`hpcstack.plan.STEP_ORDER`);
:func:`hpcstack.resolve.resolve` turns recipe + site into one plan.
"""

from __future__ import annotations

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
        components (list): component objects from :mod:`hpcstack.components`, in order.
        directory (Path | None): the recipe's directory (for lock files and patches); set by
            :func:`load_recipe`.
        ref (str): how a later command line names this recipe: ``name/version`` where the search
            path finds it without ``--repo``, else its file's absolute path; set by :func:`load_recipe`.
    """

    name: str
    version: str
    whatis: str
    components: list = field(default_factory=list)
    directory: Path | None = None
    ref: str = ""

    @property
    def full_name(self) -> str:
        """``name/version``, e.g. ``pytorch/2.3.1-gpu``."""
        return f"{self.name}/{self.version}"


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


def known_recipes(search: SearchPath | None = None) -> list[str]:
    """Return the recipe specs (``name/version``) on the search path."""
    return [e.name for e in (search or default_search_path()).entries(RECIPES)]


def check_syntax(path: Path) -> str | None:
    """Compile a recipe file without running it.

    Returns:
        str | None: one line ``"<file>:<line>: syntax error in recipe: <msg>"``, or None when it compiles.
    """
    try:
        compile(path.read_text(), str(path), "exec")
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: syntax error in recipe: {exc.msg}"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"{path}: cannot read recipe: {exc}"
    return None


def load_recipe(spec: str, site, search: SearchPath | None = None) -> Recipe:
    """Load a recipe file and call its ``recipe(site)``.

    Args:
        spec (str): ``name/version`` or a path to a recipe file.
        site (hpcstack.site.Site): the site to build for.
        search (SearchPath | None): where ``name/version`` is looked up (default: ``HPCSTACK_PATH``,
            then the built-in recipes).

    Returns:
        Recipe: with ``directory`` set.

    Raises:
        ConfigError: the file is missing, has a syntax error (file and line given), raises, or
            does not return a :class:`Recipe`.
    """
    path = recipe_path(spec, search)
    module_name = "hpcstack_recipe_" + "".join(c if c.isalnum() else "_" for c in str(path))
    try:
        source = path.read_text(encoding="utf-8")
        code = compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise ConfigError([f"{path}:{exc.lineno}: syntax error in recipe: {exc.msg}"])
    except (OSError, UnicodeDecodeError, ValueError) as exc:   # unreadable, not UTF-8, NUL bytes
        raise ConfigError([f"{path}: cannot read recipe: {' '.join(str(exc).split())}"]) from None
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(module_name, loader=None))
    module.__file__ = str(path)
    try:
        exec(code, module.__dict__)
        func = getattr(module, "recipe", None)
        if not callable(func):
            raise ConfigError([f"{path}: defines no function recipe(site)"])
        result = func(site)
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:
        frame = traceback.extract_tb(sys.exc_info()[2])[-1]
        message = CONTROL.sub(" ", f"{type(exc).__name__}: {exc}")[:300]
        raise ConfigError([f"{path}:{frame.lineno}: recipe failed: {message}"]) from None
    if not isinstance(result, Recipe):
        raise ConfigError([f"{path}: recipe(site) returned {type(result).__name__}, not a Recipe"])
    problems = check_recipe(result, str(path))
    if problems:
        raise ConfigError(problems)
    result.directory = path.parent
    entry = (search or default_search_path()).find(RECIPES, spec) if Path(spec).suffix != ".py" else None
    result.ref = spec if entry and entry.repo.origin != "--repo" else str(path)
    return result
