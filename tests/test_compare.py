"""``hpcstack compare``: two installed stacks, a stack and its bundle, two recipes' stacks
(hpcstack/lifecycle/compare.py), on small stacks and bundles made here with the real formats:
a CycloneDX SBOM, a venv's ``*.dist-info/RECORD``, wheels with their ``RECORD``, a bundle
manifest that :func:`hpcstack.lifecycle.bundle.verify_bundle` accepts."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from conftest import hpcstack
from hpcstack.lifecycle import compare
from hpcstack.lifecycle.bundle import FORMAT

pytestmark = pytest.mark.unit

FILES = {"tinypkg/__init__.py": b"VALUE = 1\n", "tinypkg/data.txt": b"data\n"}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record(name: str, version: str, files: dict) -> str:
    rows = [f"{p},sha256={b64(d)},{len(d)}" for p, d in files.items()]
    return "\n".join(rows + [f"{name}-{version}.dist-info/RECORD,,", f"../../../bin/{name},sha256=x,1",
                             f"{name}/__pycache__/x.cpython-311.pyc,,"]) + "\n"


def make_stack(root: Path, dists: dict, sbom_extra: list | None = None, python="3.11.2", cuda=None,
               files: dict | None = None) -> Path:
    """A prefix with .hpcstack/sbom.cdx.json and a venv holding ``dists`` (name -> version)."""
    sp = root / "venv" / "lib" / "python3.11" / "site-packages"
    sp.mkdir(parents=True)
    (root / "venv" / "pyvenv.cfg").write_text(f"home = /usr/bin\nversion = {python}\n")
    components = []
    for name, version in dists.items():
        info = sp / f"{name}-{version}.dist-info"
        info.mkdir()
        content = files or {p.replace("tinypkg", name): d for p, d in FILES.items()}
        for p, d in content.items():
            (sp / p).parent.mkdir(parents=True, exist_ok=True)
            (sp / p).write_bytes(d)
        (info / "RECORD").write_text(record(name, version, content))
        components.append({"type": "library", "name": name, "version": version, "purl": f"pkg:pypi/{name}@{version}",
                           "bom-ref": f"pypi:{name}=={version}"})
    components += sbom_extra or []
    (root / ".hpcstack").mkdir()
    (root / ".hpcstack" / "sbom.cdx.json").write_text(json.dumps({"bomFormat": "CycloneDX", "components": components}))
    (root / ".hpcstack" / "site.json").write_text(json.dumps({"toolchain": {"cuda": {"version": cuda} if cuda else None}}))
    return root


def make_bundle(root: Path, dists: dict) -> Path:
    """A bundle whose wheels hold the same files as :func:`make_stack`'s venv."""
    (root / "wheels").mkdir(parents=True)
    files = {}
    for name, version in dists.items():
        wheel = root / "wheels" / f"{name}-{version}-py3-none-any.whl"
        content = {p.replace("tinypkg", name): d for p, d in FILES.items()}
        with zipfile.ZipFile(wheel, "w") as zf:
            for p, d in content.items():
                zf.writestr(p, d)
            zf.writestr(f"{name}-{version}.dist-info/RECORD", record(name, version, content))
        files[f"wheels/{wheel.name}"] = {"sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
                                         "size": wheel.stat().st_size}
    (root / "manifest.json").write_text(json.dumps({"format": FORMAT, "recipe": "tiny/1.0", "site": "localhost",
                                                    "python": "3.11", "files": files}))
    return root


def test_two_installs_of_one_stack_are_the_same(tmp_path):
    a = make_stack(tmp_path / "a", {"alpha": "1.0", "beta": "2.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0", "beta": "2.0"})
    result = compare.compare(compare.read_stack(a, "A"), compare.read_stack(b, "B"))
    assert result.lines == [] and result.same == 2 and result.files_checked == 4
    proc = hpcstack("compare", str(a), str(b))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the same stack" in proc.stderr and "4 files hashed" in proc.stderr


