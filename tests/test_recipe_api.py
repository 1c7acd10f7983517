"""The recipe API: one façade (hpcstack.recipe_api) that every shipped recipe imports from alone;
the Component base with its declared hooks and step hooks (run_after / run_before);
Recipe.component / components_of; Validation beside the other components."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO
from hpcstack import recipe_api
from hpcstack.errors import ConfigError
from hpcstack.install.components.base import hook
from hpcstack.install.resolve import resolve
from hpcstack.recipe import load_recipe
from hpcstack.recipe_api import (INSTALL, MODULE, SANITYCHECK, Component, Modulefile, PipWheels, Recipe, Run,
                                 SetEnv, SourceBuild, Validation, Venv, run_after, run_before)
from hpcstack.site import load_site

pytestmark = pytest.mark.unit

#: The recipe files shipped with hpcstack and the example repository's.
RECIPE_FILES = sorted((REPO / "recipes").glob("*/*.py")) + sorted((REPO / "examples").glob("**/recipes/*/*.py"))


def test_the_facade_exports_exactly_its_names():
    namespace: dict = {}
    exec("from hpcstack.recipe_api import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(recipe_api.__all__)
    assert len(set(recipe_api.__all__)) == len(recipe_api.__all__)


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_recipe_imports_from_the_facade_alone(path):
    tree = ast.parse(path.read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    hpcstack_modules = {m for m in imported if m and m.split(".")[0] == "hpcstack"}
    assert hpcstack_modules == {"hpcstack.recipe_api"}, (path, hpcstack_modules)


def test_every_component_of_the_facade_is_a_component():
    kinds = [getattr(recipe_api, n) for n in recipe_api.__all__]
    components = sorted(k.__name__ for k in kinds if isinstance(k, type) and issubclass(k, Component)
                        and k is not Component)
    assert components == sorted(["Venv", "PipWheels", "SourceBuild", "HorovodBuild", "Mpi4pyBuild", "CudaWheelArchs", "Imports",
                                 "StackTools", "Trainer", "StackManifest", "Modulefile", "Validation"])


def test_validation_is_one_class_at_its_old_path_and_beside_the_components():
    from hpcstack.install import components
    from hpcstack.validate import workload

    assert components.Validation is Validation is workload.Validation
    assert Validation.__module__ == "hpcstack.install.components.validation"


# ----------------------------------------------------------------------------- the step hooks

@dataclass(frozen=True)
class Marked(Component):
    """Echo words in the install step; step hooks before and after, one in a step of its own."""

    def contribute(self, ctx):
        return {INSTALL: [Run(("echo", "own"))]}

    @run_before(INSTALL)
    def first(self, ctx):
        return [Run(("echo", "before"))]

    @run_after(INSTALL)
    def last(self, ctx):
        return [Run(("echo", "after", ctx.build_prefix))]

    @run_after(SANITYCHECK)
    def check(self, ctx):
        return [Run(("echo", "checked"))]


@dataclass(frozen=True)
class MoreMarked(Marked):
    """Inherits the hooks; replaces ``check`` with a plain method (no longer a hook), adds one."""

    def check(self, ctx):
        return [Run(("echo", "not a hook"))]

    @run_after(INSTALL)
    def later(self, ctx):
        return [Run(("echo", "later"))]


def plan_of(tmp_path, *components):
    site = load_site("localhost", install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"))
    recipe = Recipe("mine", "1.0", whatis="mine", components=[Venv(), *components, Modulefile()],
                    directory=tmp_path)
    return resolve(recipe, site, python_version="3.11", stage_prefix=str(tmp_path / "sw" / "mine" / ".1.0-test"))


def echoed(plan, step: str) -> list[str]:
    """The words after ``echo`` of the step's echo actions, in order."""
    actions = next(s for s in plan.steps if s.name == step).actions
    return [" ".join(a.argv[1:]) for a in actions if isinstance(a, Run) and a.argv[:1] == ("echo",)]


def test_step_hooks_run_before_and_after_the_components_own_actions(tmp_path):
    plan = plan_of(tmp_path, Marked())
    assert echoed(plan, INSTALL) == ["before", "own", f"after {plan.stage_prefix}"]
    assert echoed(plan, SANITYCHECK) == ["checked"]


def test_a_subclass_inherits_step_hooks_and_a_plain_override_removes_one(tmp_path):
    assert MoreMarked.step_hooks == (("before", INSTALL, "first"), ("after", INSTALL, "last"),
                                     ("after", INSTALL, "later"))
    plan = plan_of(tmp_path, MoreMarked())
    assert echoed(plan, INSTALL) == ["before", "own", f"after {plan.stage_prefix}", "later"]
    assert echoed(plan, SANITYCHECK) == []


def test_a_step_hook_of_the_module_step_sees_the_stable_prefix(tmp_path):
    @dataclass(frozen=True)
    class Note(Component):
        @run_after(MODULE)
        def note(self, ctx):
            return [Run(("echo", ctx.prefix))]

    plan = plan_of(tmp_path, Note())
    assert echoed(plan, MODULE) == [plan.prefix] and plan.prefix != plan.stage_prefix


def test_a_step_hook_of_an_unknown_step_is_refused_where_the_class_is_defined():
    with pytest.raises(ValueError, match=r"run_after\('instal'\): no such step \(steps: fetch, venv"):
        run_after("instal")


