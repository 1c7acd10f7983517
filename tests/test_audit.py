"""``hpcstack audit``: known vulnerabilities of a lock's pins and of source builds, from real
advisories of the PyPA advisory database (tests/data/pypa-advisory-database: a few of its
directories, CC-BY 4.0, see its NOTICE.md), recorded next to an installed stack's SBOM."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import REPO, hpcstack
from hpcstack.lifecycle.audit import affected_by

pytestmark = pytest.mark.unit

DB = REPO / "tests" / "data" / "pypa-advisory-database"

#: Pins at versions that real advisories of the database affect (and six, which has none).
VULNERABLE_LOCK = """\
--index-url https://pypi.org/simple
setuptools==65.5.0 \\
    --hash=sha256:{h}
six==1.16.0 \\
    --hash=sha256:{h}
torch==1.13.0 ; sys_platform == 'linux' \\
    --hash=sha256:{h}
    # from https://pypi.org/simple
urllib3==1.26.16 \\
    --hash=sha256:{h}
wheel==0.37.1 \\
    --hash=sha256:{h}
""".format(h="0" * 64)

#: What the database says about them, with the versions that fix each (checked by hand in the
#: records: urllib3's two advisories were fixed on the 1.26 branch and on the 2.0 one).
EXPECTED = [
    "pyyaml 5.3 (built from its sdist): PYSEC-2020-96 (CVE-2020-1747, GHSA-6757-jp84-gxfx): fixed in 5.3.1",
    "pyyaml 5.3 (built from its sdist): PYSEC-2021-142 (CVE-2020-14343, GHSA-8q59-q68h-6hv4): fixed in 5.4",
    "setuptools 65.5.0: PYSEC-2022-43012 (CVE-2022-40897): fixed in 65.5.1",
    "torch 1.13.0: PYSEC-2022-43015 (CVE-2022-45907): fixed in 1.13.1",
    "urllib3 1.26.16: PYSEC-2023-192 (CVE-2023-43804, GHSA-v845-jxx5-vc9f): fixed in 1.26.17",
    "urllib3 1.26.16: PYSEC-2023-212 (CVE-2023-45803, GHSA-g4mx-q9vg-27p4): fixed in 1.26.18",
    "wheel 0.37.1: PYSEC-2022-43017 (CVE-2022-40898): fixed in 0.38.1",
]


def write_vulnerable_recipe(root: Path) -> Path:
    """``root/vuln/1.0.py``: the lock above, and PyYAML 5.3 built from its sdist."""
    rdir = root / "vuln"
    rdir.mkdir(parents=True)
    (rdir / "1.0.pypi.lock").write_text(VULNERABLE_LOCK)
    path = rdir / "1.0.py"
    path.write_text(textwrap.dedent('''\
        """A stack with pins at versions that published advisories affect."""
        from hpcstack.install.components import Modulefile, PipWheels, SourceBuild, Venv
        from hpcstack.recipe import Recipe

        def recipe(site):
            return Recipe("vuln", "1.0", whatis="a stack with vulnerable pins", components=[
                Venv(),
                PipWheels("1.0"),
                SourceBuild("pyyaml", "5.3",
                            url="https://files.pythonhosted.org/packages/source/P/PyYAML/PyYAML-5.3.tar.gz",
                            sha256="e9f45bd5b92c7974e59bcd2dcc8631a6b6cc380a904725fce7bc08872e691615"),
                Modulefile(),
            ])
        '''))
    return path


def test_each_finding_names_package_version_advisory_and_fix(tmp_path):
    recipe = write_vulnerable_recipe(tmp_path)
    proc = hpcstack("audit", str(recipe), "--site", "localhost", "--db", str(DB))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == EXPECTED
    assert proc.stderr.splitlines()[0] == (
        f"7 known vulnerabilities in 5 of 6 packages of vuln/1.0 for site localhost (1.0.pypi.lock) "
        f"(local OSV database {DB})")


def test_the_json_form_has_the_same_findings(tmp_path):
    recipe = write_vulnerable_recipe(tmp_path)
    proc = hpcstack("audit", str(recipe), "--site", "localhost", "--db", str(DB), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    assert [(p["name"], p["version"], p["origin"]) for p in doc["packages"]] == [
        ("setuptools", "65.5.0", "lock"), ("six", "1.16.0", "lock"), ("torch", "1.13.0", "lock"),
        ("urllib3", "1.26.16", "lock"), ("wheel", "0.37.1", "lock"), ("pyyaml", "5.3", "sdist")]
    assert {(f["package"], f["id"], tuple(f["fixed_in"])) for f in doc["findings"]} == {
        ("pyyaml", "PYSEC-2020-96", ("5.3.1",)), ("pyyaml", "PYSEC-2021-142", ("5.4",)),
        ("setuptools", "PYSEC-2022-43012", ("65.5.1",)), ("torch", "PYSEC-2022-43015", ("1.13.1",)),
        ("urllib3", "PYSEC-2023-192", ("1.26.17",)), ("urllib3", "PYSEC-2023-212", ("1.26.18",)),
        ("wheel", "PYSEC-2022-43017", ("0.38.1",))}
    assert doc["recorded"] is None


def test_the_pytorch_recipes_lock_has_none_of_these_advisories():
    """torch 2.3.1, setuptools 72.1.0, pyyaml 6.0.1 and Horovod 0.28.1 are past every fix here."""
    proc = hpcstack("audit", "pytorch/2.3.1-gpu", "--site", "localhost", "--db", str(DB))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("no known vulnerabilities in ")


def _record(name: str) -> dict:
    return yaml.safe_load((DB / "vulns" / name.split("/")[0] / f"{name.split('/')[1]}.yaml").read_text())


def test_osv_ranges_per_branch_and_local_versions():
    """The OSV range rule on real records: each branch names its own fix; a local label
    (``+cu121``) is the same release; ``introduced`` bounds the range from below."""
    both = _record("urllib3/PYSEC-2023-212")
    assert affected_by(both, "urllib3", "2.0.5") == ["2.0.7"]
    assert affected_by(both, "urllib3", "1.26.17") == ["1.26.18"]
    assert affected_by(both, "urllib3", "1.26.18") is None
    assert affected_by(both, "urllib3", "2.0.7") is None
    assert affected_by(both, "URLLib3", "1.25.0") == ["1.26.18"]        # names compared canonicalised
    assert affected_by(_record("torch/PYSEC-2022-43015"), "torch", "1.13.0+cu117") == ["1.13.1"]
    assert affected_by(_record("torch/PYSEC-2022-43015"), "torch", "2.3.1+cu121") is None
    assert affected_by(_record("pyyaml/PYSEC-2020-176"), "pyyaml", "5.0") is None   # introduced 5.1
    assert affected_by(_record("pyyaml/PYSEC-2020-176"), "pyyaml", "5.1.2") == ["5.2b1"]
    assert affected_by({**both, "withdrawn": "2024-01-01T00:00:00Z"}, "urllib3", "2.0.5") is None


def _fake_stack(root: Path) -> Path:
    """A stack prefix holding only what the audit reads: an SBOM written by the install's own code."""
    from hpcstack.install.components.manifest import sbom_json

    build = root / ".vuln-1.0-abc"
    state = build / ".hpcstack"
    state.mkdir(parents=True)
    lock = root / "1.0.pypi.lock"
    lock.write_text(VULNERABLE_LOCK)
    spec = {"name": "vuln", "version": "1.0", "description": "", "site": "localhost",
            "prefix": str(root / "1.0"), "lock": str(lock),
            "builds": [{"package": "pyyaml", "version": "5.3", "url": "https://example.org/PyYAML-5.3.tar.gz",
                        "sha256": "e" * 64, "patches": [], "env": {}, "probes": []}]}
    (state / "sbom.cdx.json").write_text(sbom_json(spec))
    (root / "1.0").symlink_to(build.name)
    return root / "1.0"


