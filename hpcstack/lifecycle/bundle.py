"""``hpcstack bundle``: everything one recipe's install at one site needs, in one directory, to
rebuild it years later or on a site without internet (``hpcstack install … --from DIR``).

A bundle is a directory with ``manifest.json`` (every file with its sha256 and size: the
bundle is addressed by content, and ``bundle_id`` is the sha256 of the manifest's file list) and:

==============  ================================================================================
``wheels/``     the files of the lock's pins for the site's platform and Python (``pip download
                --no-deps --require-hashes -r LOCK``: each file's hash is one the lock allows)
``sdists/``     the sdists of the recipe's source builds (their recipe sha256 checked)
``build/``      what building those sdists needs beyond the lock: their ``build-system.requires``
                (``pyproject.toml``), ``setup_requires`` (``setup.cfg``) and a component's
                ``build_requires`` attribute, with their dependencies, as wheels (Horovod's
                ``setup.py`` asks for ``cffi`` in code: the PyTorch recipe pins it in its lock,
                so it is installed before the build and never fetched)
``recipe/``     the recipe file, its lock files and its ``patches/``
``tool/``       the hpcstack wheel, every wheel it depends on and the uv it runs (``pip install
                --no-index --find-links DIR/tool hpcstack`` on a machine without internet)
==============  ================================================================================

``install --from DIR`` first checks the manifest's shape (:data:`MANIFEST_SCHEMA`: a wrong type,
or a path that leaves the bundle such as ``../../../../etc/shadow``, is one line, exit status 2,
before any file is opened), then every file it lists, each opened below the bundle without
following a link (a missing or altered file: one line naming it, nothing run, nothing published), checks that the bundle was made for this
recipe, site and lock, then installs with no index at all: uv gets ``--no-index --find-links
DIR/wheels`` (the lock's hashes still enforced: ``--require-hashes``), the sdists are fetched
from ``DIR/sdists`` (their sha256 checked as always), and the build environment gets
``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS=DIR/build`` (setuptools fetches ``setup_requires``
with pip).
"""

from __future__ import annotations

import configparser
import dataclasses
import errno
import hashlib
import io
import json
import os
import stat
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from hpcstack import __version__
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD, sha256_file, write_atomic
from hpcstack.schema import CONTROL
from hpcstack.install.sources import SDISTS, WHEELS

MANIFEST = "manifest.json"
FORMAT = "hpcstack bundle 1"
#: The directories of a bundle (see the module's docstring).
BUILD, RECIPE, TOOL = "build", "recipe", "tool"
#: pip settings of the caller's environment that would change what is downloaded.
PIP_UNSET = ("PIP_CONSTRAINT", "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX",
             "PIP_REQUIRE_VIRTUALENV", "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_PRE", "PIP_TARGET",
             "PIP_USER", "PIP_REQUIREMENT", "UV_CONSTRAINT")


def _pip(args: list[str], announce) -> None:
    """Run this interpreter's pip without the caller's pip configuration (``PIP_CONFIG_FILE``
    set to the null device; certificates, proxies and timeouts of the environment are kept)."""
    env = {k: v for k, v in os.environ.items() if k not in PIP_UNSET}
    env["PIP_CONFIG_FILE"] = os.devnull
    cmd = [sys.executable, "-I", "-m", "pip", "--disable-pip-version-check", *args]
    announce("$ " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=CHILD_CWD)
    except OSError as exc:
        raise HpcstackError(f"cannot run pip ({exc})") from None
    if proc.returncode != 0:
        last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-3:]
        if "No module named pip" in proc.stderr:
            raise HpcstackError(f"hpcstack bundle needs pip in hpcstack's environment ({sys.executable} -m pip)")
        raise HpcstackError(f"pip {args[0]} failed: {' / '.join(last)}")


