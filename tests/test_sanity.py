"""The one-process sanity check (issue 14): imports and Horovod's build flags in one interpreter.

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
from hpcstack.install.components.sanity import PythonCheck, merge_python_checks
from hpcstack.validate.checkbuild import parse_check_build

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
    a = PythonCheck("/v/bin/python", horovod=("PyTorch", "MPI"), prepend={"LD_LIBRARY_PATH": "/s1:/s2"})
    b = PythonCheck("/v/bin/python", ("torch", "horovod.torch"), prepend={"LD_LIBRARY_PATH": "/s2"})
    c = PythonCheck("/w/bin/python", ("six",))
    merged = merge_python_checks([other, a, c, b])
    assert merged[2] is other and len(merged) == 3  # the other checks run while the interpreters do
    assert merged[1].imports == ("six",) and merged[0].background and merged[1].background
    one = merged[0]
    assert one.imports == ("torch", "horovod.torch") and one.horovod == ("PyTorch", "MPI")
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
    PythonCheck(python, ("torch",), horovod=("PyTorch", "MPI", "Gloo")).execute(ctx)
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
        PythonCheck(python, horovod=("PyTorch", "Operations:NCCL")).execute(Ctx(state_dir=tmp_path))
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
    PythonCheck(python, ("noisy_module_x",), horovod=("PyTorch",)).execute(ctx)
    assert "a line of an import" in ctx.log.getvalue()
    assert (tmp_path / "check-build.txt").read_text().startswith("Horovod v0.28.1:\n")
