"""Modulefiles and module defaults: golden files for both syntaxes, then the rendered modulefiles and
the default-version files under the real tools that read them (Tcl under Environment Modules, Lua
and Tcl under Lmod), on small fake trees. The installed stack's own module, under both tools, is
checked at the end (e2e; skipped when no stack is installed).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from conftest import assert_golden, REPO, hpcstack, make_sdist, write_tiny_recipe
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install.components import Modulefile, StackTools, Venv
from hpcstack.install.components.modulefile import WriteDefault, render_for_prefix
from hpcstack.install.actions import WriteFile
from hpcstack.install.plan import MODULE
from hpcstack.install.resolve import resolve
from hpcstack.modules import writer
from hpcstack.modules.envchange import AppendPath, PrependPath, SetEnv, UnsetEnv
from hpcstack.modules.writer import ModuleContext, modulefile_path, render_modulefile, root_variable
from hpcstack.recipe import Recipe
from hpcstack.site import load_site
from moduletools import (BOOKKEEPING, ENVIRONMENT_MODULES, LMOD, InstalledStack, ModuleTool,
                         find_installed_stack, require)

pytestmark = pytest.mark.unit

GOLDEN = REPO / "tests" / "golden"
WHATIS = "PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1"
_BOOKKEEPING = re.compile(rf"^({BOOKKEEPING}|_|SHLVL|OLDPWD|PWD)=")


def context(prefix: str = "/sw/pytorch/2.3.1-gpu", version: str = "2.3.1-gpu") -> ModuleContext:
    return ModuleContext(
        name="pytorch", version=version, whatis=WHATIS,
        help_lines=["pytorch/2.3.1-gpu: PyTorch with Horovod", "", "  extend-venv-activate ~/myvenv"],
        prefix=prefix, root_variable=root_variable("pytorch"), depends_on=["python/3.12.1-gpu"],
        path_prepend=[f"{prefix}/bin", f"{prefix}/venv/bin"],
        pythonpath_prepend=[f"{prefix}/venv/lib/python3.12/site-packages"],
        recipe="pytorch/2.3.1-gpu", site="cirrus", hpcstack_version="0.1.0",
        whatis_lines=("Version: 2.3.1-gpu", "Packages: torch 2.3.1, horovod 0.28.1", "Keywords: pytorch, GPU"),
        venv_fence="# >>> hpcstack pytorch/2.3.1-gpu >>>",
        venv_warning="pytorch/2.3.1-gpu: the active venv @VENV@ is not extended; fix: extend-venv-activate @VENV@",
        export_all=True, status_file="/sw/modules/.hpcstack-status.json")


# ------------------------------------------------------------------------------- rendering

@pytest.mark.parametrize("syntax", ["tcl", "lua"])
def test_rendered_modulefile_matches_golden(syntax):
    text = render_modulefile(context(), syntax)
    golden = GOLDEN / f"pytorch-2.3.1-gpu.{syntax}"
    assert_golden(golden, text)


@pytest.mark.parametrize("syntax, needles", [
    ("tcl", ["depends-on python/3.12.1-gpu", "conflict pytorch", f"module-whatis {{Description: {WHATIS}}}",
             "proc ModulesHelp", "setenv HPCSTACK_PYTORCH_ROOT $root", "prepend-path PYTHONPATH"]),
    ("lua", ['depends_on("python/3.12.1-gpu")', 'family("pytorch")', f'whatis("Description: {WHATIS}")',
             "help([[", 'setenv("HPCSTACK_PYTORCH_ROOT", root)', 'prepend_path("PYTHONPATH"']),
])
def test_both_syntaxes_have_the_same_blocks(syntax, needles):
    text = render_modulefile(context(), syntax)
    for needle in needles:
        assert needle in text


def test_layout_follows_the_projection():
    assert modulefile_path("/m", "pytorch", "2.3.1-gpu", "tcl") == "/m/pytorch/2.3.1-gpu"
    assert modulefile_path("/m", "pytorch", "2.3.1-gpu", "lua") == "/m/pytorch/2.3.1-gpu.lua"


def test_paths_with_spaces_and_dollars_are_quoted(tmp_path):
    text = render_modulefile(context("/odd path/$x [y]"), "tcl")
    assert 'set root "/odd path/\\$x \\[y\\]"' in text or "set root {/odd path/$x [y]}" in text


def test_lua_help_survives_closing_brackets():
    ctx = replace(context(), help_lines=["a ]] and a ]=] inside", "end"])
    text = render_modulefile(ctx, "lua")
    assert "help([==[\na ]] and a ]=] inside\nend\n]==])" in text


@pytest.mark.parametrize("syntax, expected", [
    ("tcl", "set ModulesVersion {2.3.1-gpu}"),
    ("lua", 'module_version("pytorch/2.3.1-gpu", "default")'),
])
def test_default_file_names_the_version_and_how_to_change_it(syntax, expected):
    text = writer.render_default("pytorch", "2.3.1-gpu", syntax, site="cirrus")
    assert expected in text and writer.DEFAULT_MARKER in text
    assert "hpcstack module set-default pytorch/VERSION --site cirrus" in text
    if syntax == "tcl":
        assert text.startswith("#%Module")


def test_site_config_lua_needs_lmod():
    import yaml

    from hpcstack.site import check_config

    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["modules"]["syntax"] = "lua"
    assert check_config(data, "x.yaml") == ["x.yaml: modules.syntax: 'tcl' was expected"]
    data["modules"]["tool"] = "lmod"
    assert check_config(data, "x.yaml") == []


def test_site_schema_takes_tools_and_syntaxes_from_the_registries():
    from hpcstack.modules.modsys import TOOLS
    from hpcstack.modules.syntax import SYNTAXES
    from hpcstack.site import SCHEMA

    section = SCHEMA["properties"]["modules"]
    assert section["properties"]["tool"]["enum"] == list(TOOLS) == ["environment-modules", "lmod"]
    assert section["properties"]["syntax"]["enum"] == list(SYNTAXES) == ["tcl", "lua"]


# ------------------------------------------------------------------- under the real tools

@dataclass(frozen=True)
class Combo:
    """A module tool and the modulefile syntax it reads in this test."""

    tool: ModuleTool
    syntax: str

    @property
    def id(self) -> str:
        return f"{self.tool.short}-{self.syntax}"


COMBOS = [Combo(ENVIRONMENT_MODULES, "tcl"), Combo(LMOD, "lua"), Combo(LMOD, "tcl")]


@dataclass(frozen=True)
class Tree:
    """A module root with a fake base ``python/3.0`` (Tcl) and stacks written by hpcstack."""

    combo: Combo
    root: Path
    tmp: Path

    def add_stack(self, version: str) -> Path:
        """Write ``pytorch/<version>`` over a fake prefix with an importable ``fakestack``."""
        prefix = self.tmp / "sw" / "pytorch" / version
        (prefix / "bin").mkdir(parents=True)
        sp = prefix / "venv" / "lib" / "python3.11" / "site-packages"
        sp.mkdir(parents=True)
        (sp / "fakestack.py").write_text(f"WHERE = {version!r}\n")
        ctx = replace(context(str(prefix), version), depends_on=["python"], pythonpath_prepend=[str(sp)])
        mf = Path(modulefile_path(str(self.root), "pytorch", version, self.combo.syntax))
        mf.parent.mkdir(parents=True, exist_ok=True)
        mf.write_text(render_modulefile(ctx, self.combo.syntax))
        return prefix

    def bash(self, script: str) -> subprocess.CompletedProcess:
        return self.combo.tool.bash(script, modulepath=str(self.root))


@pytest.fixture(params=[pytest.param(c, id=c.id) for c in COMBOS])
def tree(request, tmp_path) -> Tree:
    combo: Combo = request.param
    require(combo.tool)
    root = tmp_path / "mf"
    pybin = tmp_path / "base" / "bin"
    pybin.mkdir(parents=True)
    (pybin / "python3").symlink_to("/usr/bin/python3")
    (root / "python").mkdir(parents=True)
    (root / "python" / "3.0").write_text(f"#%Module\nconflict python\nprepend-path PATH {pybin}\n")
    return Tree(combo, root, tmp_path)


def loaded_version(tree: Tree, what: str = "pytorch") -> str:
    """Load ``what`` in a fresh shell and return the pytorch version that got loaded."""
    proc = tree.bash(f"module load {what} && echo \"LOADED=$LOADEDMODULES\"")
    line = next((l for l in proc.stdout.splitlines() if l.startswith("LOADED=")), "")
    found = re.findall(r"pytorch/([^:]+)", line)
    assert len(found) == 1, (proc.stdout, proc.stderr)
    return found[0]


@pytest.mark.integration
def test_module_loads_its_dependency_and_unloads_cleanly(tree):
    prefix = tree.add_stack("2.3.1-gpu")
    bookkeeping = _BOOKKEEPING.pattern
    proc = tree.bash(f"""
    filter() {{ env | sort | grep -v -E '{bookkeeping}'; }}
    before=$(filter)
    module load pytorch/2.3.1-gpu || exit 1
    echo "LOADED=$LOADEDMODULES"
    echo "ROOT=$HPCSTACK_PYTORCH_ROOT"
    echo "PYTHONPATH=$PYTHONPATH"
    python3 -c 'import fakestack; print("IMPORT", fakestack.WHERE)'
    module unload pytorch/2.3.1-gpu
    echo "AFTER_LOADED=$LOADEDMODULES"
    [ "$before" = "$(filter)" ] && echo RESTORED || diff <(echo "$before") <(filter)
    """)
    out = proc.stdout
    assert "LOADED=python/3.0:pytorch/2.3.1-gpu\n" in out, proc.stderr
    assert f"ROOT={prefix}\n" in out
    assert f"PYTHONPATH={prefix}/venv/lib/python3.11/site-packages\n" in out   # no trailing colon
    assert "IMPORT 2.3.1-gpu" in out
    assert "RESTORED" in out, out
    assert "AFTER_LOADED=\n" in out  # depends-on unloaded python again


@pytest.mark.integration
def test_module_help_and_whatis(tree):
    tree.add_stack("2.3.1-gpu")
    proc = tree.bash("module help pytorch/2.3.1-gpu; module whatis pytorch/2.3.1-gpu")
    text = proc.stdout + proc.stderr
    assert "extend-venv-activate ~/myvenv" in text
    assert f"Description: {WHATIS}" in text


@pytest.mark.integration
def test_avail_and_spider_show_the_stack_with_its_whatis(tree):
    """`module avail` lists it; the whatis line shows in Lmod's `module spider` and in
    Environment Modules' `module search` (5.x has no spider)."""
    tree.add_stack("2.3.1-gpu")
    avail = tree.bash("module avail pytorch")
    assert "pytorch/2.3.1-gpu" in avail.stdout + avail.stderr
    if tree.combo.tool is LMOD:
        proc = tree.bash("module spider pytorch/2.3.1-gpu")
        text = proc.stdout + proc.stderr
        assert re.search(rf"Description:\s+{re.escape(WHATIS)}", text), text
        assert "module load pytorch/2.3.1-gpu" in text
    else:
        proc = tree.bash("module search Horovod")
        text = proc.stdout + proc.stderr
        assert f"pytorch/2.3.1-gpu: Description: {WHATIS}" in text, text


