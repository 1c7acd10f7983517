"""``hpcstack status``: each stack's verdict where people look, from the site's history.

* a table (rich): stack, tier, verdict, last run, trend, since
  (:mod:`hpcstack.validate.verdict` decides each verdict);
* ``--json``: the same as JSON (:func:`status_document`);
* ``--html DIR``: a static page per site, ``DIR/<site>.html`` (``templates/status.html.j2``, no
  script, readable without JavaScript), with per stack its verdict, what changed, two plots
  (``DIR/<site>-<stack>-throughput.png`` and ``-startup.png``, matplotlib's Agg backend: the
  median of each run's rounds per backend and node count over time, the reference band, the
  runs whose fingerprint changed marked on the time axis) and how many users loaded it in the
  last 30 days (the usage log, :func:`hpcstack.lifecycle.usage.read_log`); and
  ``DIR/<site>.json`` beside it for other tools;
* ``--reframe-refs FILE``: the references as ReFrame YAML (:func:`hpcstack.validate.verdict.reframe_yaml`).

Every file is written through the gate (:func:`hpcstack.gate.write_atomic`, the directory made
with :func:`hpcstack.gate.mkdir`), as root or not.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import re
import statistics
import sys
import time

from hpcstack import gate
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.validate import history, verdict as verdicts_mod
from hpcstack.validate.fingerprint import KEYS

#: Usage is counted over this many days.
USAGE_DAYS = 30
#: Fingerprint keys whose change is not marked on the plots (the nodes change with every run).
UNMARKED = ("nodes",)


def slug(stack: str) -> str:
    """A file-name part for a stack: ``pytorch/2.3.1-gpu`` -> ``pytorch-2.3.1-gpu``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stack).strip("-") or "stack"


def users_per_stack(site, days: int = USAGE_DAYS, now: float | None = None) -> dict[str, int] | None:
    """Distinct users who loaded each stack in the last ``days`` days, from the usage log (read,
    not collected); None when the site keeps no log or it cannot be read (not root)."""
    from hpcstack.lifecycle import usage

    cfg = usage.usage_config(site)
    if cfg is None:
        return None
    now = time.time() if now is None else now
    try:
        events, _ = usage.read_log(cfg, now, since=now - days * 86400)
    except HpcstackError:
        return None
    return {r.module: len(r.users) for r in usage.report(events, None, now - days * 86400)}


def status_document(site, runs: list, users: dict | None) -> dict:
    """The status as JSON: ``{"site", "generated", "history", "stacks": [verdict + users]}``."""
    rows = []
    for v in verdicts_mod.site_verdicts(site, runs):
        rows.append({**v.to_dict(), "users_30d": None if users is None else users.get(v.stack, 0)})
    return {"site": site.name, "generated": history.now_iso(), "history": history.history_path(site),
            "stacks": rows}


