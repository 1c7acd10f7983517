"""``hpcstack compare A B``: are two deliveries of a stack the same stack, and what changed between
two stacks.

A and B are each an installed stack (its prefix, or ``NAME/VERSION`` of the site's install root),
a container image built from ``hpcstack export`` (``image:REF`` or an OCI archive: the stack
installed in the image, read through ``buildah mount``, :mod:`hpcstack.lifecycle.images`) or an
offline bundle (``hpcstack bundle``'s directory). Of each it reads:

- the distributions and versions its SBOM lists (``.hpcstack/sbom.cdx.json``), and for an
  installed stack (or an image's) every distribution of its venv (``*.dist-info``): one the SBOM
  leaves out is a difference of its own (the SBOM must be complete);
- the files its SBOM lists for each distribution with their sha256
  (:func:`hpcstack.install.components.manifest.distribution_files`), checked against the files on
  disk: a file changed, added to or missing from a distribution since the SBOM was written is a
  difference (an SBOM written before it listed files gives a note, not a difference);
- the files of every distribution: for an installed stack each file its ``RECORD`` names, hashed
  on disk (sha256); for a bundle the ``RECORD`` of each wheel (whose own sha256 the bundle's
  manifest and the lock vouch for). Left out on both sides, as the installer writes them and they
  differ between two correct installs: ``__pycache__``/``*.pyc`` (compiled at install; the same
  files give the same bytes, :mod:`hpcstack.install.bytecode`, but each names its source's
  path, which differs between two prefixes), files outside ``site-packages`` (entry-point
  scripts carry the venv's path in their ``#!`` line) and the installer's own ``RECORD``,
  ``INSTALLER``, ``REQUESTED``, ``direct_url.json``. A distribution built from its sdist on the site (Horovod) is compared by
  version only: its binary depends on the build machine;
- what it was built for (Python, CUDA, MPI: the SBOM's build environment and the site config the
  stack records) and its validation figures (``.hpcstack/validation.json``, or ``--report`` of
  each: ``hpcstack validate``'s ``report.json``).

It prints every difference, one line each, then a summary; exit 1 when anything differs, 0 when
nothing does, 2 for bad input. Two ``NAME/VERSION`` (two recipes' stacks for the site, e.g.
``pytorch/2.3.1-gpu pytorch/2.14.1-gpu``) give the admin's announcement: added, removed and
changed distributions, what each was built for and the validation figures side by side, without
hashing files (``--files`` hashes those of the same version on both sides).

What it reads, it reads as root may read a stack that others made (an image is anyone's): only
regular files below the compared tree (:class:`Tree`: opened by descriptor one component at a
time with ``O_NOFOLLOW``, checked by ``lstat`` and ``fstat``, read up to a limit), so a FIFO, a
device or a link out of the tree is never read (a file of a distribution that is one is a
difference, ``not read``); an image's links are followed inside its root file system, never the
host's ``/``. A file name of a ``RECORD`` or an SBOM with ``..`` after a name, an absolute one or
one with a control character is refused (``../../../bin/NAME``, the installer's own name of a
script outside ``site-packages``, is left out). A wheel that is not a zip, a ``RECORD`` that is
not CSV (a field over the ``csv`` limit), a record that is not JSON: one line naming it, exit 2.
As root, a directory argument that an account root does not trust can change is refused as an
install root is (:func:`hpcstack.trust.check_dirs`; ``--trust-writable`` turns it off).
"""

from __future__ import annotations

import base64
import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import re
import stat
import sys
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack import gate
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.schema import CONTROL

#: Written by the installer, not the wheel: left out of the comparison of files.
INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"}
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_SDIST = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+?)-(?P<version>\d[^-]*)\.(tar\.gz|zip|tar\.bz2)$")
#: The most files named per distribution whose files differ.
SHOWN = 3
#: The most bytes read of an SBOM (a stack's every file with its sha256: some MB).
MAX_SBOM = 512 << 20
#: The most bytes read of a ``RECORD`` (on disk or in a wheel).
MAX_RECORD = 64 << 20
#: The most bytes read of a small record: ``pyvenv.cfg``, ``site.json``, a validation report.
MAX_SMALL = 16 << 20
#: A file of a distribution larger than this is not hashed (a difference says so).
MAX_HASHED = 16 << 30
#: The most symbolic links followed inside an image for one path.
MAX_LINKS = 40
#: How a file that was not read shows instead of its sha256 (``not read: a FIFO``).
NOT_READ = "not read: "


