"""Install and validate on each site twin: the site's own config (with its twin's small overlay,
twins/site-configs/<site>-twin.yaml) on a cluster of the site's shape (scripts/site-twin: Slurm
with the site's accounts, QOS and submit rules in a real slurmdbd, 4 stand-in GPUs per node, the
site's module tool and hierarchy, its shared paths over sshfs on the compute nodes).

As the site's admin (root, in a login shell of the twin): ``hpcstack install`` into the site's
own roots, then ``hpcstack validate`` (the ``cpu`` workload, 1 and 2 nodes, 4 ranks per node);
then as an ordinary user in the site's account: the stack's module in a fresh login shell after
the site's hierarchy, ``module avail``/``spider`` finding it, and a validation of their own.

The twins are data: one test class per directory of twins/clusters, made below from its
``twin.conf`` (users, GPUs per node, paths) and ``checks.toml`` (what the site's login shell
shows, the first modules loaded after its hierarchy, the site's environment after ``module load
mpi4py/4.1.2``). A new twin needs no line here (docs/admin/new-site.md).

CI's time (design.md, "Tests and time") holds one Horovod build: on the twin whose checks.toml says
``pytorch_in_ci = true`` (Perlmutter, the twin least like localhost: Lmod hierarchy, compiler
wrappers over a stand-in toolchain), ``pytorch/2.3.1-gpu`` is installed and validated; on every
twin ``mpi4py/4.1.2`` (built against the site's MPI stand-in) is, and the PyTorch stack is planned.
``HPCSTACK_TWIN_E2E=SITE[,SITE...]`` (or ``all``) adds the PyTorch install and validation on the
twins named (about 6 minutes each on 2 cores): the one documented command of
docs/admin/sites.md, "Site twins"; the run's header says which twins have it. The GPU check (each
rank a GPU of its own, from the trainer's records) exists only on the twins with PyTorch
(:class:`PytorchOnTwin`); every twin's GPU binding by Slurm is checked in tests/test_site_twins.py.

Everything the twin's ``down`` removes (its site paths with the stacks installed there) goes when
the module ends, so later tests see the real sites' roots as they were.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import HPCSTACK, REPO
from twins import SITES, gpus_per_node, pytorch_twins, twin_checks, twin_conf

pytestmark = pytest.mark.e2e

TWIN_REPO = REPO / "twins"
PYTORCH = "pytorch/2.3.1-gpu"
MPI4PY = "mpi4py/4.1.2"


#: the twins whose PyTorch stack this run installs and validates (one Horovod build each)
PYTORCH_TWINS = pytorch_twins()



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
        """What the stack's module help tells a user of this site: the profiles and the
        hierarchy (``modules.preloads``), then the stack's module root."""
        lines = [f"module load {' '.join(site.modules.preloads)} || exit 7"] if site.modules.preloads else []
        return "\n".join([*lines, f"module use {shlex.quote(site.module_root)}"])

    def work(self, conf, user: str) -> Path:
        """The user's working directory on the twin's file system the compute nodes share."""
        return Path(conf["user_work"][0]) / user

    #: what the twin's login shell must show (scripts/twin-modules: the site's module tool, its
    #: default MODULEPATH and names, its paths): a script for an ordinary user's login shell
    #: and the lines or words its output holds
    LOGIN_SCRIPT: str = ""
    LOGIN_SHOWS: tuple[str, ...] = ()
    LOGIN_HIDES: tuple[str, ...] = ()
    #: what the output after ``module load mpi4py/4.1.2`` holds on this site (its own environment)
    MPI4PY_ENV_SHOWS: tuple[str, ...] = ()
    #: $LOADEDMODULES after the hierarchy and ``module load mpi4py/4.1.2``: its first and last entries
    LOADED_FIRST: tuple[str, ...] = ()

    # ------------------------------------------------------------------ the site's login shell
    def test_login_shell_has_the_sites_module_tool_names_and_paths(self, on):
        twin, conf, site = on
        shell = login(conf["user"][0], self.LOGIN_SCRIPT)
        for shown in self.LOGIN_SHOWS:
            assert shown in shell.stdout, (shown, tail(shell))
        for hidden in self.LOGIN_HIDES:
            assert hidden not in shell.stdout, (hidden, tail(shell))

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

    def test_admin_validates_on_one_and_two_nodes_four_ranks_each(self, on):
        """The site's validation of the twin's main stack (PyTorch where it is installed, else
        mpi4py) passes on 1 and 2 nodes with the site's 4 ranks per node; the report is kept for
        the GPU check of the PyTorch twins."""
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
        per_node = gpus_per_node(self.site)
        assert {r["nodes"] for r in runs} == {1, 2} and all(r["ranks"] == per_node * r["nodes"] for r in runs)
        for job in report["jobs"]:
            assert job["state"] == "COMPLETED", job
        job2 = next(j for j in report["jobs"] if j["nodes"] == 2)
        assert job2["nodelist"] == "n[1-2]"      # the first two of the twin's nodes
        REPORTS[self.site] = report

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

    def test_user_loads_mpi4py_after_the_sites_hierarchy_with_its_mpi(self, on):
        """mpi4py/4.1.2, built against the site's MPI stand-in, loads after what the stack's
        module help says (the hierarchy) in the order the site's tool gives, and ``module
        avail``/``spider`` find it."""
        twin, conf, site = on
        proc = login(conf["user"][0], f"{self.user_setup(site)}\nmodule load {MPI4PY} || exit 9\n"
                     "python -c 'import mpi4py, mpi4py.MPI; print(\"MPI4PY\", mpi4py.__file__, "
                     "mpi4py.MPI.Get_library_version()[:8])'\n"
                     "echo LOADED=$LOADEDMODULES\necho CUDA=${CRAY_CUDATOOLKIT_VERSION:-}\n"
                     "echo MPITYPE=${SLURM_MPI_TYPE:-}\n")
        assert proc.returncode == 0, tail(proc)
        assert f"MPI4PY {site.install_root}/mpi4py/" in proc.stdout and "Open MPI" in proc.stdout, tail(proc)
        loaded = proc.stdout.split("LOADED=", 1)[1].splitlines()[0].split(":")
        assert loaded[:len(self.LOADED_FIRST)] == list(self.LOADED_FIRST) and loaded[-1] == MPI4PY, loaded
        self.check_mpi4py_env(proc.stdout)

    def check_mpi4py_env(self, out: str) -> None:
        """The site's own environment after ``module load mpi4py/4.1.2`` (checks.toml's
        ``mpi4py_env_shows``)."""
        for shown in self.MPI4PY_ENV_SHOWS:
            assert shown in out, (shown, out)

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
            proc = login(user, self.hpc("validate", PYTORCH, "--nodes", "1", "--backend", "horovod",
                                        "--workload", "cpu", "--output-dir", str(out), "--json"))
            assert proc.returncode == 0, tail(proc)
            assert json.loads(proc.stdout)["ok"] is True


