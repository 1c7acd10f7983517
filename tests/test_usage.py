"""The usage log's parser and report (hpcstack/lifecycle/usage.py), hostile spool entries, and
``hpcstack usage`` / ``uninstall --idle`` / ``module deprecate`` reading a prepared log."""

from __future__ import annotations

import io
import json
import os
import pwd
import time
from pathlib import Path

import pytest
import yaml

from conftest import hpcstack, site_overlay
from hpcstack.errors import ConfigError
from hpcstack.lifecycle import usage

pytestmark = pytest.mark.unit

NOW = 1_790_000_000  # 2026-09-21


def line(t=NOW - 60, user="alice", module="pytorch/2.3.1-gpu", host="login1", job="-", extra=()):
    return "\t".join(("v1", str(t), user, module, host, job, *extra)) + "\n"


def test_a_good_spool_line_is_read_with_its_fields():
    assert usage.parse_line(line(job="123"), "alice", NOW) == (NOW - 60, "alice", "pytorch/2.3.1-gpu", "login1", "123")
    assert usage.parse_line(line(), "alice", NOW)[4] is None


@pytest.mark.parametrize("text", [
    line(user="bob"),                                  # names someone else than the file's owner
    line(t=NOW + 3600),                                # from the future
    line(t=1_000_000_000),                             # before 2020
    line(module="pytorch/2.3.1-gpu\x1b[2J"),           # control characters
    line(module="../../etc/passwd"),
    line(module="pytorch"),                            # not NAME/VERSION
    line(host="login1; rm -rf /"),
    line(job="12 34"),
    line(job="-1"),
    line() + line(),                                   # two events in one file
    line()[:-1],                                       # no newline
    line().replace("v1", "v2"),
    line(extra=("x",)),                                # one field too many
    "v1\t" + "9" * 2000 + "\n",
    "",
])
def test_hostile_or_broken_lines_are_ignored(text):
    assert usage.parse_line(text, "alice", NOW) is None


def test_a_log_line_needs_its_event_id():
    assert usage.parse_line(line(extra=("1790000000000001.42.7",)), None, NOW)[5] == "1790000000000001.42.7"
    assert usage.parse_line(line(), None, NOW) is None
    assert usage.parse_line(line(extra=("../x",)), None, NOW) is None


def ev(t, user, module="pytorch/2.3.1-gpu", job=None, i=[0]):
    i[0] += 1
    return usage.Event(t, user, module, "login1", job, f"{t}000000.1.{i[0]}")


def test_report_counts_users_loads_jobs_and_first_and_last_use():
    events = [ev(NOW - 10 * 86400, "alice", job="7"), ev(NOW - 5 * 86400, "bob", job="7"),
              ev(NOW - 3600, "alice", job="8"), ev(NOW - 100 * 86400, "carol"),
              ev(NOW - 2 * 86400, "dave", module="pytorch/2.14.1-gpu"), ev(NOW - 86400, "erin", module="jax/0.4-gpu")]
    [r] = usage.report(events, "pytorch/2.3.1-gpu", since=NOW - 90 * 86400)
    assert (sorted(r.users), r.loads, sorted(r.jobs)) == (["alice", "bob"], 3, ["7", "8"])
    assert (r.first, r.last) == (NOW - 10 * 86400, NOW - 3600)
    assert [r.module for r in usage.report(events, "pytorch")] == ["pytorch/2.14.1-gpu", "pytorch/2.3.1-gpu"]
    assert usage.report(events, "pytorch/2.3.1-gpu")[0].loads == 4
    table = usage.render_table(usage.report(events))
    assert table.splitlines()[0].split() == ["STACK", "USERS", "LOADS", "JOBS", "FIRST", "LAST"]
    assert table.splitlines()[1].split()[:4] == ["jax/0.4-gpu", "1", "1", "0"]


def test_since_forms():
    assert usage.parse_since("90d", NOW) == NOW - 90 * 86400
    assert usage.parse_since("2w", NOW) == NOW - 14 * 86400
    assert usage.parse_since("2026-01-01", NOW) == 1767225600
    for bad in ("90", "d", "-3d", "2026-13-01", "yesterday"):
        with pytest.raises(ConfigError):
            usage.parse_since(bad, NOW)


