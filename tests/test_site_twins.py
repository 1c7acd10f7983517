"""The site twins (scripts/site-twin): Slurm's own answers on each twin of a real site.

Each twin is brought up by the real script (MariaDB, slurmdbd, slurmctld, two slurmd nodes in
namespaces of their own, the SFTP server of the site's shared paths) and asked what the site's
documentation says its Slurm answers: refusals of a job without a budget, of Cirrus's ``#SBATCH``
options on GPU jobs and of an unknown QOS (by Slurm or the site's ``job_submit.lua``), the
``CUDA_VISIBLE_DEVICES`` Slurm sets per task for the three GPU request forms, the node shape
(hardware threads), and the compute nodes' view of the file systems (/home absent on Cirrus, the
site's shared path over sshfs). Jobs run as the twin's ordinary user (root's PATH leaks into jobs;
mpirun refuses root) and are waited for by polling ``squeue``/``scontrol``.

The module's fixture takes localhost's Slurm (scripts/localhost-slurm) down if it is up, brings
one twin up at a time, and puts localhost's Slurm back as it found it (up with its node count, or
down).
"""

from __future__ import annotations

import pwd
import re
import subprocess
from pathlib import Path

import pytest

from twins import SITES, Twin, gpus_per_node, twin_checks, twin_conf

pytestmark = pytest.mark.integration


@pytest.fixture
def twin(twins, request):
    """The twin of the test's class (its ``site``), up."""
    return twins.use(request.cls.site)


def job_state(record: str) -> str:
    return re.search(r"JobState=(\w+)", record).group(1)


SHOW_TASK = "#!/bin/bash\n" \
    'echo "task $(hostname) $SLURM_LOCALID ${CUDA_VISIBLE_DEVICES-unset}"\n'


def tasks_gpus(output: str) -> dict[tuple[str, int], str]:
    """{(node, local task id): CUDA_VISIBLE_DEVICES} from SHOW_TASK lines."""
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "task":
            found[(parts[1], int(parts[2]))] = parts[3]
    return found


def per_task_script(twin: Twin, srun_options: str) -> str:
    task = twin.dir / "task.sh"
    task.write_text(SHOW_TASK)
    task.chmod(0o755)
    return f"#!/bin/bash\nsrun {srun_options} {task}\n"


#: what Slurm 22.05 sets per task, 2 nodes x 4 tasks (docs/admin/sites.md, "Site twins")
GPU_FORMS = {
    "--gres=gpu:4": {i: "0,1,2,3" for i in range(4)},
    "--gpus-per-node=4": {i: "0,1,2,3" for i in range(4)},
    "--gpus-per-task=1": {i: str(i) for i in range(4)},
}


def twin_sftp_address() -> tuple[str, int]:
    """Where the twin's nodes reach its SFTP server: ``(address, port)`` as scripts/site-twin wrote
    them into the nodes' start script at ``up`` (/run/hpcstack-twin/node-start.sh: the iptables
    rule that lets only root through, and each sshfs mount's ``directport``), from
    ``$HPCSTACK_SLURM_SUBNET.1`` (scripts/localhost-slurm, default 10.77.0) and
    ``$HPCSTACK_TWIN_SFTP_PORT`` (default 7022); checked against the address and port the running
    ``sftp-listen`` (pid in /run/hpcstack-twin/pids) was started with.

    Raises:
        AssertionError: no rule, a mount or the server elsewhere.
        OSError: the twin's state files are missing (no twin up).
    """
    state = Path("/run/hpcstack-twin")
    start = (state / "node-start.sh").read_text()
    rule = re.search(r"^iptables -A OUTPUT -p tcp -d (\S+) --dport (\d+) -m owner ! --uid-owner 0 -j REJECT$",
                     start, re.M)
    assert rule, start
    addr, port = rule.group(1), int(rule.group(2))
    mounts = re.findall(r"^sshfs -o (\S+) ([^\s:]+):/\S* /\S*$", start, re.M)
    assert mounts and all((host, f"directport={port}") == (addr, opts.split(",")[0]) for opts, host in mounts), start
    pid = (state / "pids" / "sftp-listen").read_text().split()[0]
    argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    at = next(i for i, a in enumerate(argv) if a.endswith("/sftp-listen"))
    assert argv[at + 1:at + 3] == [addr, str(port)], (argv, addr, port)
    return addr, port


