"""``hpcstack bundle`` and ``hpcstack install --from DIR``: the tiny recipe (with a source build)
installed inside a network namespace that has only loopback, by an hpcstack installed there from
the bundle itself; the SBOM lists the same files as an online install's. A bundle with a missing
or altered file is refused in one line, and nothing is published."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import hpcstack, make_sdist, write_tiny_recipe

pytestmark = pytest.mark.integration


def offline(*cmd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a new network namespace (``unshare -n``: only a loopback device, down)."""
    return subprocess.run(["unshare", "-n", "--", *cmd], capture_output=True, text=True, timeout=timeout,
                          cwd="/tmp")


def write_recipe(root: Path) -> Path:
    """The tiny recipe with the stack's SBOM (StackManifest)."""
    sdist = make_sdist(root / "src")
    recipe = write_tiny_recipe(root / "recipes", sdist)
    text = recipe.read_text().replace("StackTools(),", "StackTools(),\n        StackManifest(),")
    recipe.write_text(text.replace("from hpcstack.install.components import (",
                                   "from hpcstack.install.components import (StackManifest, "))
    return recipe


@pytest.fixture(scope="module")
def bundled(localhost_ready, tmp_path_factory):
    """A bundle of the tiny recipe for localhost, and an online install of it to compare with."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("unshare -n needs root (and util-linux's unshare)")
    root = tmp_path_factory.mktemp("bundle")
    recipe = write_recipe(root)
    made = hpcstack("bundle", str(recipe), "--site", "localhost", "-o", str(root / "bundle"))
    assert made.returncode == 0, made.stderr
    online = hpcstack("install", str(recipe), "--site", "localhost", "--prefix", str(root / "online"),
                      "--module-root", str(root / "online-mf"))
    assert online.returncode == 0, online.stderr
    return root, recipe, root / "bundle"


def test_the_manifest_lists_every_file_with_its_sha256(bundled):
    root, recipe, bundle = bundled
    manifest = json.loads((bundle / "manifest.json").read_text())
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    names = {Path(p).name for p in on_disk}
    assert {"six-1.16.0-py2.py3-none-any.whl", "wheel-0.43.0-py3-none-any.whl",
            "setuptools-72.1.0-py3-none-any.whl", "tinypkg-1.0.tar.gz", "tiny.patch", "1.0.py",
            "1.0.pypi.lock"} <= names
    assert any(n.startswith("hpcstack-") and n.endswith(".whl") for n in names)
    assert any(n.startswith("uv-") for n in names)
    assert any(p.startswith("build/setuptools-") for p in on_disk)
    assert manifest["recipe"] == "tiny/1.0" and manifest["site"] == "localhost"


def test_install_from_the_bundle_with_no_network_gives_the_same_sbom(bundled, tmp_path):
    root, recipe, bundle = bundled
    # no network here: even a loopback connection to an index fails
    probe = offline("python3", "-c",
                    "import urllib.request; urllib.request.urlopen('https://pypi.org/simple', timeout=5)")
    assert probe.returncode != 0
    # hpcstack itself, from the bundle's tool/ (pip, with no index)
    made = offline("python3", "-m", "venv", str(tmp_path / "tool"))
    assert made.returncode == 0, made.stderr
    pip = offline(str(tmp_path / "tool/bin/pip"), "install", "-q", "--isolated", "--no-index", "--find-links",
                  str(bundle / "tool"), "hpcstack")
    assert pip.returncode == 0, pip.stderr
    tool = str(tmp_path / "tool/bin/hpcstack")
    proc = offline(tool, "install", str(recipe), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                   "--module-root", str(tmp_path / "mf"), "--from", str(bundle))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "mf" / "tiny" / "1.0").is_file()

    def files(prefix: Path) -> dict:
        sbom = json.loads((prefix / "tiny/1.0/.hpcstack/sbom.cdx.json").read_text())
        return {c["bom-ref"]: ([h["content"] for h in c.get("hashes", [])],
                               sorted(p["value"] for p in c.get("properties", []) if "sha256" in p["name"]),
                               [h["content"] for r in c.get("externalReferences", []) for h in r.get("hashes", [])])
                for c in sbom["components"] if not c["bom-ref"].startswith("build-env:")}

    assert files(tmp_path / "sw") == files(root / "online")
    assert "pypi:six==1.16.0" in files(tmp_path / "sw")

    # the installed distributions are the same files too (uv notes where a file came from in a
    # uv_cache.json of its own when it installs from a directory: not one of the package's files;
    # the console scripts in ../../../bin name their own prefix in their first line)
    def record(prefix: Path, name: str) -> list[str]:
        path = next((prefix / "tiny/1.0/venv/lib").glob(
            f"python3*/site-packages/{name}.dist-info/RECORD"))
        return [line for line in path.read_text().splitlines()
                if "/uv_cache.json," not in line and not line.startswith("../")]

    for name in ("six-1.16.0", "wheel-0.43.0", "setuptools-72.1.0"):
        assert record(tmp_path / "sw", name) == record(root / "online", name)


@pytest.mark.parametrize("damage", ["missing", "altered"])
def test_a_missing_or_altered_file_is_named_and_nothing_is_published(bundled, tmp_path, damage):
    root, recipe, bundle = bundled
    copy = tmp_path / "bundle"
    shutil.copytree(bundle, copy)
    victim = "sdists/tinypkg-1.0.tar.gz" if damage == "missing" else "wheels/six-1.16.0-py2.py3-none-any.whl"
    if damage == "missing":
        (copy / victim).unlink()
    else:
        with open(copy / victim, "ab") as f:
            f.write(b"\0")
    proc = offline(*hpcstack_cmd(), "install", str(recipe), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                   "--module-root", str(tmp_path / "mf"), "--from", str(copy))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith(f"error: bundle {copy}: {victim} ")
    assert ("is missing" if damage == "missing" else "was altered") in proc.stderr
    assert not (tmp_path / "sw").exists() and not (tmp_path / "mf").exists()


def test_a_bundle_of_another_lock_is_refused(bundled, tmp_path):
    root, recipe, bundle = bundled
    other = tmp_path / "recipes" / "tiny"
    shutil.copytree(recipe.parent, other)
    lock = other / "1.0.pypi.lock"
    lock.write_text(lock.read_text().replace("six==1.16.0", "six==1.16.0 ; python_version >= '3'"))
    proc = hpcstack("install", str(other / "1.0.py"), "--site", "localhost", "--prefix", str(tmp_path / "sw"),
                    "--from", str(bundle))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"error: --from {bundle}: the recipe's lock {lock} differs from the "
                                   "bundle's recipe/1.0.pypi.lock")


def hpcstack_cmd() -> list[str]:
    from conftest import HPCSTACK

    return list(HPCSTACK)


# ------------------------------------------------------------------ a site's package index

MIRROR_SCRIPT = """\
set -e
ip link set lo up
{server} run -p 8765 -i 127.0.0.1 --disable-fallback --hash-algo sha256 --log-stream none {dirs} &
server=$!
trap 'kill $server' EXIT
for i in $(seq 100); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8765/simple/')" \\
    2>/dev/null && break; sleep 0.2; done
{hpcstack} install {recipe} --site {site} --prefix {prefix} --module-root {mf}
"""


def mirror_install(tmp_path: Path, recipe: Path, dirs: list[Path]) -> subprocess.CompletedProcess:
    """Start pypiserver on loopback inside a network namespace, serving ``dirs``, and install the
    recipe for a localhost site whose installer.index_url names it."""
    from conftest import HPCSTACK, REPO

    server = Path(HPCSTACK[0]).with_name("pypi-server")
    if not server.is_file():
        pytest.skip("pypiserver missing: pip install -e '.[test]'")
    import yaml

    site = tmp_path / "localhost.yaml"
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["installer"]["index_url"] = "http://127.0.0.1:8765/simple/"
    site.write_text(yaml.safe_dump(data))
    script = MIRROR_SCRIPT.format(server=server, dirs=" ".join(map(str, dirs)), hpcstack=HPCSTACK[0],
                                  recipe=recipe, site=site, prefix=tmp_path / "sw", mf=tmp_path / "mf")
    return offline("bash", "-c", script)


def test_install_from_the_sites_package_index(bundled, tmp_path):
    root, recipe, bundle = bundled
    proc = mirror_install(tmp_path, recipe, [bundle / "wheels", bundle / "sdists"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "mf" / "tiny" / "1.0").is_file()
    fetch = (tmp_path / "sw" / "tiny" / "1.0" / ".hpcstack" / "logs" / "fetch.log").read_text()
    assert "--page http://127.0.0.1:8765/simple/tinypkg/" in fetch


@pytest.mark.parametrize("victim", ["wheels/six-1.16.0-py2.py3-none-any.whl", "sdists/tinypkg-1.0.tar.gz"])
def test_a_mirror_serving_another_file_is_refused_with_both_hashes(bundled, tmp_path, victim):
    import hashlib

    root, recipe, bundle = bundled
    served = tmp_path / "served"
    shutil.copytree(bundle / "wheels", served / "wheels")
    shutil.copytree(bundle / "sdists", served / "sdists")
    with open(served / victim, "ab") as f:
        f.write(b"\0" * 16)
    proc = mirror_install(tmp_path, recipe, [served / "wheels", served / "sdists"])
    assert proc.returncode != 0, proc.stdout
    # what the lock (six: one hash per file it allows) or the recipe (the sdist) expects
    from hpcstack.install.components.manifest import read_lock

    six = next(p for p in read_lock(str(recipe.parent / "1.0.pypi.lock")) if p.name == "six")
    expected = six.hashes if victim.startswith("wheels/") else (
        json.loads((bundle / "manifest.json").read_text())["files"][victim]["sha256"],)
    actual = hashlib.sha256((served / victim).read_bytes()).hexdigest()
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "sha256 mismatch" in error[0], proc.stderr
    assert actual in error[0] and any(h in error[0] for h in expected), error
    assert not (tmp_path / "mf").exists() and not (tmp_path / "sw" / "tiny" / "1.0").exists()
