"""ReFrame resolves the emitted check's module from a shell whose ``MODULEPATH`` is empty.

ReFrame looks a test's modules up in its own process before it submits (``modulecmd python show
…``, for conflicts). The check names its module with the module root, so neither that lookup nor
the job's ``module load`` depends on the caller's ``MODULEPATH``. Real ReFrame (test extras) and
real Environment Modules, a stand-in modulefile ``pytorch/2.3.1-gpu`` in a module root of the
test's own, and ReFrame's ``--dry-run`` (every stage up to the job script, no submission); the
same check with the bare module name fails there. The run on Slurm with the installed stack is
tests/test_reframe_modulepath_e2e.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import MODULES_INIT, hpcstack
from test_export_reframe import CHECK, REFRAME

pytestmark = pytest.mark.integration

MODULEFILE = '#%Module1.0\nmodule-whatis "a stand-in for the stack\'s module"\nconflict pytorch\n'


@pytest.fixture
def emitted(tmp_path):
    if REFRAME is None:
        pytest.skip("reframe missing (pip install reframe-hpc; the test extras have it)")
    if not MODULES_INIT.is_file():
        pytest.skip(f"Environment Modules missing ({MODULES_INIT}); run scripts/localhost-setup")
    modules = tmp_path / "modulefiles"
    (modules / "pytorch").mkdir(parents=True)
    (modules / "pytorch" / "2.3.1-gpu").write_text(MODULEFILE)
    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "localhost", "--prefix", str(tmp_path / "software"),
                    "--module-root", str(modules), "--nodes", "1", "--backend", "horovod",
                    "--emit", "reframe", str(tmp_path / "rfm"))
    assert proc.returncode == 0, proc.stderr
    assert f"run it: reframe -C {tmp_path / 'rfm' / 'settings.py'} -c {tmp_path / 'rfm' / CHECK} -r" in proc.stdout
    return tmp_path, modules


def _dry_run(tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("BASH_ENV", "MODULEPATH", "LOADEDMODULES", "_LMFILES_")}
    env["HOME"] = str(tmp_path)
    script = (f"source {MODULES_INIT} && export MODULEPATH= && exec {REFRAME} --nocolor "
              f"-C {tmp_path / 'rfm' / 'settings.py'} -c {tmp_path / 'rfm'} --dry-run")
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)


def test_the_check_resolves_its_module_with_an_empty_modulepath(emitted):
    tmp_path, modules = emitted
    check = (tmp_path / "rfm" / CHECK).read_text()
    assert f"modules = [{{'name': 'pytorch/2.3.1-gpu', 'path': '{modules}'}}]" in check
    proc = _dry_run(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert "[  PASSED  ] Ran 1/1 test case(s)" in out, out[-5000:]
    job = next((tmp_path / "stage").rglob("rfm_job.sh")).read_text()
    assert f"module use {modules}\nmodule load pytorch/2.3.1-gpu\n" in job, job
    assert "module use /opt/hpcstack/base-modulefiles\n" in job, job


def test_the_bare_module_name_fails_there(emitted):
    """The control: the form the check had before fails from the same shell."""
    tmp_path, modules = emitted
    path = tmp_path / "rfm" / CHECK
    text = path.read_text()
    path.write_text(text.replace(f"[{{'name': 'pytorch/2.3.1-gpu', 'path': '{modules}'}}]", "['pytorch/2.3.1-gpu']"))
    proc = _dry_run(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-5000:]
    assert "FAILED" in out, out[-5000:]
