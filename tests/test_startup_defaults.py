"""The start-up fast path by default and the validation's start-up figure: a site whose install
root is on a parallel file system gets ``layout: squashfs`` unless it says otherwise; the
validation's ``startup_max`` is the slowest rank's first step, judged against a site reference
and shown next to img/s."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hpcstack as package
from conftest import hpcstack, site_overlay
from hpcstack.install import image
from hpcstack.site import load_site
from hpcstack.validate.judge import lookup_references
from hpcstack.validate.render import to_markdown
from hpcstack.install.components.validation import Figure

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def _shipped() -> list[str]:
    """The shipped sites, by name: ``site-configs/*.yaml`` of the package under test (what
    ``--site <name>`` finds)."""
    return sorted(p.stem for p in (Path(package.data_root()) / "site-configs").glob("*.yaml"))


def _cluster_sites() -> list[str]:
    """The shipped cluster sites: those whose Slurm jobs span GPU nodes (``slurm.gpus_per_node``
    above 0), whose stacks every node reads over a shared file system. A config that does not
    load is left out here: tests/test_site.py names its problems."""
    names = []
    for name in _shipped():
        try:
            site = load_site(name)
        except Exception:   # noqa: BLE001 - reported by tests/test_site.py, not at collection
            continue
        if int((site.slurm or {}).get("gpus_per_node") or 0) > 0:
            names.append(name)
    return names


CLUSTER_SITES = _cluster_sites()


def _site(tmp_path: Path, **keys):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data.update(keys)
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_site(str(path))


@pytest.mark.parametrize("keys, layout", [
    ({}, "directory"),
    ({"filesystem": "local"}, "directory"),
    ({"filesystem": "parallel"}, "squashfs"),                           # the fast path by default
    ({"filesystem": "parallel", "layout": "directory"}, "directory"),   # the site's own word wins
    ({"layout": "squashfs"}, "squashfs"),
])
def test_parallel_file_system_gets_squashfs(tmp_path, keys, layout):
    site = _site(tmp_path, **keys)
    assert image.layout_of(site) == layout
    assert (image.settings(site) is not None) == (layout == "squashfs")


def test_the_cluster_sites_are_found():
    assert CLUSTER_SITES, "no shipped site has slurm.gpus_per_node > 0"
    assert "localhost" not in CLUSTER_SITES, CLUSTER_SITES


@pytest.mark.parametrize("name", CLUSTER_SITES)
def test_cluster_sites_declare_their_file_system(name):
    """A cluster site says where its stacks lie (``filesystem``), so its layout is a choice, not
    a default taken unawares; one that keeps directories on a parallel file system (its nodes
    mount no image yet) gets the note that names what squashfs would save, any other none."""
    site = load_site(name)
    assert site.raw.get("filesystem") in ("local", "parallel"), (
        f"site-configs/{name}.yaml does not state `filesystem:` (local or parallel: where its install "
        "root lies; docs/admin/new-site.md)")
    note = image.layout_note(site)
    if site.raw["filesystem"] == "parallel" and image.layout_of(site) == "directory":
        assert note and note.startswith(f"site {name}: ") and "`layout: squashfs`" in note, note
    else:
        assert note is None, note


def test_install_prints_the_layout_note_once_and_only_where_it_applies(tmp_path):
    # localhost stating its Python, so that its dry-run loads no module (conftest.site_overlay)
    overlay = site_overlay(tmp_path / "sites", roots=tmp_path / "roots")

    def dry(site):
        return hpcstack("install", "pytorch/2.3.1-gpu", "--site", site, "--repo", str(overlay), "--dry-run",
                        timeout=120)

    # a shipped site that gets the note (a parallel file system, directories) and states its
    # Python (planning then loads no module), found in site-configs/
    noted = next((n for n in CLUSTER_SITES if image.layout_note(load_site(n)) and load_site(n).python_version),
                 None)
    assert noted, f"no shipped cluster site keeps directories on a parallel file system: {CLUSTER_SITES}"
    cluster = dry(noted)
    assert cluster.returncode == 0, cluster.stderr
    notes = [line for line in cluster.stderr.splitlines() if "parallel file system" in line]
    assert notes == [f"note: {image.layout_note(load_site(noted))}"], cluster.stderr
    assert "parallel file system" not in cluster.stdout          # the script itself is unchanged
    local = dry("localhost")
    assert local.returncode == 0 and "parallel file system" not in local.stderr, local.stderr
    assert image.layout_note(_site(tmp_path, filesystem="parallel")) is None  # squashfs: nothing to say


def test_bad_filesystem_is_one_line(tmp_path):
    from hpcstack.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        _site(tmp_path, filesystem="lustre")
    assert len(exc.value.problems) == 1 and "filesystem" in exc.value.problems[0]


def test_startup_over_ranks():
    records = [{"record": "startup", "rank": r, "imports_s": 3.0, "first_step_s": s}
               for r, s in enumerate([4.0, 9.5, 5.0])] + [{"record": "result", "ok": True}]
    assert Figure("startup_max", "s", "startup", "first_step_s", over_ranks="max").value(records) == 9.5
    assert Figure("startup_median", "s", "startup", "first_step_s", over_ranks="median").value(records) == 5.0
    assert Figure("startup_max", "s", "startup", "first_step_s", over_ranks="max").value(records[-1:]) is None


def test_recipe_declares_startup_with_localhost_reference():
    from hpcstack.recipe import load_recipe
    from hpcstack.install.components.validation import validation_of

    site = load_site("localhost")
    spec = validation_of(load_recipe("pytorch/2.3.1-gpu", site))
    fig = spec.figures["startup_max"]
    assert (fig.record, fig.field, fig.over_ranks, fig.unit) == ("startup", "first_step_s", "max", "s")
    ref = lookup_references(spec.references, "localhost", "debug", 2)["startup_max"]
    assert ref.lower is None and ref.bounds()[1] == 60.0


def test_report_shows_startup_next_to_img_per_sec():
    from hpcstack.validate.judge import build_report  # noqa: F401  (the report format's owner)

    fig = {"value": 12.5, "unit": "s", "label": "start-up s (max over ranks)", "reference": None,
           "bounds": [None, None], "ok": True}
    thr = {"value": 900.0, "unit": "img/s", "label": "img/s total", "reference": None,
           "bounds": [None, None], "ok": True}
    run = {"backend": "ddp", "nodes": 1, "ranks": 2, "job_id": "7", "ok": True, "sanity": [],
           "figures": {"throughput_total": thr, "startup_max": fig}, "startup": None, "collectives": None,
           "classifier": None}
    report = {"ok": True, "site": "localhost", "system": "localhost:debug", "recipe": "pytorch/2.3.1-gpu",
              "settings": {"layout": "squashfs"}, "runs": [run], "failures": [], "jobs": [], "scaling": {}}
    text = to_markdown(report)
    header = next(line for line in text.splitlines() if line.startswith("| backend"))
    assert header.index("img/s total") < header.index("start-up s (max over ranks)")
    assert "12.5" in text and "layout squashfs" in text


def test_optimization_levels_compile_after_the_last_package(tmp_path):
    """``installer.optimization_levels: [1]`` adds one compile at level 1 over site-packages
    (hpcstack/install/bytecode.py, run by the venv's python) to the install step (after the
    source builds' installs); without it the plan has none (uv compiles level 0 as it installs)."""
    import subprocess
    import sys

    data = yaml.safe_load((REPO / "site-configs" / "cirrus.yaml").read_text())
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(data))
    data.setdefault("installer", {})["optimization_levels"] = [1]
    site = tmp_path / "opt.yaml"
    site.write_text(yaml.safe_dump(data))

    def dry_run(path):
        proc = subprocess.run([sys.executable, "-m", "hpcstack", "install", "pytorch/2.3.1-gpu", "--site",
                               str(path), "--dry-run"], capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout

    assert "/install/bytecode.py" not in dry_run(plain)
    script = dry_run(site)
    lines = [line for line in script.splitlines() if "/install/bytecode.py " in line]
    assert len(lines) == 1 and " -o 1 " in lines[0] and " -o 0 " not in lines[0], lines
    assert "/venv/bin/python -I -B " in lines[0] and lines[0].rstrip().endswith("/site-packages"), lines
    install = script.index("# --- step install")
    assert install < script.index(lines[0]) < script.index("# --- step sanitycheck")


def test_bad_optimization_level_is_one_line(tmp_path):
    from hpcstack.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        _site(tmp_path, installer={"optimization_levels": [3]})
    assert len(exc.value.problems) == 1 and "optimization_levels" in exc.value.problems[0]
