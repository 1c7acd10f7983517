"""The users' `extend-venv-activate` tool, rendered for one stack module.

The tool is a standalone Python script (standard library only) installed into the stack's
bin/; it patches a user's venv so that activating it loads the stack module. Its source is the
Jinja template ``templates/extend-venv-activate.j2``; this module fills in the stack's values.
"""

from __future__ import annotations

import re

from hpcstack import templates

TEMPLATE_NAME = "templates/extend-venv-activate.j2"

# Characters module names use in practice; none is special to any shell, even unquoted.
_MODULE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/@%,=~-]*$")
_BAD_PATH_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def render_extend_venv_activate(module_name: str, module_init: dict[str, str], python: str) -> str:
    """Render the `extend-venv-activate` script for one stack module.

    Args:
        module_name (str): the module that activation loads, e.g. ``"pytorch/2.3.1-gpu"``:
            letters, digits and ``._+/@%,=~-``, starting with a letter or digit.
        module_init (dict[str, str]): shell -> absolute path of the module tool's init script,
            sourced on activation when the ``module`` command is missing. Keys used: ``"bash"``,
            ``"zsh"``, ``"sh"`` (dash and other POSIX shells), ``"fish"``, ``"csh"``; a shell
            without an entry gets a clear error on activation when ``module`` is missing. E.g.
            ``{"bash": "/usr/share/modules/init/bash", "fish": "/usr/share/modules/init/fish"}``.
        python (str): absolute path of the interpreter for the shebang (no whitespace, since
            the kernel splits shebang lines on it).

    Returns:
        str: the script's text; write it to the stack's bin/ and make it executable.

    Raises:
        ValueError: an argument does not meet the rules above.
        jinja2.TemplateError: the template is missing or broken.

    Example:
        >>> text = render_extend_venv_activate(
        ...     "pytorch/2.3.1-gpu", {"bash": "/usr/share/modules/init/bash"}, "/usr/bin/python3")
        >>> text.splitlines()[0]
        '#!/usr/bin/python3'
    """
    if not _MODULE_NAME_RE.match(module_name):
        raise ValueError(f"module_name {module_name!r} must be letters, digits and ._+/@%,=~- "
                         "starting with a letter or digit")
    for shell, init in module_init.items():
        if not init.startswith("/") or _BAD_PATH_CHARS.search(init):
            raise ValueError(f"module_init[{shell!r}] must be an absolute path without control "
                             f"characters, got {init!r}")
    if not python.startswith("/") or re.search(r"\s", python) or _BAD_PATH_CHARS.search(python):
        raise ValueError(f"python must be an absolute path without whitespace, got {python!r}")
    return templates.render(TEMPLATE_NAME, module_name=module_name, module_init=dict(module_init),
                            python=python)