def norm(name: str) -> str:
    """A distribution's normalized name (PEP 503): lower case, runs of ``-_.`` as ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _kind(mode: int) -> str:
    """What a non-regular file is, in words (``a FIFO``)."""
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


class NotRegular(Exception):
    """What a path of a :class:`Tree` names is not a regular file reached below the tree's root
    (a link not followed, a FIFO, a device, a directory, or too large); never opened for reading.

    Args:
        what (str): e.g. ``"a FIFO"``, ``"a symbolic link"``, ``"larger than 16 GiB"``.
    """

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class Tree:
    """A directory tree that ``compare`` reads, by descriptor, never out of it.

    Every path is opened one component at a time relative to the descriptor of the one above
    (``openat(2)`` with ``O_NOFOLLOW``, :data:`hpcstack.gate.DIR_PATH`), from the descriptor of
    ``root``; a file is checked with ``lstat`` before it is opened and with ``fstat`` after
    (a regular file, the same inode), so a FIFO, a device or ``/dev/zero`` is never read, and read
    up to a limit. On the host no symbolic link below ``root`` is followed. In an image
    (``image=True``, ``root`` its mounted root file system) links are followed as the image
    would follow them, resolved inside ``root``: an absolute target from ``root``, ``..`` stopping
    at ``root`` (never the host's ``/``).

    Args:
        root (Path): the directory nothing is read out of (a stack's prefix, a bundle, an image's
            root file system); opened following links (the caller's own argument, checked).
        top (str): the path below ``root`` that the tree's paths are relative to (an image: its
            stack's prefix, e.g. ``opt/sw/tiny/1.0``); ``""`` for ``root`` itself.
        image (bool): follow links, inside ``root``.

    Attributes:
        root (Path), top (str), image (bool): as given.
    """

    def __init__(self, root: Path, top: str = "", image: bool = False):
        self.root, self.top, self.image = Path(root), top.strip("/"), image

    def where(self, rel: str) -> str:
        """The host path of ``rel`` for messages (``root/top/rel``)."""
        return str(self.root.joinpath(*[p for p in f"{self.top}/{rel}".split("/") if p]))

    def _open(self, rel: str, want_dir: bool) -> int:
        """A descriptor of ``rel``: ``O_RDONLY|O_DIRECTORY`` for a directory, else of a regular
        file (``lstat``-checked first, then opened ``O_NOFOLLOW|O_NONBLOCK`` and ``fstat``-checked:
        the same inode).

        Raises:
            FileNotFoundError: a component is missing.
            NotRegular: a link (on the host), not a directory on the way, not the kind wanted.
            OSError: a component cannot be opened (``EACCES``).
        """
        parts = [p for p in f"{self.top}/{rel}".split("/") if p not in ("", ".")]
        fds = [os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)]
        links = MAX_LINKS
        try:
            while parts:
                name = parts.pop(0)
                if name == "..":
                    if not self.image:
                        raise NotRegular("a path with '..'")
                    if len(fds) > 1:
                        os.close(fds.pop())
                    continue
                st = os.stat(name, dir_fd=fds[-1], follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode) and self.image:
                    links -= 1
                    if links < 0:
                        raise NotRegular(f"more than {MAX_LINKS} symbolic links inside the image")
                    target = os.readlink(name, dir_fd=fds[-1])
                    if target.startswith("/"):
                        while len(fds) > 1:
                            os.close(fds.pop())
                    parts = [p for p in target.split("/") if p not in ("", ".")] + parts
                    continue
                last = not parts
                if last and not want_dir:
                    if not stat.S_ISREG(st.st_mode):
                        raise NotRegular(_kind(st.st_mode))
                    try:
                        fd = os.open(name, gate.FILE_READ, dir_fd=fds[-1])
                    except OSError as exc:
                        if exc.errno == errno.ELOOP:
                            raise NotRegular("replaced while it was read") from None
                        raise
                    fst = os.fstat(fd)
                    if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
                        os.close(fd)
                        raise NotRegular("replaced while it was read")
                    return fd
                if not stat.S_ISDIR(st.st_mode):
                    raise NotRegular(_kind(st.st_mode) + ("" if last else f" on the way ({name})"))
                try:
                    fd = os.open(name, (gate.DIR_READ if last else gate.DIR_PATH), dir_fd=fds[-1])
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise NotRegular("replaced while it was read") from None
                    raise
                fds.append(fd)
            if not want_dir:
                raise NotRegular("a directory")
            if len(fds) == 1:
                return os.open(".", gate.DIR_READ, dir_fd=fds[0])
            return fds.pop()
        finally:
            for fd in fds:
                os.close(fd)

    def read(self, rel: str, limit: int) -> bytes | None:
        """The content of the regular file ``rel``, or None when it is missing.

        Args:
            rel (str): a path below the tree's top.
            limit (int): the most bytes accepted (a larger file is refused, not read in part).

        Returns:
            bytes | None: its content; None when a component is missing.

        Raises:
            ConfigError: not a regular file reached below the root (a link on the host, a FIFO,
                a device), or larger than ``limit`` (one line naming it; exit status 2).
            HpcstackError: it cannot be read (one line naming it).
        """
        try:
            fd = self._open(rel, want_dir=False)
        except FileNotFoundError:
            return None
        except NotRegular as exc:
            raise ConfigError([f"{self.where(rel)}: {exc.what}: not read (compare reads regular files "
                               "inside the compared stack only)"]) from None
        except OSError as exc:
            raise HpcstackError(f"{self.where(rel)}: cannot read it: {exc.strerror}") from None
        try:
            data = self._read_fd(fd, limit)
        except OSError as exc:
            raise HpcstackError(f"{self.where(rel)}: cannot read it: {exc.strerror}") from None
        finally:
            os.close(fd)
        if data is None:
            raise ConfigError([f"{self.where(rel)}: larger than {limit >> 20} MiB: not read"])
        return data

    @staticmethod
    def _read_fd(fd: int, limit: int, sink=None) -> bytes | None:
        """Read the regular file open as ``fd``: its bytes (or, with ``sink``, each block given
        to it and ``b""``); None when it holds more than ``limit`` bytes."""
        if os.fstat(fd).st_size > limit:
            return None
        chunks, left = [], limit + 1
        while left > 0 and (block := os.read(fd, min(left, 1 << 20))):
            left -= len(block)
            if sink is None:
                chunks.append(block)
            else:
                sink(block)
        return None if left <= 0 else b"".join(chunks)

    def sha256(self, rel: str, limit: int = MAX_HASHED) -> str:
        """The sha256 (hex) of the regular file ``rel``; ``missing`` when it is not there; for
        anything else :data:`NOT_READ` and why (``not read: a FIFO``), its bytes never read."""
        try:
            fd = self._open(rel, want_dir=False)
        except FileNotFoundError:
            return "missing"
        except NotRegular as exc:
            return NOT_READ + exc.what
        except OSError as exc:
            return NOT_READ + (exc.strerror or "cannot open it")
        h = hashlib.sha256()
        try:
            done = self._read_fd(fd, limit, h.update)
        except OSError as exc:
            return NOT_READ + (exc.strerror or "cannot read it")
        finally:
            os.close(fd)
        return h.hexdigest() if done is not None else NOT_READ + f"larger than {limit >> 30} GiB"

    def listdir(self, rel: str) -> list[str]:
        """The sorted names in the directory ``rel`` (``[]`` when it is missing or not a
        directory reached below the root)."""
        try:
            fd = self._open(rel, want_dir=True)
        except (OSError, NotRegular):
            return []
        try:
            return sorted(os.listdir(fd))
        except OSError:
            return []
        finally:
            os.close(fd)

    def kind(self, rel: str) -> str | None:
        """``dir`` or ``file`` (a regular file) for what ``rel`` names below the root, else None."""
        for want_dir, what in ((True, "dir"), (False, "file")):
            try:
                os.close(self._open(rel, want_dir))
                return what
            except (OSError, NotRegular):
                continue
        return None


def _read_named(path: str | os.PathLike, limit: int, what: str) -> bytes:
    """A file named on the command line (``--report``), read through the gate
    (:func:`hpcstack.gate.read_file`): every component from ``/`` opened without following a
    link (links on the way resolved first only where trusted accounts alone can have put them,
    :func:`hpcstack.gate.resolved`), the file itself opened ``O_NOFOLLOW|O_NONBLOCK`` and checked
    by ``fstat`` (a regular file: never a FIFO or a device), at most ``limit`` bytes. As root,
    the file and every directory above it must be ones that only trusted accounts can change
    (:func:`hpcstack.gate.current_policy`), as the directory arguments must be
    (:func:`_trust_check`); any other account reads only what it may read anyway, so for it
    only the links, the kind and the size are checked (a policy with ``trust_writable``).

    Args:
        path (str | os.PathLike): the file, as given.
        limit (int): the most bytes accepted.
        what (str): what it is, for the messages (``validation report``).

    Returns:
        bytes: its content.

    Raises:
        ConfigError: missing, unreadable, a link, not a regular file, too large, or (as root)
            one that an untrusted account can change (one line).
    """
    from hpcstack import trust

    pol = gate.current_policy() if os.geteuid() == 0 else trust.Policy(uid=os.geteuid(), trust_writable=True)
    try:
        return gate.read_file(gate.resolved(os.path.abspath(path), pol), limit, pol)
    except gate.GateError as exc:
        raise ConfigError([f"{path}: the {what} is not read: {exc.problem}"]) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the {what}: {exc.strerror}"]) from None


@dataclass
class Side:
    """What one side of the comparison holds.

    Attributes:
        label (str): how the output names it.
        kind (str): ``stack`` or ``bundle``.
        dists (dict[str, str]): normalized name -> version, from the SBOM (a bundle: its wheels
            and sdists).
        installed (dict[str, str]): an installed stack's venv: normalized name -> version.
        built (set[str]): distributions built from their sdist on the site.
        files (dict[str, dict[str, str]]): normalized name -> {path: sha256}, once hashed.
        built_for (dict[str, str]): ``Python``, ``CUDA``, ``MPI`` -> version (``-`` unknown).
        figures (dict[str, str]): validation figure -> value with unit.
        root (Path): the prefix or the bundle directory.
        sbom_files (dict[str, dict[str, str]] | None): normalized name -> {path: sha256 or
            ``missing``} as the SBOM lists them (None: an SBOM that lists no files).
        tree (Tree | None): what its files are read through (nothing out of it).
    """

    label: str
    kind: str
    root: Path
    dists: dict = field(default_factory=dict)
    installed: dict = field(default_factory=dict)
    built: set = field(default_factory=set)
    files: dict = field(default_factory=dict)
    built_for: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    sbom_files: dict | None = None
    tree: Tree | None = None
    _records: dict = field(default_factory=dict)

    def hash_files(self, name: str) -> dict[str, str] | None:
        """``{path: sha256}`` of distribution ``name`` (None when it has none to compare).

        Raises:
            ConfigError: its ``RECORD`` (or its wheel) is not one: a name that leaves the stack,
                a field over the CSV limit, a wheel that is not a zip (one line naming it).
        """
        if name not in self.files:
            tree = self.tree or Tree(self.root)
            self.files[name] = (_installed_files(tree, *self._records[name]) if self.kind == "stack"
                                else _wheel_files(tree, self._records[name])) if name in self._records else None
        return self.files[name]


def name_problem(path: str) -> str | None:
    """Why ``path``, a file name of a ``RECORD`` or an SBOM, names no file of the stack that can
    be compared: None when it is one, or a file outside ``site-packages`` as an installer writes
    it (``../../../bin/NAME``: only ``..`` before the first name; left out, never opened).

    Args:
        path (str): the name as the ``RECORD`` or SBOM gives it (relative to ``site-packages``).

    Returns:
        str | None: e.g. ``"holds '..' after a name (it would leave the stack)"``.
    """
    if "\x00" in path or CONTROL.search(path):
        return "holds a NUL or another control character"
    if path.startswith("/"):
        return "is an absolute path (a RECORD names files relative to site-packages)"
    parts = path.split("/")
    while parts and parts[0] == "..":
        parts.pop(0)
    if ".." in parts:
        return "holds '..' after a name (it would leave the stack)"
    return None


def _kept(path: str) -> bool:
    """Whether a file name (checked: :func:`name_problem`) is compared: not outside
    ``site-packages``, not bytecode, not what the installer writes."""
    parts = path.split("/")
    return not (parts[0] == ".." or "__pycache__" in parts or path.endswith(".pyc")
                or (len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in INSTALLER_FILES))


def _refuse_name(where: str, path: str, problem: str):
    """Raise the one line that refuses file name ``path`` of ``where``."""
    raise ConfigError([f"{where}: file name {path[:200]!r} {problem}: refused, nothing compared "
                       "(compare reads files inside the compared stack only)"])


def _record_rows(text: str, where: str):
    """The rows of a ``RECORD`` whose file is compared (:func:`_kept`).

    Raises:
        ConfigError: a name that :func:`name_problem` refuses, or not CSV (a field over the
            ``csv`` module's limit): one line naming ``where``.
    """
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise ConfigError([f"{where}: not a RECORD ({exc}): refused, nothing compared"]) from None
    for row in rows:
        if not row or not row[0]:
            continue
        problem = name_problem(row[0])
        if problem:
            _refuse_name(where, row[0], problem)
        if _kept(row[0]):
            yield row


def _installed_files(tree: Tree, site_packages: str, record: str) -> dict[str, str]:
    """Every kept file a venv's ``RECORD`` names, hashed on disk (:meth:`Tree.sha256`: a
    missing file ``missing``, one that is not a regular file below the stack ``not read: …``).

    Args:
        tree (Tree): the stack.
        site_packages (str), record (str): the venv's ``site-packages`` and the ``RECORD``,
            relative to the stack.
    """
    text = tree.read(record, MAX_RECORD)
    if text is None:
        raise HpcstackError(f"{tree.where(record)}: vanished while compared")
    return {row[0]: tree.sha256(f"{site_packages}/{row[0]}")
            for row in _record_rows(text.decode("utf-8", "replace"), tree.where(record))}


def _wheel_files(tree: Tree, rel: str) -> dict[str, str]:
    """Every kept file of a bundle's wheel, as its ``RECORD`` gives it (sha256 as hex).

    Args:
        tree (Tree): the bundle.
        rel (str): the wheel, relative to the bundle (``wheels/NAME-….whl``).

    Raises:
        ConfigError: not a regular file of the bundle, not a zip, no ``RECORD`` or one that is
            not CSV, a name that leaves the stack (one line naming the wheel).
    """
    where = tree.where(rel)
    try:
        fd = tree._open(rel, want_dir=False)
    except (OSError, NotRegular) as exc:
        raise ConfigError([f"{where}: cannot read the wheel: {getattr(exc, 'what', None) or exc}"]) from None
    try:
        with os.fdopen(fd, "rb") as fh, zipfile.ZipFile(fh) as zf:
            record = next((n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)), None)
            if record is None:
                raise ConfigError([f"{where}: no .dist-info/RECORD: not a wheel"])
            with zf.open(record) as member:
                data = member.read(MAX_RECORD + 1)
            if len(data) > MAX_RECORD:
                raise ConfigError([f"{where}: its {record} is larger than {MAX_RECORD >> 20} MiB: not a wheel"])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, NotImplementedError,
            RuntimeError, ValueError, OSError) as exc:
        raise ConfigError([f"{where}: not a wheel: {type(exc).__name__}: {exc}"]) from None
    out = {}
    for row in _record_rows(data.decode("utf-8", "replace"), f"{where}: {record}"):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256="):]
            try:
                out[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
            except ValueError:      # binascii.Error: not base64; kept as RECORD writes it
                out[row[0]] = row[1][:200]
        elif not row[0].endswith(".data") and len(row) >= 2:
            out[row[0]] = row[1][:200] or "unhashed"
    # a wheel's .data/purelib and platlib land in site-packages
    return {re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", k): v for k, v in out.items()
            if not re.match(r"^[^/]+\.data/(scripts|headers|data)/", k)}


def _parse_json(data: bytes, where: str, what: str) -> dict:
    """A JSON object from ``data`` (read from ``where``).

    Raises:
        ConfigError: not JSON, or not an object (one line naming ``where``).
    """
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ConfigError([f"{where}: cannot read the {what}: {str(exc)[:200]}"]) from None
    if not isinstance(value, dict):
        raise ConfigError([f"{where}: the {what} is not a JSON object"])
    return value


def _items(value: object) -> list:
    """``value`` when it is a list, else ``[]`` (a record of the wrong shape counts as empty)."""
    return value if isinstance(value, list) else []


def _figures(report: dict) -> dict[str, str]:
    out = {}
    for run in _items(report.get("runs")):
        if not isinstance(run, dict) or not isinstance(run.get("figures"), dict):
            continue
        for key, fig in run["figures"].items():
            if isinstance(fig, dict) and isinstance(fig.get("value"), (int, float)):
                out[f"{run.get('backend')} {run.get('nodes')} node(s) {key}"] = f"{fig['value']:.4g} {fig.get('unit') or ''}".strip()
    return out


def _venv_python(tree: Tree) -> str | None:
    """``X.Y.Z`` of a stack's venv's Python, from its ``venv/pyvenv.cfg`` (``version`` or
    ``version_info``)."""
    try:
        data = tree.read("venv/pyvenv.cfg", MAX_SMALL)
    except HpcstackError:
        return None
    m = re.search(r"^version(?:_info)?\s*=\s*(\d+\.\d+\.\d+)", (data or b"").decode("utf-8", "replace"), re.M)
    return m.group(1) if m else None


def _marker_holds(marker: object, python: str | None) -> bool:
    """Whether a lock pin's environment marker holds for a Linux stack of ``python`` (``X.Y.Z``);
    a marker that cannot be read holds (the pin is kept, and a difference shows)."""
    from packaging.markers import InvalidMarker, Marker

    try:
        env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
        if python:
            env.update(python_version=".".join(python.split(".")[:2]), python_full_version=python)
        return Marker(str(marker)).evaluate(env)
    except (InvalidMarker, ValueError, TypeError):
        return True


def _sbom_files(sbom: dict, where: str = "SBOM") -> dict | None:
    """normalized name -> {path: sha256 or ``missing``} of the files each ``pkg:pypi``
    component lists (nested ``file`` components), kept as :func:`_kept` keeps them; None when no
    component lists any (an SBOM written before the SBOM listed files).

    Raises:
        ConfigError: a file name that :func:`name_problem` refuses (one line naming ``where``).
    """
    out: dict = {}
    for c in _items(sbom.get("components")):
        if not (isinstance(c, dict) and str(c.get("purl") or "").startswith("pkg:pypi/")
                and isinstance(c.get("name"), str) and c["name"]):
            continue
        files = {}
        for f in _items(c.get("components")):
            if isinstance(f, dict) and f.get("type") == "file" and isinstance(f.get("name"), str) and f["name"]:
                problem = name_problem(f["name"])
                if problem:
                    _refuse_name(where, f["name"], problem)
                if not _kept(f["name"]):
                    continue
                digest = next((h.get("content") for h in _items(f.get("hashes"))
                               if isinstance(h, dict) and h.get("alg") == "SHA-256"), None)
                files[f["name"]] = str(digest)[:200] if digest else "missing"
        if "components" in c:
            out[norm(c["name"])] = files
    return out or None


def read_stack(prefix: Path, label: str, report: str | None = None, image_root: Path | None = None) -> Side:
    """An installed stack: its SBOM, its venv's distributions and ``RECORD`` files, its records,
    each read as a regular file below ``prefix`` (:class:`Tree`: no link followed, no FIFO or
    device read, each record read up to a limit).

    Args:
        prefix (Path): the stack's prefix (on the host, or below ``image_root``).
        label (str): how the output names it.
        report (str | None): its validation ``report.json`` (default
            ``.hpcstack/validation.json`` of the stack).
        image_root (Path | None): the mounted root file system of the image that holds the stack:
            links are then followed inside it (never the host's ``/``).

    Raises:
        ConfigError: no SBOM there (not an installed stack); a record that is not a regular
            file of the stack, too large or not valid JSON, an SBOM file name that leaves the
            stack (one line naming it).
        HpcstackError: a record cannot be read (``EACCES``, ``EIO``).
    """
    if image_root is not None:
        tree = Tree(Path(image_root), Path(prefix).relative_to(image_root).as_posix(), image=True)
    else:
        tree = Tree(Path(prefix))
    data = tree.read(".hpcstack/sbom.cdx.json", MAX_SBOM)
    if data is None:
        raise ConfigError([f"{label}: {prefix} holds no .hpcstack/sbom.cdx.json: not an installed stack"])
    sbom_where = tree.where(".hpcstack/sbom.cdx.json")
    sbom = _parse_json(data, sbom_where, "SBOM")
    side = Side(label, "stack", prefix, tree=tree)
    python = _venv_python(tree)
    if python:
        side.built_for["Python"] = python
    side.sbom_files = _sbom_files(sbom, sbom_where)
    for c in _items(sbom.get("components")):
        if not isinstance(c, dict):
            continue
        purl = str(c.get("purl") or "")
        name = c.get("name") if isinstance(c.get("name"), str) else ""
        props = [p for p in _items(c.get("properties")) if isinstance(p, dict)]
        markers = [p.get("value") for p in props if p.get("name") == "hpcstack:marker"]
        if markers and not all(_marker_holds(m, python) for m in markers):
            continue    # a pin for another platform or Python (pywin32, appnope): not this stack's
        if purl.startswith("pkg:pypi/") and name and c.get("version"):
            side.dists[norm(name)] = str(c["version"])[:200]
            if "built from its sdist" in str(c.get("description") or ""):
                side.built.add(norm(name))
        roles = {str(p.get("value")) for p in props}
        if "build environment" in roles and (name == "CUDA" or name.startswith("MPI")):
            side.built_for[name.split(" ")[0]] = f"{str(c.get('version'))[:200]}" + (
                f" ({name.split('(', 1)[1].rstrip(')')})" if "(" in name else "")
    for py in tree.listdir("venv/lib"):
        sp = f"venv/lib/{py}/site-packages"
        if not re.fullmatch(r"python3\.[^/]*", py) or tree.kind(sp) != "dir":
            continue
        side.built_for.setdefault("Python", py[len("python"):])
        for info in tree.listdir(sp):
            m = re.match(r"^(.+?)-([^-]+)\.dist-info$", info)
            if m and tree.kind(f"{sp}/{info}/RECORD") == "file":
                side.installed[norm(m.group(1))] = m.group(2)
                side._records[norm(m.group(1))] = (sp, f"{sp}/{info}/RECORD")
    try:
        site = json.loads(tree.read(".hpcstack/site.json", MAX_SMALL) or b"")
        cuda = ((site.get("toolchain") or {}).get("cuda") or {}).get("version")
        side.built_for.setdefault("CUDA", f"{cuda} (toolkit)" if cuda else "none (CPU build)")
    except (HpcstackError, ValueError, RecursionError, AttributeError):
        pass
    torch = side.dists.get("torch")
    if torch:
        side.built_for["torch"] = torch
    if report:
        side.figures = _figures(_parse_json(_read_named(report, MAX_SMALL, "validation report"), report,
                                            "validation report"))
    else:
        rep = tree.read(".hpcstack/validation.json", MAX_SMALL)
        if rep is not None:
            side.figures = _figures(_parse_json(rep, tree.where(".hpcstack/validation.json"), "validation report"))
    return side


def read_bundle(path: Path, label: str) -> Side:
    """An offline bundle: its manifest (checked first: :func:`hpcstack.lifecycle.bundle.verify_bundle`),
    the wheels' names, versions and ``RECORD``, the sdists' names and versions.

    Raises:
        ConfigError: no bundle or a manifest of the wrong shape (one line).
        HpcstackError: a file of the bundle is missing or altered.
    """
    from hpcstack.lifecycle.bundle import verify_bundle

    manifest = verify_bundle(str(path))
    side = Side(label, "bundle", path, tree=Tree(Path(path).resolve()))
    side.built_for["Python"] = str(manifest.get("python") or "-")
    for rel in sorted(manifest["files"]):
        top, _, name = rel.partition("/")
        m = _WHEEL.match(name) if top == "wheels" else _SDIST.match(name) if top == "sdists" else None
        if not m:
            continue
        key = norm(m.group("name"))
        side.dists[key] = m.group("version")
        if top == "wheels":
            side._records[key] = rel
        else:
            side.built.add(key)
    return side


@dataclass
class Comparison:
    """The differences, one line each (empty: the same stack), and the announcement's rows."""

    lines: list = field(default_factory=list)
    added: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    changed: list = field(default_factory=list)
    same: int = 0
    files_checked: int = 0


def _differing(fa: dict[str, str], fb: dict[str, str], la: str, lb: str) -> tuple[int, str]:
    """How many paths of two ``{path: sha256}`` differ, and the first :data:`SHOWN` of them named
    (``content``, on which side the file is missing, or why a side did not read it)."""
    def why(p: str) -> str:
        if p not in fa or p not in fb:
            return "missing in " + (la if p not in fa else lb)
        odd = [f"{v[len(NOT_READ):]}, not read, in {label}" for v, label in ((fa[p], la), (fb[p], lb))
               if v.startswith(NOT_READ)]
        return odd[0] if odd else "content"

    differ = sorted(p for p in set(fa) | set(fb) if fa.get(p) != fb.get(p))
    shown = ", ".join(f"{p} ({why(p)})" for p in differ[:SHOWN])
    return len(differ), shown + (" ..." if len(differ) > SHOWN else "")


def _against_sbom(side: Side) -> list[str]:
    """An installed stack's files on disk against the files its SBOM lists, per distribution."""
    if side.sbom_files is None:
        print(f"note: {side.label}: its SBOM lists no files (written by an older hpcstack): its files are "
              "compared with the other side only", file=sys.stderr)
        return []
    lines = []
    for name, version in sorted(side.installed.items()):
        listed = side.sbom_files.get(name)
        if listed is None:
            if side.dists.get(name) == version:
                lines.append(f"{side.label}: its SBOM lists no files of {name} {version}")
            continue
        on_disk = side.hash_files(name) or {}
        count, shown = _differing(listed, on_disk, "its SBOM", "its venv")
        if count:
            lines.append(f"{side.label}: files of {name} {version}: {count} differ from its SBOM: {shown}")
    return lines


def compare(a: Side, b: Side, files: bool = True) -> Comparison:
    """Compare two sides: distributions and versions, SBOM completeness, files (``files``), what
    they were built for.

    Args:
        a (Side), b (Side): from :func:`read_stack` / :func:`read_bundle`.
        files (bool): hash and compare the files of distributions of the same version on both sides.

    Returns:
        Comparison: every difference as a line, and the added/removed/changed lists.
    """
    out = Comparison()
    for side in (a, b):
        for name, version in sorted(side.installed.items()):
            if side.dists.get(name) != version:
                out.lines.append(f"{side.label}: {name} {version} is installed in its venv but "
                                 + (f"its SBOM says {side.dists[name]}" if name in side.dists else "not in its SBOM"))
        if side.kind == "stack":
            for name in sorted(set(side.dists) - set(side.installed)):
                out.lines.append(f"{side.label}: {name} {side.dists[name]} is in its SBOM but not installed in its venv")
            if files:
                out.lines += _against_sbom(side)
    for name in sorted(set(a.dists) | set(b.dists)):
        va, vb = a.dists.get(name), b.dists.get(name)
        if va is None:
            out.added.append((name, vb))
            out.lines.append(f"only in {b.label}: {name} {vb}")
        elif vb is None:
            out.removed.append((name, va))
            out.lines.append(f"only in {a.label}: {name} {va}")
        elif va != vb:
            out.changed.append((name, va, vb))
            out.lines.append(f"version of {name}: {va} in {a.label}, {vb} in {b.label}")
        else:
            out.same += 1
            if files and name not in a.built and name not in b.built:
                fa, fb = a.hash_files(name), b.hash_files(name)
                if fa is None or fb is None:
                    continue
                out.files_checked += len(fa)
                count, shown = _differing(fa, fb, a.label, b.label)
                if count:
                    out.lines.append(f"files of {name} {va}: {count} of {len(set(fa) | set(fb))} differ: {shown}")
    for key in sorted(set(a.built_for) | set(b.built_for)):
        if key == "torch":
            continue
        x, y = a.built_for.get(key, "-"), b.built_for.get(key, "-")
        if key == "Python" and "-" not in (x, y):   # a bundle knows X.Y only
            n = min(x.count("."), y.count(".")) + 1
            x, y = ".".join(x.split(".")[:n]), ".".join(y.split(".")[:n])
        if x != y and "-" not in (x, y):
            out.lines.append(f"built for {key}: {x} in {a.label}, {y} in {b.label}")
    return out


def open_side(arg: str, label: str, session, report: str | None = None, mounts=None,
              image_storage: tuple = (None, None), check_dir=None) -> Side:
    """``arg`` as a side: a container image (``image:REF`` or an OCI archive), a bundle directory
    (``manifest.json``), a stack prefix, or ``NAME/VERSION`` installed at the command's site
    (``session.site``).

    Args:
        arg (str): the argument.
        label (str): how the output names it.
        session (hpcstack.session.Session | None): the command's session: its site (loaded once,
            only for ``NAME/VERSION``).
        report (str | None): its validation report.json.
        mounts (contextlib.ExitStack | None): keeps an image mounted until it closes (required
            for an image).
        image_storage (tuple[str | None, str | None]): buildah's storage driver and root.
        check_dir (Callable[[str, str, hpcstack.site.Site | None], None] | None): called with a
            label, the directory and the site (``NAME/VERSION``) before a stack or bundle
            directory is read; it raises to refuse it (:func:`cmd_compare`: the trust rule, as
            root).

    Raises:
        ConfigError: none of these; a directory ``check_dir`` refuses; a stack or bundle that
            is not one (one line).
        HpcstackError: buildah cannot read the image.
    """
    from hpcstack.lifecycle import images

    check = check_dir or (lambda label, path, site=None: None)
    ref = images.image_reference(arg)
    if ref is not None:
        root, config = mounts.enter_context(images.mounted_image(ref, *image_storage))
        full, prefix = images.stack_prefix(root, config, ref)
        side = read_stack(prefix, label, report, image_root=root)
        side.kind, side.root = "stack", prefix
        return side
    path = Path(arg)
    if path.is_dir() and (path / "manifest.json").is_file():
        check("bundle", arg)
        return read_bundle(path, label)
    if path.is_dir():
        check("stack", arg)
        return read_stack(path.resolve(), label, report)
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*/[A-Za-z0-9][A-Za-z0-9._+-]*", arg):
        if session is None:
            raise ConfigError([f"{arg}: NAME/VERSION needs a site"])
        site = session.site
        prefix = Path(site.install_root) / arg
        check("stack", str(prefix), site)
        if not prefix.is_dir():
            raise ConfigError([f"{arg}: not installed for site {site.name} (no {prefix})"])
        return read_stack(prefix.resolve(), label, report)
    raise ConfigError([f"{arg}: give an installed stack's prefix, NAME/VERSION installed at --site, a "
                       "bundle directory (hpcstack bundle), or a container image (image:REF, an OCI archive)"])


def _trust_check(session):
    """As root, the check of a directory argument (:func:`open_side`'s ``check_dir``): refused
    like an install root when an account root does not trust can change it or a directory
    above it (:meth:`hpcstack.session.Session.check_dirs`); None for any other account (it reads
    only what it may read anyway)."""
    if os.geteuid() != 0:
        return None

    def check(label: str, path: str, site=None) -> None:
        session.check_dirs([(label, os.path.abspath(path))], site)
    return check


def _side_by_side(rows: list[tuple[str, str, str]], a: str, b: str) -> list[str]:
    head = [("", a, b)] + rows
    w = [max(len(r[i]) for r in head) for i in range(3)]
    return ["  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in head]


def cmd_compare(args, session) -> int:
    """``hpcstack compare``: print the differences; 1 when any, 0 when none.

    As root, every directory argument (a stack's prefix, a bundle, ``NAME/VERSION``'s prefix,
    ``--storage-root``) must be one that only trusted accounts can change, as an install root
    (:func:`hpcstack.trust.check_dirs`), before anything of it is read.

    Args:
        args (argparse.Namespace): ``hpcstack compare``'s command line.
        session (hpcstack.session.Session): the command's session (its site, with ``--prefix``,
            for ``NAME/VERSION``; its policy).

    Returns:
        int: 1 when anything differs, else 0.

    Raises:
        ConfigError: bad input: an argument of no known kind, a directory refused by the trust
            rule, a stack or bundle whose records are not what hpcstack writes (one line; exit 2).
        HpcstackError: an altered bundle, an image buildah cannot read (exit 1).
    """
    if len(args.report) > 2:
        raise ConfigError(["--report: give at most two (A's, then B's)"])
    reports = args.report + [None] * (2 - len(args.report))
    names = all(not os.path.exists(x) and "/" in x and not x.startswith("image:") for x in (args.a, args.b))
    files = (not names) if args.files is None else args.files
    storage = (getattr(args, "storage_driver", None), getattr(args, "storage_root", None))
    check = _trust_check(session)
    if check:       # every directory named, before anything of either side is read or mounted
        for label, path in [("--storage-root", storage[1])] + [(None, x) for x in (args.a, args.b)]:
            if path and os.path.isdir(path) and not path.startswith("image:"):
                check(label or ("bundle" if os.path.isfile(os.path.join(path, "manifest.json")) else "stack"), path)
    with contextlib.ExitStack() as mounts, session.gate.trusting():   # the command's policy in every read
        a = open_side(args.a, args.a, session, reports[0], mounts, storage, check)
        b = open_side(args.b, args.b, session, reports[1], mounts, storage, check)
        result = compare(a, b, files)
    return _print(args, a, b, result, files)


def _print(args, a: Side, b: Side, result: Comparison, files: bool) -> int:
    """Print the comparison (text, or ``--json``); 1 when anything differs, else 0."""
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "same": not result.lines, "differences": result.lines,
                          "added": result.added, "removed": result.removed, "changed": result.changed,
                          "built_for": {"a": a.built_for, "b": b.built_for},
                          "figures": {"a": a.figures, "b": b.figures}}, indent=1))
        return 1 if result.lines else 0
    for line in result.lines:
        print(line)
    print("\nbuilt for:")
    for line in _side_by_side([(k, a.built_for.get(k, "-"), b.built_for.get(k, "-"))
                               for k in sorted(set(a.built_for) | set(b.built_for))], a.label, b.label):
        print(line)
    if a.figures or b.figures:
        print("validation figures:")
        for line in _side_by_side([(k, a.figures.get(k, "-"), b.figures.get(k, "-"))
                                   for k in sorted(set(a.figures) | set(b.figures))], a.label, b.label):
            print(line)
    else:
        print("validation figures: none recorded (give each stack's report.json with --report)")
    verdict = ("the same stack" if not result.lines else f"{len(result.lines)} difference{'s' if len(result.lines) != 1 else ''}")
    print(f"\n{args.a} vs {args.b}: {verdict}: {len(result.added)} added, {len(result.removed)} removed, "
          f"{len(result.changed)} changed, {result.same} the same"
          + (f" ({result.files_checked} files hashed)" if files else " (files not compared)"), file=sys.stderr)
    return 1 if result.lines else 0