def test_salted_hash_is_stable_per_salt_and_hides_the_name():
    a = usage.salted("alice", "s1")
    assert a == usage.salted("alice", "s1") and a != usage.salted("alice", "s2") != usage.salted("bob", "s1")
    assert a.startswith("h:") and "alice" not in a and usage._USER.match(a)


# ------------------------------------------------------------------- collection, as root

def needs_root(test):
    """A test that collects a root-owned spool: root's, so the integration level (the unit level
    runs as a throw-away user)."""
    skip = pytest.mark.skipif(os.geteuid() != 0, reason="the spool is root's: collecting it needs root")
    return pytest.mark.integration(skip(test))


def make_usage_dir(tmp_path, users="name") -> usage.UsageConfig:
    cfg = usage.UsageConfig(str(tmp_path / "usage"), users)
    cfg.spool.mkdir(parents=True)
    os.chmod(cfg.spool, 0o1733)
    (tmp_path / "usage" / "salt").write_text("pepper\n")
    return cfg


@needs_root
@pytest.mark.parametrize("users", ["name", "hash"])
def test_collect_moves_valid_events_and_drops_hostile_entries(tmp_path, users):
    cfg = make_usage_dir(tmp_path, users)
    spool = cfg.spool
    nobody = pwd.getpwnam("nobody").pw_uid
    now = time.time()
    good = f"{int(now * 1e6)}.1.1"
    (spool / good).write_text(line(t=int(now) - 5, user="root", job="42"))
    forged = spool / f"{int(now * 1e6)}.1.2"           # nobody's file claiming to be root's load
    forged.write_text(line(t=int(now) - 5, user="root"))
    os.chown(forged, nobody, nobody)
    (spool / f"{int(now * 1e6)}.1.3").symlink_to("/etc/shadow")
    os.mkfifo(spool / f"{int(now * 1e6)}.1.4")
    (spool / f"{int(now * 1e6)}.1.5").write_text("x" * 5000)
    os.link(spool / good, spool / f"{int(now * 1e6)}.1.6")  # a second link to an event: refused
    (spool / "not-an-id").write_text(line(user="root"))
    (spool / f"{int(now * 1e6)}.1.7").mkdir()
    done = usage.collect(cfg, now)
    assert (done.moved, done.kept, done.swept) == (0, 0, 1)  # the good file had two links when read
    os.unlink(spool / f"{int(now * 1e6)}.1.6") if (spool / f"{int(now * 1e6)}.1.6").exists() else None
    (spool / good).write_text(line(t=int(now) - 5, user="root", job="42"))
    done = usage.collect(cfg, now)
    assert done.moved == 1
    assert sorted(p.name for p in spool.iterdir()) == []      # the empty directory went at once
    events, bad = usage.read_log(cfg, now)
    assert bad == 0 and len(events) == 1
    e = events[0]
    assert (e.module, e.job, e.id) == ("pytorch/2.3.1-gpu", "42", good)
    assert e.user == ("root" if users == "name" else usage.salted("root", "pepper"))
    assert "root" not in cfg.log.read_text().split("\t")[2] or users == "name"
    assert oct(cfg.log.stat().st_mode & 0o777) == "0o600"
    # a duplicate line (a collection cut short before its unlink) counts once; junk lines are counted
    with open(cfg.log, "a") as fh:
        fh.write(e.log_line() + "garbage\tline\n")
    events, bad = usage.read_log(cfg, now)
    assert (len(events), bad) == (1, 1)


@needs_root
def test_collect_refuses_a_spool_that_is_not_roots(tmp_path):
    cfg = make_usage_dir(tmp_path)
    os.chown(cfg.spool, pwd.getpwnam("nobody").pw_uid, -1)
    with pytest.raises(usage.HpcstackError, match="not root's"):
        usage.collect(cfg)


