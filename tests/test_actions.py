"""Actions: each one's dry-run bash, run for real with bash, does what its execution does.

For every action with a file effect (Fetch, VerifySha256, Unpack, WriteFile, Publish and the
modules' WriteDefault), the test runs ``to_bash()`` with ``bash -euo pipefail`` in one fresh
directory and ``execute()`` in another, then compares the trees: same files, same bytes, same
permission bits, the same refusal of a bad download or an unsafe tar member.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from conftest import HPCSTACK, make_sdist
from hpcstack.fsutil import sha256_file
from hpcstack.install.actions import (Action, Capture, Fetch, Publish, Run, Unpack, VerifySha256, WriteFile,
                                      walk_commands)
from hpcstack.install.components.horovod import CheckBuild
from hpcstack.install.components.source import CachedWheelBuild
from hpcstack.errors import HpcstackError
from hpcstack.install.components.modulefile import WriteDefault

pytestmark = pytest.mark.unit

#: PATH for the dry-run lines: the installed ``hpcstack`` command first (``hpcstack action …``).
BASH_ENV = {**{k: v for k, v in os.environ.items() if k not in ("BASH_ENV", "ENV")},
            "PATH": f"{os.path.dirname(HPCSTACK[0])}:{os.environ.get('PATH', '')}"}


class Ctx:
    """What an action needs to execute: the environment, a log, no state directory."""

    def __init__(self):
        self.env = dict(BASH_ENV)
        self.log = io.StringIO()
        self.state_dir = None


def bash(action) -> subprocess.CompletedProcess:
    """Run an action's dry-run bash, as the dry-run script would (``set -euo pipefail``)."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", action.to_bash()], env=BASH_ENV,
                          capture_output=True, text=True, timeout=120)


def execute(action) -> str | None:
    """Execute an action; return its error message, or None when it succeeded."""
    try:
        action.execute(Ctx())
    except HpcstackError as exc:
        return str(exc)
    return None


