"""The site twins (scripts/site-twin) as the tests use them: each twin's config, the script,
and one manager for the whole test run (the ``twins`` fixture of tests/conftest.py), so that each
twin comes up once per run whatever file its tests are in (tests/conftest.py groups them by site).

The sites are the directories of twins/clusters/: a new twin is data there, not a line here.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import tomllib
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TWIN_SCRIPT = REPO / "scripts" / "site-twin"
TWINS = REPO / "twins" / "clusters"
#: every twin, in the order of its directory name
SITES = tuple(sorted(p.name for p in TWINS.iterdir() if (p / "twin.conf").is_file()))
#: what a twin's `up` needs besides localhost-slurm's binaries (scripts/site-twin install)
BINARIES = ("munged", "slurmctld", "slurmd", "slurmdbd", "mariadbd", "sacctmgr", "sbatch", "squeue",
            "scontrol", "sshfs", "iptables", "findmnt", "nsenter", "unshare")
#: a job's state is final once squeue no longer lists it; this long is a hang, not a slow job
JOB_DEADLINE_S = 180


def twin_conf(site: str, twins: Path = TWINS) -> dict[str, list[str]]:
    """twins/clusters/SITE/twin.conf as {key: [values]} (the format scripts/site-twin reads);
    ``twins``: the clusters directory of another tree."""
    conf: dict[str, list[str]] = {}
    for line in (twins / site / "twin.conf").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            key, _, value = line.partition("=")
            conf.setdefault(key.strip(), []).append(value.strip())
    return conf


def gpus_per_node(site: str, twins: Path = TWINS) -> int:
    """The twin's GPUs per node: twin.conf's ``gpus_per_node`` (scripts/site-twin's default 4)."""
    return int(twin_conf(site, twins).get("gpus_per_node", ["4"])[0])


def twin_checks(site: str) -> dict:
    """twins/clusters/SITE/checks.toml: what the twin's tests check beyond every twin's (the keys
    are read by :func:`_twin_class`); an empty table where the twin has none."""
    path = TWINS / site / "checks.toml"
    return tomllib.loads(path.read_text()) if path.is_file() else {}


def pytorch_twins() -> tuple[str, ...]:
    """The twins whose PyTorch stack this run installs and validates: those whose checks.toml
    says ``pytorch_in_ci = true``, and those ``HPCSTACK_TWIN_E2E`` names (``all``, or a comma list)."""
    asked = os.environ.get("HPCSTACK_TWIN_E2E", "")
    named = set(SITES) if asked == "all" else {s.strip() for s in asked.split(",") if s.strip()}
    unknown = named - set(SITES)
    if unknown:
        raise ValueError(f"HPCSTACK_TWIN_E2E: no twin {sorted(unknown)[0]!r} (twins: {', '.join(SITES)})")
    return tuple(s for s in SITES if s in named or twin_checks(s).get("pytorch_in_ci"))


def site_twin(*args: str, check: bool = True, script: Path = TWIN_SCRIPT) -> subprocess.CompletedProcess:
    """Run ``scripts/site-twin ARGS`` (``script``: another checkout's, e.g. a copy with a
    throw-away twin); with ``check``, fail the test on a non-zero exit."""
    proc = subprocess.run([str(script), *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode:
        raise AssertionError(f"site-twin {' '.join(args)}: {proc.returncode}\n{proc.stderr}")
    return proc


class Twins:
    """One twin up at a time for the whole test run: :meth:`use` brings SITE's up (taking
    another twin down first, and localhost's Slurm down before the first); :meth:`close` takes
    the twin down and puts localhost's Slurm back as it found it (up with its node count, or
    down). tests/conftest.py runs the tests of one twin one after the other and closes the
    manager after the last test that needs a twin, so each twin comes up once per run."""

    def __init__(self, localhost_slurm) -> None:
        self.current: str | None = None
        self.localhost_slurm = localhost_slurm
        self.open = False
        self.restore: str | None = None   # localhost's node count to bring back, or None
        self.script: Path = TWIN_SCRIPT    # the site-twin script of the twin that is up

    def use(self, site: str, script: Path = TWIN_SCRIPT) -> "Twin":
        """Return SITE's twin, up (brought up, or kept up from the test before); ``script``: the
        site-twin script of another tree (a copy of the checkout with a throw-away twin)."""
        if not self.open:
            status = self.localhost_slurm("status", check=False)
            nodes = re.match(r"nodes: (\d)", status.stdout) if status.returncode == 0 else None
            if status.returncode != 0 and "partly running" in status.stderr:
                self.localhost_slurm("down")   # left over: its processes are gone; down is what it was
            self.restore = nodes.group(1) if nodes else None
            if nodes:
                self.localhost_slurm("down")
            self.open = True
        if self.current != site or self.script != script:
            if self.current is not None:
                self.down()
            site_twin("up", site, script=script)
            self.current, self.script = site, script
        return Twin(site, script.parents[1] / "twins" / "clusters")

    def down(self) -> None:
        """Take the twin that is up down (localhost's Slurm stays down until :meth:`close`)."""
        site_twin("down", script=self.script)
        self.current, self.script = None, TWIN_SCRIPT

    def close(self) -> None:
        """Take the twin down, remove the job directories its users own, bring localhost's
        Slurm back as it was; nothing when no twin was used."""
        if not self.open:
            return
        self.open = False
        self.current = None
        site_twin("down", check=False, script=self.script)
        self.script = TWIN_SCRIPT
        for path in Path("/tmp").glob("twin-*-*"):
            if path.is_dir() and path.owner() != "root":
                shutil.rmtree(path, ignore_errors=True)
        if self.restore:
            self.localhost_slurm("up", "--nodes", self.restore)


class Twin:
    """A twin that is up: its config, its ordinary user and a job directory that user owns under
    /tmp (which the nodes share with the login node)."""

    def __init__(self, site: str, twins: Path = TWINS) -> None:
        self.site = site
        conf = twin_conf(site, twins)
        self.user = conf["user"][0]
        self.account = conf["account"][0]
        self.shared = [entry.split() for entry in conf["shared"]]
        self.home_on_compute = conf["home_on_compute"][0] == "yes"
        self.dir = Path(tempfile.mkdtemp(prefix=f"twin-{site}-", dir="/tmp"))
        pw = pwd.getpwnam(self.user)
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.dir.chmod(0o755)

    def sbatch(self, *options: str, script: str) -> subprocess.CompletedProcess:
        """``sbatch --parsable OPTIONS job.sh`` as the twin's user, from its job directory."""
        path = self.dir / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        path.chmod(0o755)
        return subprocess.run(["runuser", "-u", self.user, "--", "sbatch", "--parsable",
                               f"--chdir={self.dir}", f"--output={self.dir}/%j.out", *options, str(path)],
                              capture_output=True, text=True, timeout=60)

    def run(self, *options: str, script: str) -> tuple[str, str]:
        """Submit, wait for the job to leave the queue, and return (its scontrol record, its
        output). Fails the test when the submission is refused."""
        proc = self.sbatch(*options, script=script)
        assert proc.returncode == 0, f"sbatch {' '.join(options)} refused: {proc.stderr}"
        job = proc.stdout.strip().split(";")[0]
        deadline = time.monotonic() + JOB_DEADLINE_S
        while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
            assert time.monotonic() < deadline, f"job {job} still queued after {JOB_DEADLINE_S} s"
            time.sleep(0.2)
        record = subprocess.run(["scontrol", "-d", "show", "job", job], capture_output=True, text=True).stdout
        out = self.dir / f"{job}.out"
        return record, out.read_text() if out.exists() else ""
