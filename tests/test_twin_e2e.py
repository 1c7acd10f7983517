"""Install and validate on each site twin: the site's own config (with its twin's small overlay,
twins/site-configs/<site>-twin.yaml) on a cluster of the site's shape (scripts/site-twin: Slurm
with the site's accounts, QOS and submit rules in a real slurmdbd, 4 stand-in GPUs per node, the
site's module tool and hierarchy, its shared paths over sshfs on the compute nodes).

As the site's admin (root, in a login shell of the twin): ``hpcstack install`` into the site's
own roots, then ``hpcstack validate`` (the ``cpu`` workload, 1 and 2 nodes, 4 ranks per node);
then as an ordinary user in the site's account: the stack's module in a fresh login shell after
the site's hierarchy, ``module avail``/``spider`` finding it, and a validation of their own.

CI's time (design.md, "Tests and time") holds one Horovod build per twin only for Cirrus, the
seed's site: there ``pytorch/2.3.1-gpu`` is installed and validated; on every twin ``mpi4py/4.1.2``
(built against the site's MPI stand-in) is, and the PyTorch stack is planned. ``HPCSTACK_TWIN_E2E=all``
adds the PyTorch install and validation on perlmutter and juwels-booster (about 12 minutes more on
2 cores; the closing figures of docs/admin/sites.md, "Site twins", were taken so).

Everything the twin's ``down`` removes (its site paths with the stacks installed there) goes when
the module ends, so later tests see the real sites' roots as they were.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO
from test_site_twins import twin_conf, twins  # noqa: F401  (the module's fixture: one twin up at a time)

pytestmark = pytest.mark.e2e

TWIN_REPO = REPO / "twins"
PYTORCH = "pytorch/2.3.1-gpu"
MPI4PY = "mpi4py/4.1.2"
#: the twins whose PyTorch stack CI installs and validates (one Horovod build each)
PYTORCH_TWINS = ("cirrus",) if os.environ.get("HPCSTACK_TWIN_E2E") != "all" else ("cirrus", "perlmutter", "juwels-booster")


def login(user: str, script: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``script`` in a fresh login shell of ``user`` on the twin's login node (this host). Root's
    keeps this process's environment (the network's certificates for uv); a user's is fresh."""
    argv = ["bash", "-l", "-c", script] if user == "root" else ["runuser", "-l", user, "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")


