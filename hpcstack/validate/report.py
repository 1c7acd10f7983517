"""Judge validation runs the way ReFrame judges a regression test: sanity first, then performance.

A *run* is one backend (``horovod`` or ``ddp``) of the training program in one Slurm job on N
nodes. Its **sanity** comes from the job (it must end COMPLETED, or at least this backend must have
finished with exit status 0), from the program's own checks (its ``result`` record: the loss fell
below the threshold, parameters identical on all ranks) and from the ranks it ran on. Its
**performance figures** are

* ``throughput_total`` (img/s): the sum over ranks of each rank's mean img/s;
* ``throughput_per_rank`` (img/s): ``throughput_total / ranks`` (per GPU on GPU sites);
* ``scaling_efficiency`` (fraction): ``throughput_total(N) / (N * throughput_total(1))``, against
  the 1-node run of the same backend in the same validation (absent without a 1-node run).

Each figure is compared with the site's **performance references**, kept as data in the site
config (``references:``), in ReFrame's form ``(value, lower, upper, unit)`` with tolerances relative
to the value (``lower=-0.1`` allows 10 % below; ``None`` means unbounded). References are looked up
per ``"<site>:<partition>"`` and node count, with ``*`` for any (see :func:`lookup_references`).

The report is a JSON document, a markdown table and a PNG plot of img/s against nodes with the
ideal line ``N * throughput_total(1)`` (:func:`write_report`).

Sources: ReFrame's ``reference`` / ``@performance_function`` / ``@sanity_function``
(https://reframe-hpc.readthedocs.io/en/stable/regression_test_api.html); Horovod's definition of
scaling efficiency (https://horovod.readthedocs.io/en/stable/benchmarks_include.html).

Only the standard library is imported at module level (matplotlib only when plotting), so that
:mod:`hpcstack.site` can import :data:`FIGURES` cheaply.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

#: Figures a reference can name, with their units. ``scaling_efficiency`` is a fraction (0.9 = 90 %).
FIGURES = {"throughput_total": "img/s", "throughput_per_rank": "img/s", "scaling_efficiency": ""}


@dataclass(frozen=True)
class Reference:
    """A performance reference ``(value, lower, upper, unit)``, ReFrame style.

    Args:
        value (float): the expected figure, in ``unit``.
        lower (float | None): relative lower tolerance, ``<= 0`` (``-0.1``: at least 90 % of the
            value); None: no lower bound.
        upper (float | None): relative upper tolerance, ``>= 0``; None: no upper bound.
        unit (str): e.g. ``img/s``; empty for a fraction.

    Example:
        >>> Reference(300.0, -0.1, None, "img/s").bounds()
        (270.0, None)
    """

    value: float
    lower: float | None
    upper: float | None
    unit: str

    @classmethod
    def from_data(cls, item) -> "Reference":
        """Build from the site config's ``[value, lower, upper, unit]`` list (already validated)."""
        value, lower, upper, unit = item
        return cls(float(value), None if lower is None else float(lower),
                   None if upper is None else float(upper), str(unit))

    def bounds(self) -> tuple[float | None, float | None]:
        """Return the absolute ``(low, high)`` bounds; None where unbounded."""
        low = None if self.lower is None else self.value * (1 + self.lower)
        high = None if self.upper is None else self.value * (1 + self.upper)
        return low, high

    def check(self, name: str, measured: float) -> str | None:
        """Compare a measured figure with this reference.

        Args:
            name (str): the figure's name, for the message.
            measured (float): the measured value, in ``unit``.

        Returns:
            str | None: None within bounds, else which bound it missed and by how much, e.g.
            ``"throughput_per_rank 120.3 img/s is 29.7 img/s (19.8 %) below the lower bound
            150.0 img/s (reference 300.0 img/s, -50 %)"``.
        """
        low, high = self.bounds()
        if not math.isfinite(measured):
            return f"{name} is {measured}"
        if low is not None and measured < low:
            return self._miss(name, measured, low, "below the lower", self.lower)
        if high is not None and measured > high:
            return self._miss(name, measured, high, "above the upper", self.upper)
        return None

    def _miss(self, name: str, measured: float, bound: float, where: str, tol: float) -> str:
        by = abs(measured - bound)
        rel = f" ({100 * by / bound:.1f} %)" if bound else ""
        return (f"{name} {fmt(measured, self.unit)} is {fmt(by, self.unit)}{rel} {where} bound "
                f"{fmt(bound, self.unit)} (reference {fmt(self.value, self.unit)}, {100 * tol:+.0f} %)")


