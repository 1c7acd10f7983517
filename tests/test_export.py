"""``hpcstack export``: the registry of formats, the built-in ones, and a format added in one class."""

from __future__ import annotations

import json

import pytest

from conftest import hpcstack
from hpcstack.export import EXPORTERS, get_exporter, register_exporter

pytestmark = pytest.mark.unit


def test_the_bash_export_is_the_dry_run(tmp_path):
    dry = hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run")
    out = tmp_path / "install.sh"
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", "cirrus", "--format", "bash", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == dry.stdout and "HOROVOD_GPU_OPERATIONS=NCCL" in dry.stdout


def test_the_json_export_is_the_plan():
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", "cirrus", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert [s["name"] for s in plan["steps"]][0] == "fetch"
    assert plan["prefix"] == "/work/y07/shared/cirrus-software/pytorch/2.3.1-gpu"


def test_an_unknown_format_is_one_line():
    proc = hpcstack("export", "pytorch/2.3.1-gpu", "--site", "cirrus", "--format", "rpm")
    assert proc.returncode == 2 and "invalid choice: 'rpm'" in proc.stderr


def test_a_new_format_is_one_registered_class():
    @register_exporter
    class Lines:
        name = "lines-test"
        description = "step names, one a line"
        suffix = ".txt"

        def render(self, recipe, site, plan):
            return "".join(f"{s.name}\n" for s in plan.steps)

    try:
        assert get_exporter("lines-test") is Lines
        with pytest.raises(ValueError):
            register_exporter(type("Other", (), {"name": "lines-test"}))
    finally:
        EXPORTERS.pop("lines-test")
    with pytest.raises(ValueError, match="unknown export format 'lines-test'"):
        get_exporter("lines-test")
