"""Typed environment changes that components contribute to the stack's modulefile.

As in Spack, where packages contribute ``EnvironmentModifications`` (``PrependPath``, ``SetEnv``,
``UnsetEnv``, …) and the module templates loop over them
(https://spack.readthedocs.io/en/latest/module_file_support.html), a component here returns
small frozen values from ``module_environment(ctx)`` and each modulefile syntax renders them:

=====================  ===========================  ==================================
change                 Tcl (Environment Modules)    Lua (Lmod)
=====================  ===========================  ==================================
``PrependPath(n, v)``  ``prepend-path n v``         ``prepend_path("n", "v")``
``AppendPath(n, v)``   ``append-path n v``          ``append_path("n", "v")``
``SetEnv(n, v)``       ``setenv n v``               ``setenv("n", "v")``
``UnsetEnv(n)``        ``unsetenv n``               ``unsetenv("n")``
=====================  ===========================  ==================================

On ``module unload`` both tools reverse each change: a path entry is removed, a set variable is
unset; an ``unsetenv`` is not undone (Environment Modules' ``unsetenv`` and Lmod's ``unsetenv``
manual pages).

Example, a component that tells the stack's users where its data is::

    @dataclass(frozen=True)
    class Datasets:
        def module_environment(self, ctx):
            return [SetEnv("HPCSTACK_DATASETS", f"{ctx.prefix}/datasets")]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

#: A variable name the shells and both tools accept (POSIX: letters, digits, underscore).
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check(name: str, value: str | None) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"environment variable name {name!r}: letters, digits and _, not starting "
                         "with a digit")
    if value is not None and (not isinstance(value, str) or "\x00" in value):
        raise ValueError(f"value of {name}: a string without NUL characters, got {value!r}")


@dataclass(frozen=True)
class EnvChange:
    """One change to the environment a modulefile makes; the base of the four kinds below.

    Attributes:
        name (str): the variable, e.g. ``"PATH"``.
        kind (str, class constant): what the templates switch on, the Tcl command:
            ``prepend-path``, ``append-path``, ``setenv`` or ``unsetenv`` (Lmod's function is the
            same name with ``_`` for ``-``).
    """

    name: str
    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        _check(self.name, getattr(self, "value", None))


@dataclass(frozen=True)
class PrependPath(EnvChange):
    """Put ``value`` first in the ``:``-separated path variable ``name``.

    Args:
        name (str): e.g. ``"PATH"``.
        value (str): one directory, not empty (an empty entry would mean the working directory).

    Raises:
        ValueError: a bad name, or an empty value.
    """

    value: str
    kind: ClassVar[str] = "prepend-path"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.value:
            raise ValueError(f"{self.kind} {self.name}: empty value")


@dataclass(frozen=True)
class AppendPath(PrependPath):
    """Put ``value`` last in the ``:``-separated path variable ``name`` (same arguments as
    :class:`PrependPath`)."""

    kind: ClassVar[str] = "append-path"


@dataclass(frozen=True)
class SetEnv(EnvChange):
    """Set ``name`` to ``value`` (unset again on unload).

    Args:
        name (str): e.g. ``"OMP_NUM_THREADS"``.
        value (str): the value (may be empty).

    Raises:
        ValueError: a bad name, or a value with a NUL character.
    """

    value: str
    kind: ClassVar[str] = "setenv"


@dataclass(frozen=True)
class UnsetEnv(EnvChange):
    """Unset ``name`` on load (not restored on unload, as both tools do).

    Args:
        name (str): e.g. ``"PYTHONHOME"``.

    Raises:
        ValueError: a bad name.
    """

    kind: ClassVar[str] = "unsetenv"


#: The kinds the templates know, by :attr:`EnvChange.kind`.
KINDS = {cls.kind: cls for cls in (PrependPath, AppendPath, SetEnv, UnsetEnv)}


def check_changes(changes, source: str) -> tuple[EnvChange, ...]:
    """Return ``changes`` as a tuple after checking each is one of the known kinds.

    Args:
        changes (Iterable[EnvChange]): what a component's ``module_environment`` returned.
        source (str): who returned them (for the error), e.g. the component's class name.

    Raises:
        ValueError: something that is not a :class:`PrependPath`, :class:`AppendPath`,
            :class:`SetEnv` or :class:`UnsetEnv`.
    """
    out = tuple(changes)
    for change in out:
        if not isinstance(change, EnvChange) or change.kind not in KINDS:
            raise ValueError(f"{source}.module_environment returned {change!r}; expected "
                             "PrependPath, AppendPath, SetEnv or UnsetEnv")
    return out
