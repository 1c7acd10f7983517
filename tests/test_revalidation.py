"""Stacks that stay validated, for real, on the localhost Slurm with the README's installed
``pytorch/2.3.1-gpu`` (docs/admin/status.md).

One documented command turns continuous validation on, ``hpcstack schedule install``: real
scrontab entries (Slurm's own cron, ``ScronParameters=enable`` in scripts/localhost-slurm), fired
by slurmctld at their cron slots. The site is ``localhost`` as the test command installs it, with
an overlay (``--repo``, kept in the entries) that sets the tiers' cron lines to slots one and two
minutes ahead (``revalidation.schedule``), runs the jobs as root (no ``submit_as``: the history is
root's), adds ``NCCL_IB_DISABLE=1`` to the jobs' environment (a module that sets it is the change
the probe must see) and widens the DEGRADED margins past what the suite's other lane does to a
2-core machine (``revalidation.degraded``). In order:

1. **a missed slot**: the partition is down through the smoke tier's first slot; once its second
   slot has come, ``hpcstack status`` records the first as NOT-RUN, on the page too;
2. **a smoke run, a probe and the full run it starts**: the partition comes up, the pending
   smoke job and the probe start; the probe's fingerprint differs from the install's
   (``net.env``: ``NCCL_IB_DISABLE=1``), so the same job runs the full tier at once: each passes
   its checks; smoke reads OK, the probe and the full tier OK (or DEGRADED by a Mann-Whitney shift
   alone, where the other lane loaded the 2 cores against the install's idle baseline);
3. **an injected slowdown**: the slurmd of both nodes (so every job step they start) in a CPU
   control group throttled to a quarter of a CPU; the smoke tier, started by hand, passes its
   sanity checks and reads DEGRADED, with ``cpu.quota`` in what changed;
4. **a broken environment**: ``GLOO_SOCKET_IFNAME`` naming an interface the nodes do not have;
   a run by hand FAILS, with the variable in what changed;
5. **the page**: ``hpcstack status --html`` opened in headless Chromium: every plot decoded, no
   console error, and the table read with JavaScript off;
6. ``hpcstack schedule remove`` leaves no hpcstack entry in root's scrontab.

The waits are for cron's clock (a slot comes when it comes) and for the runs the history records;
none is a guess at how long something takes. Afterwards the rows this test recorded are deleted,
the status file is written again from the history, and the partition, the control group and
root's scrontab are as before.
"""

from __future__ import annotations

import datetime as dt
import html as htmlmod
import json
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from conftest import STACK_RECIPE, hpcstack, two_node_cluster

pytestmark = pytest.mark.e2e

#: the site's state directory: its install root's .hpcstack
STATE = Path("/opt/hpcstack/software/.hpcstack")
HISTORY = STATE / "history" / "localhost.sqlite"
PARTITION = "debug"
CGROUP_NAME = "hpcstack-test-slow"
#: a quarter of a CPU: 25 ms of every 100 ms period
QUOTA_US, PERIOD_US = 25_000, 100_000
#: the longest the test waits for the runs it expects (the cron jobs start within seconds of a
#: slot: bf_interval=5; a smoke takes about 20 s, the full tier about 40 s on 2 cores)
RUNS_TIMEOUT = 600


def run(*argv: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, cwd="/")
    if check:
        assert proc.returncode == 0, f"{' '.join(argv)}: {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return proc


def scrontab_text() -> str:
    proc = run("scrontab", "-l", check=False)
    return proc.stdout if proc.returncode == 0 else ""


def overlay(repo: Path, schedule: dict, env: dict | None = None) -> None:
    """``repo/site-configs/localhost.yaml``: the installed localhost site with the test's
    revalidation section, root's jobs and ``env`` in the jobs' environment."""
    from hpcstack import data_root

    data = yaml.safe_load((data_root() / "site-configs" / "localhost.yaml").read_text())
    data["slurm"].pop("submit_as", None)
    data["slurm"].setdefault("env", {}).update({"NCCL_IB_DISABLE": "1", **(env or {})})
    data["revalidation"] = {"schedule": schedule,
                            "degraded": {"throughput_drop": 0.6, "startup_rise": 3.0}}
    path = repo / "site-configs" / "localhost.yaml"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def cron(*slots: dt.datetime) -> str:
    """The daily cron line of these slots (one hour, one day): ``M1,M2 H * * *``. Not ``M H D
    MON *``: Slurm 22.05's scrontab computes the next day of a restricted day of month wrongly
    from the 29th to the 31st (``_next_day_of_month`` in src/common/cron.c counts the 29th, 30th
    and 31st from today), and puts ``24 0 30 11 *`` submitted at 00:23 on 30 November a year
    ahead. The entries are removed before the next day's slots."""
    assert len({(s.hour, s.day, s.month) for s in slots}) == 1, slots
    return f"{','.join(str(s.minute) for s in slots)} {slots[0].hour} * * *"


