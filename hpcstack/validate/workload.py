"""The recipe's validation declaration, by its earlier path: it lives with the other components
in :mod:`hpcstack.install.components.validation` (a recipe imports ``Validation`` from
:mod:`hpcstack.recipe_api`). The names are re-exported here for code that imports them from
``hpcstack.validate.workload``; new code imports them from there.
"""

from hpcstack.install.components.validation import (PLACEHOLDERS, SCHEMA, Figure, Program, Validation,  # noqa: F401
                                                     ValidationSpec, schema, validation_of)

__all__ = ["PLACEHOLDERS", "SCHEMA", "Figure", "Program", "Validation", "ValidationSpec", "schema", "validation_of"]
