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
import shutil
import subprocess
import tempfile
from pathlib import Path

from hpcstack.fsutil import CHILD_CWD
from hpcstack.install.components.wheels import UV_UNSET, PipWheels
from hpcstack.errors import ConfigError, HpcstackError

def lock_command(source: Path, output: Path, indexes, python_version: str,
                 exclude_newer: str | None) -> list[str]:
    """Return the ``uv pip compile`` command line for a lock.

    Args:
        source (Path): the ``.in`` file of top-level requirements.
        output (Path): the lock file to write.
        indexes (tuple[str, ...]): index URLs, the first the main one (:class:`Lock.indexes`).
        python_version (str): the lowest ``X.Y`` the universal lock must support.
        exclude_newer (str | None): ``YYYY-MM-DD``; ignore files uploaded after it.
    """
    index_args = ["--index-url", indexes[0]]
    for extra in indexes[1:]:
        index_args += ["--extra-index-url", extra]
    cmd = [shutil.which("uv") or "uv", "pip", "compile", "--quiet", "--no-config", *index_args,
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
        HpcstackError: uv is missing or fails (no network, an unsatisfiable pin).
    """
    wheels = [c for c in recipe.components if isinstance(c, PipWheels)]
    if not wheels:
        raise ConfigError([f"recipe {recipe.full_name} has no PipWheels component: nothing to lock"])
    stem = wheels[0].stem
    source = Path(recipe.directory) / f"{stem}.in"
    if not source.is_file():
        raise ConfigError([f"{source}: missing (the top-level requirements to lock)"])
    lock = wheels[0].lock_for(site.toolchain, site.python_version, f"site {site.name}")
    output = Path(wheels[0].lock_path(recipe.directory, lock))
    with tempfile.TemporaryDirectory(dir=output.parent) as tmp:
        tmp_out = Path(tmp) / output.name
        cmd = lock_command(source, tmp_out, lock.indexes, wheels[0].min_python, wheels[0].exclude_newer)
        try:
            # without the uv settings of the caller's shell: a loaded stack module sets
            # UV_CONSTRAINT to the stack's pins, which would hold a re-lock to the old versions
            env = {k: v for k, v in os.environ.items() if k not in UV_UNSET}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=CHILD_CWD)
        except FileNotFoundError:
            raise HpcstackError("uv not found: pip install uv")
        if proc.returncode != 0:
            raise HpcstackError(f"uv pip compile failed: {proc.stderr.strip().splitlines()[-1:]}")
        header = (f"# Lock file '{lock.name}' of recipe {recipe.full_name}, written by\n"
                  f"#   hpcstack lock {recipe.full_name} --site {site.name}\n"
                  f"# with: uv {' '.join(cmd[1:-3])} {source.name}\n"
                  "# Every package is pinned with its sha256; each pin says which index it comes from.\n")
        output.write_text(header + tmp_out.read_text())
    return output



def _cuda_component(recipe):
    from hpcstack.install.components.cudawheels import CudaWheelArchs

    return next((c for c in recipe.components if isinstance(c, CudaWheelArchs)), None)


def record_gpu_archs(recipe, site, wheels=()) -> tuple[Path, list]:
    """Read the GPU architectures of the lock's CUDA wheels and keep them beside the lock.

    For a recipe with a :class:`~hpcstack.install.components.cudawheels.CudaWheelArchs`
    component: the wheel of its package that the site's Python installs from the lock that fits
    the site is downloaded (by the lock's sha256) into a temporary directory, read
    (:func:`hpcstack.install.gpuarch.read_wheel`) and deleted; ``wheels`` given (files obtained
    elsewhere, e.g. where the lock's index is reachable) are read instead, each only if the lock
    pins its sha256. The record file (:func:`hpcstack.install.gpuarch.record_path`) keeps the
    records of other wheels.

    Args:
        recipe (hpcstack.recipe.Recipe): the recipe.
        site (hpcstack.site.Site): the site (its lock, its Python).
        wheels (Iterable[str]): wheel files to read instead of downloading.

    Returns:
        tuple[Path, list[WheelArchs]]: the record file and the records written.

    Raises:
        ConfigError: the recipe has no CudaWheelArchs component, or a given wheel is not pinned.
        HpcstackError: the download or the reading fails.
    """
    from hpcstack.install import gpuarch
    from hpcstack.install.lockfile import read_lock

    comp = _cuda_component(recipe)
    if comp is None:
        raise ConfigError([f"recipe {recipe.full_name} has no CudaWheelArchs component: no GPU architectures to record"])
    pw = [c for c in recipe.components if isinstance(c, PipWheels)][0]
    lock = pw.lock_path(recipe.directory, pw.lock_for(site.toolchain, site.python_version, f"site {site.name}"))
    pins = [p for p in read_lock(lock) if p.name.lower() == comp.package.lower()]
    if not pins:
        raise ConfigError([f"{lock}: no pin of {comp.package}"])
    path = gpuarch.record_path(lock)
    records = gpuarch.load_records(path)
    written = []
    if wheels:
        for wheel in wheels:
            rec = gpuarch.read_wheel(str(wheel), comp.libraries)
            if not any(rec.sha256 in p.hashes for p in pins):
                raise ConfigError([f"{wheel}: sha256 {rec.sha256} is not pinned for {comp.package} in {lock}"])
            records[rec.sha256] = rec
            written.append(rec)
    else:
        if not site.python_version:
            raise ConfigError([f"site {site.name}: python.version is needed to choose the wheel to read"])
        for pin in pins:
            with tempfile.TemporaryDirectory(prefix="hpcstack-gpu-archs-") as tmp:
                rec = gpuarch.read_wheel(gpuarch.download_wheel(pin, site.python_version, tmp), comp.libraries)
            records[rec.sha256] = rec
            written.append(rec)
    gpuarch.save_records(path, records, comp.package)
    return Path(path), written
