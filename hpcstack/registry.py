"""Registries: named classes of one kind that a newcomer extends by adding one class.

Launchers and schedulers (:mod:`hpcstack.validate`), module tools and modulefile syntaxes
(:mod:`hpcstack.modules`) and export formats (:mod:`hpcstack.export`) are each a
:class:`Registry`, as ReFrame keeps its launchers and schedulers (``register_launcher``,
``register_scheduler``): a class decorated with the registry's :meth:`Registry.register` is found
by name from a site config or a command line, and nothing else needs editing.
"""

from __future__ import annotations

from typing import Callable


class Registry(dict):
    """Classes of one kind by name; a ``dict`` (``name in R``, ``sorted(R)``, ``R[name]``).

    Args:
        kind (str): what the classes are, for messages (``"launcher"``, ``"module tool"``).

    Example:
        ``LAUNCHERS = Registry("launcher")``, then ``@LAUNCHERS.register("srun")`` on a class.
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def add(self, name: str, cls: type) -> type:
        """Register ``cls`` as ``name`` (and set ``cls.name``); return it.

        Raises:
            ValueError: ``name`` is registered already (also to the same class: a second
                registration is a mistake worth hearing of).
        """
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is registered already ({self[name].__name__})")
        cls.name = name
        self[name] = cls
        return cls

    def register(self, name: str | None = None) -> Callable[[type], type]:
        """Class decorator: register the class as ``name`` (default its ``name`` attribute).

        Raises:
            ValueError: as :meth:`add`.
        """
        def decorate(cls: type) -> type:
            return self.add(name or cls.name, cls)
        return decorate

    def lookup(self, name: str) -> type:
        """The class registered as ``name``.

        Raises:
            ValueError: none is; the message lists the known names.
        """
        try:
            return self[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r} (known: {', '.join(sorted(self))})") from None
