"""``benchmarks/startup.py --report`` and ``--model``: what docs/benchmarks.md quotes from the
start-up runs is what the script prints, without running anything.

``--report FILE.json`` prints a kept run's tables again (the runs pair each layout with node-local
of the same round and rank count); ``--model`` multiplies measured counts by a node count. The raw
files under docs/benchmarks/raw/ that the page cites are exactly these outputs.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import REPO

pytestmark = pytest.mark.unit

RAW = REPO / "docs" / "benchmarks" / "raw"


def _startup():
    spec = importlib.util.spec_from_file_location("startup_bench", REPO / "benchmarks" / "startup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(layout: str, ranks: int, rnd: int, max_s: float, **extra) -> dict:
    return {"layout": layout, "ranks": ranks, "round": rnd, "latency_ms": 0.0 if layout == "local" else 1.0,
            "startup_median_s": max_s, "startup_max_s": max_s, "metadata_per_rank": extra.get("meta", 0.0),
            "read_requests": extra.get("reads", 0), "read_bytes": extra.get("bytes", 0),
            "server_total": {}, "mount_s_by_node": extra.get("mounts", {}),
            "mount_max_s": max(extra.get("mounts", {}).values(), default=0.0)}


def test_rounds_are_paired_with_node_local_of_the_same_round(tmp_path):
    runs = [_run("local", 2, 1, 2.0), _run("unpacked", 2, 1, 1.0, meta=40.0, mounts={"n1": 50.0, "n2": 70.5}),
            _run("local", 2, 2, 4.0), _run("unpacked", 2, 2, 6.0, meta=42.0, mounts={"n1": 51.0, "n2": 52.0})]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    out = _startup().report(path)
    rows = [line.split() for line in out.splitlines() if line.startswith("unpacked")]
    # per run: against the local run of its own round (0.50, then 1.50), and each node's mounts
    assert rows[0][5] == "0.50" and rows[1][5] == "1.50", out
    assert "n1=50.00 n2=70.50" in out
    # summary: the ratio of the medians (3.50 / 3.00) and the paired rounds' median (1.00)
    assert re.search(r"^unpacked\s+1\.0\s+2\s+2\s+3\.50\s+1\.17\s", out, re.M), out
    assert "unpacked 1.0 ms, N 2: median 1.00x (min-max 0.50-1.50, IQR 0.75-1.25, n 2); per round 0.50, 1.50" in out


def test_a_round_without_its_local_run_is_not_paired(tmp_path):
    # a stopped run: round 2's local never ran
    runs = [_run("local", 1, 1, 2.0), _run("staged", 1, 1, 3.0), _run("staged", 1, 2, 9.0)]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": runs}))
    out = _startup().report(path)
    assert "staged 1.0 ms, N 1: median 1.50x (min-max 1.50-1.50, IQR 1.50-1.50, n 1)" in out, out


@pytest.mark.parametrize("name", ["staged", "loop", "barrier", "dontneed", "unpacked5"])
def test_the_kept_reports_are_what_the_script_prints(name):
    kept = (RAW / f"startup-{name}-2026-11-28.report.txt").read_text()
    assert _startup().report(RAW / f"startup-{name}-2026-11-28.json") + "\n" == kept


def test_the_models_on_the_page_are_what_their_commands_print(capsys):
    page = (REPO / "docs" / "benchmarks.md").read_text()
    paragraphs = [" ".join(p.split()) for p in page.split("\n\n")]
    models = [p for p in paragraphs if p.startswith("Command: `python3 benchmarks/startup.py --model")]
    assert len(models) == 2, models
    startup = _startup()
    for para in models:
        argv = shlex.split(re.match(r"Command: `([^`]*)`", para).group(1))[2:]
        raw = re.search(r"\]\((benchmarks/raw/startup-model-[^)]+)\)", para).group(1)
        assert startup.main(argv) == 0
        assert capsys.readouterr().out == (REPO / "docs" / raw).read_text(), raw


def test_the_model_multiplies_by_the_nodes_and_divides_by_the_rates():
    out = _startup().model([2, 1000], {"directory": 24626}, 500_000.0, {"staged": 4029}, [100.0])
    assert re.search(r"^\s+2\s+49,252\s+0\.0985$", out, re.M), out
    assert re.search(r"^\s+1,000\s+24,626,000\s+49\.3$", out, re.M), out
    assert re.search(r"^\s+1,000\s+4,029\s+40\.3$", out, re.M), out


def test_the_model_refuses_what_it_cannot_compute():
    startup = _startup()
    with pytest.raises(ValueError):
        startup.model([2], {"d": 1.0}, 0.0)
    with pytest.raises(ValueError):
        startup.model([], {"d": 1.0}, 1.0)
    with pytest.raises(ValueError, match="--model-requests: 'directory' is not NAME=NUMBER"):
        startup._named_numbers("directory", "--model-requests")
    with pytest.raises(ValueError, match="is not NAME=NUMBER"):
        startup._named_numbers("directory=many", "--model-requests")


def test_report_of_a_file_that_is_no_run_exits_2(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert _startup().main(["--report", str(bad)]) == 2
    assert "not a --json file of benchmarks/startup.py" in capsys.readouterr().err
    assert _startup().main(["--report", str(tmp_path / "missing.json")]) == 2
