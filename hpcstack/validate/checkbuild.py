"""Parse ``horovodrun --check-build`` and require flags (sanity check, issue 2 item 5)."""

from __future__ import annotations

import re
import subprocess

from hpcstack.errors import HpcstackError

#: Section headings of ``horovodrun --check-build`` (Horovod 0.28.1) and their short names.
SECTIONS = {"Available Frameworks": "Frameworks", "Available Controllers": "Controllers",
            "Available Tensor Operations": "Operations"}
_FLAG = re.compile(r"^\s*\[(X| )\]\s+(\S+)\s*$")


def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """Parse the output of ``horovodrun --check-build``.

    Args:
        text (str): the output, e.g. ``"Available Controllers:\\n    [X] MPI\\n    [ ] Gloo"``.

    Returns:
        dict[str, dict[str, bool]]: ``{"Frameworks": {"PyTorch": True, …}, "Controllers": …,
        "Operations": …}``.
    """
    result: dict[str, dict[str, bool]] = {}
    section = None
    for line in text.splitlines():
        heading = line.strip().rstrip(":")
        if heading in SECTIONS:
            section = SECTIONS[heading]
            result[section] = {}
            continue
        m = _FLAG.match(line)
        if m and section:
            result[section][m.group(2)] = m.group(1) == "X"
    return result


def missing_flags(flags: dict[str, dict[str, bool]], required: tuple[str, ...] | list[str]) -> list[str]:
    """Return the required flags that are not ``[X]``.

    Args:
        flags: from :func:`parse_check_build`.
        required: ``"Name"`` (must be ``[X]`` in every section that lists it, e.g. ``MPI`` as a
            controller and as a tensor operation) or ``"Section:Name"``.

    Returns:
        list[str]: e.g. ``["Operations:NCCL"]``.
    """
    missing = []
    for req in required:
        section, _, name = req.rpartition(":")
        sections = [section] if section else [s for s in flags if name in flags[s]] or list(flags)
        for s in sections:
            if not flags.get(s, {}).get(name, False):
                missing.append(f"{s}:{name}")
    return missing


def check_build(horovodrun: str, required, env: dict[str, str] | None = None) -> str:
    """Run ``horovodrun --check-build`` and require flags.

    Args:
        horovodrun (str): path or name of ``horovodrun``.
        required: see :func:`missing_flags`.
        env (dict[str, str] | None): environment for the command.

    Returns:
        str: the command's output.

    Raises:
        HpcstackError: the command fails, or names each missing flag,
            e.g. ``horovodrun --check-build: missing [X] Operations:NCCL``.
    """
    try:
        proc = subprocess.run([horovodrun, "--check-build"], env=env, capture_output=True, text=True)
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
