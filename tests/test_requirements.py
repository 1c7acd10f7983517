"""The hashed requirements files (requirements/*.txt, installed with ``--require-hashes`` by
scripts/localhost-setup and the container specs) hold every dependency setup.cfg names: a
dependency added to setup.cfg without ``scripts/lock-requirements`` would be missing on a fresh
machine, where nothing else installs it."""

from __future__ import annotations

import configparser
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

pytestmark = pytest.mark.unit


def _setup_cfg() -> tuple[list[str], list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = lambda text: [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]  # noqa: E731
    return lines(cfg["options"]["install_requires"]), lines(cfg["options.extras_require"]["test"])


def _pinned(path) -> dict[str, list[str]]:
    """name -> the lines pinning it (``name==version ; marker \\``), each with ``--hash=`` lines."""
    text = path.read_text()
    pins = {}
    for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==\S+", text, re.M):
        pins.setdefault(canonicalize_name(m.group(1)), []).append(m.group(0))
    return pins


@pytest.mark.parametrize("name, with_test", [("hpcstack.txt", False), ("test.txt", True)])
def test_every_dependency_of_setup_cfg_is_pinned_with_hashes(name, with_test):
    base, test = _setup_cfg()
    path = REPO / "requirements" / name
    pins = _pinned(path)
    wanted = [Requirement(r) for r in base + (test if with_test else [])]
    missing = sorted({canonicalize_name(r.name) for r in wanted} - set(pins))
    assert not missing, f"{path.name} lacks {missing}: run scripts/lock-requirements"
    # every pin carries at least one sha256
    blocks = re.split(r"\n(?=[A-Za-z0-9])", path.read_text().split("\n", 2)[-1])
    unhashed = [b.split()[0] for b in blocks if "==" in b.split("\n")[0] and "--hash=sha256:" not in b]
    assert not unhashed, unhashed
