"""hpcstack: install module-based HPC software stacks from recipes, one site at a time.

An admin runs one recipe (``recipes/<name>/<version>.py``) for one site
(``site-configs/<site>.yaml``); hpcstack resolves them into a plan of named steps, runs the plan
(or prints it as a bash script with ``--dry-run``), writes the modulefile and validates the stack.
"""

import os
from pathlib import Path

__version__ = "0.1.0"


def data_root() -> Path:
    """Return the directory that holds ``recipes/``, ``site-configs/``, ``modulefiles/`` and ``scripts/``.

    That is the project checkout (hpcstack is installed from it with ``pip install -e .``), or the
    directory named by the environment variable ``HPCSTACK_ROOT``.

    Returns:
        Path: an absolute directory path.
    """
    env = os.environ.get("HPCSTACK_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[1]
