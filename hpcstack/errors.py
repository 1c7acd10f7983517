"""Errors that hpcstack reports to the user as one clear line each, with an exit status."""

from __future__ import annotations

import argparse


class HpcstackError(Exception):
    """A failure the user can act on; printed as ``error: <message>`` with exit status 1.

    Args:
        message (str): what went wrong, where, and what to do about it (one line).
        step (str | None): name of the step that failed, if any (e.g. ``"build"``).
    """

    exit_status = 1

    def __init__(self, message: str, step: str | None = None):
        super().__init__(message)
        self.step = step

    def lines(self) -> list[str]:
        """Return the lines to print, each already prefixed with the step name where known."""
        prefix = f"step {self.step}: " if self.step else ""
        return [f"{prefix}{self}"]


class ConfigError(HpcstackError):
    """A site config, recipe or command line that is invalid; exit status 2, nothing written.

    Args:
        problems (list[str]): one entry per problem, each naming the file and the key path,
            e.g. ``"site-configs/x.yaml: horovod.cpu_operations: 'FOO' is not one of ['MPI', 'Gloo']"``.
    """

    exit_status = 2

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = list(problems)

    def lines(self) -> list[str]:
        return list(self.problems)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line, raised as :class:`ConfigError` (exit status 2)
    instead of a usage block and ``sys.exit(2)``: ``hpcstack install: unrecognized arguments: …
    (see hpcstack install --help)``. Its subparsers are of this class too."""

    def error(self, message: str):
        raise ConfigError([f"{self.prog}: {message} (see {self.prog} --help)"])
