"""``hpcstack export --format docker|apptainer``: container specs written with hpccm, checked
against golden files (cirrus: NVIDIA's CUDA 12.1 base; localhost: FROM scratch + a Debian 12
root filesystem), and the site config's ``container`` section's bad input. Seconds in all; the
real build of the localhost image is tests/test_image_localhost.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess

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


# ----------------------------------------------------------------------- values quoted for each language

#: Site values that would run a command, start an instruction or an Apptainer section, or expand,
#: if a container spec wrote them unquoted (each fits on one line: the site loader refuses control
#: characters, test_attacker_quoting.py checks that).
HOSTILE_ENV = [
    "$(touch {canary})",
    "`touch {canary}`",
    "'; touch {canary}; echo '",
    '"; touch {canary}; echo "',
    "a b && touch {canary} #",
    "${{HOME}} $HOME \\$(touch {canary}) ends in a backslash\\",
    "%setup",
    "\u00a0%setup touch {canary}",
    '" \\" \\\\" ${{PATH}} $PATH \' ; | & < > * ? [ ] {{ }} ! %',
]


def apptainer_sections(text: str) -> list[tuple[str, str]]:
    """The definition's sections as Apptainer reads them: a line whose first word starts with %
    starts one (apptainer's pkg/build/types/parser/deffile.go, scanDefinitionFile)."""
    out: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        words = line.split()
        if words and words[0].startswith("%"):
            out.append((words[0][1:], []))
        elif out:
            out[-1][1].append(line)
    return [(name, "\n".join(body) + "\n") for name, body in out]


def hostile_site(tmp_path, value: str, **container) -> str:
    data = yaml.safe_load((REPO / "site-configs" / "localhost.yaml").read_text())
    data["name"] = "ctr"
    data["modules"]["env"] = {"HOSTILE": value}
    data["container"].update(container)
    path = tmp_path / "ctr.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def rootfs_tar(directory) -> None:
    """``directory/rootfs.tar``: a root filesystem of one file, etc/hello."""
    import tarfile

    src = directory / "rootfs-src"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "hello").write_text("hello\n")
    with tarfile.open(directory / "rootfs.tar", "w") as tar:
        tar.add(src / "etc", arcname="etc")


@pytest.mark.parametrize("template", HOSTILE_ENV)
def test_an_apptainer_definition_keeps_hostile_env_values_as_data(tmp_path, template):
    """modules.env reaches %environment and %post (both shell): each section passes ``sh -n``,
    and running %setup (the build host's) and the environment sections creates no canary and
    sets the value byte for byte."""
    canary = tmp_path / "canary"
    value = template.format(canary=canary)
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", hostile_site(tmp_path, value), "--format", "apptainer")
    assert proc.returncode == 0, proc.stderr
    sections = apptainer_sections(proc.stdout)
    names = [n for n, _ in sections]
    assert names.count("setup") == 1 and names[0] == "setup", names
    assert set(names) <= {"setup", "environment", "post", "files", "labels", "runscript"}, names
    for name, body in sections:
        if name in ("setup", "environment", "post", "runscript"):
            check = subprocess.run(["sh", "-n"], input=body, capture_output=True, text=True)
            assert check.returncode == 0, (name, check.stderr, body)
    work = tmp_path / "build"
    work.mkdir()
    rootfs_tar(work)
    (work / "rootfs").mkdir()
    setup = dict(sections)["setup"]
    run = subprocess.run(["sh", "-c", setup], cwd=work, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "APPTAINER_ROOTFS": str(work / "rootfs")})
    assert run.returncode == 0, run.stderr
    assert (work / "rootfs" / "etc" / "hello").read_text() == "hello\n"
    exports = [body for name, body in sections if name in ("environment", "post") and "HOSTILE" in body
               and all(line.strip().startswith("export ") for line in body.splitlines() if line.strip())]
    assert len(exports) == 2, sections
    for body in exports:
        for shell in ("sh", "bash"):
            got = subprocess.run([shell, "-c", body + 'printf "%s" "$HOSTILE"'], cwd=work, capture_output=True,
                                 text=True, env={"PATH": "/usr/bin:/bin", "HOME": "/home-of-nobody"})
            assert got.returncode == 0, got.stderr
            assert got.stdout == value, (shell, body)
    assert not canary.exists()


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, its text)`` as Docker's parser splits a Dockerfile: comment lines dropped
    (inside a continuation too), a line ending in a backslash continued on the next; the text is
    the instruction's lines as written (continuations kept)."""
    out, current = [], None
    for line in text.split("\n"):
        if line.strip().startswith("#") or (current is None and not line.strip()):
            continue
        current = line if current is None else current + "\n" + line
        if line.endswith("\\"):
            continue
        out.append((current.strip().split()[0].upper(), current))
        current = None
    return out