@pytest.mark.integration
def test_one_pytorch_at_a_time(tree):
    """Tcl `conflict` refuses a second version; Lua `family` swaps: never two loaded at once."""
    tree.add_stack("2.2.0-gpu")
    tree.add_stack("2.3.1-gpu")
    proc = tree.bash('module load pytorch/2.2.0-gpu; module load pytorch/2.3.1-gpu; echo "L=$LOADEDMODULES"')
    line = next(l for l in proc.stdout.splitlines() if l.startswith("L="))
    assert len(re.findall(r"pytorch/", line)) == 1, (line, proc.stderr)


# ------------------------------------------------ a component adds to the modulefile's environment

@dataclass(frozen=True)
class Greeting:
    """A component defined here, not in hpcstack: it adds variables to the stack's modulefile
    (and nothing to the install steps), without any change to the modulefile writer."""

    def contribute(self, ctx) -> dict:
        return {}

    def module_environment(self, ctx) -> list:
        return [SetEnv("TINY_GREETING", "hello from tiny"),
                PrependPath("TINY_DATA_PATH", f"{ctx.prefix}/data"),
                AppendPath("TINY_DATA_PATH", f"{ctx.prefix}/more data"),
                UnsetEnv("TINY_UNWANTED")]


#: The site that writes each syntax.
SITE_OF_SYNTAX = {"tcl": "localhost", "lua": "localhost-lmod"}


