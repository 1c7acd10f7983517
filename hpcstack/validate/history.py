"""The validation history of a site: one root-owned SQLite database, one row per run.

Where: ``<install_root>/.hpcstack/history/<site>.sqlite`` (:func:`history_path`), beside the
stacks' state files (:data:`hpcstack.install.layout.STATE_DIR`). Who writes: root, at the end of
``hpcstack validate`` of a published stack (:func:`record_validation`: the install's validation
is the first one of a build, tier ``install``; later ones are ``manual`` unless ``--tier``
says otherwise), and whatever schedules validations (tiers ``smoke``, ``full``, ``probe``),
which records a slot that did not run with :func:`record_not_run`. Who reads: ``hpcstack
status`` (:mod:`hpcstack.validate.verdict`, :mod:`hpcstack.validate.status`), as root or as any
user (the file is 0644).

Schema (table ``runs``, :data:`SCHEMA`)::

    id INTEGER PRIMARY KEY, stack TEXT (NAME/VERSION), recipe TEXT (the recipe's ref),
    tier TEXT (install|smoke|full|probe|manual), started TEXT, finished TEXT (ISO 8601 UTC),
    state TEXT (OK|FAILED|NOT-RUN), reason TEXT (why FAILED or NOT-RUN, one line each),
    fingerprint TEXT (JSON, :mod:`hpcstack.validate.fingerprint`), sample TEXT (JSON,
    :func:`sample_of`), report TEXT (JSON: the report ``hpcstack validate --json`` prints)

How the file is opened (:func:`open_history`), and why that is safe for root: the directory is
made or found through the gate (:func:`hpcstack.gate.mkdir`: every component from ``/`` opened
``O_NOFOLLOW`` and checked against the trust rule; ours is root's, 0755). A new database file is
made ``O_CREAT|O_EXCL|O_NOFOLLOW`` in that directory's descriptor; an existing one is checked
through the gate (:func:`hpcstack.gate.open_file`: a regular file, a trusted owner, no link on the
way). Only then does :mod:`sqlite3` open it by name, with the URI ``file:PATH?mode=rw`` (``ro``
for readers): it never creates a file, and no one but root can change a name in a root-owned
0755 directory whose whole chain the gate has checked, so the name still means the file checked.
SQLite's rollback journal (``<db>-journal``) is made in the same directory, by root.

Source: SQLite's URI filenames (``mode=ro|rw|rwc``, https://www.sqlite.org/uri.html).
"""

from __future__ import annotations

import datetime
import json
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass

from hpcstack import gate
from hpcstack.errors import HpcstackError
from hpcstack.site import state_dir_of

