"""Whatever the admin's umask, a stack is readable by every user and writable by no one else.

The tiny recipe installed under umask 077, 002 and 000: the install root, the stack, its
module root and modulefile are world-readable (directories 0755), nothing is group- or
world-writable (uv's lock files included), hpcstack's own caches, stage dirs and locks are the
installing user's only, the install lock is 0600, and the files written after the permissions
step (the module step's record and log) follow the same rule.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import HPCSTACK, NEUTRAL_DIR, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration


def _install(tmp_path: Path, umask: int) -> subprocess.CompletedProcess:
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    return subprocess.run([*HPCSTACK, "install", str(recipe), "--site", "localhost", "--prefix",
                           str(tmp_path / "sw"), "--module-root", str(tmp_path / "mf")],
                          capture_output=True, text=True, cwd=NEUTRAL_DIR, timeout=600,
                          preexec_fn=lambda: os.umask(umask))


@pytest.mark.parametrize("umask", [0o077, 0o002, 0o000], ids=["077", "002", "000"])
def test_the_stack_has_the_same_modes_under_any_umask(localhost_ready, tmp_path, umask):
    res = _install(tmp_path, umask)
    assert res.returncode == 0, res.stderr
    sw, mf = tmp_path / "sw", tmp_path / "mf"
    private = {sw / ".hpcstack" / d for d in ("cache", "stage", "locks")}
    writable, unreadable = [], []
    for top in (sw, mf):
        for path in [top, *top.rglob("*")]:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode)
            if mode & 0o022:
                writable.append(f"{mode:o} {path}")
            if path in private:
                assert mode == 0o700, f"{mode:o} {path}"
            elif not any(p in private for p in path.parents):
                need = 0o055 if stat.S_ISDIR(st.st_mode) else 0o044
                if mode & need != need:
                    unreadable.append(f"{mode:o} {path}")
    assert writable == [], writable[:10]
    assert unreadable == [], unreadable[:10]
    assert stat.S_IMODE((sw / ".hpcstack" / "locks" / "tiny-1.0.lock").stat().st_mode) == 0o600
    build = Path(os.path.realpath(sw / "tiny" / "1.0"))
    for late in ("steps/module.json", "logs/module.log"):  # written after the permissions step
        assert stat.S_IMODE((build / ".hpcstack" / late).stat().st_mode) == 0o644, late
    assert stat.S_IMODE((mf / "tiny" / "1.0").stat().st_mode) == 0o644
    assert list((sw / ".hpcstack" / "cache").rglob("*.lock")), "uv's lock files (checked above)"
