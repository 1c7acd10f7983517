"""Tar extraction against chains of the archive's own symbolic links, on every Python version.

Python's ``tarfile`` extraction filters (3.11.4 and later) check each member against the
filesystem as it is unpacked; Debian 12's Python 3.11.2 has none, and hpcstack's own check runs
before anything is unpacked. These tests take the filters away (the 3.11.2 code path) and check
that the archive's tree itself is judged: a member reached through links unpacked before it, a
link whose target goes out through other links, a loop. A refused archive leaves its
destination empty and nothing outside it.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from hpcstack.errors import HpcstackError
from hpcstack.install.archive import safe_unpack, unsafe_members

pytestmark = pytest.mark.unit


def _info(name: str, kind=tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def dir_(name):
    return _info(name, tarfile.DIRTYPE), None


def file_(name, data=b"payload\n"):
    return _info(name), data


def link(name, target):
    return _info(name, tarfile.SYMTYPE, target), None


def hard(name, target):
    return _info(name, tarfile.LNKTYPE, target), None


def archive(path: Path, members) -> Path:
    with tarfile.open(path, "w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@pytest.fixture
def no_filters(monkeypatch):
    """Python 3.11.2's tarfile: no extraction filters (``tarfile.data_filter`` missing)."""
    if hasattr(tarfile, "data_filter"):  # what safe_unpack looks for; tarfile itself uses the others
        monkeypatch.delattr(tarfile, "data_filter")
    assert not hasattr(tarfile, "data_filter")


BAD = {
    # a/b is made through a (the directory itself), so it is the link b -> .. of the directory
    "the chain a -> ., a/b -> .., a/b/x": ([link("a", "."), link("a/b", ".."), file_("a/b/x")], "a/b"),
    "a directory through a chain": ([link("a", "."), link("a/b", ".."), dir_("a/b/d")], "a/b"),
    "a file through a link made through a link": ([dir_("d"), link("d/up", ".."), link("d/up/u2", "d/up/.."),
                                                   file_("u2/x")], "d/up/u2"),
    "a link out through an earlier link": ([link("a", "."), link("c", "a/a/a/..")], "c"),
    "a link made outward by a later link": ([dir_("a"), link("x", "a/b/../.."), link("a/b", ".")], "x"),
    "a hard link through a link": ([dir_("d"), link("d/a", "."), hard("h", "d/a/../../victim")], "h"),
    "a link to itself": ([link("l", "l")], "l"),
    "a loop of two links": ([link("l", "m"), link("m", "l"), file_("l/x")], "m"),
    "a file in place of a link": ([dir_("pkg"), link("pkg/f", "../.."), file_("pkg/f")], "pkg/f"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_link_chain_out_of_the_directory_is_refused_without_extraction_filters(tmp_path, no_filters, case):
    members, bad_name = BAD[case]
    tar = archive(tmp_path / "bad.tar", members)
    outer = tmp_path / "outer"
    dest = outer / "d" / "src"
    with pytest.raises(HpcstackError) as err:
        safe_unpack(str(tar), str(dest))
    assert f"unsafe member {bad_name!r}" in str(err.value) and "refusing to unpack" in str(err.value)
    assert list(dest.iterdir()) == []                          # the destination is left empty
    assert sorted(p.name for p in outer.rglob("*")) == ["d", "src"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.tar", "outer"]


def test_the_chain_is_refused_by_the_check_itself_on_this_python(tmp_path):
    """The check judges the archive's tree, not the filesystem: the same answer whatever Python."""
    members = [m for m, _ in BAD["the chain a -> ., a/b -> .., a/b/x"][0]]
    bad = unsafe_members(members, str(tmp_path))
    assert bad is not None and bad[0].name == "a/b" and "outside the directory ('..')" in bad[1]
    # without the link a/b, a/x reached through a -> . is inside
    assert unsafe_members([members[0], _info("a/x")], str(tmp_path)) is None


def test_links_that_stay_inside_are_unpacked_without_extraction_filters(tmp_path, no_filters):
    tar = archive(tmp_path / "ok.tar", [
        dir_("."), dir_("pkg-1.0"), file_("pkg-1.0/setup.py", b"print(1)\n"),
        link("pkg-1.0/alias.py", "setup.py"), link("pkg-1.0/here", "."), dir_("pkg-1.0/sub"),
        link("pkg-1.0/sub/up", ".."), file_("pkg-1.0/here/through.txt", b"t\n"),
        hard("pkg-1.0/copy.py", "pkg-1.0/setup.py"),
    ])
    dest = tmp_path / "d"
    safe_unpack(str(tar), str(dest))
    root = dest / "pkg-1.0"
    assert (root / "alias.py").read_bytes() == b"print(1)\n"
    assert (root / "sub" / "up" / "through.txt").read_bytes() == b"t\n"
    assert (root / "copy.py").read_bytes() == b"print(1)\n"
    assert os.readlink(root / "here") == "."


def test_a_failed_unpack_leaves_the_destination_empty(tmp_path):
    good = archive(tmp_path / "ok.tar", [dir_("pkg"), file_("pkg/a", b"a" * 10000)])
    truncated = tmp_path / "cut.tar"
    truncated.write_bytes(good.read_bytes()[:1500])
    dest = tmp_path / "d"
    dest.mkdir()
    (dest / "stale").write_text("old\n")
    with pytest.raises(HpcstackError, match="cannot unpack"):
        safe_unpack(str(truncated), str(dest))
    assert list(dest.iterdir()) == []
