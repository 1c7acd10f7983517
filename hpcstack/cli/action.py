"""``hpcstack action VERB …``: one action of an install's dry-run script, run with the code of the
real run; its verbs and their options are :func:`hpcstack.install.verbs.build_parser`'s."""

from __future__ import annotations

import argparse


def add_action(sub) -> None:
    """The parser of ``hpcstack action``: it hands every word on to the verbs' own parser."""
    p = sub.add_parser("action", help="run one action of an install's dry-run script (fetch, unpack, sbom)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("words", nargs=argparse.REMAINDER)
    p.set_defaults(handler=cmd_action)


def cmd_action(args, session) -> int:
    """``hpcstack action VERB …``: the dry-run script's fetch, unpack and components' lines, run
    with the code of the real run (:func:`hpcstack.install.verbs.cli`)."""
    import hpcstack.install.components  # noqa: F401  (the components register their verbs)
    from hpcstack.install.verbs import cli

    return cli(args.words)
