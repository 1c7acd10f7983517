"""``hpcstack schedule install|remove|list``: the scrontab entries that re-validate the stacks
(:mod:`hpcstack.validate.schedule`)."""

from __future__ import annotations

from hpcstack.cli import options


def add_schedule(sub) -> None:
    """The parser of ``hpcstack schedule``."""
    p = sub.add_parser(
        "schedule", help="install, remove or list the scrontab entries that re-validate the site's "
                         "published stacks (smoke daily, full weekly, a fingerprint probe every 6 hours)",
        description="Root's entries in Slurm's per-user cron (scrontab): one per published stack "
                    "and tier of its recipe's "
                    "validation (tiers: smoke, full, probe), each running hpcstack validate STACK "
                    "--site SITE --tier TIER; each entry starts with a '# hpcstack schedule:' line, "
                    "and only those are changed: the account's other entries stay. A slot that did "
                    "not run is recorded as NOT-RUN ('slot missed') by the next run and by hpcstack "
                    "status. docs/admin/status.md says how.")
    # one parser per action, so that stacks may follow the options (`install --site S STACK`):
    # argparse matches an action and a `*` positional of one parser in one go, before any option
    actions = p.add_subparsers(dest="action", metavar="{install,remove,list}", required=True)
    for name, text in (("install", "write the entries (default: every stack published for the site)"),
                       ("remove", "remove the entries (default: every stack of the site's entries)"),
                       ("list", "print the site's entries")):
        a = actions.add_parser(name, help=text, description=text)
        a.add_argument("stacks", nargs="*", metavar="STACK", help="NAME/VERSION")
        options.add_site_and_repo(a)
        options.add_flag(a, "--dry-run", "print the table that would be written; change nothing")
        a.set_defaults(handler=cmd_schedule)
    p.set_defaults(handler=cmd_schedule)


def cmd_schedule(args, session) -> int:
    """``hpcstack schedule`` (:func:`hpcstack.validate.schedule.cmd_schedule`)."""
    from hpcstack.validate import schedule

    return schedule.cmd_schedule(args, session)
