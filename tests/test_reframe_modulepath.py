"""ReFrame resolves the emitted check's module from a shell whose ``MODULEPATH`` is empty.

By default ReFrame loads a test's modules in its own process before it submits (``modulecmd
python show`` and ``load``, to resolve conflicts), which needs every module root on the caller's
``MODULEPATH``: the stack's, and its base module's (``depends-on python``). The emitted
configuration turns that off (``general: resolve_module_conflicts: False``) and puts the site's
roots on the job's ``MODULEPATH`` (``prepare_cmds``); the check names its module with its root.

Real ReFrame (test extras) and real Environment Modules, a stand-in modulefile
``pytorch/2.3.1-gpu`` (with the stack's ``depends-on python``) in a module root of the test's
own, and ReFrame's ``--dry-run`` (every stage up to the job script, no submission); the files as
hpcstack wrote them before (bare module name, conflict resolution on) fail there. The run on
Slurm with the installed stack is tests/test_reframe_modulepath_e2e.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import MODULES_INIT, hpcstack
from test_export_reframe import CHECK, REFRAME

pytestmark = pytest.mark.integration

MODULEFILE = ('#%Module1.0\nmodule-whatis "a stand-in for the stack\'s module"\nconflict pytorch\n'
              # as the stack's modulefile: its base module, which an empty MODULEPATH cannot find
              'depends-on python\n')


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
    # the site's module roots (the base module's too) come first, from the partition's prepare_cmds
    assert job.index("module use /opt/hpcstack/base-modulefiles\n") < job.index("module load pytorch/2.3.1-gpu"), job
    settings = (tmp_path / "rfm" / "settings.py").read_text()
    assert "'resolve_module_conflicts': False," in settings


def test_the_files_as_they_were_fail_there(emitted):
    """The control: the bare module name and ReFrame's default conflict resolution (the files as
    hpcstack wrote them before) fail from the same shell."""
    tmp_path, modules = emitted
    path = tmp_path / "rfm" / CHECK
    text = path.read_text()
    path.write_text(text.replace(f"[{{'name': 'pytorch/2.3.1-gpu', 'path': '{modules}'}}]", "['pytorch/2.3.1-gpu']"))
    settings = tmp_path / "rfm" / "settings.py"
    text = settings.read_text()
    assert "'resolve_module_conflicts': False," in text
    settings.write_text(text.replace("'resolve_module_conflicts': False,", "'resolve_module_conflicts': True,"))
    proc = _dry_run(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-5000:]
    assert "FAILED" in out, out[-5000:]
