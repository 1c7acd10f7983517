"""The sanity check's half of the GPU-architecture preflight, in the installed localhost stack:
the installed torch names its architectures without a GPU, and the check fails in its own
interpreter for a capability they do not serve."""

from __future__ import annotations

import subprocess

import pytest

from hpcstack.install.components.cudawheels import _snippet
from hpcstack.install.components.sanity import PythonCheck, PythonSnippet

pytestmark = pytest.mark.e2e


def _check(python: str, cc_list: tuple[int, ...]) -> subprocess.CompletedProcess:
    snippet = PythonSnippet("torch GPU architectures", _snippet("torch._C._cuda_getArchFlags()", cc_list, "torch"))
    program = PythonCheck(python, ("torch",), checks=(snippet,)).program()
    return subprocess.run([python, "-c", program], capture_output=True, text=True, timeout=300)


def test_the_installed_torch_runs_on_every_shipped_gpu_site(installed_stack):
    proc = _check(str(installed_stack / "venv" / "bin" / "python"), (70, 80))
    assert proc.returncode == 0, proc.stderr
    assert "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90" in proc.stdout


def test_a_capability_the_installed_torch_does_not_serve_fails_the_check(installed_stack):
    proc = _check(str(installed_stack / "venv" / "bin" / "python"), (37, 80, 100))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "torch GPU architectures: sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90 do not run on compute "
        "capability 3.7, 10.0")
