"""The usage hooks in the real module tools: an ordinary user's login shell loads modules with
Environment Modules (the hook as MODULES_SITECONFIG) and with Lmod (LMOD_PACKAGE_PATH's
SitePackage.lua); root's ``hpcstack usage`` then reports those loads, and only those. The hooks
are configured per test (no /etc file is touched)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from attacker import USER, attacker_fixture
from conftest import hpcstack, site_overlay
from moduletools import tool_params, require

pytestmark = pytest.mark.integration


@pytest.fixture
def top():
    d = Path(tempfile.mkdtemp(prefix="hpcstack-usage-", dir="/var/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def login_shell(tool, script: str, **env: str) -> subprocess.CompletedProcess:
    """``script`` in a login shell of the ordinary user, with ``tool`` initialised."""
    pw_home = f"/home/{USER}"
    words = [f"HOME={pw_home}", f"USER={USER}", f"LOGNAME={USER}", "PATH=/usr/bin:/bin", "SHELL=/bin/bash",
             *(f"{k}={v}" for k, v in env.items())]
    return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *words, "bash", "-lc",
                           f"unset BASH_ENV; source {tool.init('bash')}\n{script}"],
                          capture_output=True, text=True, timeout=120, cwd="/")


@pytest.mark.parametrize("tool", tool_params())
def test_loads_by_a_user_are_recorded_and_reported(tool, top):
    require(tool)
    attacker_fixture()          # makes sure the ordinary account exists (skips unless root)
    roots, other = top / "modulefiles", top / "other-modulefiles"
    tool.write_module(roots / "teststack", "1.0", setenv={"TESTSTACK": "1"})
    tool.write_module(other / "elsewhere", "1.0", setenv={"ELSEWHERE": "1"})
    for p in (roots, other):
        subprocess.run(["chmod", "-R", "a+rX", str(p)], check=True)
    repo = site_overlay(top / "repo", name="usagehook", roots=top,
                        lifecycle={"usage_log": str(top / "usage"), "usage_users": "name"},
                        modules={"tool": tool.name, "syntax": tool.syntax, "base": "python/3"})
    proc = hpcstack("module", "usage-hook", "install", "--site", "usagehook", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    hooks = top / "usage" / "hooks"
    assert oct((top / "usage" / "spool").stat().st_mode & 0o7777) == "0o1733"
    env = ({"MODULES_SITECONFIG": str(hooks / "siteconfig.tcl")} if tool.name == "environment-modules"
           else {"LMOD_PACKAGE_PATH": str(hooks)})
    # someone else's event, that the user may neither read, change nor remove
    theirs = top / "usage" / "spool" / "1790000000000000.1.1"
    theirs.write_text("v1\t1790000000\troot\tteststack/1.0\tlogin9\t-\n")
    theirs.chmod(0o600)
    proc = login_shell(tool, f"""
module use {roots} {other}
module load teststack/1.0 && echo "loaded $TESTSTACK"
SLURM_JOB_ID=77 module load elsewhere/1.0
module purge; SLURM_JOB_ID=77 module load teststack/1.0
ls {top}/usage/spool >/dev/null 2>&1 && echo LISTED
cat {theirs} 2>/dev/null && echo READ
rm -f {theirs} 2>/dev/null; echo x >> {theirs} 2>/dev/null && echo WROTE
printf 'v1\\t1790000000\\troot\\tteststack/1.0\\tlogin1\\t-\\n' > {top}/usage/spool/1790000000000001.2.2
cat {top}/usage/usage.log 2>/dev/null && echo READLOG
true""", **env)
    assert proc.returncode == 0 and "loaded 1" in proc.stdout, proc.stdout + proc.stderr
    for word in ("LISTED", "READ\n", "WROTE", "READLOG"):
        assert word not in proc.stdout, proc.stdout
    assert theirs.read_text().startswith("v1\t1790000000\troot") and "x" not in theirs.read_text()
    theirs.unlink()
    proc = hpcstack("usage", "--site", "usagehook", "--repo", str(repo), "--since", "1d", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)["stacks"]
    assert (row["stack"], row["users"], row["loads"], row["jobs"]) == ("teststack/1.0", 1, 2, 1)
    assert json.loads(proc.stdout)["ignored_lines"] == 1          # the forged line naming root
    log = (top / "usage" / "usage.log").read_text()
    assert log.count(f"\t{USER}\tteststack/1.0\t") == 2 and "\t77\t" in log and "elsewhere" not in log
    assert list((top / "usage" / "spool").iterdir()) == []


@pytest.mark.parametrize("tool", tool_params())
def test_a_load_never_fails_when_the_log_cannot_be_written(tool, top):
    require(tool)
    attacker_fixture()
    roots = top / "modulefiles"
    tool.write_module(roots / "teststack", "1.0", setenv={"TESTSTACK": "1"})
    subprocess.run(["chmod", "-R", "a+rX", str(roots)], check=True)
    repo = site_overlay(top / "repo", name="usagehook", roots=top,
                        lifecycle={"usage_log": str(top / "usage")},
                        modules={"tool": tool.name, "syntax": tool.syntax, "base": "python/3"})
    assert hpcstack("module", "usage-hook", "install", "--site", "usagehook", "--repo", str(repo)).returncode == 0
    hooks = top / "usage" / "hooks"
    env = ({"MODULES_SITECONFIG": str(hooks / "siteconfig.tcl")} if tool.name == "environment-modules"
           else {"LMOD_PACKAGE_PATH": str(hooks)})
    (top / "usage" / "spool").chmod(0o1700)     # a full disk, a spool made wrong: nothing can be written
    proc = login_shell(tool, f"module use {roots}; module load teststack/1.0; echo rc=$? TESTSTACK=$TESTSTACK", **env)
    assert "rc=0 TESTSTACK=1" in proc.stdout, proc.stdout + proc.stderr
    assert "hpcstack" not in proc.stderr and "rror" not in proc.stderr, proc.stderr