def fmt(value: float | None, unit: str) -> str:
    """Format a figure with its unit (fractions as fractions: ``0.873``)."""
    if value is None:
        return "n/a"
    if not unit:
        return f"{value:.3f}"
    return f"{value:.1f} {unit}"


def lookup_references(references: dict, site: str, partition: str, nodes: int) -> dict[str, Reference]:
    """Return the references that apply to ``nodes`` nodes of ``site:partition``.

    Systems are tried from the most general to the most specific — ``*:*``, ``*:<partition>``,
    ``<site>:*``, ``<site>:<partition>`` — and within each, node count ``"*"`` then ``"<nodes>"``;
    a later (more specific) entry replaces an earlier one figure by figure.

    Args:
        references (dict): the site config's ``references`` section (node keys as strings).
        site (str): the site's name.
        partition (str): the Slurm partition the jobs ran in.
        nodes (int): node count.

    Returns:
        dict[str, Reference]: figure name -> reference.
    """
    found: dict[str, Reference] = {}
    for system in ("*:*", f"*:{partition}", f"{site}:*", f"{site}:{partition}"):
        per_nodes = references.get(system) or {}
        for key in ("*", str(nodes)):
            for name, item in (per_nodes.get(key) or {}).items():
                found[name] = Reference.from_data(item)
    return found


@dataclass
class RunOutcome:
    """What one backend's run in one job left behind, as input to :func:`build_report`.

    Args:
        backend (str): ``horovod`` or ``ddp``.
        nodes (int): the job's node count.
        ranks (int): ranks expected (nodes x tasks per node).
        job_id (str | None): Slurm job id (None for a job that was never submitted).
        job_state (str): the job's final ``JobState`` (``COMPLETED``, ``FAILED``, ``TIMEOUT``, ...).
        job_exit_code (str): the job's ``ExitCode`` (``status:signal``).
        exit_status (int | None): this backend's own exit status, as the job script recorded it;
            None when the job ended before the backend finished.
        records (list[dict]): the training program's JSON-lines records.
        output (str | None): path of the job's output file.
        output_tail (list[str]): its last lines.
    """

    backend: str
    nodes: int
    ranks: int
    job_id: str | None
    job_state: str
    job_exit_code: str
    exit_status: int | None
    records: list[dict] = field(default_factory=list)
    output: str | None = None
    output_tail: list[str] = field(default_factory=list)


def measured_figures(records: list[dict]) -> dict[str, float]:
    """Extract ``throughput_total`` and ``throughput_per_rank`` (img/s) from a run's records.

    Args:
        records (list[dict]): the training program's records (``throughput_total`` record:
            ``img_per_sec`` and ``world_size``).

    Returns:
        dict[str, float]: the figures found (empty when the benchmark did not report).
    """
    total = next((r for r in records if r.get("record") == "throughput_total"), None)
    if not total:
        return {}
    figures = {"throughput_total": float(total["img_per_sec"])}
    if total.get("world_size"):
        figures["throughput_per_rank"] = float(total["img_per_sec"]) / int(total["world_size"])
    return figures


