"""``hpcstack action VERB …``: one action of an install's dry-run script, run with the code of
the real run (the dry-run prints these lines: :mod:`hpcstack.install.actions` says why).

The verbs: ``fetch`` (:class:`~hpcstack.install.actions.Fetch`), ``unpack``
(:class:`~hpcstack.install.actions.Unpack`) and those the components register in
:data:`ACTION_VERBS` (``sbom``, ``reuse-wheel``, …). The ``hpcstack`` command hands its words on
to :func:`cli` (:mod:`hpcstack.cli.action`); the documentation's command reference lists the
verbs from :func:`build_parser`.
"""

from __future__ import annotations

import os
import sys

from hpcstack.errors import ArgumentParser
from hpcstack.install.actions import Fetch, Unpack
from hpcstack.registry import Registry


class _CommandContext:
    """The context of an action run by :func:`cli`: the process environment, the log on stdout."""

    def __init__(self):
        self.env = dict(os.environ)
        self.log = sys.stdout
        self.state_dir = None


#: The verbs of ``hpcstack action`` that components add: a class with ``help`` (one line),
#: ``add_arguments(parser)``, ``run(args) -> int`` and ``written`` (the arguments naming what it
#: writes or reads back, checked by the trust rule first: :func:`_check_written`), registered with
#: ``@ACTION_VERBS.register("sbom")`` in the component's module (a lower layer never imports the
#: components: they register themselves when :mod:`hpcstack.install.components` is imported).
ACTION_VERBS = Registry("action verb")


#: The arguments of the built-in verbs that name what they write (a registered verb lists its
#: own in a ``written`` attribute, e.g. ``("path",)``).
_WRITTEN = {"fetch": ("dest",), "unpack": ("dest",)}


def _check_written(args) -> None:
    """Refuse a verb's destination that an untrusted account can change (:func:`hpcstack.trust.check_dirs`).

    The dry-run script is run later than it is printed (maybe much later, maybe edited): the
    stage paths it names were checked when it was printed, not when ``hpcstack action unpack``
    empties one and unpacks into it, following whatever links lie above it. So each verb checks
    its destination, and every directory above it, when it runs.

    Raises:
        ConfigError: one line naming the directory, whose it is and the fix (exit status 2).
    """
    from hpcstack import trust

    names = _WRITTEN[args.verb] if args.verb in _WRITTEN else getattr(ACTION_VERBS[args.verb], "written", ())
    dirs = [(f"hpcstack action {args.verb} {name.upper()}", os.path.abspath(getattr(args, name))) for name in names]
    if dirs:
        trust.check_dirs(dirs, trust.policy())


def build_parser() -> ArgumentParser:
    """The parser of ``hpcstack action``: ``fetch``, ``unpack`` and every registered verb
    (:data:`ACTION_VERBS`; the caller imports :mod:`hpcstack.install.components` first, so that
    the components' verbs are registered). :func:`cli` parses with it, and the documentation's
    command reference (``docs/hooks/reference.py``) lists its verbs and options.

    Returns:
        hpcstack.errors.ArgumentParser: the parser (bad arguments raise ``ConfigError``).
    """
    parser = ArgumentParser(prog="hpcstack action",
                            description="run one action of an install's dry-run script")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = sub.add_parser("fetch", help="download URL to DEST unless DEST has the sha256; check it")
    p.add_argument("--sha256", required=True, help="the expected sha256 (64 hex digits)")
    p.add_argument("--page", default="", help="find the file on this package index project page instead")
    p.add_argument("url", help="where the file is (its last part is the file's name)")
    p.add_argument("dest", help="the file to write (the download cache's copy)")
    p = sub.add_parser("unpack", help="unpack ARCHIVE into DEST (emptied first), refusing unsafe members")
    p.add_argument("archive", help="the tar or zip archive (an sdist)")
    p.add_argument("dest", help="the directory to unpack into")
    for name in sorted(ACTION_VERBS):
        ACTION_VERBS[name].add_arguments(sub.add_parser(name, help=ACTION_VERBS[name].help))
    return parser


def cli(argv: list[str]) -> int:
    """``hpcstack action fetch|unpack|VERB …``: run one action of the dry-run script with the
    code of the real run (the dry-run prints these lines; see the module's docstring).

    ``hpcstack action fetch --sha256 SHA URL DEST`` is :class:`Fetch`;
    ``hpcstack action unpack ARCHIVE DEST`` is :class:`Unpack`; every other verb is registered
    (:data:`ACTION_VERBS`), e.g. ``hpcstack action sbom --spec JSON PATH``, the
    :class:`hpcstack.install.components.manifest.WriteSbom` of ``StackManifest``, and
    ``hpcstack action reuse-wheel NAME ENTRY DIST``, the hit of a cached source build
    (:func:`hpcstack.install.wheelcache.reuse`: exit 1 when the build must run); the caller
    imports the components first (:func:`hpcstack.cli.action.cmd_action` does).

    Args:
        argv (list[str]): the words after ``hpcstack action``.

    Returns:
        int: 0 when the action succeeded.

    Raises:
        HpcstackError: the action failed (``hpcstack`` prints one ``error:`` line, exit 1).
        ConfigError: bad arguments (one line, exit 2).
    """
    args = build_parser().parse_args(argv)
    _check_written(args)
    if args.verb in ACTION_VERBS:
        return ACTION_VERBS[args.verb].run(args)
    if args.verb == "fetch":
        action = Fetch(args.url, args.sha256, os.path.abspath(args.dest), page=args.page)
    else:
        action = Unpack(args.archive, os.path.abspath(args.dest))
    action.execute(_CommandContext())
    sys.stdout.flush()
    return 0