def sdist_build_requires(sdist: Path) -> list[str]:
    """What building an sdist needs, read from the sdist: ``build-system.requires`` of its
    ``pyproject.toml`` (PEP 518; ``setuptools>=40.8.0`` and ``wheel`` when it has none) and the
    ``options.setup_requires`` of its ``setup.cfg``.

    Args:
        sdist (Path): a ``.tar.gz`` sdist.

    Returns:
        list[str]: requirement strings, in order, each once.
    """
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = None
    reqs: list[str] = []
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[-1]: m for m in tar.getmembers() if m.isfile() and m.name.count("/") == 1}
        pyproject = members.get("pyproject.toml")
        if pyproject is not None and tomllib is not None:
            data = tomllib.loads(tar.extractfile(pyproject).read().decode())
            reqs += list(data.get("build-system", {}).get("requires", []))
        if not reqs:
            reqs += ["setuptools>=40.8.0", "wheel"]
        cfg = members.get("setup.cfg")
        if cfg is not None:
            parser = configparser.ConfigParser()
            parser.read_string(tar.extractfile(cfg).read().decode(errors="replace"))
            value = parser.get("options", "setup_requires", fallback="")
            reqs += [r.strip() for r in value.replace(";", "\n").splitlines() if r.strip()]
    return list(dict.fromkeys(reqs))


def _tool_wheel(tmp: Path, announce) -> Path:
    """The wheel of the running hpcstack: the file it was installed from, else built with
    ``uv build --wheel`` from the directory it was installed from (a checkout)."""
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlparse

    from hpcstack.install.components.wheels import uv_binary

    try:
        direct = json.loads(distribution("hpcstack").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, ValueError):
        direct = {}
    path = Path(unquote(urlparse(direct.get("url", "")).path)) if direct.get("url", "").startswith("file:") else None
    if path and path.is_file() and path.suffix == ".whl":
        return path
    if path and (path / "setup.cfg").is_file():
        announce(f"building hpcstack's wheel from {path}")
        proc = subprocess.run([uv_binary(), "build", "--no-config", "--wheel", "--out-dir", str(tmp), str(path)], cwd=CHILD_CWD,
                              capture_output=True, text=True)
        wheels = sorted(tmp.glob("hpcstack-*.whl"))
        if proc.returncode == 0 and wheels:
            return wheels[-1]
        raise HpcstackError(f"cannot build hpcstack's wheel from {path}: {proc.stderr.strip().splitlines()[-1:]}")
    raise HpcstackError("cannot find the wheel hpcstack was installed from: give --tool-wheel FILE")


