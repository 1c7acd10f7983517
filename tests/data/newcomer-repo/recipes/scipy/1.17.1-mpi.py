"""scipy 1.17.1 with mpi4py: SciPy and NumPy from PyPI's wheels, mpi4py built against the site's MPI.

A small scientific-Python stack for MPI programs: the validation (scipy-validate) solves a sparse
linear system split by rows across the ranks (conjugate gradients with halo exchange) and checks
the answer against SciPy's serial solver on rank 0, and checks allreduce/allgather exactly.
"""

from hpcstack.recipe_api import (Imports, Lock, Modulefile, Mpi4pyBuild, PipWheels, Recipe, StackManifest, StackTools,
                                 Validation, Venv)


def recipe(site):
    return Recipe("scipy", "1.17.1-mpi", whatis="SciPy 1.17.1 and NumPy with mpi4py 4.1.2 built against the site's MPI",
                  keywords=("scientific computing", "sparse linear algebra", "MPI"),
                  components=[
        # a venv on the site's Python module
        Venv(),
        # scipy, numpy and mpi4py's build requirements, every wheel pinned with hashes
        PipWheels("1.17.1-mpi", min_python="3.11", exclude_newer="2026-11-01", locks=(Lock("pypi"),)),
        # mpi4py from the PyPI sdist (the sha256 recipes/mpi4py/4.1.2.py checks), with the site's mpicc
        Mpi4pyBuild(
            "mpi4py", "4.1.2",
            url="https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz",
            sha256="56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"),
        # extend-venv-activate and a pip that says where packages go, in <prefix>/bin
        StackTools(),
        # <prefix>/.hpcstack/constraints.txt and the SBOM; PYTHONNOUSERSITE=1 in the module
        StackManifest(),
        # sanity check: SciPy's sparse solvers and mpi4py's MPI extension load
        Imports(("numpy", "scipy", "scipy.sparse.linalg", "mpi4py.MPI")),
        # the modulefile scipy/1.17.1-mpi
        Modulefile(),
        # `hpcstack validate`: scipy-validate, exact collectives and a distributed CG solve
        Validation("1.17.1-mpi.validation.yaml"),
    ])
