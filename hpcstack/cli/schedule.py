"""``hpcstack schedule install|remove|list``: the scrontab entries that re-validate the stacks
(:mod:`hpcstack.validate.schedule`)."""

from __future__ import annotations

from hpcstack.cli import options


def add_schedule(sub) -> None:
    """The parser of ``hpcstack schedule``."""
    p = sub.add_parser(
        "schedule", help="install, remove or list the scrontab entries that re-validate the site's "
                         "published stacks (smoke daily, full weekly, a fingerprint probe every 6 hours)",
        description="Slurm's per-user cron (scrontab) of the site's slurm.submit_as account (root's "
                    "without one) gets one entry per published stack and tier of its recipe's "
                    "validation (tiers: smoke, full, probe), each running hpcstack validate STACK "
                    "--site SITE --tier TIER; each entry starts with a '# hpcstack schedule:' line, "
                    "and only those are changed: the account's other entries stay. A slot that did "
                    "not run is recorded as NOT-RUN ('slot missed') by the next run and by hpcstack "
                    "status. docs/admin/status.md says how.")
    p.add_argument("action", choices=["install", "remove", "list"], help="what to do")
    p.add_argument("stacks", nargs="*", metavar="STACK",
                   help="NAME/VERSION (default: every stack published for the site; remove: every "
                        "stack of the site's entries)")
    options.add_site_and_repo(p)
    options.add_flag(p, "--dry-run", "print the table that would be written; change nothing")
    p.set_defaults(handler=cmd_schedule)


def cmd_schedule(args, session) -> int:
    """``hpcstack schedule`` (:func:`hpcstack.validate.schedule.cmd_schedule`)."""
    from hpcstack.validate import schedule

    return schedule.cmd_schedule(args, session)
