"""The package's one jinja2 environment, for every template hpcstack ships.

Templates live in the built-in data (:func:`hpcstack.data_root`) and are named by their path
there: ``modulefiles/modulefile.tcl.j2``, ``scripts/extend-venv-activate.j2``,
``scripts/slurm-job.sh.j2``. They render with ``trim_blocks`` and ``lstrip_blocks`` (as Spack's
module templates do), ``StrictUndefined`` (a misspelt variable is an error, not an empty string),
the trailing newline kept and no HTML escaping (https://jinja.palletsprojects.com/en/3.1.x/api/,
"Environment").

Filters: ``pyrepr`` (Python's :func:`repr`, for values put into generated Python) here; the
modulefile syntaxes add their own quoting filters (``tcl_quote``, ``lua_quote``, …) with
:func:`add_filters` when they register (:mod:`hpcstack.modules.syntax`), so a new syntax brings
its filters in its own file.
"""

from __future__ import annotations

from typing import Callable

import jinja2

from hpcstack import data_root

#: Filters every template may use, by name; :func:`add_filters` adds more.
_FILTERS: dict[str, Callable] = {"pyrepr": repr}
_ENVIRONMENT: jinja2.Environment | None = None


def add_filters(filters: dict[str, Callable]) -> None:
    """Make ``filters`` available to every template.

    Args:
        filters (dict[str, Callable]): filter name -> function of the value (e.g.
            ``{"tcl_quote": tcl_quote}``).

    Raises:
        ValueError: a name already taken by a different function (two syntaxes must not
            quietly redefine each other's quoting).
    """
    for name, function in filters.items():
        if _FILTERS.get(name, function) is not function:
            raise ValueError(f"template filter {name!r} is defined twice")
        _FILTERS[name] = function
        if _ENVIRONMENT is not None:
            _ENVIRONMENT.filters[name] = function


def environment() -> jinja2.Environment:
    """Return the jinja2 environment (made on first use, then shared, so templates compile once).

    Returns:
        jinja2.Environment: loads templates from :func:`hpcstack.data_root` by relative path.

    Raises:
        RuntimeError: hpcstack's data is not a directory (see :func:`hpcstack.data_root`).
    """
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(data_root())),
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True, autoescape=False)
        env.filters.update(_FILTERS)
        _ENVIRONMENT = env
    return _ENVIRONMENT


def render(template: str, **variables) -> str:
    """Render one template.

    Args:
        template (str): its path under the built-in data, e.g. ``"modulefiles/modulefile.lua.j2"``.
        **variables: what the template sees (nothing else: undefined names are errors).

    Returns:
        str: the rendered text.

    Raises:
        jinja2.TemplateNotFound: no such template.
        jinja2.UndefinedError: the template uses a variable not given.
    """
    return environment().get_template(template).render(**variables)
