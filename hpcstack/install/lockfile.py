"""Hashed lock files, read: one :class:`Pin` per ``name==version`` (what the wheels step
installs, what the constraints file and the SBOM list, what an export downloads)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcstack.errors import ConfigError

#: The index of a pin when the lock names none.
PYPI = "https://pypi.org/simple"


@dataclass(frozen=True)
class Pin:
    """One ``name==version`` of a lock file.

    Attributes:
        name (str): the package name as the lock writes it (``nvidia-cublas-cu12``).
        version (str): the pinned version (``2.3.1+cu121`` keeps its local part).
        marker (str | None): its PEP 508 environment marker, if any.
        hashes (tuple[str, ...]): the sha256 of every file the lock allows, in the lock's order.
        index (str): the index it comes from (``# from URL`` annotation, else the lock's
            ``--index-url``, else PyPI).
    """

    name: str
    version: str
    marker: str | None = None
    hashes: tuple = ()
    index: str = PYPI

    def constraint(self) -> str:
        """``name==version`` with ``; marker`` when there is one."""
        return f"{self.name}=={self.version}" + (f" ; {self.marker}" if self.marker else "")

    def applies(self, python_version: str) -> bool:
        """Whether the pin's PEP 508 marker holds for CPython ``python_version`` (``X.Y``) on
        x86_64 Linux (True without a marker).

        Raises:
            packaging.markers.InvalidMarker: a marker that cannot be read.
        """
        from packaging.markers import Marker

        return self.marker is None or Marker(self.marker).evaluate(marker_environment(python_version))


def marker_environment(python_version: str) -> dict[str, str]:
    """PEP 508 marker variables of CPython ``X.Y`` on x86_64 Linux (the machines stacks run on)."""
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
            "os_name": "posix", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
            "implementation_version": f"{python_version}.0", "extra": ""}


#: Locks read by this process: ``{path: (stamp, pins)}``, the stamp the file's device, inode,
#: mtime, ctime and size (a rewrite, in place or by rename, changes one); one install reads the
#: same lock in several components (module help, the manifest, the wheels step's check).
_READ: dict[str, tuple[tuple[int, ...], tuple[Pin, ...]]] = {}


def read_lock(path: str) -> list[Pin]:
    """Parse a hashed requirements lock file.

    The format ``hpcstack lock`` writes (``uv pip compile --generate-hashes``): a pin per
    requirement with its ``--hash=sha256:`` continuation lines, an optional ``# from URL``
    annotation naming its index, and the file's ``--index-url``. Requirements are parsed with
    :mod:`packaging` (PEP 508).

    Args:
        path (str): the lock file (``recipes/pytorch/2.3.1-gpu.pypi.lock``).

    Returns:
        list[Pin]: in file order.

    Raises:
        ConfigError: unreadable, or a pin that is not ``name==version`` with hashes.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            stamp = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if path in _READ and _READ[path][0] == stamp:
                return list(_READ[path][1])
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"])
    index = PYPI
    entries: list[list[str]] = []            # [requirement text, hash..., from-index]
    current: list[str] | None = None
    for line in lines:
        text = line.strip()
        if text.startswith("--index-url"):
            index = text.split(None, 1)[1].rstrip("/")
            continue
        if text.startswith("# from ") and entries:
            entries[-1].append("from:" + text[len("# from "):].strip().rstrip("/"))
            continue
        if not text or text.startswith("#") or text.startswith("--"):
            if not (current is not None and text.startswith("--hash=")):
                continue
        body = text.rstrip("\\").strip()
        if current is None:
            current = [body]
            entries.append(current)
        elif body.startswith("--hash="):
            current.append(body)
        if not text.endswith("\\"):
            current = None
    pins, problems = [], []
    for entry in entries:
        try:
            req = Requirement(entry[0])
        except InvalidRequirement as exc:
            problems.append(f"{path}: {entry[0]!r}: not a requirement ({exc})")
            continue
        spec = list(req.specifier)
        hashes = tuple(dict.fromkeys(h.split(":", 1)[1] for h in entry[1:] if h.startswith("--hash=sha256:")))
        if len(spec) != 1 or spec[0].operator != "==" or not hashes:
            problems.append(f"{path}: {entry[0]!r}: expected name==version with --hash=sha256 lines")
            continue
        source = next((e[5:] for e in entry[1:] if e.startswith("from:")), index)
        # the marker as the lock writes it (packaging would normalise its quotes)
        marker = entry[0].split(";", 1)[1].strip() if req.marker else None
        pins.append(Pin(req.name, spec[0].version, marker, hashes, source))
    if problems:
        raise ConfigError(problems)
    _READ[path] = (stamp, tuple(pins))
    return pins
