"""``hpcstack status`` (hpcstack.validate.status): the table, the JSON, and the static page:
each stack's verdict in the HTML (parsed), an <img> per plot, the JSON file beside it loadable."""

from __future__ import annotations

import io
import json
import time
from contextlib import closing
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
import yaml

from conftest import hpcstack, unit_site
from hpcstack.validate import history, status
from historydata import FP, day, report, sample

pytestmark = pytest.mark.unit


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.text, self.scripts = [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        self.scripts += tag == "script"

    def handle_data(self, data):
        self.text.append(data)


def _fill(root):
    site = SimpleNamespace(name="testsite", install_root=str(root), raw={})
    with closing(history.open_history(history.history_path(site))) as conn:
        ok, slow = "pytorch/2.3.1-gpu", "mpi4py/4.1.2"
        for stack in (ok, slow):
            history.record_report(conn, stack, stack, "install", report(generated=day(1)), started=day(1),
                                  fingerprint=FP, sample=sample(1000, seed=1))
        for d in (2, 3):
            history.record_report(conn, ok, ok, "full", report(generated=day(d)), started=day(d),
                                  fingerprint=FP, sample=sample(1000, seed=d))
            history.record_report(conn, slow, slow, "full", report(generated=day(d)), started=day(d),
                                  fingerprint={**FP, "kernel": "5.14.0-427"}, sample=sample(750, seed=d))
        history.record_not_run(conn, ok, ok, "smoke", "slot skipped", started=day(4))
    return site


def test_the_page_holds_each_stacks_verdict_and_an_image_per_plot(tmp_path):
    site = _fill(tmp_path / "root")
    runs = history.read_runs(history.history_path(site))
    doc = status.status_document(site, runs, {"pytorch/2.3.1-gpu": 3})
    written = status.write_html(site, str(tmp_path / "www"), doc, runs)
    page = _Page()
    page.feed((tmp_path / "www" / "testsite.html").read_text())
    text = " ".join(page.text)
    verdicts = {(r["stack"], r["tier"]): r["verdict"] for r in doc["stacks"]}
    assert verdicts == {("mpi4py/4.1.2", "install"): "OK", ("mpi4py/4.1.2", "full"): "DEGRADED",
                        ("pytorch/2.3.1-gpu", "install"): "OK", ("pytorch/2.3.1-gpu", "full"): "OK",
                        ("pytorch/2.3.1-gpu", "smoke"): "NOT-RUN"}
    for stack in ("mpi4py/4.1.2", "pytorch/2.3.1-gpu"):
        assert stack in text
    for word in ("DEGRADED", "NOT-RUN", "OK", "changed kernel: 5.14.0-362.el9.x86_64 -> 5.14.0-427"):
        assert word in text
    assert len(page.images) == 4 and page.scripts == 0                 # two plots per stack, no script
    for image in page.images:
        png = tmp_path / "www" / image["src"]
        assert png.read_bytes().startswith(b"\x89PNG") and image["alt"]
    data = json.loads((tmp_path / "www" / "testsite.json").read_text())
    assert data["stacks"] == json.loads(json.dumps(doc["stacks"]))
    assert next(r for r in data["stacks"] if r["stack"] == "pytorch/2.3.1-gpu")["users_30d"] == 3
    assert len(written) == 6


def test_the_table_names_every_stack_and_verdict(tmp_path):
    site = _fill(tmp_path / "root")
    out = io.StringIO()
    status.print_table(status.status_document(site, history.read_runs(history.history_path(site)), None), out)
    text = out.getvalue()
    assert "DEGRADED" in text and "NOT-RUN" in text and "what changed since the last OK run" in text
    assert "changed kernel" in text


def test_the_command_prints_json_and_writes_the_page_and_reframe_references(tmp_path):
    root = tmp_path / "roots"
    site_file = tmp_path / "testsite.yaml"
    site_file.write_text(yaml.safe_dump(unit_site("localhost", name="testsite", roots=root)))
    _fill(root / "software")
    proc = hpcstack("status", "--site", str(site_file), "--json", "--html", str(tmp_path / "www"),
                    "--reframe-refs", str(tmp_path / "refs.yaml"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert {r["verdict"] for r in doc["stacks"]} == {"OK", "DEGRADED", "NOT-RUN"}
    assert (tmp_path / "www" / "testsite.html").is_file()
    refs = yaml.safe_load((tmp_path / "refs.yaml").read_text())
    assert refs["mpi4py/4.1.2"]["testsite:gpu"][2]["throughput_total"][0] == 1000.0


def test_an_empty_history_says_so(tmp_path):
    root = tmp_path / "roots"
    site_file = tmp_path / "testsite.yaml"
    site_file.write_text(yaml.safe_dump(unit_site("localhost", name="testsite", roots=root)))
    proc = hpcstack("status", "--site", str(site_file))
    assert proc.returncode == 0, proc.stderr
    assert "no validation recorded for site testsite" in proc.stdout


def test_users_are_counted_from_the_usage_log_of_the_last_30_days(tmp_path, monkeypatch):
    from hpcstack.lifecycle import usage

    now = time.time()
    events = [usage.Event(int(now - 86400), "alice", "pytorch/2.3.1-gpu", "login1", None, id="1.1.1"),
              usage.Event(int(now - 86400), "bob", "pytorch/2.3.1-gpu", "login1", None, id="1.1.2"),
              usage.Event(int(now - 40 * 86400), "carol", "pytorch/2.3.1-gpu", "login1", None, id="1.1.3")]
    monkeypatch.setattr(usage, "read_log", lambda cfg, now=None, pol=None, since=None: (events, 0))
    site = SimpleNamespace(name="s", raw={"lifecycle": {"usage_log": str(tmp_path)}})
    assert status.users_per_stack(site, now=now) == {"pytorch/2.3.1-gpu": 2}
    assert status.users_per_stack(SimpleNamespace(name="s", raw={})) is None


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


_PLOT = ("import sys; from hpcstack.validate import status; "
         "sys.stdout.buffer.write(status.plot([], 'throughput_total'))")


def test_a_matplotlibrc_of_the_callers_changes_no_plot(tmp_path):
    """status runs as root from the admin's working directory: a user's ./matplotlibrc there
    (savefig.dpi: 400), $MATPLOTLIBRC or $MPLCONFIGDIR's matplotlibrc is not read; the PNG is the
    size of matplotlib's defaults (7 x 3.2 in at 90 dpi). A fresh interpreter: matplotlib reads its
    rc at import."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    rc = "savefig.dpi: 400\n"
    (tmp_path / "matplotlibrc").write_text(rc)
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "matplotlibrc").write_text(rc)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MATPLOTLIBRC": str(tmp_path / "env"),
           "MPLCONFIGDIR": str(tmp_path / "env")}
    proc = subprocess.run([sys.executable, "-c", _PLOT], cwd=tmp_path, env=env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert _png_size(proc.stdout) == (630, 288)
    assert sorted(p.name for p in (tmp_path / "env").iterdir()) == ["matplotlibrc"]   # no font cache there


def test_rc_settings_read_before_are_not_used(monkeypatch):
    """Where matplotlib was imported already (its rc read from wherever), the plot still uses
    the defaults."""
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "savefig.dpi", 400)
    monkeypatch.setitem(matplotlib.rcParams, "figure.facecolor", "red")
    assert _png_size(status.plot([], "startup_s")) == (630, 288)