def scaling_efficiency(throughput_n: float, throughput_1: float, nodes: int) -> float:
    """Scaling efficiency ``throughput(N) / (N * throughput(1))`` (Horovod's definition).

    Args:
        throughput_n (float): total img/s on ``nodes`` nodes.
        throughput_1 (float): total img/s on 1 node (same backend, same sizes).
        nodes (int): N.

    Returns:
        float: the efficiency as a fraction (1.0 = perfect linear scaling).

    Raises:
        ValueError: ``nodes < 1`` or ``throughput_1 <= 0``.
    """
    if nodes < 1 or throughput_1 <= 0:
        raise ValueError(f"scaling efficiency needs nodes >= 1 and throughput(1) > 0 "
                         f"(got {nodes}, {throughput_1})")
    return throughput_n / (nodes * throughput_1)


def sanity_reasons(run: RunOutcome, required_transport: str | None = None) -> list[str]:
    """Why a run fails its sanity checks (empty when it passes).

    Checks, in order: the backend finished (else the job's id, state and exit code are named),
    with exit status 0; its ``result`` record exists and is ok (the training program's own
    reasons are passed on); it ran on the expected number of ranks, and reported the throughput
    of every rank; its transport contains ``required_transport`` (e.g. ``nccl`` on GPU sites).

    Args:
        run (RunOutcome): the run.
        required_transport (str | None): substring the ``config`` record's transport must hold.
    """
    if run.exit_status is None:
        return [f"did not finish: job {run.job_id} ended {run.job_state} "
                f"(exit code {run.job_exit_code})"]
    reasons = []
    if run.exit_status != 0:
        reasons.append(f"exit status {run.exit_status}")
    result = next((r for r in run.records if r.get("record") == "result"), None)
    if result is None:
        reasons.append("no result record in its output (it stopped before the end)")
    elif not result.get("ok"):
        reasons += list(result.get("reasons") or ["result not ok"])
    config = next((r for r in run.records if r.get("record") == "config"), None)
    if config is not None and config.get("world_size") != run.ranks:
        reasons.append(f"ran on {config.get('world_size')} ranks, expected {run.ranks}")
    per_rank = {r.get("rank") for r in run.records if r.get("record") == "throughput"}
    if result is not None and per_rank != set(range(run.ranks)):
        reasons.append(f"throughput reported for ranks {sorted(per_rank)}, expected 0..{run.ranks - 1}")
    if required_transport and config is not None and required_transport not in str(config.get("transport")):
        reasons.append(f"transport {config.get('transport')!r} does not use {required_transport}")
    return reasons


