"""``hpcstack export --format docker|apptainer``: container specs written with hpccm, checked
against golden files (cirrus: NVIDIA's CUDA 12.1 base; localhost: FROM scratch + a Debian 12
root filesystem), and the site config's ``container`` section's bad input. Seconds in all; the
real build of the localhost image is tests/test_image_localhost.py.
"""

from __future__ import annotations

import hashlib
import os
import re

import pytest
import yaml

from conftest import assert_golden, REPO, hpcstack
from hpcstack import __version__

pytestmark = pytest.mark.unit

GOLDEN = REPO / "tests" / "golden"
LOCK = REPO / "recipes" / "pytorch" / "2.3.1-gpu.pypi.lock"


def export(site: str, fmt: str, *extra: str):
    return hpcstack("export", "pytorch/2.3.1-gpu", "--site", site, "--format", fmt, *extra)


@pytest.mark.parametrize("site, fmt, golden", [
    ("cirrus", "docker", "cirrus.Dockerfile"),
    ("cirrus", "apptainer", "cirrus.def"),
    ("localhost", "docker", "localhost.Dockerfile"),
    ("localhost", "apptainer", "localhost.def"),
])
def test_container_spec_matches_golden(site, fmt, golden, tmp_path):
    out = tmp_path / golden
    proc = export(site, fmt, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    # the version and the lock's hash are checked below, not frozen in the golden file
    sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    assert sha in text
    normal = text.replace(__version__, "@VERSION@").replace(sha, "@LOCK_SHA256@")
    path = GOLDEN / golden
    assert_golden(path, normal)


def test_cirrus_image_builds_for_the_v100_with_cuda_12_1_and_labels_what_it_holds():
    proc = export("cirrus", "docker")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert re.search(r"^FROM nvcr\.io/nvidia/cuda:12\.1\.1-cudnn8-devel-ubuntu22\.04@sha256:[0-9a-f]{64}$", text, re.M)
    for label in (f'org.hpcstack.version="{__version__}"', 'org.hpcstack.recipe="pytorch/2.3.1-gpu"',
                  'org.hpcstack.lock="2.3.1-gpu.pypi.lock"', 'org.hpcstack.site="cirrus"'):
        assert label in text
    # the site config written into the image is a valid one, with the image's CUDA and NCCL
    block = text.split("printf '%s\\n' \\\n", 1)[1].split("> /opt/hpcstack/site-configs/", 1)[0]
    words = [w.strip().rstrip("\\").strip() for w in block.splitlines()]
    lines = [w[1:-1] if w[:1] in "'\"" else w for w in words if w]
    inside = yaml.safe_load("\n".join(lines))
    from hpcstack.site import check_config
    assert check_config(inside, "inside") == []
    assert inside["toolchain"]["cuda"] == {"home": "/usr/local/cuda", "version": "12.1", "cc_list": [70],
                                           "stubs": "/usr/local/cuda/lib64/stubs"}
    assert inside["cache_dir"] == "/var/cache/hpcstack" and "slurm" not in inside
    assert "hpcstack install pytorch/2.3.1-gpu --site /opt/hpcstack/site-configs/cirrus-image.yaml" in text
    assert 'ENTRYPOINT ["hpcstack", "validate", "pytorch/2.3.1-gpu", "--site", ' \
           '"/opt/hpcstack/site-configs/cirrus-image.yaml", "--local"]' in text
    # the module's variables, for the image's Python 3.10
    assert "PYTHONPATH=/opt/hpcstack/software/pytorch/2.3.1-gpu/venv/lib/python3.10/site-packages" in text


def test_the_cache_never_reaches_a_layer():
    """Every RUN that fills /var/cache/hpcstack removes it unless a host's cache is mounted there."""
    text = export("localhost", "docker").stdout
    runs = [r for r in re.findall(r"^RUN .*?(?=\n\n|\Z)", text, re.M | re.S) if "/var/cache/hpcstack" in r]
    assert len(runs) == 2
    for run in runs:
        assert run.rstrip().endswith("if ! mountpoint -q /var/cache/hpcstack; then rm -rf /var/cache/hpcstack; fi")


def write_site(tmp_path, **container):
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["name"] = "ctr"
    if container:
        data["container"] = container
    else:
        data.pop("container")
    path = tmp_path / "ctr.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("container, says", [
    ({}, "container: missing section"),
    ({"python": "3.11", "rootfs": "r.tar", "base_image": "debian:12"}, "container: give one of base_image"),
    ({"python": "3.11", "rootfs": "r.tar", "distro": "debian13"}, "container.distro: 'debian13' is not one of"),
    ({"python": "3.11", "base_image": "debian:12@sha256:" + "0" * 64, "site_changes": {"toolchain": {"cuda": {"home": "/x"}}}},
     "container.site_changes: toolchain.cuda.version: missing key"),
    ({"rootfs": "r.tar"}, "container.python: missing key"),
])
def test_a_bad_container_section_is_one_line_and_exit_2(tmp_path, container, says):
    out = tmp_path / "Dockerfile"
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", write_site(tmp_path, **container),
                    "--format", "docker", "-o", str(out))
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("site", ["cirrus", "localhost"])
@pytest.mark.parametrize("fmt", ["docker", "apptainer"])
def test_every_base_image_is_named_by_digest_and_hpcstack_is_installed_with_hashes(tmp_path, site, fmt):
    """Checked as text (no image registry is reachable here): every FROM / From: line names its
    image by digest (or is FROM scratch), and pip installs hpcstack's dependencies only with
    --require-hashes, then the wheel itself with --no-deps."""
    import re

    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", site, "--format", fmt)
    assert proc.returncode == 0, proc.stderr
    bases = re.findall(r"^(?:FROM|From:)\s+(\S+)", proc.stdout, re.M)
    assert bases or "Bootstrap: scratch" in proc.stdout
    for image in bases:
        assert image == "scratch" or re.search(r"@sha256:[0-9a-f]{64}$", image), image
    installs = [l for l in proc.stdout.splitlines() if "pip install" in l]
    assert installs, proc.stdout
    for line in installs:
        assert "--require-hashes -r " in line or "--no-deps " in line, line


def test_a_base_image_named_by_tag_only_is_refused(tmp_path):
    out = tmp_path / "Dockerfile"
    site = write_site(tmp_path, python="3.11", base_image="debian:12")
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", site, "--format", "docker", "-o", str(out))
    assert proc.returncode == 2 and "container.base_image: 'debian:12' is named by tag only" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_a_parallel_file_system_outside_is_not_carried_into_the_image():
    """The cluster site's ``filesystem: parallel`` would make squashfs the default layout inside
    the image, where the build has no FUSE: the image's site is a directory on its own disk."""
    from hpcstack.export.container import inside_site
    from hpcstack.install import image
    from hpcstack.site import load_site

    site = load_site("cirrus")
    assert site.raw["filesystem"] == "parallel"
    inside, raw = inside_site(site)
    assert "filesystem" not in raw and "layout" not in raw
    assert image.layout_of(inside) == "directory" and image.layout_note(inside) is None