class EveryTwin:
    """What every twin answers; one class per twin is made below from its data (the tests of a
    class share its twin, so the twins come up one after the other, once each)."""

    site = ""

    def options(self, twin, *keys: str) -> list[str]:
        """The twin's job options of checks.toml ``[slurm]`` ``keys``, with {account} and {gpus}."""
        values = {"account": twin.account, "gpus": gpus_per_node(self.site)}
        slurm = twin_checks(self.site).get("slurm", {})
        return [opt.format(**values) for key in keys for opt in slurm.get(key, [])]

    def test_each_rank_gets_a_gpu_of_its_own(self, twin):
        """The site's GPU job (checks.toml ``gpu_job_options``) on 2 nodes, one task per GPU
        (``srun --gpus-per-task=1``): Slurm gives every task of a node a GPU of its own, which
        is what the stacks' validation binds its ranks by."""
        gpus = gpus_per_node(self.site)
        script = per_task_script(twin, f"--ntasks-per-node={gpus} --gpus-per-task=1")
        record, out = twin.run(*self.options(twin, "job_options", "gpu_job_options"), "--nodes=2", script=script)
        assert job_state(record) == "COMPLETED", record + out
        assert tasks_gpus(out) == {(node, i): str(i) for node in ("n1", "n2") for i in range(gpus)}, out

    def test_unknown_qos_refused(self, twin):
        proc = twin.sbatch(f"--account={twin.account}", "--qos=no_such_qos", script="#!/bin/bash\nhostname\n")
        assert proc.returncode != 0
        assert "Invalid qos specification" in proc.stderr, proc.stderr

    def test_shared_path_over_sshfs_on_compute_nodes(self, twin):
        path, mode = twin.shared[0]
        probe = twin.dir / "probe.sh"
        probe.write_text(f"#!/bin/bash\necho mount $(hostname) $(findmnt -n -o FSTYPE --target {path}) "
                         f"$(findmnt -n -o OPTIONS --target {path} | cut -d, -f1)\n")
        probe.chmod(0o755)
        record, out = twin.run(f"--account={twin.account}", "--nodes=2",
                               script=f"#!/bin/bash\nsrun --ntasks-per-node=1 {probe}\n")
        assert job_state(record) == "COMPLETED", record + out
        assert sorted(re.findall(r"mount n\d \S+ \S+", out)) == [
            f"mount n1 fuse.sshfs {mode}", f"mount n2 fuse.sshfs {mode}"], out
        host_type = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "--target", path],
                                   capture_output=True, text=True).stdout.strip()
        assert host_type != "fuse.sshfs"          # the login node holds the files itself

    def test_sftp_server_refuses_ordinary_users(self, twin):
        """The SFTP server serves as root: only root on the nodes may reach it. Root on node n1
        (in slurmd's namespaces) gets the server's SFTP answer at the address the nodes use; the
        ordinary user's job on a node, at the same address, is refused."""
        addr, port = twin_sftp_address()
        slurmd = (Path("/run/hpcstack-twin/pids/slurmd-n1").read_text().split() or ["?"])[0]
        # SSH_FXP_INIT (version 3); the server answers SSH_FXP_VERSION (type 2) with its version
        handshake = ("import socket, struct, sys\n"
                     "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
                     "s.sendall(struct.pack('>IBI', 5, 1, 3))\n"
                     "got = b''\n"
                     "while len(got) < 9:\n"
                     "    chunk = s.recv(9 - len(got))\n"
                     "    if not chunk:\n"
                     "        break\n"
                     "    got += chunk\n"
                     "print(socket.gethostname(), 'sftp-answer', *(struct.unpack('>IBI', got) if len(got) == 9 "
                     "else ('short', got.hex())))\n")
        root = subprocess.run(["nsenter", "-t", slurmd, "--net", "--uts", "--mount", "python3", "-c", handshake,
                               addr, str(port)], capture_output=True, text=True, timeout=60)
        answer = root.stdout.split()
        assert root.returncode == 0 and answer[:2] == ["n1", "sftp-answer"] and answer[3:] == ["2", "3"], \
            f"root on n1 got no SFTP answer from {addr}:{port}: {root.stdout}{root.stderr}"
        script = (f"#!/bin/bash\nif timeout 5 bash -c 'exec 3<>/dev/tcp/{addr}/{port}' 2>/dev/null; "
                  "then echo sftp-reached $(hostname); else echo sftp-refused $(hostname); fi\n")
        record, out = twin.run(f"--account={twin.account}", script=script)
        assert job_state(record) == "COMPLETED", record + out
        assert re.search(r"^sftp-refused n[12]$", out, re.M), record + out

    def test_home_on_compute_nodes_as_the_site_has_it(self, twin):
        home = Path(pwd.getpwnam(twin.user).pw_dir)
        assert home.is_dir()                     # on the login node (the host)
        script = (f"#!/bin/bash\nsrun --ntasks-per-node=1 bash -c "
                  f"'test -e {home} && echo home-present $(hostname) || echo home-absent $(hostname)'\n")
        record, out = twin.run(f"--account={twin.account}", "--nodes=2", script=script)
        assert job_state(record) == "COMPLETED", record + out
        word = "present" if twin.home_on_compute else "absent"
        assert sorted(re.findall(r"home-\w+ n\d", out)) == [f"home-{word} n1", f"home-{word} n2"], out


