"""One session per command (:mod:`hpcstack.session`): ``hpcstack.cli.main`` builds one
:class:`~hpcstack.session.Session`, and the command loads its site and its recipe once each,
looked up once on the search path, under one policy; a recipe is run again for another site only
as the session checked it (no fallback policy)."""

from __future__ import annotations

import argparse

import pytest

from hpcstack import recipe as recipe_mod
from hpcstack import session as session_mod
from hpcstack import site as site_mod
from hpcstack import trust
from hpcstack.cli import main
from hpcstack.errors import ConfigError

pytestmark = pytest.mark.unit


@pytest.fixture
def counted(monkeypatch):
    """Count sessions made, site and recipe loads and lookups, and policies made."""
    counts = {"sessions": 0, "load_site": 0, "load_recipe": 0, "site_path": 0, "recipe_path": 0, "policy": 0}
    real_init = session_mod.Session.__init__

    def init(self, *a, **k):
        counts["sessions"] += 1
        real_init(self, *a, **k)
    monkeypatch.setattr(session_mod.Session, "__init__", init)
    for module, name in ((site_mod, "load_site"), (site_mod, "site_path"), (recipe_mod, "load_recipe"),
                         (recipe_mod, "recipe_path"), (trust, "policy")):
        real = getattr(module, name)

        def wrapped(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        monkeypatch.setattr(module, name, wrapped)
    return counts


@pytest.mark.parametrize("argv", [
    ["install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run", "--json"],
    ["validate", "pytorch/2.3.1-gpu", "--site", "cirrus", "--nodes", "1,2", "--account", "y07", "--dry-run"],
], ids=["install", "validate"])
def test_a_command_builds_one_session_and_loads_its_site_and_recipe_once(counted, argv, capsys):
    assert main(argv) == 0, capsys.readouterr().err
    assert counted == {"sessions": 1, "load_site": 1, "load_recipe": 1, "site_path": 1, "recipe_path": 1,
                       "policy": 1}


def test_the_sessions_site_and_recipe_are_made_once_and_kept():
    args = argparse.Namespace(site="cirrus", recipe="pytorch/2.3.1-gpu", prefix=None, module_root=None)
    s = session_mod.Session.from_args(args)
    site, recipe = s.load()
    assert s.site is site and s.recipe is recipe and s.load() == (site, recipe)
    assert s.loads == {"site": 1, "recipe": 1}
    assert s.stack_of("pytorch/2.3.1-gpu") == ("pytorch", "2.3.1-gpu")
    assert s.loads == {"site": 1, "recipe": 1}


def test_a_recipe_is_run_again_only_as_a_session_checked_it(tmp_path):
    """The site inside a container image gets the recipe from the file the session checked, with
    its search path; a recipe that no session loaded is refused, not checked anew under a
    default policy."""
    s = session_mod.Session(site="cirrus", recipe="mpi4py/4.1.2")
    recipe = s.recipe
    again = session_mod.rerun_recipe(recipe, s.load_site("localhost"))
    assert again.file == recipe.file and again.full_name == recipe.full_name and again.ref == recipe.ref
    import dataclasses

    made_by_hand = dataclasses.replace(recipe, file=tmp_path / "elsewhere.py")
    with pytest.raises(ConfigError) as exc:
        session_mod.rerun_recipe(made_by_hand, s.site)
    assert "not loaded through this command's session" in str(exc.value)


def test_a_command_without_a_site_loads_none(counted, capsys):
    assert main(["list"]) == 0
    assert counted["sessions"] == 1 and counted["load_site"] == 0 and counted["load_recipe"] == 0
