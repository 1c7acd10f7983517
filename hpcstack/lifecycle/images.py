"""A container image as one side of ``hpcstack compare``: the stack that ``hpcstack export
--format docker`` installs in the image, read from the image's own files with buildah.

The image holds the stack as ``hpcstack install`` left it inside (its prefix, its venv and its
``.hpcstack/sbom.cdx.json``, written in the image by the same code as on the site), so nothing is
generated again: a working container is made from the image (``buildah from``), its root file
system mounted (``buildah mount``: a directory on the host, nothing runs in the image), the stack
found and read there like an installed prefix, then the container is removed (``buildah umount``,
``buildah rm``) whatever happens.

Which stack: the image's label ``org.hpcstack.recipe`` (``NAME/VERSION``, written by the export)
and its environment's ``HPCSTACK_<NAME>_ROOT`` (the module's root variable, which the export sets
in the image), the prefix inside the image. Links on the way (the published prefix is a link to
its build) are followed inside the image's root, never out of it.

Arguments (:func:`image_reference`): ``image:REF``, where REF is whatever ``buildah from`` takes
(``localhost/hpcstack-mpi4py:4.1.2``, ``oci-archive:/path/image.tar``, ``docker-archive:…``), or
the path of an OCI archive (a tar holding ``oci-layout``: ``buildah push IMAGE oci-archive:PATH``),
read as ``oci-archive:PATH``. An archive is imported into buildah's storage to be mounted (it
stays there, as ``buildah from`` leaves it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

from hpcstack import gate, trust
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD

#: The prefix that names an image argument of ``hpcstack compare``.
IMAGE_PREFIX = "image:"
#: The label the export writes: the recipe's ``NAME/VERSION``.
RECIPE_LABEL = "org.hpcstack.recipe"


def image_reference(arg: str) -> str | None:
    """The ``buildah from`` reference ``arg`` names, or None when it names no image.

    A path that names a file is opened once, through the gate (:func:`hpcstack.gate.open_file`:
    every component from ``/`` without following a link, the file ``O_NOFOLLOW|O_NONBLOCK`` and
    a regular one by ``fstat``; links on the way resolved first only where trusted accounts
    alone can have put them, :func:`hpcstack.gate.resolved`), and read as a tar from that
    descriptor. As root, the archive and every directory above it must be ones that only
    trusted accounts can change (:func:`hpcstack.gate.current_policy`): buildah, run as root,
    then reads it by that path, which no one else can change. Any other account reads only what
    it may read anyway: only the links and the kind are checked (a policy with
    ``trust_writable``).

    Args:
        arg (str): ``image:REF`` or the path of an OCI archive (a tar file holding ``oci-layout``).

    Returns:
        str | None: REF, ``oci-archive:<absolute path>``, or None (not a file, not a tar, no
        ``oci-layout`` in it).

    Raises:
        ConfigError: ``image:`` with nothing after it; a file that is refused (a link, not a
            regular file, as root one that an untrusted account can change), cannot be read,
            or is a damaged tar (one line).
    """
    if arg.startswith(IMAGE_PREFIX):
        ref = arg[len(IMAGE_PREFIX):]
        if not ref or ref.startswith("-"):
            raise ConfigError([f"{arg}: give the image after image: (e.g. image:localhost/hpcstack-mpi4py:4.1.2)"])
        return ref
    named = os.path.abspath(arg)
    if not os.path.isfile(named):       # a directory (a stack, a bundle), NAME/VERSION: no archive
        return None
    pol = gate.current_policy() if os.geteuid() == 0 else trust.Policy(uid=os.geteuid(), trust_writable=True)
    try:
        real = gate.resolved(named, pol)
        with os.fdopen(gate.open_file(real, pol), "rb") as f:
            if not tarfile.is_tarfile(f):
                return None
            f.seek(0)
            with tarfile.open(fileobj=f) as tar:
                if not any(m.name.lstrip("./") == "oci-layout" for m in tar):
                    return None
    except gate.GateError as exc:
        raise ConfigError([f"{arg}: the image archive is not read: {exc.problem}"]) from None
    except OSError as exc:
        raise ConfigError([f"{arg}: cannot read the image archive: {exc.strerror or exc}"]) from None
    except tarfile.TarError as exc:
        raise ConfigError([f"{arg}: a damaged tar archive ({exc})"]) from None
    return f"oci-archive:{real}"


def buildah_command(driver: str | None = None, root: str | None = None) -> list[str]:
    """``buildah`` with the storage to use: ``--storage-driver`` (default ``$STORAGE_DRIVER``,
    else buildah's own configuration) and ``--root``.

    Raises:
        HpcstackError: buildah is not installed.
    """
    exe = shutil.which("buildah")
    if exe is None:
        raise HpcstackError("buildah is not installed: it reads container images (Debian's package buildah)")
    cmd = [exe]
    driver = driver or os.environ.get("STORAGE_DRIVER")
    if driver:
        cmd += ["--storage-driver", driver]
    if root:
        cmd += ["--root", root]
    return cmd


def _buildah(cmd: list[str], *args: str, what: str) -> str:
    try:
        proc = subprocess.run([*cmd, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=CHILD_CWD,
                              timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HpcstackError(f"cannot run buildah to {what}: {exc}") from None
    if proc.returncode != 0:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["(no message)"]
        raise HpcstackError(f"buildah could not {what}: {last[0]}")
    return proc.stdout.strip()


def inside(root: Path, path: str, hops: int = 40) -> Path:
    """``path`` of the image resolved under its mounted ``root``: every link on the way is
    followed as the image would (an absolute target from ``root``), and ``..`` stops at ``root``.

    Args:
        root (Path): the image's mounted root file system.
        path (str): an absolute path inside the image.
        hops (int): the most links to follow (a loop ends there).

    Returns:
        Path: the host path of what ``path`` names in the image (it may not exist).

    Raises:
        HpcstackError: more than ``hops`` links.
    """
    parts = [p for p in path.split("/") if p and p != "."]
    done: list[str] = []
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = root.joinpath(*done, part)
        if here.is_symlink():
            hops -= 1
            if hops < 0:
                raise HpcstackError(f"{path}: too many links inside the image")
            target = os.readlink(here)
            parts = [p for p in target.split("/") if p and p != "."] + parts
            if target.startswith("/"):
                done = []
            continue
        done.append(part)
    return root.joinpath(*done)


@contextlib.contextmanager
def mounted_image(ref: str, driver: str | None = None, storage_root: str | None = None):
    """The image ``ref`` mounted through a working container that is removed on leaving.

    Args:
        ref (str): what ``buildah from`` takes (:func:`image_reference`).
        driver (str | None): buildah's storage driver (``vfs`` on machines without overlay).
        storage_root (str | None): buildah's storage directory (``--root``).

    Yields:
        tuple[Path, dict]: the mounted root and the image's configuration (OCI ``config``:
        ``Env``, ``Labels``, ...).

    Raises:
        HpcstackError: buildah is missing, or cannot make, mount or inspect the container.
    """
    cmd = buildah_command(driver, storage_root)
    name = f"hpcstack-compare-{uuid.uuid4().hex[:12]}"
    ctr = _buildah(cmd, "from", "--quiet", "--name", name, ref, what=f"make a container of {ref}")
    try:
        root = Path(_buildah(cmd, "mount", ctr, what=f"mount the image {ref}"))
        info = json.loads(_buildah(cmd, "inspect", "--type", "container", ctr, what=f"inspect {ref}") or "{}")
        config = ((info.get("OCIv1") or {}).get("config")) or {}
        yield root, config
    finally:
        subprocess.run([*cmd, "umount", ctr], capture_output=True, stdin=subprocess.DEVNULL, cwd=CHILD_CWD)
        subprocess.run([*cmd, "rm", ctr], capture_output=True, stdin=subprocess.DEVNULL, cwd=CHILD_CWD)


def stack_prefix(root: Path, config: dict, ref: str) -> tuple[str, Path]:
    """The stack an image holds: ``(NAME/VERSION, its prefix under root)``.

    Raises:
        ConfigError: the image has no ``org.hpcstack.recipe`` label or no root variable (not an
            image of ``hpcstack export``), or nothing at that prefix.
    """
    from hpcstack.modules.writer import root_variable

    labels = config.get("Labels") or {}
    full = labels.get(RECIPE_LABEL)
    if not full or "/" not in full:
        raise ConfigError([f"image {ref}: no label {RECIPE_LABEL}: not an image of hpcstack export"])
    variable = root_variable(full.split("/", 1)[0])
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    if not env.get(variable, "").startswith("/"):
        raise ConfigError([f"image {ref}: its environment sets no {variable}: not an image of hpcstack export"])
    prefix = inside(root, env[variable])
    if not prefix.is_dir():
        raise ConfigError([f"image {ref}: {full} is not installed at {env[variable]} in the image"])
    return full, prefix