@needs_root
def test_collect_removes_users_directories_once_empty_or_a_day_old_following_no_link(tmp_path):
    """A directory in the spool is never an event (the hooks make files): an empty one goes at
    the first collection, one that holds something once its status is older than
    SPOOL_DIR_MAX_AGE, with everything in it, removed by descriptor: the links in it are removed
    themselves, and what they point at (root's file, root's directory) stays."""
    cfg = make_usage_dir(tmp_path)
    spool = cfg.spool
    victim_dir = tmp_path / "roots"
    victim_dir.mkdir()
    victim = victim_dir / "keep"
    victim.write_text("root's\n")
    (spool / "empty").mkdir()
    full = spool / "full"
    (full / "sub" / "deeper").mkdir(parents=True)
    (full / "sub" / "deeper" / "f").write_text("junk\n")
    (full / "to-file").symlink_to(victim)
    (full / "sub" / "to-dir").symlink_to(victim_dir)
    (full / "to-dir-too").symlink_to(victim_dir, target_is_directory=True)
    now = time.time()
    done = usage.collect(cfg, now)
    assert (done.swept, done.kept) == (1, 1)
    assert sorted(p.name for p in spool.iterdir()) == ["full"]
    done = usage.collect(cfg, now + usage.SPOOL_DIR_MAX_AGE - 60)     # not yet a day old
    assert (done.swept, done.kept) == (0, 1) and full.is_dir()
    done = usage.collect(cfg, now + usage.SPOOL_DIR_MAX_AGE + 60)
    assert (done.swept, done.kept) == (1, 0)
    assert list(spool.iterdir()) == []
    assert victim.read_text() == "root's\n" and sorted(p.name for p in victim_dir.iterdir()) == ["keep"]


