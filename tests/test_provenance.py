"""Provenance in the prefix (plan as JSON, recipe and site as used, lock, logs, pip freeze,
check-build output, hpcstack version), ``hpcstack show`` and ``hpcstack uninstall``."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
from pathlib import Path

import pytest

from conftest import CHECK_BUILD_CPU as CHECK_BUILD
from conftest import hpcstack, make_sdist, write_tiny_recipe
from hpcstack import __version__
from hpcstack.install.components.horovod import CheckBuild

pytestmark = pytest.mark.unit



def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_plan_as_json_is_the_plan_as_bash():
    bash = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run")
    js = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run", "--json")
    assert bash.returncode == 0 and js.returncode == 0, bash.stderr + js.stderr
    plan = json.loads(js.stdout)
    assert plan["hpcstack"] == __version__
    assert plan["prefix"] == "/work/y07/shared/cirrus-software/pytorch/2.3.1-gpu"
    assert re.fullmatch(r"/work/y07/shared/cirrus-software/pytorch/\.2\.3\.1-gpu-[0-9a-f]{12}",
                        plan["stage_prefix"])
    assert f"# stage prefix: {plan['stage_prefix']} (build {plan['build_id']})" in bash.stdout
    for step in plan["steps"]:
        assert step["script"] in bash.stdout  # the same objects, two renderings
        assert re.fullmatch(r"[0-9a-f]{64}", step["hash"])
    module = plan["steps"][-1]
    assert module["name"] == "module" and module["actions"][0]["type"] == "Publish"
    assert module["actions"][0]["target"] == plan["stage_prefix"]


def test_check_build_output_is_kept_in_the_build(tmp_path):
    fake = tmp_path / "horovodrun"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{CHECK_BUILD}EOF\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    class Ctx:
        env = dict(os.environ)
        log = io.StringIO()
        state_dir = tmp_path / ".hpcstack"

    CheckBuild(str(fake), ("PyTorch", "MPI", "Gloo")).execute(Ctx)
    assert (tmp_path / ".hpcstack" / "check-build.txt").read_text() == CHECK_BUILD


# ------------------------------------------------------------------ on a real tiny install

@pytest.fixture(scope="module")
def tiny(tmp_path_factory, localhost_ready):
    root = tmp_path_factory.mktemp("prov")
    recipe = write_tiny_recipe(root / "recipes", make_sdist(root))
    args = ["--site", "localhost", "--prefix", str(root / "sw"), "--module-root", str(root / "mf")]
    proc = hpcstack("install", str(recipe), *args)
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "recipe": recipe, "args": args, "prefix": root / "sw" / "tiny" / "1.0",
            "modulefile": root / "mf" / "tiny" / "1.0", "where": args[2:]}


@pytest.mark.integration
def test_the_build_records_plan_recipe_site_lock_logs_freeze_and_version(tiny):
    state = tiny["prefix"] / ".hpcstack"
    plan = json.loads((state / "plan.json").read_text())
    assert plan["stage_prefix"] == os.path.realpath(tiny["prefix"]) and plan["prefix"] == str(tiny["prefix"])
    recipe_dir = Path(tiny["recipe"]).parent
    for rel in ("1.0.py", "1.0.pypi.lock", "patches/tiny.patch"):
        assert _sha(state / "recipe" / rel) == _sha(recipe_dir / rel), rel
    record = json.loads((state / "provenance.json").read_text())
    assert record["hpcstack"] == __version__ and record["build_id"] == plan["build_id"]
    assert record["site"]["name"] == "localhost" and record["site"]["sha256"] == _sha(state / "site.yaml")
    assert record["recipe"]["inputs"]["1.0.pypi.lock"] == _sha(recipe_dir / "1.0.pypi.lock")
    used = json.loads((state / "site.json").read_text())
    assert used["install_root"] == str(tiny["root"] / "sw")  # --prefix as used
    freeze = (state / "pip-freeze.txt").read_text().splitlines()
    assert "six==1.16.0" in freeze and "tinypkg==1.0" in freeze
    for step in plan["steps"]:
        assert (state / "logs" / f"{step['name']}.log").is_file()
        assert json.loads((state / "steps" / f"{step['name']}.json").read_text())["hash"] == step["hash"]
    assert (state / "install.sh").read_text().startswith("#!/bin/bash")


@pytest.mark.integration
@pytest.mark.parametrize("how", ["name", "prefix"])
def test_show_prints_the_record(tiny, how):
    target = ["tiny/1.0", "--site", "localhost", "--prefix", str(tiny["root"] / "sw")] if how == "name" \
        else [str(tiny["prefix"])]
    proc = hpcstack("show", *target)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"prefix:        {tiny['prefix']} -> {os.path.realpath(tiny['prefix'])}" in out
    assert f"built by:      hpcstack {__version__}" in out
    assert re.search(r"^  wheels\s+done\s", out, re.M) and re.search(r"^  module\s+done\s", out, re.M)
    assert "==> pip-freeze.txt" in out and "tinypkg==1.0" in out
    assert "recipe/1.0.pypi.lock" in out and "logs/build.log" in out


@pytest.mark.integration
def test_show_one_file_and_json(tiny):
    proc = hpcstack("show", str(tiny["prefix"]), "--file", "plan.json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["steps"][0]["name"] == "fetch"
    proc = hpcstack("show", str(tiny["prefix"]), "--json")
    info = json.loads(proc.stdout)
    assert info["provenance"]["hpcstack"] == __version__ and "module" in info["steps"]
    proc = hpcstack("show", str(tiny["prefix"]), "--file", "nothing.txt")
    assert proc.returncode == 1 and "no recorded file 'nothing.txt'" in proc.stderr


def test_show_of_a_stack_that_is_not_installed_is_one_line(tmp_path):
    proc = hpcstack("show", "tiny/9.9", "--site", "localhost", "--prefix", str(tmp_path))
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "tiny/9.9 is not installed under" in proc.stderr


@pytest.mark.integration
def test_uninstall_refuses_the_default_version(tiny):
    mdir = tiny["modulefile"].parent
    (mdir / ".version").write_text('#%Module\nset ModulesVersion "1.0"\n')
    proc = hpcstack("uninstall", "tiny/1.0", *tiny["args"])
    assert proc.returncode == 1
    assert f"refusing to uninstall tiny/1.0: it is the default version of tiny ({mdir / '.version'})" in proc.stderr
    assert tiny["modulefile"].is_file() and os.path.isdir(tiny["prefix"])
    proc = hpcstack("uninstall", "tiny/1.0", *tiny["args"], "--force", "--dry-run")
    assert proc.returncode == 0 and f"would remove {tiny['modulefile']}" in proc.stdout
    assert f"would remove {os.path.realpath(tiny['prefix'])}\n" in proc.stdout  # the build, beside the prefix
    assert f"would remove {tiny['prefix'].parent}\n" not in proc.stdout  # not the directory of every version
    assert tiny["modulefile"].is_file()


@pytest.mark.integration
def test_uninstall_removes_modulefile_then_prefix(tiny):
    """Last of the tests on the shared install: it removes it."""
    mdir = tiny["modulefile"].parent
    (mdir / ".version").write_text('#%Module\nset ModulesVersion "2.0"\n')  # another version is the default
    build = os.path.realpath(tiny["prefix"])
    proc = hpcstack("uninstall", "tiny/1.0", *tiny["args"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"removed {tiny['modulefile']}" and lines[1] == f"removed {tiny['prefix']}"
    assert not tiny["modulefile"].exists() and not os.path.lexists(tiny["prefix"]) and not os.path.exists(build)
    assert (mdir / ".version").exists()  # not this version's marker: left alone
    proc = hpcstack("uninstall", "tiny/1.0", *tiny["args"])
    assert proc.returncode == 1 and "tiny/1.0 is not installed" in proc.stderr


# ------------------------------------------------------------------ show DIR follows no link below DIR

def _build_with_record(tmp_path) -> Path:
    build = tmp_path / "build"
    (build / ".hpcstack" / "steps").mkdir(parents=True)
    (build / ".hpcstack" / "provenance.json").write_text(json.dumps({"hpcstack": "build's own"}))
    (build / ".hpcstack" / "steps" / "venv.json").write_text(json.dumps({"step": "venv"}))
    return build


def test_show_refuses_a_link_at_the_builds_record_directory(tmp_path):
    """``show DIR`` with ``DIR/.hpcstack`` a link to someone else's record: refused in one line
    (the control: the same path read by name is what the link points at)."""
    from hpcstack.errors import ConfigError
    from hpcstack.install import provenance

    elsewhere = _build_with_record(tmp_path / "other") / ".hpcstack"
    (elsewhere / "provenance.json").write_text(json.dumps({"hpcstack": "not this build's"}))
    build = tmp_path / "build"
    build.mkdir()
    (build / ".hpcstack").symlink_to(elsewhere)
    with pytest.raises(ConfigError) as exc:
        provenance.describe(build)
    [line] = exc.value.lines()
    assert line.startswith(f"{build / '.hpcstack'}: a symbolic link; ")
    assert json.loads((build / ".hpcstack" / "provenance.json").read_text())["hpcstack"] == "not this build's"


def test_show_lists_and_reads_no_link_below_the_build(tmp_path):
    """Below DIR nothing is reached through a link: a linked ``logs``/``recipe`` or file is not
    listed, and a recorded path whose directory is swapped for a link afterwards is refused."""
    from hpcstack.gate import GateError
    from hpcstack.install import provenance

    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "secret.log").write_text("root's\n")
    (outside / "sub" / "r.py").write_text("root's\n")
    build = _build_with_record(tmp_path)
    state = build / ".hpcstack"
    (state / "logs").symlink_to(outside)
    (state / "recipe").mkdir()
    (state / "recipe" / "1.0.py").write_text("recipe\n")
    (state / "recipe" / "linked").symlink_to(outside / "sub")
    (state / "plan.json").symlink_to(outside / "secret.log")
    info = provenance.describe(build)
    assert info["provenance"] == {"hpcstack": "build's own"} and info["steps"] == {"venv": {"step": "venv"}}
    assert sorted(info["files"]) == ["provenance.json", "recipe/1.0.py"]
    assert provenance.read_recorded(info["files"]["recipe/1.0.py"]) == "recipe\n"
    (state / "recipe").rename(tmp_path / "recipe-moved")
    (state / "recipe").symlink_to(tmp_path / "recipe-moved")
    with pytest.raises(GateError, match="a symbolic link"):
        provenance.read_recorded(info["files"]["recipe/1.0.py"])
    assert provenance.read_json(Path(info["files"]["recipe/1.0.py"])) is None
