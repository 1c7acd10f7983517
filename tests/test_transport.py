"""hpcstack.validate.transport: NCCL's and Open MPI's own logs say which transport the
collectives took; the judge holds it to the site's ``network:``. The parsers read real log
excerpts (tests/data/nccl-logs/, from public NVIDIA/nccl, nccl-tests, horovod and aws-ofi-nccl
issues, each named in its README; tests/data/ompi-logs/, made with Open MPI 4.1.4), the job
scripts of a GPU site carry the variables, and a job directory of logs turns into a failure of
the validation's verdict."""

from __future__ import annotations

import re

import os
from pathlib import Path

import pytest
import yaml

from hpcstack.errors import ConfigError
from hpcstack.validate import render
from hpcstack.validate.judge import judge
from hpcstack.validate.runner import read_logs
from hpcstack.validate.transport import (OmpiRule, TransportRule, judge_nccl, judge_ompi, nccl_env, parse_nccl,
                                         parse_ompi)

pytestmark = pytest.mark.unit

DATA = Path(__file__).parent / "data"
IB, SLINGSHOT = TransportRule("infiniband", True, "nccl/2.19.3", "${NCCL_HOME}"), TransportRule("slingshot", True)


def nccl(*names: str) -> dict[str, str]:
    """Excerpts of tests/data/nccl-logs/, by file name."""
    return {name: (DATA / "nccl-logs" / name).read_text() for name in names}


def ompi(*names: str) -> dict[str, str]:
    return {name: (DATA / "ompi-logs" / name).read_text() for name in names}


def test_every_excerpt_is_named_with_its_source():
    readme = (DATA / "nccl-logs" / "README.md").read_text()
    for path in sorted((DATA / "nccl-logs").glob("*.log")):
        row = next((line for line in readme.splitlines() if f"| {path.name} |" in line), "")
        assert "https://github.com/" in row, path.name
    for path in sorted((DATA / "ompi-logs").glob("*.log")):
        assert path.read_text().startswith("# made on this machine"), path.name
        assert "mpirun" in path.read_text().splitlines()[2]


# ------------------------------------------------------------------------------ the parsers

def test_socket_fallback_after_no_ib_device():
    log = parse_nccl(nccl("socket-fallback-no-ib-nccl1267.log"))
    assert set(log.networks) == {"Socket"}
    assert list(log.versions) == ["2.19.3+cuda12.3"]
    assert any("NET/IB : No device found." in ln.text for ln in log.causes)
    assert any("Failed to find ncclNetPlugin_v7 symbol" in ln.text for ln in log.plugins)


def test_channels_decide_over_init_lines():
    log = parse_nccl(nccl("socket-channels-p2p-ipc-nccl952.log"))
    assert set(log.networks) == {"Socket"} and set(log.intra) == {"P2P/IPC"}
    assert [ln.text.split("Plugin Path : ")[1] for ln in log.plugins if "Plugin Path" in ln.text] == [
        "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"]


def test_nccl_2_4_sets_up_sockets_then_uses_ib():
    log = parse_nccl(nccl("ib-and-socket-init-nccl247-horovod1523.log"))
    assert set(log.networks) == {"IB"} and list(log.versions) == ["2.4.7+cuda10.0"]


@pytest.mark.parametrize("name, networks", [
    ("ib-roce-nccltests185.log", {"IB"}), ("ib-channels-gdrdma-aks36.log", {"IB"}),
    ("ring-socket-nccl247-nccl226.log", {"Socket"}), ("ib-disabled-by-env-nccltests188.log", {"Socket"}),
    ("slingshot-cxi-awsofi801.log", {"OFI"}), ("ofi-efa-awsofi161.log", {"OFI"}),
    ("perlmutter-ofi-channels-nccltests139.log", {"OFI"}), ("horovod-mpirun-socket-horovod3658.log", {"Socket"}),
    ("socket-shm-nccltests166.log", {"Socket"}), ("p2p-cumem-nccl1538.log", set()),
])
def test_the_network_each_excerpt_shows(name, networks):
    assert set(parse_nccl(nccl(name)).networks) == networks


