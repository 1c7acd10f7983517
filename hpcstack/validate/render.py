"""Render a validation: the report document as JSON, markdown and a PNG scaling plot, and
everything ``hpcstack validate`` prints (dry runs, progress, the local run's figures, verdicts):
the runners (:mod:`hpcstack.validate.runner`) print nothing.

Rendering only: the input is the report document that :meth:`hpcstack.validate.judge.Verdict.to_dict`
returns (the ``report.json`` format), so a report can be rendered again from its JSON. Nothing
here judges; :mod:`hpcstack.validate.judge` never calls into this module.

The plot shows total img/s against node count per backend, with the ideal line
``N * throughput_total(1)`` (matplotlib, imported only when plotting), and a caption with each
backend's collectives check (PASS/FAIL, checks, seconds) and, for the digits workload, the test
accuracy per node count (also next to each point). The markdown has a table of runs (with a test
accuracy column next to img/s for the digits workload) and one line per run on its collectives
check (ops x dtypes x sizes, seconds, PASS/FAIL).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import sys
from pathlib import Path

from hpcstack.fsutil import write_no_follow
from hpcstack.validate.judge import fmt


def to_markdown(report: dict) -> str:
    """Render the report as markdown: a header, a table of runs, failures, and the verdict.

    Args:
        report (dict): a report document (:meth:`hpcstack.validate.judge.Verdict.to_dict`).

    Returns:
        str: markdown text ending with a newline.
    """
    s = report.get("settings") or {}
    lines = [f"# Validation of {report['recipe']} on {report['system']}", ""]
    if s:
        lines += ["Settings: " + ", ".join(f"{k} {v}" for k, v in s.items()), ""]
    accuracy = any((r.get("classifier") or {}).get("ran") for r in report["runs"])
    # the figures, in the validation file's order: measured ones first, fractions (scaling
    # efficiencies) after the test accuracy
    names = list(dict.fromkeys(name for r in report["runs"] for name in r["figures"]))
    first = report["runs"][0]["figures"] if report["runs"] else {}
    measured = [n for n in names if first.get(n, {}).get("unit")]
    fractions = [n for n in names if n not in measured]

    def heading(name: str) -> str:
        return first.get(name, {}).get("label") or name

    lines += ["| backend | nodes | ranks | job | " + "".join(f"{heading(n)} | " for n in measured)
              + ("test accuracy | " if accuracy else "") + "".join(f"{heading(n)} | " for n in fractions)
              + "sanity | result |",
              "|---|---:|---:|---|" + "---:|" * len(measured) + ("---:|" if accuracy else "")
              + "---:|" * len(fractions) + "---|---|"]
    for r in report["runs"]:
        f = r["figures"]
        cells = [r["backend"], str(r["nodes"]), str(r["ranks"]), str(r["job_id"]),
                 *[_cell(f[n]) if n in f else "n/a" for n in measured],
                 *([accuracy_cell(r)] if accuracy else []),
                 *[_fraction_cell(f.get(n)) for n in fractions],
                 "PASS" if not r["sanity"] else "FAIL", "PASS" if r["ok"] else "FAIL"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += startup_lines(report["runs"])
    lines += collectives_lines(report["runs"])
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
    lines += transport_lines(report.get("jobs", []))
    if report["failures"]:
        lines += ["Failures:", ""] + [f"- {line}" for line in report["failures"]] + [""]
    for job in report.get("jobs", []):
        if job.get("state") != "COMPLETED" and job.get("output_tail"):
            lines += [f"Last lines of job {job['job_id']} ({job.get('output')}):", "", "```"]
            lines += job["output_tail"] + ["```", ""]
    lines.append(f"**{'PASS' if report['ok'] else 'FAIL'}**")
    return "\n".join(lines) + "\n"


def transport_lines(jobs: list[dict]) -> list[str]:
    """What each job's NCCL logs showed (a job's ``transport``, from
    :class:`hpcstack.validate.transport.TransportVerdict`): the networks between and within
    nodes, the NCCL loaded beside the one the site names; and on the CPU path the BTLs Open MPI
    chose (:class:`hpcstack.validate.transport.OmpiVerdict`); none without such jobs.

    Example:
        >>> transport_lines([{"job_id": "7", "nodes": 2, "transport": {"fabric": "infiniband",
        ...     "inter_node": ["IB"], "intra_node": ["P2P/IPC"], "files": 8,
        ...     "nccl": {"loaded": ["2.19.3+cuda12.3"], "module": "nccl/2.19.3", "home": None}}}])[2]
        '- job 7 (2 node(s)), fabric infiniband: between nodes IB; within a node P2P/IPC; NCCL loaded 2.19.3+cuda12.3 (site: nccl/2.19.3); 8 log(s)'
    """
    out, ompi = [], []
    for job in jobs:
        t = job.get("transport")
        if not t:
            continue
        if t.get("mpi"):          # the CPU path (transport.OmpiVerdict)
            ompi.append(f"- job {job.get('job_id')} ({job.get('nodes')} node(s)): within a node "
                        f"{', '.join(t.get('within_node') or []) or 'not shown'}; between nodes "
                        f"{', '.join(t.get('between_nodes') or []) or 'not shown'}")
            continue
        nccl = t.get("nccl") or {}
        site = ", ".join(x for x in (nccl.get("module"), nccl.get("home") and f"toolchain.nccl.home {nccl['home']}")
                         if x) or "names none"
        out.append(f"- job {job.get('job_id')} ({job.get('nodes')} node(s)), fabric {t.get('fabric')}: "
                   f"between nodes {', '.join(t.get('inter_node') or []) or 'not shown'}; within a node "
                   f"{', '.join(t.get('intra_node') or []) or 'not shown'}; NCCL loaded "
                   f"{', '.join(nccl.get('loaded') or []) or 'not shown'} (site: {site}); {t.get('files', 0)} log(s)")
    return ((["Transport (NCCL_DEBUG=INFO logs of the ranks):", "", *out, ""] if out else [])
            + (["Transport (Open MPI's BTL per peer, btl_base_verbose):", "", *ompi, ""] if ompi else []))


def collectives_line(run: dict) -> str:
    """One line on a run's collectives check: ops x dtypes x sizes checked, time, PASS/FAIL.

    Args:
        run (dict): a run of the report document (its ``collectives`` entry may be absent in
            reports written before the check existed).

    Returns:
        str: e.g. ``"horovod on 2 node(s): 410 checks (12 ops x 5 dtypes x 9 sizes) in 3.5 s:
        PASS; skipped: 10 op/dtype pairs the backend lacks"``.
    """
    c = run.get("collectives") or {"ran": False}
    where = f"{run['backend']} on {run['nodes']} node(s)"
    if not c.get("ran"):
        return f"{where}: not run"
    seconds = "?" if c.get("seconds") is None else f"{c['seconds']:.1f}"
    line = (f"{where}: {c['checks']} checks ({c['ops']} ops x {c['dtypes']} dtypes x "
            f"{c['sizes']} sizes) in {seconds} s: {'PASS' if c['ok'] else 'FAIL'}")
    if c.get("failures"):
        line += ": " + "; ".join(c["failures"])
    if c.get("skipped"):
        reasons = sorted({item["reason"] for item in c["skipped"]})
        line += f"; skipped {len(c['skipped'])} op/dtype pairs: " + "; ".join(reasons)
    return line


def collectives_lines(runs: list[dict]) -> list[str]:
    """The report's "Collectives check" section: one line per run (backend and node count);
    none where the program has no such check (every run recorded that it did not run)."""
    if not runs or all(r.get("collectives") and not r["collectives"].get("ran") for r in runs):
        return []
    return (["Collectives check (exact results of every collective the backend offers, before "
             "training):", ""] + [f"- {collectives_line(r)}" for r in runs] + [""])


def collectives_caption(runs: list[dict]) -> str:
    """The PNG's caption: per backend, the collectives checks of its runs, e.g.
    ``collectives: horovod PASS (1 node: 410 checks, 3.5 s; 2 nodes: ...)``."""
    per_backend: dict[str, list[str]] = {}
    verdict: dict[str, str] = {}
    for r in runs:
        c = r.get("collectives") or {}
        if not c.get("ran"):
            continue
        seconds = "?" if c.get("seconds") is None else f"{c['seconds']:.1f} s"
        per_backend.setdefault(r["backend"], []).append(f"{r['nodes']}N {c['checks']} checks {seconds}")
        if not c["ok"] or r["backend"] not in verdict:
            verdict[r["backend"]] = "PASS" if c["ok"] and verdict.get(r["backend"]) != "FAIL" else "FAIL"
    return "\n".join(f"collectives {b}: {verdict[b]} ({', '.join(parts)})"
                     for b, parts in sorted(per_backend.items()))


def accuracy_cell(run: dict) -> str:
    """A run's digits test accuracy against its threshold, e.g. ``0.981 (>= 0.95) ✓``; ``n/a``
    when the classifier did not run or reported no accuracy."""
    c = run.get("classifier") or {}
    if not c.get("ran") or c.get("test_accuracy") is None:
        return "n/a"
    return f"{c['test_accuracy']:.3f} (>= {c['threshold']})" + _mark(c)


def accuracy_caption(runs: list[dict]) -> str:
    """The PNG's caption line on the digits classifier: test accuracy per backend and node
    count, e.g. ``test accuracy (>= 0.95): horovod 1N 0.986, 2N 0.981; ddp ...``; empty when
    no run trained it."""
    per_backend: dict[str, list[str]] = {}
    thresholds = set()
    for r in runs:
        c = r.get("classifier") or {}
        if c.get("ran") and c.get("test_accuracy") is not None:
            per_backend.setdefault(r["backend"], []).append(
                f"{r['nodes']}N {c['test_accuracy']:.3f}" + ("" if c.get("ok") else " FAIL"))
            thresholds.add(c.get("threshold"))
    if not per_backend:
        return ""
    return (f"test accuracy (>= {', '.join(str(t) for t in sorted(thresholds, key=str))}): "
            + "; ".join(f"{b} {', '.join(parts)}" for b, parts in sorted(per_backend.items())))


def _cell(fig: dict) -> str:
    return "n/a" if fig["value"] is None else f"{fig['value']:.1f}" + _mark(fig)


def _fraction_cell(fig: dict | None) -> str:
    if not fig or fig["value"] is None:
        return "n/a"
    return f"{100 * fig['value']:.1f} %" + _mark(fig)


def startup_lines(runs: list[dict]) -> list[str]:
    """The report's "Start-up" section: per run, process start to imports done and to the end
    of the first measured step, median and max over the ranks (none without startup records)."""
    lines = []
    for r in runs:
        s = r.get("startup")
        if not s:
            continue
        imports, first = s["imports_s"], s["first_step_s"]
        lines.append(f"- {r['backend']} on {r['nodes']} node(s), {s['ranks']} rank(s): imports done "
                     f"{_seconds(imports['median'])} median, {_seconds(imports['max'])} max; first "
                     f"measured step {_seconds(first['median'])} median, {_seconds(first['max'])} max")
    if not lines:
        return []
    return ["Start-up per rank (from process start):", ""] + lines + [""]


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _mark(fig: dict) -> str:
    return {True: " ✓", False: " ✗"}.get(fig["ok"], "")


def plot_scaling(report: dict, path: str | os.PathLike) -> bool:
    """Plot total img/s against node count per backend, with the ideal line ``N * img/s(1)``.

    Args:
        report (dict): a report document (:meth:`hpcstack.validate.judge.Verdict.to_dict`).
        path (str | PathLike | IO[bytes]): the PNG file to write, or a binary file object.

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
        values = [_point(points[str(n)]) for n in nodes]
        colour = colours.get(backend)
        ax.plot(nodes, values, "o-", color=colour, label=f"{backend} (measured)")
        for n, v in zip(nodes, values):
            eff = points[str(n)]["efficiency"]
            if eff is not None and n > 1:
                ax.annotate(f"{100 * eff:.0f} %", (n, v), textcoords="offset points",
                            xytext=(6, -12), fontsize=8, color=colour)
            accuracy = points[str(n)].get("test_accuracy")
            if accuracy is not None:
                ax.annotate(f"acc {accuracy:.3f}", (n, v), textcoords="offset points",
                            xytext=(6, 4), fontsize=8, color=colour)
        if "1" in points:
            ax.plot([1, top], [_point(points["1"]), top * _point(points["1"])],
                    "--", color=colour, alpha=0.6, label=f"{backend} ideal (N x 1-node)")
    ax.set_xlabel("nodes")
    unit = next((p.get("unit", "img/s") for points in scaling.values() for p in points.values()), "img/s")
    figure = next((p.get("figure") for points in scaling.values() for p in points.values()), None)
    ax.set_ylabel(f"{unit} (all ranks)" if unit == "img/s" or not figure else f"{figure} ({unit})")
    ax.set_xticks(sorted(all_nodes))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    settings = report.get("settings") or {}
    model = f", {settings['model']} batch {settings.get('batch_size')}" if settings.get("model") else ""
    ax.set_title(f"{report['recipe']} on {report['system']}{model}", fontsize=10)
    ax.legend(fontsize=8)
    summary = "\n".join(line for line in (collectives_caption(report.get("runs", [])),
                                           accuracy_caption(report.get("runs", []))) if line)
    if summary:
        fig.text(0.01, 0.01, summary, fontsize=7, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.04 * len(summary.splitlines()), 1, 1))
    fig.savefig(path, format="png")
    plt.close(fig)
    return True