def test_a_changed_file_a_version_and_a_missing_distribution_are_differences(tmp_path):
    a = make_stack(tmp_path / "a", {"alpha": "1.0", "beta": "2.0", "gamma": "3.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0", "beta": "2.1"})
    (b / "venv/lib/python3.11/site-packages/alpha/data.txt").write_bytes(b"tampered\n")
    proc = hpcstack("compare", str(a), str(b))
    assert proc.returncode == 1
    out = proc.stdout
    assert "files of alpha 1.0: 1 of 2 differ: alpha/data.txt (content)" in out
    assert f"version of beta: 2.0 in {a}, 2.1 in {b}" in out
    assert f"only in {a}: gamma 3.0" in out
    assert "pyc" not in out and "bin/" not in out      # what the installer writes is left out


def test_an_sbom_that_misses_a_distribution_of_the_venv_is_a_difference(tmp_path):
    a = make_stack(tmp_path / "a", {"alpha": "1.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0"})
    sp = b / "venv/lib/python3.11/site-packages"
    (sp / "stowaway-0.1.dist-info").mkdir()
    (sp / "stowaway-0.1.dist-info" / "RECORD").write_text("stowaway.py,,\n")
    result = compare.compare(compare.read_stack(a, "A"), compare.read_stack(b, "B"))
    assert result.lines == ["B: stowaway 0.1 is installed in its venv but not in its SBOM"]


def test_a_pin_for_another_platform_is_not_missing(tmp_path):
    extra = [{"type": "library", "name": "pywin32", "version": "306", "purl": "pkg:pypi/pywin32@306",
              "properties": [{"name": "hpcstack:marker", "value": "sys_platform == 'win32'"}]}]
    a = make_stack(tmp_path / "a", {"alpha": "1.0"}, sbom_extra=extra)
    assert compare.compare(compare.read_stack(a, "A"), compare.read_stack(a, "A")).lines == []


def test_a_stack_and_its_bundle_hold_the_same_files(tmp_path):
    dists = {"alpha": "1.0", "beta": "2.0"}
    stack = make_stack(tmp_path / "stack", dists)
    bundle = make_bundle(tmp_path / "bundle", dists)
    proc = hpcstack("compare", str(stack), str(bundle))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (stack / "venv/lib/python3.11/site-packages/beta/__init__.py").write_bytes(b"VALUE = 2\n")
    proc = hpcstack("compare", str(stack), str(bundle))
    assert proc.returncode == 1 and "files of beta 2.0: 1 of 2 differ: beta/__init__.py" in proc.stdout


def test_an_altered_bundle_is_refused_before_comparing(tmp_path):
    bundle = make_bundle(tmp_path / "bundle", {"alpha": "1.0"})
    stack = make_stack(tmp_path / "stack", {"alpha": "1.0"})
    wheel = next((bundle / "wheels").iterdir())
    wheel.write_bytes(wheel.read_bytes() + b"x")
    proc = hpcstack("compare", str(stack), str(bundle))
    assert proc.returncode == 1 and proc.stderr.count("error:") == 1 and "altered" in proc.stderr


def test_two_recipes_stacks_side_by_side(tmp_path):
    prefix = tmp_path / "software"
    make_stack(prefix / "tiny" / "1.0", {"alpha": "1.0", "beta": "2.0"}, cuda="12.1")
    make_stack(prefix / "tiny" / "2.0", {"alpha": "1.1", "delta": "4.0"}, python="3.12.1", cuda="12.4")
    report = {"runs": [{"backend": "ddp", "nodes": 1, "figures": {"throughput_per_rank": {"value": 300.0, "unit": "img/s"}}}]}
    (prefix / "tiny" / "1.0" / ".hpcstack" / "validation.json").write_text(json.dumps(report))
    report["runs"][0]["figures"]["throughput_per_rank"]["value"] = 450.0
    (tmp_path / "r2.json").write_text(json.dumps(report))
    proc = hpcstack("compare", "tiny/1.0", "tiny/2.0", "--prefix", str(prefix), "--report",
                    str(prefix / "tiny" / "1.0" / ".hpcstack" / "validation.json"), "--report", str(tmp_path / "r2.json"))
    assert proc.returncode == 1, proc.stderr
    out = proc.stdout
    assert "version of alpha: 1.1" not in out and "version of alpha: 1.0 in tiny/1.0, 1.1 in tiny/2.0" in out
    assert "only in tiny/1.0: beta 2.0" in out and "only in tiny/2.0: delta 4.0" in out
    assert any(l.split() == ["Python", "3.11.2", "3.12.1"] for l in out.splitlines())
    assert any(l.split()[:3] == ["CUDA", "12.1", "(toolkit)"] for l in out.splitlines())
    assert any(l.split() == ["ddp", "1", "node(s)", "throughput_per_rank", "300", "img/s", "450", "img/s"]
               for l in out.splitlines())
    assert "1 added, 1 removed, 1 changed" in proc.stderr and "files not compared" in proc.stderr
    data = json.loads(hpcstack("compare", "tiny/1.0", "tiny/2.0", "--prefix", str(prefix), "--json").stdout)
    assert data["added"] == [["delta", "4.0"]] and data["same"] is False