def print_table(doc: dict, file=None) -> None:
    """The table of :func:`status_document` (rich), or a line saying there is no history."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    if not doc["stacks"]:
        console.print(f"no validation recorded for site {doc['site']} ({doc['history']})", markup=False)
        return
    table = Table(title=f"hpcstack status: {doc['site']}")
    for column in ("stack", "tier", "verdict", "last run", "trend", "since"):
        table.add_column(column, no_wrap=column in ("stack", "verdict"))
    colours = {"OK": "green", "DEGRADED": "yellow", "FAILED": "red", "NOT-RUN": "magenta"}
    for row in doc["stacks"]:
        table.add_row(row["stack"], row["tier"], f"[{colours[row['verdict']]}]{row['verdict']}[/]",
                      _short(row["last_run"]), row["trend"] or "-", _short(row["since"]))
    console.print(table)
    for row in doc["stacks"]:
        if row["verdict"] in ("DEGRADED", "FAILED"):
            v = verdicts_mod.StackVerdict(**{k: row[k] for k in ("stack", "tier", "verdict", "since", "last_ok",
                                                                  "changed", "reasons")})
            for line in v.lines():
                console.print(line, markup=False, highlight=False)


def _short(when: str | None) -> str:
    """``2026-01-05T12:00:00+00:00`` -> ``2026-01-05 12:00`` (UTC); ``-`` for None."""
    return when[:16].replace("T", " ") if when else "-"


def _when(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _changes(runs: list) -> list[tuple[datetime.datetime, str]]:
    """Runs whose fingerprint differs from the run before (nodes aside): (time, first change)."""
    from hpcstack.validate.fingerprint import diff

    out, before = [], None
    for run in runs:
        if not any(run.fingerprint.get(k) is not None for k in KEYS):
            continue
        if before is not None:
            lines = [line for line in diff(before.fingerprint, run.fingerprint)
                     if line.split(" ", 2)[1].rstrip(":") not in UNMARKED]
            if lines:
                out.append((_when(run.started), lines[0]))
        before = run
    return out


def _matplotlib():
    """matplotlib, imported with nothing of the caller's (status runs as root, from whatever
    directory and environment the admin's shell has).

    At import matplotlib reads the first ``matplotlibrc`` of: the working directory,
    ``$MATPLOTLIBRC``, ``$MPLCONFIGDIR`` (else ``$XDG_CONFIG_HOME``, ``~/.config``), its own; and
    it keeps its font cache in ``$MPLCONFIGDIR`` (else ``$XDG_CACHE_HOME``, ``~/.cache``): the
    font files that cache names are opened. A user's ``./matplotlibrc`` in root's working
    directory (``savefig.dpi: 9000``; ``text.usetex``; ``text.latex.preamble``) or a font cache
    in a directory of theirs would be root's. So, when this process has not imported it yet:
    ``MATPLOTLIBRC`` is removed, ``MPLCONFIGDIR`` is a new private directory (``mkdtemp``, 0700,
    root's; removed at exit: the font cache is rebuilt, about two seconds) and the import runs
    in ``/`` (root's), then the working directory is restored. :func:`plot` then draws under
    matplotlib's own defaults whatever was read (``rc_context(rcParamsDefault)``), also where
    matplotlib was imported before (a test, a library)."""
    if "matplotlib" not in sys.modules:
        import atexit
        import shutil
        import tempfile

        os.environ.pop("MATPLOTLIBRC", None)
        private = tempfile.mkdtemp(prefix="hpcstack-matplotlib-")
        atexit.register(shutil.rmtree, private, True)
        os.environ["MPLCONFIGDIR"] = private
        try:
            here = os.getcwd()
        except OSError:
            here = None
        os.chdir("/")
        try:
            import matplotlib
        finally:
            if here is not None:
                try:
                    os.chdir(here)
                except OSError:
                    pass                # gone meanwhile: stay in /
    import matplotlib

    matplotlib.use("Agg")
    return matplotlib


def plot(runs: list, figure: str) -> bytes:
    """One PNG: ``figure`` (``throughput_total`` or ``startup_s``) of a stack's runs over time, a
    line per backend and node count (the median of each run's sample), the reference band of
    each (throughput, from the latest report), the fingerprint changes as vertical lines; drawn
    under matplotlib's defaults only (:func:`_matplotlib`: no ``matplotlibrc`` of the caller's)."""
    matplotlib = _matplotlib()
    defaults = {k: v for k, v in matplotlib.rcParamsDefault.items() if k != "backend"}
    with matplotlib.rc_context(rc=defaults):
        return _plot(runs, figure)


def _plot(runs: list, figure: str) -> bytes:
    """:func:`plot`, under the defaults."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2), dpi=90)
    ax = fig.add_subplot()
    keys = sorted({k for r in runs for k in r.sample})
    for key in keys:
        points = [(_when(r.started), statistics.median(v)) for r in runs if r.state == "OK"
                  if (v := [x for x in (r.sample.get(key) or {}).get(figure) or [] if isinstance(x, (int, float))])]
        if points:
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=key)
            band = _band(runs, key) if figure == "throughput_total" else None
            if band:
                ax.axhspan(band[0], band[1], color=line.get_color(), alpha=0.12)
    for when, what in _changes(runs):
        ax.axvline(when, color="grey", linestyle="--", linewidth=1)
        ax.annotate(what[:40], (when, 1), xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                    va="top", ha="right", color="grey")
    ax.set_ylabel("img/s (total)" if figure == "throughput_total" else "start-up to first step (s)")
    ax.set_title("throughput per node count" if figure == "throughput_total" else "start-up per node count")
    if keys:
        ax.legend(fontsize=7, loc="lower left")
    fig.autofmt_xdate()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _band(runs: list, key: str) -> tuple[float, float] | None:
    """The throughput reference's band for ``<backend>:<nodes>`` in the latest report that has one:
    its bounds, an open side ending at the reference value (a lower tolerance alone: the band
    from the lowest accepted to the reference)."""
    backend, _, nodes = key.rpartition(":")
    for run in reversed(runs):
        for entry in run.report.get("runs") or []:
            if entry.get("backend") == backend and str(entry.get("nodes")) == nodes:
                bounds = ((entry.get("figures") or {}).get("throughput_total") or {}).get("bounds")
                if isinstance(bounds, list) and len(bounds) == 2:
                    low, high = bounds
                    ref = ((entry.get("figures") or {}).get("throughput_total") or {}).get("reference") or [None]
                    value = ref[0] if isinstance(ref[0], (int, float)) else None
                    if low is None and high is None:
                        return None
                    # an open side is drawn up to (down to) the reference value itself
                    low = float(low) if low is not None else float(value if value is not None else 0.0)
                    high = float(high) if high is not None else float(value if value is not None else low)
                    return (low, high) if high > low else (low, low * 1.001 + 1e-9)
    return None


def write_html(site, directory: str, doc: dict, runs: list, pol=None) -> list[str]:
    """Write ``<site>.html``, ``<site>.json`` and each stack's two plots into ``directory``
    (made if missing) through the gate; return the paths written."""
    from hpcstack.templates import render

    real = gate.resolved(os.path.abspath(directory), pol)
    gate.mkdir(real, 0o755, parents=True, exact=False, pol=pol)
    written = []

    def put(name: str, data) -> str:
        gate.write_atomic(os.path.join(real, name), data, 0o644, pol=pol)
        written.append(os.path.join(directory, name))
        return name

    stacks = []
    for stack in sorted({r["stack"] for r in doc["stacks"]}):
        mine = sorted((r for r in runs if r.stack == stack), key=lambda r: (r.started, r.id))
        images = [{"src": put(f"{slug(site.name)}-{slug(stack)}-{kind}.png", plot(mine, figure)), "alt": f"{stack}: {kind}"}
                  for kind, figure in (("throughput", "throughput_total"), ("startup", "startup_s"))]
        stacks.append({"name": stack, "rows": [r for r in doc["stacks"] if r["stack"] == stack], "images": images,
                       "users": next((r["users_30d"] for r in doc["stacks"] if r["stack"] == stack), None)})
    json_name = put(f"{slug(site.name)}.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")
    page = render("templates/status.html.j2", site=site.name, generated=doc["generated"], stacks=stacks,
                  json_name=json_name, usage_days=USAGE_DAYS)
    put(f"{slug(site.name)}.html", page)
    return written


def _missed_and_status_file(site, runs: list, pol) -> list:
    """As root: record the scheduled tiers' missed slots as NOT-RUN
    (:func:`hpcstack.validate.schedule.record_missed_for_site`) and rewrite the status file that
    ``module load`` reads (:mod:`hpcstack.validate.statusfile`); return the runs, re-read when
    slots were recorded. A failure is one warning line."""
    from hpcstack.validate import schedule, statusfile

    try:
        missed = schedule.record_missed_for_site(site, pol=pol)
        for line in missed:
            print(line, file=sys.stderr)
        if missed:
            runs = history.read_runs(history.history_path(site), pol)
        statusfile.write_status_file(site, runs, pol)
    except (HpcstackError, OSError, history.sqlite3.Error) as exc:
        print(f"warning: missed slots or the status file: {exc}", file=sys.stderr)
    return runs


def cmd_status(args, session) -> int:
    """``hpcstack status``: print the table (or JSON); with ``--html`` and ``--reframe-refs``,
    write the page and the references too.

    Raises:
        ConfigError: a directory or file the gate refuses (one line).
        HpcstackError: the history cannot be read.
    """
    site = session.site
    path = history.history_path(site)
    try:
        runs = history.read_runs(path, session.policy)
    except gate.GateError as exc:
        raise ConfigError([f"history: {exc}"]) from None
    except (OSError, history.sqlite3.Error) as exc:
        raise HpcstackError(f"cannot read the validation history {path}: {exc}") from None
    runs = _missed_and_status_file(site, runs, session.policy)
    doc = status_document(site, runs, users_per_stack(site))
    try:
        if args.html:
            for written in write_html(site, args.html, doc, runs, session.policy):
                print(f"wrote {written}", file=sys.stderr)
        if args.reframe_refs:
            target = os.path.abspath(args.reframe_refs)
            real = os.path.join(gate.resolved(os.path.dirname(target), session.policy), os.path.basename(target))
            gate.write_atomic(real, verdicts_mod.reframe_yaml(runs, site.name), 0o644, pol=session.policy)
            print(f"wrote {args.reframe_refs}", file=sys.stderr)
    except gate.GateError as exc:
        raise ConfigError([f"{'--html' if args.html else '--reframe-refs'}: {exc}"]) from None
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        print_table(doc)
    return 0