def _point(point: dict) -> float:
    """A scaling point's value (reports written before figures were declared: ``img_per_sec``)."""
    return point["value"] if "value" in point else point["img_per_sec"]


def write_report(report: dict, directory: str | os.PathLike) -> dict[str, str]:
    """Write ``report.json``, ``report.md`` and ``scaling.png`` into ``directory``.

    Args:
        report (dict): a report document (:meth:`hpcstack.validate.judge.Verdict.to_dict`).
        directory (str | PathLike): an existing directory.

    Returns:
        dict[str, str]: ``{"json": path, "markdown": path, "plot": path}`` (no ``plot`` when
        there was nothing to plot).
    """
    d = Path(directory)
    paths = {"json": str(d / "report.json"), "markdown": str(d / "report.md")}
    # the directory may belong to the user the jobs ran as: no symbolic link is followed
    write_no_follow(paths["json"], json.dumps(report, indent=1) + "\n")
    write_no_follow(paths["markdown"], to_markdown(report))
    png = io.BytesIO()
    if plot_scaling(report, png):
        write_no_follow(d / "scaling.png", png.getvalue())
        paths["plot"] = str(d / "scaling.png")
    return paths


# --------------------------------------------------------------------------------------------
# The command's output: what ``hpcstack validate`` prints, from the plan and the outcomes
# --------------------------------------------------------------------------------------------

