"""The search path of recipes and site configs, through the real installed ``hpcstack``:
every ``--repo DIR``, then ``HPCSTACK_PATH``, then the built-in data shipped in the wheel; first
match wins. ``hpcstack list`` says where each entry comes from and what it shadows; bad
repositories and unknown names give one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import HPCSTACK, REPO, TEST_PYTHON, hpcstack, site_overlay

pytestmark = pytest.mark.unit

RECIPE = "pytorch/2.3.1-gpu"


def _json(*args: str, env: dict | None = None) -> dict:
    proc = hpcstack("list", "--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def builtin() -> Path:
    """The built-in data directory of the installed hpcstack, as its own listing names it."""
    listing = _json(env={"HPCSTACK_PATH": ""})
    [repo] = listing["search_path"]
    assert repo["origin"] == "built-in"
    return Path(repo["path"])


def _entry_lines(stdout: str) -> dict[str, str]:
    """``hpcstack list`` text: entry name -> the rest of its line (recipes and sites together)."""
    lines = {}
    for line in stdout.splitlines():
        if line.startswith("  "):
            name, _, rest = line.strip().partition(" ")
            lines[name] = rest.strip()
    return lines


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def _site(builtin: Path, name: str, base: str = "localhost", roots: Path | None = None, **changes) -> str:
    """A copy of the built-in site ``base`` named ``name``, stating its Python version (a dry-run
    of it loads no module: conftest.TEST_PYTHON); with ``roots``, its install and module roots live
    there, so that the test does not meet stacks the machine already holds (the README's main
    command publishes ``pytorch/2.3.1-gpu`` for ``localhost`` under /opt/hpcstack)."""
    data = yaml.safe_load((builtin / "site-configs" / f"{base}.yaml").read_text())
    data["name"] = name
    data.setdefault("python", {}).setdefault("version", TEST_PYTHON)
    if roots is not None:
        data["install_root"] = str(roots / "software")
        data["module_root"] = str(roots / "modulefiles")
    data.update(changes)
    return yaml.safe_dump(data)


def make_repo(root: Path, builtin: Path, *, recipe: bool = False, sites: dict | None = None) -> Path:
    """A site repository: ``recipes/pytorch/`` copied from the built-in one (lock files and
    patches included) when ``recipe``, and ``site-configs/<name>.yaml`` for each of ``sites``."""
    root.mkdir(parents=True)
    if recipe:
        shutil.copytree(builtin / "recipes" / "pytorch", root / "recipes" / "pytorch")
    if sites:
        (root / "site-configs").mkdir()
        for name, text in sites.items():
            (root / "site-configs" / f"{name}.yaml").write_text(text)
    return root


@pytest.fixture
def site_repo(tmp_path, builtin) -> Path:
    """A repository with its own site ``mysite`` and a ``pytorch/2.3.1-gpu`` that shadows the built-in one."""
    return make_repo(tmp_path / "site-repo", builtin, recipe=True, sites={"mysite": _site(builtin, "mysite")})


def test_list_shows_the_builtin_entries_as_built_in(builtin):
    proc = hpcstack("list", env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"search path: built-in ({builtin})"
    entries = _entry_lines(proc.stdout)
    for name in (RECIPE, "cirrus", "localhost", "localhost-lmod"):
        assert entries.get(name) == "built-in", proc.stdout
    # the package data of the installed wheel, not the checkout's recipes/ and site-configs/
    assert (builtin / "recipes" / "pytorch" / "2.3.1-gpu.py").is_file()
    assert (builtin / "site-configs" / "cirrus.yaml").is_file()
    if os.environ.get("HPCSTACK_TEST_INSTALLED"):
        assert not builtin.resolve().is_relative_to(REPO), builtin


def test_repo_entries_are_listed_with_their_repo_and_what_they_shadow(site_repo, builtin):
    proc = hpcstack("list", "--repo", str(site_repo), env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"search path: --repo {site_repo}; built-in ({builtin})"
    entries = _entry_lines(proc.stdout)
    assert entries[RECIPE] == f"--repo {site_repo}; shadows built-in ({builtin})"
    assert entries["mysite"] == f"--repo {site_repo}"  # new, shadows nothing
    assert entries["cirrus"] == "built-in" and entries["localhost"] == "built-in"


def test_a_site_config_that_shadows_a_built_in_one_is_listed_and_used(tmp_path, builtin):
    cirrus = yaml.safe_load((builtin / "site-configs" / "cirrus.yaml").read_text())
    cirrus["modules"]["base"] = "python/3.12.9-site"
    repo = make_repo(tmp_path / "repo", builtin, sites={"cirrus": yaml.safe_dump(cirrus)})
    proc = hpcstack("list", "--repo", str(repo), env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert _entry_lines(proc.stdout)["cirrus"] == f"--repo {repo}; shadows built-in ({builtin})"
    proc = hpcstack("install", RECIPE, "--site", "cirrus", "--repo", str(repo), "--dry-run",
                    env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert "module load python/3.12.9-site" in proc.stdout
    assert "python/3.12.1-gpu" not in proc.stdout
    # without the repository, the built-in cirrus again
    proc = hpcstack("install", RECIPE, "--site", "cirrus", "--dry-run", env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert "module load python/3.12.1-gpu" in proc.stdout


def test_hpcstack_path_is_searched_in_order(tmp_path, builtin):
    first = make_repo(tmp_path / "first", builtin, recipe=True, sites={"mysite": _site(builtin, "mysite")})
    second = make_repo(tmp_path / "second", builtin, recipe=True, sites={"other": _site(builtin, "other", roots=tmp_path / "roots")})
    env = {"HPCSTACK_PATH": f"{first}::{second}"}  # an empty element is ignored
    proc = hpcstack("list", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == (f"search path: HPCSTACK_PATH {first}; HPCSTACK_PATH {second}; "
                                           f"built-in ({builtin})")
    entries = _entry_lines(proc.stdout)
    assert entries[RECIPE] == (f"HPCSTACK_PATH {first}; shadows HPCSTACK_PATH {second}; "
                               f"shadows built-in ({builtin})")
    assert entries["mysite"] == f"HPCSTACK_PATH {first}"
    assert entries["other"] == f"HPCSTACK_PATH {second}"
    # and an install finds them there
    proc = hpcstack("install", RECIPE, "--site", "other", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"{first}/recipes/pytorch/2.3.1-gpu.pypi.lock" in proc.stdout


def test_repo_comes_before_hpcstack_path(tmp_path, builtin):
    repo = make_repo(tmp_path / "repo", builtin, recipe=True,
                     sites={"mysite": _site(builtin, "mysite", roots=tmp_path / "roots")})
    path = make_repo(tmp_path / "path", builtin, recipe=True,
                     sites={"mysite": _site(builtin, "mysite", install_root="/srv/from-path")})
    env = {"HPCSTACK_PATH": str(path)}
    listing = _json("--repo", str(repo), env=env)
    assert [(r["origin"], r["path"]) for r in listing["search_path"]] == [
        ("--repo", str(repo)), ("HPCSTACK_PATH", str(path)), ("built-in", str(builtin))]
    [recipe] = [e for e in listing["recipes"] if e["name"] == RECIPE]
    assert (recipe["origin"], recipe["repo"]) == ("--repo", str(repo))
    assert recipe["shadows"] == [str(path), str(builtin)]
    proc = hpcstack("install", RECIPE, "--site", "mysite", "--repo", str(repo), "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"{repo}/recipes/pytorch/2.3.1-gpu.pypi.lock" in proc.stdout
    assert str(path) not in proc.stdout and "/srv/from-path" not in proc.stdout
    assert f"# prefix: {tmp_path}/roots/software/pytorch/2.3.1-gpu" in proc.stdout  # the --repo's mysite
    # without --repo, HPCSTACK_PATH's mysite (its install_root) and recipe
    proc = hpcstack("install", RECIPE, "--site", "mysite", "--dry-run", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "# prefix: /srv/from-path/pytorch/2.3.1-gpu" in proc.stdout
    assert f"{path}/recipes/pytorch/2.3.1-gpu.pypi.lock" in proc.stdout


def test_list_json(site_repo, builtin):
    listing = _json("--repo", str(site_repo), env={"HPCSTACK_PATH": ""})
    assert set(listing) == {"search_path", "recipes", "site-configs"}
    recipes = {e["name"]: e for e in listing["recipes"]}
    sites = {e["name"]: e for e in listing["site-configs"]}
    assert recipes[RECIPE] == {"name": RECIPE, "path": str(site_repo / "recipes/pytorch/2.3.1-gpu.py"),
                               "origin": "--repo", "repo": str(site_repo), "shadows": [str(builtin)]}
    assert sites["mysite"] == {"name": "mysite", "path": str(site_repo / "site-configs/mysite.yaml"),
                               "origin": "--repo", "repo": str(site_repo), "shadows": []}
    assert sites["cirrus"] == {"name": "cirrus", "path": str(builtin / "site-configs/cirrus.yaml"),
                               "origin": "built-in", "repo": str(builtin), "shadows": []}
    assert [e["name"] for e in listing["site-configs"]] == sorted(sites)


def test_a_relative_repo_is_taken_from_the_working_directory(tmp_path, site_repo):
    proc = subprocess.run([*HPCSTACK, "list", "--json", "--repo", "site-repo"], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "HPCSTACK_PATH": ""}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["search_path"][0] == {"path": str(site_repo), "origin": "--repo"}


def test_unknown_recipe_names_the_search_path(site_repo, builtin):
    line = _one_error_line(hpcstack("install", "nope/1.0", "--repo", str(site_repo), "--dry-run",
                                    env={"HPCSTACK_PATH": ""}))
    assert "unknown recipe 'nope/1.0'" in line
    assert f"searched: --repo {site_repo}; built-in ({builtin})" in line
    known = line.split("(known: ", 1)[1].split(";", 1)[0].split(", ")
    assert RECIPE in known and "mpi4py/4.1.2" in known


def test_unknown_site_names_the_search_path(tmp_path, site_repo, builtin):
    other = make_repo(tmp_path / "other", builtin, sites={"x": _site(builtin, "x")})
    line = _one_error_line(hpcstack("install", RECIPE, "--site", "nosite", "--repo", str(site_repo),
                                    "--dry-run", env={"HPCSTACK_PATH": str(other)}))
    assert "unknown site 'nosite'" in line
    assert f"searched: --repo {site_repo}; HPCSTACK_PATH {other}; built-in ({builtin})" in line
    assert "mysite" in line and "cirrus" in line  # the known ones, the repositories' included


@pytest.mark.parametrize("command", [["list"], ["install", RECIPE, "--dry-run"]])
def test_a_repo_that_does_not_exist_is_one_line(tmp_path, command):
    missing = tmp_path / "no-such-repo"
    line = _one_error_line(hpcstack(*command, "--repo", str(missing), env={"HPCSTACK_PATH": ""}))
    assert line == f"error: --repo {missing}: no such directory"
    line = _one_error_line(hpcstack(*command, env={"HPCSTACK_PATH": str(missing)}))
    assert line == f"error: HPCSTACK_PATH {missing}: no such directory"


@pytest.mark.parametrize("command", [["list"], ["install", RECIPE, "--dry-run"]])
def test_a_directory_that_is_no_repository_is_one_line(tmp_path, command):
    plain = tmp_path / "plain"
    (plain / "recipe").mkdir(parents=True)  # neither recipes/ nor site-configs/
    (plain / "cirrus.yaml").write_text("name: cirrus\n")
    line = _one_error_line(hpcstack(*command, "--repo", str(plain), env={"HPCSTACK_PATH": ""}))
    assert line.startswith(f"error: --repo {plain}: not an hpcstack repository")
    proc = hpcstack(*command, "--repo", str(plain / "cirrus.yaml"), env={"HPCSTACK_PATH": ""})  # a file
    assert _one_error_line(proc) == f"error: --repo {plain / 'cirrus.yaml'}: no such directory"


def test_each_bad_repo_is_its_own_line(tmp_path):
    (tmp_path / "plain").mkdir()
    proc = hpcstack("list", "--repo", str(tmp_path / "missing"), "--repo", str(tmp_path / "plain"),
                    env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: --repo {tmp_path / 'missing'}: no such directory",
        f"error: --repo {tmp_path / 'plain'}: not an hpcstack repository (it holds neither recipes/ "
        "nor site-configs/)"]


def test_a_recipe_with_a_syntax_error_makes_list_fail_naming_file_and_line(tmp_path, builtin):
    repo = make_repo(tmp_path / "repo", builtin)
    bad = repo / "recipes" / "broken" / "1.0.py"
    bad.parent.mkdir(parents=True)
    bad.write_text('"""A broken recipe."""\nfrom hpcstack.recipe import Recipe\n\ndef recipe(site)\n'
                   '    return Recipe("broken", "1.0")\n')
    proc = hpcstack("list", "--repo", str(repo), env={"HPCSTACK_PATH": ""})
    line = _one_error_line(proc)
    assert line.startswith(f"error: {bad}:4: syntax error in recipe"), line
    assert "broken/1.0" in proc.stdout  # the listing itself is still printed
    line = _one_error_line(hpcstack("install", "broken/1.0", "--repo", str(repo), "--dry-run",
                                    env={"HPCSTACK_PATH": ""}))
    assert line.startswith(f"error: {bad}:4: syntax error in recipe"), line
    # the same repository without the broken recipe is fine
    bad.unlink()
    assert hpcstack("list", "--repo", str(repo), env={"HPCSTACK_PATH": ""}).returncode == 0


def test_a_site_whose_name_differs_from_its_file_is_refused_by_name(tmp_path, builtin):
    repo = make_repo(tmp_path / "repo", builtin, sites={"other": _site(builtin, "mysite")})
    line = _one_error_line(hpcstack("install", RECIPE, "--site", "other", "--repo", str(repo), "--dry-run",
                                    env={"HPCSTACK_PATH": ""}))
    path = repo / "site-configs" / "other.yaml"
    assert line == f"error: {path}: name: 'mysite' differs from the file name 'other'"


def test_install_dry_run_uses_the_repos_recipe(tmp_path, site_repo, builtin):
    # the site: localhost stating its Python (no module loads), from a repository without recipes
    sites = site_overlay(tmp_path / "sites", roots=tmp_path / "roots")
    args = ["install", RECIPE, "--site", "localhost", "--dry-run"]
    proc = hpcstack(*args, "--repo", str(site_repo), "--repo", str(sites), env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert f"-r {site_repo}/recipes/pytorch/2.3.1-gpu.pypi.lock" in proc.stdout
    assert f"{site_repo}/recipes/pytorch/patches/horovod-0.28.1-cxx17.patch" in proc.stdout
    assert str(builtin / "recipes") not in proc.stdout
    proc = hpcstack(*args, "--repo", str(sites), env={"HPCSTACK_PATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert f"-r {builtin}/recipes/pytorch/2.3.1-gpu.pypi.lock" in proc.stdout
    assert str(site_repo) not in proc.stdout


def test_a_directory_named_twice_is_searched_once_where_first_named(site_repo, builtin):
    env = {"HPCSTACK_PATH": f"{site_repo}:{builtin}"}
    listing = _json("--repo", str(site_repo), "--repo", f"{site_repo}/", "--repo", str(builtin), env=env)
    assert [(r["origin"], r["path"]) for r in listing["search_path"]] == [
        ("--repo", str(site_repo)), ("built-in", str(builtin))]
    sites = {e["name"]: e for e in listing["site-configs"]}
    assert sites["mysite"]["shadows"] == []  # not "shadows" itself
    assert sites["cirrus"]["origin"] == "built-in" and sites["cirrus"]["shadows"] == []