#: Tiers of a run: the install's baseline, the scheduled ones, the change-triggered probe, by hand.
TIERS = ("install", "smoke", "full", "probe", "manual")
#: States of a run (the verdicts DEGRADED is derived from OK runs, never stored).
STATES = ("OK", "FAILED", "NOT-RUN")
#: The directory under ``<install_root>/.hpcstack``.
HISTORY_DIR = "history"
#: Job states that mean the jobs never ran the stack: the run is NOT-RUN, not FAILED.
NOT_RUN_JOB_STATES = ("CANCELLED", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED")

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    stack TEXT NOT NULL,
    recipe TEXT NOT NULL,
    tier TEXT NOT NULL CHECK (tier IN ('install', 'smoke', 'full', 'probe', 'manual')),
    started TEXT NOT NULL,
    finished TEXT,
    state TEXT NOT NULL CHECK (state IN ('OK', 'FAILED', 'NOT-RUN')),
    reason TEXT NOT NULL DEFAULT '',
    fingerprint TEXT NOT NULL DEFAULT '{}',
    sample TEXT NOT NULL DEFAULT '{}',
    report TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS runs_stack ON runs (stack, tier, started);
"""


@dataclass(frozen=True)
class Run:
    """One row of ``runs``, its JSON columns loaded.

    Attributes:
        id (int), stack (str), recipe (str), tier (str), started (str), finished (str | None),
        state (str), reason (str): as stored.
        fingerprint (dict), sample (dict), report (dict): the JSON columns.
    """

    id: int
    stack: str
    recipe: str
    tier: str
    started: str
    finished: str | None
    state: str
    reason: str
    fingerprint: dict
    sample: dict
    report: dict

    def to_dict(self, full: bool = False) -> dict:
        """The row as JSON (without the report unless ``full``)."""
        out = {"id": self.id, "stack": self.stack, "recipe": self.recipe, "tier": self.tier,
               "started": self.started, "finished": self.finished, "state": self.state,
               "reason": self.reason, "fingerprint": self.fingerprint, "sample": self.sample}
        if full:
            out["report"] = self.report
        return out


def now_iso() -> str:
    """The current time, ISO 8601 UTC to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def state_root(site) -> str:
    """Where a site keeps its validation history and schedule: ``revalidation.state_dir``, else
    ``<install_root>/.hpcstack``. A site whose install root its admin group may write (a 2775
    project directory), or that its compute nodes see read-only (Perlmutter's
    ``/global/common/software``), names a directory only root can change and the nodes can
    write as root: the gate refuses a history in a chain a group may change, and the scheduled
    runs record from the compute nodes."""
    from hpcstack.install.layout import STATE_DIR

    return state_dir_of(site) or os.path.join(site.install_root, STATE_DIR)


def history_path(site) -> str:
    """``<state root>/history/<site>.sqlite`` of a site (:func:`state_root`)."""
    return os.path.join(state_root(site), HISTORY_DIR, f"{site.name}.sqlite")


def open_history(path: str, write: bool = True, pol=None) -> sqlite3.Connection | None:
    """Open (with ``write``: make) the history database at ``path`` (see the module's text).

    Args:
        path (str): the database file (absolute).
        write (bool): make the directory and the file when missing (0755, 0644) and open for
            writing; False: open read-only, None when there is no database yet.
        pol (hpcstack.trust.Policy | None): whom to trust (default the gate's current policy),
            always without a site's stack group (``stack_gids``): see below.

    sqlite3 opens the file (and makes its journal beside it) by name, after the gate checked
    it: that is safe only while nobody but root and the admin group can change the directory
    (a member of the stack group could swap the file for a link between the check and the
    open). So the check here never trusts a stack group, whatever ``pol`` says: a history
    directory that group can write is refused (:class:`hpcstack.gate.GateError`).

    Returns:
        sqlite3.Connection | None: with the schema made (when writing).

    Raises:
        GateError: a link, a non-regular file or an untrusted owner on the way (a stack group's
            write access included).
        OSError: a directory cannot be made, the file cannot be read.
    """
    from dataclasses import replace

    pol = pol if pol is not None else gate.current_policy()
    if pol.stack_gids:
        pol = replace(pol, stack_gids=frozenset())
    directory, name = os.path.split(path)
    if write:
        gate.mkdir(directory, 0o755, parents=True, pol=pol)
        with gate.directory(directory, pol) as dfd:
            try:      # a new file only, in the checked directory's descriptor, never through a link
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o644, dir_fd=dfd))
            except FileExistsError:
                pass
    try:
        os.close(gate.open_file(path, pol))    # a regular file, trusted owner, no link on the way
    except FileNotFoundError:
        if write:
            raise
        return None
    from urllib.parse import quote

    conn = sqlite3.connect(f"file:{quote(path)}?mode={'rw' if write else 'ro'}", uri=True, timeout=30)
    if write:
        conn.executescript(SCHEMA)
    return conn


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _insert(conn: sqlite3.Connection, **row) -> int:
    if row["tier"] not in TIERS:
        raise HpcstackError(f"history: tier {row['tier']!r}: not one of {', '.join(TIERS)}")
    if row["state"] not in STATES:
        raise HpcstackError(f"history: state {row['state']!r}: not one of {', '.join(STATES)}")
    with conn:
        cur = conn.execute(
            "INSERT INTO runs (stack, recipe, tier, started, finished, state, reason, fingerprint, sample, report) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row["stack"], row["recipe"], row["tier"], row["started"], row.get("finished"), row["state"],
             row.get("reason") or "", _dumps(row.get("fingerprint") or {}), _dumps(row.get("sample") or {}),
             _dumps(row.get("report") or {})))
    return int(cur.lastrowid)