def make_bundle(recipe, site, recipe_file: Path, out: Path, python_version: str,
                tool_wheel: str | None = None, announce=print, tool: bool = True) -> dict:
    """Write the bundle of ``recipe`` for ``site`` into ``out`` (created; files already there
    with the right content are kept, so a bundle can be refreshed).

    Args:
        recipe (hpcstack.recipe.Recipe): the loaded recipe.
        site (hpcstack.site.Site): the site (its lock, platform and Python).
        recipe_file (Path): the recipe's file.
        out (Path): the bundle directory.
        python_version (str): ``X.Y`` of the site's Python (the wheels are chosen for it).
        tool_wheel (str | None): hpcstack's own wheel (default: the one it was installed from).
        announce (Callable[[str], None]): prints progress.
        tool (bool): add ``tool/`` (hpcstack's wheel, its dependencies, uv); False for a bundle
            the same hpcstack installs (``build.batch_job``: :mod:`hpcstack.install.batch`).

    Returns:
        dict: the manifest written.

    Raises:
        ConfigError: no lock fits the site.
        HpcstackError: a download or build fails (one line).
    """
    from hpcstack.install.actions import Fetch
    from hpcstack.install.components.source import SourceBuild
    from hpcstack.install.components.wheels import PipWheels

    out = Path(out).resolve()
    wheels = recipe.component(PipWheels)
    lock = Path(wheels.lock_file(_Ctx(recipe, site, python_version))) if wheels else None
    for sub in (WHEELS, SDISTS, BUILD, RECIPE, *([TOOL] if tool else [])):
        (out / sub).mkdir(parents=True, exist_ok=True)
    # the recipe as used: its file, its locks, its patches
    rdir = Path(recipe_file).resolve().parent
    shutil.copy2(recipe_file, out / RECIPE / Path(recipe_file).name)
    for lf in sorted(rdir.glob(f"{Path(recipe_file).stem}.*.lock")):
        shutil.copy2(lf, out / RECIPE / lf.name)
    builds = recipe.components_of(SourceBuild)
    for b in builds:
        for p in b.patches:
            (out / RECIPE / "patches").mkdir(exist_ok=True)
            shutil.copy2(rdir / "patches" / p.file, out / RECIPE / "patches" / p.file)
    same_python = python_version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    target = [] if same_python else ["--python-version", python_version, "--only-binary=:all:"]
    if lock is not None:
        announce(f"==> the lock's files for Python {python_version}: {lock.name}")
        _pip(["download", "--no-deps", "--require-hashes", "-r", str(lock), "-d", str(out / WHEELS),
              *(["--python-version", python_version] if not same_python else [])], announce)

    class _Log:
        log = io.StringIO()
        env = dict(os.environ)

    build_reqs: list[str] = []
    for b in builds:
        announce(f"==> sdist of {b.package} {b.version}")
        dest = out / SDISTS / os.path.basename(b.url)
        Fetch(b.url, b.sha256, str(dest)).execute(_Log())
        build_reqs += sdist_build_requires(dest) + list(getattr(b, "build_requires", ()) or ())
    if build_reqs:
        build_reqs = list(dict.fromkeys(build_reqs))
        announce(f"==> what building the sdists needs: {', '.join(build_reqs)}")
        _pip(["download", "--prefer-binary", "-d", str(out / BUILD), *target, *build_reqs], announce)
    if tool:
        announce("==> hpcstack, its dependencies and uv")
        with tempfile.TemporaryDirectory() as tmp:
            wheel = Path(tool_wheel) if tool_wheel else _tool_wheel(Path(tmp), announce)
            shutil.copy2(wheel, out / TOOL / wheel.name)
            from importlib.metadata import version as dist_version

            _pip(["download", "--prefer-binary", "-d", str(out / TOOL), str(out / TOOL / wheel.name),
                  f"uv=={dist_version('uv')}", "pip"], announce)
    files = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_file() and rel != MANIFEST:
            files[rel] = {"sha256": sha256_file(path), "size": path.stat().st_size}
    manifest = {
        "format": FORMAT, "hpcstack": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "recipe": recipe.full_name, "recipe_file": f"{RECIPE}/{Path(recipe_file).name}",
        "site": site.name, "python": python_version,
        "lock": f"{RECIPE}/{lock.name}" if lock is not None else None,
        "sdists": {b.package: f"{SDISTS}/{os.path.basename(b.url)}" for b in builds},
        "bundle_id": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
        "files": files,
    }
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=1) + "\n", 0o644)
    return manifest


class _Ctx:
    """Just what :meth:`PipWheels.lock_file` reads of a plan context."""

    def __init__(self, recipe, site, python_version):
        self.recipe, self.site, self.python_version, self.toolchain = recipe, site, python_version, site.toolchain


