"""The ``hpcstack`` command: install, validate, lock, list, show, uninstall, check-build, ...

One module per group of commands, each command's parser beside its handler (as Spack's
``cmd/<name>.py``): :mod:`~hpcstack.cli.install` (install, lock, uninstall, mount),
:mod:`~hpcstack.cli.validate` (validate, check-build), :mod:`~hpcstack.cli.info` (list, show,
doctor), :mod:`~hpcstack.cli.modules` (module, kernel), :mod:`~hpcstack.cli.lifecycle` (bundle,
audit, module deprecate), :mod:`~hpcstack.cli.export`, :mod:`~hpcstack.cli.action` and :mod:`~hpcstack.cli.status`. The
options they share are declared once, in :mod:`~hpcstack.cli.options`. :func:`main` builds one
:class:`hpcstack.session.Session` per command and hands it to the command's handler
(``handler(args, session)``): the command reads its site and recipe, and whom it trusts, from
that session only.
``hpcstack`` (the console script) and ``python -m hpcstack`` run :func:`main`.

Every problem the user can fix is printed as one line (``error: …``) with a non-zero exit:
2 for a bad site config, recipe or command line (nothing written), 1 for a failure while running.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from hpcstack import __version__
from hpcstack.cli import action, export, info, install, lifecycle, modules, schedule, status, validate
from hpcstack.errors import ArgumentParser, ConfigError, HpcstackError


#: A name given on the command line (partition, QOS, account, workload, kernel): letters,
#: digits and ``._-``, as the site schema's Slurm names.
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,255}"


#: What jsonschema imports, when installed, to check a schema's ``format`` keywords (jupyter's
#: ``jsonschema[format-nongpl]`` brings them, and arrow and lark with them). hpcstack's schemas
#: have no ``format``, and nothing else of hpcstack imports them, so :func:`main` blocks them in
#: its own process (jsonschema expects the ImportError): ``rfc3987_syntax`` alone compiles 38 lark
#: grammars at import, 1.1-2.4 s of every command; the others cost about 60 ms of a no-op
#: re-install (docs/benchmarks.md, "The CLI runs without rfc3987_syntax").
FORMAT_MODULES = ("rfc3987_syntax", "rfc3987", "rfc3986_validator", "rfc3339_validator", "fqdn",
                  "webcolors", "uri_template", "isoduration", "jsonpointer")


def check_args(argv: list[str], args: argparse.Namespace | None = None) -> list[str]:
    """Check command-line values before anything uses them.

    Rules: no argument holds a control character (:data:`hpcstack.schema.CONTROL`: a newline in
    ``--partition`` would become a line of a job script); ``--partition``, ``--qos``,
    ``--account`` and ``--workload`` are names (letters, digits, ``._-``); ``--jobs`` and
    ``--ranks`` are within the site schema's bounds.

    Args:
        argv (list[str]): the raw arguments.
        args (argparse.Namespace | None): the parsed ones (None: check only ``argv``).

    Returns:
        list[str]: one line per problem; empty when every value is fine.
    """
    import re

    from hpcstack.schema import CONTROL
    from hpcstack.site import MAX_JOBS, MAX_RANKS

    problems = [f"argument {i + 1} {ascii(a)[:80]}: holds a control character (newline, NUL, ...)"
                for i, a in enumerate(argv) if CONTROL.search(a)]
    if problems or args is None:
        return problems
    for opt in ("partition", "qos", "account", "workload"):
        value = getattr(args, opt, None)
        if value is not None and not re.fullmatch(_NAME, value):
            problems.append(f"--{opt}: {value!r}: use letters, digits and ._- (at most 256)")
    for opt, top in (("jobs", MAX_JOBS), ("ranks", MAX_RANKS), ("idle", 36500)):
        value = getattr(args, opt, None)
        if value is not None and not 1 <= value <= top:
            problems.append(f"--{opt}: {value}: must be from 1 to {top}")
    return problems


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the ``hpcstack`` command (its commands in the order of
    ``hpcstack --help``, each declared by its module)."""
    parser = ArgumentParser(
        prog="hpcstack", description="Install module-based HPC software stacks from recipes, per site.")
    parser.add_argument("--version", action="version", version=f"hpcstack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


#: The commands, each as the function that adds its parser (with its handler), in the order of
#: ``hpcstack --help``.
COMMANDS = (install.add_install, validate.add_validate, install.add_lock, info.add_list, info.add_show,
            install.add_uninstall, install.add_mount, export.add_export, modules.add_kernel,
            validate.add_check_build, info.add_doctor, action.add_action, lifecycle.add_bundle,
            lifecycle.add_audit, lifecycle.add_usage, lifecycle.add_compare, modules.add_module,
            status.add_status, schedule.add_schedule)


#: Signals that stop a command the way Ctrl-C does: SIGTERM is what ``kill``, ``timeout`` and
#: Slurm at a job's time limit send (Slurm's ``KillWait``: SIGTERM, then SIGKILL 30 s later by
#: default, slurm.conf(5)); SIGHUP is a closed terminal or a dropped ssh session.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_SIGNAL_NAMES = {"SIGINT", *(s.name for s in STOP_SIGNALS)}


def _stop(signum: int, frame) -> None:
    """Raise :class:`KeyboardInterrupt` naming the signal, so that a step stops and says how to
    resume, a validation cancels its jobs, and child processes started with
    :func:`subprocess.run` are killed on the way out (as for Ctrl-C)."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def install_stop_handlers() -> None:
    """Stop cleanly on SIGTERM and SIGHUP as on SIGINT (:func:`_stop`), in the main thread.

    A signal the parent set to be ignored stays ignored: ``nohup`` ignores SIGHUP, and a
    non-interactive shell starts background commands with SIGINT ignored (POSIX, "Shell Command
    Language", 2.11), which Python keeps (no ``KeyboardInterrupt`` then); SIGTERM is never
    ignored that way, so ``kill PID`` always reaches an install.
    """
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) == signal.SIG_DFL:
            signal.signal(sig, _stop)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``hpcstack`` console script.

    Args:
        argv (list[str] | None): arguments (default ``sys.argv[1:]``).

    Returns:
        int: exit status (0 ok, 1 failure, 2 bad input).
    """
    for name in FORMAT_MODULES:
        sys.modules.setdefault(name, None)
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        install_stop_handlers()
    try:
        problems = check_args(argv)
        if problems:
            raise ConfigError(problems)
        args = build_parser().parse_args(argv)
        problems = check_args(argv, args)
        if problems:
            raise ConfigError(problems)
        from hpcstack.session import Session

        return args.handler(args, Session.from_args(args))
    except HpcstackError as exc:
        from hpcstack.schema import CONTROL

        for line in exc.lines():      # one line each, whatever a value in it holds
            print(f"error: {CONTROL.sub(lambda m: ascii(m.group())[1:-1], line)}", file=sys.stderr)
        return exc.exit_status
    except RecursionError:
        print("error: input nested too deeply", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        name = exc.args[0] if exc.args and exc.args[0] in _SIGNAL_NAMES else "SIGINT"
        print("error: interrupted" + ("" if name == "SIGINT" else f" ({name})"), file=sys.stderr)
        return 128 + signal.Signals[name].value
    except BrokenPipeError:  # `hpcstack … | head`: the reader has gone; nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except OSError as exc:  # a full disk, a permission problem: what, where, what to do
        from hpcstack.install.actions import describe_os_error

        print(f"error: {describe_os_error(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the last resort: one line, never a traceback
        if os.environ.get("HPCSTACK_DEBUG"):
            raise
        print(f"error: internal error: {type(exc).__name__}: {exc} (a bug in hpcstack; "
              "HPCSTACK_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 70
