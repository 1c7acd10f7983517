"""``hpcstack lock``: regenerate a recipe's lock file with uv (one lock per package index).

``uv pip compile --generate-hashes --universal`` (https://docs.astral.sh/uv/pip/compile/) pins
every transitive package with the sha256 of every file, for every Python version the recipe
supports; ``--emit-index-annotation`` records the index each pin comes from; ``--exclude-newer``
resolves as of the recipe's date, so a re-lock gives the same set.

Not to be confused with the install lock (:func:`hpcstack.install.runner.install_lock`, a
``flock`` that keeps two installs of one stack apart) nor with reading a lock file
(:mod:`hpcstack.install.lockfile`).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from hpcstack.fsutil import CHILD_CWD
from hpcstack.install.components.wheels import UV_UNSET, PipWheels, uv_binary
from hpcstack.errors import ConfigError, HpcstackError


class UvCompileError(HpcstackError):
    """``uv pip compile`` failed: uv's own error lines, each printed as an ``error:`` line.

    Args:
        lock (str): the lock being written (``<stem>.<name>.lock``), named in the first line.
        stderr (str): uv's standard error.
        stem (str): the ``PipWheels`` stem (named in the hint).
        min_python (str): the recipe's ``PipWheels(min_python=…)``, named where uv says that a
            package needs a newer Python (its ``requires-python`` hint).
    """

    def __init__(self, lock: str, stderr: str, stem: str, min_python: str):
        # uv writes "  × No solution found …", "  ╰─▶ Because …" and "hint: …" lines: kept
        # in order, without the tree drawing, blank lines dropped
        lines = [re.sub(r"^(error:\s*)?", "", re.sub(r"^[\s×╰─▶│├]+", "", line)).rstrip()
                 for line in stderr.splitlines()]
        self.details = [line for line in lines if line] or ["(uv printed nothing)"]
        if any("requires-python" in line for line in self.details):
            self.details.append(f"the lock is resolved for Python >= {min_python} (PipWheels' min_python, "
                                f"default 3.10) and a package needs a newer one: give PipWheels the "
                                f"lowest Python the packages support, e.g. PipWheels({stem!r}, "
                                f"min_python=\"{needed_python(self.details, min_python)}\"), if the "
                                f"sites' Python is that new; else pin an older release of the package")
        super().__init__(f"uv pip compile failed for {lock}: " + " ".join(self.details))
        self.lock = lock

    def lines(self) -> list[str]:
        return [f"uv pip compile failed for {self.lock}:"] + self.details


def needed_python(lines: list[str], min_python: str) -> str:
    """The Python that uv's ``requires-python`` hint proposes (``… (like >=3.12)``), else the
    next minor version after ``min_python``.

    Args:
        lines (list[str]): uv's error lines, as :class:`UvCompileError` keeps them.
        min_python (str): the recipe's ``PipWheels(min_python=…)``, ``"3.X"``.

    Returns:
        str: ``"3.Y"``, the value to suggest for ``min_python``.
    """
    for line in lines:
        found = re.search(r"\(like >=\s*(\d+\.\d+)", line)
        if found:
            return found.group(1)
    major, _, minor = min_python.partition(".")
    return f"{major}.{int(minor.split('.')[0]) + 1}" if minor[:1].isdigit() else "3.11"


def find_uv() -> str:
    """The uv that ``hpcstack install`` uses (:func:`hpcstack.install.components.wheels.uv_binary`:
    hpcstack's own, the ``uv`` package's binary, else one on PATH).

    Raises:
        HpcstackError: neither (``pip install uv`` into hpcstack's environment).
    """
    try:
        return uv_binary()
    except ConfigError:
        raise HpcstackError("uv not found: neither hpcstack's own (the uv package, an install "
                            "requirement of hpcstack) nor one on PATH: pip install uv") from None


def lock_command(source: Path, output: Path, indexes, python_version: str,
                 exclude_newer: str | None, uv: str | None = None) -> list[str]:
    """Return the ``uv pip compile`` command line for a lock.

    Args:
        source (Path): the ``.in`` file of top-level requirements.
        output (Path): the lock file to write.
        indexes (tuple[str, ...]): index URLs, the first the main one (:class:`Lock.indexes`).
        python_version (str): the lowest ``X.Y`` the universal lock must support.
        exclude_newer (str | None): ``YYYY-MM-DD``; ignore files uploaded after it.
        uv (str | None): the uv executable; default :func:`find_uv`.

    Raises:
        HpcstackError: ``uv`` not given and none found (:func:`find_uv`).
    """
    index_args = ["--index-url", indexes[0]]
    for extra in indexes[1:]:
        index_args += ["--extra-index-url", extra]
    cmd = [uv or find_uv(), "pip", "compile", "--quiet", "--no-config", *index_args,
           "--universal", "--python-version", python_version, "--generate-hashes",
           "--emit-index-annotation", "--emit-index-url", "--no-header"]
    if exclude_newer:
        cmd += ["--exclude-newer", exclude_newer]
    return cmd + [str(source), "-o", str(output)]


def write_lock(recipe, site) -> Path:
    """Write ``<stem>.<index>.lock`` next to the recipe, atomically.

    Args:
        recipe (hpcstack.recipe.Recipe): a recipe with a :class:`PipWheels` component.
        site (hpcstack.site.Site): the lock that fits it (its CUDA and Python) is the one written.

    Returns:
        Path: the lock file.

    Raises:
        ConfigError: the recipe has no PipWheels component or no ``<stem>.in``.
        HpcstackError: uv is missing (:func:`find_uv`); :class:`UvCompileError`: uv fails (no
            network, an unsatisfiable pin, a package that needs a newer Python than ``min_python``).
    """
    wheels = recipe.component(PipWheels)
    if wheels is None:
        raise ConfigError([f"recipe {recipe.full_name} has no PipWheels component: nothing to lock"])
    stem = wheels.stem
    source = Path(recipe.directory) / f"{stem}.in"
    if not source.is_file():
        raise ConfigError([f"{source}: missing (the top-level requirements to lock)"])
    lock = wheels.lock_for(site.toolchain, site.python_version, f"site {site.name}")
    output = Path(wheels.lock_path(recipe.directory, lock))
    with tempfile.TemporaryDirectory(dir=output.parent) as tmp:
        tmp_out = Path(tmp) / output.name
        cmd = lock_command(source, tmp_out, lock.indexes, wheels.min_python, wheels.exclude_newer)
        try:
            # without the uv settings of the caller's shell: a loaded stack module sets
            # UV_CONSTRAINT to the stack's pins, which would hold a re-lock to the old versions
            env = {k: v for k, v in os.environ.items() if k not in UV_UNSET}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=CHILD_CWD)
        except OSError as exc:
            raise HpcstackError(f"cannot run {cmd[0]}: {exc.strerror}") from None
        if proc.returncode != 0:
            raise UvCompileError(output.name, proc.stderr, stem, wheels.min_python)
        header = (f"# Lock file '{lock.name}' of recipe {recipe.full_name}, written by\n"
                  f"#   hpcstack lock {recipe.full_name} --site {site.name}\n"
                  f"# with: uv {' '.join(cmd[1:-3])} {source.name}\n"
                  "# Every package is pinned with its sha256; each pin says which index it comes from.\n")
        output.write_text(header + tmp_out.read_text())
    return output



def _cuda_components(recipe) -> list:
    from hpcstack.install.components.cudawheels import CudaWheelArchs

    return recipe.components_of(CudaWheelArchs)


def _wheel_name(path) -> str:
    """The normalised project name of a wheel file (``jax_cuda12_pjrt-…`` -> ``jax-cuda12-pjrt``)."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

    try:
        return parse_wheel_filename(os.path.basename(str(path)))[0]
    except InvalidWheelFilename:
        return canonicalize_name(os.path.basename(str(path)).split("-")[0])


def record_gpu_archs(recipe, site, wheels=()) -> tuple[Path, list]:
    """Read the GPU architectures of the lock's CUDA wheels and keep them beside the lock.

    For each :class:`~hpcstack.install.components.cudawheels.CudaWheelArchs` component of the
    recipe (a JAX stack has two: ``jax-cuda12-pjrt`` and ``jax-cuda12-plugin``): the wheel of its
    package that the site's Python installs from the lock that fits the site is downloaded (by the
    lock's sha256) into a temporary directory, read (:func:`hpcstack.install.gpuarch.read_wheel`,
    with the component's ``libraries``) and deleted; ``wheels`` given (files obtained elsewhere,
    e.g. where the lock's index is reachable) are read instead, each with the libraries of the
    component whose package it is (by its file name), and only if the lock pins its sha256. The
    record file (:func:`hpcstack.install.gpuarch.record_path`, one per lock) keeps the records of
    other wheels.

    Args:
        recipe (hpcstack.recipe.Recipe): the recipe.
        site (hpcstack.site.Site): the site (its lock, its Python).
        wheels (Iterable[str]): wheel files to read instead of downloading.

    Returns:
        tuple[Path, list[WheelArchs]]: the record file and the records written.

    Raises:
        ConfigError: the recipe has no CudaWheelArchs component, a component's package has no
            pin in the lock, or a given wheel is of no component's package or not pinned.
        HpcstackError: the download or the reading fails.
    """
    from packaging.utils import canonicalize_name

    from hpcstack.install import gpuarch
    from hpcstack.install.lockfile import read_lock

    comps = _cuda_components(recipe)
    if not comps:
        raise ConfigError([f"recipe {recipe.full_name} has no CudaWheelArchs component: no GPU architectures to record"])
    pw = recipe.component(PipWheels)
    lock = pw.lock_path(recipe.directory, pw.lock_for(site.toolchain, site.python_version, f"site {site.name}"))
    locked = read_lock(lock)
    pins = {}
    for comp in comps:
        pins[canonicalize_name(comp.package)] = [p for p in locked if canonicalize_name(p.name) == canonicalize_name(comp.package)]
        if not pins[canonicalize_name(comp.package)]:
            raise ConfigError([f"{lock}: no pin of {comp.package}"])
    path = gpuarch.record_path(lock)
    records = gpuarch.load_records(path)
    written = []
    if wheels:
        by_name = {canonicalize_name(c.package): c for c in comps}
        for wheel in wheels:
            comp = by_name.get(_wheel_name(wheel))
            if comp is None:
                raise ConfigError([f"{wheel}: not a wheel of {', '.join(c.package for c in comps)} "
                                   "(the packages of the recipe's CudaWheelArchs components)"])
            rec = gpuarch.read_wheel(str(wheel), comp.libraries)
            if not any(rec.sha256 in p.hashes for p in pins[canonicalize_name(comp.package)]):
                raise ConfigError([f"{wheel}: sha256 {rec.sha256} is not pinned for {comp.package} in {lock}"])
            records[rec.sha256] = rec
            written.append(rec)
    else:
        if not site.python_version:
            raise ConfigError([f"site {site.name}: python.version is needed to choose the wheel to read"])
        for comp in comps:
            for pin in pins[canonicalize_name(comp.package)]:
                with tempfile.TemporaryDirectory(prefix="hpcstack-gpu-archs-") as tmp:
                    rec = gpuarch.read_wheel(gpuarch.download_wheel(pin, site.python_version, tmp), comp.libraries)
                records[rec.sha256] = rec
                written.append(rec)
    gpuarch.save_records(path, records, ", ".join(c.package for c in comps))
    return Path(path), written
