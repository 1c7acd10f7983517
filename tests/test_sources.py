"""Where an install gets its packages: the site's package index (``installer.index_url``) in the
plan, and its validation."""

from __future__ import annotations

import yaml
import pytest

from conftest import REPO, hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration  # the dry-run of a localhost install asks the module tool for its Python


def _site(tmp_path, index_url) -> str:
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["installer"]["index_url"] = index_url
    path = tmp_path / "localhost.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_plan_takes_wheels_and_sdists_from_the_sites_index(tmp_path):
    recipe = write_tiny_recipe(tmp_path / "recipes", make_sdist(tmp_path))
    proc = hpcstack("install", str(recipe), "--site", _site(tmp_path, "https://mirror.example.org/simple"),
                    "--prefix", str(tmp_path / "sw"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "--require-hashes -r" in proc.stdout and "--index-url https://mirror.example.org/simple" in proc.stdout
    assert "fetch --page https://mirror.example.org/simple/tinypkg/ --sha256" in proc.stdout


def test_a_bad_index_url_is_one_line_and_exit_2(tmp_path):
    proc = hpcstack("install", "pytorch/2.3.1-gpu", "--site", _site(tmp_path, "mirror here"), "--dry-run")
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "installer.index_url" in proc.stderr, proc.stderr