def rows_after(first: int) -> list[dict]:
    """The history's rows of the stack from id ``first`` on (read-only)."""
    with sqlite3.connect(f"file:{HISTORY}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute(
            "SELECT id, tier, state, reason, started, fingerprint FROM runs WHERE id >= ? AND stack = ? "
            "ORDER BY id", (first, STACK_RECIPE))]


def status(repo: Path, *extra: str) -> dict:
    proc = hpcstack("status", "--site", "localhost", "--repo", str(repo), "--json", *extra)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {(r["stack"], r["tier"]): r for r in json.loads(proc.stdout)["stacks"]}


def wait_until(when: dt.datetime) -> None:
    """Sleep until the wall clock is past ``when`` (a cron slot: the clock is what is awaited)."""
    while (left := (when - dt.datetime.now().astimezone()).total_seconds()) > 0:
        time.sleep(min(left, 5) + 0.2)


def wait_for_rows(first: int, done, what: str) -> list[dict]:
    """Poll the history until ``done(rows)``; fail with the rows and the cron jobs' logs."""
    deadline = time.monotonic() + RUNS_TIMEOUT
    while time.monotonic() < deadline:
        rows = rows_after(first)
        if done(rows):
            return rows
        time.sleep(3)
    logs = STATE / "schedule" / "logs"
    tails = {p.name: p.read_text()[-1500:] for p in sorted(logs.glob("*"))[-4:]} if logs.is_dir() else {}
    raise AssertionError(f"{what}: not recorded in {RUNS_TIMEOUT} s; rows {rows_after(first)}; "
                         f"squeue {run('squeue', check=False).stdout}; logs {tails}")


def slurmd_pids() -> list[int]:
    return [int(p) for p in run("pgrep", "-x", "slurmd", check=False).stdout.split()]


class Throttle:
    """The localhost nodes' slurmd (and so every job they start) in a CPU control group of a
    quarter of a CPU; cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us``). Undone on exit."""

    def __init__(self):
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.exists() and "cpu" in v2.read_text().split():
            self.root, self.v2 = Path("/sys/fs/cgroup"), True
        else:
            self.root = next((p for p in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))
                              if (p / "cpu.cfs_quota_us").exists()), None)
            self.v2 = False
        if self.root is None:
            pytest.fail("no CPU controller of cgroup v1 or v2 under /sys/fs/cgroup")
        self.group = self.root / CGROUP_NAME

    def __enter__(self):
        self.group.mkdir(exist_ok=True)
        if self.v2:
            (self.group / "cpu.max").write_text(f"{QUOTA_US} {PERIOD_US}")
        else:
            (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.group / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        for pid in slurmd_pids():
            (self.group / "cgroup.procs").write_text(str(pid))
        return self

    def __exit__(self, *exc):
        if not self.group.exists():
            return
        for pid in (self.group / "cgroup.procs").read_text().split():
            try:
                (self.root / "cgroup.procs").write_text(pid)
            except OSError:
                pass
        for _ in range(50):
            try:
                self.group.rmdir()
                return
            except OSError:
                time.sleep(0.2)


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("chromium missing (scripts/localhost-setup --with-test-tools installs it)")


def browse(page: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0",
           "--allow-file-access-from-files", "--virtual-time-budget=10000", *args, "--dump-dom", page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp)})


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory):
    """Root, the 2-node local cluster, scrontab, the overlay's directory; everything put back."""
    if os.geteuid() != 0:
        pytest.skip("the schedule, the history and the partition are root's")
    if shutil.which("scrontab") is None:
        pytest.skip("scrontab missing (scripts/localhost-slurm install builds it)")
    with two_node_cluster():
        repo = Path(tempfile.mkdtemp(prefix="hpcstack-reval-", dir="/var/tmp"))
        os.chmod(repo, 0o755)
        before_tab = scrontab_text()
        assert "# hpcstack schedule:" not in before_tab, "root's scrontab holds hpcstack entries already"
        first = 1
        if HISTORY.exists():     # the README's main command validated as root: its install run
            with sqlite3.connect(f"file:{HISTORY}?mode=ro", uri=True) as conn:
                first = (conn.execute("SELECT MAX(id) FROM runs").fetchone()[0] or 0) + 1
        try:
            yield repo, first
        finally:
            run("scontrol", "update", f"PartitionName={PARTITION}", "State=UP", check=False)
            hpcstack("schedule", "remove", "--site", "localhost", "--repo", str(repo))
            if before_tab.strip():
                Path(repo / "tab").write_text(before_tab)
                run("scrontab", str(repo / "tab"), check=False)
            else:
                run("scrontab", "-r", check=False)
            for job in run("squeue", "-h", "-o", "%i %j", check=False).stdout.splitlines():
                if "hpcstack" in job:
                    run("scancel", job.split()[0], check=False)
            if HISTORY.exists():
                with sqlite3.connect(HISTORY) as conn:
                    conn.execute("DELETE FROM runs WHERE id >= ?", (first,))
            hpcstack("status", "--site", "localhost")    # the status file from the history as it was
            shutil.rmtree(repo, ignore_errors=True)


