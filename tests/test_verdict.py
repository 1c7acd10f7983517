"""Verdicts from the history (hpcstack.validate.verdict): a 20 % slower sample is DEGRADED with
the date of the shift and what changed first; noise of a few percent stays OK; a failed report
is FAILED; a run that did not run stays NOT-RUN, never a pass. Real SQLite files."""

from __future__ import annotations

from contextlib import closing

import pytest

from hpcstack.validate import history, verdict
from historydata import FP, day, report, sample

pytestmark = pytest.mark.unit

STACK = "pytorch/2.3.1-gpu"


def _record(conn, tier, when, mean=None, fp=None, ok=True, failures=None, seed=0):
    return history.record_report(conn, STACK, STACK, tier, report(ok=ok, failures=failures, generated=when),
                                 started=when, fingerprint=fp or FP,
                                 sample=sample(mean, seed=seed) if mean is not None else {})


def _runs(tmp_path, fill):
    path = str(tmp_path / "h" / "site.sqlite")
    with closing(history.open_history(path)) as conn:
        fill(conn)
    return history.read_runs(path)


def _one(runs, tier):
    return next(v for v in verdict.verdicts(runs) if v.tier == tier)


def test_a_20_percent_slower_sample_is_degraded_with_its_date_and_what_changed_first(tmp_path):
    new_driver = {**FP, "gpu.driver": "550.54.15"}

    def fill(conn):
        _record(conn, "install", day(1), 1000, seed=1)
        for d in (2, 3, 4):
            _record(conn, "full", day(d), 1000, seed=d)
        for d in (5, 6, 7):
            _record(conn, "full", day(d), 800, fp=new_driver, seed=d)

    v = _one(_runs(tmp_path, fill), "full")
    assert v.verdict == "DEGRADED"
    assert v.since == day(5)                       # the change point: the first slower run
    assert v.last_ok == day(4)                     # the last run before the shift
    assert v.changed == ["changed gpu.driver: 535.104.05 -> 550.54.15"]
    lines = v.lines()
    assert lines[1].startswith("  what changed since the last OK run")     # first, before the reasons
    assert lines[2] == "    changed gpu.driver: 535.104.05 -> 550.54.15"
    assert "throughput on horovod:2" in lines[3] and "-20" in lines[3]
    assert v.trend.startswith("-2") and v.trend.endswith("horovod:2")
    assert v.shifts[0].p_value < verdict.ALPHA


@pytest.mark.parametrize("seed", range(5))
def test_noise_within_a_few_percent_stays_ok(tmp_path, seed):
    def fill(conn):
        _record(conn, "install", day(1), 1000, seed=100 + seed)
        for d in (2, 3, 4, 5):
            _record(conn, "full", day(d), 1000 * (0.98 if d == 5 else 1.0), seed=seed * 10 + d)

    v = _one(_runs(tmp_path, fill), "full")
    assert v.verdict == "OK", v.lines()
    assert v.changed == [] and v.since is None


def test_a_failed_run_is_failed_with_what_changed_first(tmp_path):
    def fill(conn):
        _record(conn, "install", day(1), 1000)
        _record(conn, "smoke", day(2), 1000)
        _record(conn, "smoke", day(3), fp={**FP, "mpi": "mpirun (Open MPI) 5.0.3"}, ok=False,
                failures=["sanity: horovod on 1 node(s) (job 12): allreduce sum wrong"])

    v = _one(_runs(tmp_path, fill), "smoke")
    assert v.verdict == "FAILED" and v.since == day(3) and v.last_ok == day(2)
    assert v.changed == ["changed mpi: mpirun (Open MPI) 4.1.5 -> mpirun (Open MPI) 5.0.3"]
    assert v.reasons == ["sanity: horovod on 1 node(s) (job 12): allreduce sum wrong"]


def test_not_run_is_never_a_pass(tmp_path):
    def fill(conn):
        _record(conn, "install", day(1), 1000)
        _record(conn, "smoke", day(2), 1000)
        history.record_not_run(conn, STACK, STACK, "smoke", "slot skipped: node down", started=day(3))
        history.record_not_run(conn, STACK, STACK, "smoke", "slot skipped: queue full", started=day(4))

    runs = _runs(tmp_path, fill)
    v = _one(runs, "smoke")
    assert v.verdict == "NOT-RUN" and v.since == day(3) and v.last_ok == day(2)
    assert v.reasons == ["slot skipped: queue full"]
    # a tier that only ever missed its slots is NOT-RUN too, not OK
    only_missed = [r for r in runs if r.state == "NOT-RUN"]
    assert _one(only_missed, "smoke").verdict == "NOT-RUN"


def test_the_references_export_as_reframe_yaml(tmp_path):
    import yaml

    runs = _runs(tmp_path, lambda conn: _record(conn, "install", day(1), 1000))
    doc = yaml.safe_load(verdict.reframe_yaml(runs, "testsite"))
    assert doc == {STACK: {"testsite:gpu": {2: {"throughput_total": [1000.0, -0.1, None, "img/s"]}}}}


def test_a_tier_with_a_workload_of_its_own_is_compared_with_itself_not_the_install(tmp_path):
    """A smoke run trains the recipe's smoke workload: far fewer img/s than the install's
    workload, which is no slowdown; its baseline is the tier's first OK run of that workload."""
    def smoke(conn, when, mean, seed):
        rep = report(generated=when)
        rep["settings"] = {"model": "tiny", "workload": "smoke"}
        history.record_report(conn, STACK, STACK, "smoke", rep, started=when, fingerprint=FP,
                              sample=sample(mean, seed=seed))

    def fill(conn):
        _record(conn, "install", day(1), 5000, seed=1)
        smoke(conn, day(2), 1000, 2)
        smoke(conn, day(3), 1010, 3)

    runs = _runs(tmp_path, fill)
    v = _one(runs, "smoke")
    assert v.verdict == "OK" and v.trend.startswith("+"), v
    assert verdict.workload_of(runs[1]) == "smoke" and verdict.workload_of(runs[0]) is None
    assert verdict.baseline_of(runs, runs[1:]).id == runs[1].id


def test_the_sites_margins_decide_what_a_drop_is(tmp_path):
    """revalidation.degraded: a 20 % drop is DEGRADED by default and OK where the site allows
    30 %; a 40 % drop is DEGRADED under both."""
    from types import SimpleNamespace

    def fill(conn):
        _record(conn, "install", day(1), 1000, seed=1)
        _record(conn, "full", day(2), 800, seed=2)

    runs = _runs(tmp_path, fill)
    wide = SimpleNamespace(raw={"revalidation": {"degraded": {"throughput_drop": 0.3, "startup_rise": 1.0}}})
    assert verdict.margins_of(wide) == {"min_drop": 0.3, "min_startup_rise": 1.0}
    assert verdict.margins_of(SimpleNamespace(raw={})) == {"min_drop": verdict.MIN_DROP,
                                                           "min_startup_rise": verdict.MIN_STARTUP_RISE}
    assert next(v for v in verdict.verdicts(runs) if v.tier == "full").verdict == "DEGRADED"
    assert next(v for v in verdict.site_verdicts(wide, runs) if v.tier == "full").verdict == "OK"

    def fill40(conn):
        _record(conn, "install", day(1), 1000, seed=1)
        _record(conn, "full", day(2), 600, seed=2)

    runs = _runs(tmp_path / "b", fill40)
    assert next(v for v in verdict.site_verdicts(wide, runs) if v.tier == "full").verdict == "DEGRADED"
