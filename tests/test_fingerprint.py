"""The environment fingerprint (hpcstack.validate.fingerprint): the job's collector runs, what it
wrote is checked, merged and diffed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcstack.validate import fingerprint

pytestmark = pytest.mark.unit


def test_the_job_line_writes_a_fingerprint_with_every_key(tmp_path):
    out = tmp_path / "n1" / fingerprint.FILENAME
    out.parent.mkdir()
    line = fingerprint.job_line(out).replace("python -c", f"{sys.executable} -c", 1)
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "LOADEDMODULES": "python/3.11:mpi4py/4.1.2",
                               "SLURM_JOB_NODELIST": "node[01-02]"})
    assert proc.returncode == 0, proc.stderr
    got = fingerprint.from_job(json.loads(out.read_text()))
    assert set(got) == set(fingerprint.KEYS)
    assert got["modules"] == "python/3.11:mpi4py/4.1.2" and got["nodes"] == "node[01-02]"
    assert got["kernel"] and got["python"]
    assert got["nccl.version"] is None      # left for the NCCL logs


def test_a_failing_collector_never_fails_the_job(tmp_path):
    line = fingerprint.job_line(tmp_path / "missing-dir" / "fingerprint.json")
    proc = subprocess.run(["bash", "-c", f"{line}; echo rc=$?"], capture_output=True, text=True, timeout=120,
                          env={"PATH": f"{sys.prefix}/bin:/usr/bin:/bin"})
    assert "rc=0" in proc.stdout
    assert "no environment fingerprint" in proc.stderr


def test_the_collector_follows_no_link_at_its_temporary_name(tmp_path):
    """The collector runs as the job's account in a directory it may share: a link planted at
    fingerprint.json.tmp (the old fixed temporary name) is not written through; the file comes
    from a new temporary file (mkstemp, O_EXCL) renamed over the name, none left behind."""
    out = tmp_path / "fingerprint.json"
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "fingerprint.json.tmp").symlink_to(victim)
    proc = subprocess.run([sys.executable, "-c", fingerprint.COLLECTOR, str(out)], capture_output=True, text=True,
                          timeout=120, env={"PATH": f"{sys.prefix}/bin:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "untouched\n"
    assert not out.is_symlink() and set(json.loads(out.read_text())) >= {"kernel", "python"}
    assert oct(out.stat().st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fingerprint.json", "fingerprint.json.tmp", "victim"]


def test_what_a_job_wrote_is_checked():
    got = fingerprint.from_job({"gpu.model": "A100\n\x1b[31m", "evil": "x", "modules": ["a", "b"],
                                "os": "x" * 10000})
    assert "evil" not in got and got["gpu.model"].startswith("A100") and "\x1b" not in got["gpu.model"]
    assert got["modules"] == "a, b" and len(got["os"]) == fingerprint.MAX_VALUE
    assert fingerprint.from_job(["not", "a", "dict"]) == {k: None for k in fingerprint.KEYS}


def test_merge_keeps_every_jobs_distinct_values():
    a = {**dict.fromkeys(fingerprint.KEYS), "nodes": "n01", "slurm": "slurm 23.02"}
    b = {**dict.fromkeys(fingerprint.KEYS), "nodes": "n[01-02]", "slurm": "slurm 23.02"}
    got = fingerprint.merge([a, b])
    assert got["nodes"] == "n01; n[01-02]" and got["slurm"] == "slurm 23.02" and got["mpi"] is None


def test_diff_lists_added_removed_and_changed_keys_in_order():
    old = {"gpu.driver": "535.104.05", "mpi": "Open MPI 4.1.5", "kernel": "5.14"}
    new = {"gpu.driver": "550.54.15", "kernel": "5.14", "slurm": "slurm 24.05"}
    assert fingerprint.diff(old, new) == ["changed gpu.driver: 535.104.05 -> 550.54.15",
                                          "removed mpi: Open MPI 4.1.5", "added slurm: slurm 24.05"]
    assert fingerprint.diff(new, new) == []


def test_the_nccl_the_logs_name_fills_the_fingerprint():
    rep = {"jobs": [{"transport": {"nccl": {"loaded": ["2.19.3+cuda12.3"], "plugin": ["NET/Plugin : No plugin found"]}}},
                    {"transport": {"nccl": {"loaded": ["2.18.1+cuda12.1", "2.19.3+cuda12.3"], "plugin": []}}},
                    {"state": "FAILED"}]}
    assert fingerprint.nccl_of_report(rep) == {"nccl.version": "2.18.1+cuda12.1, 2.19.3+cuda12.3",
                                               "nccl.net_plugin": "NET/Plugin : No plugin found"}
    assert fingerprint.nccl_of_report({"jobs": [{}]}) == {"nccl.version": None, "nccl.net_plugin": None}
    assert fingerprint.nccl_of_report({"jobs": "x"}) == {"nccl.version": None, "nccl.net_plugin": None}


def test_the_collector_reads_the_transport_settings_and_cpu(tmp_path):
    out = tmp_path / "fp.json"
    env = {**os.environ, "NCCL_IB_DISABLE": "1", "GLOO_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "INFO", "HOME_X": "1"}
    subprocess.run([sys.executable, "-c", fingerprint.COLLECTOR, str(out)], check=True, env=env, timeout=60)
    got = json.loads(out.read_text())
    assert got["net.env"] == "GLOO_SOCKET_IFNAME=ib0 NCCL_IB_DISABLE=1"        # sorted; NCCL_DEBUG is hpcstack's
    assert got["cpu.affinity"] == str(len(os.sched_getaffinity(0)))
    assert set(got) == set(fingerprint.KEYS) - {"stack.build"}