def test_bad_arguments_are_one_line(tmp_path):
    proc = hpcstack("compare", str(tmp_path), "nonsense")
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1
    proc = hpcstack("compare", "tiny/9", "tiny/8", "--prefix", str(tmp_path))
    assert proc.returncode == 2 and "not installed" in proc.stderr


# ------------------------------------------------------------- SBOMs that list every file

def sbom_of_venv(prefix: Path) -> dict:
    """Rewrite ``prefix``'s SBOM with the real writer (:func:`manifest.sbom_json`) from its venv."""
    from hpcstack.install.components import manifest

    spec = {"name": "tiny", "version": "1.0", "site": "localhost", "prefix": str(prefix), "lock": None,
            "builds": [], "site_packages": str(prefix / "venv/lib/python3.11/site-packages")}
    text = manifest.sbom_json(spec)
    (prefix / ".hpcstack" / "sbom.cdx.json").write_text(text)
    return json.loads(text)


def test_the_sbom_lists_every_file_of_every_distribution_with_its_hash_on_disk(tmp_path):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    stack = make_stack(tmp_path / "a", {"alpha": "1.0"})
    sp = stack / "venv/lib/python3.11/site-packages"
    (sp / "alpha/data.txt").write_bytes(b"changed after install\n")      # RECORD still says data\n
    (sp / "alpha-1.0.dist-info/uv_cache.json").write_text("{}")
    record = sp / "alpha-1.0.dist-info/RECORD"
    record.write_text(record.read_text() + "alpha-1.0.dist-info/uv_cache.json,,\n../../../../outside,,\n")
    sbom = sbom_of_venv(stack)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(sbom)) is None
    alpha = next(c for c in sbom["components"] if c["name"] == "alpha")
    assert alpha["description"].startswith("installed in the stack's venv")      # no lock: found in the venv
    files = {f["name"]: f for f in alpha["components"]}
    assert set(files) == {"alpha/__init__.py", "alpha/data.txt", "../../../bin/alpha",
                          "alpha/__pycache__/x.cpython-311.pyc"}
    assert files["alpha/__init__.py"]["hashes"][0]["content"] == hashlib.sha256(b"VALUE = 1\n").hexdigest()
    changed = files["alpha/data.txt"]
    assert changed["hashes"][0]["content"] == hashlib.sha256(b"changed after install\n").hexdigest()
    assert changed["properties"] == [{"name": "hpcstack:record-sha256", "value": hashlib.sha256(b"data\n").hexdigest()}]
    assert {"name": "hpcstack:missing", "value": "true"} in files["../../../bin/alpha"]["properties"]


def test_a_file_changed_since_the_sbom_was_written_is_a_difference_on_its_own_side(tmp_path):
    a = make_stack(tmp_path / "a", {"alpha": "1.0", "beta": "2.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0", "beta": "2.0"})
    sbom_of_venv(a), sbom_of_venv(b)
    proc = hpcstack("compare", str(a), str(b))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lists no files" not in proc.stderr
    (b / "venv/lib/python3.11/site-packages/beta/data.txt").write_bytes(b"tampered\n")
    proc = hpcstack("compare", str(a), str(b))
    assert proc.returncode == 1
    assert f"{b}: files of beta 2.0: 1 differ from its SBOM: beta/data.txt (content)" in proc.stdout
    assert "files of beta 2.0: 1 of 2 differ: beta/data.txt (content)" in proc.stdout