def sample_of(runs: list) -> dict:
    """Every round's figures per backend and node count, from a validation's runs
    (:class:`hpcstack.validate.judge.RunOutcome`, their JSON-lines records).

    Returns:
        dict: ``{"<backend>:<nodes>": {"throughput_total": [img/s of each round, summed over
        the ranks], "unit": "img/s", "startup_s": [each rank's first_step_s]}}``; a run
        without per-round records keeps its ``throughput_total`` record's one figure.
    """
    out: dict = {}
    for run in runs:
        rows = [r.get("img_per_sec_iters") or [] for r in run.records if r.get("record") == "throughput"]
        rounds = min((len(r) for r in rows), default=0)
        values = [float(sum(r[i] for r in rows)) for i in range(rounds)] if rows and rounds else []
        if not values:
            values = [float(r["img_per_sec"]) for r in run.records
                      if r.get("record") == "throughput_total" and isinstance(r.get("img_per_sec"), (int, float))]
        startup = [float(r["first_step_s"]) for r in run.records
                   if r.get("record") == "startup" and isinstance(r.get("first_step_s"), (int, float))]
        if values or startup:
            out[f"{run.backend}:{run.nodes}"] = {"throughput_total": values, "unit": "img/s", "startup_s": startup}
    return out


def sample_from_report(report: dict) -> dict:
    """A sample from the report alone (no per-round records): each run's ``throughput_total``
    figure and start-up median, one value each."""
    out = {}
    for r in report.get("runs") or []:
        value = ((r.get("figures") or {}).get("throughput_total") or {}).get("value")
        start = ((r.get("startup") or {}).get("first_step_s") or {}).get("median")
        if value is not None or start is not None:
            out[f"{r.get('backend')}:{r.get('nodes')}"] = {
                "throughput_total": [float(value)] if value is not None else [], "unit": "img/s",
                "startup_s": [float(start)] if start is not None else []}
    return out


def not_run_reason(report: dict) -> str | None:
    """Why a validation's report means NOT-RUN (no job ran the stack: every job ended in one of
    :data:`NOT_RUN_JOB_STATES` and no run wrote a record), else None."""
    jobs = report.get("jobs") or []
    if not jobs or any(j.get("state") not in NOT_RUN_JOB_STATES for j in jobs):
        return None
    if any(r.get("figures", {}).get("throughput_total", {}).get("value") is not None or r.get("startup")
           for r in report.get("runs") or []):
        return None
    return "; ".join(f"job {j.get('job_id')} ({j.get('nodes')} node(s)) {j.get('state')}"
                     + (f": {j['reason']}" if j.get("reason") else "") for j in jobs)


def record_report(conn: sqlite3.Connection, stack: str, recipe: str, tier: str, report: dict, *,
                  started: str | None = None, fingerprint: dict | None = None,
                  sample: dict | None = None) -> int:
    """Record a validation's report (the dict ``hpcstack validate --json`` prints): OK when
    ``report["ok"]``; NOT-RUN when no job ran (:func:`not_run_reason`); else FAILED with the
    report's ``failures`` as the reason.

    Args:
        conn (sqlite3.Connection): from :func:`open_history`.
        stack (str): ``NAME/VERSION``; recipe (str): the recipe's ref.
        tier (str): one of :data:`TIERS`.
        report (dict): the report.
        started (str | None): when the validation started (default: the report's ``generated``).
        fingerprint (dict | None): the environment (:mod:`hpcstack.validate.fingerprint`).
        sample (dict | None): every round's figures (:func:`sample_of`); default from the report.

    Returns:
        int: the row's id.
    """
    why_not = not_run_reason(report)
    state = "OK" if report.get("ok") else "NOT-RUN" if why_not else "FAILED"
    reason = "" if state == "OK" else why_not if why_not else "\n".join(report.get("failures") or ["failed"])
    finished = report.get("generated") or now_iso()
    return _insert(conn, stack=stack, recipe=recipe, tier=tier, started=started or finished, finished=finished,
                   state=state, reason=reason, fingerprint=fingerprint, report=report,
                   sample=sample if sample is not None else sample_from_report(report))


def record_not_run(conn: sqlite3.Connection, stack: str, recipe: str, tier: str, reason: str, *,
                   started: str | None = None) -> int:
    """Record a slot that did not run (skipped, node down, queue full): NOT-RUN with its reason,
    never a pass.

    Returns:
        int: the row's id.
    """
    if not reason:
        raise HpcstackError("history: a NOT-RUN needs its reason")
    when = started or now_iso()
    return _insert(conn, stack=stack, recipe=recipe, tier=tier, started=when, finished=None, state="NOT-RUN",
                   reason=reason)


