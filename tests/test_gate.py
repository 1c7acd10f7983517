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


# ------------------------------------------------------------------------------ rmtree, rename

def test_rmtree_removes_links_in_the_tree_never_what_they_point_to(tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "keep").write_text("root's\n")
    (victim / "file").write_text("root's\n")
    tree = tmp_path / "cache" / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "a" / "dirlink").symlink_to(victim)             # a link to a directory, inside the tree
    (tree / "a" / "b" / "filelink").symlink_to(victim / "file")
    (tree / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tree / "fifo")
    with gate.directory(tmp_path / "cache") as fd:
        gate.rmtree(fd, "tree")
        assert os.listdir(fd) == []
    assert (victim / "sub" / "keep").read_text() == "root's\n" and (victim / "file").read_text() == "root's\n"
    # positive control: a walk by name that follows links (os.walk(followlinks=True)) reaches the victim
    (tmp_path / "t2").mkdir()
    (tmp_path / "t2" / "dirlink").symlink_to(victim)
    reached = [os.path.join(d, f) for d, _, files in os.walk(tmp_path / "t2", followlinks=True) for f in files]
    assert str(tmp_path / "t2" / "dirlink" / "sub" / "keep") in reached


def test_rmtree_refuses_a_link_or_a_file_at_the_name_and_leaves_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("root's\n")
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "file").write_text("")
    with gate.directory(tmp_path) as fd:
        refused(lambda: gate.rmtree(fd, "link"), f"{tmp_path}/link: a symbolic link")
        refused(lambda: gate.rmtree(fd, "file"), "not a directory")
        refused(lambda: gate.rmtree(fd, "../x"), "not the name of one entry")
        refused(lambda: gate.rmtree(fd, ".."), "not the name of one entry")
        with pytest.raises(FileNotFoundError):
            gate.rmtree(fd, "missing")
    assert (victim / "keep").read_text() == "root's\n" and (tmp_path / "link").is_symlink()


def test_rmtree_removes_a_deep_tree_without_recursion(tmp_path):
    deep = tmp_path / "deep"
    p = deep
    for _ in range(300):                # deeper than a recursive walk of the same frames would like
        p = p / "d"
    p.mkdir(parents=True)
    (p / "leaf").write_text("")
    with gate.directory(tmp_path) as fd:
        gate.rmtree(fd, "deep")
    assert not deep.exists()


_MOUNTED = textwrap.dedent("""\
    import os, shutil, subprocess, sys
    from hpcstack import gate
    top, how = sys.argv[1], sys.argv[2]
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", os.path.join(top, "tree", "sub", "mnt")], check=True)
    with open(os.path.join(top, "tree", "sub", "mnt", "keep"), "w") as f:
        f.write("other file system")
    try:
        if how == "gate":
            fd = os.open(top, gate.DIR_READ)     # not gate.directory: in a user namespace root is "nobody"
            gate.rmtree(fd, "tree")
        else:
            shutil.rmtree(os.path.join(top, "tree"), ignore_errors=True)     # by name: enters the mount
    except gate.GateError as exc:
        print("refused:", exc)
    print("kept" if os.path.exists(os.path.join(top, "tree", "sub", "mnt", "keep")) else "removed")
    """)


