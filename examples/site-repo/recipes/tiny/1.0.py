"""tiny 1.0: the example recipe of docs/recipes.md, a venv with one pinned wheel (six) and a module."""

from hpcstack.recipe_api import Imports, Modulefile, PipWheels, Recipe, StackManifest, StackTools, Venv


def recipe(site):
    return Recipe("tiny", "1.0", whatis="an example stack: six 1.17 in a venv on the site's Python",
                  components=[
        # a venv on the site's Python module
        Venv(),
        # every wheel pinned with its sha256 in 1.0.pypi.lock (`hpcstack lock tiny/1.0`)
        PipWheels("1.0"),
        # <prefix>/bin: extend-venv-activate (a user's venv on top of the stack) and a pip that
        # says where packages go; every module help names them
        StackTools(),
        # <prefix>/.hpcstack/constraints.txt and the SBOM; the module sets PYTHONNOUSERSITE=1
        StackManifest(),
        # sanity check: it imports
        Imports(("six",)),
        # the modulefile tiny/1.0, written last
        Modulefile(),
    ])
