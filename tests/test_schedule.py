"""Re-validation on a schedule (hpcstack/validate/schedule.py), the status file and the load line
(statusfile.py, the modulefile templates), and the site's revalidation actions (actions.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
from types import SimpleNamespace

import pytest

from hpcstack.errors import ConfigError
from hpcstack.modules.writer import ModuleContext, render_modulefile, root_variable
from hpcstack.site import SCHEMA
from hpcstack.site_keys import KEYS
from hpcstack.validate import actions, history, schedule, statusfile
from hpcstack.validate.verdict import StackVerdict

from moduletools import tool_params, require

UTC = dt.timezone.utc
FOREIGN = "# my own job\n#SCRON --partition=debug\n*/10 * * * * /home/alice/check.sh\n"
SLURM = {"partition": "gpu", "qos": "short", "account": "z04", "output_root": "/work/z04/val"}


def tiers(**over):
    spec = SimpleNamespace(tiers=over, names=lambda: ["smoke"])
    return schedule.tiers_of(spec)


def entries(stack="pytorch/2.3.1-gpu", site="cirrus"):
    return [schedule.Entry(site, stack, t) for t in tiers().values()]


@pytest.mark.unit
def test_the_state_dir_holds_the_history_and_the_schedule(tmp_path):
    from hpcstack.validate import history as hist

    site = SimpleNamespace(name="perlmutter", install_root="/global/common/software/m1/hpcstack", raw={})
    assert hist.history_path(site) == "/global/common/software/m1/hpcstack/.hpcstack/history/perlmutter.sqlite"
    site.raw = {"revalidation": {"state_dir": "/global/cfs/cdirs/m1/hpcstack-state"}}
    assert hist.history_path(site) == "/global/cfs/cdirs/m1/hpcstack-state/history/perlmutter.sqlite"
    assert schedule.state_path(site) == "/global/cfs/cdirs/m1/hpcstack-state/schedule/perlmutter.json"
    assert schedule.log_dir_path(site) == "/global/cfs/cdirs/m1/hpcstack-state/schedule/logs"


@pytest.mark.unit
def test_the_status_file_goes_to_the_state_dir_where_the_site_names_one(tmp_path):
    """module load reads the status file the scheduled runs write from the compute nodes: beside
    the modulefiles, else (revalidation.state_dir) in the state directory, which the nodes can
    write where they see the module root read-only."""
    site = SimpleNamespace(name="perlmutter", module_root="/global/common/software/m1/modulefiles",
                           install_root="/global/common/software/m1/hpcstack", raw={})
    assert statusfile.status_file_path(site) == "/global/common/software/m1/modulefiles/.hpcstack-status.json"
    site.raw = {"revalidation": {"state_dir": "/global/cfs/cdirs/m1/hpcstack-state"}}
    assert statusfile.status_file_path(site) == "/global/cfs/cdirs/m1/hpcstack-state/status/perlmutter.json"
    if os.geteuid() != 0:
        return
    state = tmp_path / "state"
    site = SimpleNamespace(name="testsite", module_root=str(tmp_path / "not-there"),
                           install_root=str(tmp_path / "sw"), raw={"revalidation": {"state_dir": str(state)}})
    assert statusfile.write_status_file(site, []) == str(state / "status" / "testsite.json")
    assert json.loads((state / "status" / "testsite.json").read_text())["stacks"] == {}
    assert oct((state / "status").stat().st_mode & 0o777) == "0o755"
    assert oct((state / "status" / "testsite.json").stat().st_mode & 0o777) == "0o644"
    site.raw = {}                                   # in the module root: only where there is one
    assert statusfile.write_status_file(site, []) is None and not (tmp_path / "not-there").exists()
    # a module root's file that modulefiles written before state_dir was set read: kept up to date
    legacy = tmp_path / "modulefiles" / ".hpcstack-status.json"
    legacy.parent.mkdir()
    legacy.write_text("{}")
    site = SimpleNamespace(name="testsite", module_root=str(legacy.parent), install_root=str(tmp_path / "sw"),
                           raw={"revalidation": {"state_dir": str(state)}})
    assert statusfile.write_status_file(site, []) == str(state / "status" / "testsite.json")
    assert json.loads(legacy.read_text())["stacks"] == {}


@pytest.mark.unit
def test_the_sites_schedule_sets_the_cron_lines_over_the_recipes():
    spec = SimpleNamespace(tiers={"smoke": {"schedule": "0 1 * * *"}, "full": {"nodes": [2]}}, names=lambda: ["smoke"])
    site = SimpleNamespace(raw={"revalidation": {"schedule": {"smoke": "5 2 * * *", "probe": "0 * * * *"}}})
    tiers = schedule.tiers_of(spec, site)
    assert (tiers["smoke"].schedule, tiers["smoke"].workload) == ("5 2 * * *", "smoke")
    assert (tiers["probe"].schedule, tiers["full"].schedule, tiers["full"].nodes) == \
        ("0 * * * *", schedule.DEFAULT_SCHEDULES["full"], (2,))
    assert schedule.tiers_of(spec)["smoke"].schedule == "0 1 * * *"


@pytest.mark.unit
def test_default_tiers_and_recipe_overrides():
    t = tiers()
    assert (t["smoke"].schedule, t["full"].schedule, t["probe"].schedule) == ("0 3 * * *", "0 4 * * 0", "30 */6 * * *")
    assert t["smoke"].nodes == (1,) and t["smoke"].workload == "smoke"
    assert t["full"].nodes == () and t["full"].workload is None
    t = tiers(full={"schedule": "0 2 * * 6", "nodes": [2, 4]})
    assert t["full"] == schedule.Tier("full", "0 2 * * 6", (2, 4), None)


@pytest.mark.unit
def test_scrontab_text_exact():
    logs = "/sw/.hpcstack/schedule/logs"
    text = schedule.entries_text(entries()[:1], ["/opt/hpcstack/bin/python", "-I", "-m", "hpcstack"], SLURM,
                                 log_dir=logs)
    assert text.splitlines() == [
        "# hpcstack schedule: site cirrus, stack pytorch/2.3.1-gpu, tier smoke",
        "#SCRON --job-name=hpcstack-smoke-pytorch-2.3.1-gpu",
        "#SCRON --time=00:30:00",
        "#SCRON --partition=gpu",
        "#SCRON --qos=short",
        "#SCRON --account=z04",
        f"#SCRON --chdir={logs}",
        f"#SCRON --output={logs}/hpcstack-smoke-pytorch-2.3.1-gpu-%j.out",
        "0 3 * * * /opt/hpcstack/bin/python -I -m hpcstack validate pytorch/2.3.1-gpu --site cirrus --tier smoke "
        "--then-collect",
    ]


@pytest.mark.unit
def test_entries_never_write_into_output_root():
    """H1: slurm.output_root may be world-writable (/tmp): a link planted at the job's predictable
    %j name would be followed by slurmstepd; without a log directory: --chdir=/, --output=/dev/null."""
    text = schedule.entries_text(entries(), ["hpcstack"], SLURM)
    assert SLURM["output_root"] not in text
    assert text.count("#SCRON --chdir=/\n") == 3 and text.count("#SCRON --output=/dev/null\n") == 3


@pytest.mark.unit
def test_entry_command_is_isolated():
    """M1: python -m puts the working directory on sys.path: -I keeps it (and PYTHON*) out."""
    import sys

    assert schedule.hpcstack_command() == [sys.executable, "-I", "-m", "hpcstack"]


def schedule_site(tmp_path, slurm=None):
    return SimpleNamespace(name="cirrus", install_root=str(tmp_path / "sw"), slurm=slurm or {"partition": "gpu"})


@pytest.mark.unit
def test_log_dir_made_through_the_gate(tmp_path):
    import os
    import stat

    site = schedule_site(tmp_path)
    (tmp_path / "sw").mkdir(mode=0o755)
    old = os.umask(0o002)
    try:
        path = schedule.make_log_dir(site)
    finally:
        os.umask(old)
    assert path == str(tmp_path / "sw" / ".hpcstack" / "schedule" / "logs")
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o755 and st.st_uid == os.geteuid()
    assert schedule.make_log_dir(site) == path                         # found made
    os.chmod(path, 0o777)
    with pytest.raises(ConfigError):
        schedule.make_log_dir(site)


@pytest.mark.integration
def test_log_dir_of_another_account_refused(tmp_path):
    """Needs root (chown): a logs directory another account owns is refused, never used."""
    import os

    if os.geteuid() != 0:
        pytest.skip("needs root")
    site = schedule_site(tmp_path)
    (tmp_path / "sw").mkdir(mode=0o755)
    path = schedule.make_log_dir(site)
    os.chown(path, 65534, 65534)
    with pytest.raises(Exception) as exc:
        schedule.make_log_dir(site)
    assert "65534" in str(exc.value) or "nobody" in str(exc.value)


@pytest.mark.unit
def test_a_submit_as_site_schedules_in_roots_table(tmp_path, capsys, monkeypatch):
    """The table is root's also where slurm.submit_as is set: each run is hpcstack validate as
    root (recorded in root's history), which submits the jobs as that account."""
    site = schedule_site(tmp_path, {"partition": "gpu", "submit_as": "hpcval"})
    from hpcstack.validate import settings

    (tmp_path / "sw").mkdir(mode=0o755)
    monkeypatch.setattr(schedule, "published_stacks", lambda s: ["pytorch/2.3.1-gpu"])
    monkeypatch.setattr(settings, "validation_settings", lambda site, recipe: SimpleNamespace(spec=None))

    class Session:
        policy = None

        def __init__(self, site):
            self.site = site

        def load_recipe(self, name, site):
            return SimpleNamespace(full_name=name, ref=None)

    class Tab:
        def read(self):
            return ""

    args = SimpleNamespace(action="install", stacks=[], dry_run=True)
    assert schedule.cmd_schedule(args, Session(site), tab=Tab()) == 0
    out = capsys.readouterr().out
    assert out.count("# hpcstack schedule: site") == 3 and "-u hpcval" not in out, out
    assert schedule.Scrontab()._argv("-l") == ["scrontab", "-l"]


@pytest.mark.unit
def test_remove_stack_without_scrontab(tmp_path):
    """L5: scrontab not installed: an HpcstackError (uninstall's one warning line), state kept."""
    from hpcstack.errors import HpcstackError

    site = schedule_site(tmp_path)
    (tmp_path / "sw").mkdir(mode=0o755)
    schedule.write_state(site, {"pytorch/2.3.1-gpu": {"smoke": {"schedule": "0 3 * * *"}}})

    def missing(argv, **kw):
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    with pytest.raises(HpcstackError, match="scrontab"):
        schedule.remove_stack(site, "pytorch/2.3.1-gpu", schedule.Scrontab(None, missing))
    assert "pytorch/2.3.1-gpu" in schedule.read_state(site)


@pytest.mark.unit
def test_install_keeps_foreign_lines_and_replaces_its_own():
    cmd = ["hpcstack"]
    once = schedule.install_entries(FOREIGN, entries(), cmd, SLURM)
    assert once.startswith(FOREIGN)
    assert [e[1:3] for e in schedule.listed_entries(once)] == [("pytorch/2.3.1-gpu", t) for t in ("smoke", "full", "probe")]
    assert schedule.install_entries(once, entries(), cmd, SLURM) == once       # idempotent
    both = schedule.install_entries(once, entries("mpi4py/4.1.2"), cmd, SLURM)
    assert len(schedule.listed_entries(both)) == 6 and both.startswith(FOREIGN)
    other_site = schedule.install_entries(both, entries(site="archer2"), cmd, SLURM)
    assert len(schedule.listed_entries(other_site, "cirrus")) == 6


@pytest.mark.unit
def test_remove_keeps_foreign_lines():
    cmd = ["hpcstack"]
    text = schedule.install_entries(FOREIGN, entries() + entries("mpi4py/4.1.2"), cmd, SLURM) + "# after\n"
    one = schedule.remove_entries(text, "cirrus", ["pytorch/2.3.1-gpu"])
    assert {e[1] for e in schedule.listed_entries(one)} == {"mpi4py/4.1.2"}
    assert one.startswith(FOREIGN) and one.endswith("# after\n")
    assert schedule.remove_entries(text, "cirrus") == FOREIGN + "# after\n"
    assert schedule.remove_entries(schedule.entries_text(entries(), cmd), "cirrus") == ""
    assert schedule.remove_entries(FOREIGN, "cirrus") == FOREIGN


@pytest.mark.unit
def test_scrontab_commands():
    calls = []

    def run(argv, **kw):
        calls.append((argv, kw.get("input")))
        assert kw.get("cwd") == "/"                    # CHILD_CWD, never the caller's directory
        if argv[-1] == "-l":
            return subprocess.CompletedProcess(argv, 1, "", "no crontab for hpcval\n")
        return subprocess.CompletedProcess(argv, 0, "", "")

    tab = schedule.Scrontab("hpcval", run)
    assert tab.read() == ""
    tab.write("0 3 * * * true\n")
    tab.write("")
    assert calls == [(["scrontab", "-u", "hpcval", "-l"], None),
                     (["scrontab", "-u", "hpcval", "/dev/stdin"], "0 3 * * * true\n"),
                     (["scrontab", "-u", "hpcval", "-r"], None)]


@pytest.mark.unit
@pytest.mark.parametrize("spec", ["0 3 * *", "61 * * * *", "@daily", "0 3 * * mon", "5-1 * * * *"])
def test_bad_cron_refused(spec):
    with pytest.raises(ConfigError):
        schedule.parse_cron(spec)


@pytest.mark.unit
def test_cron_slots():
    got = schedule.slots("0 4 * * 0", dt.datetime(2026, 3, 1, tzinfo=UTC), dt.datetime(2026, 3, 16, tzinfo=UTC))
    assert [s.date().isoformat() for s in got] == ["2026-03-01", "2026-03-08", "2026-03-15"]   # Sundays
    got = schedule.slots("0 0 1 * 1", dt.datetime(2026, 3, 1, tzinfo=UTC), dt.datetime(2026, 3, 10, tzinfo=UTC))
    assert [s.day for s in got] == [2, 9]    # 1st of the month OR Monday (Mar 1 00:00 is the start, excluded)


@pytest.mark.unit
def test_missed_slots_from_times():
    now = dt.datetime(2026, 3, 5, 3, 30, tzinfo=UTC)
    ran = ["2026-03-01T03:00:05+00:00", "2026-03-02T03:40:00+00:00", "2026-03-04T03:01:00+00:00"]
    missed = schedule.missed_slots("0 3 * * *", ran, now)
    assert [m.isoformat() for m in missed] == []    # after the last run (Mar 4) only Mar 5's slot, still open
    missed = schedule.missed_slots("0 3 * * *", ran[:2], now)
    assert [m.isoformat() for m in missed] == ["2026-03-03T03:00:00+00:00", "2026-03-04T03:00:00+00:00"]
    assert schedule.missed_slots("0 3 * * *", ran, now + dt.timedelta(days=1))[-1].day == 5
    # no run recorded: from the schedule's installation; nothing without it
    since = dt.datetime(2026, 3, 3, 12, tzinfo=UTC)
    assert [m.day for m in schedule.missed_slots("0 3 * * *", [], now, since)] == [4]
    assert schedule.missed_slots("0 3 * * *", [], now) == []
    # a run from before the schedule was installed: the slots start at the installation
    assert [m.day for m in schedule.missed_slots("0 3 * * *", ["2026-02-20T03:00:00+00:00"], now, since)] == [4]
    # a late run in its slot's window covers it
    assert schedule.missed_slots("0 */6 * * *", ["2026-03-05T00:00:00+00:00", "2026-03-05T11:59:00+00:00"],
                                 dt.datetime(2026, 3, 5, 17, 59, tzinfo=UTC)) == []


@pytest.mark.unit
def test_record_missed_is_not_run(tmp_path):
    conn = sqlite3.connect(tmp_path / "h.sqlite")
    conn.executescript(history.SCHEMA)
    history.record_report(conn, "pytorch/2.3.1-gpu", "pytorch/2.3.1-gpu", "smoke", {"ok": True},
                          started="2026-03-01T03:00:00+00:00")
    now = dt.datetime(2026, 3, 4, 3, 10, tzinfo=UTC)
    got = schedule.record_missed(conn, "pytorch/2.3.1-gpu", "pytorch/2.3.1-gpu", "smoke", "0 3 * * *", now)
    assert got == ["2026-03-02T03:00:00+00:00", "2026-03-03T03:00:00+00:00"]
    rows = history.runs(conn, "pytorch/2.3.1-gpu", "smoke")
    assert [(r.state, r.reason) for r in rows[1:]] == [("NOT-RUN", "slot missed (0 3 * * *)")] * 2
    assert schedule.record_missed(conn, "pytorch/2.3.1-gpu", "pytorch/2.3.1-gpu", "smoke", "0 3 * * *", now) == []


def run(i, tier, state="OK", **fp):
    return history.Run(i, "pytorch/2.3.1-gpu", "r", tier, f"2026-03-0{i}T00:00:00+00:00", None, state, "",
                       fp, {}, {})


@pytest.mark.unit
def test_probe_decision():
    base = run(1, "full", **{"gpu.driver": "535.104", "nodes": "r1i0n1"})
    same = run(2, "probe", **{"gpu.driver": "535.104", "nodes": "r1i0n7"})
    assert schedule.probe_decision([base, same], same) == (False, [])
    moved = run(3, "probe", **{"gpu.driver": "550.54", "nodes": "r1i0n1"})
    assert schedule.probe_decision([base, same, moved], moved) == (True, ["changed gpu.driver: 535.104 -> 550.54"])
    # compared with the last OK run at scale (install or full); a failed probe runs the full tier too
    assert schedule.probe_decision([moved], moved)[0] is True
    smoke = run(5, "smoke", **{"gpu.driver": "550.54", "nodes": "r1i0n2"})
    assert schedule.probe_decision([base, smoke, moved], moved) == \
        (True, ["changed gpu.driver: 535.104 -> 550.54"])     # a smoke run in between re-validates nothing at scale
    assert schedule.probe_decision([base, run(4, "probe", "FAILED")], run(4, "probe", "FAILED"))[0] is True


def verdict(tier, v, since=None, stack="pytorch/2.3.1-gpu"):
    return StackVerdict(stack, tier, v, since=since)


@pytest.mark.unit
def test_status_file_text():
    lines = statusfile.stack_lines([verdict("smoke", "DEGRADED", "2026-11-20T03:00:00+00:00"),
                                    verdict("full", "FAILED", "2026-11-29T04:00:00+00:00"),
                                    verdict("smoke", "OK", stack="mpi4py/4.1.2"),
                                    verdict("full", "NOT-RUN", stack="jax/0.10.2-cpu")])
    assert lines == {"pytorch/2.3.1-gpu": "FAILED since 2026-11-29"}
    text = statusfile.render(lines, "2026-11-30T00:00:00+00:00")
    assert json.loads(text)["stacks"] == lines
    assert '\n"pytorch/2.3.1-gpu": "FAILED since 2026-11-29"\n' in text
    assert json.loads(statusfile.render({}, "x")) == {"generated": "x", "stacks": {}}


def module_context(status_file: str) -> ModuleContext:
    return ModuleContext(name="pytorch", version="2.3.1-gpu", whatis="PyTorch", help_lines=["h"],
                         prefix="/sw/pytorch/2.3.1-gpu", root_variable=root_variable("pytorch"), depends_on=[],
                         path_prepend=[], pythonpath_prepend=[], status_file=status_file)


@pytest.mark.unit
@pytest.mark.parametrize("syntax,line", [
    ("tcl", 'if {[module-info mode load] && [string index {/m/.hpcstack-status.json} 0] eq "/"\n'
            '        && [file isfile {/m/.hpcstack-status.json}]\n'
            '        && ![catch {open {/m/.hpcstack-status.json} {RDONLY NONBLOCK}} hpcstack_sf]} {'),
    ("lua", 'local fh = io.open("/m/.hpcstack-status.json", "r")')])
def test_modulefile_status_lines(syntax, line):
    text = render_modulefile(module_context("/m/.hpcstack-status.json"), syntax)
    assert line in text and "(hpcstack status for details)" in text
    assert "hpcstack-status" not in render_modulefile(module_context(""), syntax)


@pytest.mark.unit
def test_lua_status_read_only_from_a_regular_file():
    """L3: io.open of a FIFO blocks every load: the file's type is checked (lfs.attributes follows
    links; Lmod's isFile does not) before io.open, inside the pcall."""
    text = render_modulefile(module_context("/m/.hpcstack-status.json"), "lua")
    check = 'if lfs.attributes("/m/.hpcstack-status.json", "mode") ~= "file" then return nil end'
    assert check in text and text.index(check) < text.index('io.open("/m/.hpcstack-status.json"')


@pytest.mark.unit
def test_tcl_status_line_quotes_the_name():
    """L3: the stack's name and version are one quoted Tcl word, never substituted ([cmd], $var)."""
    import shutil

    ctx = module_context("/m/.hpcstack-status.json")
    ctx = ModuleContext(**{**ctx.__dict__, "version": "2.3.1-gpu[exec touch /tmp/pwned]$env(HOME)"})
    text = render_modulefile(ctx, "tcl")
    assert "set hpcstack_line {pytorch/2.3.1-gpu[exec touch /tmp/pwned]$env(HOME): }" in text
    assert "puts stderr $hpcstack_line" in text and '"pytorch/2.3.1-gpu[' not in text
    if shutil.which("tclsh"):
        block = text[text.index("if {[module-info mode load] && [string index {/m/.hpcstack-status.json} 0]"):]
        block = block[:block.index("\n}\n") + 3]
        needle = '"pytorch/2.3.1-gpu[exec touch /tmp/pwned]$env(HOME)": "'
        script = ("proc module-info {args} {return 1}\n"
                  f"set hpcstack_sf [file tempfile hpcstack_path]\nputs $hpcstack_sf {{\n{needle}FAILED since x\"}}\n"
                  "seek $hpcstack_sf 0\n" + block.replace("![catch {open {/m/.hpcstack-status.json} {RDONLY NONBLOCK}} "
                                                           "hpcstack_sf]", "1")
                                               .replace("[file isfile {/m/.hpcstack-status.json}]", "1"))
        p = subprocess.run(["tclsh"], input=script, capture_output=True, text=True, cwd="/")
        assert p.stderr == "pytorch/2.3.1-gpu[exec touch /tmp/pwned]$env(HOME): FAILED since x (hpcstack status for details)\n"


@pytest.mark.integration
@pytest.mark.parametrize("tool", tool_params())
def test_module_load_prints_the_status_line(tool, tmp_path):
    """Needs the real `module` command (Environment Modules, Lmod): integration."""
    require(tool)
    root = tmp_path / "modules"
    (root / "pytorch").mkdir(parents=True)
    status = root / ".hpcstack-status.json"
    name = "2.3.1-gpu" + (".lua" if tool.syntax == "lua" else "")
    (root / "pytorch" / name).write_text(render_modulefile(module_context(str(status)), tool.syntax))

    def load() -> str:
        p = tool.bash("module load pytorch/2.3.1-gpu", modulepath=str(root))
        assert p.returncode == 0, p.stderr
        return p.stderr

    assert "hpcstack status" not in load()                        # no file: nothing
    status.write_text(statusfile.render({"mpi4py/4.1.2": "DEGRADED since 2026-11-01"}, "x"))
    assert "hpcstack status" not in load()                        # not this stack
    status.write_text(statusfile.render({"pytorch/2.3.1-gpu": "FAILED since 2026-11-29"}, "x"))
    assert "pytorch/2.3.1-gpu: FAILED since 2026-11-29 (hpcstack status for details)" in load()
    status.chmod(0)
    if subprocess.run(["cat", str(status)], capture_output=True).returncode != 0:    # not root
        assert "hpcstack status" not in load()                    # unreadable: nothing


@pytest.mark.unit
def test_revalidation_site_key():
    section = SCHEMA["properties"]["revalidation"]
    assert set(section["properties"]) == {"notify", "deprecate_on_failed", "schedule", "degraded", "state_dir"}
    for key in ("revalidation", "revalidation.notify", "revalidation.deprecate_on_failed",
                "revalidation.schedule", "revalidation.degraded", "revalidation.state_dir"):
        assert key in KEYS and "validate" in KEYS[key].used_by
    assert "apprise" in KEYS["revalidation.notify"].description
    import jsonschema

    good = {"notify": ["mailto://ops@example.org"], "deprecate_on_failed": True,
            "schedule": {"smoke": "15 2 * * *", "probe": "*/30 * * * *"},
            "degraded": {"throughput_drop": 0.1, "startup_rise": 0.5}}
    jsonschema.validate(good, section)
    for bad in ({"notify": ["not a url"]}, {"deprecate": True}, {"schedule": {"smoke": "@daily"}},
                {"schedule": {"weekly": "0 4 * * 0"}}, {"schedule": {"full": "0 4 * * 0; reboot"}},
                {"degraded": {"throughput_drop": 1.5}}, {"degraded": {"jitter": 0.1}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, section)


class FakeApprise:
    sent: list = []

    class Apprise:
        def __init__(self):
            self.urls = []

        def add(self, url):
            self.urls.append(url)

        def notify(self, title, body):
            FakeApprise.sent.append((self.urls, title, body))
            return True


@pytest.mark.unit
def test_actions_on_a_verdict_change():
    site = SimpleNamespace(name="cirrus", raw={"revalidation": {"notify": ["json://localhost/hook"],
                                                                 "deprecate_on_failed": True}})
    deprecated = []
    FakeApprise.sent = []
    before = [verdict("full", "OK")]
    after = [verdict("full", "FAILED", "2026-11-29T04:00:00+00:00")]
    done = actions.after_record(site, before, after, "pytorch/2.3.1-gpu", apprise_module=FakeApprise,
                                deprecate=lambda *a: deprecated.append(a))
    assert len(done) == 2 and FakeApprise.sent[0][0] == ["json://localhost/hook"]
    assert FakeApprise.sent[0][1] == "hpcstack cirrus: pytorch/2.3.1-gpu [full] FAILED"
    assert deprecated == [(site, "pytorch/2.3.1-gpu", None, None, "its validation (full) FAILED since 2026-11-29")]
    # the same verdict again: nothing; DEGRADED: told, never deprecated; no config: nothing
    assert actions.after_record(site, after, after, "pytorch/2.3.1-gpu", apprise_module=FakeApprise) == []
    deprecated.clear()
    actions.after_record(site, before, [verdict("full", "DEGRADED")], "pytorch/2.3.1-gpu",
                         apprise_module=FakeApprise, deprecate=lambda *a: deprecated.append(a))
    assert deprecated == [] and len(FakeApprise.sent) == 2
    assert actions.after_record(SimpleNamespace(name="c", raw={}), before, after, "pytorch/2.3.1-gpu") == []


def slurm_settings(**kw):
    from hpcstack.validate.settings import SlurmSettings

    base = dict(partition="debug", qos=None, account=None, tasks_per_node=1, cpus_per_task=1, gpus_per_node=0,
                time_limit="00:10:00", exclusive=True, launcher="srun", mpi=None, submit_as=None, env={})
    return SlurmSettings(**{**base, **kw})


@pytest.mark.unit
def test_the_collector_job_waits_on_slurm_not_on_a_node(tmp_path):
    """--then-collect: one sbatch, afterany on the validation's jobs, the command shell-quoted
    in --wrap, its output in root's log directory, only PATH exported."""
    import shlex

    from hpcstack.validate.validation import submit_collector

    (tmp_path / "sw").mkdir(mode=0o755)
    site = schedule_site(tmp_path)
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        assert kw.get("cwd") == "/"
        return subprocess.CompletedProcess(argv, 0, "4242;hpcstack\n", "")

    slurm = slurm_settings(partition="gpu", qos="short", account="z04")
    command = ["/opt/hpcstack/tool/bin/python", "-I", "-m", "hpcstack", "validate", "pytorch/2.3.1-gpu",
               "--site", "cirrus", "--tier", "probe", "--then-collect", "--repo", "/srv/site repo"]
    out = tmp_path / "v; rm -rf /"
    assert submit_collector(site, out, ["11", "12"], command, slurm, run=run) == "4242"
    [argv] = calls
    logs = schedule.log_dir_path(site)
    assert argv[:2] == ["sbatch", "--parsable"]
    assert "--dependency=afterany:11:12" in argv and "--kill-on-invalid-dep=yes" in argv
    assert f"--chdir={logs}" in argv and f"--output={logs}/hpcstack-collect-%j.out" in argv
    assert [a for a in argv if a.startswith("--export=")] == [a for a in argv if a.startswith("--export=PATH=")]
    assert {"--partition=gpu", "--qos=short", "--account=z04"} <= set(argv)
    assert shlex.split(argv[argv.index("--wrap") + 1]) == [*command, "--collect", str(out)]


@pytest.mark.unit
def test_a_refused_collector_is_one_error_line(tmp_path):
    from hpcstack.errors import HpcstackError
    from hpcstack.validate.validation import submit_collector

    (tmp_path / "sw").mkdir(mode=0o755)

    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Invalid account\n")

    with pytest.raises(HpcstackError, match="collector job failed: sbatch: error: Invalid account"):
        submit_collector(schedule_site(tmp_path), tmp_path / "v", ["1"], ["hpcstack"], slurm_settings(), run=run)


@pytest.mark.unit
def test_entries_name_the_nodes_as_the_sites_jobs_do():
    """Perlmutter: no --partition (partition_option false), -C gpu and the QOS, as its jobs."""
    entry = schedule.Entry("perlmutter", "pytorch/2.3.1-gpu", schedule.Tier("smoke", "0 3 * * *"))
    lines = schedule.entry_lines(entry, ["python"], {"partition": "gpu_ss11", "partition_option": False,
                                                     "qos": "regular", "constraint": "gpu", "account": "m0000"})
    opts = [line.split(" ", 1)[1] for line in lines if line.startswith("#SCRON ")]
    assert "--constraint=gpu" in opts and "--qos=regular" in opts and "--account=m0000" in opts
    assert not any(o.startswith("--partition") for o in opts)
