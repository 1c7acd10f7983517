"""Source builds: ``SourceBuild`` (a Python sdist built into a wheel) and ``HorovodBuild`` on it.

A built wheel is kept in the site's build cache under a key that hashes everything that changes
the binary (:class:`CachedWheelBuild`), so the same Horovod is never compiled twice (issue 6).
The component owns its two actions, :class:`CachedWheelBuild` and :class:`CheckBuild`
(``horovodrun --check-build``); both follow :class:`hpcstack.install.actions.Action`.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

from hpcstack.errors import HpcstackError
from hpcstack.install import wheelcache
from hpcstack.install.actions import ACTION_COMMAND, ActionBase, ExecContext, Fetch, Run, Unpack, VerifySha256, bash_word
from hpcstack.install.wheelcache import SUMS
from hpcstack.install.plan import BUILD, FETCH, INSTALL, PATCH, SANITYCHECK
from hpcstack.install.components.base import PlanContext
from hpcstack.install.components.sanity import PythonCheck
from hpcstack.install.components.wheels import UV_UNSET, install_run, uv_binary, wheel_cache

#: Bumped when the key's recipe changes, so wheels keyed the old way are not reused.
KEY_FORMAT = "hpcstack build key v1"
#: Drops the ``<script>: line N: `` that bash puts before its own errors (``command not found``,
#: ``No such file or directory``): the line differs between the dry-run script and the key
#: function run alone, and the key must not. A probe that succeeds prints no such line, so its
#: keys are unchanged and the wheels already cached stay valid.
_NO_LINE_NUMBERS = "sed -E 's/^[^:]*: line [0-9]+: //'"

#: Variables of the build environment that change the binary; the key records their values.
#: ``MAKEFLAGS`` (parallelism) is left out on purpose: ``-j2`` and ``-j8`` give the same wheel.
KEY_VARIABLES = r"HOROVOD_[A-Z0-9_]*|CC|CXX|FC|CFLAGS|CXXFLAGS|CPPFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS"


@dataclass(frozen=True)
class CachedWheelBuild(ActionBase):
    """Build a wheel, or reuse the one built before under the same build key (an action).

    The key is the sha256 of the text a bash function prints: fixed lines (key format, package,
    sdist and patch sha256s) and the output of probe commands run in the build environment
    (Python and key package versions, compilers, MPI, CUDA, NCCL, the ``HOROVOD_*`` and compiler
    variables). The dry-run prints that function and the ``if … then reuse else build`` around
    it; :meth:`execute` runs the same function text with bash, so both compute the same key.
    A hit copies ``<root>/<key>/*.whl`` into ``dist``; a miss runs ``build`` and stores the
    wheel with ``key.txt`` (the key's text, to see why two builds differ) under ``<root>/<key>``,
    atomically (a new directory renamed into place).

    Args:
        name (str): the package, e.g. ``"horovod"``; names the bash function.
        root (str): the cache directory of this package and version,
            ``<cache_dir>/builds/<package>-<version>``.
        dist (str): where the wheel must end up (emptied first).
        build (Run): the build command (``pip wheel … -w dist src``).
        env (dict[str, str]): the build's variables, exported for the probes (may hold ``${NAME}``).
        fixed (tuple[str, ...]): key lines known when planning.
        probes (tuple[tuple[str, str], ...]): ``(label, bash command)``; the label (as
            ``--- label``) and the command's output (stdout and stderr, then ``(exit N)`` when it
            fails) enter the key.
        prepare (tuple): actions run before ``build`` on a miss only (unpack and patch the
            sources: thousands of small files, slow on a parallel filesystem, useless on a hit).
        ready (str): a stamp file: when it holds ``ready_digest``, the patch step has already
            unpacked and patched the sources (:class:`PrepareAhead`, while the wheels
            installed), and a miss removes the stamp and builds that tree instead of running
            ``prepare`` (a build that fails leaves no stamp: the next run prepares anew).
        ready_digest (str): what the stamp must hold (:meth:`PrepareAhead.digest`).

    Raises:
        HpcstackError: the build fails, or it leaves no wheel in ``dist``.
    """

    name: str
    root: str
    dist: str
    build: Run
    env: dict[str, str] = field(default_factory=dict)
    fixed: tuple[str, ...] = ()
    probes: tuple[tuple[str, str], ...] = ()
    prepare: tuple = ()
    ready: str = ""
    ready_digest: str = ""

    def commands(self) -> tuple[Run, ...]:
        """``bash`` (the key function), then on a miss the commands of ``prepare`` (``patch``)
        and of the build (its compilers): the preflight checks them all, hit or miss."""
        return (Run(("bash",)), *(r for a in self.prepare for r in a.commands()), *self.build.commands())

    def inputs(self) -> tuple[str, ...]:
        return (*(p for a in self.prepare for p in a.inputs()), *self.build.inputs())

    def outputs(self) -> tuple[str, ...]:
        return (self.dist, self.root, *(o for a in self.prepare for o in a.outputs()))

    @property
    def function(self) -> str:
        """Name of the bash function that prints the key's text."""
        return "hpcstack_build_key_" + re.sub(r"\W", "_", self.name)

    def key_script(self) -> str:
        """The bash function that prints the key's text (same in the dry-run and the real run)."""
        lines = [f"{self.function}() {{", "  (", "    set +eu -o pipefail"]
        lines += [f"    export {n}={bash_word(v)}" for n, v in self.env.items()]
        lines += [f"    echo {shlex.quote(line)}" for line in self.fixed]
        for label, probe in self.probes:
            lines.append(f"    echo {shlex.quote('--- ' + label)}; {{ {probe}; }} 2>&1 | {_NO_LINE_NUMBERS} "
                         '|| echo "(exit $?)"')
        return "\n".join(lines + ["  )", "}"])

    def key_text(self, env: dict[str, str]) -> str:
        """Run the key function with bash in ``env`` (the build environment) and return its output."""
        proc = subprocess.run(["bash", "-c", f"{self.key_script()}\n{self.function}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return proc.stdout.decode(errors="replace")

    @staticmethod
    def key_of(text: str) -> str:
        """The key: the first 24 hex digits of the text's sha256 (``sha256sum | cut -c1-24``)."""
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def to_bash(self) -> str:
        root, dist = shlex.quote(self.root), shlex.quote(self.dist)
        key = f"{self.function}_key"
        entry = f'{root}/"${{{key}}}"'
        return "\n".join([
            f"# the wheel cache: the key hashes everything that changes the {self.name} binary",
            self.key_script(),
            f"{key}=$({self.function} | sha256sum | cut -c1-24)",
            f"if {shlex.join([*ACTION_COMMAND, 'reuse-wheel', self.name])} {entry} {dist}; then",
            f'  echo "{self.name}: build key ${{{key}}}"',
            "else",
            *(self._prepare_bash()),
            f"  rm -rf {dist}",
            "  " + self.build.to_bash(),
            f"  mkdir -p {root} && tmp=$(mktemp -d {root}/.new-XXXXXX) && chmod 755 \"$tmp\" && cp {dist}/*.whl \"$tmp\"/ \\",
            f"    && (cd \"$tmp\" && sha256sum -- *.whl > {SUMS} && chmod 644 -- *.whl {SUMS}) \\",
            f"    && {self.function} > \"$tmp/key.txt\" && {{ mv -T \"$tmp\" {entry} 2>/dev/null || rm -rf \"$tmp\"; }}",
            "fi",
        ])

    def _prepare_bash(self) -> list[str]:
        if not self.ready:
            return ["  " + a.to_bash() for a in self.prepare]
        ready = shlex.quote(self.ready)
        return [f'  if [ "$(cat {ready} 2>/dev/null)" = {self.ready_digest} ]; then',
                f"    rm -f {ready}  # unpacked and patched by the patch step",
                "  else",
                *("    " + a.to_bash() for a in self.prepare),
                "  fi"]

    def _prepared_ahead(self) -> bool:
        """True (and the stamp removed) when the patch step left the tree ready."""
        try:
            with open(self.ready) as f:
                if f.read().strip() != self.ready_digest:
                    return False
            os.unlink(self.ready)
        except OSError:
            return False
        return True

    def execute(self, ctx: ExecContext) -> None:
        text = self.key_text(ctx.env)
        key = self.key_of(text)
        entry = os.path.join(self.root, key)
        ctx.log.write(f"# {self.name} build key {key}; its text:\n{text}")
        if wheelcache.reuse(self.name, entry, self.dist, ctx.log):  # sha256 checked before reuse
            return
        shutil.rmtree(self.dist, ignore_errors=True)
        ctx.log.write(f"{self.name}: no wheel with key {key} in {self.root}; building\n")
        ctx.log.flush()
        if self.ready and self._prepared_ahead():
            ctx.log.write(f"{self.name}: the sources were unpacked and patched by the patch step\n")
        else:
            for action in self.prepare:
                action.execute(ctx)
        self.build.execute(ctx)
        built = sorted(glob.glob(os.path.join(self.dist, "*.whl")))
        if not built:
            raise HpcstackError(f"the build of {self.name} left no wheel in {self.dist}")
        os.makedirs(self.root, exist_ok=True)
        tmp = tempfile.mkdtemp(dir=self.root, prefix=".new-")
        try:
            for wheel in built:
                shutil.copy(wheel, tmp)
            with open(os.path.join(tmp, "key.txt"), "w") as f:
                f.write(text)
            wheelcache.write_sums(tmp)
            os.chmod(tmp, 0o755)
            os.rename(tmp, entry)  # atomic; fails if another install stored the same key first
            ctx.log.write(f"stored {', '.join(os.path.basename(w) for w in built)} in {entry}\n")
        except OSError as exc:  # the build succeeded; only its reuse is lost
            ctx.log.write(f"warning: could not store the wheel in {entry}: {exc}\n")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class PrepareAhead(ActionBase):
    """Unpack and patch the sources in the patch step when the build cache surely misses (an action).

    The patch step runs in the background while the venv and wheels steps run
    (:data:`hpcstack.install.plan.BACKGROUND_STEPS`), so on a first install the unpack and patch
    overlap the downloads of the wheels (issue 14). Whether the build step will miss is known
    only there (its key probes the venv's torch), so this does the work only when the cache
    holds no wheel of this package and version at all (a first install, a new version); then
    it writes ``ready`` with :meth:`digest`, which :class:`CachedWheelBuild` takes as "the tree
    is ready". Otherwise it does nothing and a miss prepares in the build step, as before.

    Args:
        root (str): the build cache of this package and version (``CachedWheelBuild.root``).
        ready (str): the stamp file.
        prepare (tuple): the unpack and patch actions (``SourceBuild.prepare_actions``).
        fixed (tuple[str, ...]): the key lines known when planning (sdist and patch sha256s).

    Raises:
        HpcstackError: from the unpack or a patch.
    """

    root: str
    ready: str
    prepare: tuple
    fixed: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        """The stamp's content: the sha256 of ``fixed`` (the sources this tree is made of)."""
        return hashlib.sha256("\n".join(self.fixed).encode()).hexdigest()

    def commands(self) -> tuple[Run, ...]:
        return tuple(r for a in self.prepare for r in a.commands())

    def inputs(self) -> tuple[str, ...]:
        return tuple(p for a in self.prepare for p in a.inputs())

    def outputs(self) -> tuple[str, ...]:
        return (*(o for a in self.prepare for o in a.outputs()),)

    def to_bash(self) -> str:
        root, ready = shlex.quote(self.root), shlex.quote(self.ready)
        return "\n".join([
            "# no wheel of this version in the build cache: the build step will compile; unpack and",
            "# patch now, while the wheels install, and leave the stamp the build step looks for",
            f"if ! ls {root}/*/*.whl >/dev/null 2>&1; then",
            f"  rm -f {ready}",
            *("  " + a.to_bash() for a in self.prepare),
            f"  echo {self.digest} > {ready}",
            "fi"])

    def execute(self, ctx: ExecContext) -> None:
        if glob.glob(os.path.join(glob.escape(self.root), "*", "*.whl")):
            ctx.log.write(f"a wheel of this version is in {self.root}: unpack and patch only if the build needs it\n")
            return
        try:
            os.unlink(self.ready)
        except FileNotFoundError:
            pass
        for action in self.prepare:
            action.execute(ctx)
        with open(self.ready, "w") as f:
            f.write(self.digest + "\n")