#: The directories a bundle's files are in.
_DIRS = (WHEELS, SDISTS, BUILD, RECIPE, TOOL)
_REL_PATH = {"type": "string", "minLength": 1, "maxLength": 4096}
_TEXT = {"type": "string", "maxLength": 4096, "pattern": r"^[^\x00-\x1f\x7f]*$"}
#: What ``manifest.json`` holds (:func:`make_bundle` writes it): checked before any file of the
#: bundle is read, so a manifest of the wrong shape is one line, and one that names a path out of
#: the bundle (``../../../../etc/shadow``) is refused before anything is opened.
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["format", "recipe", "site", "files"],
    "properties": {
        "format": {"const": FORMAT},
        "hpcstack": _TEXT, "created": _TEXT, "recipe": _TEXT, "site": _TEXT,
        "python": {**_TEXT, "type": ["string", "null"]},
        "recipe_file": _REL_PATH,
        "lock": {**_REL_PATH, "type": ["string", "null"]},
        "sdists": {"type": "object", "maxProperties": 1000, "additionalProperties": _REL_PATH},
        "bundle_id": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "files": {"type": "object", "maxProperties": 100000,
                  "additionalProperties": {
                      "type": "object", "required": ["sha256", "size"], "additionalProperties": False,
                      "properties": {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                                     "size": {"type": "integer", "minimum": 0}}}},
    },
}
#: A manifest larger than this is not one :func:`make_bundle` wrote.
MAX_MANIFEST = 64 << 20
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def read_manifest(path) -> dict:
    """Read and check a bundle's ``manifest.json`` (:data:`MANIFEST_SCHEMA`): nothing else of the
    bundle is read.

    Args:
        path (str | Path): the bundle directory.

    Returns:
        dict: the manifest.

    Raises:
        ConfigError: no readable manifest (a missing file, a symbolic link, not JSON), or one
            line per problem of its shape (a wrong type, a path out of the bundle, a ``lock``,
            ``recipe_file`` or sdist that it does not list).
    """
    from hpcstack.schema import problems

    where = f"--from {path}: {MANIFEST}"
    none = ConfigError([f"--from {path}: no bundle there (no readable {MANIFEST}; "
                        "make one with hpcstack bundle RECIPE --site S -o DIR)"])
    try:
        fd = os.open(Path(path) / MANIFEST, _NOFOLLOW)
    except OSError:
        raise none from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise none
        data = f.read(MAX_MANIFEST + 1)
    if len(data) > MAX_MANIFEST:
        raise ConfigError([f"{where}: larger than {MAX_MANIFEST >> 20} MiB: not a manifest hpcstack wrote"])
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        raise none from None
    lines = problems(MANIFEST_SCHEMA, manifest, where)
    if lines:
        raise ConfigError(lines)
    files = manifest["files"]
    named = [("files", rel) for rel in sorted(files)]
    named += [(key, manifest[key]) for key in ("recipe_file", "lock") if manifest.get(key)]
    named += [(f"sdists.{p}", rel) for p, rel in sorted(manifest.get("sdists", {}).items())]
    lines = [f"{where}: {key}: {why}" for key, rel in named if (why := _path_problem(rel))]
    if lines:
        raise ConfigError(lines)
    for key in ("recipe_file", "lock"):
        if manifest.get(key) and manifest[key] not in files:
            lines.append(f"{where}: {key}: {manifest[key]} is not among its files")
    for package, rel in sorted(manifest.get("sdists", {}).items()):
        if rel not in files:
            lines.append(f"{where}: sdists.{package}: {rel} is not among its files")
    if lines:
        raise ConfigError(lines)
    return manifest


def _path_problem(rel: str) -> str | None:
    """Why ``rel`` is not the path of a file inside a bundle (relative, in one of its
    directories, no ``.``, ``..`` or empty component, no control character), or None."""
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts or "." in parts or "" in parts or CONTROL.search(rel):
        return (f"{rel!r} is not a path inside the bundle (relative, with no '..'); refusing it "
                "before anything is read")
    if len(parts) < 2 or parts[0] not in _DIRS:
        return f"{rel!r} is not in one of the bundle's directories ({', '.join(_DIRS)})"
    return None


