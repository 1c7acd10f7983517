"""The source-build cache: every entry carries its wheels' sha256, checked before each reuse.

A wheel replaced in the cache (by a user who could write there, or by a disk error) is never
reused: the entry is removed and the wheel built again, and the log says why. The dry-run's
bash (``hpcstack action reuse-wheel``) and the real run decide the same way.
"""

from __future__ import annotations

import io
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import HPCSTACK
from hpcstack.install.actions import Run
from hpcstack.install.components.source import CachedWheelBuild
from hpcstack.install.wheelcache import SUMS, check_entry, reuse, write_sums

pytestmark = pytest.mark.unit

WHEEL = "pkg-1.0-py3-none-any.whl"
BASH_ENV = {**{k: v for k, v in os.environ.items() if k not in ("BASH_ENV", "ENV")},
            "PATH": f"{os.path.dirname(HPCSTACK[0])}:{os.environ.get('PATH', '')}"}


class Ctx:
    """An action's context; the log is a real file (commands write to it)."""

    def __init__(self):
        self.env = dict(BASH_ENV)
        self.log = tempfile.TemporaryFile("w+")
        self.state_dir = None


def cached_build(tmp_path: Path, content: str = "built") -> CachedWheelBuild:
    """A cached build whose "build" writes a wheel with ``content`` (and counts its runs)."""
    dist = tmp_path / "dist"
    script = (f"mkdir -p {dist} && printf %s {content} > {dist}/{WHEEL} && "
              f"echo run >> {tmp_path}/builds.txt")
    return CachedWheelBuild("pkg", str(tmp_path / "cache"), str(dist), Run(("bash", "-c", script)),
                            fixed=("package pkg 1.0",))


def builds(tmp_path: Path) -> int:
    try:
        return len((tmp_path / "builds.txt").read_text().splitlines())
    except FileNotFoundError:
        return 0


def entry_of(tmp_path: Path) -> Path:
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    return entry


@pytest.mark.parametrize("how", ["execute", "bash"])
def test_a_replaced_cached_wheel_is_rebuilt_saying_so(tmp_path, how):
    action = cached_build(tmp_path)

    def run() -> str:
        if how == "execute":
            ctx = Ctx()
            action.execute(ctx)
            ctx.log.seek(0)
            return ctx.log.read()
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", action.to_bash()], env=BASH_ENV,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout + proc.stderr

    run()
    entry = entry_of(tmp_path)
    assert (entry / SUMS).read_text().endswith(f"  {WHEEL}\n") and builds(tmp_path) == 1
    assert oct((entry / WHEEL).stat().st_mode & 0o777) == oct(0o644) and (entry.stat().st_mode & 0o777) == 0o755
    log = run()
    assert "reusing the wheel built before" in log and builds(tmp_path) == 1
    (entry / WHEEL).write_text("a user's code")          # replaced in the cache
    log = run()
    assert f"does not have the sha256 recorded in {SUMS}" in log and "building again" in log
    assert builds(tmp_path) == 2
    assert (tmp_path / "dist" / WHEEL).read_text() == "built"
    assert (entry_of(tmp_path) / WHEEL).read_text() == "built"  # stored anew, with its sha256
    assert check_entry(str(entry_of(tmp_path))) == ([str(entry_of(tmp_path) / WHEEL)], None)


def _entry(tmp_path: Path) -> Path:
    entry = tmp_path / "e"
    entry.mkdir(mode=0o755)
    (entry / WHEEL).write_text("w")
    write_sums(str(entry))
    return entry


@pytest.mark.parametrize("harm,problem", [
    (lambda e: os.chmod(e / WHEEL, 0o666), "not a plain file that only its owner can write"),
    (lambda e: os.chmod(e, 0o777), "a directory that another user can write"),
    (lambda e: (e / SUMS).unlink(), f"no {SUMS}"),
    (lambda e: (e / "other-1.0-py3-none-any.whl").write_text("x"), f"are not those of {SUMS}"),
    (lambda e: (e / WHEEL).write_text("v"), "does not have the sha256"),
])
def test_an_entry_that_cannot_be_trusted_is_refused_and_removed(tmp_path, harm, problem):
    entry = _entry(tmp_path)
    assert check_entry(str(entry)) == ([str(entry / WHEEL)], None)
    harm(entry)
    log = io.StringIO()
    assert reuse("pkg", str(entry), str(tmp_path / "dist"), log) is False
    assert problem in log.getvalue() and not entry.exists() and not (tmp_path / "dist").exists()


def test_a_link_in_place_of_an_entry_is_removed_not_followed(tmp_path):
    real = _entry(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert reuse("pkg", str(link), str(tmp_path / "dist"), io.StringIO()) is False
    assert not os.path.lexists(link) and (real / WHEEL).exists()


def test_the_action_command_exits_0_on_a_hit_and_1_otherwise(tmp_path):
    entry = _entry(tmp_path)
    cmd = [*HPCSTACK, "action", "reuse-wheel", "pkg", str(entry), str(tmp_path / "dist")]
    hit = subprocess.run(cmd, capture_output=True, text=True)
    assert hit.returncode == 0 and (tmp_path / "dist" / WHEEL).read_text() == "w", hit.stderr
    (entry / WHEEL).write_text("v")
    miss = subprocess.run(cmd, capture_output=True, text=True)
    assert miss.returncode == 1 and "does not have the sha256" in miss.stdout and not entry.exists()
    none = subprocess.run(cmd, capture_output=True, text=True)
    assert none.returncode == 1 and none.stdout == ""