def greeting_recipe(directory: Path, extra=Greeting()) -> Recipe:
    """A tiny recipe: a venv, the stack's tools, the extra component, the modulefile."""
    return Recipe("tiny", "1.0", whatis="a tiny test stack",
                  components=[Venv(), StackTools(), extra, Modulefile()], directory=directory)


@pytest.mark.parametrize("syntax, lines", [
    ("tcl", ["setenv TINY_GREETING {hello from tiny}", "prepend-path TINY_DATA_PATH {PREFIX/data}",
             "append-path TINY_DATA_PATH {PREFIX/more data}", "unsetenv TINY_UNWANTED"]),
    ("lua", ['setenv("TINY_GREETING", "hello from tiny")', 'prepend_path("TINY_DATA_PATH", "PREFIX/data")',
             'append_path("TINY_DATA_PATH", "PREFIX/more data")', 'unsetenv("TINY_UNWANTED")']),
])
def test_a_component_adds_variables_to_the_modulefile(tmp_path, syntax, lines):
    """The install's plan (resolve) writes the component's changes into the modulefile of the
    site's syntax, after the stack's own PATH and PYTHONPATH, in the order the component gave."""
    site = load_site(SITE_OF_SYNTAX[syntax], install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"))
    plan = resolve(greeting_recipe(tmp_path), site, python_version="3.11")
    module_step = next(s for s in plan.steps if s.name == MODULE)
    text = next(a.content for a in module_step.actions if isinstance(a, WriteFile) and a.path == plan.modulefile)
    assert plan.modulefile == modulefile_path(str(tmp_path / "mf"), "tiny", "1.0", syntax)
    expected = [line.replace("PREFIX", plan.prefix) for line in lines]
    body = text.splitlines()
    positions = [body.index(line) for line in expected]
    assert positions == sorted(positions)
    pythonpath = max(i for i, line in enumerate(body) if "PYTHONPATH" in line)
    assert pythonpath < positions[0]


@pytest.mark.parametrize("returned", [["TINY=1"], [("TINY", "1")], [None]])
def test_a_component_that_returns_no_environment_change_is_one_config_error(tmp_path, returned):
    @dataclass(frozen=True)
    class Careless:
        def contribute(self, ctx) -> dict:
            return {}

        def module_environment(self, ctx) -> list:
            return returned

    site = load_site("localhost", install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"))
    with pytest.raises(ConfigError) as info:
        resolve(greeting_recipe(tmp_path, Careless()), site, python_version="3.11")
    assert len(info.value.problems) == 1
    assert "Careless.module_environment returned" in info.value.problems[0]


@pytest.mark.parametrize("make", [
    lambda: SetEnv("1ABC", "x"), lambda: SetEnv("A-B", "x"), lambda: PrependPath("P", ""),
    lambda: AppendPath("P", ""), lambda: SetEnv("A", "nul\x00"), lambda: UnsetEnv("A B"),
])
def test_bad_environment_changes_are_refused(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.integration
def test_the_component_sets_its_variables_on_load_and_unload_takes_them_away(tree):
    """Under the real tool: after `module load` the component's variables are set (the unset
    one is gone); after `module unload` they are unset again."""
    syntax = tree.combo.syntax
    site = load_site(SITE_OF_SYNTAX[syntax], module_root=str(tree.root))
    prefix = tree.tmp / "sw" / "tiny" / "1.0"
    (prefix / "venv").mkdir(parents=True)
    (prefix / "venv" / "pyvenv.cfg").write_text("")      # the module loads only where its stack is
    mf = Path(modulefile_path(str(tree.root), "tiny", "1.0", syntax))
    mf.parent.mkdir(parents=True)
    mf.write_text(render_for_prefix(site, greeting_recipe(tree.tmp), str(prefix), "3.11", syntax))
    proc = tree.bash("""
    show() {
        echo "$1TINY_GREETING=${TINY_GREETING-<unset>}"
        echo "$1TINY_DATA_PATH=${TINY_DATA_PATH-<unset>}"
        echo "$1TINY_UNWANTED=${TINY_UNWANTED-<unset>}"
    }
    export TINY_UNWANTED=bye
    module load tiny/1.0 || exit 1
    show LOADED_
    module unload tiny/1.0 || exit 1
    show UNLOADED_
    """)
    out = proc.stdout
    assert "LOADED_TINY_GREETING=hello from tiny\n" in out, proc.stderr
    assert f"LOADED_TINY_DATA_PATH={prefix}/data:{prefix}/more data\n" in out
    assert "LOADED_TINY_UNWANTED=<unset>\n" in out
    assert "UNLOADED_TINY_GREETING=<unset>\n" in out
    assert "UNLOADED_TINY_DATA_PATH=<unset>\n" in out


class _Log:
    """What an action needs to execute: a log."""

    def __init__(self):
        self.log = io.StringIO()


@pytest.mark.integration
def test_install_writes_a_default_only_when_there_is_none(tree):
    tree.add_stack("2.2.0-gpu")
    tree.add_stack("2.3.1-gpu")
    assert loaded_version(tree) == "2.3.1-gpu"           # no default: the highest version
    module_dir = str(tree.root / "pytorch")
    WriteDefault(module_dir, "pytorch", "2.2.0-gpu", tree.combo.syntax).execute(_Log())
    assert loaded_version(tree) == "2.2.0-gpu"           # the first install became the default
    WriteDefault(module_dir, "pytorch", "2.3.1-gpu", tree.combo.syntax).execute(_Log())
    assert loaded_version(tree) == "2.2.0-gpu"           # a later install does not move it


@pytest.mark.integration
def test_set_default_switches_and_switching_back_is_the_same_call(tree):
    tree.add_stack("2.2.0-gpu")
    tree.add_stack("2.3.1-gpu")
    root, syntax, tool = str(tree.root), tree.combo.syntax, tree.combo.tool.name
    first = writer.set_default(root, "pytorch", "2.2.0-gpu", syntax, tool)
    assert first.previous is None and loaded_version(tree) == "2.2.0-gpu"
    change = writer.set_default(root, "pytorch", "2.3.1-gpu", syntax, tool)
    assert change.previous == "2.2.0-gpu" and loaded_version(tree) == "2.3.1-gpu"
    avail = tree.bash("module avail pytorch")
    marker = "(D)" if tree.combo.tool is LMOD else "(default)"
    assert re.search(rf"pytorch/2\.3\.1-gpu\s*{re.escape(marker)}", avail.stdout + avail.stderr), avail
    back = writer.set_default(root, "pytorch", change.previous, syntax, tool)
    assert back.previous == "2.3.1-gpu" and loaded_version(tree) == "2.2.0-gpu"


def test_to_bash_writes_what_execute_writes(tmp_path):
    """The dry-run rendering of the install's default action does what the real run does."""
    for syntax in ("tcl", "lua"):
        a, b = tmp_path / syntax / "a", tmp_path / syntax / "b"
        a.mkdir(parents=True)
        b.mkdir(parents=True)
        WriteDefault(str(a), "pytorch", "2.3.1-gpu", syntax, "localhost").execute(_Log())
        script = WriteDefault(str(b), "pytorch", "2.3.1-gpu", syntax, "localhost").to_bash()
        for _ in range(2):   # the second run finds the default and leaves it
            subprocess.run(["bash", "-euo", "pipefail", "-c", script], check=True)
        name = writer.DEFAULT_FILES[syntax]
        assert (b / name).read_text() == (a / name).read_text()
        assert sorted(p.name for p in b.iterdir()) == [name]


def _tcl_tree(tmp_path: Path, versions=("2.2.0-gpu", "2.3.1-gpu")) -> Path:
    for v in versions:
        p = tmp_path / "pytorch" / v
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("#%Module\n")
    return tmp_path


def test_set_default_refuses_a_missing_version(tmp_path):
    root = _tcl_tree(tmp_path)
    with pytest.raises(HpcstackError, match=r"no modulefile pytorch/9.9 .*available: 2.2.0-gpu, 2.3.1-gpu"):
        writer.set_default(str(root), "pytorch", "9.9", "tcl", "environment-modules")
    with pytest.raises(HpcstackError, match="bad version"):
        writer.set_default(str(root), "pytorch", "../x", "tcl", "environment-modules")


@pytest.mark.parametrize("foreign", [".modulerc", ".version", ".modulerc.lua", "default"])
def test_set_default_refuses_a_default_file_it_did_not_write(tmp_path, foreign):
    root = _tcl_tree(tmp_path)
    path = root / "pytorch" / foreign
    if foreign == "default":
        path.symlink_to("2.2.0-gpu")
    else:
        path.write_text("#%Module\nmodule-version pytorch/2.2.0-gpu default\n")
    before = sorted(p.name for p in (root / "pytorch").iterdir())
    with pytest.raises(HpcstackError, match=f"{re.escape(str(path))}: not written by hpcstack"):
        writer.set_default(str(root), "pytorch", "2.3.1-gpu", "tcl", "environment-modules")
    assert sorted(p.name for p in (root / "pytorch").iterdir()) == before


def test_a_shared_tree_keeps_both_default_files_in_step(tmp_path):
    root = _tcl_tree(tmp_path)
    (root / "pytorch" / "2.4.0-gpu.lua").write_text("-- lua only\n")
    writer.set_default(str(root), "pytorch", "2.2.0-gpu", "tcl", "environment-modules")
    writer.set_default(str(root), "pytorch", "2.3.1-gpu", "lua", "lmod")
    assert writer.read_defaults(root / "pytorch") == {".version": "2.3.1-gpu", ".modulerc.lua": "2.3.1-gpu"}
    change = writer.set_default(str(root), "pytorch", "2.4.0-gpu", "lua", "lmod")
    assert writer.read_defaults(root / "pytorch") == {".version": "2.3.1-gpu", ".modulerc.lua": "2.4.0-gpu"}
    assert "no Tcl modulefile" in change.notes[0]
    assert writer.unset_default(str(root), "pytorch") and writer.read_defaults(root / "pytorch") == {}


def test_cli_set_default_prints_the_command_that_switches_back(tmp_path):
    root = _tcl_tree(tmp_path / "mf")
    args = ["--site", "localhost-lmod", "--module-root", str(root)]
    first = hpcstack("module", "set-default", "pytorch/2.2.0-gpu", *args)
    assert first.returncode == 0, first.stderr
    second = hpcstack("module", "set-default", "pytorch/2.3.1-gpu", *args)
    assert "(was 2.2.0-gpu)" in second.stdout
    back = second.stdout.split("switch back: ")[1].strip()
    assert back == f"hpcstack module set-default pytorch/2.2.0-gpu {' '.join(args)}"
    third = hpcstack(*back.split()[1:])
    assert third.returncode == 0 and "(was 2.3.1-gpu)" in third.stdout
    shown = hpcstack("module", "default", "pytorch", *args)
    assert "pytorch/2.2.0-gpu (default)" in shown.stdout.splitlines()
    bad = hpcstack("module", "set-default", "pytorch", *args)
    assert bad.returncode == 2 and "expected NAME/VERSION" in bad.stderr
    for target in ("../x", "pytorch/..", "a/b/c", "x y/1"):
        assert hpcstack("module", "set-default", target, *args).returncode == 2, target
    missing = hpcstack("module", "set-default", "pytorch/7.0", *args)
    assert missing.returncode == 1 and "error: no modulefile pytorch/7.0" in missing.stderr


@pytest.mark.integration
def test_the_site_switched_to_lmod_installs_a_lua_module_with_its_default(tmp_path, localhost_ready):
    """The tiny recipe through every step with --site localhost-lmod: the build environment
    comes from Lmod's python mode, the Lua modulefile and .modulerc.lua are written, the stack's
    extend-venv-activate initialises Lmod, and `module load tiny` under Lmod gives the package."""
    require(LMOD)
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    args = ["--site", "localhost-lmod", "--prefix", str(tmp_path / "sw"), "--module-root", str(tmp_path / "mf")]
    proc = hpcstack("install", str(recipe), *args)
    assert proc.returncode == 0, proc.stderr
    mdir = tmp_path / "mf" / "tiny"
    assert sorted(p.name for p in mdir.iterdir()) == [".modulerc.lua", "1.0.lua"]
    assert writer.read_defaults(mdir) == {".modulerc.lua": "1.0"}
    tool = tmp_path / "sw" / "tiny" / "1.0" / "bin" / "extend-venv-activate"
    assert "/usr/share/lmod/lmod/init/bash" in tool.read_text()
    run = LMOD.bash("module load tiny && echo \"LOADED=$LOADEDMODULES\" && "
                    "python -c 'import tinypkg; assert tinypkg.PATCHED; print(\"IMPORT\", tinypkg.__file__)'",
                    modulepath=f"{tmp_path / 'mf'}:/opt/hpcstack/base-modulefiles")
    assert re.search(r"^LOADED=python/3\.\d+:tiny/1\.0$", run.stdout, re.M), run.stderr
    # the stack's python imports from the published build by its real path
    assert f"IMPORT {os.path.realpath(tmp_path / 'sw' / 'tiny' / '1.0')}/venv/" in run.stdout


# ------------------------------------------------------------------- the installed stack

@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> InstalledStack:
    """The stack the e2e test installed (else the quickstart's); its Lua modulefile is rendered
    into a temporary root, as a localhost-lmod install would write it, the prefix untouched."""
    found = find_installed_stack(tmp_path_factory.mktemp("lua-modulefiles"))
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("combo", [pytest.param(c, id=c.id) for c in COMBOS])
def test_installed_stack_loads_and_unloads_cleanly(combo, installed):
    require(combo.tool)
    proc = combo.tool.bash(f"""
    filter() {{ env | sort | grep -v -E '{_BOOKKEEPING.pattern}'; }}
    before=$(filter)
    module load pytorch/2.3.1-gpu || exit 1
    echo "LOADED=$LOADEDMODULES"
    python -c 'import torch, horovod.torch; print("TORCH", torch.__version__, torch.__file__)'
    module unload pytorch/2.3.1-gpu
    [ "$before" = "$(filter)" ] && echo RESTORED || diff <(echo "$before") <(filter)
    """, modulepath=installed.modulepath(combo.syntax), timeout=300)
    assert re.search(r"LOADED=python/3\.\d+:pytorch/2\.3\.1-gpu\n", proc.stdout), proc.stderr
    assert "TORCH 2.3.1" in proc.stdout and f" {os.path.realpath(installed.prefix)}/venv/" in proc.stdout
    assert "RESTORED" in proc.stdout, proc.stdout


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_in_a_module_directory_is_no_modulefile_and_blocks_nothing(tmp_path, kind):
    """A FIFO (or a link to ``/dev/zero``) put where a Tcl modulefile is looked for: not a
    modulefile, answered at once (an ``open`` by name blocked on the FIFO for ever)."""
    import signal

    from hpcstack.modules.syntax import Tcl

    path = tmp_path / "1.0"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    (tmp_path / "2.0").write_text("#%Module\n")
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("blocked on the FIFO"))
    signal.alarm(5)
    try:
        assert Tcl()._is_modulefile(path) is False
        assert Tcl()._is_modulefile(tmp_path / "2.0") is True
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.unit
def test_a_version_link_is_followed_only_inside_the_module_root(tmp_path):
    """Tcl._is_modulefile opens with O_NOFOLLOW: a version link is read with readlink and
    followed only while its target stays in the module root, as named and as resolved; a link
    out of it (a root-only file, a device) is not a modulefile, and its target is never opened."""
    from hpcstack.modules.syntax import Tcl

    root, outside = tmp_path / "mods", tmp_path / "outside"
    (root / "pytorch").mkdir(parents=True)
    (root / "other").mkdir()
    outside.mkdir()
    (root / "pytorch" / "2.0").write_text("#%Module\n")
    (root / "other" / "3.0").write_text("#%Module\n")
    (outside / "mf").write_text("#%Module\n")
    (root / "evil").symlink_to(outside)
    links = {"2.1": "2.0", "2.2": "../other/3.0", "2.3": str(outside / "mf"), "2.4": "../evil/mf",
             "2.5": "2.5", "2.6": "2.1", "2.7": "/dev/zero", "2.8": "../../outside/mf"}
    for name, target in links.items():
        (root / "pytorch" / name).symlink_to(target)
    got = {name: Tcl()._is_modulefile(root / "pytorch" / name) for name in ["2.0", *links]}
    assert got == {"2.0": True, "2.1": True, "2.2": True, "2.3": False, "2.4": False, "2.5": False,
                   "2.6": True, "2.7": False, "2.8": False}


@pytest.mark.unit
def test_a_module_directory_that_is_a_link_is_neither_listed_nor_read(tmp_path):
    """A link at ``<module root>/<name>`` (a stack-group member's, to /dev or a directory of
    root-only files): available_versions lists nothing through it and Tcl._is_modulefile opens
    no file below it, though the target holds a modulefile (the by-name control finds it)."""
    from hpcstack.modules.syntax import Tcl
    from hpcstack.modules.writer import available_versions

    root, outside = tmp_path / "mods", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "1.0").write_text("#%Module\n")
    (root / "pytorch").symlink_to(outside)
    assert [p.name for p in (root / "pytorch").iterdir()] == ["1.0"]        # control: the link leads there
    assert available_versions(root / "pytorch", "environment-modules") == []
    assert Tcl()._is_modulefile(root / "pytorch" / "1.0") is False
    (root / "real").mkdir()
    (root / "real" / "1.0").write_text("#%Module\n")
    assert available_versions(root / "real", "environment-modules") == ["1.0"]
