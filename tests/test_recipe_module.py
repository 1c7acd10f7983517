"""Recipes load as Python modules of their own: no future imports inherited from hpcstack,
registered in ``sys.modules``, dataclasses and type hints work; anything a recipe raises is one
line naming the recipe file and its line, exit status 2, nothing written."""

from __future__ import annotations

import sys
import textwrap
import typing
from pathlib import Path

import pytest

from conftest import hpcstack, make_sdist, write_tiny_recipe
from hpcstack.errors import ConfigError
from hpcstack.install.plan import INSTALL
from hpcstack.install.resolve import resolve
from hpcstack.recipe import load_recipe, module_name
from hpcstack.site import load_site

pytestmark = pytest.mark.unit

HEAD = """\
from hpcstack.install.components import Imports, Modulefile, StackTools, Venv
from hpcstack.recipe import Recipe
"""


def write(root: Path, body: str, name: str = "1.0.py") -> Path:
    path = root / "mine" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEAD + textwrap.dedent(body))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


DATACLASS_RECIPE = '''\
"""A recipe with a component of its own, a dataclass with type hints."""
import os
from dataclasses import dataclass, field
from hpcstack.install.actions import WriteFile
from hpcstack.install.plan import INSTALL


@dataclass(frozen=True)
class Motd:
    """Write <prefix>/motd."""
    text: str
    extra: list[str] = field(default_factory=list)

    def contribute(self, ctx) -> dict[str, list]:
        return {INSTALL: [WriteFile(os.path.join(ctx.build_prefix, "motd"), self.text + "\\n")]}


def recipe(site):
    return Recipe("mine", "1.0", whatis="mine", components=[
        Venv(),
        Motd("hello"),
        Modulefile(),
    ])
'''


def test_a_recipe_with_a_dataclass_loads_as_a_module_of_its_own(tmp_path):
    path = write(tmp_path, DATACLASS_RECIPE)
    site = load_site("localhost")
    recipe = load_recipe(str(path), site)
    motd = recipe.components[1]
    module = sys.modules[module_name(path)]
    assert type(motd).__module__ == module.__name__ and module.__file__ == str(path)
    # no `from __future__ import annotations` inherited: annotations are real types
    assert type(motd).__annotations__["text"] is str
    assert typing.get_type_hints(type(motd)) == {"text": str, "extra": list[str]}
    plan = resolve(recipe, site, python_version="3.11")
    install = next(s for s in plan.steps if s.name == INSTALL)
    assert any("motd" in a.to_bash() and "hello" in a.to_bash() for a in install.actions)
    # loading it again replaces the module; another file gets a name of its own
    load_recipe(str(path), site)
    assert module_name(path) != module_name(write(tmp_path, DATACLASS_RECIPE, "2.0.py"))


@pytest.mark.parametrize("body, marker, says", [
    ("def recipe(site):\n    return Recipe('mine', '1.0', whatis='x', components=[\n        Venv(),\n        x = 1,\n    ])\n",
     "x = 1", "syntax error in recipe"),
    ("def recipe(site):\n    return Recipe('mine', '1.0', whatis='x', components=[Venv(), Modulfile()])\n",
     "Modulfile()", "recipe failed: NameError: name 'Modulfile' is not defined"),
    ("import no_such_module_xyz\n", "import no_such_module_xyz",
     "recipe failed: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("def recipe(site):\n    return Recipe('mine', '1.0', whatis='x', components=[\n        Venv(),\n"
     "        'Modulefile()',\n    ])\n", "'Modulefile()'",
     "component 2 of the recipe is str 'Modulefile()', not a component"),
    ("from hpcstack.install.components import HorovodBuild\n"
     "def recipe(site):\n    return Recipe('mine', '1.0', whatis='x', components=[\n        Venv(),\n"
     "        HorovodBuild(cpu_operations='TCP'),\n    ])\n", "cpu_operations='TCP'",
     "recipe failed: ValueError: cpu_operations 'TCP': one of MPI, Gloo, CCL"),
    ("from dataclasses import dataclass\n@dataclass\nclass Broken:\n    a: int = 1\n    b: int\n",
     "@dataclass", "recipe failed: TypeError: non-default argument 'b' follows default argument"),
    ("def recipe(site):\n    raise RuntimeError('first line\\nsecond line')\n", "raise RuntimeError",
     "recipe failed: RuntimeError: first line second line"),
])
def test_anything_a_recipe_raises_is_one_line_naming_its_file_and_line(tmp_path, body, marker, says):
    path = write(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_recipe(str(path), load_site("localhost"))
    (line,) = err.value.lines()
    assert line.startswith(f"{path}:{line_of(path, marker)}: "), line
    assert says in line, line


def test_the_command_says_it_in_one_line_with_exit_status_2_and_writes_nothing(tmp_path):
    path = write(tmp_path, "def recipe(site):\n    return Recipe('mine', '1.0', whatis='x', components=[Venv(), 42])\n")
    proc = hpcstack("install", str(path), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                    "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}:{line_of(path, '42')}:" in lines[0] and "int 42" in lines[0], proc.stderr
    assert not (tmp_path / "sw").exists() and not (tmp_path / "mf").exists()


def test_the_tiny_and_pytorch_recipes_still_load(tmp_path):
    site = load_site("localhost")
    assert load_recipe("pytorch/2.3.1-gpu", site).full_name == "pytorch/2.3.1-gpu"
    tiny = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    assert load_recipe(str(tiny), site).full_name == "tiny/1.0"