def runs(conn: sqlite3.Connection, stack: str | None = None, tier: str | None = None) -> list[Run]:
    """The rows, oldest first (by ``started``, then ``id``), of one stack and tier or all."""
    sql, args = "SELECT id, stack, recipe, tier, started, finished, state, reason, fingerprint, sample, report " \
                "FROM runs", []
    where = [(c, v) for c, v in (("stack", stack), ("tier", tier)) if v is not None]
    if where:
        sql += " WHERE " + " AND ".join(f"{c} = ?" for c, _ in where)
        args = [v for _, v in where]
    out = []
    for row in conn.execute(sql + " ORDER BY started, id", args):
        loaded = []
        for text in row[8:]:
            try:
                value = json.loads(text or "{}")
            except ValueError:
                value = {}
            loaded.append(value if isinstance(value, dict) else {})
        out.append(Run(*row[:8], *loaded))
    return out


def read_runs(path: str, pol=None) -> list[Run]:
    """Every row of the database at ``path`` (read-only; empty when there is none)."""
    conn = open_history(path, write=False, pol=pol)
    if conn is None:
        return []
    with closing(conn):
        return runs(conn)


def has_install_baseline(conn: sqlite3.Connection, stack: str, build: str | None) -> bool:
    """The history holds an ``install`` run of this build of the stack already."""
    for run in runs(conn, stack, "install"):
        if build is None or run.fingerprint.get("stack.build") == build:
            return True
    return False


def record_validation(site, recipe, report: dict, *, after_recorded, runs_outcome: list | None = None,
                      job_dirs: list | None = None, output_dir=None, tier: str | None = None,
                      started: str | None = None) -> int | None:
    """At the end of ``hpcstack validate`` as root, of a published stack: record the report with
    its sample and fingerprint in the site's history, then call ``after_recorded``. Tier:
    ``tier``, else ``install`` for the first validation of the published build, else ``manual``.

    It never raises: a failure to record is one warning line on stderr (the validation's own
    result stands).

    Args:
        site, recipe: what was validated.
        report (dict): the report.
        after_recorded: called as ``after_recorded(site, stack, before, after)`` once the run is
            recorded, with the history's runs before and after it: what follows a recorded run
            (:func:`hpcstack.validate.actions.after_recorded`: the site's ``revalidation``
            actions and the status file). Passed in, since those modules read this one.
        runs_outcome (list | None): the runs (:class:`~hpcstack.validate.judge.RunOutcome`), for
            the per-round sample.
        job_dirs (list | None), output_dir: the jobs' directories and the validation's, where
            the jobs wrote ``fingerprint.json``.
        tier (str | None): as above.
        started (str | None): when the validation started.

    Returns:
        int | None: the row's id, or None when nothing was recorded (not root, not published,
        or the warning).
    """
    import sys

    from hpcstack.validate import fingerprint as fp
    from hpcstack.install.layout import StackLayout

    if os.geteuid() != 0:
        return None
    try:
        layout = StackLayout.for_site(site, recipe.name, recipe.version)
        build = layout.published()
        if build is None:
            return None
        prints = fp.read_job_fingerprints(job_dirs or [], output_dir) if output_dir is not None else []
        env = fp.merge(prints)
        env.update({k: v for k, v in fp.nccl_of_report(report).items() if v})
        env["stack.build"] = layout.id_of(build) or os.path.basename(build)
        with closing(open_history(history_path(site))) as conn:
            chosen = tier or ("manual" if has_install_baseline(conn, recipe.full_name, env["stack.build"])
                              else "install")
            before = runs(conn)
            row = record_report(conn, recipe.full_name, recipe.ref or recipe.full_name, chosen, report,
                                started=started, fingerprint=env,
                                sample=sample_of(runs_outcome) if runs_outcome else None)
            after = runs(conn)
    except (HpcstackError, OSError, sqlite3.Error, ValueError) as exc:
        print(f"warning: the validation was not recorded in the site's history: {exc}", file=sys.stderr)
        return None
    after_recorded(site, recipe.full_name, before, after)
    return row