def _err(text: str) -> None:
    print(text, file=sys.stderr)


def print_json(document) -> None:
    """A JSON document on stdout (indent 1, as every ``--json`` output)."""
    print(json.dumps(document, indent=1))


def print_note(note: str) -> None:
    """A note on stderr (``note: …``)."""
    _err(f"note: {note}")


def print_local_dry_run(run) -> None:
    """The ``--local`` dry run: the module commands, the exports, the launcher's command line.

    Args:
        run (hpcstack.validate.plan.LocalRun): the plan's local run.
    """
    lines = list(run.module_lines) + [f"export {k}={shlex.quote(v)}" for k, v in run.env.items()]
    print("\n".join(lines + [shlex.join(run.argv("records.jsonl"))]))


def print_jobs_dry_run(plan, as_json: bool) -> None:
    """The Slurm dry run: each job's script (as JSON: ``{"jobs": [{nodes, path, script}], "plan":
    ...}``, the plan's :meth:`~hpcstack.validate.plan.ValidationPlan.to_dict` less its jobs)."""
    if as_json:
        print(json.dumps({"jobs": [{"nodes": j.nodes, "path": str(j.script_path), "script": j.script}
                                   for j in plan.jobs],
                          "plan": {k: v for k, v in plan.to_dict().items() if k != "jobs"}}, indent=1))
        return
    for j in plan.jobs:
        print(f"# ===== {j.script_path} ({j.nodes} node(s)) =====")
        print(j.script)


