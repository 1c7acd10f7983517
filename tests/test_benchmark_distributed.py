"""benchmarks/distributed.py (Horovod against DDP on two PyTorch stacks): its command line, its
table, and one real round of one configuration on the local Slurm cluster with the installed
pytorch/2.3.1-gpu (e2e, about a minute). The recorded runs are in docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import HPCSTACK, REPO, STACK_TOP, two_node_cluster

SCRIPT = REPO / "benchmarks" / "distributed.py"

pytestmark = pytest.mark.e2e


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster():
        yield


def test_one_round_of_ddp_on_1_and_2_nodes(installed_stack, cluster, tmp_path):
    out = tmp_path / "runs.json"
    proc = run("--rounds", "1", "--configs", "2.3.1-gpu:ddp", "--hpcstack", HPCSTACK[0], "--old-prefix", str(STACK_TOP / "software"),
               "--old-module-root", str(STACK_TOP / "modulefiles"), "--output-root", "/tmp",
               "--json", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "load average before:" in proc.stdout and "load average after:" in proc.stdout
    row = next(l for l in proc.stdout.splitlines() if l.startswith("| pytorch/2.3.1-gpu | ddp |"))
    assert "| 1/1 |" in row
    (result,) = json.loads(out.read_text())["results"]
    assert result["img_s_1"] > 0 and result["img_s_2"] > 0 and 0 < result["efficiency"]