class TestCirrusOwnForm:
    """What only Cirrus's documentation says (beyond its twin's checks.toml)."""

    site = "cirrus"

    def test_gpu_job_with_mem_is_not_refused(self, twin):
        """--mem is not among gpu.md's rejected options (batch.md only says the memory cannot be
        chosen: it comes with the GPUs), so the twin lets it through."""
        script = "#!/bin/bash\n#SBATCH --gres=gpu:4\n#SBATCH --mem=64M\nsrun hostname\n"
        record, out = twin.run(f"--account={twin.account}", script=script)
        assert job_state(record) == "COMPLETED", record + out

    def test_gpu_job_as_documented_runs(self, twin):
        """The site's own form: GPUs and nodes to sbatch, tasks and CPUs to srun (gpu.md)."""
        script = per_task_script(twin, "--ntasks=8 --tasks-per-node=4 --cpus-per-task=10 --hint=nomultithread")
        record, out = twin.run(f"--account={twin.account}", "--qos=gpu", "--nodes=2", "--gres=gpu:4",
                               "--exclusive", script=script)
        assert job_state(record) == "COMPLETED", record + out
        assert tasks_gpus(out) == {(node, i): "0,1,2,3" for node in ("n1", "n2") for i in range(4)}, out


class TestPerlmutterOwnForm:
    """What only Perlmutter's documentation says (beyond its twin's checks.toml)."""

    site = "perlmutter"

    def test_job_without_project_runs_on_default(self, twin):
        record, out = twin.run("--constraint=gpu", script="#!/bin/bash\nhostname\n")
        assert job_state(record) == "COMPLETED", record + out
        assert f"Account={twin.account}" in record and "QOS=debug" in record, record

    @pytest.mark.parametrize("form", list(GPU_FORMS))
    def test_cuda_visible_devices_per_task(self, twin, form):
        script = per_task_script(twin, "")
        record, out = twin.run("--nodes=2", "--ntasks-per-node=4", "--exclusive", "--constraint=gpu",
                               form, script=script)
        assert job_state(record) == "COMPLETED", record + out
        expected = {(node, i): gpus for node in ("n1", "n2") for i, gpus in GPU_FORMS[form].items()}
        assert tasks_gpus(out) == expected, out

    def test_shared_software_read_only_on_compute_nodes(self, twin):
        path = twin_conf("perlmutter")["project_dir"][0]
        script = f"#!/bin/bash\nsrun touch {path}/from-compute 2>&1 | grep -o 'Read-only file system'\n"
        record, out = twin.run("--constraint=gpu", "--qos=regular", script=script)
        assert "Read-only file system" in out, record + out
        assert not Path(path, "from-compute").exists()


