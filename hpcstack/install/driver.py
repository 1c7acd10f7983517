"""Whether the compute nodes' GPU driver runs the CUDA a lock's wheels were built for.

A prebuilt CUDA wheel (torch ``2.3.1+cu121``, NVIDIA's ``nvidia-cuda-runtime-cu12==12.1.105``,
``cuda-toolkit==13.0.3``) carries the CUDA runtime of its build; the node's driver must run it.
From CUDA 11 on, NVIDIA's *minor version compatibility* lets an application built with any CUDA
``X.y`` run on a driver of the same major family at or above a minimum (the table below); before
CUDA 11 each minor release needs its own driver. A driver of a newer major runs older CUDA
(backward compatibility). So a wheel built for CUDA ``X.Y`` (X >= 11) needs:

* a driver at least :data:`MIN_DRIVER` ``[X]`` (``gpu.driver_version``), and
* a CUDA driver API (``nvidia-smi``'s "CUDA Version", ``gpu.cuda_driver_api``) of at least ``X.0``.

The site states either, both or neither (:class:`hpcstack.site.GpuConfig`): with neither there is
no check. The check runs on the lock the site installs when the plan is resolved
(:func:`check_wheels`, called by :class:`hpcstack.install.components.wheels.PipWheels`), so the
install and ``--dry-run`` refuse before anything is written.
"""

from __future__ import annotations

import os
import re

from hpcstack.errors import ConfigError

#: Minimum Linux x86_64 driver per CUDA release family, as ``(major, minor, patch)``: "CUDA Toolkit
#: and Minimum Required Driver Version for CUDA Minor Version Compatibility", NVIDIA CUDA Toolkit
#: release notes (https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html): CUDA 12.x
#: >= 525.60.13, CUDA 11.x >= 450.80.02 (CUDA 11.0 shipped with an earlier driver; minor version
#: compatibility across 11.x starts at 450.80.02). CUDA 13.x: the table says ">= 580"; hpcstack
#: asks for 580.65.06, the driver CUDA 13.0 GA requires (the same notes, "CUDA Toolkit and
#: Corresponding Driver Versions"). CUDA 10.x has no minor version compatibility: each minor
#: needs the driver it shipped with (https://docs.nvidia.com/deploy/cuda-compatibility/
#: minor-version-compatibility.html, "CUDA Toolkit 10.x Minimum Required Driver Versions").
#: Keys: ``"X"`` for a family with minor version compatibility, ``"X.Y"`` for one release.
MIN_DRIVER: dict[str, tuple[int, ...]] = {
    "13": (580, 65, 6),
    "12": (525, 60, 13),
    "11": (450, 80, 2),
    "10.2": (440, 33),
    "10.1": (418, 39),
    "10.0": (410, 48),
}
#: The first CUDA major with minor version compatibility (NVIDIA: "From CUDA 11 onwards").
MINOR_COMPAT_FROM = 11
#: Where the table comes from, for the error lines.
SOURCE = "NVIDIA CUDA Toolkit release notes, minor version compatibility"

#: A CUDA runtime package of a lock: NVIDIA's ``nvidia-cuda-runtime-cu12`` (CUDA 12 wheels),
#: ``nvidia-cuda-runtime`` (CUDA 13) and the ``cuda-toolkit`` metapackage (torch's CUDA 13 wheels).
_RUNTIME = re.compile(r"nvidia-cuda-runtime(-cu\d+)?|cuda-toolkit")


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def _text(version: tuple[int, ...]) -> str:
    """``(525, 60, 13)`` -> ``"525.60.13"``; NVIDIA writes the patch with two digits (``580.65.06``)."""
    return ".".join([str(version[0])] + [f"{v:02d}" for v in version[1:]])


def cuda_of_pin(name: str, version: str) -> str | None:
    """The CUDA ``X.Y`` a locked pin was built for, or None where it says none.

    From the version's local label (``2.3.1+cu121`` -> ``12.1``, ``2.9.0+cu130`` -> ``13.0``), or
    the version of a CUDA runtime package (``nvidia-cuda-runtime-cu12==12.1.105`` -> ``12.1``,
    ``cuda-toolkit==13.0.3.0`` -> ``13.0``); the rule of
    :func:`hpcstack.install.gpuarch.cuda_of_wheel`, read from the lock instead of the wheel.

    Args:
        name (str): the package's name as the lock writes it.
        version (str): its pinned version.

    Example:
        >>> cuda_of_pin("torch", "2.3.1+cu121"), cuda_of_pin("nvidia-cuda-runtime", "13.0.96")
        ('12.1', '13.0')
    """
    label = re.search(r"\+cu(\d+)(\d)(?:\.|$)", version)   # also 2.3.1+cu121.with.pypi.cudnn
    if label:
        return f"{int(label.group(1))}.{label.group(2)}"
    runtime = re.match(r"(\d+)\.(\d+)", version)
    if _RUNTIME.fullmatch(name.lower().replace("_", "-")) and runtime:
        return f"{runtime.group(1)}.{runtime.group(2)}"
    return None


def lock_cuda(pins, python_version: str | None) -> list[tuple[str, str]]:
    """The pins of a lock that state a CUDA version, with it: ``[("torch==2.3.1+cu121", "12.1"), …]``.

    Args:
        pins (Iterable[hpcstack.install.lockfile.Pin]): the lock's pins.
        python_version (str | None): the site's Python ``X.Y``: pins whose marker leaves them out
            there are left out (all count where it is None).
    """
    found = []
    for pin in pins:
        if python_version and not pin.applies(python_version):
            continue
        cuda = cuda_of_pin(pin.name, pin.version)
        if cuda:
            found.append((f"{pin.name}=={pin.version}", cuda))
    return found