def print_local_start(recipe_name: str, argv: list[str]) -> None:
    """The line before a ``--local`` run."""
    _err(f"==> validate {recipe_name}: {shlex.join(argv)}")


def print_submitted(job, backends: list[str]) -> None:
    """One line per submitted job."""
    _err(f"==> submitted job {job.job_id}: {job.nodes} node(s), {', '.join(backends)}; {job.script_path}")


def print_no_wait(submitted: list, out, later: str, as_json: bool) -> None:
    """After ``--no-wait``: the job ids, the directory and the command that reports later."""
    if as_json:
        print(json.dumps({"submitted": [{"job_id": j.job_id, "nodes": j.nodes} for j in submitted],
                          "output_dir": str(out), "collect": later}, indent=1))
    else:
        print(f"submitted {' '.join(j.job_id for j in submitted)}; outputs in {out}\nreport when they end: {later}")


def print_job_state(job, info) -> None:
    """A job's new state while waiting."""
    extra = f" (exit code {info.exit_code}, {info.elapsed})" if info.finished else ""
    _err(f"    job {info.job_id} ({job.nodes} node(s)): {info.state}{extra}")


def print_interrupted(ids: list[str]) -> None:
    """Ctrl-C while waiting: the jobs are cancelled."""
    _err(f"interrupted: cancelling jobs {' '.join(ids)}")