def tree(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: relative path -> (kind, permission bits, content or link target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
        else:
            out[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes(), st.st_uid)
    return out


def both(tmp_path: Path, make, prepare=None):
    """Run ``make(root)``'s action as bash in ``tmp_path/bash`` and executed in ``tmp_path/py``.

    Returns:
        tuple: (bash result, execute's error or None, bash tree, python tree).
    """
    roots = {}
    for name in ("bash", "py"):
        roots[name] = tmp_path / name
        roots[name].mkdir(parents=True)
        if prepare:
            prepare(roots[name])
    res = bash(make(roots["bash"]))
    err = execute(make(roots["py"]))
    return res, err, tree(roots["bash"]), tree(roots["py"])


# ------------------------------------------------------------------------------- the protocol

def test_every_action_follows_the_protocol(tmp_path):
    run = Run(("true",))
    actions = [run, Capture(("true",), "/d"), Fetch("u", "0" * 64, "/d"), VerifySha256("/p", "0" * 64),
               Unpack("/a.tar.gz", "/d"), WriteFile("/p", "x"), Publish("/l", "/t"),
               CachedWheelBuild("x", "/r", "/d", run, prepare=(Run(("patch", "-p1")),)),
               CheckBuild("/v/bin/horovodrun", ("PyTorch",)), WriteDefault("/m", "n", "1", "tcl")]
    for action in actions:
        assert isinstance(action, Action), type(action).__name__
        assert all(isinstance(r, Run) for r in action.commands())
        assert isinstance(action.to_bash(), str)
    assert "patch" in [r.argv[0] for r in walk_commands(actions)]  # nested in the cached build


# ----------------------------------------------------------------------------------- fetch

def test_fetch_bash_and_execute_download_the_same_file_and_refuse_the_same_bad_one(tmp_path):
    sdist = make_sdist(tmp_path / "src")
    sha = sha256_file(sdist)
    res, err, tb, tp = both(tmp_path / "ok", lambda r: Fetch(sdist.as_uri(), sha, str(r / "cache" / sdist.name)))
    assert res.returncode == 0 and err is None, res.stderr
    assert tb == tp and tb["cache/" + sdist.name][2] == sdist.read_bytes()

    res, err, tb, tp = both(tmp_path / "bad", lambda r: Fetch(sdist.as_uri(), "1" * 64, str(r / sdist.name)))
    assert res.returncode == 1 and err and "sha256 mismatch" in err
    assert f"error: sha256 mismatch for {sdist.as_uri()}" in res.stderr
    assert tb == tp == {}  # the bad download is never left at its destination


def test_fetch_keeps_a_cached_file_with_the_right_hash(tmp_path):
    cached = tmp_path / "a.tar.gz"
    cached.write_bytes(b"cached bytes")
    action = Fetch("http://127.0.0.1:9/a.tar.gz", sha256_file(cached), str(cached))  # nothing listens
    assert bash(action).returncode == 0 and execute(action) is None
    assert cached.read_bytes() == b"cached bytes"


# --------------------------------------------------------------------------------- verify

def test_verify_bash_and_execute_accept_and_refuse_the_same_files(tmp_path):
    patch = tmp_path / "a.patch"
    patch.write_text("--- a\n+++ b\n")
    good, bad = VerifySha256(str(patch), sha256_file(patch)), VerifySha256(str(patch), "2" * 64)
    assert bash(good).returncode == 0 and execute(good) is None
    assert bash(bad).returncode != 0 and "sha256 mismatch" in execute(bad)
    missing = VerifySha256(str(tmp_path / "none"), "2" * 64)
    assert bash(missing).returncode != 0 and "missing file" in execute(missing)


# ---------------------------------------------------------------------------------- unpack

def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, kind=tarfile.REGTYPE, mode: int = 0o644, linkname: str = "", uid: int = 4242):
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.uid, info.gid = kind, mode, linkname, uid, uid
    return info


def test_unpack_bash_and_execute_give_the_same_tree(tmp_path):
    archive = _archive(tmp_path / "pkg-1.0.tar.gz", [
        (_member("pkg-1.0", tarfile.DIRTYPE, 0o775), None),
        (_member("pkg-1.0/setup.py", mode=0o666), b"print('setup')\n"),
        (_member("pkg-1.0/run.sh", mode=0o4777), b"#!/bin/sh\n"),   # set-uid, world-writable
        (_member("pkg-1.0/link", tarfile.SYMTYPE, linkname="setup.py"), None),
    ])

    def stale(root: Path):  # a stale tree from an earlier run: emptied first
        (root / "src" / "old").mkdir(parents=True)

    res, err, tb, tp = both(tmp_path / "t", lambda r: Unpack(str(archive), str(r / "src")), prepare=stale)
    assert res.returncode == 0 and err is None, res.stderr
    assert tb == tp
    assert "src/old" not in tb
    assert tb["src/pkg-1.0/setup.py"][1:] == (0o644, b"print('setup')\n", os.getuid())  # no-same-owner
    assert tb["src/pkg-1.0/run.sh"][1] == 0o755                          # no set-uid, no world write
    assert tb["src/pkg-1.0/link"] == ("link", "setup.py")


UNSAFE = {
    "parent": [(_member("../evil"), b"x")],
    "absolute": [(_member("/tmp/hpcstack-test-evil"), b"x")],
    "symlink out": [(_member("pkg/out", tarfile.SYMTYPE, linkname="../../.."), None)],
    "absolute symlink": [(_member("pkg/etc", tarfile.SYMTYPE, linkname="/etc"), None)],
    "hard link out": [(_member("pkg/passwd", tarfile.LNKTYPE, linkname="../../etc/passwd"), None)],
    "device": [(_member("pkg/null", tarfile.CHRTYPE), None)],
    "fifo": [(_member("pkg/fifo", tarfile.FIFOTYPE), None)],
}


@pytest.mark.parametrize("case", list(UNSAFE))
def test_unpack_bash_and_execute_refuse_the_same_unsafe_member(tmp_path, case):
    name = UNSAFE[case][-1][0].name
    archive = _archive(tmp_path / "bad.tar.gz", [(_member("pkg", tarfile.DIRTYPE, 0o755), None),
                                                  (_member("pkg/ok.py"), b"ok\n"), *UNSAFE[case]])
    res, err, tb, tp = both(tmp_path / "t", lambda r: Unpack(str(archive), str(r / "d" / "src")))
    assert res.returncode == 1 and err is not None, res.stdout + res.stderr
    assert f"unsafe member {name!r}" in err and f"unsafe member {name!r}" in res.stderr
    assert tb == tp == {"d": ("dir", tb["d"][1]), "d/src": ("dir", tb["d/src"][1])}  # nothing unpacked
    assert not (tmp_path / "t" / "evil").exists() and not os.path.exists("/tmp/hpcstack-test-evil")


# ------------------------------------------------------------------------------- write file

@pytest.mark.parametrize("content,mode", [("line 1\nHPCSTACK_EOF\n$HOME `x` \\n\n", 0o644),
                                          ("no final newline", 0o755), ("", 0o600)])
def test_write_file_bash_and_execute_write_the_same_bytes_and_bits(tmp_path, content, mode):
    res, err, tb, tp = both(tmp_path, lambda r: WriteFile(str(r / "a" / "f"), content, mode))
    assert res.returncode == 0 and err is None, res.stderr
    assert tb == tp and tb["a/f"][1:3] == (mode, content.encode())
    assert sorted(tb) == ["a", "a/f"]  # no temporary file left


def test_write_file_replaces_atomically_and_honours_unless_exists(tmp_path):
    def prepare(root: Path):
        (root / "f").write_text("old\n")
        (root / "marker").symlink_to("nowhere")  # a dangling link counts as existing

    res, err, tb, tp = both(tmp_path / "a", lambda r: WriteFile(str(r / "f"), "new\n", unless_exists=(str(r / "marker"),)),
                            prepare=prepare)
    assert res.returncode == 0 and err is None and tb == tp and tb["f"][2] == b"old\n"
    res, err, tb, tp = both(tmp_path / "b", lambda r: WriteFile(str(r / "f"), "new\n", unless_exists=(str(r / "no"),)),
                            prepare=prepare)
    assert res.returncode == 0 and err is None and tb == tp and tb["f"][2] == b"new\n"
    assert "mv -fT" in WriteFile("/p/f", "x").to_bash()  # a rename over the file, never `cat > file`


def test_write_file_where_no_directory_can_be_fails_both_ways(tmp_path):
    """A parent that is a file (root may write anywhere, so not a read-only directory): the bash
    and the Python execution both fail, and neither leaves the file or a temporary one."""
    def prepare(root: Path):
        (root / "ro").write_text("a file, not a directory\n")

    res, err, tb, tp = both(tmp_path, lambda r: WriteFile(str(r / "ro" / "f"), "x\n"), prepare=prepare)
    assert res.returncode != 0 and err
    assert any(word in err for word in ("Not a directory", "File exists")), err
    assert tb == tp and set(tb) == {"ro"}


@pytest.mark.parametrize("syntax", ["tcl", "lua"])
def test_write_default_bash_and_execute_agree(tmp_path, syntax):
    res, err, tb, tp = both(tmp_path / "new", lambda r: WriteDefault(str(r), "pytorch", "2.3.1-gpu", syntax, "x"))
    assert res.returncode == 0 and err is None and tb == tp and len(tb) == 1
    res, err, tb2, tp2 = both(tmp_path / "set", lambda r: WriteDefault(str(r), "pytorch", "9.9", syntax, "x"),
                              prepare=lambda r: (r / "default").symlink_to("2.2.0-gpu"))
    assert res.returncode == 0 and err is None and tb2 == tp2 == {"default": ("link", "2.2.0-gpu")}


# ---------------------------------------------------------------------------------- publish

def _builds(root: Path):
    for build in ("a", "b"):
        (root / f".1-{build}").mkdir(parents=True)
        (root / f".1-{build}" / "payload").write_text(build)


@pytest.mark.parametrize("before", ["nothing", "link", "directory"])
def test_publish_bash_and_execute_switch_the_same_link(tmp_path, before):
    def prepare(root: Path):
        _builds(root)
        if before == "link":
            (root / "1").symlink_to(".1-a")
        elif before == "directory":  # the layout before staging: moved aside, then linked
            (root / "1").mkdir()
            (root / "1" / "old").write_text("old")

    res, err, tb, tp = both(tmp_path, lambda r: Publish(str(r / "1"), str(r / ".1-b")),
                            prepare=prepare)
    assert res.returncode == 0 and err is None, res.stderr
    assert tb == tp and tb["1"] == ("link", ".1-b")
    assert not any(".publish-tmp" in p for p in tb)
    assert ("directory" == before) == (".1-pre-staging/old" in tb)


def test_publish_never_leaves_the_prefix_missing(tmp_path):
    """A reader polling the prefix while it is switched 40 times sees a build every time."""
    _builds(tmp_path)
    link = tmp_path / "1"
    link.symlink_to(".1-a")
    seen, stop = set(), threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.add((link / "payload").read_text())
            except OSError:
                seen.add("missing")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(40):
            assert execute(Publish(str(link), str(tmp_path / f".1-{'ab'[i % 2]}"))) is None
    finally:
        stop.set()
        thread.join()
    assert "missing" not in seen and seen <= {"a", "b"}