@dataclass(frozen=True)
class Patch:
    """A patch file of the project, under the recipe's ``patches/``, with its sha256.

    Args:
        file (str): file name under ``patches/``.
        sha256 (str): 64 hex digits; a patch that differs is refused.
    """

    file: str
    sha256: str


@dataclass(frozen=True)
class SourceBuild:
    """Download a Python sdist, check its sha256, patch it, build a wheel, install the wheel.

    Building a wheel (``pip wheel --no-build-isolation``) and installing that avoids pip's
    fallback to a legacy ``setup.py install`` that doubles the time of a failed build (docs/notes.md).
    The wheel goes through the site's build cache (``installer.build_cache``, default on): a
    re-install whose build key matches copies the wheel built before instead of compiling
    (:class:`CachedWheelBuild`; the key covers the sdist and patch sha256s, the venv's Python,
    the compilers, cmake and the compiler variables). The wheel is installed with the site's
    installer (uv by default, ``--compile-bytecode``).

    Args:
        package (str): distribution name, e.g. ``"horovod"``.
        version (str): e.g. ``"0.28.1"``.
        url (str): the sdist's URL (PyPI's files.pythonhosted.org).
        sha256 (str): the sdist's sha256 (64 hex digits), as PyPI lists it.
        patches (tuple[Patch, ...]): applied in order with ``patch -p1``.

    Example:
        ``SourceBuild("foo", "1.0", "https://…/foo-1.0.tar.gz", "ab12…")``
    """

    package: str
    version: str
    url: str
    sha256: str
    patches: tuple[Patch, ...] = ()

    # -- paths
    def sdist(self, ctx: PlanContext) -> str:
        """Where the sdist lands in the download cache."""
        return os.path.join(ctx.cache_dir, "sources", os.path.basename(self.url))

    def src_dir(self, ctx: PlanContext) -> str:
        """The unpacked source tree in the stage dir."""
        return os.path.join(ctx.stage_dir, "src", f"{self.package}-{self.version}")

    def ready_stamp(self, ctx: PlanContext) -> str:
        """The stamp :class:`PrepareAhead` leaves beside the source tree it unpacked and patched."""
        return os.path.join(ctx.stage_dir, "src", f".{self.package}-{self.version}.prepared")

    def dist_dir(self, ctx: PlanContext) -> str:
        """Where the built wheel goes."""
        return os.path.join(ctx.stage_dir, "dist")

    def patch_path(self, ctx: PlanContext, patch: Patch) -> str:
        return str(ctx.recipe_file(os.path.join("patches", patch.file)))

    # -- what the build needs; subclasses add to it
    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        """Variables for the build: the site's ``build.env`` and ``MAKEFLAGS=-j<jobs>``."""
        return {**ctx.site.build_env, "MAKEFLAGS": f"-j{ctx.jobs}"}

    def build_prepend(self, ctx: PlanContext) -> dict[str, str]:
        """Path-like variables to prepend to during the build."""
        return {}

    def sanity_actions(self, ctx: PlanContext) -> list:
        """Sanity-check actions; none by default."""
        return []

    # -- the build key (see CachedWheelBuild); subclasses add probes
    def key_packages(self, ctx: PlanContext) -> tuple[str, ...]:
        """Packages of the venv the binary is built against; their versions enter the key."""
        return ()

    def key_fixed(self, ctx: PlanContext) -> tuple[str, ...]:
        """Key lines known when planning: key format, package, sdist and patch sha256s."""
        return (KEY_FORMAT, f"package {self.package} {self.version}",
                f"sdist {os.path.basename(self.url)} sha256 {self.sha256}",
                *(f"patch {p.file} sha256 {p.sha256}" for p in self.patches))

    def key_probes(self, ctx: PlanContext) -> tuple[tuple[str, str], ...]:
        """``(label, bash command)`` pairs run in the build environment whose output enters the
        key: the venv's Python (version, base prefix, platform) and the versions of
        :meth:`key_packages`, the variables of :data:`KEY_VARIABLES`, the C and C++ compilers'
        ``--version``, cmake's."""
        code = ("import importlib.metadata as m, sys, sysconfig; print(sys.version); "
                "print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); "
                f"[print(p, m.version(p)) for p in {json.dumps(list(self.key_packages(ctx)))}]")
        return (("python", f"{shlex.quote(ctx.python)} -c {shlex.quote(code)}"),
                ("variables", f"env | LC_ALL=C grep -E '^({KEY_VARIABLES})=' | LC_ALL=C sort"),
                ("C compiler", '"${CC:-cc}" --version'),
                ("C++ compiler", '"${CXX:-c++}" --version'),
                ("cmake", "cmake --version"))

    def prepare_actions(self, ctx: PlanContext) -> list:
        """Unpack the sdist into the stage dir (emptied first) and apply the patches in order."""
        src = self.src_dir(ctx)
        return ([Unpack(self.sdist(ctx), os.path.dirname(src))]
                + [Run(("patch", "-p1", "-i", self.patch_path(ctx, p)), cwd=src) for p in self.patches])

    def wheel_run(self, ctx: PlanContext) -> Run:
        """Build a wheel of the source tree into ``dist``, with the build's variables, in the
        stack's venv (``--no-build-isolation``: the build sees the venv's torch).

        With ``installer.backend: uv`` the venv has no pip (:class:`~hpcstack.install.components.venv.Venv`),
        so the build is ``uv build --wheel --no-build-isolation --python <venv python>``
        (https://docs.astral.sh/uv/reference/cli/#uv-build), which runs the same setuptools
        backend with the venv's interpreter; with ``backend: pip`` it is ``pip wheel --no-deps
        --no-build-isolation``. Both need the lock's ``setuptools`` and ``wheel``.
        """
        if ctx.site.installer.backend == "uv":
            # TMPDIR: uv's lock files (uv-setuptools-*.lock) and the build's temporary files go
            # to the stage dir, not the machine's /tmp (an admin's install writes nothing outside
            # its own directories: tests/test_packaging.py)
            return Run((uv_binary(), "build", "--no-config", "--cache-dir", wheel_cache(ctx), "--python", ctx.python,
                        "--no-build-isolation",
                        "--wheel", "--out-dir", self.dist_dir(ctx), self.src_dir(ctx)),
                       env={**self.build_env(ctx), "TMPDIR": ctx.stage_dir}, prepend=self.build_prepend(ctx),
                       unset=UV_UNSET)
        return Run(ctx.pip("wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                           "-w", self.dist_dir(ctx), self.src_dir(ctx)),
                   env=self.build_env(ctx), prepend=self.build_prepend(ctx))

    def cached_build(self, ctx: PlanContext) -> CachedWheelBuild | None:
        """The build through the site's build cache, or None when ``installer.build_cache`` is off."""
        if not ctx.site.installer.build_cache:
            return None
        root = os.path.join(ctx.cache_dir, "builds", f"{self.package}-{self.version}")
        ahead = self.prepare_ahead(ctx, root)
        return CachedWheelBuild(self.package, root, self.dist_dir(ctx), self.wheel_run(ctx),
                                env=self.build_env(ctx),
                                fixed=self.key_fixed(ctx), probes=self.key_probes(ctx),
                                prepare=tuple(self.prepare_actions(ctx)),
                                ready=ahead.ready, ready_digest=ahead.digest)

    def prepare_ahead(self, ctx: PlanContext, root: str) -> PrepareAhead:
        """The patch step's unpack and patch on a sure build-cache miss (:class:`PrepareAhead`)."""
        return PrepareAhead(root, self.ready_stamp(ctx), tuple(self.prepare_actions(ctx)), self.key_fixed(ctx))

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component.

        With the build cache (default), ``patch`` checks the patches' sha256 (and unpacks and
        patches when the cache holds no wheel of this version: :class:`PrepareAhead`; the step
        runs while the wheels install) and ``build`` is a :class:`CachedWheelBuild` that
        unpacks, patches (unless done ahead) and builds only on a miss; without it,
        ``patch`` unpacks and patches and ``build`` runs ``pip wheel``. ``install`` installs the
        wheel with the site's installer (:func:`install_run`: uv with ``--compile-bytecode`` by
        default, or pip), reinstalling the package.
        """
        dist = self.dist_dir(ctx)
        verify = [VerifySha256(self.patch_path(ctx, p), p.sha256) for p in self.patches]
        cached = self.cached_build(ctx)
        if cached:  # unpack and patch only when the wheel must be built (CachedWheelBuild.prepare)
            patch_step, build_step = verify + [self.prepare_ahead(ctx, cached.root)], [cached]
        else:
            patch_step = verify + self.prepare_actions(ctx)
            build_step = [Run(("rm", "-rf", dist)), self.wheel_run(ctx)]
        return {
            FETCH: [Fetch(self.url, self.sha256, self.sdist(ctx))],
            PATCH: patch_step,
            BUILD: build_step,
            INSTALL: [install_run(ctx, "--no-deps", "--no-index", "--find-links", dist,
                                  f"{self.package}=={self.version}", reinstall=(self.package,))],
            SANITYCHECK: self.sanity_actions(ctx),
        }


@dataclass(frozen=True)
class HorovodBuild(SourceBuild):
    """Horovod from its PyPI sdist, built against the site's MPI (and NCCL and CUDA on GPU sites).

    What Horovod is built *with* is this component's (the recipe's) choice: PyTorch only, the MPI
    and Gloo controllers, ``cpu_operations`` for CPU tensors, and on a site whose toolchain has
    CUDA, ``gpu_operations`` for GPU tensors. What it is built *against* comes from the site's
    :class:`hpcstack.site.Toolchain`: the compilers (``CC``/``CXX``/``FC``, the MPI wrappers),
    ``HOROVOD_CUDA_HOME``, ``HOROVOD_NCCL_HOME``, ``HOROVOD_BUILD_CUDA_CC_LIST``. The variables
    follow Horovod's install guide (https://horovod.readthedocs.io/en/stable/install_include.html).
    On a site without CUDA the build sets ``HOROVOD_WITHOUT_CUDA=1`` (our patch): Horovod would
    otherwise turn CUDA on by itself when torch is a CUDA build and any CUDA toolkit can be found
    (``nvcc`` on PATH, ``/usr/local/cuda``). A site's CUDA stubs directory is prepended to
    ``LD_LIBRARY_PATH`` for the build and the sanity check only (a login node has no driver); it
    never reaches the modulefile. The sanity check reads the flags ``horovodrun --check-build``
    reports (in the recipe's import process by default, see ``check_build``) and requires
    :meth:`required_flags`: ``required`` plus the GPU operations on CUDA sites (a Gloo-only GPU
    build halves per-GPU throughput, Horovod issue #2686).

    The build key adds to :class:`SourceBuild`'s the torch version, the MPI behind the compiler
    wrappers, the CUDA compiler and NCCL's version, and every ``HOROVOD_*`` variable of the build
    environment; ``MAKEFLAGS`` does not count. Not in the key: the venv's path. Horovod's CMake
    gives its ``.so`` files a RUNPATH to the building venv's ``torch/lib``; a wheel reused in
    another prefix keeps that path. It works, also once the first build is gone:
    ``horovod.torch`` imports torch first, so the loader matches ``libtorch.so`` and
    ``libc10.so`` by name among the libraries already loaded, and it looks for ``libmpi*.so`` in
    that directory in vain (23 failed lookups in the benchmark's strace) before the system
    directories. A prefix-free wheel needs the RUNPATH dropped at build time (docs/benchmarks.md).

    Args:
        cpu_operations (str): ``HOROVOD_CPU_OPERATIONS``: ``MPI``, ``Gloo`` or ``CCL``.
        gpu_operations (str): ``HOROVOD_GPU_OPERATIONS`` on CUDA sites: ``NCCL`` or ``MPI``.
        required (tuple[str, ...]): ``horovodrun --check-build`` flags every site must show.
        check_build (str): how the sanity check reads the flags: ``"in-process"`` (default)
            from ``horovod.torch``'s ``mpi_built()``, ``gloo_built()``, ``nccl_built()``, … in the
            one interpreter that also runs the recipe's imports (:class:`PythonCheck`: 1.5 s, where
            ``horovodrun --check-build`` forks about 13 processes that each import torch: 6 s on
            2 cores, issue 14); ``"horovodrun"`` runs ``horovodrun --check-build`` itself.

    Example:
        ``HorovodBuild("horovod", "0.28.1", url=..., sha256=..., patches=(Patch("horovod-0.28.1-cxx17.patch", "…"),))``
    """

    package: str = "horovod"
    version: str = "0.28.1"
    url: str = ""
    sha256: str = ""
    patches: tuple[Patch, ...] = field(default=())
    cpu_operations: str = "MPI"
    gpu_operations: str = "NCCL"
    required: tuple[str, ...] = ("PyTorch", "MPI", "Gloo")
    check_build: str = "in-process"

    def __post_init__(self):
        if self.check_build not in ("in-process", "horovodrun"):
            raise ValueError(f"check_build {self.check_build!r}: one of in-process, horovodrun")
        if self.cpu_operations not in ("MPI", "Gloo", "CCL"):
            raise ValueError(f"cpu_operations {self.cpu_operations!r}: one of MPI, Gloo, CCL")
        if self.gpu_operations not in ("NCCL", "MPI"):
            raise ValueError(f"gpu_operations {self.gpu_operations!r}: one of NCCL, MPI")

    def required_flags(self, ctx: PlanContext) -> tuple[str, ...]:
        """The check-build flags this site's build must show: ``required``, plus
        ``gpu_operations`` where the toolchain has CUDA."""
        extra = (self.gpu_operations,) if ctx.toolchain.has_cuda else ()
        return tuple(dict.fromkeys(self.required + extra))

    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        tc = ctx.toolchain
        env = {"CC": tc.cc, "CXX": tc.cxx}
        if tc.fc:
            env["FC"] = tc.fc
        env.update({
            "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
            "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
            "HOROVOD_CPU_OPERATIONS": self.cpu_operations,
        })
        if tc.has_cuda:
            env["HOROVOD_GPU"] = "CUDA"
            env["HOROVOD_GPU_OPERATIONS"] = self.gpu_operations
            env["HOROVOD_CUDA_HOME"] = tc.cuda_home
            if tc.nccl_home:
                env["HOROVOD_NCCL_HOME"] = tc.nccl_home
            if tc.cuda_cc_list:
                env["HOROVOD_BUILD_CUDA_CC_LIST"] = ",".join(str(c) for c in tc.cuda_cc_list)
            if not tc.cuda_static_runtime:
                # our patch's knob; nvcc's own links follow NVCC_APPEND_FLAGS. CMake's probe of
                # the CUDA compiler's link directories links libcudart_static.a whatever the
                # setting, fails without it, and leaves the toolkit's lib64 off the final link
                # line: LDFLAGS puts it there (CMake starts its linker flags from LDFLAGS).
                env["HOROVOD_CUDA_RUNTIME_LIBRARY"] = "Shared"
                env["NVCC_APPEND_FLAGS"] = "--cudart shared"
                site_ldflags = ctx.site.build_env.get("LDFLAGS", "")
                env["LDFLAGS"] = f"-L{tc.cuda_home}/lib64" + (f" {site_ldflags}" if site_ldflags else "")
            if (not {"CUDA_HOME", "CUDA_PATH"} & set(ctx.site.build_env)
                    and tc.cuda_home not in ("${CUDA_HOME}", "$CUDA_HOME")):
                # torch's cpp_extension, which Horovod's CMake asks for the CUDA libraries, finds
                # the toolkit by CUDA_HOME (else CUDA_PATH, else nvcc on PATH, else /usr/local/cuda)
                env["CUDA_HOME"] = tc.cuda_home
        else:
            env["HOROVOD_WITHOUT_CUDA"] = "1"
        base = super().build_env(ctx)
        if "LDFLAGS" in env:
            base.pop("LDFLAGS", None)
        return {**env, **base}

    def key_packages(self, ctx: PlanContext) -> tuple[str, ...]:
        """torch: Horovod's PyTorch extension is built against its headers and C++ ABI."""
        return ("torch",)

    def key_probes(self, ctx: PlanContext) -> tuple[tuple[str, str], ...]:
        """As :meth:`SourceBuild.key_probes`, plus the MPI behind the compiler wrapper (Open MPI
        ``-showme`` and its version, else MPICH-style ``-show``), the CUDA compiler Horovod would
        use (``$HOROVOD_CUDA_HOME/bin/nvcc``, else an ``nvcc`` on PATH, none for a build with
        ``HOROVOD_WITHOUT_CUDA``: a CPU build does not depend on the machine's nvcc) and NCCL's version
        (``$HOROVOD_NCCL_HOME/include/nccl.h``)."""
        return (*super().key_probes(ctx),
                ("MPI", '"${CC:-mpicc}" -showme 2>/dev/null && "${CC:-mpicc}" -showme:version 2>/dev/null'
                        ' || "${CC:-mpicc}" -show'),
                ("CUDA", 'if [ -n "$HOROVOD_CUDA_HOME" ]; then "$HOROVOD_CUDA_HOME/bin/nvcc" --version; '
                         'elif [ -n "$HOROVOD_WITHOUT_CUDA" ]; then echo "CUDA off (HOROVOD_WITHOUT_CUDA)"; '
                         'else command -v nvcc && nvcc --version; fi'),
                ("NCCL", 'if [ -n "$HOROVOD_NCCL_HOME" ]; then grep -E "^#define NCCL_(MAJOR|MINOR|PATCH|SUFFIX)" '
                         '"$HOROVOD_NCCL_HOME/include/nccl.h"; fi'))

    def stub_dir(self, ctx: PlanContext) -> str:
        """A directory of ours in the stage dir holding ``libcuda.so.1`` -> the site's stub."""
        return os.path.join(ctx.stage_dir, "cuda-stubs")

    def build_prepend(self, ctx: PlanContext) -> dict[str, str]:
        stubs = ctx.toolchain.cuda_stubs
        return {"LD_LIBRARY_PATH": f"{self.stub_dir(ctx)}:{stubs}"} if stubs else {}

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """As :meth:`SourceBuild.contribute`, plus the ``libcuda.so.1`` stub link on GPU sites.

        The Cirrus instructions ask the admin to check that ``libcuda.so.1`` links to
        ``libcuda.so`` in NVHPC's stubs; we make that link in the stage dir instead of touching
        the NVHPC tree.
        """
        steps = super().contribute(ctx)
        tc = ctx.toolchain
        if tc.has_cuda and tc.cuda_cc_list:
            steps[BUILD][:0] = [CudaArchCheck(f"{tc.cuda_home}/bin/nvcc", tuple(tc.cuda_cc_list), tc.cuda_version)]
        stubs = ctx.toolchain.cuda_stubs
        if stubs:
            stub_dir = self.stub_dir(ctx)
            steps[BUILD][:0] = [Run(("test", "-e", f"{stubs}/libcuda.so")),
                                Run(("mkdir", "-p", stub_dir)),
                                Run(("ln", "-sfn", f"{stubs}/libcuda.so", f"{stub_dir}/libcuda.so.1"))]
        return steps

    def sanity_actions(self, ctx: PlanContext) -> list:
        """The build flags of :meth:`required_flags`, checked in one process with the recipe's
        imports (:class:`PythonCheck`), or by ``horovodrun --check-build`` itself
        (:class:`CheckBuild`) when ``check_build="horovodrun"``."""
        if self.check_build == "horovodrun":
            return [CheckBuild(os.path.join(ctx.venv, "bin", "horovodrun"),
                               self.required_flags(ctx),
                               prepend=self.build_prepend(ctx))]
        return [PythonCheck(ctx.python, horovod=self.required_flags(ctx), prepend=self.build_prepend(ctx))]


@dataclass(frozen=True)
class CudaArchCheck(ActionBase):
    """Check that the site's CUDA toolkit compiles for every compute capability it lists.

    CUDA 13 dropped compute capability 7.0 (V100): ``nvcc --list-gpu-arch`` of 13.0 starts at
    ``compute_75``, so a site with ``cuda.cc_list: [70]`` needs a CUDA 12.x toolkit (the CUDA
    13.0 release notes; issue 10). The install's preflight runs :meth:`preflight` before anything
    is written; the dry-run prints the same check as bash (``nvcc --list-gpu-arch`` and a
    ``grep`` for each capability), and :meth:`execute` runs that bash, so the three agree.

    Args:
        nvcc (str): the toolkit's ``nvcc``; may hold ``${VAR}`` references to the build
            environment (``${NVHPC_ROOT}/cuda/12.4/bin/nvcc``).
        cc_list (tuple[int, ...]): compute capabilities, e.g. ``(70,)``.
        cuda_version (str | None): the site's CUDA ``X.Y``, named in the message.

    Raises:
        HpcstackError: (execute) a capability the toolkit does not offer, or no usable nvcc.
    """

    nvcc: str
    cc_list: tuple[int, ...]
    cuda_version: str | None = None

    def commands(self) -> tuple[Run, ...]:
        return (Run((self.nvcc, "--list-gpu-arch")),)

    def problems(self, env: dict[str, str]) -> list[str]:
        """One line naming the toolkit and every unsupported capability; empty when all are offered.

        Args:
            env (dict[str, str]): the build environment (the site's modules loaded).
        """
        from hpcstack.install.actions import expand

        nvcc = expand(self.nvcc, env)
        where = f"CUDA {self.cuda_version} ({nvcc})" if self.cuda_version else nvcc
        try:
            proc = subprocess.run([nvcc, "--list-gpu-arch"], env=env, capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"toolchain.cuda: cannot run {nvcc} --list-gpu-arch ({exc}); check toolchain.cuda.home"]
        offered = sorted({int(m) for m in re.findall(r"compute_(\d+)", proc.stdout)})
        if proc.returncode != 0 or not offered:
            return [f"toolchain.cuda: {nvcc} --list-gpu-arch listed no architectures (exit "
                    f"{proc.returncode}); check toolchain.cuda.home"]
        missing = [cc for cc in self.cc_list if cc not in offered]
        if not missing:
            return []
        shown = ", ".join(f"{cc // 10}.{cc % 10} (compute_{cc})" for cc in missing)
        return [f"toolchain.cuda.cc_list: {where} does not compile for compute capability {shown}; "
                f"it offers compute_{offered[0]} to compute_{offered[-1]}: use a toolkit that has "
                "them (CUDA 12.x for 7.0, V100) or drop them from cc_list"]

    def preflight(self, env: dict[str, str]) -> list[str]:
        """The install's preflight calls this before anything is written (:func:`hpcstack.install.runner.preflight`)."""
        return self.problems(env)

    def to_bash(self) -> str:
        nvcc = bash_word(self.nvcc)
        ccs = " ".join(str(c) for c in self.cc_list)
        return (f"hpcstack_archs=$({nvcc} --list-gpu-arch)\n"
                f"for cc in {ccs}; do\n"
                f'  grep -qx "compute_$cc" <<<"$hpcstack_archs" || '
                f'{{ echo "{self.nvcc} does not compile for compute_$cc" >&2; exit 2; }}\n'
                "done")

    def execute(self, ctx: ExecContext) -> None:
        problems = self.problems(getattr(ctx, "env", None) or dict(os.environ))
        ctx.log.write(f"$ {self.nvcc} --list-gpu-arch: {'; '.join(problems) or 'every capability offered'}\n")
        if problems:
            raise HpcstackError(problems[0])


@dataclass(frozen=True)
class CheckBuild(ActionBase):
    """Run ``horovodrun --check-build`` and require flags (the Horovod build's sanity check).

    The dry-run line is ``hpcstack check-build --horovodrun … --require …``, which calls the same
    :func:`hpcstack.validate.checkbuild.check_build` as :meth:`execute`, in the environment built
    from the same ``env`` and ``prepend`` (:meth:`Run.command_env`). :meth:`execute` also keeps
    the output as ``check-build.txt`` in the build's ``.hpcstack`` (provenance).

    Args:
        horovodrun (str): path of ``horovodrun`` in the stack.
        required (tuple[str, ...]): flags that must be ``[X]``, as ``Section:Name`` or ``Name``
            (any section), e.g. ``("PyTorch", "Controllers:MPI", "Controllers:Gloo", "Operations:NCCL")``.
        env (dict[str, str]) / prepend (dict[str, str]): as for :class:`Run`.

    Raises:
        HpcstackError: names every required flag that is missing.
    """

    horovodrun: str
    required: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    prepend: dict[str, str] = field(default_factory=dict)

    def _run(self) -> Run:
        return Run(("hpcstack", "check-build", "--horovodrun", self.horovodrun,
                    "--require", ",".join(self.required)), env=self.env, prepend=self.prepend)

    def commands(self) -> tuple[Run, ...]:
        """``horovodrun --check-build``, with the variables it runs with (hpcstack's own code
        runs it, not the ``hpcstack`` command)."""
        return (Run((self.horovodrun, "--check-build"), env=self.env, prepend=self.prepend),)

    def to_bash(self) -> str:
        return self._run().to_bash()

    def execute(self, ctx: ExecContext) -> None:
        from hpcstack.fsutil import write_atomic
        from hpcstack.validate.checkbuild import check_build

        env = self._run().command_env(ctx.env)
        ctx.log.write(f"$ {self.to_bash()}\n")
        output = check_build(self.horovodrun, self.required, env)
        ctx.log.write(output)
        state_dir = getattr(ctx, "state_dir", None)
        if state_dir is not None:  # provenance: the stack records what its Horovod was built with
            write_atomic(os.path.join(state_dir, "check-build.txt"), output)
