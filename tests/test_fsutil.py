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


def test_the_mode_is_given_to_the_file_written_not_to_what_holds_its_name(tmp_path, monkeypatch):
    """A member of a stack's group who can write the directory swaps the temporary name for a
    link to another file between the write and the mode: the mode goes to the file written
    (its descriptor), the other file keeps its own. Positive control: ``os.chmod`` by name gives
    the other file the mode."""
    import os
    import tempfile

    from hpcstack import fsutil

    other = tmp_path / "other"
    other.write_text("secret\n")
    other.chmod(0o600)
    real_mkstemp = tempfile.mkstemp

    def mkstemp_then_swap(*a, **k):
        fd, name = real_mkstemp(*a, **k)
        os.rename(name, name + ".moved")        # the file made stays open on fd
        os.symlink(other, name)                 # its name now leads elsewhere
        return fd, name
    monkeypatch.setattr(fsutil.tempfile, "mkstemp", mkstemp_then_swap)
    write_atomic(tmp_path / "f.txt", "new\n", 0o644)
    assert stat.S_IMODE(other.stat().st_mode) == 0o600
    assert other.read_text() == "secret\n"
    fd, name = mkstemp_then_swap(dir=tmp_path)
    os.close(fd)
    os.chmod(name, 0o644)                       # the control: by name, the link's target changes
    assert stat.S_IMODE(other.stat().st_mode) == 0o644


def test_a_fifo_or_a_device_is_not_hashed(tmp_path):
    """sha256_file refuses what is not a regular file at once: a FIFO put where a file was
    expected would block the reader, /dev/zero never ends."""
    import errno
    import os

    from hpcstack.fsutil import sha256_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero"):
        with pytest.raises(OSError) as exc:
            sha256_file(path)
        assert exc.value.errno == errno.EINVAL and str(path) in str(exc.value)
    (tmp_path / "f").write_bytes(b"abc")
    assert sha256_file(tmp_path / "f") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
