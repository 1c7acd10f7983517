"""hpcstack: install module-based HPC software stacks from recipes, one site at a time.

An admin runs one recipe (``recipes/<name>/<version>.py``) for one site
(``site-configs/<site>.yaml``); hpcstack resolves them into a plan of named steps, runs the plan
(or prints it as a bash script with ``--dry-run``), writes the modulefile and validates the stack.

The package by role: :mod:`hpcstack.install` (plan, runner, layout, resolve, lockfile, lockgen,
provenance, components), :mod:`hpcstack.modules` (modulefile writer, module tools,
``extend-venv-activate``), :mod:`hpcstack.validate` (validation, scheduler, launchers, judge,
render), :mod:`hpcstack.export`, :mod:`hpcstack.lifecycle`; :mod:`hpcstack.cli`,
:mod:`hpcstack.site`, :mod:`hpcstack.recipe` and the search path :mod:`hpcstack.repos` on top.
"""

from importlib import resources
from pathlib import Path

__version__ = "0.3.0"


def data_root() -> Path:
    """Return the built-in data: the directory that holds ``recipes/``, ``site-configs/``,
    ``modulefiles/``, ``templates/``, ``scripts/``, ``trainer/`` (the training program shipped
    into PyTorch stacks), ``examples/`` and ``requirements/``.

    They ship inside the package as ``hpcstack/data/`` (package data, read with
    :mod:`importlib.resources`); in a checkout ``hpcstack/data/*`` are links to the top-level
    directories of the same names. Sites add their own recipes and site configs in front of these
    with ``--repo``/``HPCSTACK_PATH`` (:mod:`hpcstack.repos`).

    Returns:
        Path: an absolute directory path.

    Raises:
        RuntimeError: the package is installed somewhere that is not a directory (a zip file):
            hpcstack needs its data as files (its templates and scripts are run and copied).
    """
    data = resources.files(__name__) / "data"
    if not isinstance(data, Path):
        raise RuntimeError(f"hpcstack's data {data} is not a directory; install hpcstack unzipped")
    return data
