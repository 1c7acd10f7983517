"""The validation backends, by their earlier path: they live beside the ``Validation`` component
in :mod:`hpcstack.install.components.backends`; re-exported here for code that imports them from
``hpcstack.validate.backends``. New code imports them from there.
"""

from hpcstack.install.components.backends import (BACKENDS, DEFAULT_BACKENDS, Backend, get_backend,  # noqa: F401
                                                   register_backend)

#: The built-in backends by their earlier class names (now declarations).
Horovod, Ddp, Mpi = (DEFAULT_BACKENDS[n] for n in ("horovod", "ddp", "mpi"))

__all__ = ["BACKENDS", "DEFAULT_BACKENDS", "Backend", "Ddp", "Horovod", "Mpi", "get_backend", "register_backend"]