def min_driver(cuda: str) -> tuple[int, ...] | None:
    """The lowest driver that runs CUDA ``X.Y`` (:data:`MIN_DRIVER`); None where the table has
    no entry (a CUDA newer than it, or older than 10.0)."""
    major = cuda.split(".")[0]
    return MIN_DRIVER.get(cuda) or (MIN_DRIVER.get(major) if int(major) >= MINOR_COMPAT_FROM else None)


def min_driver_api(cuda: str) -> str:
    """The lowest CUDA driver API (``nvidia-smi``'s "CUDA Version") that runs CUDA ``X.Y``:
    ``X.0`` under minor version compatibility (CUDA 11 and later), else ``X.Y``."""
    major, minor = _numbers(cuda)[:2]
    return f"{major}.0" if major >= MINOR_COMPAT_FROM else f"{major}.{minor}"


def driver_problems(driver_version: str | None, cuda_driver_api: str | None,
                    needs: list[tuple[str, str]], what: str) -> tuple[list[str], str | None]:
    """Lines for a driver that cannot run the CUDA of ``needs``, and a note where it cannot tell.

    The newest CUDA among ``needs`` decides (the pins that state it are named). Per key the site
    gives, one line: ``gpu.driver_version`` below :func:`min_driver`, ``gpu.cuda_driver_api``
    below :func:`min_driver_api`.

    Args:
        driver_version (str | None): ``gpu.driver_version`` (``"535.104.05"``); None: not given.
        cuda_driver_api (str | None): ``gpu.cuda_driver_api`` (``"12.2"``); None: not given.
        needs (list[tuple[str, str]]): :func:`lock_cuda`'s answer.
        what (str): the wheels, for the lines (``"the wheels of 2.3.1-gpu.cu121.lock"``).

    Returns:
        tuple[list[str], str | None]: the lines (none where the driver runs them, no key is given
        or no pin states a CUDA), and a note where only ``gpu.driver_version`` is given and the
        table has no entry for the CUDA (nothing refused then).

    Example:
        >>> driver_problems("470.57.02", None, [("torch==2.3.1+cu121", "12.1")], "the wheels")[0]
        ['gpu.driver_version: driver 470.57.02 is too old for the wheels: torch==2.3.1+cu121 is built for CUDA 12.1, which needs driver >= 525.60.13 (NVIDIA CUDA Toolkit release notes, minor version compatibility); update the driver or install wheels built for an older CUDA']
    """
    if not needs or not (driver_version or cuda_driver_api):
        return [], None
    newest = max(_numbers(cuda) for _, cuda in needs)
    cuda = ".".join(str(n) for n in newest[:2])
    named = [p for p, c in needs if _numbers(c) == newest]
    pins = ", ".join(named) + (" is" if len(named) == 1 else " are")
    lines, note = [], None
    if driver_version:
        least = min_driver(cuda)
        if least is None:
            note = (f"gpu.driver_version: the driver table of hpcstack ({SOURCE}) has no entry for CUDA {cuda} "
                    f"({pins} built for it): not checked; give gpu.cuda_driver_api")
        elif _numbers(driver_version) < least:
            lines.append(f"gpu.driver_version: driver {driver_version} is too old for {what}: {pins} built "
                         f"for CUDA {cuda}, which needs driver >= {_text(least)} ({SOURCE}); update the driver "
                         "or install wheels built for an older CUDA")
    if cuda_driver_api:
        least_api = min_driver_api(cuda)
        if _numbers(cuda_driver_api) < _numbers(least_api):
            lines.append(f"gpu.cuda_driver_api: the driver's CUDA {cuda_driver_api} is too old for {what}: {pins} "
                         f"built for CUDA {cuda}, which needs CUDA driver API >= {least_api} ({SOURCE}); "
                         "update the driver or install wheels built for an older CUDA")
    return lines, note


#: The notes printed by this process (each once: an install resolves its plan more than once).
_NOTED: set = set()


def check_wheels(lock: str, python_version: str | None, gpu, where: str) -> None:
    """Refuse a lock whose wheels the compute nodes' GPU driver cannot run (:func:`driver_problems`).

    Called where the plan is resolved (:meth:`hpcstack.install.components.wheels.PipWheels.contribute`),
    so ``--dry-run`` and the install refuse before anything is written, and the check is no part
    of any step: a ``gpu`` section added to (or changed in) a site with installed stacks does not
    make them out of date.

    Args:
        lock (str): the lock file the site installs.
        python_version (str | None): the site's Python ``X.Y`` (which pins apply).
        gpu (hpcstack.site.GpuConfig | None): the site's ``gpu`` section; nothing is checked
            where it gives neither key (or is None: a stand-in site without one).
        where (str): the site config's file, to start each line with.

    Raises:
        ConfigError: one line per ``gpu`` key whose driver is too old for the wheels (naming the
            key, the driver and what the wheels need); a lock that cannot be read.
    """
    if gpu is None or not gpu.known:
        return
    from hpcstack.install.lockfile import read_lock

    needs = lock_cuda(read_lock(lock), python_version)
    lines, note = driver_problems(gpu.driver_version, gpu.cuda_driver_api, needs,
                                  f"the wheels of {os.path.basename(lock)}")
    if note and note not in _NOTED:
        from hpcstack.install.runner import console

        _NOTED.add(note)
        console.print(f"note: {note}", markup=False)
    if lines:
        raise ConfigError([f"{where}: {line}" for line in lines])