def build_report(runs: list[RunOutcome], *, site: str, partition: str, recipe: str,
                 references: dict, required_transport: str | None = None,
                 output_dir: str | None = None, jobs: list[dict] | None = None,
                 settings: dict | None = None) -> dict:
    """Judge every run and assemble the report.

    Args:
        runs (list[RunOutcome]): one per backend and node count.
        site (str): site name; partition (str): the partition the jobs ran in.
        recipe (str): ``name/version`` of the stack.
        references (dict): the site's ``references`` section.
        required_transport (str | None): see :func:`sanity_reasons`.
        output_dir (str | None): where the jobs wrote their output (recorded).
        jobs (list[dict] | None): per job: ``job_id``, ``nodes``, ``state``, ``exit_code``,
            ``output``, ``output_tail``, ``elapsed``; recorded, and failed jobs are named.
        settings (dict | None): model, batch size etc., recorded as they were.

    Returns:
        dict: ``{"ok", "site", "system", "recipe", "generated", "output_dir", "settings",
        "jobs", "runs", "scaling", "failures"}``; ``runs[i]["figures"][name]`` holds ``value``,
        ``unit``, ``reference``, ``bounds``, ``ok`` (None when there is no reference) and
        ``message``; ``failures`` has one line per failed check, naming the backend, node
        count and figure.
    """
    system = f"{site}:{partition}"
    failures: list[str] = []
    for job in jobs or []:
        if job.get("state") != "COMPLETED":
            failures.append(f"job {job.get('job_id')} ({job.get('nodes')} node(s)) ended "
                            f"{job.get('state')} with exit code {job.get('exit_code')}; see "
                            f"{job.get('output')}")

    judged = []
    throughput_1 = {r.backend: measured_figures(r.records).get("throughput_total")
                    for r in runs if r.nodes == 1}
    for run in sorted(runs, key=lambda r: (r.backend, r.nodes)):
        reasons = sanity_reasons(run, required_transport)
        values = measured_figures(run.records) if not reasons else {}
        base = throughput_1.get(run.backend)
        if values and base:
            values["scaling_efficiency"] = scaling_efficiency(values["throughput_total"], base, run.nodes)
        refs = lookup_references(references, site, partition, run.nodes)
        figures = {}
        for name in FIGURES:
            ref = refs.get(name)
            value = values.get(name)
            entry = {"value": value, "unit": FIGURES[name], "ok": None, "message": None,
                     "reference": None, "bounds": None}
            if ref is not None:
                entry["reference"] = [ref.value, ref.lower, ref.upper, ref.unit]
                entry["bounds"] = list(ref.bounds())
                if value is None:
                    entry["message"] = ("not measured: sanity failed" if reasons else
                                        "not measured: needs a 1-node run of the same backend"
                                        if name == "scaling_efficiency" else "not measured")
                else:
                    entry["message"] = ref.check(name, value)
                    entry["ok"] = entry["message"] is None
            figures[name] = entry
        where = f"{run.backend} on {run.nodes} node(s) (job {run.job_id})"
        failures += [f"sanity: {where}: {reason}" for reason in reasons]
        failures += [f"performance: {where}: {f['message']}" for f in figures.values() if f["ok"] is False]
        config = next((r for r in run.records if r.get("record") == "config"), {})
        judged.append({
            "backend": run.backend, "nodes": run.nodes, "ranks": run.ranks, "job_id": run.job_id,
            "job_state": run.job_state, "exit_status": run.exit_status,
            "transport": config.get("transport"),
            "ok": not reasons and all(f["ok"] is not False for f in figures.values()),
            "sanity": reasons, "figures": figures,
            "throughput_total_ci95": next((r.get("img_per_sec_ci95") for r in run.records
                                           if r.get("record") == "throughput_total"), None),
        })
    scaling: dict[str, dict[str, dict]] = {}
    for r in judged:
        total = r["figures"]["throughput_total"]["value"]
        if total is not None:
            scaling.setdefault(r["backend"], {})[str(r["nodes"])] = {
                "img_per_sec": total, "efficiency": r["figures"]["scaling_efficiency"]["value"]}
    return {
        "ok": not failures and bool(judged) and all(r["ok"] for r in judged),
        "site": site, "system": system, "recipe": recipe,
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "output_dir": output_dir, "settings": settings or {}, "jobs": jobs or [],
        "runs": judged, "scaling": scaling, "failures": failures,
    }