def test_ofi_provider_and_intra_node_kinds():
    assert set(parse_nccl(nccl("slingshot-cxi-awsofi801.log")).providers) == {"cxi"}
    assert set(parse_nccl(nccl("ofi-efa-awsofi161.log")).providers) == {"efa"}
    assert set(parse_nccl(nccl("perlmutter-ofi-channels-nccltests139.log")).intra) == {"P2P/direct pointer"}
    assert set(parse_nccl(nccl("socket-shm-nccltests166.log")).intra) == {"SHM"}
    assert set(parse_nccl(nccl("p2p-cumem-nccl1538.log")).intra) == {"P2P/CUMEM"}


# ------------------------------------------------------------------------------ the judge

def test_infiniband_fails_a_socket_fallback_quoting_the_lines_and_why():
    failures = judge_nccl(nccl("socket-fallback-no-ib-nccl1267.log"), IB, nodes=2).failures
    assert len(failures) == 1
    assert failures[0].startswith("fabric infiniband, but NCCL fell back to TCP sockets (NET/Socket), expected NET/IB")
    assert 'socket-fallback-no-ib-nccl1267.log:9: "instance-8g-96c-4:101707:101889 [0] NCCL INFO Using network Socket"' \
        in failures[0]
    assert "NET/IB : No device found." in failures[0]


def test_the_environment_that_disabled_ib_is_quoted():
    failures = judge_nccl(nccl("ib-disabled-by-env-nccltests188.log"), IB, nodes=2).failures
    assert "NCCL_IB_DISABLE set by environment to 1." in failures[0]


@pytest.mark.parametrize("name", ["ib-roce-nccltests185.log", "ib-channels-gdrdma-aks36.log",
                                  "ib-and-socket-init-nccl247-horovod1523.log"])
def test_infiniband_passes_net_ib(name):
    assert judge_nccl(nccl(name), IB, nodes=2).failures == []


@pytest.mark.parametrize("name", ["socket-channels-p2p-ipc-nccl952.log", "ring-socket-nccl247-nccl226.log",
                                  "horovod-mpirun-socket-horovod3658.log"])
def test_infiniband_fails_socket_channels(name):
    failures = judge_nccl(nccl(name), IB, nodes=2).failures
    assert len(failures) == 1 and "via NET/Socket/" in failures[0] and f"{name}:" in failures[0]


def test_slingshot_wants_ofi_with_cxi():
    assert judge_nccl(nccl("slingshot-cxi-awsofi801.log"), SLINGSHOT, nodes=2).failures == []
    efa = judge_nccl(nccl("ofi-efa-awsofi161.log"), SLINGSHOT, nodes=2).failures
    assert efa == [f"fabric slingshot, but NET/OFI selected provider efa, expected cxi: ofi-efa-awsofi161.log:6: "
                   f'"algo-1:462:462 [0] NCCL INFO NET/OFI Selected Provider is efa"']
    socket = judge_nccl(nccl("socket-fallback-no-ib-nccl1267.log"), SLINGSHOT, nodes=2).failures
    assert socket[0].startswith("fabric slingshot, but NCCL fell back to TCP sockets (NET/Socket), "
                                "expected NET/OFI with provider cxi")
    ib = judge_nccl(nccl("ib-roce-nccltests185.log"), SLINGSHOT, nodes=2).failures
    assert ib[0].startswith("fabric slingshot, but NCCL used IB, expected NET/OFI with provider cxi")


def test_slingshot_channels_alone_lack_the_provider():
    failures = judge_nccl(nccl("perlmutter-ofi-channels-nccltests139.log"), SLINGSHOT, nodes=2).failures
    assert failures[0].startswith("fabric slingshot: no line names NET/OFI's provider, expected cxi")
    both = nccl("perlmutter-ofi-channels-nccltests139.log", "slingshot-cxi-awsofi801.log")
    assert judge_nccl(both, SLINGSHOT, nodes=2).failures == []


def test_nvlink_wants_p2p_within_a_node():
    shm = judge_nccl(nccl("socket-shm-nccltests166.log"), TransportRule("none", True), nodes=2).failures
    assert len(shm) == 1 and shm[0].startswith("network.nvlink, but NCCL's channels within a node go through SHM")
    assert "via SHM/direct/direct" in shm[0] and "(and" not in shm[0]
    for name in ("p2p-cumem-nccl1538.log", "socket-channels-p2p-ipc-nccl952.log",
                 "perlmutter-ofi-channels-nccltests139.log"):
        assert judge_nccl(nccl(name), TransportRule("none", True)).failures == [], name


