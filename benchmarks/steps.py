#!/usr/bin/env python3
"""Where an install's time went, from the records it keeps in its prefix.

Every install writes ``<prefix>/.hpcstack/steps/<step>.json`` (the step's seconds and when it
finished), ``timings.json`` and its logs. This script prints, for one installed prefix: the wall
time from the first step's start to the module step's end, each step's seconds, uv's own lines
of the wheels step (resolve, download, link, bytecode compile), and for a cold install the
ratio the install target is held to: the install's wall time against the download (uv's
"Resolved" and "Prepared") plus the build step (the Horovod compile). It reads only; it reports
what the records say (whether the install was cold is what ``Prepared`` shows: a warm one
prepares nothing).

Usage:
    python3 benchmarks/steps.py [PREFIX] [--raw FILE]     # default /opt/hpcstack/software/pytorch/2.3.1-gpu
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

UV_LINE = re.compile(r"^(Resolved|Prepared|Installed|Bytecode compiled) .* in ([0-9.]+)(ms|s)$")


def _seconds(value: str, unit: str) -> float:
    return float(value) / (1000 if unit == "ms" else 1)


def report(prefix: Path) -> list[str]:
    """The report's lines for the install in ``prefix``.

    :raises FileNotFoundError: when ``prefix`` holds no step records.
    """
    meta = prefix.resolve() / ".hpcstack"
    records = []
    for path in sorted((meta / "steps").glob("*.json")):
        data = json.loads(path.read_text())
        end = datetime.datetime.strptime(data["finished"], "%Y-%m-%dT%H:%M:%S%z")
        records.append((end - datetime.timedelta(seconds=data["seconds"]), end, data["step"], data["seconds"]))
    if not records:
        raise FileNotFoundError(f"no step records in {meta / 'steps'}")
    start, end = min(r[0] for r in records), max(r[1] for r in records)
    wall = (end - start).total_seconds()
    seconds = {r[2]: r[3] for r in records}
    timings = meta / "timings.json"  # its steps in plan order; else the order they ended
    order = (list(json.loads(timings.read_text()).get("seconds", {})) if timings.is_file() else [])
    order = [s for s in order if s in seconds] + [r[2] for r in sorted(records, key=lambda r: r[1])
                                                  if r[2] not in order]
    lines = [f"steps: {prefix} ({prefix.resolve().name})",
             f"  started {start:%Y-%m-%d %H:%M:%S}, last step ended {end:%H:%M:%S}: {wall:.0f} s wall",
             "  steps (s): " + ", ".join(f"{s} {seconds[s]}" for s in order)]
    uv = {}
    log = meta / "logs" / "wheels.log"
    for text in (log.read_text(errors="replace").splitlines() if log.is_file() else []):
        m = UV_LINE.match(text.strip())
        if m:
            uv[m.group(1)] = _seconds(m.group(2), m.group(3))
            lines.append(f"  uv: {text.strip()}")
    download = uv.get("Resolved", 0.0) + uv.get("Prepared", 0.0)
    build = seconds.get("build", 0.0)
    if "Prepared" in uv:
        lines.append(f"  download (resolve + prepare) {download:.1f} s + build step {build:.1f} s = "
                     f"{download + build:.1f} s; the install: {wall:.0f} s, {wall / (download + build):.2f}x")
    else:
        lines.append("  uv prepared nothing (warm cache): not a cold install, no download + compile ratio")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the report of the prefix given (also to ``--raw``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("prefix", nargs="?", default="/opt/hpcstack/software/pytorch/2.3.1-gpu")
    p.add_argument("--raw", metavar="FILE", help="also write the report to FILE")
    args = p.parse_args(argv)
    try:
        lines = report(Path(args.prefix))
    except (FileNotFoundError, ValueError, KeyError) as exc:
        print(f"steps: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if args.raw:
        Path(args.raw).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