@pytest.mark.parametrize("how", ["gate", "by name"])
def test_rmtree_enters_no_other_file_system(tmp_path, how):
    """A file system mounted in the tree (a tmpfs, in a mount namespace of the test's own) is not
    entered: refused in one line, its file kept; the positive control, ``shutil.rmtree`` by name,
    removes the other file system's file."""
    (tmp_path / "tree" / "sub" / "mnt").mkdir(parents=True)
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    try:
        proc = subprocess.run([*unshare, sys.executable, "-c", _MOUNTED, str(tmp_path), how], capture_output=True,
                              text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if "mount" in proc.stderr and proc.returncode != 0:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    if how == "gate":
        assert f"refused: {tmp_path}/tree: {tmp_path}/tree/sub/mnt: a mount point" in proc.stdout, proc.stdout
        assert proc.stdout.endswith("kept\n"), proc.stdout
    else:
        assert proc.stdout == "removed\n", proc.stdout


def test_rename_within_a_directory_descriptor_replaces_a_link_without_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    d = tmp_path / "d"
    d.mkdir()
    (d / "new.tmp").write_text("new\n")
    (d / "current").symlink_to(victim)
    with gate.directory(d) as fd:
        gate.rename(fd, "new.tmp", "current")
        refused(lambda: gate.rename(fd, "current", "../elsewhere"), f"{d}/../elsewhere: not the name of one entry")
        refused(lambda: gate.rename(fd, "..", "x"), "not the name of one entry")
        refused(lambda: gate.rename(fd, "a/b", "x"), "not the name of one entry")
        with pytest.raises(FileNotFoundError):
            gate.rename(fd, "missing", "x")
        (d / "sub").mkdir()
        with gate.directory(d / "sub") as sub:
            gate.rename(fd, "current", "moved", new_dir_fd=sub)
    assert victim.read_text() == "root's\n" and not victim.is_symlink()
    assert (d / "sub" / "moved").read_text() == "new\n" and not (d / "sub" / "moved").is_symlink()
    assert sorted(p.name for p in d.iterdir()) == ["sub"]


# ------------------------------------------------------------------------------ exec

def _script(path: Path, text: str = "#!/bin/sh\necho ran\n", mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_checked_exec_path_names_the_checked_file_and_runs_it(tmp_path):
    tool = _script(tmp_path / "tool")
    got = gate.checked_exec_path(tmp_path / "tool")
    assert got == str(tool)
    assert subprocess.run([got], capture_output=True, text=True, check=True).stdout == "ran\n"
    assert gate.checked_exec_path(f"{tmp_path}/./tool") == str(tool)    # normalised
    # a venv's bin/python: a link in a checked directory, followed, the target checked too; the name
    # is kept (a venv's python finds pyvenv.cfg by it)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to("../../tool")
    assert gate.checked_exec_path(tmp_path / "venv" / "bin" / "python") == str(tmp_path / "venv" / "bin" / "python")
    # a link on a directory of the way, in a checked directory: followed likewise
    (tmp_path / "bin").symlink_to(tmp_path / "venv" / "bin")
    assert gate.checked_exec_path(tmp_path / "bin" / "python") == str(tmp_path / "bin" / "python")
    # the real interpreter running the tests passes (its chain is root's)
    real = os.path.realpath(sys.executable)
    assert gate.checked_exec_path(real) == real


def test_checked_exec_path_refuses_what_another_account_could_change(tmp_path):
    _script(tmp_path / "tool")
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    (open_ / "python").symlink_to(tmp_path / "tool")
    # positive control: run by name, the link in the open directory decides what runs
    assert subprocess.run([str(open_ / "python")], capture_output=True, text=True).stdout == "ran\n"
    refused(lambda: gate.checked_exec_path(open_ / "python"), f"{open_}: writable by every user")
    _script(open_ / "tool")
    refused(lambda: gate.checked_exec_path(open_ / "tool"), f"{open_}: writable by every user")
    # a link whose target lies in an open directory: refused there
    (tmp_path / "via").symlink_to(open_ / "tool")
    refused(lambda: gate.checked_exec_path(tmp_path / "via"), f"{open_}: writable by every user")
    # the file itself writable by others, not executable, not a regular file
    _script(tmp_path / "w", mode=0o777)
    refused(lambda: gate.checked_exec_path(tmp_path / "w"), "writable by every user")
    _script(tmp_path / "plain", mode=0o644)
    refused(lambda: gate.checked_exec_path(tmp_path / "plain"), "not executable")
    refused(lambda: gate.checked_exec_path(tmp_path), "not a regular file")
    os.mkfifo(tmp_path / "fifo")
    refused(lambda: gate.checked_exec_path(tmp_path / "fifo"), "not a regular file")
    # links in a loop, '..' and relative paths
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    refused(lambda: gate.checked_exec_path(tmp_path / "loop1"), "symbolic links on the way")
    refused(lambda: gate.checked_exec_path(f"{tmp_path}/open/../tool"), "'..'")
    refused(lambda: gate.checked_exec_path("tool"), "not an absolute path")
    with pytest.raises(FileNotFoundError):
        gate.checked_exec_path(tmp_path / "missing")
    # a trusted group's write access is accepted where the policy says so
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o770)
    if os.geteuid() == 0:
        os.chown(group, -1, 100)
    _script(group / "tool")
    refused(lambda: gate.checked_exec_path(group / "tool", trust.Policy(uid=os.geteuid())), "writable by group")
    pol = trust.Policy(uid=os.geteuid(), stack_gids=frozenset({group.stat().st_gid}))
    assert gate.checked_exec_path(group / "tool", pol) == str(group / "tool")


@pytest.mark.integration          # root gives the link to another account: not the unit level's throw-away user
def test_checked_exec_path_refuses_a_link_another_account_made_in_a_sticky_directory(tmp_path):
    """In a sticky directory (``/tmp``'s rule) a child of a trusted account passes, another's
    link does not: made here with the owner changed (as root) or skipped."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the link to another account")
    _script(tmp_path / "tool")
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "mine").symlink_to(tmp_path / "tool")
    assert gate.checked_exec_path(sticky / "mine") == str(sticky / "mine")
    (sticky / "theirs").symlink_to(tmp_path / "tool")
    os.lchown(sticky / "theirs", 65534, 65534)
    refused(lambda: gate.checked_exec_path(sticky / "theirs"), f"{sticky}: writable by every user")


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


def test_read_file_with_one_link_refuses_a_file_that_is_also_elsewhere(tmp_path):
    """``one_link``: a file with a second hard link (another directory's file linked in) is
    refused; without it (positive control) it is read."""
    (tmp_path / "elsewhere").write_text("secret\n")
    os.link(tmp_path / "elsewhere", tmp_path / "record")
    assert gate.read_file(tmp_path / "record", 100) == b"secret\n"
    refused(lambda: gate.read_file(tmp_path / "record", 100, one_link=True), "has 2 hard links")
    (tmp_path / "elsewhere").unlink()
    assert gate.read_file(tmp_path / "record", 100, one_link=True) == b"secret\n"


def test_open_file_gives_a_descriptor_of_the_checked_regular_file(tmp_path):
    (tmp_path / "f").write_bytes(b"content")
    fd = gate.open_file(tmp_path / "f")
    with os.fdopen(fd, "rb") as f:
        assert f.read() == b"content" and stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    os.mkfifo(tmp_path / "fifo")    # no writer: the open does not block, and it is refused
    refused(lambda: gate.open_file(tmp_path / "fifo"), "not a regular file")
    refused(lambda: gate.open_file(tmp_path), "not a regular file")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    refused(lambda: gate.open_file(tmp_path / "link"), "a symbolic link")
    (tmp_path / "f").chmod(0o666)
    refused(lambda: gate.open_file(tmp_path / "f"), "writable by every user")
    with pytest.raises(FileNotFoundError):
        gate.open_file(tmp_path / "missing")


def test_resolved_follows_only_links_that_trusted_accounts_alone_can_have_put(tmp_path):
    """gate.resolved: what a caller hands the gate for a path through a link. A link of a
    trusted account in directories only trusted accounts can write is followed (a root-owned
    /scratch -> /lustre/scratch); one in a directory others can write, or that only a stack
    group the policy trusts to write may change, is left as named, and the gate refuses it."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "rel").symlink_to("real/sub")
    assert gate.resolved(tmp_path / "link" / "sub" / "missing" / "x") == str(real / "sub" / "missing" / "x")
    assert gate.resolved(tmp_path / "rel") == str(real / "sub")
    assert gate.resolved(f"{tmp_path}/rel/../sub") == str(real / "sub")     # '..' of the link's target
    open_ = tmp_path / "open"
    open_.mkdir()
    open_.chmod(0o777)
    (open_ / "l").symlink_to(real)
    assert gate.resolved(open_ / "l" / "sub") == str(open_ / "l" / "sub")
    refused(lambda: gate.open_dir(gate.resolved(open_ / "l" / "sub")), f"{open_ / 'l'}: a symbolic link")
    # below a directory others can write, even a link further down is not followed
    (open_ / "d").mkdir()
    (open_ / "d" / "l").symlink_to(real)
    assert gate.resolved(open_ / "d" / "l") == str(open_ / "d" / "l")
    # a stack group may write the directory (the gate accepts it), not send the walk elsewhere
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o770)
    if os.geteuid() == 0:
        os.chown(group, -1, 100)
    (group / "l").symlink_to(real)
    pol = trust.Policy(uid=os.geteuid(), stack_gids=frozenset({group.stat().st_gid}))
    os.close(gate.open_dir(group, pol))
    assert gate.resolved(group / "l", pol) == str(group / "l")
    # --trust-writable: every link followed
    assert gate.resolved(open_ / "l", trust.Policy(uid=os.geteuid(), trust_writable=True)) == str(real)
    refused(lambda: gate.resolved("relative"), "not an absolute path")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    refused(lambda: gate.resolved(tmp_path / "loop"), "symbolic links on the way")


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


@pytest.mark.integration
def test_checked_exec_path_refuses_a_users_interpreter_and_a_link_to_it(attacker):
    """A user's ``bin/python`` (their directory) and root's link to it: refused, nothing run; the
    positive control runs it by name and the canary appears."""
    theirs = attacker.mkdir(attacker.shared / "venv" / "bin")
    python = attacker.write(theirs / "python", f"#!/bin/sh\n{attacker.shell_payload()}\n", 0o755)
    subprocess.run([str(python)], check=True)
    assert attacker.canary.exists()
    attacker.canary.unlink()

    refused(lambda: gate.checked_exec_path(python), f"{theirs}: owned by {attacker.name}")
    (attacker.shared / "python").symlink_to(python)         # root's link in root's directory
    refused(lambda: gate.checked_exec_path(attacker.shared / "python"), f"{theirs}: owned by {attacker.name}")
    assert not attacker.canary.exists()


@pytest.mark.integration
def test_rmtree_of_a_tree_holding_a_users_directory_removes_nothing_outside_it(attacker):
    """Root removes a spool whose entry a user owns and filled with links to root's files and to
    a directory of root's: the links go, their targets stay."""
    spool = attacker.shared / "spool"
    spool.mkdir()
    keep = attacker.shared / "keep"
    keep.mkdir()
    (keep / "f").write_text("root's\n")
    entry = attacker.mkdir(spool / "entry")
    attacker.sh(f"ln -s {keep} {entry}/dir && ln -s {keep}/f {entry}/file && mkdir {entry}/sub && "
                f"ln -s / {entry}/sub/root")
    with gate.directory(attacker.shared) as fd:
        gate.rmtree(fd, "spool")
    assert sorted(p.name for p in attacker.shared.iterdir()) == ["keep"]
    assert (keep / "f").read_text() == "root's\n"
