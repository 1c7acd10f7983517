"""The one-process sanity check: imports and the components' checks (Horovod's build flags) in one interpreter.

The Horovod tests run against the installed stack of the end-to-end tests (the real library;
they skip where it is absent) and compare the in-process report with `horovodrun --check-build`
itself. About 10 s (most of it `horovodrun --check-build`).
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest

from conftest import STACK_TOP

from hpcstack.errors import HpcstackError
from hpcstack.install.actions import Run
from hpcstack.install.components.horovod import build_flags_check
from hpcstack.install.components.sanity import PythonCheck, PythonSnippet, merge_python_checks
from hpcstack.install.components.checkbuild import parse_check_build

pytestmark = pytest.mark.unit

STACK_BIN = (STACK_TOP
             / "software" / "pytorch" / "2.3.1-gpu" / "venv" / "bin")


class Ctx:
    def __init__(self, state_dir=None):
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        self.log = io.StringIO()
        self.state_dir = state_dir


def test_checks_of_one_python_merge_into_one_that_runs_first_in_the_background():
    other = Run(("true",))
    flags = build_flags_check(("PyTorch", "MPI"))
    a = PythonCheck("/v/bin/python", checks=(flags,), prepend={"LD_LIBRARY_PATH": "/s1:/s2"})
    b = PythonCheck("/v/bin/python", ("torch", "horovod.torch"), prepend={"LD_LIBRARY_PATH": "/s2"})
    c = PythonCheck("/w/bin/python", ("six",))
    merged = merge_python_checks([other, a, c, b])
    assert merged[2] is other and len(merged) == 3  # the other checks run while the interpreters do
    assert merged[1].imports == ("six",) and merged[0].background and merged[1].background
    one = merged[0]
    assert one.imports == ("torch", "horovod.torch") and one.checks == (flags,)
    assert one.prepend == {"LD_LIBRARY_PATH": "/s1:/s2"}
    program = one.program()
    assert program.index("import torch\n") < program.index('REQUIRED = ["PyTorch", "MPI"]')


def test_imports_only_runs_one_interpreter_and_a_failed_import_names_the_module(tmp_path):
    python = "python3"
    ok = PythonCheck(python, ("json", "shlex"))
    ctx = Ctx()
    ok.execute(ctx)
    assert "imports ok: json, shlex" in ctx.log.getvalue()
    with pytest.raises(HpcstackError, match="No module named 'no_such_module_x'"):
        PythonCheck(python, ("json", "no_such_module_x")).execute(Ctx())


def test_bash_rendering_runs_the_same_program(tmp_path):
    check = PythonCheck("python3", ("json",))
    out = subprocess.run(["bash", "-c", check.to_bash()], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "imports ok: json"


def _stack():
    if not (STACK_BIN / "horovodrun").exists():
        pytest.skip(f"no installed stack with Horovod at {STACK_BIN}")
    return str(STACK_BIN / "python")


@pytest.mark.e2e
def test_in_process_flags_equal_horovodrun_check_build_and_are_kept(tmp_path):
    python = _stack()
    ctx = Ctx(state_dir=tmp_path)
    PythonCheck(python, ("torch",), checks=(build_flags_check(("PyTorch", "MPI", "Gloo")),)).execute(ctx)
    ours = parse_check_build((tmp_path / "check-build.txt").read_text())
    real = subprocess.run([str(STACK_BIN / "horovodrun"), "--check-build"], capture_output=True, text=True,
                          env=ctx.env)
    assert real.returncode == 0, real.stderr
    assert ours == parse_check_build(real.stdout)
    assert ours["Controllers"] == {"MPI": True, "Gloo": True}


@pytest.mark.e2e
def test_a_missing_flag_fails_the_check_naming_it(tmp_path):
    python = _stack()
    with pytest.raises(HpcstackError, match=r"missing \[X\] Operations:NCCL"):
        PythonCheck(python, checks=(build_flags_check(("PyTorch", "Operations:NCCL")),)).execute(Ctx(state_dir=tmp_path))
    assert not (tmp_path / "check-build.txt").exists()


def test_horovod_check_build_mode_is_checked():
    from hpcstack.install.components.horovod import HorovodBuild

    assert HorovodBuild(check_build="horovodrun").check_build == "horovodrun"
    with pytest.raises(ValueError, match="check_build 'fork': one of in-process, horovodrun"):
        HorovodBuild(check_build="fork")


@pytest.mark.e2e
def test_what_an_import_prints_before_the_report_is_not_parsed(tmp_path):
    python = _stack()
    noisy = tmp_path / "noisy_module_x.py"
    noisy.write_text("print('a line of an import')\n")
    ctx = Ctx(state_dir=tmp_path)
    ctx.env["PYTHONPATH"] = str(tmp_path)
    PythonCheck(python, ("noisy_module_x",), checks=(build_flags_check(("PyTorch",)),)).execute(ctx)
    assert "a line of an import" in ctx.log.getvalue()
    assert (tmp_path / "check-build.txt").read_text().startswith("Horovod v0.28.1:\n")


def test_the_check_names_no_package_and_runs_each_components_snippet_in_its_own_function(tmp_path):
    """PythonCheck knows no package: the snippets come from the components; a failing one names
    itself, its ``verify`` sees its own section of the output, and its record is kept."""
    seen = []

    def verify(text):
        seen.append(text)
        return [] if "two 2" in text else ["no two"]

    one = PythonSnippet("one", "x = 1\nprint('one', x)")
    two = PythonSnippet("two", "x = 2\nprint('two', x)", verify=verify, record="two.txt")
    check = PythonCheck("python3", ("json",), checks=(one, two))
    assert "horovod" not in PythonCheck("python3", ("json",)).program().lower()
    ctx = Ctx(state_dir=tmp_path)
    check.execute(ctx)
    assert seen == ["two 2\n"] and (tmp_path / "two.txt").read_text() == "two 2\n"
    assert check.merged(PythonCheck("python3", checks=(one,))).checks == (one, two)  # no repeats
    bad = PythonSnippet("three", "sys.exit('three: the library is not the site\\'s')")
    with pytest.raises(HpcstackError, match="three: the library is not the site's"):
        PythonCheck("python3", checks=(one, bad)).execute(Ctx())
    noisy = PythonSnippet("noisy", "print('noise of an import')\nprint('Report v1')\nprint('ok')",
                          record="noisy.txt", start=r"^Report v")
    PythonCheck("python3", checks=(noisy,)).execute(Ctx(state_dir=tmp_path))
    assert (tmp_path / "noisy.txt").read_text() == "Report v1\nok\n"
    with pytest.raises(HpcstackError, match="^two: no two$"):
        PythonCheck("python3", checks=(PythonSnippet("two", "print('two 3')", verify=verify),)).execute(Ctx())


def test_components_bring_their_checks_and_the_trainer_is_the_pytorch_recipes():
    from hpcstack.install.components.trainer import TRAINER
    from hpcstack.install.resolve import resolve
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site

    site = load_site("localhost")
    plan = resolve(load_recipe("pytorch/2.3.1-gpu", site), site, python_version="3.11")
    sanity = next(s for s in plan.steps if s.name == "sanitycheck")
    (check,) = [a for a in sanity.actions if isinstance(a, PythonCheck)]
    assert [c.name for c in check.checks] == ["horovod build flags", "trainer"]
    assert "torch" in check.imports and "horovod.torch" in check.imports
    install = next(s for s in plan.steps if s.name == "install")
    assert any(TRAINER in " ".join(getattr(a, "argv", ())) for a in install.actions)
    # a stack without the Trainer component has no trainer
    from conftest import make_sdist, write_tiny_recipe
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        recipe = write_tiny_recipe(Path(tmp) / "recipes", make_sdist(Path(tmp)))
        tiny = resolve(load_recipe(str(recipe), site), site, python_version="3.11")
        text = "\n".join(a.to_bash() for s in tiny.steps for a in s.actions)
        assert TRAINER not in text