def to_markdown(report: dict) -> str:
    """Render the report as markdown: a header, a table of runs, failures, and the verdict.

    Args:
        report (dict): from :func:`build_report`.

    Returns:
        str: markdown text ending with a newline.
    """
    s = report.get("settings") or {}
    lines = [f"# Validation of {report['recipe']} on {report['system']}", ""]
    if s:
        lines += ["Settings: " + ", ".join(f"{k} {v}" for k, v in s.items()), ""]
    lines += ["| backend | nodes | ranks | job | img/s total | img/s per rank | scaling efficiency | sanity | result |",
              "|---|---:|---:|---|---:|---:|---:|---|---|"]
    for r in report["runs"]:
        f = r["figures"]
        eff = f["scaling_efficiency"]["value"]
        cells = [r["backend"], str(r["nodes"]), str(r["ranks"]), str(r["job_id"]),
                 _cell(f["throughput_total"]), _cell(f["throughput_per_rank"]),
                 "n/a" if eff is None else f"{100 * eff:.1f} %" + _mark(f["scaling_efficiency"]),
                 "PASS" if not r["sanity"] else "FAIL", "PASS" if r["ok"] else "FAIL"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    refs = [(r, name, fig) for r in report["runs"] for name, fig in r["figures"].items() if fig["reference"]]
    if refs:
        lines += ["References (value, lower and upper tolerance relative to it):", ""]
        seen = set()
        for r, name, fig in refs:
            key = (r["nodes"], name)
            if key in seen:
                continue
            seen.add(key)
            value, lower, upper, unit = fig["reference"]
            low, high = fig["bounds"]
            tol = ", ".join("unbounded" if t is None else f"{100 * t:+.0f} %" for t in (lower, upper))
            lines.append(f"- {r['nodes']} node(s), {name}: {fmt(value, unit)} ({tol}): accepted "
                         f"{fmt(low, unit) if low is not None else '-inf'} .. "
                         f"{fmt(high, unit) if high is not None else '+inf'}")
        lines.append("")
    if report["failures"]:
        lines += ["Failures:", ""] + [f"- {line}" for line in report["failures"]] + [""]
    for job in report.get("jobs", []):
        if job.get("state") != "COMPLETED" and job.get("output_tail"):
            lines += [f"Last lines of job {job['job_id']} ({job.get('output')}):", "", "```"]
            lines += job["output_tail"] + ["```", ""]
    lines.append(f"**{'PASS' if report['ok'] else 'FAIL'}**")
    return "\n".join(lines) + "\n"


def _cell(fig: dict) -> str:
    return "n/a" if fig["value"] is None else f"{fig['value']:.1f}" + _mark(fig)


def _mark(fig: dict) -> str:
    return {True: " ✓", False: " ✗"}.get(fig["ok"], "")


def plot_scaling(report: dict, path: str | os.PathLike) -> bool:
    """Plot total img/s against node count per backend, with the ideal line ``N * img/s(1)``.

    Args:
        report (dict): from :func:`build_report`.
        path (str | PathLike): the PNG file to write.

    Returns:
        bool: True if written; False when no run reported a throughput (nothing to plot).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scaling = report.get("scaling") or {}
    if not any(scaling.values()):
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
    colours = {"horovod": "tab:blue", "ddp": "tab:orange"}
    all_nodes = {int(n) for points in scaling.values() for n in points} | {
        r["nodes"] for r in report.get("runs", [])}
    top = max(all_nodes)
    for backend, points in sorted(scaling.items()):
        nodes = sorted(int(n) for n in points)
        values = [points[str(n)]["img_per_sec"] for n in nodes]
        colour = colours.get(backend)
        ax.plot(nodes, values, "o-", color=colour, label=f"{backend} (measured)")
        for n, v in zip(nodes, values):
            eff = points[str(n)]["efficiency"]
            if eff is not None and n > 1:
                ax.annotate(f"{100 * eff:.0f} %", (n, v), textcoords="offset points",
                            xytext=(6, -12), fontsize=8, color=colour)
        if "1" in points:
            ax.plot([1, top], [points["1"]["img_per_sec"], top * points["1"]["img_per_sec"]],
                    "--", color=colour, alpha=0.6, label=f"{backend} ideal (N x 1-node)")
    ax.set_xlabel("nodes")
    ax.set_ylabel("img/s (all ranks)")
    ax.set_xticks(sorted(all_nodes))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    settings = report.get("settings") or {}
    model = f", {settings['model']} batch {settings.get('batch_size')}" if settings.get("model") else ""
    ax.set_title(f"{report['recipe']} on {report['system']}{model}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_report(report: dict, directory: str | os.PathLike) -> dict[str, str]:
    """Write ``report.json``, ``report.md`` and ``scaling.png`` into ``directory``.

    Args:
        report (dict): from :func:`build_report`.
        directory (str | PathLike): an existing directory.

    Returns:
        dict[str, str]: ``{"json": path, "markdown": path, "plot": path}`` (no ``plot`` when
        there was nothing to plot).
    """
    d = Path(directory)
    paths = {"json": str(d / "report.json"), "markdown": str(d / "report.md")}
    Path(paths["json"]).write_text(json.dumps(report, indent=1) + "\n")
    Path(paths["markdown"]).write_text(to_markdown(report))
    if plot_scaling(report, d / "scaling.png"):
        paths["plot"] = str(d / "scaling.png")
    return paths
