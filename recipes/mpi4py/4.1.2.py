"""mpi4py 4.1.2 built from its sdist against the site's MPI, with the site's MPI compiler wrapper."""

from hpcstack.recipe_api import (Imports, Lock, Modulefile, Mpi4pyBuild, PipWheels, Recipe, Run, StackManifest,
                                 Validation, Venv)


class CheckedMpi4pyBuild(Mpi4pyBuild):
    """The shared mpi4py build (``MPICC`` the site's wrapper, the wrapper in the build-cache key,
    ``mpi.cfg`` recorded) with this recipe's sanity check: mpi4py-sanity requires
    ``mpi4py.get_config()`` to name that wrapper and ``MPI.Get_library_version()`` the version the
    wrapper reports."""

    def sanity_actions(self, ctx):
        script = str(ctx.recipe_file("mpi4py-sanity"))
        return [Run((ctx.python, script, ctx.site.toolchain.cc), input_files=(script,))]


def recipe(site):
    return Recipe("mpi4py", "4.1.2", whatis="mpi4py 4.1.2 (MPI for Python) built against the site's MPI",
                  components=[
        # a venv on the site's Python module
        Venv(),
        # what the build needs in the venv (setuptools, build, Cython), pinned with hashes
        PipWheels("4.1.2", locks=(Lock("pypi"),)),
        # mpi4py from the PyPI sdist (sha256 as PyPI lists it), compiled with the site's mpicc
        CheckedMpi4pyBuild(
            "mpi4py", "4.1.2",
            url="https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz",
            sha256="56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02"),
        # <prefix>/.hpcstack/constraints.txt and the SBOM; PYTHONNOUSERSITE=1 in the module
        StackManifest(),
        # sanity check: the MPI extension loads the site's MPI library
        Imports(("mpi4py", "mpi4py.MPI", "mpi4py.bench")),
        # the modulefile mpi4py/4.1.2
        Modulefile(),
        # `hpcstack validate`: mpi4py.bench's helloworld, ringtest and pingpong as JSON lines
        Validation("4.1.2.validation.yaml"),
    ])
