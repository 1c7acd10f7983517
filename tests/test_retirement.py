"""Users are told, never stranded: a venv extended against a deprecated stack prints the
deprecation line at activate; once the stack is uninstalled, the module's stand-in makes activate
print one line naming the replacement and leaves the shell usable (deactivate works). Environment
Modules and the real tiny install."""

from __future__ import annotations

import datetime as dt
import subprocess

import pytest

from conftest import BASE_MODULES, REPO, bash_modules, hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration


def test_a_venv_on_a_deprecated_then_uninstalled_stack(localhost_ready, tmp_path):
    import yaml

    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    site = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    site.update(install_root=str(tmp_path / "sw"), module_root=str(tmp_path / "mf"))
    (tmp_path / "localhost.yaml").write_text(yaml.safe_dump(site))
    args = ["--site", str(tmp_path / "localhost.yaml")]
    proc = hpcstack("install", str(recipe), *args)
    assert proc.returncode == 0, proc.stderr
    venv = tmp_path / "myvenv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    ext = subprocess.run([str(tmp_path / "sw/tiny/1.0/bin/extend-venv-activate"), str(venv)],
                         capture_output=True, text=True)
    assert ext.returncode == 0, ext.stderr
    after = (dt.date.today() + dt.timedelta(days=90)).isoformat()
    dep = hpcstack("module", "deprecate", "tiny/1.0", "--replacement", "tiny/2.0", "--after", after,
                   *args)
    assert dep.returncode == 0, dep.stderr
    kernel = hpcstack("kernel", "install", str(recipe), *args, "--prefix", str(tmp_path / "jupyter"),
                      "--venv", str(venv))
    assert kernel.returncode == 0, kernel.stderr
    line = f"tiny/1.0 is deprecated; use tiny/2.0 instead; it cannot be loaded from {after} on"
    use = f"module use {tmp_path / 'mf'}; module use {BASE_MODULES}\n"

    active = bash_modules(use + f"source {venv}/bin/activate && python -c 'import tinypkg' && echo ACTIVE\n")
    assert "ACTIVE" in active.stdout, active.stderr
    lines = [x for x in active.stderr.splitlines() if x.strip()]
    assert lines.count(line) == 1, active.stderr
    # and the tool's own report of the load it tagged (with its auto-loaded requirement)
    python = next(BASE_MODULES.glob("python/*")).relative_to(BASE_MODULES)
    assert set(lines) - {line} <= {"Loading tiny/1.0 <deprecated>", f"  Loading requirement: {python}"}

    refused = hpcstack("uninstall", "tiny/1.0", *args)
    assert refused.returncode == 1 and "refusing to uninstall tiny/1.0: it is deprecated" in refused.stderr
    gone = hpcstack("uninstall", "tiny/1.0", "--force", *args)
    assert gone.returncode == 0, gone.stderr
    assert not (tmp_path / "sw/tiny/1.0").exists()

    stranded = bash_modules(use + f"source {venv}/bin/activate; echo rc=$?; deactivate 2>/dev/null; "
                                  "echo STILL HERE\n")
    assert "rc=1" in stranded.stdout and "STILL HERE" in stranded.stdout
    err = stranded.stderr
    # removed with --force before its date: retired now, not "on" the date it was to go
    assert "tiny/1.0 was retired: use tiny/2.0 instead" in err, err
    assert "Traceback" not in err and "while executing" not in err, err
    # hpcstack doctor says the same, and how to rebuild the venv on the replacement
    doctor = hpcstack("doctor", "--venv", str(venv), env={"MODULEPATH": str(tmp_path / "mf")})
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert doctor.stdout.splitlines()[0].startswith(
        "tiny/1.0 was retired: use tiny/2.0 instead; rebuild this venv on it: module load tiny/2.0; "
        "python -m venv NEWVENV; extend-venv-activate NEWVENV")
    # the Jupyter kernel ends at once with the line
    launch = next((tmp_path / "jupyter").rglob("launch"))
    ended = subprocess.run([str(launch), "/dev/null"], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert ended.returncode == 98, ended.stderr
    assert "tiny/1.0 was retired: use tiny/2.0 instead" in ended.stderr.splitlines()[0]
    # the undo removes the stand-in
    undo = hpcstack("module", "undeprecate", "tiny/1.0", *args)
    assert undo.returncode == 0 and not (tmp_path / "mf/tiny/1.0").exists(), undo.stdout + undo.stderr
