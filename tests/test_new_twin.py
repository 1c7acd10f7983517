"""A new site and its twin from data alone, as docs/admin/new-site.md says (sections 1 and 4).

In a copy of the checkout's ``scripts/`` (no line of them names a site), a throw-away site is
added the way the page walks a new admin through it: ``site-configs/throwaway.yaml`` (started
from the shipped config closest to it, here Cirrus's, with an Lmod module tree of its own),
its overlay ``twins/site-configs/throwaway-twin.yaml``, and ``twins/clusters/throwaway/`` with
``twin.conf`` (2 nodes of 2 GPUs, a home base, two project directories, a login-only path, a
default partition, a login module), ``slurm.conf``, ``accounting.txt``, ``modules.toml`` and
``checks.toml``. Then, as the page says: ``scripts/twin-modules show``, ``scripts/site-twin up``,
and the checks every twin gets: Slurm's partitions and GPUs as twin.conf says, each rank a GPU of
its own, the login shell with the site's module tool and login module, the homes at the home base,
the login-only path absent on the nodes, and hpcstack's plan for the site (``--repo . --repo
twins`` of the copy). The twin goes down with the twins' manager (tests/twins.py).
"""

from __future__ import annotations

import pwd
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import HPCSTACK, REPO

pytestmark = pytest.mark.integration

SITE = "throwaway"


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the checkout's scripts with the throw-away site and twin added as data."""
    root = tmp_path_factory.mktemp("new-twin")
    root.chmod(0o755)
    shutil.copytree(REPO / "scripts", root / "scripts", symlinks=True)
    # 1. the site config, from the shipped config closest to the machine (new-site.md, section 1)
    site = yaml.safe_load((REPO / "site-configs" / "cirrus.yaml").read_text())
    site.update(name=SITE, description="A throw-away site: 2 GPUs per node, Lmod",
                install_root="/throwaway/proj/PROJECT/sw", module_root="/throwaway/proj/PROJECT/modules",
                cache_dir="/throwaway/proj/PROJECT/cache")
    site["modules"] = {"tool": "lmod", "syntax": "lua",
                       "init": {"bash": "/usr/share/lmod/lmod/init/bash", "sh": "/usr/share/lmod/lmod/init/sh"},
                       "use": [], "base": "python/3.11", "build": [], "runtime": ["openmpi/4.1"]}
    site["python"] = {"version": "3.11"}
    site["slurm"].update(partition="gpu", qos=None, gpus_per_node=2, tasks_per_node=2, cpus_per_task=4,
                         srun_options=[], login_only_paths=["/throwaway/login"])
    site["launcher"]["ranks"] = 2
    site.pop("container", None)
    write(root / "site-configs" / f"{SITE}.yaml", yaml.safe_dump(site, sort_keys=False))
    # 4. the twin: its overlay, then its cluster's data
    write(root / "twins" / "site-configs" / f"{SITE}-twin.yaml", yaml.safe_dump({
        "extends": SITE, "name": f"{SITE}-twin", "description": "the throw-away site's twin",
        # the site's PROJECT placeholder, replaced by the twin's project
        "install_root": "/throwaway/proj/twinproj/sw", "module_root": "/throwaway/proj/twinproj/modules",
        # the machine's cache
        "cache_dir": "/var/cache/hpcstack",
        # no GPU and no CUDA here
        "build": {"env": {"CUDA_PATH": None}}, "toolchain": {"cuda": None, "nccl": None},
        # the twin's budget; one thread per rank on this machine's cores
        "slurm": {"account": "twinproj", "cpus_per_task": 1, "env": {"OMPI_MCA_mpi_yield_when_idle": "1"}},
    }, sort_keys=False))
    data = root / "twins" / "clusters" / SITE
    write(data / "twin.conf", """# the throw-away twin (tests/test_new_twin.py)
cluster = throwaway
admin_user = twinadmin
admin_group = twinadmins
user = twinuser
account = twinproj
nodes = 2
gpus_per_node = 2
home_base = /throwaway/home
home_on_compute = yes
shared = /throwaway/proj rw
project_dir = /throwaway/proj/twinproj
project_dir = /throwaway/proj/fast
login_only = /throwaway/login
user_work = /throwaway/proj/work
default_partition = gpu
login_modules = openmpi/4.1
""")
    write(data / "slurm.conf", """NodeName=DEFAULT Sockets=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=64000 Feature=gpu
JobSubmitPlugins=lua
PartitionName=debug Nodes=@NODES@ Default=YES MaxTime=00:30:00 State=UP
PartitionName=gpu Nodes=@NODES@ MaxTime=1-00:00:00 State=UP
""")
    write(data / "accounting.txt", """add account ${ACCOUNT} Cluster=${CLUSTER} Description=twin Organization=twin
add user root Account=${ACCOUNT} Cluster=${CLUSTER}
add user ${ADMIN_USER} Account=${ACCOUNT} Cluster=${CLUSTER}
add user ${USER_NAME} Account=${ACCOUNT} Cluster=${CLUSTER}
""")
    write(data / "job_submit.lua", """function slurm_job_submit(job_desc, part_list, submit_uid)
   if job_desc.account == nil or job_desc.account == "" then
      slurm.log_user("throwaway: name a budget: --account=<budget>")
      return slurm.ESLURM_INVALID_ACCOUNT
   end
   return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end
return slurm.SUCCESS
""")
    write(data / "modules.toml", """tool = "lmod"
roots = ["/throwaway/sw"]
modulepath = ["{mods}"]

[vars]
mods = "/throwaway/sw/modules"

[[module]]
dir = "{mods}"
name = "openmpi/4.1"
whatis = "Open MPI (stand-in)"
family = "mpi"
bin = { dir = "/throwaway/sw/openmpi/4.1", tools = "@mpi" }

[[module]]
dir = "{mods}"
name = "python/3.11"
whatis = "Python 3.11 (stand-in)"
default = true
depends_on = ["openmpi/4.1"]
bin = { dir = "/throwaway/sw/python/3.11", tools = "@python" }
""")
    write(data / "checks.toml", """login_script = 'echo "LOADED=$LOADEDMODULES"; module -t avail 2>&1'
login_shows = ["LOADED=openmpi/4.1", "python/3.11"]

[slurm]
job_options = ["--account={account}"]
gpu_job_options = ["--gres=gpu:{gpus}", "--exclusive"]
""")
    for path in root.rglob("*"):
        path.chmod(path.stat().st_mode | 0o055 if path.is_dir() else path.stat().st_mode | 0o044)
    return root


