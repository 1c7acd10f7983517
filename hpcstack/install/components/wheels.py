"""The ``PipWheels`` component: pinned wheels from a lock file with hashes, in one resolution.

Also the installer backend every component installs with: uv by default
(https://docs.astral.sh/uv/pip/), pip as the fallback, chosen by the site's ``installer``
section. uv installs from a per-site cache by hard-linking the files into the venv (the cache
sits on the prefixes' filesystem) and compiles bytecode at install time, so a stack that is
read-only to its users never has a ``.pyc`` written on import. The bytecode is
``unchecked-hash`` (:mod:`hpcstack.install.bytecode`): the same files give the same ``.pyc``
bytes, whenever they were unpacked; with pip (whose ``--compile`` writes timestamp ``.pyc``) it is
compiled after the last package (:func:`compile_run`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from hpcstack.errors import ConfigError
from hpcstack.install.actions import Run
from hpcstack.install.driver import check_wheels
from hpcstack.install.plan import SANITYCHECK, WHEELS
from hpcstack.install.components.base import Component, PlanContext
from hpcstack.install.sources import wheel_index_args, wheel_source_args

#: uv environment variables that would change what is installed, from where, or how; they are
#: removed from uv's environment so an admin's shell settings cannot change the stack
#: (``--no-config`` only stops uv reading ``uv.toml``/``pyproject.toml``; see
#: https://docs.astral.sh/uv/reference/environment/). Network settings (proxies, certificates,
#: ``UV_HTTP_TIMEOUT``, ``UV_NATIVE_TLS``, ``UV_KEYRING_PROVIDER``, ``UV_OFFLINE``) are kept:
#: a site may need them. Options given on the command line (``--cache-dir``, ``--link-mode``,
#: ``--python``, ``--require-hashes``) override their variables anyway.
UV_UNSET = (
    "UV_CONFIG_FILE", "UV_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL",
    "UV_FIND_LINKS", "UV_NO_INDEX", "UV_INDEX_STRATEGY", "UV_TORCH_BACKEND", "UV_INSECURE_HOST",
    "UV_NO_VERIFY_HASHES", "UV_CONSTRAINT", "UV_OVERRIDE", "UV_BUILD_CONSTRAINT",
    "UV_EXCLUDE_NEWER", "UV_PRERELEASE", "UV_RESOLUTION", "UV_NO_BINARY", "UV_NO_BUILD",
    "UV_NO_BUILD_ISOLATION", "UV_SYSTEM_PYTHON", "UV_BREAK_SYSTEM_PACKAGES", "UV_NO_CACHE",
    "UV_COMPILE_BYTECODE",
)

#: uv's bytecode as :mod:`hpcstack.install.bytecode` compiles it (PEP 552 unchecked-hash: the same
#: bytes for the same files, whatever their modification times; read by uv's compile workers).
UV_BYTECODE_ENV = {"PYC_INVALIDATION_MODE": "UNCHECKED_HASH"}


def uv_binary() -> str:
    """Return the path of the ``uv`` executable that came with hpcstack (``uv`` is an install requirement).

    The ``uv`` Python package knows where its binary is (``uv.find_uv_bin()``), so the install
    does not depend on the admin's PATH; a ``uv`` on PATH is the fallback.

    Returns:
        str: absolute path of ``uv``.

    Raises:
        ConfigError: no uv (install it with ``pip install uv`` or set ``installer.backend: pip``).
    """
    try:
        import uv

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise ConfigError(["installer.backend: uv: no uv executable (pip install uv, "
                       "or set installer.backend: pip in the site config)"])


def wheel_cache(ctx: PlanContext) -> str:
    """The site's wheel cache: ``installer.wheel_cache``, else ``<cache_dir>/<backend>``.

    uv hard-links from it, so it should be on the filesystem of the prefixes (uv copies where it
    is not); ``cache_dir`` defaults to the machine's cache (:func:`hpcstack.site.default_cache_dir`).
    Absolute path.
    """
    inst = ctx.site.installer
    return os.path.abspath(inst.wheel_cache or os.path.join(ctx.cache_dir, inst.backend))


def install_run(ctx: PlanContext, *args: str, reinstall: tuple[str, ...] = (),
                input_files: tuple[str, ...] = ()) -> Run:
    """Return the action that installs into the stack's venv with the site's backend.

    uv: ``uv pip install --python <venv python> --no-config --cache-dir <wheel cache>
    --link-mode <mode> [--compile-bytecode] [--reinstall-package P …] <args>`` with the
    variables of :data:`UV_UNSET` removed and, when it compiles, :data:`UV_BYTECODE_ENV` set.
    pip: ``<venv python> -m pip --isolated install --cache-dir <wheel cache> --no-compile
    [--force-reinstall] <args>`` (its ``--compile`` writes timestamp ``.pyc``, which differ
    between two installs of the same files: the venv's bytecode is compiled after the last
    package instead, :func:`compile_run`).

    Args:
        ctx (PlanContext): the install.
        *args (str): requirements and options common to both (``--require-hashes``, ``-r``,
            ``--no-deps``, ``--no-index``, ``--find-links DIR``, ``name==version``).
        reinstall (tuple[str, ...]): packages to reinstall even when the same version is there.
        input_files (tuple[str, ...]): files whose content decides whether the step is up to
            date (:meth:`Run.inputs`).

    Returns:
        Run: the action.

    Raises:
        ConfigError: backend uv and no uv executable.
    """
    inst = ctx.site.installer
    cache = wheel_cache(ctx)
    if inst.backend == "uv":
        argv = [uv_binary(), "pip", "install", "--python", ctx.python, "--no-config",
                "--cache-dir", cache, "--link-mode", inst.link_mode]
        if inst.compile_bytecode:
            argv.append("--compile-bytecode")
        for name in reinstall:
            argv += ["--reinstall-package", name]
        return Run(tuple(argv + list(args)), env=dict(UV_BYTECODE_ENV) if inst.compile_bytecode else {},
                   unset=UV_UNSET, input_files=input_files)
    argv = list(ctx.pip("install", "--cache-dir", cache, "--no-compile"))
    if reinstall:
        argv.append("--force-reinstall")
    return Run(tuple(argv + list(args)), input_files=input_files)


def bytecode_levels(installer) -> tuple[int, ...]:
    """The optimisation levels :func:`compile_run` compiles after the last package: 0 with the pip
    backend when ``installer.compile_bytecode`` (uv compiles level 0 as it installs), and
    ``installer.optimization_levels``; empty: no pass.

    Args:
        installer (hpcstack.site.InstallerConfig): the site's ``installer`` section.

    Returns:
        tuple[int, ...]: the levels, sorted (0: plain, 1: ``python -O``, 2: ``-OO``).
    """
    levels = set(installer.optimization_levels)
    if installer.compile_bytecode and installer.backend == "pip":
        levels.add(0)
    return tuple(sorted(levels))


def compile_run(python: str, paths: tuple[str, ...], levels: tuple[int, ...], jobs: int = 1) -> Run:
    """The action that compiles the bytecode of ``paths`` as :func:`hpcstack.install.bytecode.compile_tree`
    does (``unchecked-hash``: the same bytes for the same files at the same path), run by the
    venv's Python: ``<python> -I -B <hpcstack>/install/bytecode.py -j JOBS -o LEVEL … PATH …``.

    Args:
        python (str): the venv's Python (the ``.pyc`` are its version's).
        paths (tuple[str, ...]): directories (the venv's ``site-packages``) or files.
        levels (tuple[int, ...]): optimisation levels (0, 1, 2).
        jobs (int): processes compiling at once.

    Returns:
        Run: the action (it exits 0 also when a file does not compile: that file is named in
        the step's log and left to Python at import, as pip and uv leave it).
    """
    from hpcstack import data_root
    from hpcstack.install import bytecode

    # named from the package's data directory, as the doctor's source is (StackManifest), so
    # that the dry-run reads the same wherever hpcstack is installed
    script = os.path.join(str(data_root()), os.pardir, "install", os.path.basename(bytecode.__file__))
    return Run((python, "-I", "-B", script, "-j", str(max(1, jobs)),
                *[a for level in levels for a in ("-o", str(level))], *paths))


def check_run(ctx: PlanContext) -> Run:
    """Return the dependency check of the venv: ``uv pip check --python …`` or ``pip check``."""
    if ctx.site.installer.backend == "uv":
        return Run((uv_binary(), "pip", "check", "--python", ctx.python, "--no-config"),
                   unset=UV_UNSET)
    return Run(ctx.pip("check"))


def freeze_argv(ctx: PlanContext) -> tuple[str, ...]:
    """The command that lists the venv's packages for provenance: ``uv pip freeze --python …``
    (the venv of a uv site has no pip) or ``pip freeze --all``."""
    if ctx.site.installer.backend == "uv":
        return (uv_binary(), "pip", "freeze", "--python", ctx.python, "--no-config")
    return ctx.pip("freeze", "--all")


def extra_indexes(lock: str) -> bool:
    """True if the lock file names more than one index (an ``--extra-index-url`` line)."""
    with open(lock) as f:
        return any(line.lstrip().startswith("--extra-index-url") for line in f)


#: The Python Package Index, the default (and last) index of a lock.
PYPI = "https://pypi.org/simple"


@dataclass(frozen=True)
class Lock:
    """One lock file of a :class:`PipWheels` component, and which sites it fits.

    Which lock a site gets follows from the site's machine facts (its toolchain's CUDA version
    and its Python), not from a name the site must know (a site describes the machine, not packages): the component takes the
    first of its locks that fits.

    Args:
        name (str): the lock's name: the file is ``<stem>.<name>.lock`` next to the recipe.
        indexes (tuple[str, ...]): package index URLs, the first as ``--index-url``, the others
            as ``--extra-index-url`` (``hpcstack lock`` resolves against them; the lock records them).
        cuda (str | None): the lowest CUDA ``X.Y`` a site's toolchain must have; None fits any
            site, with or without CUDA.
        python (tuple[str, ...]): the ``X.Y`` Python versions the lock holds wheels for; empty
            fits any.

    Example:
        ``Lock("cu121", indexes=("https://download.pytorch.org/whl/cu121", PYPI), cuda="12.1",
        python=("3.12",))``
    """

    name: str
    indexes: tuple = (PYPI,)
    cuda: str | None = None
    python: tuple = ()

    def misfit(self, toolchain, python_version: str | None) -> str | None:
        """Why this lock does not fit a site, or None when it does.

        Args:
            toolchain (hpcstack.site.Toolchain): the site's toolchain (``cuda_version``).
            python_version (str | None): ``X.Y`` of the site's Python, None when unknown.
        """
        if self.cuda:
            if not toolchain.cuda_version:
                return f"needs CUDA >= {self.cuda}; the site has none"
            if _version(toolchain.cuda_version) < _version(self.cuda):
                return f"needs CUDA >= {self.cuda}; the site has {toolchain.cuda_version}"
        if self.python and python_version not in self.python:
            return f"holds Python {', '.join(self.python)}; the site has {python_version or 'an unknown one'}"
        return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


@dataclass(frozen=True)
class PipWheels(Component):
    """Install every package of a lock file with hashes in one resolution, then check dependencies.

    The lock (``<stem>.<name>.lock`` next to the recipe, one per package index; the first of
    ``locks`` that fits the site's CUDA and Python, :class:`Lock`) is written by ``hpcstack lock`` (``uv pip compile
    --generate-hashes --universal``): every transitive package pinned with its sha256, the index
    it comes from recorded in its header and per pin. One install resolves them all, and the
    installer refuses any file whose hash is not in the lock (``--require-hashes``).

    With the site's ``installer.backend: uv`` (default) this is ``uv pip install --require-hashes
    -r <lock>`` (https://docs.astral.sh/uv/pip/packages/) into the stack's venv, from the site's
    wheel cache by hard links, with ``--compile-bytecode``; ``uv pip check`` in the sanity
    check. uv reads the index from the lock (``--index-url`` line) and ignores user config
    (``--no-config``, :data:`UV_UNSET`). A lock with several indexes (the cu121 one) is
    installed with ``--index-strategy unsafe-best-match``: pip's behaviour (every index
    considered for every package), which the ``+cu121`` pins need; uv's default would look for
    torch only on the first index that has it. The hashes pin every file, which is what
    protects against the dependency confusion that uv's default guards against.
    With ``backend: pip``: ``pip --isolated install --require-hashes --compile`` and ``pip check``.
    Where the site states its GPU driver (``gpu.driver_version`` or ``gpu.cuda_driver_api``), a
    lock whose wheels are built for a CUDA that driver cannot run is refused when the plan is
    resolved, before anything is written (:func:`hpcstack.install.driver.check_wheels`).

    Args:
        stem (str): lock file stem, e.g. ``"2.3.1-gpu"`` for ``2.3.1-gpu.pypi.lock``; the
            top-level requirements are in ``<stem>.in``.
        min_python (str): lowest ``X.Y`` the lock supports (it is universal: markers cover newer).
        exclude_newer (str | None): ``YYYY-MM-DD``; ``hpcstack lock`` resolves as of that date.
        locks (tuple[Lock, ...]): the lock files, most specific first; default one PyPI lock.

    Example:
        ``PipWheels("2.3.1-gpu", locks=(Lock("cu121", …, cuda="12.1"), Lock("pypi")))``

    Raises:
        ConfigError: no lock fits the site, or its file does not exist; backend uv without uv; the
            site's GPU driver cannot run the lock's wheels.
    """

    stem: str
    min_python: str = "3.10"
    exclude_newer: str | None = None
    locks: tuple = (Lock("pypi"),)

    def lock_for(self, toolchain, python_version: str | None, site_ref: str = "the site") -> Lock:
        """The first of :attr:`locks` that fits the site (:meth:`Lock.misfit`).

        Raises:
            ConfigError: none fits; one line naming each lock and why.
        """
        why = []
        for lock in self.locks:
            reason = lock.misfit(toolchain, python_version)
            if reason is None:
                return lock
            why.append(f"{self.stem}.{lock.name}.lock {reason}")
        raise ConfigError([f"no lock file of this recipe fits {site_ref}: {'; '.join(why)}"])

    def lock_path(self, directory, lock: Lock) -> str:
        """The file of ``lock`` in the recipe's directory."""
        return os.path.join(str(directory), f"{self.stem}.{lock.name}.lock")

    def lock_file(self, ctx: PlanContext) -> str:
        """The lock file that fits the site."""
        lock = self.lock_for(ctx.toolchain, ctx.python_version, f"site {ctx.site.name}")
        return self.lock_path(ctx.recipe.directory, lock)

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        lock = self.lock_file(ctx)
        if not os.path.isfile(lock):
            raise ConfigError([f"{lock}: no such lock file "
                               f"(run: hpcstack lock {ctx.recipe.ref or ctx.recipe.full_name} --site {ctx.site.ref or ctx.site.name})"])
        extra = ()
        if ctx.site.installer.backend == "uv" and extra_indexes(lock):
            extra = ("--index-strategy", "unsafe-best-match")
        extra = wheel_source_args(ctx.site) or extra  # a bundle (install --from): no index at all
        extra += wheel_index_args(ctx.site)  # the site's package index, instead of the lock's
        # the compute nodes' GPU driver (the site's gpu section) against the wheels' CUDA: refused
        # here, where the plan is resolved, before anything is written (hpcstack.install.driver)
        check_wheels(lock, ctx.python_version or None, getattr(ctx.site, "gpu", None), str(ctx.site.path))
        return {
            WHEELS: [install_run(ctx, *extra, "--require-hashes", "-r", lock, input_files=(lock,))],
            SANITYCHECK: [check_run(ctx)],
        }