def test_an_installed_stack_is_audited_from_its_sbom_and_the_result_recorded_beside_it(tmp_path):
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    prefix = _fake_stack(tmp_path)
    show = hpcstack("show", str(prefix))
    assert show.returncode == 0, show.stderr
    assert f"audited:       never (hpcstack audit --stack {prefix} --db DIR)" in show.stdout
    proc = hpcstack("audit", "--stack", str(prefix), "--db", str(DB))
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == EXPECTED
    record = prefix / ".hpcstack" / "audit.cdx.json"
    assert f"recorded in {Path(str(record)).resolve()}" in proc.stderr
    text = record.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    doc = json.loads(text)
    vulns = {(v["id"], v["affects"][0]["ref"]) for v in doc["vulnerabilities"]}
    assert ("PYSEC-2022-43015", "pypi:torch==1.13.0") in vulns and len(vulns) == 7
    # the refs are the SBOM's own
    sbom_refs = {c["bom-ref"] for c in json.loads((prefix / ".hpcstack" / "sbom.cdx.json").read_text())["components"]}
    assert {ref for _, ref in vulns} <= sbom_refs
    torch = next(v for v in doc["vulnerabilities"] if v["id"] == "PYSEC-2022-43015")
    assert torch["recommendation"] == "upgrade torch to 1.13.1"
    assert torch["references"][0]["id"] == "CVE-2022-45907"
    show = hpcstack("show", str(prefix))
    line = next(x for x in show.stdout.splitlines() if x.startswith("audited:"))
    assert line == (f"audited:       {doc['metadata']['timestamp']}: 7 known vulnerabilities "
                    f"(local OSV database {DB})")