def test_scheduled_smoke_probe_full_missed_slot_slowdown_and_broken_environment(scheduled, tmp_path):
    repo, first = scheduled
    # slot 0 at least 10 s ahead, slot 1 a minute later, in the same hour
    now = dt.datetime.now().astimezone()
    slot0 = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    if (slot0 - now).total_seconds() < 10 or slot0.minute == 59:
        slot0 += dt.timedelta(minutes=2 if slot0.minute == 58 else 1)
    slot1 = slot0 + dt.timedelta(minutes=1)
    never = f"0 0 1 {(now.month + 5) % 12 + 1} *"
    overlay(repo, {"smoke": cron(slot0, slot1), "probe": cron(slot1), "full": never})

    # 1. the one command, with the partition down through slot 0
    run("scontrol", "update", f"PartitionName={PARTITION}", "State=DOWN")
    proc = hpcstack("schedule", "install", "--site", "localhost", "--repo", str(repo), STACK_RECIPE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tab = scrontab_text()
    markers = re.findall(r"^# hpcstack schedule: site localhost, stack (\S+), tier (\w+)$", tab, re.M)
    assert sorted(markers) == [(STACK_RECIPE, t) for t in ("full", "probe", "smoke")], tab
    assert f"--repo {repo}" in tab and "-I -m hpcstack validate" in tab, tab
    assert cron(slot0, slot1) in tab, tab
    wait_until(slot1 + dt.timedelta(seconds=2))
    verdicts = status(repo)
    smoke = verdicts[(STACK_RECIPE, "smoke")]
    assert smoke["verdict"] == "NOT-RUN" and any("slot missed" in r for r in smoke["reasons"]), smoke
    missed = [r for r in rows_after(first) if r["tier"] == "smoke"]
    assert [r["state"] for r in missed] == ["NOT-RUN"], missed
    assert missed[0]["started"] == slot0.astimezone(dt.timezone.utc).isoformat(timespec="seconds"), missed
    early = tmp_path / "early"
    status(repo, "--html", str(early))      # the missed slot on the page too
    assert re.search(r'<td>smoke</td>\s*<td class="NOT-RUN">NOT-RUN</td>', (early / "localhost.html").read_text())

    # 2. the partition up: the pending smoke job and the probe start; the probe sees NCCL_IB_DISABLE
    run("scontrol", "update", f"PartitionName={PARTITION}", "State=UP")
    rows = wait_for_rows(first, lambda rs: {"smoke", "probe", "full"} <= {r["tier"] for r in rs if r["state"] != "NOT-RUN"},
                         "a smoke run, a probe and the full run it starts")
    ran = {r["tier"]: r for r in rows if r["state"] != "NOT-RUN"}
    assert all(ran[t]["state"] == "OK" for t in ("smoke", "probe", "full")), ran
    assert ran["full"]["started"] > ran["probe"]["started"], ran
    assert "NCCL_IB_DISABLE=1" in json.loads(ran["probe"]["fingerprint"])["net.env"], ran["probe"]
    verdicts = status(repo)
    # each passed its sanity checks and references (OK in the history, above); the full tier is
    # judged against the install's baseline, which the README's command measured alone on the
    # machine, and here the other lane may be training on the same 2 cores (a fresh CI run read
    # ddp on 1 node 72 % slower): a shift measured then reads DEGRADED, with the test's numbers
    # as its only reasons, never FAILED or NOT-RUN
    for tier in ("smoke", "probe", "full"):
        v = verdicts[(STACK_RECIPE, tier)]
        assert v["verdict"] in ("OK", "DEGRADED"), v
        assert v["verdict"] == "OK" or all("Mann-Whitney" in r for r in v["reasons"]), v
    assert verdicts[(STACK_RECIPE, "smoke")]["verdict"] == "OK", verdicts   # its own first run: the baseline
    scheduled = {t: verdicts[(STACK_RECIPE, t)]["verdict"] for t in ("probe", "full")}

    # 3. a CPU-limited node: DEGRADED, and what changed
    with Throttle():
        proc = hpcstack("validate", STACK_RECIPE, "--site", "localhost", "--repo", str(repo), "--tier", "smoke",
                        timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    smoke = status(repo)[(STACK_RECIPE, "smoke")]
    assert smoke["verdict"] == "DEGRADED", smoke
    assert any(line.startswith(("added cpu.quota: 0.25 CPUs", "changed cpu.quota:")) and CGROUP_NAME in line
               for line in smoke["changed"]), smoke
    assert any("throughput" in r and "Mann-Whitney" in r for r in smoke["reasons"]), smoke

    # 4. a broken environment: FAILED, and what changed
    overlay(repo, {"smoke": never, "probe": never, "full": never}, {"GLOO_SOCKET_IFNAME": "hpcstack-gone0"})
    proc = hpcstack("validate", STACK_RECIPE, "--site", "localhost", "--repo", str(repo), "--tier", "manual",
                    "--nodes", "1", "--workload", "smoke", timeout=900)
    assert proc.returncode != 0 and "Unable to find address for: hpcstack-gone0" in proc.stdout + proc.stderr, \
        proc.stdout[-3000:]
    manual = status(repo)[(STACK_RECIPE, "manual")]
    assert manual["verdict"] == "FAILED", manual
    assert any("GLOO_SOCKET_IFNAME=hpcstack-gone0" in line for line in manual["changed"]), manual

    # 5. the page, in a real browser
    page_dir = tmp_path / "page"
    status(repo, "--html", str(page_dir))
    page = page_dir / "localhost.html"
    assert json.loads((page_dir / "localhost.json").read_text())["site"] == "localhost"
    html = page.read_text()
    images = re.findall(r'<img src="([^"]+)"', html)
    assert len(images) >= 2 and all((page_dir / src).is_file() for src in images), images
    assert "<script" not in html.lower()                  # readable without JavaScript
    # the page in a sandboxed frame without scripts (as a browser with JavaScript off shows it);
    # the harness around it reads the frame's table and waits for every image to decode
    harness = tmp_path / "harness.html"
    harness.write_text(
        '<!doctype html><body><iframe id=f sandbox="allow-same-origin" src="' + page.as_uri() + '"></iframe>'
        "<script>\n"
        "const f = document.getElementById('f');\n"
        "f.onload = () => {\n"
        "  const doc = f.contentDocument, imgs = [...doc.images];\n"
        "  const check = () => { if (imgs.every(i => i.complete)) {\n"
        "    document.body.dataset.rows = JSON.stringify([...doc.querySelectorAll('tbody tr')].map(\n"
        "      tr => [...tr.cells].map(td => td.textContent.trim())));\n"
        "    document.body.dataset.images = imgs.length;\n"
        "    document.body.dataset.decoded = imgs.filter(i => i.naturalWidth > 0).length; }\n"
        "    else setTimeout(check, 100); };\n"
        "  check(); };\n</script></body>\n")
    proc = browse(harness, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'data-images="{len(images)}" data-decoded="{len(images)}"' in proc.stdout, proc.stdout[-2000:]
    rows = json.loads(htmlmod.unescape(re.search(r'data-rows="([^"]*)"', proc.stdout).group(1)))
    shown = {(r[1], r[2]) for r in rows if len(r) > 2 and r[0] == STACK_RECIPE}
    assert {("smoke", "DEGRADED"), ("manual", "FAILED")} | {(t, v) for t, v in scheduled.items()} <= shown, rows
    console = [line for line in proc.stderr.splitlines()
               if "CONSOLE" in line or "Uncaught" in line or "Failed to load resource" in line]
    assert console == [], console

    # 6. the schedule removed
    proc = hpcstack("schedule", "remove", "--site", "localhost", "--repo", str(repo), STACK_RECIPE)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "# hpcstack schedule:" not in scrontab_text()
