"""Horovod's build flags: parse ``horovodrun --check-build`` and require flags (the build's sanity check)."""

from __future__ import annotations

import re
import subprocess

from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD

#: Section headings of ``horovodrun --check-build`` (Horovod 0.28.1) and their short names; the
#: output must have all three (``horovod/runner/launch.py``, ``check_build``).
SECTIONS = {"Available Frameworks": "Frameworks", "Available Controllers": "Controllers",
            "Available Tensor Operations": "Operations"}
_FLAG = re.compile(r"^\s*\[(X| )\]\s+(\S+)\s*$")
_HEADER = re.compile(r"^\s*Horovod v\S+:\s*$")
_HEADING = re.compile(r"^\s*(Available [A-Za-z ]+):\s*$")


class CheckBuildParseError(HpcstackError):
    """``horovodrun --check-build`` printed something that is not its report (one-line reason)."""


def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """Parse the output of ``horovodrun --check-build``, failing closed.

    Accepted: an optional ``Horovod vX.Y.Z:`` line, then sections, each an ``Available …:``
    heading followed by ``[X] Name`` / ``[ ] Name`` lines; blank lines anywhere. Headings other
    than those of :data:`SECTIONS` are kept under their own name (``Available Foo`` -> ``Foo``).

    Args:
        text (str): the output, e.g. ``"Available Controllers:\\n    [X] MPI\\n    [ ] Gloo"``.

    Returns:
        dict[str, dict[str, bool]]: ``{"Frameworks": {"PyTorch": True, …}, "Controllers": …,
        "Operations": …}``.

    Raises:
        CheckBuildParseError: empty output; a line that is neither header, heading, flag nor
            blank (named with its line number); a flag before any heading; a section without
            flags; a section of :data:`SECTIONS` missing.
    """
    if not text.strip():
        raise CheckBuildParseError("horovodrun --check-build printed nothing (is it Horovod's horovodrun?)")
    result: dict[str, dict[str, bool]] = {}
    section = None
    for number, line in enumerate(text.splitlines(), 1):
        heading = _HEADING.match(line)
        flag = _FLAG.match(line)
        if heading:
            name = heading.group(1)
            section = SECTIONS.get(name, name[len("Available "):])
            result[section] = {}
        elif flag and section:
            result[section][flag.group(2)] = flag.group(1) == "X"
        elif flag:
            raise CheckBuildParseError(f"horovodrun --check-build: line {number} {line.strip()!r}: "
                                       "a flag before any 'Available …:' heading")
        elif line.strip() and not (_HEADER.match(line) and section is None):
            raise CheckBuildParseError(f"horovodrun --check-build: line {number} does not parse: "
                                       f"{line.strip()[:80]!r}")
    missing = [heading for heading, short in SECTIONS.items() if short not in result]
    if missing:
        raise CheckBuildParseError("horovodrun --check-build: no " + ", ".join(f"'{m}:'" for m in missing)
                                   + " section in its output")
    empty = [name for name, flags in result.items() if not flags]
    if empty:
        raise CheckBuildParseError(f"horovodrun --check-build: section {empty[0]} lists no flags")
    return result


def missing_flags(flags: dict[str, dict[str, bool]], required: tuple[str, ...] | list[str]) -> list[str]:
    """Return the required flags that are not ``[X]``.

    Args:
        flags: from :func:`parse_check_build`.
        required: ``"Name"`` (must be ``[X]`` in every section that lists it, e.g. ``MPI`` as a
            controller and as a tensor operation) or ``"Section:Name"``.

    Returns:
        list[str]: e.g. ``["Operations:NCCL"]``; a name no section lists is returned as it is
        (``["JAX"]``).
    """
    missing = []
    for req in required:
        section, _, name = req.rpartition(":")
        sections = [section] if section else [s for s in flags if name in flags[s]]
        if not sections:  # listed nowhere: missing, whatever flags there are (fail closed)
            missing.append(name)
        for s in sections:
            if not flags.get(s, {}).get(name, False):
                missing.append(f"{s}:{name}")
    return missing


def check_build(horovodrun: str, required: "tuple[str, ...] | list[str]", env: dict[str, str] | None = None) -> str:
    """Run ``horovodrun --check-build`` and require flags.

    Args:
        horovodrun (str): path or name of ``horovodrun``.
        required (tuple[str, ...] | list[str]): flags that must be ``[X]``; see :func:`missing_flags`.
        env (dict[str, str] | None): environment for the command.

    Returns:
        str: the command's output.

    Raises:
        HpcstackError: the command fails; its output does not parse (:class:`CheckBuildParseError`,
            see :func:`parse_check_build`); or it names each missing flag,
            e.g. ``horovodrun --check-build: missing [X] Operations:NCCL``.
    """
    try:
        proc = subprocess.run([horovodrun, "--check-build"], env=env, capture_output=True, text=True,
                          cwd=CHILD_CWD)
    except FileNotFoundError:
        raise HpcstackError(f"{horovodrun} not found: is Horovod installed in the stack?")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise HpcstackError(f"horovodrun --check-build failed ({proc.returncode}): {' | '.join(tail)}")
    missing = missing_flags(parse_check_build(proc.stdout), required)
    if missing:
        raise HpcstackError("horovodrun --check-build: missing " + ", ".join(f"[X] {m}" for m in missing)
                            + " (check the HOROVOD_* settings in the site config)")
    return proc.stdout