#: each twin's validation report as the admin's test got it (for :class:`PytorchOnTwin`)
REPORTS: dict[str, dict] = {}


class PytorchOnTwin:
    """The checks that need the PyTorch stack on the twin (the trainer records each rank's GPU):
    only the classes of :data:`PYTORCH_TWINS` have them, so no other twin passes them with
    nothing checked."""

    def test_every_rank_trains_on_a_gpu_of_its_own(self, on):
        """Slurm's own ``CUDA_VISIBLE_DEVICES`` (``Gres=gpu:4``) as the trainer recorded it in the
        admin's validation: on each node every rank a GPU of its own, on the nodes of the job."""
        report = REPORTS.get(self.site)
        assert report is not None, "the admin's validation on this twin did not pass (test above)"
        for run in report["runs"]:
            assert len(run["gpus"]) == run["ranks"], run["gpus"]
            seen = {(g["host"], g["physical_gpu"]) for g in run["gpus"]}
            assert len(seen) == run["ranks"], run["gpus"]          # no two ranks of a node share one
            assert {h for h, _ in seen} == ({"n1"} if run["nodes"] == 1 else {"n1", "n2"}), run["gpus"]
            assert all(g["cuda_visible_devices"] for g in run["gpus"]), run["gpus"]


    def test_a_scheduled_smoke_run_fires_on_the_twins_slurm(self, on):
        """``hpcstack schedule install`` as the twin's admin, with the smoke tier's cron line at
        the next minute (``revalidation.schedule`` in an overlay of the twin's site config): the
        twin's slurmctld fires root's entry (``ScronParameters=enable``), whose job submits the
        smoke tier as the site's jobs (its QOS, account, constraint) and the collector that
        records it; the run is OK in the twin's history and ``hpcstack status``. Removed after:
        root's scrontab holds no hpcstack entry."""
        import datetime as dt
        import os
        import sqlite3
        import tempfile
        import time

        import yaml

        twin, conf, site = on
        name = f"{self.site}-twin"
        repo = Path(tempfile.mkdtemp(prefix="hpcstack-twin-cron-", dir="/var/tmp"))
        os.chmod(repo, 0o755)
        data = yaml.safe_load((TWIN_REPO / "site-configs" / f"{name}.yaml").read_text())
        now = dt.datetime.now().astimezone()
        slot = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        if (slot - now).total_seconds() < 10:
            slot += dt.timedelta(minutes=1)
        never = f"0 0 1 {(now.month + 5) % 12 + 1} *"
        # the history where root on a compute node can write it and no group can change it (not
        # the 2775 project directory, which Perlmutter's nodes see read-only): a host directory
        # the twin's nodes see as it is (revalidation.state_dir)
        state = Path("/var/lib/hpcstack-twin-state") / name
        shutil.rmtree(state, ignore_errors=True)
        # daily at the slot, not on the slot's day of month (test_revalidation.cron: Slurm
        # 22.05 puts a day of month a year ahead when submitted on the 29th to the 31st)
        data["revalidation"] = {"schedule": {"smoke": f"{slot.minute} {slot.hour} * * *",
                                             "full": never, "probe": never},
                                "state_dir": str(state)}
        (repo / "site-configs").mkdir(mode=0o755)
        (repo / "site-configs" / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        repos = ["--site", name, "--repo", str(repo), "--repo", str(TWIN_REPO)]
        history = state / "history" / f"{name}.sqlite"

        def rows():
            if not history.exists():
                return []
            with sqlite3.connect(f"file:{history}?mode=ro", uri=True) as conn:
                return conn.execute("SELECT id, tier, state FROM runs WHERE stack = ? ORDER BY id",
                                    (PYTORCH,)).fetchall()

        first = max((r[0] for r in rows()), default=0) + 1
        try:
            proc = login("root", shlex.join([*HPCSTACK, "schedule", "install", PYTORCH, *repos]))
            assert proc.returncode == 0, tail(proc)
            # the collector on a compute node records the run, then writes the status file of
            # `module load` into the state directory (the nodes see the module root read-only)
            status_file = state / "status" / f"{name}.json"
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and not (
                    [r for r in rows() if r[0] >= first and r[1] == "smoke"] and status_file.exists()):
                time.sleep(3)
            ran = [r for r in rows() if r[0] >= first and r[1] == "smoke"]
            logs = sorted((state / "schedule" / "logs").glob("*.out"))
            assert [r[2] for r in ran] == ["OK"], (ran, [p.read_text()[-1500:] for p in logs[-3:]])
            said = "".join(p.read_text() for p in logs)
            assert status_file.exists() and "status file" not in said, said[-3000:]
            assert json.loads(status_file.read_text())["stacks"] == {}
            proc = login("root", shlex.join([*HPCSTACK, "status", *repos, "--json"]))
            assert proc.returncode == 0, tail(proc)
            verdicts = {(r["stack"], r["tier"]): r["verdict"] for r in json.loads(proc.stdout)["stacks"]}
            assert verdicts[(PYTORCH, "smoke")] == "OK", verdicts
        finally:
            login("root", shlex.join([*HPCSTACK, "schedule", "remove", *repos]))
            shutil.rmtree(repo, ignore_errors=True)
            shutil.rmtree(state, ignore_errors=True)
        tab = subprocess.run(["scrontab", "-l"], capture_output=True, text=True)
        assert "# hpcstack schedule:" not in tab.stdout


def _bases(site: str) -> tuple[type, ...]:
    """A twin class's bases: pytest collects a class hierarchy's tests in reverse MRO, so
    :class:`PytorchOnTwin` goes first here for its test to run after :class:`TwinE2E`'s."""
    return (PytorchOnTwin, TwinE2E) if site in PYTORCH_TWINS else (TwinE2E,)


def _twin_class(site: str) -> type:
    """The test class of twin ``site``: :class:`TwinE2E` (and :class:`PytorchOnTwin` where this
    run has its PyTorch stack) with the site's checks.toml: ``login_script``, ``login_shows``,
    ``login_hides``, ``loaded_first``, ``mpi4py_env_shows``."""
    checks = twin_checks(site)
    attrs = {"site": site,
             "LOGIN_SCRIPT": checks.get("login_script", "module avail 2>&1"),
             "LOGIN_SHOWS": tuple(checks.get("login_shows", ())),
             "LOGIN_HIDES": tuple(checks.get("login_hides", ())),
             "LOADED_FIRST": tuple(checks.get("loaded_first", ())),
             "MPI4PY_ENV_SHOWS": tuple(checks.get("mpi4py_env_shows", ())),
             "__doc__": f"The {site} twin (twins/clusters/{site})."}
    name = "Test" + "".join(part.capitalize() for part in site.replace("_", "-").split("-")) + "Twin"
    return type(name, _bases(site), attrs)


for _site in SITES:
    _cls = _twin_class(_site)
    globals()[_cls.__name__] = _cls
del _site, _cls
