"""A secret in a site config's ``build.env`` reaches the build and nothing else: a tiny install
whose source build checks the value it gets (by its sha256, so the check holds no value), then
every file under the install root, the module root and the dry-run output is searched for it;
and a build that prints the secrets (and a value that expands one) and fails: its log and
hpcstack's error line hold the marker, never the value."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import textwrap
from pathlib import Path

import pytest

from conftest import hpcstack, write_tiny_recipe
from hpcstack.secrets import MARKER
from test_secrets import ENV_VALUE, FILE_VALUE, site_with_secrets

pytestmark = pytest.mark.integration


def checking_sdist(dest: Path) -> Path:
    """The tiny sdist, whose setup.py fails unless TOKEN and FILE_TOKEN hold the secrets."""
    src = dest / "tinypkg-1.0"
    (src / "tinypkg").mkdir(parents=True)
    (src / "tinypkg" / "__init__.py").write_text("GREETING = 'hello'\n")
    want = {name: hashlib.sha256(value.encode()).hexdigest()
            for name, value in (("TOKEN", ENV_VALUE), ("FILE_TOKEN", FILE_VALUE))}
    (src / "setup.py").write_text(textwrap.dedent(f"""\
        import hashlib, os
        from setuptools import setup
        for name, digest in {want!r}.items():
            got = hashlib.sha256(os.environ.get(name, "").encode()).hexdigest()
            assert got == digest, name + ": not the secret"
        setup(name="tinypkg", version="1.0", packages=["tinypkg"])
        """))
    archive = dest / "tinypkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    shutil.rmtree(src)
    return archive


def _holding(root: Path, values: list[bytes]) -> list[str]:
    found = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            found += [f"{path}: {v!r}" for v in values if v in data]
    return found


def test_a_secret_reaches_the_build_and_no_file(tmp_path, localhost_ready):
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    token_file = secret_dir / "token"
    token_file.write_text(FILE_VALUE + "\n")
    work = tmp_path / "work"
    work.mkdir()
    recipe = write_tiny_recipe(work / "recipes", checking_sdist(work))
    site = site_with_secrets(work, token_file)
    args = [str(recipe), "--site", str(site), "--prefix", str(work / "sw"), "--module-root", str(work / "mf")]
    env = {"MY_TOKEN": ENV_VALUE}

    missing = hpcstack("install", *args, env={"MY_TOKEN": ""})
    assert missing.returncode == 1 and "the secret's variable MY_TOKEN is not set" in missing.stderr

    dry = hpcstack("install", *args, "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    proc = hpcstack("install", *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    prefix = work / "sw" / "tiny" / "1.0"
    assert (prefix / ".hpcstack" / "plan.json").is_file() and (prefix / ".hpcstack" / "site.json").is_file()
    values = [ENV_VALUE.encode(), FILE_VALUE.encode()]
    for out in (dry.stdout, dry.stderr, proc.stdout, proc.stderr):
        assert not any(v.decode() in out for v in values)
    # the install root (stacks, builds, caches, stage, logs, provenance) and the module root
    assert _holding(work, values) == []


def leaking_sdist(dest: Path) -> Path:
    """The tiny sdist, whose setup.py prints TOKEN, FILE_TOKEN and TOKEN_URL (a value that
    expands the secret) to its output, then fails: the build tool shows the values, hpcstack's
    log and error line must not."""
    src = dest / "tinypkg-1.0"
    (src / "tinypkg").mkdir(parents=True)
    (src / "tinypkg" / "__init__.py").write_text("GREETING = 'hello'\n")
    (src / "setup.py").write_text(textwrap.dedent("""\
        import os, sys
        for name in ("TOKEN", "FILE_TOKEN", "TOKEN_URL"):
            print(name, "=", os.environ.get(name), file=sys.stderr)
        sys.exit("the build failed on purpose: " + os.environ.get("TOKEN", ""))
        """))
    archive = dest / "tinypkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    shutil.rmtree(src)
    return archive


def failing_install(work: Path, token_file: Path) -> tuple:
    """An install whose build prints the secrets and fails (:func:`leaking_sdist`); returns
    the process and the prefix's build directory's logs."""
    import yaml

    recipe = write_tiny_recipe(work / "recipes", leaking_sdist(work))
    site = site_with_secrets(work, token_file)
    data = yaml.safe_load(site.read_text())
    data["build"]["env"]["TOKEN_URL"] = "https://ci:${MY_TOKEN}@example.invalid/simple"
    site.write_text(yaml.safe_dump(data))
    proc = hpcstack("install", str(recipe), "--site", str(site), "--prefix", str(work / "sw"),
                    "--module-root", str(work / "mf"), env={"MY_TOKEN": ENV_VALUE})
    return proc, sorted((work / "sw" / "tiny").glob(".1.0-*/.hpcstack/logs/build.log"))


def test_a_build_that_prints_the_secrets_leaves_them_in_no_log_and_no_error_line(tmp_path, localhost_ready):
    token_file = tmp_path / "token"
    token_file.write_text(FILE_VALUE + "\n")
    work = tmp_path / "work"
    work.mkdir()
    proc, logs = failing_install(work, token_file)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "step build:" in proc.stderr and MARKER in proc.stderr   # the tail of the log, redacted
    for out in (proc.stdout, proc.stderr):
        assert ENV_VALUE not in out and FILE_VALUE not in out
    assert logs, list((work / "sw").rglob("*.log"))
    text = logs[0].read_text()
    assert f"TOKEN = {MARKER}" in text and f"TOKEN_URL = https://ci:{MARKER}@" in text
    assert _holding(work, [ENV_VALUE.encode(), FILE_VALUE.encode()]) == []
