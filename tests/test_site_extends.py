"""Site config overlays (``extends``): a site config that names another as its base is that base
merged with its own keys (mappings key by key, lists and scalars replaced, null removes a key); the
base is found on the same search path as ``--site`` and passes the same trust rule; an unknown base,
a cycle or an overlay without a name is one error line."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
import yaml

from conftest import hpcstack, unit_site
from hpcstack.errors import ConfigError
from hpcstack.repos import SearchPath
from hpcstack.site import load_site, merge_config

pytestmark = pytest.mark.unit


def _repo(root: Path, **configs: dict) -> Path:
    """A repository at ``root`` holding ``site-configs/<name>.yaml`` for each keyword."""
    (root / "site-configs").mkdir(parents=True, exist_ok=True)
    for name, data in configs.items():
        (root / "site-configs" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return root


def _load(repo: Path, name: str, **kw):
    return load_site(name, search=SearchPath.from_args([str(repo)], {}), **kw)


def test_merge_mappings_deep_lists_and_scalars_replaced_null_removes():
    base = {"a": {"x": 1, "y": [1, 2], "m": {"k": "v", "j": "w"}}, "b": 2, "c": [1]}
    overlay = {"a": {"y": [3], "m": {"j": None, "n": "new"}}, "b": None, "c": [], "d": "added"}
    assert merge_config(base, overlay) == {"a": {"x": 1, "y": [3], "m": {"k": "v", "n": "new"}},
                                           "c": [], "d": "added"}
    assert base["a"]["m"] == {"k": "v", "j": "w"}          # neither input changes


def test_an_overlay_is_its_base_with_its_own_keys(tmp_path):
    base = unit_site("cirrus", roots=tmp_path)
    repo = _repo(tmp_path / "repo", **{"cirrus-twin": {
        "extends": "cirrus", "name": "cirrus-twin",
        "python": {"version": "3.11"},
        "toolchain": {"cuda": None, "nccl": None},
        "build": {"env": {"CUDA_PATH": None}},
        "slurm": {"account": "twin-budget", "srun_options": []},
    }}, cirrus=base)
    site = _load(repo, "cirrus-twin")
    assert site.name == "cirrus-twin" and site.bases == (repo / "site-configs" / "cirrus.yaml",)
    assert site.python_version == "3.11"
    assert not site.toolchain.has_cuda and site.toolchain.nccl_home is None
    assert site.toolchain.cc == "mpicc" and site.toolchain.fc == "mpifort"     # the base's, kept
    assert site.build_env == {} and site.jobs == 8
    assert site.slurm["account"] == "twin-budget" and site.slurm["srun_options"] == []
    assert site.slurm["partition"] == "gpu" and site.slurm["task_options"] == "srun"
    assert site.modules.base == "python/3.12.1-gpu" and site.install_root == base["install_root"]
    assert "extends" not in site.raw and site.raw["name"] == "cirrus-twin"


def test_the_base_comes_from_the_search_path_like_any_site(tmp_path):
    # no cirrus in the repository: the built-in one is the base
    repo = _repo(tmp_path / "repo", t={"extends": "cirrus", "name": "t", "python": {"version": "3.11"}})
    site = _load(repo, "t")
    assert site.bases[0].name == "cirrus.yaml" and site.modules.tool == "environment-modules"
    # a chain: t2 -> t -> cirrus
    _repo(repo, t2={"extends": "t", "name": "t2", "description": "second"})
    site = _load(repo, "t2")
    assert [p.stem for p in site.bases] == ["t", "cirrus"] and site.description == "second"
    assert site.python_version == "3.11"


@pytest.mark.parametrize("configs, name, expected", [
    ({"t": {"extends": "nowhere", "name": "t"}}, "t", "t.yaml: extends: unknown site 'nowhere' (known: "),
    ({"a": {"extends": "b", "name": "a"}, "b": {"extends": "a", "name": "b"}}, "a",
     "b.yaml: extends: 'a' closes a cycle (a -> b -> a)"),
    ({"a": {"extends": "a", "name": "a"}}, "a", "a.yaml: extends: 'a' closes a cycle (a -> a)"),
    ({"t": {"extends": "cirrus"}}, "t", "t.yaml: name: required in a config that extends another"),
    ({"t": {"extends": "../cirrus", "name": "t"}}, "t", "t.yaml: extends: '../cirrus' is not a site name"),
    ({"t": {"extends": ["cirrus"], "name": "t"}}, "t", "t.yaml: extends: \"['cirrus']\" is not a site name"),
])
def test_a_bad_extends_is_one_line(tmp_path, configs, name, expected):
    repo = _repo(tmp_path / "repo", **configs)
    with pytest.raises(ConfigError) as err:
        _load(repo, name)
    assert len(err.value.problems) == 1, err.value.problems
    assert expected in err.value.problems[0], err.value.problems


def test_problems_of_the_merged_config_name_the_overlay_and_its_base(tmp_path):
    repo = _repo(tmp_path / "repo", t={"extends": "cirrus", "name": "t", "slurm": {"partition": None},
                                       "launcher": {"ranks": 0}})
    with pytest.raises(ConfigError) as err:
        _load(repo, "t")
    lines = err.value.problems
    assert len(lines) == 2, lines
    assert all(line.startswith(f"{repo / 'site-configs' / 't.yaml'} (extends cirrus.yaml): ") for line in lines)
    assert any("slurm.partition: missing key" in line for line in lines), lines
    assert any("launcher.ranks" in line for line in lines), lines


def test_check_file_sees_each_base_before_it_is_read(tmp_path):
    repo = _repo(tmp_path / "repo", a={"extends": "b", "name": "a"},
                 b={**unit_site("cirrus"), "name": "b", "extends": "cirrus"})
    seen = []
    _load(repo, "a", check_file=seen.append)
    assert [p.stem for p in seen] == ["b", "cirrus"]

    def refuse(path):
        raise ConfigError([f"{path}: refused"])
    with pytest.raises(ConfigError, match="b.yaml: refused"):
        _load(repo, "a", check_file=refuse)


def test_the_cli_loads_an_overlay_given_as_a_file(tmp_path):
    over = tmp_path / "mine.yaml"
    over.write_text(yaml.safe_dump({"extends": "localhost", "name": "mine", "description": "mine",
                                    "install_root": str(tmp_path / "sw"), "module_root": str(tmp_path / "mf"),
                                    "python": {"version": "3.11"}}))
    proc = hpcstack("install", "mpi4py/4.1.2", "--site", str(over), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "sw") in proc.stdout
    over.write_text(yaml.safe_dump({"extends": "nowhere", "name": "mine"}))
    proc = hpcstack("install", "mpi4py/4.1.2", "--site", str(over), "--dry-run")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "extends: unknown site 'nowhere'" in proc.stderr


@pytest.mark.integration
def test_a_base_another_account_owns_is_refused_as_a_site_file_is(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the trust rule applies to root only; run the tests as root")
    repo = _repo(tmp_path / "repo", t={"extends": "b", "name": "t"}, b={**unit_site("localhost"), "name": "b"})
    for p in [repo, *repo.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chown(repo / "site-configs" / "b.yaml", pwd.getpwnam("nobody").pw_uid, -1)
    proc = hpcstack("install", "mpi4py/4.1.2", "--site", "t", "--repo", str(repo), "--dry-run",
                    "--prefix", str(tmp_path / "sw"), "--module-root", str(tmp_path / "mf"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {repo / 'site-configs' / 'b.yaml'}: owned by nobody;"), proc.stderr


#: the sites with a twin overlay in twins/site-configs (<site>-twin.yaml): found, not listed
TWINS = tuple(sorted(p.name[:-len("-twin.yaml")]
                     for p in (Path(__file__).resolve().parents[1] / "twins" / "site-configs").glob("*-twin.yaml")))


@pytest.mark.parametrize("base", TWINS)
def test_each_site_twin_is_its_site_less_cuda_with_this_machines_python(base):
    from conftest import REPO
    repo = REPO / "twins"
    twin = _load(repo, f"{base}-twin")
    site = load_site(base)
    assert twin.bases == (site.path,) or [p.resolve() for p in twin.bases] == [site.path.resolve()]
    assert not twin.toolchain.has_cuda and twin.toolchain.nccl_home is None
    assert twin.python_version == "3.11" and "CUDA_PATH" not in twin.build_env
    assert "PROJECT" not in twin.install_root + twin.module_root
    # the module system, its load order and the jobs' shape stay the site's own
    assert twin.modules == site.modules and twin.launcher == site.launcher
    # the jobs' shape too, but for the budget, one thread per rank (this machine's 2 cores are
    # each node's) and Open MPI ranks that yield while they wait
    ours = ("account", "cpus_per_task", "env")
    assert ({k: v for k, v in twin.slurm.items() if k not in ours}
            == {k: v for k, v in site.slurm.items() if k not in ours})
    assert twin.slurm["cpus_per_task"] == 1
    assert twin.slurm["env"] == {**site.slurm.get("env", {}), "OMPI_MCA_mpi_yield_when_idle": "1"}
    text = (repo / "site-configs" / f"{base}-twin.yaml").read_text()
    # every overlaid key says why: each paragraph that sets one holds a comment
    for block in text.split("\n\n"):
        keys = [line for line in block.splitlines() if line[:1].isalpha()]
        if keys and not {k.split(":")[0] for k in keys} <= {"extends", "name", "description"}:
            assert "#" in block, block
