"""JAX 0.10.2 for CPUs: jax and jaxlib from PyPI, with multi-process collectives over Gloo.

The third framework beside PyTorch and mpi4py, from prebuilt wheels only (no source build, no
MPI in the stack): ``jax.distributed.initialize()`` reads the ranks of ``srun`` or ``mpirun``,
and jaxlib's CPU client runs collectives between processes over Gloo (JAX's default
``jax_cpu_collectives_implementation``).

Why 0.10.2 and not PyPI's newest (0.12.0.1, 2026-10-21): jax 0.11.0 (2026-07) and later require
Python >= 3.12, and the Python of localhost (Debian 12), Perlmutter and JUWELS Booster is 3.11
(their site configs). 0.10.2 (2026-06-17) is the newest release that installs on every shipped
site; a site with Python >= 3.12 can have a newer jax as a recipe of its own (copy this file,
``min_python="3.12"``, ``hpcstack lock``).
"""

from hpcstack.recipe_api import (Imports, Lock, Modulefile, PipWheels, Recipe, StackManifest, StackTools, Validation,
                                 Venv)


def recipe(site):
    return Recipe("jax", "0.10.2-cpu", whatis="JAX 0.10.2 (jax, jaxlib) for CPUs, multi-process over Gloo",
                  keywords=("machine learning", "automatic differentiation", "XLA", "numerical computing"),
                  components=[
        # a venv on the site's Python module
        Venv(),
        # jax, jaxlib, numpy, scipy, ml-dtypes, opt-einsum, every wheel pinned with hashes in
        # 0.10.2-cpu.pypi.lock; universal for Python >= 3.11 (jax 0.10.2's requires-python: with
        # the default min_python 3.10 `hpcstack lock` cannot resolve it)
        PipWheels("0.10.2-cpu", min_python="3.11", exclude_newer="2026-11-01", locks=(Lock("pypi"),)),
        # extend-venv-activate and a pip that says where packages go, in <prefix>/bin
        StackTools(),
        # <prefix>/.hpcstack/constraints.txt and the SBOM; PYTHONNOUSERSITE=1 in the module
        StackManifest(),
        # sanity check: JAX imports and finds its CPU backend
        Imports(("jax", "jax.numpy", "jax.experimental.multihost_utils")),
        # the modulefile jax/0.10.2-cpu; `module help` shows how to launch processes
        Modulefile(launch=(
            ("JAX across processes: call jax.distributed.initialize() first (it reads the ranks "
             "of srun or mpirun)", "srun python train.py"),
        ), cpu_note="The CPU build of JAX (jaxlib's CPU backend; collectives between processes over "
                    "Gloo); GPU nodes have jax/0.10.2-gpu."),
        # `hpcstack validate`: jax-validate, collectives and data-parallel training across processes
        Validation("0.10.2-cpu.validation.yaml"),
    ])
