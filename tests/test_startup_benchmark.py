"""``benchmarks/startup.py`` runs on the local 2-node Slurm: two ranks (one per node) start from
the installed stack served over SFTP (sshfs in each node's own mount namespace, through the
benchmark's counting relay) with the ``squashfs`` layout at 1 ms, and from node-local disk; its
JSON has the figures per run and the requests the server saw. It checks fields, never times.
About 1-2 minutes on 2 loaded cores (the image is packed once under /var/tmp and kept)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, two_node_cluster

pytestmark = pytest.mark.e2e

WORK = Path("/var/tmp/hpcstack-startup-bench")


def test_two_ranks_squashfs_at_one_ms(installed_stack, tmp_path):
    for tool in ("sshfs", "squashfuse", "mksquashfs", "fusermount3"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} missing (scripts/localhost-setup --with-test-tools installs it)")
    if not os.path.exists("/usr/lib/openssh/sftp-server"):
        pytest.skip("/usr/lib/openssh/sftp-server missing (scripts/localhost-setup --with-test-tools)")
    out = tmp_path / "startup.json"
    with two_node_cluster():
        try:
            proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "startup.py"), "--stack",
                                   str(installed_stack), "--work", str(WORK), "--ranks", "2",
                                   "--layouts", "local,squashfs", "--latency", "1", "--json", str(out)],
                                  capture_output=True, text=True, timeout=1500)
        finally:
            shutil.rmtree(WORK, ignore_errors=True)  # the image: 4 GB
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["layout"], r["ranks"], r["latency_ms"]) for r in runs] == [("local", 2, 0.0), ("squashfs", 2, 1.0)]
    for r in runs:
        assert {"startup_median_s", "startup_max_s", "metadata_per_rank", "read_requests", "read_bytes",
                "server_total", "server_by_node"} <= set(r)
        assert sorted(rec["rank"] for rec in r["rank_records"]) == [0, 1]
        assert {rec["node"] for rec in r["rank_records"]} == {"n1", "n2"}
        assert 0 < r["startup_median_s"] <= r["startup_max_s"]
    local, squashfs = runs
    assert local["metadata_requests"] == 0 and local["server_total"] == {}
    # each node's sshfs spoke to the server, and the ranks imported from the image on the node
    assert set(squashfs["server_by_node"]) == {"n1", "n2"}
    assert squashfs["read_requests"] > 0 and squashfs["read_bytes"] > 0
    assert all(rec["executable"].endswith("/venv/bin/python") for rec in squashfs["rank_records"])
    assert "squashfs" in proc.stdout and "meta/rank" in proc.stdout
    # nothing stays mounted: the mounts lived in the nodes' own namespaces
    assert str(installed_stack) not in Path("/proc/self/mounts").read_text()
