"""Verdicts from the history: OK / DEGRADED / FAILED / NOT-RUN per stack and tier.

The rules, applied to the runs of one stack in one tier (:mod:`hpcstack.validate.history`),
the latest run first:

* **NOT-RUN**: the latest run did not run (a missed slot, a node down, a full queue, or jobs
  that never started). It stays NOT-RUN, never a pass, whatever ran before; the verdict says
  since when and when the last OK run was.
* **FAILED**: the latest run failed: sanity or arithmetic wrong, or a figure outside its
  reference's tolerance (the report's ``failures``, one reason each).
* **DEGRADED**: the latest run passed, but its sample is slower than the install's baseline
  sample (the latest ``install``-tier OK run of the stack; without one, the tier's first OK run):
  for some backend and node count, a one-sided Mann-Whitney U test of the recent run's
  per-round throughput against the baseline's (``scipy.stats.mannwhitneyu(recent, baseline,
  alternative="less")``) gives ``p < ALPHA`` (0.01) **and** the recent median is at least
  :data:`MIN_DROP` (5 %) below the baseline's. The second condition is hpcstack's: with enough
  rounds the test alone flags any consistent shift, however small, and a few percent is the
  noise of a shared file system or a busy network. Start-up (each rank's time to its first
  step) is judged the same way, ``alternative="greater"``, with a rise of at least
  :data:`MIN_STARTUP_RISE` (25 %). The date of the shift comes from change-point detection
  on the runs' rounds in time order (PELT, ``ruptures.Pelt(model="l2")``, penalty
  ``3 log n`` on the series standardised by the baseline's spread): the first run of the
  last stretch of segments that sit below the baseline.
* **OK** otherwise.

Every DEGRADED or FAILED verdict starts with **what changed since the last OK run**: the
fingerprint diff (:func:`hpcstack.validate.fingerprint.diff`) from the last OK run before the
shift (DEGRADED) or before the failure (FAILED) to the latest run.

Sources: H. B. Mann and D. R. Whitney, "On a test of whether one of two random variables is
stochastically larger than the other", Ann. Math. Statist. 18 (1947) 50-60; SciPy's
``mannwhitneyu`` (https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.mannwhitneyu.html);
R. Killick, P. Fearnhead, I. A. Eckley, "Optimal detection of changepoints with a linear
computational cost", JASA 107 (2012) 1590-1598; ruptures' PELT and its ``l2`` cost
(https://centre-borelli.github.io/ruptures-docs/user-guide/detection/pelt/,
https://centre-borelli.github.io/ruptures-docs/user-guide/costs/costl2/).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from hpcstack.validate.fingerprint import diff
from hpcstack.validate.history import Run

#: The one-sided Mann-Whitney test's level.
ALPHA = 0.01
#: The smallest drop of the median throughput that counts as DEGRADED (a fraction).
MIN_DROP = 0.05
#: The smallest rise of the median start-up that counts as DEGRADED (a fraction).
MIN_STARTUP_RISE = 0.25
#: The verdicts, worst first (the order of a summary).
VERDICTS = ("FAILED", "DEGRADED", "NOT-RUN", "OK")


@dataclass(frozen=True)
class Shift:
    """One figure of one backend and node count that moved the wrong way.

    Attributes:
        key (str): ``<backend>:<nodes>``; figure (str): ``throughput_total`` or ``startup_s``.
        p_value (float): the Mann-Whitney test's p.
        ratio (float): recent median / baseline median.
    """

    key: str
    figure: str
    p_value: float
    ratio: float

    def line(self) -> str:
        what = "throughput" if self.figure == "throughput_total" else "start-up"
        return (f"{what} on {self.key}: median {100 * (self.ratio - 1):+.1f}% against the baseline "
                f"(Mann-Whitney p = {self.p_value:.2g})")


@dataclass
class StackVerdict:
    """The verdict of one stack in one tier.

    Attributes:
        stack (str), tier (str), verdict (str): one of :data:`VERDICTS`.
        last_run (str | None): when the latest run started; last_ok (str | None): the last OK run.
        since (str | None): when the verdict began (the shift's date for DEGRADED).
        changed (list[str]): what changed since the last OK run (DEGRADED, FAILED).
        reasons (list[str]): why (the failures, the shifts, why it did not run).
        trend (str): the worst figure's median against the baseline (``-19.8% horovod:2``).
        run_id (int | None): the latest run's row.
        shifts (list[Shift]): the figures that moved.
    """

    stack: str
    tier: str
    verdict: str
    last_run: str | None = None
    last_ok: str | None = None
    since: str | None = None
    changed: list = field(default_factory=list)
    reasons: list = field(default_factory=list)
    trend: str = ""
    run_id: int | None = None
    shifts: list = field(default_factory=list)

    def lines(self) -> list[str]:
        """The verdict as text: what changed first (DEGRADED, FAILED), then why."""
        head = [f"{self.stack} [{self.tier}]: {self.verdict}" + (f" since {self.since}" if self.since else "")]
        if self.verdict in ("DEGRADED", "FAILED"):
            head += ["  what changed since the last OK run"
                     + (f" ({self.last_ok})" if self.last_ok else "") + ":"]
            head += [f"    {line}" for line in self.changed]
        return head + [f"  {line}" for line in self.reasons]

    def to_dict(self) -> dict:
        """As JSON (``changed`` before ``reasons``)."""
        return {"stack": self.stack, "tier": self.tier, "verdict": self.verdict, "since": self.since,
                "last_run": self.last_run, "last_ok": self.last_ok, "changed": list(self.changed),
                "reasons": list(self.reasons), "trend": self.trend, "run_id": self.run_id,
                "shifts": [{"key": s.key, "figure": s.figure, "p_value": s.p_value, "ratio": s.ratio}
                           for s in self.shifts]}


def _values(run: Run, key: str, figure: str) -> list[float]:
    entry = run.sample.get(key) or {}
    return [float(v) for v in entry.get(figure) or [] if isinstance(v, (int, float)) and math.isfinite(v)]


def shifts(baseline: Run, recent: Run, alpha: float = ALPHA, min_drop: float = MIN_DROP,
           min_startup_rise: float = MIN_STARTUP_RISE) -> list[Shift]:
    """The figures of ``recent`` that are worse than ``baseline``'s by the rule of this module
    (throughput lower, start-up higher), per backend and node count both samples hold."""
    from scipy.stats import mannwhitneyu

    out = []
    for key in sorted(set(baseline.sample) & set(recent.sample)):
        for figure, alternative, bound in (("throughput_total", "less", 1 - min_drop),
                                           ("startup_s", "greater", 1 + min_startup_rise)):
            base, now = _values(baseline, key, figure), _values(recent, key, figure)
            if not base or not now or statistics.median(base) <= 0:
                continue
            ratio = statistics.median(now) / statistics.median(base)
            p = float(mannwhitneyu(now, base, alternative=alternative).pvalue)
            worse = ratio <= bound if alternative == "less" else ratio >= bound
            if p < alpha and worse:
                out.append(Shift(key, figure, p, ratio))
    return out


def change_run(ok_runs: list[Run], baseline: Run, shift: Shift, min_drop: float = MIN_DROP,
               min_startup_rise: float = MIN_STARTUP_RISE) -> Run | None:
    """The first run of the shift: PELT (``ruptures``, ``l2`` cost) on the rounds of
    ``ok_runs`` (oldest first, the baseline among them or before them) in time order; of the
    segments, the last stretch whose mean lies beyond the baseline by the rule's margin starts
    at the shift. None when there is nothing to segment."""
    import numpy as np
    import ruptures

    base = _values(baseline, shift.key, shift.figure)
    series, owner = [], []
    for i, run in enumerate(ok_runs):
        values = _values(run, shift.key, shift.figure)
        series += values
        owner += [i] * len(values)
    if len(series) < 2 or not base:
        return None
    centre = statistics.median(base)
    spread = max(statistics.pstdev(base) if len(base) > 1 else 0.0, 0.01 * abs(centre), 1e-12)
    signal = (np.asarray(series, dtype=float) - centre) / spread
    ends = ruptures.Pelt(model="l2", min_size=1, jump=1).fit(signal.reshape(-1, 1)).predict(
        pen=3 * math.log(len(series)))
    worse = (lambda m: m <= centre * (1 - min_drop)) if shift.figure == "throughput_total" \
        else (lambda m: m >= centre * (1 + min_startup_rise))
    start, first = 0, None
    for end in ends:
        segment = series[start:end]
        if segment and worse(statistics.fmean(segment)):
            first = start if first is None else first
        else:
            first = None
        start = end
    return ok_runs[owner[first]] if first is not None else None


def workload_of(run: Run) -> str | None:
    """The named workload a run trained (its report's ``settings.workload``, written where the
    run named one: :func:`hpcstack.validate.settings.settings_record`; None: the site's own, as
    an install's validation runs it)."""
    settings = (run.report or {}).get("settings") if isinstance(run.report, dict) else None
    name = settings.get("workload") if isinstance(settings, dict) else None
    return name if isinstance(name, str) else None


def baseline_of(stack_runs: list[Run], tier_runs: list[Run]) -> Run | None:
    """The install's baseline: the latest OK ``install`` run of the stack that trained the same
    workload as the tier's latest run; else the tier's first OK run (a smoke or probe tier with
    a workload of its own is compared with itself, never with another workload's figures)."""
    wanted = workload_of(tier_runs[-1]) if tier_runs else None
    installs = [r for r in stack_runs if r.tier == "install" and r.state == "OK" and workload_of(r) == wanted]
    if installs:
        return installs[-1]
    return next((r for r in tier_runs if r.state == "OK" and workload_of(r) == wanted), None)


def _changed(last_ok: Run | None, latest: Run) -> list[str]:
    if last_ok is None:
        return ["no OK run before it to compare with"]
    if not any(v is not None for v in latest.fingerprint.values()):
        return ["the run left no fingerprint"]
    return diff(last_ok.fingerprint, latest.fingerprint) or ["nothing in the fingerprint changed"]


def _trend(baseline: Run | None, latest_ok: Run | None) -> str:
    """The worst throughput median of ``latest_ok`` against the baseline's, e.g. ``-19.8% ddp:2``."""
    if baseline is None or latest_ok is None:
        return ""
    worst = None
    for key in sorted(set(baseline.sample) & set(latest_ok.sample)):
        base, now = _values(baseline, key, "throughput_total"), _values(latest_ok, key, "throughput_total")
        if base and now and statistics.median(base) > 0:
            ratio = statistics.median(now) / statistics.median(base)
            if worst is None or ratio < worst[0]:
                worst = (ratio, key)
    return f"{100 * (worst[0] - 1):+.1f}% {worst[1]}" if worst else ""


def verdict_of(stack_runs: list[Run], stack: str, tier: str, alpha: float = ALPHA,
               min_drop: float = MIN_DROP, min_startup_rise: float = MIN_STARTUP_RISE) -> StackVerdict:
    """The verdict of ``stack`` in ``tier`` from every run of the stack (oldest first, all
    tiers: the baseline may be of the install tier)."""
    tier_runs = [r for r in stack_runs if r.tier == tier]
    if not tier_runs:
        return StackVerdict(stack, tier, "NOT-RUN", reasons=["no run recorded"])
    latest = tier_runs[-1]
    oks = [r for r in tier_runs if r.state == "OK"]
    baseline = baseline_of(stack_runs, tier_runs)
    out = StackVerdict(stack, tier, "OK", last_run=latest.started, run_id=latest.id,
                       last_ok=oks[-1].started if oks else None, trend=_trend(baseline, oks[-1] if oks else None))
    if latest.state != "OK":
        streak = latest
        for r in reversed(tier_runs):
            if r.state != latest.state:
                break
            streak = r
        out.verdict, out.since = latest.state, streak.started
        out.reasons = [line for line in latest.reason.splitlines() if line] or [latest.state.lower()]
        if latest.state == "FAILED":
            before = [r for r in stack_runs if r.state == "OK" and (r.started, r.id) < (latest.started, latest.id)]
            same = [r for r in before if r.tier == tier]
            out.changed = _changed((same or before or [None])[-1], latest)
        return out
    if baseline is None or baseline.id == latest.id:
        return out
    moved = shifts(baseline, latest, alpha, min_drop, min_startup_rise)
    if not moved:
        return out
    series = [baseline] + [r for r in oks if (r.started, r.id) > (baseline.started, baseline.id)
                           and workload_of(r) == workload_of(baseline)]
    first = change_run(series, baseline, moved[0], min_drop, min_startup_rise) or latest
    earlier = [r for r in series if (r.started, r.id) < (first.started, first.id)]
    last_good = earlier[-1] if earlier else baseline
    out.verdict, out.since, out.shifts = "DEGRADED", first.started, moved
    out.last_ok = last_good.started
    out.changed = _changed(last_good, latest)
    out.reasons = [s.line() for s in moved]
    return out


def margins_of(site) -> dict:
    """The site's ``revalidation.degraded`` as :func:`verdicts`' keyword arguments
    (``min_drop``, ``min_startup_rise``; this module's defaults where it says nothing)."""
    from hpcstack.site import revalidation_of

    raw = revalidation_of(site).get("degraded") or {}
    return {"min_drop": float(raw.get("throughput_drop", MIN_DROP)),
            "min_startup_rise": float(raw.get("startup_rise", MIN_STARTUP_RISE))}


def site_verdicts(site, all_runs: list[Run]) -> list[StackVerdict]:
    """:func:`verdicts` with the site's margins (:func:`margins_of`)."""
    return verdicts(all_runs, **margins_of(site))


def verdicts(all_runs: list[Run], alpha: float = ALPHA, min_drop: float = MIN_DROP,
             min_startup_rise: float = MIN_STARTUP_RISE) -> list[StackVerdict]:
    """Every stack's verdict in every tier it has runs in, sorted by stack then tier order."""
    from hpcstack.validate.history import TIERS

    by_stack: dict[str, list[Run]] = {}
    for run in all_runs:
        by_stack.setdefault(run.stack, []).append(run)
    out = []
    for stack in sorted(by_stack):
        runs = sorted(by_stack[stack], key=lambda r: (r.started, r.id))
        for tier in sorted({r.tier for r in runs}, key=TIERS.index):
            out.append(verdict_of(runs, stack, tier, alpha, min_drop, min_startup_rise))
    return out


def reframe_references(all_runs: list[Run]) -> dict:
    """The performance references of each stack's latest report, as ReFrame keeps them:
    ``{stack: {"<site>:<partition>": {nodes: {figure: [value, lower, upper, unit]}}}}``
    (:attr:`reframe.core.pipeline.RegressionTest.reference`, per node count as the check
    ``hpcstack validate --emit reframe`` writes looks them up)."""
    out: dict = {}
    for run in sorted(all_runs, key=lambda r: (r.started, r.id)):
        system = run.report.get("system")
        refs: dict = {}
        for entry in run.report.get("runs") or []:
            for name, figure in (entry.get("figures") or {}).items():
                ref = figure.get("reference")
                if isinstance(ref, list) and len(ref) == 4:
                    refs.setdefault(int(entry.get("nodes") or 0), {})[name] = list(ref)
        if system and refs:
            out[run.stack] = {system: {n: refs[n] for n in sorted(refs)}}
    return out


def reframe_yaml(all_runs: list[Run], site: str) -> str:
    """:func:`reframe_references` as YAML, with a header saying where it came from."""
    import yaml

    head = (f"# ReFrame performance references of site {site}, from hpcstack's validation history\n"
            "# (hpcstack status --reframe-refs): stack -> system -> node count -> figure ->\n"
            "# [value, lower, upper, unit], tolerances relative to the value, as ReFrame's `reference`.\n")
    return head + yaml.safe_dump(reframe_references(all_runs), sort_keys=True, default_flow_style=None)
