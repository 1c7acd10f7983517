"""The documentation site: built with ``mkdocs build --strict`` (any warning fails) from the
checkout's ``mkdocs.yml``, then rendered in a real headless browser (Debian's ``chromium``, which
``scripts/localhost-setup --with-test-tools`` installs).

The home page and the generated references are read back from the DOM Chromium renders
(``--dump-dom``): the site-config reference must list every key of the schema in
``hpcstack/site.py``, the command reference every command of the parser of ``hpcstack/cli/``.
Screenshots of the home page and the site-config reference are kept as build artifacts in
``$HPCSTACK_ARTIFACTS/docs-site/`` (default ``/tmp/hpcstack-artifacts/docs-site/``), with the
built site beside them (``site/``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.integration

ARTIFACTS = Path(os.environ.get("HPCSTACK_ARTIFACTS", "/tmp/hpcstack-artifacts")) / "docs-site"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("chromium missing (scripts/localhost-setup --with-test-tools installs it)")


def _browser(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    """Run headless Chromium with a profile of its own; ``--no-sandbox`` because the tests run as
    root, where Chromium's sandbox refuses to start."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--hide-scrollbars", f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "HOME": str(tmp)})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once with warnings as errors, into the artifacts directory."""
    out = ARTIFACTS / "site"
    if out.exists():
        shutil.rmtree(out)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                             str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
                            capture_output=True, text=True, timeout=600, cwd=REPO,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def test_a_recipe_that_does_not_load_fails_the_strict_build(tmp_path):
    """The reference hook names the recipe and MkDocs aborts, also with ``--quiet``; the same
    build of the checkout passes (the ``site`` fixture)."""
    recipe = tmp_path / "repo" / "recipes" / "broken" / "1.0.py"
    recipe.parent.mkdir(parents=True)
    recipe.write_text('def recipe(site):\n    raise RuntimeError("no such component")\n')
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                             "--config-file", str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                            capture_output=True, text=True, timeout=600, cwd=REPO,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "HPCSTACK_PATH": str(tmp_path / "repo")})
    assert result.returncode == 1, result.stderr[-4000:]
    assert "reference/site-config.md: recipe broken/1.0 does not load for the localhost site" in result.stderr
    assert "no such component" in result.stderr
    assert "Aborted with 1 errors in strict mode" in result.stdout + result.stderr


def _render(page: Path, name: str, tmp: Path) -> str:
    """The page's DOM after Chromium rendered it; a screenshot kept as ``<name>.png``."""
    dom = _browser("--dump-dom", page.as_uri(), tmp=tmp)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = ARTIFACTS / f"{name}.png"
    shot.unlink(missing_ok=True)
    result = _browser("--window-size=1280,1600", f"--screenshot={shot}", page.as_uri(), tmp=tmp)
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    _assert_not_blank(shot)
    return dom.stdout


def _assert_not_blank(png: Path) -> None:
    """A rendered page has text and colours: the screenshot is not one flat colour."""
    import matplotlib.image
    pixels = matplotlib.image.imread(str(png))
    assert pixels.shape[0] >= 1000 and pixels.shape[1] >= 1000, pixels.shape
    assert pixels.std() > 0.05, f"{png} looks blank"


def _text(dom: str) -> str:
    """The visible text of a DOM, tags removed (what a reader sees)."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self):
            super().__init__()
            self.parts, self.skip = [], 0

        def handle_starttag(self, tag, attrs):
            self.skip += tag in ("script", "style")

        def handle_endtag(self, tag):
            self.skip -= tag in ("script", "style") and self.skip > 0

        def handle_data(self, data):
            if not self.skip:
                self.parts.append(data)

    parser = Text()
    parser.feed(dom)
    return " ".join(" ".join(parser.parts).split())


def test_the_home_page_renders_with_the_two_commands_and_the_navigation(site, tmp_path):
    text = _text(_render(site / "index.html", "home", tmp_path))
    assert "hpcstack installs a module-based HPC software stack from a recipe" in text
    for words in ("scripts/quickstart-localhost", "scripts/run-tests", "Admin guide", "User guide",
                  "Recipe authoring", "Site-config reference", "Lifecycle", "Containers", "EasyBuild",
                  "ReFrame", "SBOM", "Benchmarks"):
        assert words in text, words


def test_the_site_config_reference_lists_every_key_of_the_schema(site, tmp_path):
    from hpcstack.site import SCHEMA

    text = _text(_render(site / "reference" / "site-config.html", "site-config", tmp_path))
    assert "Site-config reference" in text
    keys = []

    def walk(schema, prefix=""):
        for key, sub in schema.get("properties", {}).items():
            keys.append(prefix + key)
            walk(sub, prefix + key + ".")

    walk(SCHEMA)
    missing = [k for k in keys if k not in text]
    assert not missing, f"keys not on the page: {missing}"
    # the parts of one entry: type, allowed values, default, an example, the recipes that use it
    for words in ("type", "allowed", "default", "used by", "environment-modules", "From localhost.yaml",
                  "pytorch/2.3.1-gpu", "HorovodBuild"):
        assert words in text, words


def test_the_command_reference_lists_every_command_and_the_api_every_component(site, tmp_path):
    from hpcstack.cli import build_parser
    from hpcstack.install import components

    text = _text(_browser("--dump-dom", (site / "reference" / "cli.html").as_uri(), tmp=tmp_path).stdout)
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name, sub in commands.items():
        assert f"hpcstack {name}" in text, name
        for action in sub._actions:
            for option in action.option_strings:
                assert option in text, (name, option)
    api = _text(_browser("--dump-dom", (site / "reference" / "api.html").as_uri(), tmp=tmp_path).stdout)
    for name in components.__all__:
        assert name in api, name