@needs_root
@pytest.mark.parametrize("where", ["usage", "spool"])
def test_collect_follows_no_link_to_the_usage_directory_or_its_spool(tmp_path, where):
    """The usage directory and its spool are opened by descriptor, without following a link: a
    link at either name is refused in one line and nothing is read or removed where it points."""
    cfg = make_usage_dir(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (cfg.spool / f"{int(time.time() * 1e6)}.1.1").write_text(line(t=int(time.time()) - 5, user="root"))
    if where == "usage":
        os.rename(tmp_path / "usage", elsewhere)
        (tmp_path / "usage").symlink_to(elsewhere)
        kept = elsewhere / "spool"
    else:
        os.rename(cfg.spool, elsewhere)
        cfg.spool.symlink_to(elsewhere)
        kept = elsewhere
    with pytest.raises(usage.HpcstackError) as exc:
        usage.collect(cfg)
    assert "symbolic link" in str(exc.value) or "not root's directory" in str(exc.value)
    assert len(list(kept.iterdir())) == 1


@needs_root
def test_a_flood_of_one_users_lines_is_capped_per_collection(tmp_path, monkeypatch, capsys):
    """Well-formed lines in the user's own name pass every check: a collection logs at most
    MAX_USER_EVENTS of one user's, drops the rest (removed from the spool) and names the user in
    one warning line; another user's events are not crowded out."""
    monkeypatch.setattr(usage, "MAX_USER_EVENTS", 5)
    cfg = make_usage_dir(tmp_path)
    now = time.time()
    nobody = pwd.getpwnam("nobody").pw_uid
    for i in range(12):
        (cfg.spool / f"{int(now * 1e6)}.1.{i}").write_text(line(t=int(now) - 5, user="root"))
    other = cfg.spool / f"{int(now * 1e6)}.2.1"
    other.write_text(line(t=int(now) - 5, user="nobody"))
    os.chown(other, nobody, nobody)
    done = usage.collect(cfg, now)
    assert (done.moved, done.capped) == (6, {"root": 7})
    assert list(cfg.spool.iterdir()) == []
    err = capsys.readouterr().err
    assert err.count("warning: usage:") == 1 and "root wrote 12 events" in err
    events, _ = usage.read_log(cfg, now)
    assert sorted(e.user for e in events) == ["nobody"] + ["root"] * 5


@needs_root
def test_a_module_without_a_modulefile_is_counted_not_logged(tmp_path):
    cfg = make_usage_dir(tmp_path)
    roots = tmp_path / "modulefiles"
    (roots / "pytorch").mkdir(parents=True)
    (roots / "pytorch" / "2.3.1-gpu.lua").write_text("-- a module\n")
    (tmp_path / "usage" / "hooks").mkdir()
    (tmp_path / "usage" / "hooks" / "roots.json").write_text(json.dumps({"roots": [str(roots)]}))
    now = time.time()
    for i, module in enumerate(("pytorch/2.3.1-gpu", "made-up/1.0", "made-up/2.0")):
        (cfg.spool / f"{int(now * 1e6)}.1.{i}").write_text(line(t=int(now) - 5, user="root", module=module))
    done = usage.collect(cfg, now)
    assert (done.moved, done.unknown) == (1, 2)
    assert [e.module for e in usage.read_log(cfg, now)[0]] == ["pytorch/2.3.1-gpu"]


@needs_root
def test_the_log_rotates_monthly_and_keeps_thirteen_months(tmp_path):
    """usage.log last written in an earlier month becomes usage-YYYY-MM.log at the next
    collection; a rotated file KEEP_MONTHS months old goes; readers read both, and only the files
    of their window."""
    cfg = make_usage_dir(tmp_path)
    now = 1_790_000_000.0                       # 2026-09-21
    old = now - 40 * 86400                      # 2026-08-12
    cfg.log.write_text(ev(int(old), "alice").log_line())
    os.chmod(cfg.log, 0o600)
    os.utime(cfg.log, (old, old))
    top = tmp_path / "usage"
    (top / "usage-2025-08.log").write_text(ev(int(now - 400 * 86400), "carol").log_line())
    (top / "usage-2025-09.log").write_text(ev(int(now - 366 * 86400), "dave").log_line())
    (cfg.spool / f"{int(now * 1e6)}.1.1").write_text(line(t=int(now) - 5, user="root"))
    done = usage.collect(cfg, now)
    assert done.rotated == ["usage-2026-08.log", "-usage-2025-08.log"]
    assert sorted(p.name for p in top.glob("usage*")) == ["usage-2025-09.log", "usage-2026-08.log", "usage.log"]
    assert [e.user for e in usage.read_log(cfg, now)[0]] == ["root", "alice", "dave"]
    assert usage.log_files(cfg, now - 30 * 86400) == ["usage.log", "usage-2026-08.log"]
    assert [e.user for e in usage.read_log(cfg, now, since=now - 30 * 86400)[0]] == ["root"]
    done = usage.collect(cfg, now)              # the same month: nothing moves
    assert done.rotated == []


class _Stream(io.BytesIO):
    """A file that records how much each readline asked for and how far it was read."""

    def __init__(self, data):
        super().__init__(data)
        self.asked = []

    def readline(self, size=-1):
        self.asked.append(size)
        return super().readline(size)


def test_the_log_is_read_line_by_line_in_bounded_pieces():
    """The reader never asks for more than one event's bytes at a time (an overlong line is
    skipped in pieces and counted once), and hands each line on before reading the next."""
    good = ev(NOW - 60, "alice").log_line().encode()
    stream = _Stream(good + b"x" * (10 * usage.MAX_EVENT) + b"\n" + good * 3)
    lines = usage.read_lines(stream, [usage.MAX_LOG])
    assert next(lines) == good.decode() and stream.tell() == len(good)
    rest = list(lines)
    assert rest == [None] + [good.decode()] * 3
    assert max(stream.asked) == usage.MAX_EVENT + 1
    stream = _Stream(good * 10)                 # the byte budget stops the read
    assert len(list(usage.read_lines(stream, [3 * len(good)]))) == 3


def test_read_log_streams_the_files_and_never_reads_one_whole(tmp_path, monkeypatch):
    cfg = usage.UsageConfig(str(tmp_path / "usage"))
    (tmp_path / "usage").mkdir()
    cfg.log.write_text("".join(ev(NOW - i, "alice").log_line() for i in range(1, 50)) + "junk\n")
    monkeypatch.setattr(usage.gate, "read_file", lambda *a, **k: pytest.fail("read whole"))
    gen = usage.iter_log(cfg, NOW)
    assert next(gen).user == "alice"
    events, bad = usage.read_log(cfg, NOW)
    assert (len(events), bad) == (49, 1)


# ------------------------------------------------------------------------- the commands

def site_with_log(tmp_path, events: list[usage.Event], with_log=True) -> Path:
    repo = tmp_path / "repo"
    changes = {"lifecycle": {"usage_log": str(tmp_path / "usage")}} if with_log else {}
    site_overlay(repo, name="usagesite", roots=tmp_path, **changes)
    (tmp_path / "usage").mkdir(exist_ok=True)
    (tmp_path / "usage" / "usage.log").write_text("".join(e.log_line() for e in events) + "hostile\x1b[2J\n")
    return repo


def test_usage_command_reports_per_stack_as_table_and_json(tmp_path):
    now = int(time.time())
    repo = site_with_log(tmp_path, [ev(now - 86400, "alice", job="9"), ev(now - 3600, "bob"),
                                    ev(now - 200 * 86400, "carol")])
    proc = hpcstack("usage", "--site", "usagesite", "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)["stacks"]
    assert (row["stack"], row["users"], row["loads"], row["jobs"]) == ("pytorch/2.3.1-gpu", 2, 2, 1)
    assert "ignored 1 entries" in proc.stderr
    proc = hpcstack("usage", "pytorch/2.3.1-gpu", "--since", "365d", "--site", "usagesite", "--repo", str(repo))
    assert proc.returncode == 0 and proc.stdout.split("\n")[1].split()[:4] == ["pytorch/2.3.1-gpu", "3", "3", "1"]


def test_usage_command_bad_input_is_one_line(tmp_path):
    repo = site_with_log(tmp_path, [])
    proc = hpcstack("usage", "--since", "soon", "--site", "usagesite", "--repo", str(repo))
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and "--since" in proc.stderr
    proc = hpcstack("usage", "../x", "--site", "usagesite", "--repo", str(repo))
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1
    (repo / "site-configs" / "usagesite.yaml").write_text(yaml.safe_dump(
        {**yaml.safe_load((repo / "site-configs" / "usagesite.yaml").read_text()), "lifecycle": {}}))
    proc = hpcstack("usage", "--site", "usagesite", "--repo", str(repo))
    assert proc.returncode == 1 and "records no module usage" in proc.stderr


def test_retire_refuses_a_stack_loaded_within_idle_days(tmp_path):
    now = int(time.time())
    repo = site_with_log(tmp_path, [ev(now - 3 * 86400, "alice"), ev(now - 3600, "bob")])
    args = ("uninstall", "pytorch/2.3.1-gpu", "--site", "usagesite", "--repo", str(repo), "--dry-run")
    proc = hpcstack(*args)
    assert proc.returncode == 1, proc.stderr
    assert "2 users loaded it in the last 30 days" in proc.stderr and "last on" in proc.stderr
    proc = hpcstack(*args, "--idle", "1")
    assert proc.returncode == 1 and "1 user loaded it in the last 1 days" in proc.stderr
    proc = hpcstack(*args, "--idle", "0")
    assert proc.returncode == 2 and "--idle" in proc.stderr
    proc = hpcstack(*args, "--force")
    assert "refusing" not in proc.stderr


def test_deprecate_prints_the_usage_before_acting(tmp_path):
    now = int(time.time())
    repo = site_with_log(tmp_path, [ev(now - 86400, "alice", job="5")])
    mod = tmp_path / "modulefiles" / "pytorch"
    mod.mkdir(parents=True)
    (mod / "2.3.1-gpu").write_text("#%Module\n")
    proc = hpcstack("module", "deprecate", "pytorch/2.3.1-gpu", "--site", "usagesite", "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("usage of pytorch/2.3.1-gpu in the last 90 days: 1 users, 1 loads, 1 jobs, last on ")
