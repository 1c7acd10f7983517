"""An ordinary user of the same login node, for the attacker's tests (tests/test_attacker*.py).

The account ``rtuser`` (group ``users``, no sudo) is created by the tests when missing. Each test
gets a fresh :class:`Attacker`: a home of the user's own, a root-owned scratch directory both can
reach (``shared``, mode 0755, under ``/var/tmp``), and a ``canary`` path that the user's payloads
create when root runs them. The user's payloads are real code and real files: root then runs the
real ``hpcstack`` command, and the test asserts that the canary is absent and that the refusal is
one line with exit status 2 (:meth:`Attacker.assert_refused`).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The unprivileged account the attacks run as.
USER = "rtuser"
#: Its group (a group every user of a login node is in, as on many sites).
GROUP = "users"


@dataclass
class Attacker:
    """One attack's setting.

    Attributes:
        name (str): the account's name.
        uid (int), gid (int): its ids.
        home (Path): its home directory (the user's own, mode 0755).
        shared (Path): a root-owned directory, mode 0755, that root uses for this test.
        canary (Path): the file a payload creates when it runs; root must never create it.
    """

    name: str
    uid: int
    gid: int
    home: Path
    shared: Path
    canary: Path

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``cmd`` as the user (``runuser``), in the user's home, with a plain environment."""
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", f"HOME={self.home}",
                               f"USER={self.name}", "PATH=/usr/local/bin:/usr/bin:/bin", *cmd],
                              cwd=self.home, capture_output=True, text=True, check=check, timeout=120)

    def sh(self, script: str) -> subprocess.CompletedProcess:
        """Run a shell script as the user."""
        return self.run("sh", "-c", script)

    def mkdir(self, path: Path, mode: int = 0o755) -> Path:
        """Create ``path`` (and parents) owned by the user, as a user would."""
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, self.uid, self.gid)
        path.chmod(mode)
        return path

    def write(self, path: Path, text: str, mode: int = 0o644) -> Path:
        """Write ``text`` to ``path`` as a file the user owns."""
        path.write_text(text)
        os.chown(path, self.uid, self.gid)
        path.chmod(mode)
        return path

    def payload(self) -> str:
        """Python code that creates the canary (as whoever runs it)."""
        return f"import os; open({str(self.canary)!r}, 'w').close()\n"

    def shell_payload(self) -> str:
        """A shell command that creates the canary."""
        return f"touch {self.canary}"

    def assert_refused(self, proc: subprocess.CompletedProcess, *words: str) -> None:
        """The command refused: exit status 2, one ``error:`` line (naming ``words``), no canary."""
        assert not self.canary.exists(), f"root ran the user's code: {proc.stderr}"
        assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert errors, proc.stderr
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
        for word in words:
            assert any(word in line for line in errors), (word, proc.stderr)


def attacker_fixture() -> Attacker:
    """Create (once) the account and return a fresh :class:`Attacker`; skips, saying why, unless
    root with ``runuser``/``useradd``. The caller removes ``shared`` and the canary."""
    if os.geteuid() != 0:
        pytest.skip("the attacks need root (root runs hpcstack; the attacker is another account)")
    for tool in ("runuser", "useradd"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing (util-linux / passwd)")
    try:
        pw = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "--gid", GROUP,
                        "--comment", "an ordinary user (hpcstack attacker tests)", USER], check=True)
        pw = pwd.getpwnam(USER)
    assert pw.pw_uid != 0 and grp.getgrgid(pw.pw_gid).gr_name == GROUP
    home = Path(pw.pw_dir)
    home.mkdir(exist_ok=True)
    os.chown(home, pw.pw_uid, pw.pw_gid)
    home.chmod(0o755)
    shared = Path(tempfile.mkdtemp(prefix="hpcstack-attack-", dir="/var/tmp"))
    shared.chmod(0o755)
    canary = Path(tempfile.gettempdir()) / f"hpcstack-canary-{shared.name}"
    return Attacker(USER, pw.pw_uid, pw.pw_gid, home, shared, canary)


@pytest.fixture
def attacker():
    """A fresh :class:`Attacker`; its scratch directory, canary and home's contents are removed
    afterwards."""
    a = attacker_fixture()
    try:
        yield a
    finally:
        shutil.rmtree(a.shared, ignore_errors=True)
        a.canary.unlink(missing_ok=True)
        for p in a.home.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
