"""The validation history (hpcstack.validate.history): real SQLite files in temporary
directories, opened through the gate; reports recorded OK, FAILED or NOT-RUN, never a pass for
a run that did not happen."""

from __future__ import annotations

import os
import sqlite3
import stat
from contextlib import closing
from types import SimpleNamespace

import pytest

from hpcstack import gate
from hpcstack.validate import history
from historydata import FP, day, report, sample

pytestmark = pytest.mark.unit


def _db(tmp_path):
    return str(tmp_path / "state" / "history" / "site.sqlite")


def test_a_report_is_recorded_with_its_sample_fingerprint_and_report(tmp_path):
    path = _db(tmp_path)
    with closing(history.open_history(path)) as conn:
        row = history.record_report(conn, "pytorch/2.3.1-gpu", "pytorch/2.3.1-gpu", "install", report(),
                                    started=day(1), fingerprint=FP, sample=sample(1000))
    st = os.stat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o644
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o755
    [run] = history.read_runs(path)
    assert (run.id, run.state, run.tier, run.started, run.reason) == (row, "OK", "install", day(1), "")
    assert run.fingerprint == FP
    assert len(run.sample["horovod:2"]["throughput_total"]) == 20
    assert run.report["system"] == "testsite:gpu"
    # the schema holds what the issue asks for, column by column
    with closing(sqlite3.connect(path)) as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    assert columns == ["id", "stack", "recipe", "tier", "started", "finished", "state", "reason",
                       "fingerprint", "sample", "report"]


def test_a_failed_report_is_failed_with_its_failures_as_the_reason(tmp_path):
    with closing(history.open_history(_db(tmp_path))) as conn:
        history.record_report(conn, "s/1", "s/1", "full", report(ok=False, failures=[
            "performance: horovod on 2 node(s) (job 11): throughput_total 700 below 900"]))
        [run] = history.runs(conn)
    assert run.state == "FAILED" and "below 900" in run.reason


def test_jobs_that_never_ran_are_not_run_never_a_pass(tmp_path):
    with closing(history.open_history(_db(tmp_path))) as conn:
        r = report(ok=False, jobs_state="NODE_FAIL")
        r["runs"][0]["figures"]["throughput_total"]["value"] = None
        r["runs"][0]["startup"] = None
        history.record_report(conn, "s/1", "s/1", "smoke", r)
        history.record_not_run(conn, "s/1", "s/1", "smoke", "scrontab slot skipped (late)")
        states = [(run.state, run.reason) for run in history.runs(conn)]
    assert states[0][0] == "NOT-RUN" and "NODE_FAIL" in states[0][1]
    assert states[1] == ("NOT-RUN", "scrontab slot skipped (late)")
    with closing(history.open_history(_db(tmp_path))) as conn, pytest.raises(Exception):
        history.record_not_run(conn, "s/1", "s/1", "smoke", "")


def test_a_bad_tier_is_refused(tmp_path):
    with closing(history.open_history(_db(tmp_path))) as conn, pytest.raises(Exception, match="tier"):
        history.record_report(conn, "s/1", "s/1", "weekly", report())


def test_a_link_at_the_database_is_refused_and_not_followed(tmp_path):
    target = tmp_path / "elsewhere.sqlite"
    target.write_bytes(b"")
    path = _db(tmp_path)
    os.makedirs(os.path.dirname(path))
    os.symlink(target, path)
    with pytest.raises(gate.GateError):
        history.open_history(path)
    assert target.read_bytes() == b""


def test_reading_a_missing_history_gives_no_runs_and_makes_nothing(tmp_path):
    assert history.read_runs(_db(tmp_path)) == []
    assert not (tmp_path / "state").exists()


def test_the_sample_keeps_every_round_summed_over_the_ranks():
    records = [{"record": "throughput", "rank": 0, "img_per_sec_iters": [10.0, 11.0, 12.0]},
               {"record": "throughput", "rank": 1, "img_per_sec_iters": [20.0, 21.0, 22.0]},
               {"record": "startup", "rank": 0, "first_step_s": 3.0},
               {"record": "startup", "rank": 1, "first_step_s": 4.0}]
    run = SimpleNamespace(backend="ddp", nodes=2, records=records)
    assert history.sample_of([run]) == {"ddp:2": {"throughput_total": [30.0, 32.0, 34.0], "unit": "img/s",
                                                  "startup_s": [3.0, 4.0]}}


def test_the_history_lives_in_the_sites_state_directory():
    site = SimpleNamespace(install_root="/opt/stacks", name="cirrus")
    assert history.history_path(site) == "/opt/stacks/.hpcstack/history/cirrus.sqlite"


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="gives the directory to another group: root")
def test_open_history_never_trusts_a_stack_group(tmp_path):
    """sqlite3 opens the database by name after the gate's check: safe only while no stack-group
    member can swap it. A history directory the site's stack group can write is refused even
    under a policy that trusts that group for the site's directories."""
    from hpcstack import trust

    users = 100
    db = tmp_path / "history" / "s.sqlite"
    db.parent.mkdir()
    os.chown(db.parent, 0, users)
    pol = trust.Policy(uid=0, stack_gids=frozenset({users}))
    with closing(history.open_history(str(db), pol=pol)) as conn:      # 0755: root's alone
        assert conn is not None
    os.chmod(db.parent, 0o775)
    for write in (True, False):
        with pytest.raises(gate.GateError, match="writable by group"):
            history.open_history(str(db), write=write, pol=pol)
