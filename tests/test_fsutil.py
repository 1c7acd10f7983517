"""hpcstack.fsutil.write_atomic: the new file whole, or the old one untouched."""

from __future__ import annotations

import stat

import pytest

from hpcstack.fsutil import write_atomic

pytestmark = pytest.mark.unit


def test_writes_the_file_with_its_mode_and_parents(tmp_path):
    path = tmp_path / "a" / "b" / "f.txt"
    write_atomic(path, "hello\n", 0o640)
    assert path.read_text() == "hello\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    write_atomic(str(path), "again\n")
    assert path.read_text() == "again\n" and stat.S_IMODE(path.stat().st_mode) == 0o644


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "f.txt"
    write_atomic(path, "old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "new \udcff\n")      # a lone surrogate cannot be written as UTF-8
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]