@pytest.mark.parametrize("template", HOSTILE_ENV)
def test_a_dockerfile_keeps_hostile_env_values_in_one_env_instruction(tmp_path, template):
    """The instructions stay the ones hpcstack writes, and each ENV value is a Dockerfile word
    whose unquoting gives the value back (the real build: test_attacker_quoting.py, buildah)."""
    from hpcstack.export.container import docker_word

    canary = tmp_path / "canary"
    value = template.format(canary=canary)
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", hostile_site(tmp_path, value), "--format", "docker")
    assert proc.returncode == 0, proc.stderr
    clean = hpcstack("export", "pytorch/2.3.1-gpu", "--site", hostile_site(tmp_path, "plain"), "--format", "docker")
    got = [i for i, _ in dockerfile_instructions(proc.stdout)]
    assert got == [i for i, _ in dockerfile_instructions(clean.stdout)]
    assert got[:2] == ["FROM", "ADD"] and got[-1] == "ENTRYPOINT"
    assert re.search(r"^(ENV |    )HOSTILE=" + re.escape(docker_word(value)) + r" \\$", proc.stdout, re.M)
    assert not canary.exists()


@pytest.mark.parametrize("value, word", [
    ("/opt/x/bin", "/opt/x/bin"),
    ("$(touch x)", '"\\$(touch x)"'),
    ('a "b" \\c', '"a \\"b\\" \\\\c"'),
    ("", '""'),
])
def test_docker_words(value, word):
    from hpcstack.export.container import docker_value, docker_word

    assert (docker_word(value) if value else docker_value([value])) == word


def test_module_path_variables_keep_only_their_own_reference_live():
    from hpcstack.export.container import Ref, docker_value, shell_value

    parts = ("/opt/a b/bin", ":", Ref("PATH"))
    assert shell_value(parts) == "'/opt/a b/bin:'\"$PATH\""
    assert docker_value(parts) == '"/opt/a b/bin:"${PATH}'
    assert subprocess.run(["sh", "-c", f"PATH=/usr/bin; X={shell_value(parts)}; printf %s \"$X\""],
                          capture_output=True, text=True).stdout == "/opt/a b/bin:/usr/bin"


@pytest.mark.parametrize("fmt", ["docker", "apptainer"])
@pytest.mark.parametrize("container, says", [
    ({"rootfs": "rootfs.tar;touch${IFS}x"}, "container.rootfs: 'rootfs.tar;touch${IFS}x': give a file name"),
    ({"rootfs": "-xf/etc/shadow"}, "container.rootfs: '-xf/etc/shadow': give a file name"),
    ({"setup": ["%setup", "touch /x"]}, "container.setup: '%setup': a command may not start with %"),
    ({"setup": ["echo \\"]}, "container.setup: 'echo \\\\': a command may not end with a backslash"),
])
def test_container_values_no_language_can_hold_are_refused_in_one_line(tmp_path, fmt, container, says):
    out = tmp_path / "spec"
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", hostile_site(tmp_path, "x", **container),
                    "--format", fmt, "-o", str(out))
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()