def test_a_step_hook_that_returns_no_list_is_one_config_error(tmp_path):
    @dataclass(frozen=True)
    class Careless(Component):
        @run_after(INSTALL)
        def oops(self, ctx):
            return Run(("true",))

    with pytest.raises(ConfigError) as info:
        plan_of(tmp_path, Careless())
    assert info.value.problems == [
        f"mine/1.0: Careless: step hook oops(ctx) returned Run, not a list of actions "
        f"(check the site config {load_site('localhost').path} and the recipe)"]


def test_mpi4py_records_its_mpi_cfg_in_a_step_hook_after_its_install():
    site = load_site("localhost")
    recipe = load_recipe("mpi4py/4.1.2", site)
    build = recipe.component(SourceBuild)
    assert isinstance(build, recipe_api.Mpi4pyBuild) and type(build).__name__ == "CheckedMpi4pyBuild"
    assert type(build).step_hooks == (("after", INSTALL, "record_mpi_cfg"),)  # inherited
    plan = resolve(recipe, site, python_version="3.11")
    install = next(s for s in plan.steps if s.name == INSTALL).actions
    cfg = os.path.join(plan.stage_prefix, "venv", "lib", "python3.11", "site-packages", "mpi4py", "mpi.cfg")
    records = [i for i, a in enumerate(install) if isinstance(a, Run) and a.argv[-1:] == (cfg,)]
    # right after the build's own install (its wheel), before the next component's actions
    own = len(build.contribute(_context(recipe, site, plan))[INSTALL])
    assert records == [own], [a.to_bash()[:80] for a in install]


def _context(recipe, site, plan):
    from hpcstack.recipe_api import PlanContext
    return PlanContext(site=site, recipe=recipe, prefix=plan.prefix, stage_dir="", cache_dir=site.cache_dir,
                       python_version="3.11", jobs=1, modulefile=plan.modulefile)


# ------------------------------------------------------------- hooks of a plain (duck) component

class Plain:
    """A component by protocol only: contribute(ctx), no base class."""

    def contribute(self, ctx):
        return {}

    def module_environment(self, ctx):
        return [SetEnv("PLAIN", "1")]


def test_a_plain_component_gets_the_default_of_each_hook_it_lacks():
    plain = Plain()
    assert hook(plain, "module_environment")(None) == [SetEnv("PLAIN", "1")]
    assert hook(plain, "module_help")(None) == []
    assert hook(plain, "actions")(None) == {}
    with pytest.raises(KeyError, match="not a component hook"):
        hook(plain, "contribut")


# ------------------------------------------------------------------- finding a recipe's components

def test_a_recipe_finds_its_components_by_kind():
    site = load_site("localhost")
    recipe = load_recipe("pytorch/2.3.1-gpu", site)
    horovod = recipe.component(SourceBuild)
    assert type(horovod).__name__ == "HorovodBuild" and recipe.components_of(SourceBuild) == [horovod]
    assert recipe.component(PipWheels) is recipe.components[1]
    assert recipe.components_of(Component) == recipe.components
    mpi4py = load_recipe("mpi4py/4.1.2", site)
    assert mpi4py.component(recipe_api.Trainer) is None and mpi4py.components_of(recipe_api.Trainer) == []
    assert isinstance(mpi4py.component(Validation), Validation)


def test_the_example_recipe_directory_exists():
    """The parametrised checks above cover the shipped recipes and the example's."""
    names = {f"{p.parent.name}/{p.stem}" for p in RECIPE_FILES}
    assert {"pytorch/2.3.1-gpu", "pytorch/2.14.1-gpu", "mpi4py/4.1.2", "jax/0.10.2-cpu", "jax/0.10.2-gpu",
            "tiny/1.0"} <= names
    assert all(isinstance(p, Path) and p.is_file() for p in RECIPE_FILES)


# ---------------------------------------------------------------- the walk-through of docs/recipes.md

def walk_through(name: str) -> str:
    """The python block after ``<!-- walk-through: NAME -->`` in docs/recipes.md."""
    text = (REPO / "docs" / "recipes.md").read_text()
    after = text.split(f"<!-- walk-through: {name} -->\n", 1)[1]
    assert after.startswith("```python\n")
    return after[len("```python\n"):].split("\n```\n", 1)[0] + "\n"


@pytest.mark.parametrize("site_name, syntax", [("localhost", "tcl"), ("localhost-lmod", "lua")])
def test_the_component_walk_through_of_the_docs_plans_as_written(tmp_path, site_name, syntax):
    from hpcstack.install.actions import WriteFile

    path = tmp_path / "recipes" / "motd" / "1.0.py"
    path.parent.mkdir(parents=True)
    path.write_text(walk_through("motd"))
    site = load_site(site_name, install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"))
    recipe = load_recipe(str(path), site)
    plan = resolve(recipe, site, python_version="3.11", stage_prefix=str(tmp_path / "sw" / "motd" / ".1.0-test"))
    steps = {s.name: s.actions for s in plan.steps}
    motd = os.path.join(plan.stage_prefix, "share", "motd")
    assert [a.content for a in steps[INSTALL] if isinstance(a, WriteFile) and a.path == motd] == ["hello from motd/1.0\n"]
    assert steps[SANITYCHECK][-2].argv == ("grep", "-qxF", "hello from motd/1.0", motd)   # then pip freeze
    modulefile = next(a.content for a in steps[MODULE] if isinstance(a, WriteFile) and a.path == plan.modulefile)
    stable = os.path.join(plan.prefix, "share", "motd")
    assert {"tcl": f"setenv MOTD_FILE {{{stable}}}", "lua": f'setenv("MOTD_FILE", "{stable}")'}[syntax] in modulefile
    assert "Message of the day: $MOTD_FILE" in modulefile