class TestJuwelsBoosterOwnForm:
    """What only JUWELS's documentation says (beyond its twin's checks.toml)."""

    site = "juwels-booster"

    def test_cpus_per_task_counts_hardware_threads(self, twin):
        """24 CPUs per task are 24 hardware threads (12 cores); 4 such tasks fill a 96-thread node."""
        record, _ = twin.run(f"--account={twin.account}", "--ntasks=1", "--cpus-per-task=24",
                             script="#!/bin/bash\nhostname\n")
        assert "NumCPUs=24 " in record, record
        ids = re.search(r"CPU_IDs=(\S+)", record).group(1)   # e.g. 0-23: 12 cores x 2 threads
        count = 0
        for part in ids.split(","):
            first, _, last = part.partition("-")
            count += int(last or first) - int(first) + 1
        assert count == 24, record
        record, _ = twin.run(f"--account={twin.account}", "--nodes=1", "--ntasks-per-node=4",
                             "--cpus-per-task=24", script="#!/bin/bash\nhostname\n")
        assert "NumCPUs=96 " in record, record


class SiteRefusals:
    """The refusals a twin's checks.toml lists (only the twins that list some have this test)."""

    def test_the_sites_refusals(self, twin):
        """Each job checks.toml ``[[slurm.refused]]`` lists is refused by sbatch, with the words
        the site's message holds (the site's submit rules or Slurm's own)."""
        values = {"account": twin.account}
        for case in twin_checks(self.site).get("slurm", {}).get("refused", []):
            proc = twin.sbatch(*[o.format(**values) for o in case.get("options", [])],
                               script=case.get("script", "#!/bin/bash\nhostname\n"))
            assert proc.returncode != 0, case["why"]
            for words in case["stderr"]:
                assert words in proc.stderr, (case["why"], proc.stderr)


for _site in SITES:
    _name = "Test" + "".join(part.capitalize() for part in _site.split("-")) + "Twin"
    _bases = (EveryTwin, SiteRefusals) if twin_checks(_site).get("slurm", {}).get("refused") else (EveryTwin,)
    globals()[_name] = type(_name, _bases, {"site": _site, "__doc__": f"The {_site} twin (twins/clusters/{_site})."})
del _site, _name, _bases



def test_one_twin_at_a_time_and_down_puts_localhost_back(twins, ordinary_user):
    """A second twin is refused while one is up (one line); ``down`` removes the twin's login
    setup and module trees, after which an ordinary user's login shell shows localhost's modules
    exactly as before; ``down`` of a twin that is not up succeeds and leaves the state alone. Runs
    after every twin's own tests (tests/conftest.py groups them); the manager brings localhost's
    Slurm back afterwards."""
    from twins import site_twin

    twins.use("cirrus")        # localhost's Slurm down (a twin refuses to start beside it)
    twins.down()
    profile = Path("/etc/profile.d/zz-hpcstack-twin.sh")

    def localhost_state() -> tuple[str, str]:
        proc = subprocess.run(["runuser", "-l", ordinary_user, "-c",
                               'echo "$MODULEPATH|$MODULES_CMD|${LMOD_CMD:-}|${BASH_ENV:-}"; module avail 2>&1'],
                              capture_output=True, text=True, timeout=300, cwd="/")
        return proc.stdout, proc.stderr

    assert not profile.exists()
    before = localhost_state()
    twins.use("cirrus")
    try:
        assert profile.exists()
        during = localhost_state()
        assert "/work/y07/shared/cirrus-modulefiles" in during[0] and during != before, during
        again = site_twin("up", "perlmutter", check=False)
        said = (again.stdout + again.stderr).strip().splitlines()
        assert again.returncode == 1 and len(said) == 1, said
        assert "the cirrus twin is up; run 'site-twin down' first" in said[0], said
        assert not Path("/opt/cray/pe/lmod").exists()
    finally:
        twins.down()
    assert not profile.exists()
    assert not Path("/work/y07/shared/cirrus-modulefiles/python/3.12.1-gpu").exists()
    assert localhost_state() == before
    assert site_twin("status", check=False).returncode == 3
    nothing = site_twin("down", check=False)
    assert nothing.returncode == 0
