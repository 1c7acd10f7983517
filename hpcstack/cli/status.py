"""``hpcstack status``: each stack's verdict from the site's validation history."""

from __future__ import annotations

from hpcstack.cli import options


def add_status(sub) -> None:
    """The parser of ``hpcstack status`` (:mod:`hpcstack.validate.status`)."""
    p = sub.add_parser(
        "status", help="each stack's verdict (OK, DEGRADED, FAILED, NOT-RUN) per tier from the site's "
                       "validation history; a static HTML page",
        description="Read the site's validation history (<install_root>/.hpcstack/history/<site>.sqlite, "
                    "written by hpcstack validate as root) and print per stack and tier its verdict, last "
                    "run, trend and since when: FAILED when the latest run failed its sanity checks or a "
                    "reference; DEGRADED when it passed but is slower than the install's baseline (a "
                    "one-sided Mann-Whitney test, p < 0.01, and a drop of at least 5%%), with the date "
                    "of the shift and what changed in the environment since the last OK run; NOT-RUN "
                    "when it did not run (never a pass). docs/admin/status.md says how.")
    options.add_site_and_repo(p)
    options.add_prefix(p)
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    p.add_argument("--html", metavar="DIR",
                   help="write a static page DIR/<site>.html (verdicts, what changed, history plots of "
                        "throughput and start-up per node count with the reference band and the "
                        "environment's changes, users in the last 30 days) and DIR/<site>.json")
    p.add_argument("--reframe-refs", metavar="FILE",
                   help="write the stacks' performance references as ReFrame YAML to FILE")
    p.set_defaults(handler=cmd_status)


def cmd_status(args, session) -> int:
    """``hpcstack status`` (:func:`hpcstack.validate.status.cmd_status`)."""
    from hpcstack.validate import status

    return status.cmd_status(args, session)