def test_an_sbom_without_files_is_noted_not_counted(tmp_path):
    a = make_stack(tmp_path / "a", {"alpha": "1.0"})
    proc = hpcstack("compare", str(a), str(a))
    assert proc.returncode == 0 and "its SBOM lists no files (written by an older hpcstack)" in proc.stderr


# ------------------------------------------------------------------------- images

def test_paths_inside_an_image_stay_inside_its_root(tmp_path):
    from hpcstack.lifecycle.images import inside

    root = tmp_path / "root"
    (root / "opt/sw/tiny/.1.0-abc").mkdir(parents=True)
    (root / "opt/sw/tiny/1.0").symlink_to(".1.0-abc")
    (root / "opt/escape").symlink_to("/etc")
    (root / "opt/up").symlink_to("../../../../../etc")
    assert inside(root, "/opt/sw/tiny/1.0") == root / "opt/sw/tiny/.1.0-abc"
    assert inside(root, "/opt/escape/shadow") == root / "etc/shadow"
    assert inside(root, "/opt/up/shadow") == root / "etc/shadow"
    (root / "loop").symlink_to("/loop")
    with pytest.raises(Exception, match="too many links"):
        inside(root, "/loop/x")


def test_image_arguments(tmp_path):
    import tarfile

    from hpcstack.lifecycle.images import image_reference

    assert image_reference("image:localhost/hpcstack-mpi4py:4.1.2") == "localhost/hpcstack-mpi4py:4.1.2"
    (tmp_path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    with tarfile.open(tmp_path / "img.tar", "w") as tar:
        tar.add(tmp_path / "oci-layout", arcname="oci-layout")
    assert image_reference(str(tmp_path / "img.tar")) == f"oci-archive:{tmp_path / 'img.tar'}"
    assert image_reference(str(tmp_path)) is None
    proc = hpcstack("compare", "image:", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and "give the image after image:" in proc.stderr


# ------------------------------------------------- hostile stacks, bundles and images

SP = "venv/lib/python3.11/site-packages"


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``hpcstack ARGV`` in this process (this checkout's code): (exit status, stdout, stderr)."""
    import contextlib
    import io

    from hpcstack.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def run_bounded(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``hpcstack ARGV`` in a child Python on the package under test, killed after ``timeout``
    seconds: a read that blocks (a FIFO) or never ends (``/dev/zero``) fails the test, in time."""
    code = "import sys; from hpcstack.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(Path(compare.__file__).resolve().parents[2])}
    try:
        return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                              timeout=timeout, env=env, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        pytest.fail(f"hpcstack {' '.join(argv)}: still running after {timeout} s (it read a FIFO or a device)")


def one_error(status: int, err: str, *words: str) -> str:
    """Exit status 2 and one ``error:`` line holding ``words`` (besides ``note:`` lines); returns
    the line."""
    lines = [line for line in err.strip().splitlines() if not line.startswith("note: ")]
    assert status == 2, (status, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, err)
    return lines[0]


@pytest.mark.parametrize("name", ["alpha/../../../../../../../../../etc/shadow", "/etc/shadow",
                                  "alpha/x\x00/../../../../../../../../etc/shadow"])
def test_a_record_name_that_leaves_the_stack_is_refused(tmp_path, name):
    """``alpha/../../../../etc/shadow`` in a RECORD made root hash /etc/shadow (a sha256 oracle);
    an installer's own ``../../../bin/alpha`` (outside site-packages) is still left out."""
    a = make_stack(tmp_path / "a", {"alpha": "1.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0"})
    assert run_cli("compare", str(a), str(b))[0] == 0          # with ../../../bin/alpha in RECORD
    record_path = b / SP / "alpha-1.0.dist-info/RECORD"
    record_path.write_text(record_path.read_text() + f'"{name}",,\n')
    status, out, err = run_cli("compare", str(a), str(b))
    one_error(status, err, str(record_path), "refused")
    assert out == ""


def test_an_sbom_file_name_that_leaves_the_stack_is_refused(tmp_path):
    a = make_stack(tmp_path / "a", {"alpha": "1.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0"})
    sbom_of_venv(a)
    sbom = sbom_of_venv(b)
    assert run_cli("compare", str(a), str(b))[0] == 0
    alpha = next(c for c in sbom["components"] if c["name"] == "alpha")
    alpha["components"].append({"type": "file", "name": "alpha/../../../../../../../../etc/shadow"})
    (b / ".hpcstack/sbom.cdx.json").write_text(json.dumps(sbom))
    one_error(*run_cli("compare", str(a), str(b))[::2], str(b / ".hpcstack/sbom.cdx.json"), "'..'")


def test_a_fifo_and_a_link_to_dev_zero_in_a_stack_are_never_read(tmp_path):
    """A FIFO hung ``compare`` and a link to /dev/zero made it hash forever; a link out of the
    tree made it hash the host's file. Now each is a difference, named, and never opened."""
    a = make_stack(tmp_path / "a", {"alpha": "1.0", "beta": "2.0", "gamma": "3.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0", "beta": "2.0", "gamma": "3.0"})
    proc = run_bounded("compare", str(a), str(b))
    assert proc.returncode == 0, proc.stderr                    # the same trees: the same stack
    os.unlink(b / SP / "alpha/data.txt")
    os.mkfifo(b / SP / "alpha/data.txt")
    os.unlink(b / SP / "beta/data.txt")
    os.symlink("/dev/zero", b / SP / "beta/data.txt")
    os.unlink(b / SP / "gamma/data.txt")
    os.symlink(a / SP / "gamma/data.txt", b / SP / "gamma/data.txt")      # the same bytes, out of the tree
    proc = run_bounded("compare", str(a), str(b))
    assert proc.returncode == 1, proc.stderr
    assert "alpha/data.txt (a FIFO, not read, in " in proc.stdout
    assert "beta/data.txt (a symbolic link, not read, in " in proc.stdout
    assert "gamma/data.txt (a symbolic link, not read, in " in proc.stdout
    # the records themselves: a RECORD that is a FIFO, an SBOM that is a link to /dev/zero
    c = make_stack(tmp_path / "c", {"alpha": "1.0"})
    os.unlink(c / SP / "alpha-1.0.dist-info/RECORD")
    os.mkfifo(c / SP / "alpha-1.0.dist-info/RECORD")
    proc = run_bounded("compare", str(a), str(c))
    assert proc.returncode == 1 and "alpha 1.0 is in its SBOM but not installed" in proc.stdout, proc.stderr
    os.unlink(c / ".hpcstack/sbom.cdx.json")
    os.symlink("/dev/zero", c / ".hpcstack/sbom.cdx.json")
    proc = run_bounded("compare", str(a), str(c))
    one_error(proc.returncode, proc.stderr, str(c / ".hpcstack/sbom.cdx.json"), "a symbolic link")


def test_an_images_absolute_links_resolve_inside_the_image(tmp_path, monkeypatch):
    """An image's ``/…`` link was followed on the host (its root file system is a directory of
    the host): here the image's stack links its records and a file to absolute paths, and a
    file to ``../../..`` past its root; each is read inside the image, and the host's file of
    the same path (different bytes) is not."""
    from hpcstack.lifecycle import images

    host = make_stack(tmp_path / "host-stack", {"alpha": "1.0", "beta": "2.0"})
    root = tmp_path / "image"
    stack = make_stack(root / "opt/sw/tiny/.1.0-abc", {"alpha": "1.0", "beta": "2.0"})
    (root / "opt/sw/tiny/1.0").symlink_to("/opt/sw/tiny/.1.0-abc")
    (root / "opt/sw/shared").mkdir()
    shutil.move(stack / ".hpcstack", root / "opt/sw/shared/state")
    (stack / ".hpcstack").symlink_to("/opt/sw/shared/state")               # absolute, in the image
    outside = tmp_path / "host-data"                                         # a host path ...
    outside.mkdir()
    (outside / "data.txt").write_bytes(b"the host's file\n")
    inner = root / outside.relative_to("/")                                 # ... and the image's
    inner.mkdir(parents=True)
    (inner / "data.txt").write_bytes(b"data\n")
    os.unlink(stack / SP / "alpha/data.txt")
    os.symlink(outside / "data.txt", stack / SP / "alpha/data.txt")
    (root / "data.txt").write_bytes(b"data\n")
    os.unlink(stack / SP / "beta/data.txt")
    os.symlink("../" * 40 + "data.txt", stack / SP / "beta/data.txt")

    @contextlib.contextmanager
    def mounted(ref, driver=None, storage_root=None):
        yield root, {"Labels": {images.RECIPE_LABEL: "tiny/1.0"}, "Env": ["HPCSTACK_TINY_ROOT=/opt/sw/tiny/1.0"]}

    monkeypatch.setattr(images, "mounted_image", mounted)
    with contextlib.ExitStack() as mounts:
        side = compare.open_side("image:localhost/tiny:1.0", "IMG", None, None, mounts)
    assert side.root == stack and side.dists == {"alpha": "1.0", "beta": "2.0"}
    result = compare.compare(compare.read_stack(host, "HOST"), side)
    assert result.lines == [] and result.files_checked == 4
    # controls: the image's own file at that path is the one read; as a host's stack, no link is followed
    (inner / "data.txt").write_bytes(b"changed in the image\n")
    side = compare.read_stack(stack, "IMG", image_root=root)
    assert compare.compare(compare.read_stack(host, "HOST"), side).lines == [
        "files of alpha 1.0: 1 of 2 differ: alpha/data.txt (content)"]
    with pytest.raises(compare.ConfigError, match=r"\.hpcstack/sbom\.cdx\.json: a symbolic link on the way"):
        compare.read_stack(stack, "IMG")           # read as a host's stack: its links are not followed


def rewrite_manifest(bundle: Path) -> None:
    """List every file of ``bundle``'s wheels in its manifest again (a bundle made hostile on
    purpose still passes :func:`hpcstack.lifecycle.bundle.verify_bundle`)."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"] = {f"wheels/{w.name}": {"sha256": hashlib.sha256(w.read_bytes()).hexdigest(),
                                              "size": w.stat().st_size} for w in (bundle / "wheels").iterdir()}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_wheel_that_is_not_a_zip_is_one_line(tmp_path):
    stack = make_stack(tmp_path / "stack", {"alpha": "1.0"})
    bundle = make_bundle(tmp_path / "bundle", {"alpha": "1.0"})
    assert run_cli("compare", str(stack), str(bundle))[0] == 0
    wheel = bundle / "wheels/alpha-1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a zip\n" * 100)
    rewrite_manifest(bundle)
    one_error(*run_cli("compare", str(stack), str(bundle))[::2], str(wheel), "not a wheel")


def test_a_record_field_over_the_csv_limit_is_one_line(tmp_path):
    stack = make_stack(tmp_path / "stack", {"alpha": "1.0"})
    bundle = make_bundle(tmp_path / "bundle", {"alpha": "1.0"})
    assert run_cli("compare", str(stack), str(bundle))[0] == 0
    wheel = bundle / "wheels/alpha-1.0-py3-none-any.whl"
    long_row = "alpha/long.py,sha256=" + "A" * 300_000 + ",1\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("alpha/__init__.py", FILES["tinypkg/__init__.py"])
        zf.writestr("alpha-1.0.dist-info/RECORD", record("alpha", "1.0", {"alpha/__init__.py": b"x"}) + long_row)
    rewrite_manifest(bundle)
    one_error(*run_cli("compare", str(stack), str(bundle))[::2], str(wheel), "RECORD", "field larger than")
    # the same in an installed stack's RECORD
    other = make_stack(tmp_path / "other", {"alpha": "1.0"})
    (other / SP / "alpha-1.0.dist-info/RECORD").write_text(record("alpha", "1.0", {}) + long_row)
    one_error(*run_cli("compare", str(stack), str(other))[::2], "alpha-1.0.dist-info/RECORD", "field larger than")


def test_as_root_a_directory_that_everyone_can_change_is_refused(tmp_path):
    """The case with the real other account is tests/test_attacker_compare.py; here a
    world-writable directory above a stack, which any account could swap. The rule is root's:
    another account reads only what it may read anyway, and compares."""
    a = make_stack(tmp_path / "a", {"alpha": "1.0"})
    shared = tmp_path / "shared"
    shared.mkdir()
    b = make_stack(shared / "b", {"alpha": "1.0"})
    assert run_cli("compare", str(a), str(b))[0] == 0
    shared.chmod(0o777)
    if os.geteuid() != 0:
        assert run_cli("compare", str(a), str(b))[0] == 0
        return
    one_error(*run_cli("compare", str(a), str(b))[::2], f"stack {b}: {shared}: writable by every user")
    one_error(*run_cli("compare", str(b), str(a))[::2], f"stack {b}: {shared}: writable by every user")
    assert run_cli("compare", str(a), str(b), "--trust-writable")[0] == 0


def test_as_root_a_report_or_an_image_archive_others_can_change_is_refused(tmp_path):
    """compare --report FILE and an OCI archive argument are read through the gate (issue 45):
    opened once, no link followed, a regular file (a FIFO neither blocks nor is read), and as
    root one that only trusted accounts can change, in directories only they can change (they
    were read, and the archive handed to buildah, by name). Another account reads only what it
    may read anyway: only links it did not put there and the kind are refused."""
    import tarfile

    from blocking import returns_on_fifo
    from hpcstack.errors import ConfigError
    from hpcstack.lifecycle.images import image_reference

    a = make_stack(tmp_path / "a", {"alpha": "1.0"})
    b = make_stack(tmp_path / "b", {"alpha": "1.0"})
    report = json.dumps({"runs": []})
    (tmp_path / "r.json").write_text(report)
    (tmp_path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    with tarfile.open(tmp_path / "img.tar", "w") as tar:
        tar.add(tmp_path / "oci-layout", arcname="oci-layout")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "r.json").write_text(report)
    shutil.copy(tmp_path / "img.tar", shared / "img.tar")
    shared.chmod(0o777)
    (shared / "link.json").symlink_to(tmp_path / "r.json")
    (shared / "link.tar").symlink_to(tmp_path / "img.tar")
    assert run_cli("compare", str(a), str(b), "--report", str(tmp_path / "r.json"))[0] == 0
    assert image_reference(str(tmp_path / "img.tar")) == f"oci-archive:{tmp_path / 'img.tar'}"
    os.mkfifo(tmp_path / "fifo")
    one_error(*returns_on_fifo(lambda: run_cli("compare", str(a), str(b), "--report", str(tmp_path / "fifo")),
                               tmp_path / "fifo")[::2], "not a regular file")
    assert returns_on_fifo(lambda: image_reference(str(tmp_path / "fifo")), tmp_path / "fifo") is None
    if os.geteuid() != 0:
        assert run_cli("compare", str(a), str(b), "--report", str(shared / "r.json"))[0] == 0
        assert image_reference(str(shared / "img.tar")) == f"oci-archive:{shared / 'img.tar'}"
        return
    for name, problem in (("r.json", f"{shared}: writable by every user"), ("link.json", "a symbolic link")):
        one_error(*run_cli("compare", str(a), str(b), "--report", str(shared / name))[::2],
                  f"{shared / name}: the validation report is not read: ", problem)
    for name, problem in (("img.tar", f"{shared}: writable by every user"), ("link.tar", "a symbolic link")):
        with pytest.raises(ConfigError) as info:
            image_reference(str(shared / name))
        (line,) = info.value.lines()
        assert line.startswith(f"{shared / name}: the image archive is not read: ") and problem in line, line
