"""Exports: one recipe's plan for one site, written in another tool's format.

An exporter turns the resolved plan (the same :class:`hpcstack.install.plan.Plan` that
``hpcstack install`` runs) into a file another tool reads: a stand-alone install script, the plan
as JSON, container specs (Docker, Apptainer; :mod:`hpcstack.export.container`), and — as they
come — EasyBuild easyconfigs, ReFrame checks. A new
format is one class registered here with :func:`register_exporter`, in a module of this package
imported below; ``hpcstack export … --format NAME`` and its help pick it up from the registry.
"""

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


from hpcstack.export import container, easyconfig, script  # noqa: E402,F401  (registers the built-in formats)
