"""The registry of export formats (``hpcstack export --format NAME``): a format module registers
its exporter class here with :func:`register_exporter`; :mod:`hpcstack.export` imports the
built-in format modules and re-exports these names."""

from __future__ import annotations

from hpcstack.registry import Registry

#: Registered exporters by format name (``hpcstack export --format NAME``).
EXPORTERS = Registry("export format")


def register_exporter(cls: type) -> type:
    """Class decorator: register an exporter under its ``name``.

    An exporter class has ``name`` (str, the ``--format`` value), ``description`` (str, one line
    for the help), ``suffix`` (str, the usual file suffix) and ``render(recipe, site, plan) -> str``.

    Raises:
        ValueError: another class already has that name.
    """
    return EXPORTERS.add(cls.name, cls)


def get_exporter(name: str) -> type:
    """The exporter class registered as ``name``.

    Raises:
        ValueError: no such format (the message lists the known ones).
    """
    return EXPORTERS.lookup(name)