@pytest.mark.parametrize("args, message", [
    (["--db", "/nonexistent/advisories", "pytorch/2.3.1-gpu"],
     "error: --db /nonexistent/advisories: no such directory (a local OSV advisory database, "
     "e.g. a clone of https://github.com/pypa/advisory-database)"),
    (["--db", str(REPO / "hpcstack" / "lifecycle")], None),
    ([], "error: give a recipe (NAME/VERSION, with --site) or --stack PREFIX"),
    (["pytorch/2.3.1-gpu", "--stack", "/tmp"], "error: give a recipe (NAME/VERSION, with --site) or "
                                               "--stack PREFIX, not both"),
    (["--stack", "/tmp", "--db", str(DB)], "error: --stack /tmp: not a stack installed by hpcstack "
                                           "(no .hpcstack/ in /tmp)"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = hpcstack("audit", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stdout == ""
    if message:
        assert proc.stderr.strip() == message


def test_an_unreachable_live_service_says_so_in_one_line_and_exit_3():
    """No live vulnerability service is reachable from these machines; a closed port stands for
    one that cannot be reached anywhere."""
    proc = hpcstack("audit", "pytorch/2.3.1-gpu", "--osv-url", "http://127.0.0.1:9")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("error: cannot reach the OSV service at http://127.0.0.1:9 (")
    assert "give --db DIR, a local copy of an OSV advisory database" in proc.stderr


def test_the_live_service_path_against_an_osv_api_on_loopback(tmp_path):
    """The OSV API's two calls (``POST /v1/querybatch``, ``GET /v1/vulns/ID``) answered on loopback
    from the same records, as OSV answers them: the same findings as the local database gives."""
    import http.server
    import threading

    from hpcstack.lifecycle.audit import OsvDatabase, Package, affected_by

    names = ("torch", "wheel", "urllib3", "pyyaml", "setuptools")
    records = {r["id"]: r for r in OsvDatabase(DB).records([Package(n, "0") for n in names])}

    class Osv(http.server.BaseHTTPRequestHandler):
        def _send(self, doc):
            body = json.dumps(doc, default=str).encode()  # YAML read its timestamps as datetimes
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):  # noqa: N802 - http.server's name
            queries = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["queries"]
            self._send({"results": [{"vulns": [{"id": i} for i, r in records.items()
                                               if affected_by(r, q["package"]["name"], q["version"]) is not None]}
                                    for q in queries]})

        def do_GET(self):  # noqa: N802
            self._send(records[self.path.rsplit("/", 1)[-1]])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Osv)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        recipe = write_vulnerable_recipe(tmp_path)
        proc = hpcstack("audit", str(recipe), "--site", "localhost",
                        "--osv-url", f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == EXPECTED
    assert f"(OSV service http://127.0.0.1:{server.server_address[1]})" in proc.stderr
