"""An ordinary user of the login node against ``hpcstack compare`` run by root.

``compare`` reads every file a stack's ``RECORD`` names and hashes it: run by root on a
directory that the user ``rtuser`` (tests/attacker.py) can change, it would read whatever the user
puts there, whenever the user puts it (a directory swapped during the run, a file that is
another name of one the user cannot read). So a directory argument that another account can
change, or that lies below one, is refused as an install root is (hpcstack.trust.check_dirs):
one ``error:`` line, exit status 2, nothing read. The control: root's own copy of the same stack
compares as the same stack.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from attacker import attacker  # noqa: F401
from test_attacker_trust import hs, refused
from test_compare import make_stack

pytestmark = pytest.mark.integration

DISTS = {"alpha": "1.0", "beta": "2.0"}


def root_stack(path: Path) -> Path:
    """A stack of :data:`DISTS` that root makes at ``path``, readable by all (0755/0644)."""
    make_stack(path, DISTS)
    for p in [path, *path.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    return path


def test_compare_as_root_refuses_a_stack_directory_the_user_can_change(attacker):
    shared = attacker.shared                    # root's, mode 0755
    original = root_stack(shared / "original")
    copy = root_stack(shared / "copy")
    proc = hs("compare", original, copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr       # control: root's copy is the same stack
    assert "the same stack" in proc.stderr

    # the user's own copy of the stack (cp -r, as any user can): its directory is the user's
    theirs = attacker.home / "stack"
    attacker.sh(f"cp -r {original} {theirs}")
    assert os.stat(theirs).st_uid == attacker.uid
    for args in ((original, theirs), (theirs, original)):
        proc = hs("compare", *args)
        refused(attacker, proc, f"stack {theirs}: owned by {attacker.name}")
        assert proc.stdout == ""

    # root's own stack, below a directory the user owns (the user can rename it and put another there)
    parent = attacker.mkdir(attacker.home / "sw")
    below = root_stack(parent / "stack")
    assert os.stat(below).st_uid == 0
    proc = hs("compare", original, below)
    refused(attacker, proc, f"stack {below}: {parent}: owned by {attacker.name}")

    # and a bundle directory the user owns
    bundle = attacker.mkdir(attacker.home / "bundle")
    attacker.write(bundle / "manifest.json", "{}")
    proc = hs("compare", original, bundle)
    refused(attacker, proc, f"bundle {bundle}: owned by {attacker.name}")
    assert Path(bundle / "manifest.json").read_text() == "{}"
