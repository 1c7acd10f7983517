"""The trainer's one error of its own: a usage error (exit status 2)."""


class UsageError(Exception):
    """A command-line value or launch environment the program cannot run with (exit status 2)."""
