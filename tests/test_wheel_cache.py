"""The source-build cache: every entry carries its wheels' sha256, checked before each reuse.

A wheel replaced in the cache (by a user who could write there, or by a disk error) is never
reused: the entry is removed and the wheel built again, and the log says why. The dry-run's
bash (``hpcstack action reuse-wheel``) and the real run decide the same way.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import HPCSTACK
from hpcstack.install.actions import Run
from hpcstack import gate, trust
from hpcstack.install.components.source import CachedWheelBuild, store_wheels
from hpcstack.install.wheelcache import SUMS, check_entry, discard, reuse

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
    """An entry ``<tmp_path>/e`` as the install stores it (store_wheels: the wheel, key.txt, SUMS)."""
    built = tmp_path / "built"
    built.mkdir(exist_ok=True)
    (built / WHEEL).write_text("w")
    return Path(store_wheels(os.path.realpath(tmp_path), "e", [str(built / WHEEL)], "key\n"))


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


# ------------------------------------------------------------ a group-writable cache (issue 45)

def test_an_entry_swapped_after_its_check_is_not_what_is_copied(tmp_path, monkeypatch):
    """A member of the stack group may rename entries in the cache (0770): one who moves the
    checked entry aside and puts their own at its name once the sha256 have been compared got
    their wheel copied by name. The wheels are copied from the descriptors that were hashed."""
    entry = _entry(tmp_path)
    real_sha256, swapped = hashlib.sha256, []

    class Spy:
        """hashlib.sha256 whose digest, once read, lets the swap happen."""

        def __init__(self, *args):
            self.h = real_sha256(*args)

        def update(self, block):
            self.h.update(block)

        def hexdigest(self):
            digest = self.h.hexdigest()
            if not swapped:
                os.rename(entry, tmp_path / "checked")
                entry.mkdir()
                (entry / WHEEL).write_text("a user's code")
                swapped.append(True)
            return digest

    monkeypatch.setattr(hashlib, "sha256", Spy)
    assert reuse("pkg", str(entry), str(tmp_path / "dist"), io.StringIO()) is True
    assert swapped and (tmp_path / "dist" / WHEEL).read_text() == "w"


def test_a_link_put_in_dist_as_it_is_made_is_not_written_through(tmp_path, monkeypatch):
    """The stage directory may be the group's (0770): a member who puts a link at dist/<wheel>
    right after dist is made made root write the wheel through it (shutil.copy). The wheels are
    created O_EXCL|O_NOFOLLOW in dist's descriptor: the reuse is refused, the target untouched."""
    entry = _entry(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    dist = tmp_path / "stage" / "dist"
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)
        if dist.is_dir() and not os.path.lexists(dist / WHEEL):
            (dist / WHEEL).symlink_to(victim)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(gate.GateError, match=str(dist)):
        reuse("pkg", str(entry), str(dist), io.StringIO())
    assert victim.read_text() == "root's file\n"


def test_a_link_in_a_group_writable_cache_is_not_followed(tmp_path):
    """The site's stack group may write the cache, not decide where root reads and removes: a
    package's cache directory swapped for a link to another directory is refused (one line) by
    check_entry, reuse and discard; nothing there is read, copied or removed."""
    other = tmp_path / "other"
    other.mkdir()
    real = _entry(other)
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o770)
    if os.geteuid() == 0:
        os.chown(cache, -1, 100)            # root's group is trusted; another group is not
    (cache / "pkg-1.0").symlink_to(other)
    pol = trust.Policy(uid=os.geteuid(), stack_gids=frozenset({cache.stat().st_gid}))
    entry = str(cache / "pkg-1.0" / "e")
    assert (Path(entry) / WHEEL).read_text() == "w"        # control: by name, the link leads there
    with gate.trusting(pol):                                # as the install runs them
        assert check_entry(str(cache / "e")) == ([], None)  # the group's own cache directory passes
        for call in (lambda: check_entry(entry), lambda: reuse("pkg", entry, str(tmp_path / "dist"), io.StringIO()),
                     lambda: discard(entry)):
            with pytest.raises(gate.GateError, match=f"{cache / 'pkg-1.0'}: a symbolic link") as info:
                call()
            assert "\n" not in str(info.value)
    with pytest.raises(gate.GateError, match="writable by group"):   # a policy without the group
        check_entry(str(cache / "e"), trust.Policy(uid=os.geteuid()))
    assert (real / WHEEL).read_text() == "w" and (real / SUMS).exists() and not (tmp_path / "dist").exists()


def test_discard_renames_the_entry_aside_and_removes_it_by_descriptor(tmp_path):
    """discard: a link in the entry is removed itself, never what it points to."""
    entry = _entry(tmp_path)
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "f").write_text("kept\n")
    (entry / "link").symlink_to(keep)
    discard(str(entry))
    assert not os.path.lexists(entry) and (keep / "f").read_text() == "kept\n"
    assert [p.name for p in tmp_path.iterdir() if "discarded" in p.name] == []