def test_the_twin_modules_show_what_up_would_write(tree):
    proc = subprocess.run([str(tree / "scripts" / "twin-modules"), "show", SITE], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "file /throwaway/sw/modules/openmpi/4.1.lua" in proc.stdout
    assert "file /throwaway/sw/modules/python/.modulerc.lua" in proc.stdout
    assert "link /throwaway/sw/python/3.11/bin/python3 -> /usr/bin/python3.11" in proc.stdout
    assert "login modules: openmpi/4.1" in proc.stdout


def test_the_twin_comes_up_as_its_data_says(tree, twins):
    twin = twins.use(SITE, script=tree / "scripts" / "site-twin")
    sinfo = subprocess.run(["sinfo", "-h", "-o", "%P %D %G"], capture_output=True, text=True, check=True).stdout
    # twin.conf's default partition is the only default, and 2 nodes with 2 GPUs each
    assert sorted(sinfo.split("\n")[:2]) == ["debug 2 gpu:2", "gpu* 2 gpu:2"], sinfo
    # the login-only path: made on the login node, its files hidden on the nodes (an empty file system)
    Path("/throwaway/login/marker").write_text("on the login node\n")
    # each rank a GPU of its own, as every twin proves
    task = twin.dir / "task.sh"
    task.write_text('#!/bin/bash\necho "task $(hostname) $SLURM_LOCALID ${CUDA_VISIBLE_DEVICES-unset}"\n'
                    'test -e /throwaway/login/marker && echo login-only-seen || echo login-only-absent\n')
    task.chmod(0o755)
    record, out = twin.run("--account=twinproj", "--nodes=2", "--gres=gpu:2", "--exclusive",
                           script=f"#!/bin/bash\nsrun --ntasks-per-node=2 --gpus-per-task=1 {task}\n")
    assert "JobState=COMPLETED" in record, record + out
    assert sorted(re.findall(r"^task (n\d) (\d) (\S+)$", out, re.M)) == [
        ("n1", "0", "0"), ("n1", "1", "1"), ("n2", "0", "0"), ("n2", "1", "1")], out
    assert "login-only-seen" not in out and out.count("login-only-absent") == 4, out
    # the home base and both project directories
    assert pwd.getpwnam("twinuser").pw_dir == "/throwaway/home/twinuser"
    for path in ("/throwaway/proj/twinproj", "/throwaway/proj/fast"):
        st = Path(path).stat()
        assert st.st_mode & 0o2775 == 0o2775, path
    # the login shell: Lmod, the login module, the site's names
    shell = subprocess.run(["runuser", "-l", "twinuser", "-c",
                            'echo "LOADED=$LOADEDMODULES"; module -t avail 2>&1; type module | head -1'],
                           capture_output=True, text=True, timeout=120)
    assert "LOADED=openmpi/4.1" in shell.stdout and "python/3.11" in shell.stdout, shell.stdout + shell.stderr
    # hpcstack plans the site's stack on its twin from the copy's repositories
    plan = subprocess.run(["bash", "-l", "-c", " ".join([*HPCSTACK, "install", "mpi4py/4.1.2", "--site", f"{SITE}-twin",
                                                        "--repo", str(tree), "--repo", str(tree / "twins"),
                                                        "--dry-run"])],
                          capture_output=True, text=True, timeout=600, cwd="/")
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    assert "openmpi/4.1" in plan.stdout and "/throwaway/proj/twinproj/sw/mpi4py" in plan.stdout, plan.stdout[-3000:]
