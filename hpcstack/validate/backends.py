"""The validation backends, by their earlier path: they live beside the ``Validation`` component
in :mod:`hpcstack.install.components.backends`; re-exported here for code that imports them from
``hpcstack.validate.backends``. New code imports them from there.
"""

from hpcstack.install.components.backends import (BACKENDS, Backend, Ddp, Horovod, Mpi, get_backend,  # noqa: F401
                                                   register_backend)

__all__ = ["BACKENDS", "Backend", "Ddp", "Horovod", "Mpi", "get_backend", "register_backend"]
