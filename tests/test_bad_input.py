"""Bad input, named and generated: malformed site configs, command lines and recipes end with
exit status 2 and one ``error:`` line per problem; no traceback, no "internal error", nothing
written.

First the cases found by hand (binary and non-UTF-8 site files, 50,000-deep nesting, duplicate
keys, alias bombs, numbers out of bounds, NUL bytes, bad env names, hostile recipe names, a
recipe with a non-component object, a bad ``action sbom`` spec); then more than 1,000 generated
ones (hypothesis): site configs, command lines and recipes, run in-process through
:func:`hpcstack.cli.main`; and a few through the real ``hpcstack`` command, for its real exit.
"""

from __future__ import annotations

import contextlib
import copy
import io
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, hpcstack
from hpcstack.cli import main

pytestmark = pytest.mark.unit

BASE = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
BASE.setdefault("python", {})["version"] = "3.11"  # no module tool needed for a dry-run
TMP = Path(tempfile.mkdtemp(prefix="hpcstack-bad-input-"))
ROOT = TMP / "root"


def run(argv: list[str]) -> tuple[int, str, str]:
    """``hpcstack ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # --help and --version only
            status = exc.code if isinstance(exc.code, int) else 99
    return status, out.getvalue(), err.getvalue()


def check(argv: list[str], expect_bad: bool = False) -> tuple[int, str]:
    """Run and check the rules; with ``expect_bad`` the input must be refused with exit 2."""
    status, out, err = run(argv)
    assert "Traceback" not in err and "internal error" not in err, (argv, err)
    assert status in (0, 1, 2), (argv, status, err)
    if status:
        assert err.strip(), (argv, "a failure must say why")
    if status == 2:
        lines = err.splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), (argv, err)
    if expect_bad:
        assert status == 2, (argv, status, out[-500:], err)
        assert not ROOT.exists() or not any(ROOT.iterdir()), "a refused command wrote something"
    return status, err


def site_file(data, name: str = "site.yaml") -> Path:
    path = TMP / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif isinstance(data, str):
        path.write_text(data)
    else:
        path.write_text(yaml.safe_dump(data))
    return path


def dry_run(site: Path, recipe: str = "pytorch/2.3.1-gpu", *extra: str) -> list[str]:
    return ["install", recipe, "--site", str(site), "--prefix", str(ROOT), "--module-root", str(ROOT),
            "--dry-run", *extra]


def with_(path: str, value) -> dict:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return data


# -------------------------------------------------------------------------- the named cases

NESTED = "a: " + "[" * 50_000 + "]" * 50_000 + "\n"
BOMB = yaml.safe_dump({k: v for k, v in BASE.items() if k != "container"}) + \
    "container:\n  python: '3.11'\n  site_changes:\n" + "".join(
    f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" if i else "    l0: &l0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(9))

SITE_CASES = {
    "binary": b"\x00\x01\x02\xff\xfe" * 40,
    "invalid UTF-8": yaml.safe_dump(BASE).encode() + b"\ndescription: caf\xe9\n",
    "50,000-deep nesting": NESTED,
    "duplicate key": yaml.safe_dump(BASE) + "name: localhost\n",
    "duplicate nested key": "build:\n  jobs: 1\n  jobs: 2\n" + yaml.safe_dump({k: v for k, v in BASE.items() if k != "build"}),
    "alias bomb in container.site_changes": BOMB,
    "huge integer": yaml.safe_dump(BASE) + "squashfs: {processors: " + "9" * 5000 + "}\n",
    "ranks 10**40": with_("launcher.ranks", 10**40),
    "jobs 10**100": with_("build.jobs", 10**100),
    "NUL in a module name": with_("modules.base", "python\x00/3"),
    "newline in a module name": with_("modules.base", "python\nexec touch /tmp/x"),
    "Tcl in a module name": with_("modules.base", "python [exec touch /tmp/x]"),
    "empty env name": with_("build.env", {"": "x"}),
    "; in an env name": with_("build.env", {"BAR;touch /tmp/x": "1"}),
    "newline in an env value": with_("build.env", {"FOO": "a\nb"}),
    "newline in slurm.partition": with_("slurm", {**BASE.get("slurm", {}), "partition": "debug\nhostname"}),
    "newline in slurm.constraint": with_("slurm", {**BASE.get("slurm", {}), "constraint": "gpu\n#SBATCH -A x"}),
    "space in a launcher env name": with_("launcher.env", {"A B": "1"}),
    "; in a slurm.env name": with_("slurm", {**BASE.get("slurm", {}), "env": {"X;touch /tmp/x": "1"}}),
    "$ in a partition": with_("slurm", {**BASE.get("slurm", {}), "partition": "$(id)"}),
    "nodes 0 gpus": with_("slurm", {**BASE.get("slurm", {}), "gpus_per_node": 10**30}),
    "cc_list out of range": with_("toolchain", {"cuda": {"home": "/c", "version": "12.1", "cc_list": [10**20]}}),
    "a list at the top": "- a\n- b\n",
    "not YAML": "name: [",
    "a tab in a value": with_("description", "a\tb"),
    "U+2028 in a key": with_("build.env", {"A\u2028B": "1"}),
    "secret without a source": with_("build.env", {"TOKEN": {"secret": True}}),
    "a number as an env name": with_("build.env", {1: "x"}),
    "a boolean as a key": with_("slurm", {**BASE.get("slurm", {}), True: "x"}),
    "a recursive alias": yaml.safe_dump({k: v for k, v in BASE.items() if k != "description"}) + "description: &a [*a]\n",
}


@pytest.mark.parametrize("case", sorted(SITE_CASES))
def test_a_bad_site_config_is_refused_in_one_line_each(case):
    check(dry_run(site_file(SITE_CASES[case])), expect_bad=True)


def test_an_alias_bomb_is_refused_before_it_expands():
    status, err = check(dry_run(site_file(BOMB)), expect_bad=True)
    assert "aliases" in err


def test_a_duplicate_key_names_the_key_and_its_line():
    status, err = check(dry_run(site_file(SITE_CASES["duplicate key"])), expect_bad=True)
    assert "duplicate key 'name'" in err and "line " in err


def _recipe(text: str, name: str = "bad.py") -> Path:
    path = TMP / "recipes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


RECIPE_HEAD = "from hpcstack.recipe import Recipe\nfrom hpcstack.install.components import Venv, Modulefile\n"
RECIPE_CASES = {
    "a non-component object": RECIPE_HEAD + "def recipe(site):\n    return Recipe('x', '1', 'w', components=[Venv(), 42, Modulefile()])\n",
    "a class, not an object": RECIPE_HEAD + "def recipe(site):\n    return Recipe('x', '1', 'w', components=[Venv])\n",
    "components not a list": RECIPE_HEAD + "def recipe(site):\n    return Recipe('x', '1', 'w', components='abc')\n",
    "named bad;[exec id]": RECIPE_HEAD + "def recipe(site):\n    return Recipe('bad;[exec id]', '1', 'w', components=[Venv()])\n",
    "a version with a newline": RECIPE_HEAD + "def recipe(site):\n    return Recipe('x', '1\\nexec id', 'w', components=[Venv()])\n",
    "whatis with a newline": RECIPE_HEAD + "def recipe(site):\n    return Recipe('x', '1', 'a\\n}\\nexec id', components=[Venv()])\n",
    "a name that is not a string": RECIPE_HEAD + "def recipe(site):\n    return Recipe(7, '1', 'w', components=[Venv()])\n",
    "contribute returns junk": RECIPE_HEAD + "class C:\n    def contribute(self, ctx):\n        return 5\n"
                               "def recipe(site):\n    return Recipe('x', '1', 'w', components=[Venv(), C()])\n",
    "contribute to an unknown step": RECIPE_HEAD + "class C:\n    def contribute(self, ctx):\n        return {'nostep': []}\n"
                                     "def recipe(site):\n    return Recipe('x', '1', 'w', components=[Venv(), C()])\n",
    "sys.exit in the recipe": "import sys\ndef recipe(site):\n    sys.exit(3)\n",
    "deep recursion": "def recipe(site):\n    return recipe(site)\n",
    "a syntax error": "def recipe(site)\n",
    "returns None": "def recipe(site):\n    return None\n",
}


@pytest.mark.parametrize("case", sorted(RECIPE_CASES))
def test_a_bad_recipe_is_refused_in_one_line(case):
    site = site_file(BASE, "good.yaml")
    check(dry_run(site, str(_recipe(RECIPE_CASES[case]))), expect_bad=True)


def test_a_recipe_file_that_is_binary_or_holds_nul_is_refused():
    site = site_file(BASE, "good.yaml")
    for data in (b"\xff\xfe\x00junk", b"def recipe(site):\x00\n"):
        path = TMP / "recipes" / "binary.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        check(dry_run(site, str(path)), expect_bad=True)


COMMAND_CASES = {
    "--nodes 1,,2": ["validate", "pytorch/2.3.1-gpu", "--nodes", "1,,2", "--dry-run"],
    "--nodes 10**40": ["validate", "pytorch/2.3.1-gpu", "--nodes", str(10**40), "--dry-run"],
    "--nodes 0": ["validate", "pytorch/2.3.1-gpu", "--nodes", "0", "--dry-run"],
    "--nodes -1": ["validate", "pytorch/2.3.1-gpu", "--nodes=-1", "--dry-run"],
    "--partition with a newline": ["validate", "pytorch/2.3.1-gpu", "--partition", "debug\nhostname", "--dry-run"],
    "--partition with ;": ["validate", "pytorch/2.3.1-gpu", "--partition", "debug;id", "--dry-run"],
    "--qos with a quote": ["validate", "pytorch/2.3.1-gpu", "--qos", "a'b", "--dry-run"],
    "--ranks 10**40": ["validate", "pytorch/2.3.1-gpu", "--local", "--ranks", str(10**40), "--dry-run"],
    "--jobs 10**100": ["install", "pytorch/2.3.1-gpu", "--jobs", str(10**100), "--dry-run"],
    "--jobs 0": ["install", "pytorch/2.3.1-gpu", "--jobs", "0", "--dry-run"],
    "NUL in a recipe spec": ["install", "pytorch/2.3.1-gpu\x00", "--dry-run"],
    "newline in --site": ["install", "pytorch/2.3.1-gpu", "--site", "local\nhost", "--dry-run"],
    "newline in --repo": ["install", "pytorch/2.3.1-gpu", "--repo", "/tmp/a\n/b", "--dry-run"],
    "unknown option": ["install", "pytorch/2.3.1-gpu", "--bogus"],
    "unknown command": ["bogus"],
    "no command": [],
    "module set-default bad;[exec id]": ["module", "set-default", "bad;[exec id]/1"],
    "kernel name": ["kernel", "install", "pytorch/2.3.1-gpu", "--name", "a b", "--prefix", str(TMP / "k")],
    "bad sbom spec": ["action", "sbom", "--spec", "{not json", str(TMP / "sbom.json")],
    "sbom spec of the wrong shape": ["action", "sbom", "--spec", '{"builds": 5}', str(TMP / "sbom.json")],
    "sbom spec a list": ["action", "sbom", "--spec", "[1, 2]", str(TMP / "sbom.json")],
    "action unknown": ["action", "frobnicate"],
    "action fetch without arguments": ["action", "fetch"],
}


@pytest.mark.parametrize("case", sorted(COMMAND_CASES))
def test_a_bad_command_line_is_refused_in_one_line(case):
    argv = COMMAND_CASES[case]
    if argv and argv[0] in ("install", "validate"):
        argv = [*argv, "--site", str(site_file(BASE, "good.yaml")), "--prefix", str(ROOT), "--module-root", str(ROOT)]
    check(argv, expect_bad=True)
    assert not (TMP / "sbom.json").exists()


# ----------------------------------------------------------------- the real command, a few

@pytest.mark.parametrize("case", ["binary", "50,000-deep nesting", "duplicate key", "alias bomb in container.site_changes"])
def test_the_real_command_exits_2_with_one_line(case):
    site = site_file(SITE_CASES[case], f"real-{case.replace(' ', '_').replace(',', '')}.yaml")
    proc = hpcstack(*dry_run(site))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert proc.stdout == ""


def test_the_real_command_refuses_nodes_1__2():
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--nodes", "1,,2", "--dry-run", "--site",
                    str(site_file(BASE, "good.yaml")))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


# ------------------------------------------------------------- generated: over 1,000 inputs

def _paths(node, prefix=()) -> list[tuple]:
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append(prefix + (key,))
            out += _paths(value, prefix + (key,))
    return out


PATHS = _paths(BASE)
HOSTILE = ["python [exec touch /tmp/x]", "$(touch x)", "`id`", '"; os.system("id") #', "a\nb", "\x00",
           "bad;[exec id]", "", " ", "\t", "\r", "\u2028", "\\", "}{", "]]", "%(installdir)s", "${HOME}",
           "1,,2", "é", "../..", "/", "x" * 5000]
scalars = (st.none() | st.booleans() | st.integers(-10**3, 10**3) | st.sampled_from([10**40, 10**100, -10**40, 2**63])
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | st.sampled_from(HOSTILE))
keys = st.text(max_size=6) | st.sampled_from(HOSTILE) | st.integers(-2, 2) | st.booleans() | st.none()
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(keys, c, max_size=3), max_leaves=6)


def _mutate(mutations) -> dict:
    data = copy.deepcopy(BASE)
    for kind, path, value in mutations:
        node = data
        for key in path[:-1]:
            if not isinstance(node, dict):
                break
            node = node.setdefault(key, {})
        else:
            if not isinstance(node, dict):
                continue
            if kind == "set":
                node[path[-1]] = value
            elif kind == "del":
                node.pop(path[-1], None)
    return data


def _dump(data) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return yaml.safe_dump(BASE)


mutation = st.tuples(st.sampled_from(["set", "set", "del"]), st.sampled_from(PATHS), values)
site_texts = st.one_of(
    st.lists(mutation, min_size=1, max_size=4).map(lambda m: _dump(_mutate(m))),
    st.text(max_size=300),
    st.binary(max_size=300),
    st.tuples(st.lists(mutation, min_size=1, max_size=2), st.sampled_from(PATHS)).map(
        # a key given twice
        lambda t: _dump(_mutate(t[0])) + f"{t[1][0]}: null\n"),
    st.integers(1, 60).map(lambda depth: "a: " + "[" * depth * 1000 + "]" * depth * 1000),
    st.integers(2, 12).map(lambda n: "container:\n  site_changes:\n" + "".join(
        f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * n)}]\n" for i in range(n))),
)


@settings(max_examples=450, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=site_texts, command=st.sampled_from(["install", "validate", "export", "uninstall"]))
def test_generated_site_configs_are_refused_in_one_line_or_accepted(text, command):
    site = site_file(text, "generated.yaml")
    argv = {"install": dry_run(site),
            "validate": ["validate", "pytorch/2.3.1-gpu", "--site", str(site), "--dry-run", "--prefix", str(ROOT),
                         "--output-dir", str(TMP / "out")],
            "export": ["export", "pytorch/2.3.1-gpu", "--site", str(site), "--format", "docker"],
            "uninstall": ["uninstall", "pytorch/2.3.1-gpu", "--site", str(site), "--dry-run", "--prefix", str(ROOT),
                          "--module-root", str(ROOT)]}[command]
    check(argv)


WORDS = ["pytorch/2.3.1-gpu", "nope", "", "-", "--", "localhost", "cirrus", "0", "-1", "1,,2", "1,2", str(10**40),
         "build", "module", "fetch", "a/b/c", "../x", "x.py", "horovod", "ddp", "reframe", "docker", "easyconfig",
         *HOSTILE[:14]]
OPTIONS = ["--site", "--prefix", "--module-root", "--dry-run", "--force", "--no-wait", "--json", "--stop-after",
           "--jobs", "-j", "--file", "--ranks", "--nodes", "--local", "--backend", "--partition", "--qos",
           "--account", "--workload", "--format", "--name", "--repo", "--emit"]
SAFE = {
    "install": ["--dry-run", "--prefix", str(ROOT), "--module-root", str(ROOT)],
    "uninstall": ["--dry-run", "--prefix", str(ROOT), "--module-root", str(ROOT)],
    "validate": ["--dry-run", "--prefix", str(ROOT), "--module-root", str(ROOT), "--output-dir", str(TMP / "out")],
    "show": ["--prefix", str(ROOT)],
    "list": [],
    "module": [],
    "action": [],
}


@settings(max_examples=350, deadline=None, suppress_health_check=list(HealthCheck))
@given(command=st.sampled_from(sorted(SAFE) + ["bogus", ""]),
       words=st.lists(st.sampled_from(WORDS) | st.sampled_from(OPTIONS) | st.text(max_size=8), max_size=6))
def test_generated_command_lines_are_refused_in_one_line_or_run(command, words):
    site_file(BASE, "good.yaml")
    if command == "module":
        words = [st_word for st_word in words if st_word not in ("set-default", "unset-default")]
        words = ["default", *words]                 # read-only: shows a default, writes nothing
    if command == "action":
        words = ["sbom", "--spec", *words[:1], str(TMP / "generated-sbom.json")]
    check([command, *words, *SAFE.get(command, [])] if command else words)


IDENT = st.sampled_from(["x", "tiny", "pytorch", "2.3.1-gpu", "1.0", *HOSTILE]) | st.text(max_size=10)
COMPONENTS = st.lists(st.sampled_from(["Venv()", "Modulefile()", "42", "None", "'text'", "Venv", "object()",
                                       "[Venv()]", "{'a': 1}", "C()", "Bad()"]), max_size=4)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=IDENT, version=IDENT, whatis=IDENT, components=COMPONENTS,
       shape=st.sampled_from(["recipe", "list", "tuple", "string", "none", "raise", "text"]), junk=st.text(max_size=60))
def test_generated_recipes_are_refused_in_one_line_or_accepted(name, version, whatis, components, shape, junk):
    listed = "[" + ", ".join(components) + "]"
    body = {"recipe": f"Recipe({name!r}, {version!r}, {whatis!r}, components={listed})",
            "list": listed, "tuple": f"({name!r}, {version!r})", "string": repr(whatis), "none": "None",
            "raise": f"(_ for _ in ()).throw(ValueError({junk!r}))", "text": ""}[shape]
    text = (RECIPE_HEAD + "class C:\n    def contribute(self, ctx):\n        return {'venv': 'x'}\n"
            "class Bad:\n    contribute = 5\n"
            + (junk if shape == "text" else f"def recipe(site):\n    return {body}\n"))
    recipe = _recipe(text, "generated.py")
    check(dry_run(site_file(BASE, "good.yaml"), str(recipe)))