def test_no_fabric_checks_nothing_and_ethernet_expects_sockets():
    logs = nccl("socket-shm-nccltests166.log")
    assert judge_nccl(logs, TransportRule(), nodes=2, require_logs=True).failures == []
    assert judge_nccl(logs, TransportRule("ethernet"), nodes=2).failures == []
    assert judge_nccl({}, TransportRule(), require_logs=True).failures == []


def test_missing_or_silent_logs():
    assert judge_nccl({}, IB, nodes=2).failures == []
    assert judge_nccl({}, IB, nodes=2, require_logs=True).failures[0].startswith("no NCCL log (nccl-*.log)")
    silent = {"nccl-a-1.log": "a:1:1 [0] NCCL INFO cudaDriverVersion 12000\n"}
    assert judge_nccl(silent, IB, nodes=1).failures == []
    assert "no line of the 1 NCCL log(s) shows the network" in judge_nccl(silent, IB, nodes=2).failures[0]


def test_many_lines_are_counted_not_all_quoted():
    failures = judge_nccl(nccl("ring-socket-nccl247-nccl226.log", "horovod-mpirun-socket-horovod3658.log",
                               "socket-shm-nccltests166.log"), IB, nodes=2).failures
    assert "(and 6 more)" in failures[0]          # 7 socket channels, 2 causes, 3 quoted


def test_the_report_names_the_nccl_loaded_beside_the_sites():
    verdict = judge_nccl(nccl("ib-roce-nccltests185.log", "hpcx-plugin-ibext-nccl676.log"), IB, nodes=2)
    data = verdict.to_dict()
    assert data["nccl"]["loaded"] == ["2.19.3+cuda12.3"] and data["nccl"]["module"] == "nccl/2.19.3"
    assert any("/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so" in q for q in data["nccl"]["plugin"])
    assert verdict.nccl_line() == "NCCL loaded: 2.19.3+cuda12.3 (site: nccl/2.19.3, toolchain.nccl.home ${NCCL_HOME})"
    assert data["inter_node"] == ["IB"] and data["ok"]


def test_quoted_lines_lose_control_characters():
    failures = judge_nccl({"nccl-x-1.log": "x:1:1 [0] NCCL INFO Using network Socket\x1b[2J\x07"}, IB).failures
    assert "\x1b" not in failures[0] and "\x07" not in failures[0]


# ------------------------------------------------------------------------------ Open MPI

def test_open_mpi_shared_memory_within_a_node():
    sends = parse_ompi(ompi("one-node-vader.log"))
    assert {s.btl for s in sends} == {"vader", "self"} and all(s.same_node for s in sends)
    assert judge_ompi(ompi("one-node-vader.log")) == []


def test_open_mpi_tcp_within_a_node_fails_quoting_the_line():
    failures = judge_ompi(ompi("one-node-tcp-only.log"))
    assert len(failures) == 1
    assert failures[0].startswith("within a node Open MPI used tcp, not shared memory (vader/sm/smcuda): ")
    assert "mca: bml: Using tcp btl for send to [[27113,1],1] on node vm" in failures[0]


def test_open_mpi_between_nodes_wants_tcp():
    # lines of the form of ompi-logs/, with a second host (no public two-node excerpt: see its README)
    ok = "[n1.cluster:11] mca: bml: Using tcp btl for send to [[9,1],2] on node n2\n"
    bad = "[n1:11] mca: bml: Using openib btl for send to [[9,1],2] on node n2.cluster\n"
    assert judge_ompi({"a": ok}) == []
    assert judge_ompi({"a": bad})[0].startswith("between nodes Open MPI used openib, expected tcp: a:1:")
    assert judge_ompi({"a": "no verbose output\n"})[0].startswith("no 'mca: bml: Using ... btl' line")


# ------------------------------------------------------------------------------ the validation

