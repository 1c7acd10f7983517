"""Exports: one recipe's plan for one site, written in another tool's format.

An exporter turns the resolved plan (the same :class:`hpcstack.install.plan.Plan` that
``hpcstack install`` runs) into a file another tool reads: a stand-alone install script, the plan
as JSON, container specs (Docker, Apptainer; :mod:`hpcstack.export.container`), and — as they
come — EasyBuild easyconfigs, ReFrame checks. A new
format is one class registered with :func:`hpcstack.export.formats.register_exporter`, in a module of
this package imported below; ``hpcstack export … --format NAME`` and its help pick it up from the registry.
"""

from __future__ import annotations

from hpcstack.export.formats import EXPORTERS, get_exporter, register_exporter  # noqa: F401  (the package's names)
from hpcstack.export import container, easyconfig, script  # noqa: F401  (registers the built-in formats)
