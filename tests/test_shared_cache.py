"""Sites on one machine share one cache (downloads, uv's wheel cache, source builds) by default:
a second site (``localhost-lmod`` after ``localhost``) reuses what the first downloaded and
built. ``cache_dir`` in a site config and ``--prefix`` (a private install) keep caches apart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack, make_sdist, write_tiny_recipe
from hpcstack.site import CACHE_ENV, default_cache_dir, load_site

pytestmark = pytest.mark.unit


def test_the_shipped_localhost_sites_share_the_machine_cache(monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    sites = [load_site(name) for name in ("localhost", "localhost-lmod", "localhost-gpu-build")]
    assert {s.cache_dir for s in sites} == {default_cache_dir()}
    assert len({s.install_root for s in sites}) == 3  # three install roots, one cache
    expected = "/var/cache/hpcstack" if os.geteuid() == 0 else None
    if expected:
        assert default_cache_dir() == expected


def test_the_variable_moves_the_machine_cache(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "c"))
    assert load_site("localhost").cache_dir == load_site("localhost-lmod").cache_dir == str(tmp_path / "c")


def test_a_site_cache_dir_and_a_prefix_keep_caches_apart(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "machine"))
    assert load_site("cirrus").cache_dir == "/work/y07/shared/cirrus-software/.hpcstack/cache"
    private = load_site("localhost", install_root=str(tmp_path / "sw"))
    assert private.cache_dir == str(tmp_path / "sw" / ".hpcstack" / "cache")


def _site_copy(name: str, root: Path) -> Path:
    """The shipped site ``name`` with its install and module roots under ``root`` and no cache_dir."""
    data = yaml.safe_load((REPO / "site-configs" / f"{name}.yaml").read_text())
    data.pop("cache_dir", None)
    data.update(install_root=str(root / name / "sw"), module_root=str(root / name / "mf"))
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.integration
def test_a_second_site_reuses_the_first_sites_downloads_and_build(localhost_ready, tmp_path):
    """localhost then localhost-lmod, each with its own roots: the second install downloads
    nothing (uv links from the shared cache) and reuses the source build's wheel."""
    import shutil
    if not shutil.which("lmod") and not Path("/usr/share/lmod/lmod/libexec/lmod").exists():
        pytest.skip("Lmod missing; run scripts/localhost-setup --with-test-tools")
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    cache = tmp_path / "machine-cache"
    env = {CACHE_ENV: str(cache)}
    logs = {}
    for name in ("localhost", "localhost-lmod"):
        proc = hpcstack("install", str(recipe), "--site", str(_site_copy(name, tmp_path)), env=env)
        assert proc.returncode == 0, proc.stderr
        prefix = tmp_path / name / "sw" / "tiny" / "1.0"
        logs[name] = "\n".join(p.read_text() for p in prefix.rglob("logs/*.log"))
        assert not (tmp_path / name / "sw" / ".hpcstack" / "cache").exists()
    assert "stored tinypkg-1.0-" in logs["localhost"]
    assert "reusing the wheel built before" in logs["localhost-lmod"]
    assert len(list((cache / "builds" / "tinypkg-1.0").iterdir())) == 1
    six = [next((tmp_path / n / "sw" / "tiny" / "1.0" / "venv" / "lib").glob("python3*/site-packages/six.py"))
           for n in ("localhost", "localhost-lmod")]
    assert six[0].stat().st_ino == six[1].stat().st_ino  # both hard-linked from the one uv cache
    assert (tmp_path / "localhost-lmod" / "mf" / "tiny" / "1.0.lua").is_file()