def test_a_job_directory_of_logs_becomes_a_failure_of_the_verdict(tmp_path):
    from hpcstack.validate.plan import ValidationJob
    from hpcstack.validate.validation import check_transports

    job_dir = tmp_path / "n2"
    job_dir.mkdir()
    (job_dir / "nccl-node1-101707.log").write_text((DATA / "nccl-logs" / "socket-fallback-no-ib-nccl1267.log").read_text())
    (job_dir / "nccl-node2-2152176.log").write_text((DATA / "nccl-logs" / "ib-roce-nccltests185.log").read_text())
    (job_dir / "slurm-42.out").write_text("Using network Socket\n")           # not a rank's NCCL log
    os.symlink("/etc/hostname", job_dir / "nccl-link-1.log")                   # a link is never followed
    assert sorted(read_logs(job_dir, tmp_path, "nccl-", ".log")) == ["nccl-node1-101707.log", "nccl-node2-2152176.log"]

    job = ValidationJob(2, job_dir, "", ["horovod"], 8, job_id="42")
    checked = check_transports(IB, [job], [{"job_id": "42", "state": "COMPLETED"}], tmp_path)
    records = [{"job_id": "42", "nodes": 2, "state": "COMPLETED", "exit_code": "0:0"}]
    verdict = judge([], site="s", partition="p", recipe="r/1", references={}, jobs=records, transports=checked)
    assert not verdict.ok
    assert verdict.failures[0].startswith("transport: job 42 (2 node(s)): fabric infiniband, but NCCL fell back "
                                          "to TCP sockets (NET/Socket), expected NET/IB: nccl-node1-101707.log:9: ")
    entry = verdict.to_dict()["jobs"][0]["transport"]
    assert entry["inter_node"] == ["IB", "Socket"] and entry["nccl"]["loaded"] == ["2.19.3+cuda12.3"]
    assert records[0].get("transport") is None                                 # the caller's records untouched
    markdown = render.to_markdown(verdict.to_dict())
    assert ("- job 42 (2 node(s)), fabric infiniband: between nodes IB, Socket; within a node not shown; NCCL "
            "loaded 2.19.3+cuda12.3 (site: nccl/2.19.3, toolchain.nccl.home ${NCCL_HOME}); 2 log(s)") in markdown

    empty = tmp_path / "n1"
    empty.mkdir()
    none = check_transports(IB, [ValidationJob(1, empty, "", ["horovod"], 4, job_id="41")],
                            [{"job_id": "41", "state": "COMPLETED"}], tmp_path)
    assert none["41"].failures[0].startswith("no NCCL log")
    assert check_transports(None, [job], records, tmp_path) == {}


def test_stale_nccl_logs_are_removed_before_a_new_run(tmp_path):
    from hpcstack.validate.runner import remove_stale

    (tmp_path / "n2").mkdir()
    (tmp_path / "n2" / "nccl-node1-1.log").write_text("old")
    assert remove_stale(tmp_path / "n2", tmp_path) == ["nccl-node1-1.log"]


def _plan(site_name: str, tmp_path: Path, **changes):
    from conftest import unit_site
    from hpcstack.recipe import load_recipe
    from hpcstack.site import load_site
    from hpcstack.validate.plan import PlanOptions, plan_validation

    path = tmp_path / f"{site_name}.yaml"
    path.write_text(yaml.safe_dump(unit_site(site_name, **changes), sort_keys=False))
    site = load_site(str(path))
    return plan_validation(site, load_recipe("pytorch/2.3.1-gpu", site),
                           PlanOptions(nodes=[2], output_dir=str(tmp_path / "out")))


def test_gpu_job_scripts_log_nccl_per_rank(tmp_path):
    plan = _plan("perlmutter", tmp_path)
    script = plan.jobs[0].script
    assert "export NCCL_DEBUG=INFO\n" in script                   # over the site's NCCL_DEBUG: WARN
    assert "NCCL_DEBUG=WARN" not in script
    assert f"export NCCL_DEBUG_FILE={tmp_path}/out/n2/nccl-%h-%p.log\n" in script
    assert plan.rules.transport == TransportRule("slingshot", True, "nccl/2.21.5", "${NCCL_DIR}")
    assert plan.to_dict()["rules"]["transport"]["fabric"] == "slingshot"
    assert nccl_env("/d") == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/d/nccl-%h-%p.log"}


def without_fingerprint(script: str) -> str:
    """A job script without its fingerprint line (hpcstack.validate.fingerprint.job_line)."""
    return re.sub(r"python -c '.*?' \S*fingerprint\.json", "", script, flags=re.S)