def _digest_in(root_fd: int, root: Path, rel: str) -> str | None:
    """The sha256 of the bundle's file ``rel``, opened below ``root_fd`` one component at a time
    without following a link; None when it is missing.

    Raises:
        ConfigError: a component is a symbolic link, or the file is not a regular file (a bundle
            holds files only: a link could lead root's read out of the bundle).
    """
    fd = os.dup(root_fd)
    try:
        parts = rel.split("/")
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nfd = os.open(part, _NOFOLLOW | (0 if last else os.O_DIRECTORY), dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    what = "a symbolic link" if exc.errno == errno.ELOOP else "not a directory"
                    raise ConfigError([f"bundle {root}: {'/'.join(parts[:i + 1])} is {what}; a bundle holds plain "
                                       "files only, reached through no link (nothing was installed)"]) from None
                raise
            os.close(fd)
            fd = nfd
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError([f"bundle {root}: {rel} is not a regular file; a bundle holds plain files only "
                               "(nothing was installed)"])
        h = hashlib.sha256()
        while block := os.read(fd, 1 << 20):
            h.update(block)
        return h.hexdigest()
    finally:
        os.close(fd)


def verify_bundle(path) -> dict:
    """Check a bundle: its manifest (:func:`read_manifest`), then every file it lists (present,
    a plain file inside the bundle reached through no link, same sha256).

    Args:
        path (str | Path): the bundle directory.

    Returns:
        dict: the manifest.

    Raises:
        ConfigError: no readable manifest, a manifest of the wrong shape or naming a path out of
            the bundle, a listed file reached through a symbolic link (exit 2; nothing read).
        HpcstackError: a file is missing or altered; the one line names it (and both hashes).
    """
    root = Path(path)
    manifest = read_manifest(root)
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError([f"--from {path}: cannot open the bundle: {exc.strerror}"]) from None
    try:
        for rel, entry in sorted(manifest["files"].items()):
            try:
                actual = _digest_in(root_fd, root, rel)
            except OSError as exc:
                raise HpcstackError(f"bundle {root}: cannot read {rel}: {exc.strerror}; "
                                    "nothing was installed") from None
            if actual is None:
                raise HpcstackError(f"bundle {root}: {rel} is missing (the manifest lists it with sha256 "
                                    f"{entry['sha256']}); nothing was installed")
            if actual != entry["sha256"]:
                raise HpcstackError(f"bundle {root}: {rel} was altered: sha256 {actual}, the manifest says "
                                    f"{entry['sha256']}; nothing was installed")
    finally:
        os.close(root_fd)
    return manifest


def use_bundle(site, recipe, lock: str | None, path) -> object:
    """The site with the bundle as its only package source, after :func:`verify_bundle`.

    Args:
        site (hpcstack.site.Site): the site as loaded.
        recipe (hpcstack.recipe.Recipe): the recipe to install.
        lock (str | None): the lock file the install will use.
        path (str | Path): the bundle.

    Returns:
        hpcstack.site.Site: a copy whose ``installer.bundle`` is the bundle's absolute path and
        whose build environment has ``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS=<bundle>/build``.

    Raises:
        ConfigError: the bundle was made for another recipe, site or lock.
        HpcstackError: from :func:`verify_bundle`.
    """
    root = Path(path).resolve()
    manifest = verify_bundle(root)
    problems = []
    if manifest.get("recipe") != recipe.full_name:
        problems.append(f"--from {path}: the bundle holds {manifest.get('recipe')}, not {recipe.full_name}")
    if manifest.get("site") != site.name:
        problems.append(f"--from {path}: the bundle was made for site {manifest.get('site')}, not {site.name}")
    if lock and manifest.get("lock"):
        bundled = manifest["files"][manifest["lock"]]["sha256"]
        if os.path.basename(lock) != os.path.basename(manifest["lock"]) or sha256_file(lock) != bundled:
            problems.append(f"--from {path}: the recipe's lock {lock} differs from the bundle's {manifest['lock']}")
    if problems:
        raise ConfigError(problems)
    installer = dataclasses.replace(site.installer, bundle=str(root))
    env = {**site.build_env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(root / BUILD)}
    return dataclasses.replace(site, installer=installer, build_env=env)
