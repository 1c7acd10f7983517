"""The gate for root's file operations (:mod:`hpcstack.gate`): every path walked from ``/`` by
descriptor, no link followed anywhere on it, each directory checked against the trust rule, the
operation done on a descriptor of what was checked.

Each attack has a positive control: the same setting against the operation by name that the gate
replaces (``os.chmod``, ``open``) shows the effect, so that a test whose gate did nothing fails.
The unit tests run as whoever runs them, in their own temporary directory; the tests with another
account (``rtuser``, tests/attacker.py) need root and are integration tests.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attacker import attacker  # noqa: F401
from hpcstack import gate, trust
from hpcstack.errors import HpcstackError

pytestmark = pytest.mark.unit


def refused(call, *words: str) -> str:
    """Run ``call``; it must raise :class:`gate.GateError` (an HpcstackError), one line naming
    ``words``. Returns the line."""
    with pytest.raises(gate.GateError) as info:
        call()
    line = str(info.value)
    assert isinstance(info.value, HpcstackError) and "\n" not in line, line
    for word in words:
        assert word in line, (word, line)
    return line


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ------------------------------------------------------------------------------ links

def test_a_link_anywhere_on_the_path_is_refused_and_nothing_is_written_through_it(tmp_path):
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "f").write_text("root's\n")
    (tmp_path / "link").symlink_to(real)
    via = tmp_path / "link" / "sub"
    # positive control: the same path by name reaches the real directory
    assert (via / "f").read_text() == "root's\n"

    refused(lambda: gate.open_dir(via), f"{tmp_path / 'link'}: a symbolic link")
    refused(lambda: gate.read_file(via / "f", 100), "a symbolic link")
    refused(lambda: gate.write_atomic(via / "new", "x"), "a symbolic link")
    refused(lambda: gate.mkdir(via / "d", 0o755), "a symbolic link")
    assert sorted(p.name for p in (real / "sub").iterdir()) == ["f"]
    # the last component a link: refused too, the target unread
    (tmp_path / "flink").symlink_to(real / "sub" / "f")
    refused(lambda: gate.read_file(tmp_path / "flink", 100), "a symbolic link")
    # the real path passes
    with gate.directory(real / "sub") as fd:
        assert os.listdir(fd) == ["f"]
    assert gate.read_file(real / "sub" / "f", 100) == b"root's\n"


def test_relative_paths_and_dot_dot_are_refused(tmp_path):
    refused(lambda: gate.open_dir("relative/dir"), "not an absolute path")
    refused(lambda: gate.open_dir(f"{tmp_path}/../{tmp_path.name}"), "'..'")


# ------------------------------------------------------------------------------ the rule

def test_directories_others_can_write_are_refused_unless_sticky_above_a_trusted_child(tmp_path):
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    refused(lambda: gate.write_atomic(open_ / "f", "x"), f"{open_}: writable by every user")
    assert list(open_.iterdir()) == []
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    gate.write_atomic(sticky / "f", "mine\n", 0o644)        # /tmp's rule: the child is this account's
    assert (sticky / "f").read_text() == "mine\n" and mode_of(sticky / "f") == 0o644
    refused(lambda: gate.open_dir(sticky), "writable by every user")  # as the last component: refused
    # a trusted group is accepted where the policy says so (the site's stack group)
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o770)
    if os.geteuid() == 0:
        os.chown(group, -1, 100)            # root's group is trusted; another group is not
    gid = group.stat().st_gid
    refused(lambda: gate.open_dir(group, trust.Policy(uid=os.geteuid())), f"{group}: writable by group")
    with gate.trusting(trust.Policy(uid=os.geteuid(), stack_gids=frozenset({gid}))):
        os.close(gate.open_dir(group))


# ------------------------------------------------------------------------------ fchmod

def test_fchmod_through_a_lock_file_swapped_for_a_link_does_not_touch_the_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    cache = tmp_path / "cache"
    cache.mkdir()
    lock = cache / "x.lock"
    lock.write_text("")
    lock.chmod(0o666)
    with gate.directory(cache) as fd:
        lock.unlink()
        lock.symlink_to(victim)                 # swapped after the directory was opened
        refused(lambda: gate.fchmod(fd, "x.lock", 0o755), f"{cache}/x.lock: a symbolic link")
        assert mode_of(victim) == 0o600
        # positive control: chmod by name goes through the link
        os.chmod(lock, 0o755)
        assert mode_of(victim) == 0o755
        victim.chmod(0o600)
        # a regular file is changed; a function of its mode decides
        lock.unlink()
        lock.write_text("")
        lock.chmod(0o666)
        st = gate.fchmod(fd, "x.lock", lambda s: stat.S_IMODE(s.st_mode) & 0o755)
        assert stat.S_IMODE(st.st_mode) == 0o666 and mode_of(lock) == 0o644
        # a second hard link of another file: refused (the file is also elsewhere)
        os.link(victim, cache / "hard.lock")
        refused(lambda: gate.fchmod(fd, "hard.lock", 0o644), "hard links")
        assert mode_of(victim) == 0o600
        os.mkfifo(cache / "fifo.lock")
        refused(lambda: gate.fchmod(fd, "fifo.lock", 0o600), "not a regular file")
        refused(lambda: gate.fchmod(fd, "../victim", 0o644), "not the name of one entry")


def test_unlink_removes_a_link_itself_never_a_directory(tmp_path):
    (tmp_path / "target").write_text("kept\n")
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "target")
    with gate.directory(tmp_path) as fd:
        gate.unlink(fd, "l")
        refused(lambda: gate.unlink(fd, "d"), "a directory")
    assert not os.path.lexists(tmp_path / "l") and (tmp_path / "target").read_text() == "kept\n"
    assert (tmp_path / "d").is_dir()


def test_walk_files_enters_no_linked_directory(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.lock").write_text("")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "y.lock").write_text("")
    (tmp_path / "a" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "a" / "archive-v0").mkdir()
    (tmp_path / "a" / "archive-v0" / "z.lock").write_text("")
    with gate.directory(tmp_path / "a") as top:
        seen = sorted(n for _, names in gate.walk_files(top, skip_dir=lambda n: n.startswith("archive-v"))
                      for n in names)
    assert seen == ["link", "x.lock"]


# ------------------------------------------------------------------------------ write, read, mkdir

_PARTIAL = textwrap.dedent("""\
    import os, resource, signal, sys
    from hpcstack import gate
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    path, how = sys.argv[1], sys.argv[2]
    try:
        if how == "gate":
            gate.write_atomic(path, b"n" * (1 << 20), 0o644)
        else:
            with open(path, "wb") as f:
                f.write(b"n" * (1 << 20))
    except OSError as exc:
        print(exc.errno)
    """)


@pytest.mark.parametrize("how", ["gate", "by name"])
def test_write_atomic_leaves_no_partial_file(tmp_path, how):
    """A write that fails half-way (the file-size limit reached: EFBIG, as a full disk gives
    ENOSPC) leaves the old file whole and no temporary file; the positive control, a plain write
    by name, leaves a partial file."""
    target = tmp_path / "config"
    target.write_bytes(b"o" * 100)
    proc = subprocess.run([sys.executable, "-c", _PARTIAL, str(target), how], capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert proc.returncode == 0 and proc.stdout.strip() == "27", proc.stdout + proc.stderr  # EFBIG
    if how == "gate":
        assert target.read_bytes() == b"o" * 100
        assert [p.name for p in tmp_path.iterdir()] == ["config"]
    else:
        data = target.read_bytes()
        assert data != b"o" * 100 and len(data) < 1 << 20, len(data)       # neither old nor new


def test_write_atomic_replaces_a_link_at_the_name_without_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    (tmp_path / "out").symlink_to(victim)
    gate.write_atomic(tmp_path / "out", "new\n", 0o640)
    assert victim.read_text() == "root's\n"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_text() == "new\n"
    assert mode_of(tmp_path / "out") == 0o640


def test_read_file_takes_regular_files_up_to_its_limit_only(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert gate.read_file(tmp_path / "f", 10) == b"x" * 10
    refused(lambda: gate.read_file(tmp_path / "f", 9), "larger than 9 bytes")
    os.mkfifo(tmp_path / "fifo")    # opened without blocking (no writer), and refused
    refused(lambda: gate.read_file(tmp_path / "fifo", 10), "not a regular file")
    (tmp_path / "open").write_text("x")
    (tmp_path / "open").chmod(0o666)
    refused(lambda: gate.read_file(tmp_path / "open", 10), "writable by every user")
    with pytest.raises(FileNotFoundError):
        gate.read_file(tmp_path / "missing", 10)


def test_mkdir_sets_the_mode_of_what_it_makes_and_reports_what_it_found(tmp_path):
    made, st = gate.mkdir(tmp_path / "a" / "b", 0o1733, parents=True)
    assert made and stat.S_IMODE(st.st_mode) == 0o1733 == mode_of(tmp_path / "a" / "b")
    assert mode_of(tmp_path / "a") == 0o755
    (tmp_path / "a" / "b").chmod(0o700)
    made, st = gate.mkdir(tmp_path / "a" / "b", 0o1733)
    assert not made and stat.S_IMODE(st.st_mode) == 0o700 == mode_of(tmp_path / "a" / "b")  # found: unchanged
    (tmp_path / "file").write_text("")
    refused(lambda: gate.mkdir(tmp_path / "file", 0o755), "not a directory")
    with pytest.raises(FileNotFoundError):
        gate.mkdir(tmp_path / "missing" / "x", 0o755)


# ------------------------------------------------------------------------------ another account

@pytest.mark.integration
def test_a_directory_owned_by_another_account_is_refused(attacker):
    theirs = attacker.mkdir(attacker.shared / "theirs")
    # positive control: root writes there by name without a word
    (theirs / "control").write_text("x")
    (theirs / "control").unlink()

    line = refused(lambda: gate.write_atomic(theirs / "f", "root's\n"), f"{theirs}: owned by {attacker.name}")
    assert line.startswith(f"{theirs}/f: ")
    refused(lambda: gate.open_dir(theirs / "."), f"owned by {attacker.name}")
    refused(lambda: gate.mkdir(theirs / "d", 0o755), f"owned by {attacker.name}")
    attacker.write(theirs / "data", "theirs\n")
    refused(lambda: gate.read_file(theirs / "data", 100), f"owned by {attacker.name}")
    assert sorted(p.name for p in theirs.iterdir()) == ["data"]
    # below a root-owned directory, a directory of theirs at the name asked for is refused as found
    refused(lambda: gate.mkdir(theirs, 0o755), f"owned by {attacker.name}")


@pytest.mark.integration
def test_usage_hook_install_changes_no_directory_it_did_not_make(attacker):
    """``usage-hook install`` on a usage directory whose ``spool`` an admin made 0700: refused in
    one line, the spool still 0700 (it used to become 1733); made by it, the modes are the
    layout's; a spool that is a link is refused."""
    from hpcstack.lifecycle import usage

    cfg = usage.UsageConfig(str(attacker.shared / "usage"))
    made = usage.install_hooks(cfg, "/opt/modulefiles", "s")
    assert f"{cfg.spool}/" in made and mode_of(cfg.spool) == 0o1733 and mode_of(Path(cfg.directory)) == 0o755
    assert usage.install_hooks(cfg, "/opt/modulefiles", "s")       # again: found as made, hooks rewritten
    cfg.spool.chmod(0o700)
    with pytest.raises(HpcstackError) as info:
        usage.install_hooks(cfg, "/opt/modulefiles", "s")
    assert str(info.value).startswith(f"{cfg.spool}: mode 0700, not 1733;") and "\n" not in str(info.value)
    assert mode_of(cfg.spool) == 0o700
    cfg.spool.rmdir()
    elsewhere = attacker.mkdir(attacker.home / "spool", 0o700)
    cfg.spool.symlink_to(elsewhere)
    with pytest.raises(HpcstackError, match="a symbolic link"):
        usage.install_hooks(cfg, "/opt/modulefiles", "s")
    assert mode_of(elsewhere) == 0o700