def test_cpu_jobs_log_no_nccl_but_open_mpis_btls(tmp_path):
    plan = _plan("localhost", tmp_path)
    assert plan.rules.transport is None and plan.rules.ompi == OmpiRule(("tcp",))
    # (the fingerprint's collector names NCCL_DEBUG only to leave it out of net.env)
    assert all("NCCL_DEBUG" not in without_fingerprint(job.script) for job in plan.jobs)
    assert all("export OMPI_MCA_btl_base_verbose=100\n" in job.script for job in plan.jobs)
    assert _plan("perlmutter", tmp_path).rules.ompi is None          # its GPU jobs log NCCL
    (tmp_path / "ib").mkdir()
    ib = _plan("localhost", tmp_path / "ib", network={"fabric": "infiniband"})   # MPI unknown: not held
    assert ib.rules.ompi is None and all("OMPI_MCA_btl_base_verbose" not in j.script for j in ib.jobs)


def _mpi_run(nodes: int, transport: str):
    from types import SimpleNamespace

    return SimpleNamespace(nodes=nodes, records=[{"record": "config", "transport": transport}])


def test_a_cpu_job_that_used_mpi_is_held_to_shared_memory_and_tcp(tmp_path):
    """check_ompi: the job's output (slurm-<id>.out) of a completed job of 2+ ranks whose runs
    used MPI; a 1-rank job, or runs over Gloo only, are not judged."""
    from hpcstack.validate.plan import ValidationJob
    from hpcstack.validate.validation import check_transports

    job_dir = tmp_path / "n2"
    job_dir.mkdir()
    (job_dir / "slurm-42.out").write_text(
        "[n1:11] mca: bml: Using tcp btl for send to [[9,1],1] on node n2\n"
        "[n2:12] mca: bml: Using tcp btl for send to [[9,1],0] on node n1\n")
    job = ValidationJob(2, job_dir, "", ["horovod"], 2, job_id="42")
    done = [{"job_id": "42", "state": "COMPLETED"}]
    got = check_transports(None, [job], done, tmp_path, OmpiRule(("tcp",)), [_mpi_run(2, "horovod-mpi")])
    assert got["42"].failures == [] and got["42"].to_dict()["between_nodes"] == ["tcp"]
    (job_dir / "slurm-42.out").write_text("[n1:11] mca: bml: Using tcp btl for send to [[9,1],1] on node n1\n")
    got = check_transports(None, [job], done, tmp_path, OmpiRule(("tcp",)), [_mpi_run(2, "horovod-mpi")])
    assert got["42"].failures[0].startswith("within a node Open MPI used tcp, not shared memory")
    records = [{"job_id": "42", "nodes": 2, "state": "COMPLETED", "exit_code": "0:0"}]
    verdict = judge([], site="s", partition="p", recipe="r/1", references={}, jobs=records, transports=got)
    assert not verdict.ok and verdict.failures[0].startswith("transport: job 42 (2 node(s)): within a node")
    assert "Transport (Open MPI's BTL per peer" in render.to_markdown(verdict.to_dict())
    assert check_transports(None, [job], done, tmp_path, OmpiRule(("tcp",)), [_mpi_run(2, "gloo")]) == {}
    one = ValidationJob(1, job_dir, "", ["horovod"], 1, job_id="42")
    assert check_transports(None, [one], done, tmp_path, OmpiRule(("tcp",)), [_mpi_run(1, "horovod-mpi")]) == {}
    assert check_transports(None, [job], done, tmp_path, None, [_mpi_run(2, "horovod-mpi")]) == {}


def test_the_shipped_gpu_sites_state_their_fabric():
    from hpcstack.site import load_site

    assert {name: (load_site(name).network.fabric, load_site(name).network.nvlink)
            for name in ("cirrus", "perlmutter", "juwels-booster", "leonardo-booster")} == {
        "cirrus": ("infiniband", True), "perlmutter": ("slingshot", True),
        "juwels-booster": ("infiniband", True), "leonardo-booster": ("infiniband", True)}
    assert load_site("localhost").network.fabric == "none"


def test_an_unknown_fabric_is_one_line_naming_the_key(tmp_path):
    from conftest import unit_site
    from hpcstack.site import load_site

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(unit_site("localhost", name="s", network={"fabric": "myrinet", "nvlink": "yes"})))
    with pytest.raises(ConfigError) as err:
        load_site(str(path))
    problems = [p for p in err.value.problems if "network" in p]
    assert len(problems) == 2 and any("network.fabric" in p and "myrinet" in p for p in problems)