def tail(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"


class TwinE2E:
    """The steps on one twin, in order (pytest runs a class's tests in file order)."""

    site: str = ""

    @pytest.fixture
    def on(self, twins):  # noqa: F811
        twin = twins.use(self.site)
        conf = twin_conf(self.site)
        from hpcstack.site import load_site

        site = load_site(str(TWIN_REPO / "site-configs" / f"{self.site}-twin.yaml"))
        return twin, conf, site

    def hpc(self, *args: str) -> str:
        return shlex.join([*HPCSTACK, *args, "--site", f"{self.site}-twin", "--repo", str(TWIN_REPO)])

    def user_setup(self, site) -> str:
        """What the stack's module help tells a user of this site: the hierarchy, then the
        stack's module root."""
        lines = [f"module load {' '.join(site.modules.hierarchy)} || exit 7"] if site.modules.hierarchy else []
        return "\n".join([*lines, f"module use {shlex.quote(site.module_root)}"])

    def work(self, conf, user: str) -> Path:
        """The user's working directory on the twin's file system the compute nodes share."""
        return Path(conf["user_work"][0]) / user

    # ------------------------------------------------------------------ as the site's admin
    def test_admin_installs_the_stacks_into_the_sites_roots(self, on):
        twin, conf, site = on
        recipes = [MPI4PY] + ([PYTORCH] if self.site in PYTORCH_TWINS else [])
        for recipe in recipes:
            proc = login("root", self.hpc("install", recipe))
            assert proc.returncode == 0, tail(proc)
            modulefile = Path(site.module_root) / (recipe + (".lua" if site.modules.syntax == "lua" else ""))
            assert modulefile.is_file(), tail(proc)
        if self.site not in PYTORCH_TWINS:
            plan = login("root", self.hpc("install", PYTORCH, "--dry-run"), timeout=600)
            assert plan.returncode == 0, tail(plan)
            assert "horovod" in plan.stdout

    def test_admin_validates_on_one_and_two_nodes_with_every_rank_on_a_gpu_of_its_own(self, on):
        twin, conf, site = on
        out = Path(conf["user_work"][0]) / "root-validate"
        out.mkdir(mode=0o755, exist_ok=True)
        recipe = PYTORCH if self.site in PYTORCH_TWINS else MPI4PY
        proc = login("root", self.hpc("validate", recipe, "--nodes", "1,2", "--workload", "cpu",
                                      "--output-dir", str(out / "v"), "--json"))
        assert proc.returncode == 0, tail(proc)
        report = json.loads(proc.stdout)
        assert report["ok"] is True and report["failures"] == [], tail(proc)
        assert report["system"] == f"{self.site}-twin:{site.slurm['partition']}"
        runs = report["runs"]
        assert {r["nodes"] for r in runs} == {1, 2} and all(r["ranks"] == 4 * r["nodes"] for r in runs)
        for job in report["jobs"]:
            assert job["state"] == "COMPLETED", job
        if recipe == PYTORCH:
            # Slurm's own CUDA_VISIBLE_DEVICES (Gres=gpu:4): each rank of a node its own GPU
            for run in runs:
                seen = {(g["host"], g["physical_gpu"]) for g in run["gpus"]}
                assert len(seen) == run["ranks"], run["gpus"]          # no two ranks of a node share one
                assert {h for h, _ in seen} == ({"n1"} if run["nodes"] == 1 else {"n1", "n2"}), run["gpus"]
                assert all(g["cuda_visible_devices"] for g in run["gpus"]), run["gpus"]
            job2 = next(j for j in report["jobs"] if j["nodes"] == 2)
            assert job2["nodelist"] == "n[1-2]"

    def test_a_wrong_budget_is_one_line_before_anything_is_submitted(self, on):
        twin, conf, site = on
        out = self.work(conf, conf["user"][0]) / "refused"
        proc = login(conf["user"][0], self.hpc("validate", MPI4PY, "--nodes", "1", "--account", "nosuchbudget",
                                               "--output-dir", str(out)))
        assert proc.returncode != 0
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "--account" in errors[0] and "nosuchbudget" in errors[0], proc.stderr
        assert "sbatch:" not in proc.stderr and not out.exists()

    # ------------------------------------------------------------------ as an ordinary user
    def test_user_loads_the_stacks_in_a_fresh_login_shell_and_the_tools_find_them(self, on):
        twin, conf, site = on
        user = conf["user"][0]
        recipe = PYTORCH if self.site in PYTORCH_TWINS else MPI4PY
        check = ("python -c 'import torch, horovod.torch as h; print(\"LOADED\", torch.__version__, h.__file__)'"
                 if recipe == PYTORCH else
                 "python -c 'import mpi4py.MPI as M; print(\"LOADED\", M.Get_library_version()[:8])'")
        spider = "module spider" if site.modules.tool == "lmod" else "module avail"
        proc = login(user, f"{self.user_setup(site)}\nmodule load {recipe} || exit 9\n{check}\n"
                           f"{spider} {recipe.split('/')[0]} 2>&1\n")
        assert proc.returncode == 0, tail(proc)
        assert "LOADED" in proc.stdout and recipe in proc.stdout, tail(proc)
        if recipe == PYTORCH:
            assert f"{site.install_root}/pytorch/" in proc.stdout, proc.stdout

    def test_user_validates_in_the_sites_account(self, on):
        twin, conf, site = on
        user = conf["user"][0]
        out = self.work(conf, user) / "v"
        proc = login(user, self.hpc("validate", MPI4PY, "--nodes", "1,2", "--output-dir", str(out), "--json"))
        assert proc.returncode == 0, tail(proc)
        report = json.loads(proc.stdout)
        assert report["ok"] is True, tail(proc)
        assert all(job["state"] == "COMPLETED" for job in report["jobs"])
        if self.site in PYTORCH_TWINS:
            out = self.work(conf, user) / "vt"
            proc = login(user, self.hpc("validate", PYTORCH, "--nodes", "2", "--backend", "horovod",
                                        "--workload", "cpu", "--output-dir", str(out), "--json"))
            assert proc.returncode == 0, tail(proc)
            assert json.loads(proc.stdout)["ok"] is True


class TestCirrusTwin(TwinE2E):
    site = "cirrus"


class TestPerlmutterTwin(TwinE2E):
    site = "perlmutter"


class TestJuwelsBoosterTwin(TwinE2E):
    site = "juwels-booster"