def print_slurm_report(result: dict, job_records: list[dict], as_json: bool) -> None:
    """The judged Slurm validation: the report (markdown or JSON), its files, the failures, the
    tails of the jobs that did not complete, PASS or FAIL."""
    if as_json:
        print(json.dumps(result, indent=1))
    else:
        print(to_markdown(result))
        print("report: " + ", ".join(result["files"].values()))
    for line in result["failures"]:
        _err(f"FAIL: {line}")
    for job in job_records:
        if job["output_tail"]:
            _err(f"  last lines of job {job['job_id']} ({job['output']}):\n  | " + "\n  | ".join(job["output_tail"]))
    _err("PASS" if result["ok"] else "FAIL")


def startup_line(startup: dict) -> str:
    """One line on the start-up times of a run's ranks (:func:`hpcstack.validate.judge.startup_summary`)."""
    imports, first = startup["imports_s"], startup["first_step_s"]
    return (f"start-up over {startup['ranks']} rank(s): imports done after {imports['median']:.2f} s "
            f"(median), {imports['max']:.2f} s (max); first measured step after "
            f"{first['median']:.2f} s (median), {first['max']:.2f} s (max)")


def print_local_figures(records: list[dict], spec, startup: dict | None) -> None:
    """A ``--local`` run's figures, collectives, accuracy, convergence and start-up, one line each
    (printed, never compared with references)."""
    from hpcstack.validate.judge import ClassifierOutcome, CollectivesOutcome

    for figure in (spec.figures.values() if spec else []):
        value = figure.value(records) if figure.record else None
        if value is not None:
            print(f"{figure.label or figure.name}: {fmt(value, figure.unit)}")
    collectives = CollectivesOutcome.from_records(records)
    if collectives.ran:
        print(f"collectives: {collectives.checks} checks ({collectives.ops} ops x {collectives.dtypes} "
              f"dtypes x {collectives.sizes} sizes) in {collectives.seconds or 0:.1f} s: "
              + ("PASS" if collectives.ok else "FAIL: " + "; ".join(collectives.failures)))
    classifier = ClassifierOutcome.from_records(records)
    if classifier.ran:
        print(f"digits: test accuracy {classifier.test_accuracy:.4f} (threshold {classifier.threshold}) "
              f"after {classifier.epochs} epochs")
    for r in records:  # a training program's convergence check, where it ran one
        if r.get("record") == "convergence" and {"initial_loss", "final_loss"} <= set(r):
            print(f"loss {r['initial_loss']:.4f} -> {r['final_loss']:.4f} (threshold {r.get('threshold')}); "
                  f"parameters identical on all ranks: {r.get('params_identical')}")
        elif r.get("record") == "classifier" and "params_identical" in r:
            print(f"digits: parameters identical on all ranks: {r['params_identical']}")
    if startup:
        print(startup_line(startup))


def print_local_verdict(ok: bool, reasons: list[str], returncode: int, output: str) -> None:
    """PASS, or FAIL with the exit status, the reasons and the output's last 15 lines.

    Args:
        ok (bool): the judge's verdict.
        reasons (list[str]): the judge's reasons; its ``exit status N`` is left out, the line
            begins with it.
        returncode (int): the launcher's exit status.
        output (str): the run's standard output and error.
    """
    if not ok:
        tail = "\n  | ".join(output.strip().splitlines()[-15:])
        rest = [r for r in reasons if r != f"exit status {returncode}"]
        _err(f"FAIL: exit status {returncode}" + (f": {'; '.join(rest)}" if rest else "") + f"\n  | {tail}")
        return
    print("PASS")
