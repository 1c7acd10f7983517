"""Options that do not go together are refused with one line and exit status 2, never ignored."""

from __future__ import annotations

import pytest

from conftest import hpcstack

pytestmark = pytest.mark.unit


def _one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "", proc.stdout
    [line] = proc.stderr.splitlines()
    assert line.startswith("error: "), line
    return line


def test_install_dry_run_refuses_stop_after():
    line = _one_error_line(hpcstack("install", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run",
                                    "--stop-after", "build"))
    assert "--stop-after build: not with --dry-run" in line


def test_local_validate_dry_run_refuses_json():
    line = _one_error_line(hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "localhost", "--local",
                                    "--dry-run", "--json"))
    assert "--json: not with --dry-run and --local" in line


def test_slurm_validate_dry_run_gives_json():
    import json

    proc = hpcstack("validate", "pytorch/2.3.1-gpu", "--site", "cirrus", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout), (dict, list))
