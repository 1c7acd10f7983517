"""Generic source builds: a Python sdist, sha256-checked, patched, built into a wheel with the
site's compilers, kept in the site's build cache, installed into the stack's venv.

:class:`SourceBuild` is the component any recipe lists for a package that must match the site
(``mpi4py`` against the site's MPI, Horovod against MPI, NCCL and CUDA: :class:`HorovodBuild`
specialises it). Its actions: :class:`PrepareAhead` (unpack and patch while the wheels install)
and :class:`CachedWheelBuild` (reuse the wheel built before under the same build key, else
build it). Both follow :class:`hpcstack.install.actions.Action`.

The build key hashes everything that changes the binary: the sdist and patch sha256s, the
compilers' versions (``$CC``, ``$CXX``, ``$FC --version``), the MPI behind the wrappers (Open MPI
``-showme`` and ``-showme:version``, else MPICH's ``-show`` and ``-v``), CUDA and NCCL where the
build uses them, the venv's Python and its ABI (``SOABI``), the versions of the packages the
binary is built against, and the build's variables. ``MAKEFLAGS`` (parallelism) does not count,
nor do the variables that say where pip and uv fetch packages from (an index, a bundle).
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import secrets as _random
import shlex
import shutil
import stat
import subprocess
from dataclasses import dataclass, field

from hpcstack import gate, secrets
from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD, copy_fd
from hpcstack.install import wheelcache
from hpcstack.install.actions import ACTION_COMMAND, ActionBase, ExecContext, Run, Unpack, VerifySha256, bash_word
from hpcstack.install.plan import BUILD, FETCH, INSTALL, PATCH, SANITYCHECK
from hpcstack.install.components.base import Component, PlanContext
from hpcstack.install.components.wheels import UV_UNSET, install_run, uv_binary, wheel_cache
from hpcstack.install.sources import sdist_fetch
from hpcstack.install.wheelcache import SUMS

#: Bumped when the key's recipe changes, so wheels keyed the old way are not reused
#: (v2: the MPI wrapper, the Fortran compiler, Python's ABI and every build variable in every key).
#: Leaving a line out needs no bump: an old text equal to a new one comes from a build that never
#: had that line, so its wheel is right (v2 later left out :data:`PACKAGE_SOURCE_VARIABLES`).
KEY_FORMAT = "hpcstack build key v2"
#: Drops the ``<script>: line N: `` that bash puts before its own errors (``command not found``,
#: ``No such file or directory``): the line differs between the dry-run script and the key
#: function run alone, and the key must not. A probe that succeeds prints no such line.
_NO_LINE_NUMBERS = "sed -E 's/^[^:]*: line [0-9]+: //'"

#: Variables of the surroundings that change the binary whatever the component sets; the key
#: records their values, with those of every variable of the component's build environment.
#: ``MAKEFLAGS`` (parallelism) is left out on purpose: ``-j2`` and ``-j8`` give the same wheel.
#: No secret may be one (:func:`hpcstack.secrets.key_problems`).
KEY_VARIABLES = secrets.BUILD_KEY_VARIABLES
#: Build variables that never enter the key: parallelism and scratch space.
_NOT_IN_KEY = ("MAKEFLAGS", "TMPDIR")
#: Build variables that never enter the key either: where pip and uv find packages and how they
#: reach the network (an index, a directory of files, a proxy). ``install --from BUNDLE`` sets
#: ``PIP_NO_INDEX=1`` and ``PIP_FIND_LINKS=<bundle>/build``
#: (:func:`hpcstack.lifecycle.bundle.use_bundle`), a site may name its own mirror: they say where
#: a build requirement is fetched from, not what is compiled, so a build from a bundle has the
#: key of the same build online (and the bundle's path, which differs with every copy of it, is
#: not in the key).
PACKAGE_SOURCE_VARIABLES = (r"(PIP|UV)_(INDEX_URL|EXTRA_INDEX_URL|INDEX|DEFAULT_INDEX|FIND_LINKS|NO_INDEX|OFFLINE"
                            r"|TRUSTED_HOST|INSECURE_HOST|CERT|CLIENT_CERT|PROXY|TIMEOUT|HTTP_TIMEOUT|RETRIES)"
                            r"|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy")

#: The MPI behind the C compiler wrapper: Open MPI's ``-showme`` (the underlying command) and
#: ``-showme:version``, else MPICH's (and its derivatives') ``-show`` and the first line of ``-v``.
MPI_PROBE = ('mpi="${MPICC:-${CC:-mpicc}}"; if "$mpi" -showme:version >/dev/null 2>&1; '
             'then "$mpi" -showme; "$mpi" -showme:version; '
             "else \"$mpi\" -show; \"$mpi\" -v 2>&1 | sed -n 1p; fi")


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
        proc = subprocess.run(["bash", "-c", f"{self.key_script()}\n{self.function}"], env=env, cwd=CHILD_CWD,
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
        real_root = os.path.realpath(self.root)
        gate.mkdir(real_root, 0o777, parents=True, exact=False)   # as os.makedirs: under the umask
        try:
            store_wheels(real_root, key, built, text)
            ctx.log.write(f"stored {', '.join(os.path.basename(w) for w in built)} in {entry}\n")
        except (OSError, HpcstackError) as exc:  # the build succeeded; only its reuse is lost
            ctx.log.write(f"warning: could not store the wheel in {entry}: {exc}\n")


def _copy_into(src: str, dst_fd: int, h) -> str:
    """Copy the regular file ``src`` (its directory through :mod:`hpcstack.gate`, the file opened
    with ``O_NOFOLLOW``) to a new file of the same name in the directory ``dst_fd`` (``O_EXCL``),
    mode 0644, feeding ``h`` (a hashlib object) its bytes. Returns the name."""
    name = os.path.basename(src)
    with gate.directory(os.path.realpath(os.path.dirname(src))) as sfd:
        fin = os.open(name, gate.FILE_READ, dir_fd=sfd)
    try:
        if not stat.S_ISREG(os.fstat(fin).st_mode):
            gate.refuse(src, "not a regular file")
        fout = os.open(name, gate.FILE_NEW, 0o600, dir_fd=dst_fd)
        try:
            copy_fd(fin, fout, h)
            os.fchmod(fout, 0o644)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return name


def _write_new(dir_fd: int, name: str, text: str) -> None:
    """A new file ``name`` (``O_EXCL|O_NOFOLLOW``) in ``dir_fd`` holding ``text``, mode 0644."""
    f = os.open(name, gate.FILE_NEW, 0o600, dir_fd=dir_fd)
    try:
        os.write(f, text.encode())
        os.fchmod(f, 0o644)
    finally:
        os.close(f)


def store_wheels(root: str, key: str, wheels: list[str], text: str) -> str:
    """Store built wheels as the build-cache entry ``<root>/<key>`` (the wheels, ``key.txt``
    holding ``text``, :data:`~hpcstack.install.wheelcache.SUMS`; files 0644, the entry 0755),
    by descriptor: the cache directory is opened through :mod:`hpcstack.gate` (the trust rule
    from ``/``, no link followed; the site's group may write it where the site says so); the
    entry is made inside a new 0700 directory of this account there (``.new-XXXXXXXXXXXX``,
    which no one else can write into), every file created ``O_EXCL|O_NOFOLLOW``, then renamed
    from that directory's descriptor to ``key`` in the cache's. A member of the site's group who
    renames or replaces entries of the cache meanwhile makes the store fail, never write or
    ``chmod`` anything elsewhere.

    Args:
        root (str): the cache directory of the package and version (absolute, resolved: it is
            walked without following links).
        key (str): the build key (the entry's name).
        wheels (list[str]): the built wheels' paths (regular files).
        text (str): the key's text.

    Returns:
        str: the entry, ``<root>/<key>``.

    Raises:
        OSError: the cache cannot be written, or an entry of that key is there already
            (another install stored it first).
        hpcstack.gate.GateError: a link or an untrusted directory on the way, or a wheel that
            is not a regular file.
    """
    with gate.directory(root) as root_fd:
        for _ in range(100):
            tmp = f".new-{_random.token_hex(6)}"
            try:
                os.mkdir(tmp, 0o700, dir_fd=root_fd)
                break
            except FileExistsError:
                continue
        else:
            raise OSError(errno.EEXIST, "no free temporary name", os.path.join(root, ".new-*"))
        tmp_fd = os.open(tmp, gate.DIR_READ, dir_fd=root_fd)
        st = os.fstat(tmp_fd)
        try:
            if st.st_uid != os.geteuid() or st.st_mode & 0o777 != 0o700 or st.st_nlink != 2:
                gate.refuse(os.path.join(root, tmp), "replaced while it was made")
            try:
                os.mkdir("entry", 0o700, dir_fd=tmp_fd)
                entry_fd = os.open("entry", gate.DIR_READ, dir_fd=tmp_fd)
                try:
                    sums = {}
                    for wheel in wheels:
                        h = hashlib.sha256()
                        name = _copy_into(wheel, entry_fd, h)
                        sums[name] = h.hexdigest()
                    _write_new(entry_fd, "key.txt", text)
                    _write_new(entry_fd, SUMS, "".join(f"{sums[n]}  {n}\n" for n in sorted(sums)))
                    os.fchmod(entry_fd, 0o755)
                finally:
                    os.close(entry_fd)
                os.rename("entry", key, src_dir_fd=tmp_fd, dst_dir_fd=root_fd)  # atomic; fails if stored first
            finally:
                shutil.rmtree("entry", ignore_errors=True, dir_fd=tmp_fd)
        finally:
            try:   # the temporary directory, if it is still the one made here (empty now)
                now = os.stat(tmp, dir_fd=root_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    os.rmdir(tmp, dir_fd=root_fd)
            except OSError:
                pass
            os.close(tmp_fd)
    return os.path.join(root, key)


@dataclass(frozen=True)
class PrepareAhead(ActionBase):
    """Unpack and patch the sources in the patch step when the build cache surely misses (an action).

    The patch step runs in the background while the venv and wheels steps run
    (:data:`hpcstack.install.plan.BACKGROUND_STEPS`), so on a first install the unpack and patch
    overlap the downloads of the wheels. Whether the build step will miss is known
    only there (its key probes the venv), so this does the work only when the cache
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
class SourceBuild(Component):
    """Download a Python sdist, check its sha256, patch it, build a wheel with the site's
    compilers, install the wheel.

    Building a wheel (``pip wheel --no-build-isolation``, or ``uv build``) and installing that
    avoids pip's fallback to a legacy ``setup.py install`` that doubles the time of a failed build
    (docs/notes.md). The build runs in the site's build environment (its ``modules.build`` loaded,
    its ``build.env`` set) with the site toolchain's compilers: ``CC``, ``CXX`` and ``FC`` and the
    MPI wrapper variables ``MPICC``, ``MPICXX`` and ``MPIFC`` (read by mpi4py and most MPI
    builds) name the toolchain's ``cc``, ``cxx`` and ``fc`` (the MPI wrappers on every site).
    Precedence, lowest first: the toolchain, the recipe's ``env``, the site's ``build.env``.
    The wheel goes through the site's build cache (``installer.build_cache``, default on): a
    re-install whose build key matches copies the wheel built before instead of compiling
    (:class:`CachedWheelBuild`; the key: see this module's docstring and :meth:`key_probes`).
    The wheel is installed with the site's installer (uv by default, ``--compile-bytecode``).

    Args:
        package (str): distribution name, e.g. ``"mpi4py"``.
        version (str): e.g. ``"3.1.6"``.
        url (str): the sdist's URL (PyPI's files.pythonhosted.org, or ``file://``).
        sha256 (str): the sdist's sha256 (64 hex digits), as PyPI lists it.
        patches (tuple[Patch, ...]): applied in order with ``patch -p1``; default none.
        env (dict[str, str]): the recipe's build settings (e.g. ``{"CFLAGS": "-O3"}``); values
            may hold ``${VAR}`` references to the build environment. Default none.
        built_against (tuple[str, ...]): packages of the stack's venv the binary is built
            against (headers, C++ ABI: ``("torch",)``); their versions enter the build key.
            Default none.
        cuda (bool): the build uses CUDA where the site's toolchain has it: ``CUDA_HOME`` is set
            to the toolchain's, and ``nvcc --version`` and NCCL's version enter the key. Default False.
        imports (tuple[str, ...]): modules the sanity check imports (in the recipe's one
            interpreter, :class:`hpcstack.install.components.sanity.PythonCheck`); default none.
        checks (tuple[PythonSnippet, ...]): checks of the built package run in that interpreter
            after the imports (:class:`hpcstack.install.components.sanity.PythonSnippet`); default none.

    Raises:
        HpcstackError: (when run) a download or patch whose sha256 differs, a failed build.

    Example:
        ``SourceBuild("mpi4py", "3.1.6", "https://…/mpi4py-3.1.6.tar.gz", "ab12…", imports=("mpi4py.MPI",))``
    """

    package: str
    version: str
    url: str
    sha256: str
    patches: tuple[Patch, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    built_against: tuple[str, ...] = ()
    cuda: bool = False
    imports: tuple[str, ...] = ()
    checks: tuple = ()

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
    def toolchain_env(self, ctx: PlanContext) -> dict[str, str]:
        """The site toolchain's compilers: ``CC``/``CXX``/``FC`` and the MPI wrapper variables
        ``MPICC``/``MPICXX``/``MPIFC``; ``CUDA_HOME`` where :attr:`cuda` is set and the site has CUDA
        (unless the site's ``build.env`` names ``CUDA_HOME`` or ``CUDA_PATH`` itself)."""
        tc = ctx.toolchain
        env = {"CC": tc.cc, "CXX": tc.cxx, "MPICC": tc.cc, "MPICXX": tc.cxx}
        if tc.fc:
            env.update(FC=tc.fc, MPIFC=tc.fc)
        if (self.cuda and tc.has_cuda and not {"CUDA_HOME", "CUDA_PATH"} & set(ctx.site.build_env)
                and tc.cuda_home not in ("${CUDA_HOME}", "$CUDA_HOME")):
            env["CUDA_HOME"] = tc.cuda_home
        return env

    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        """Variables for the build: the toolchain's (:meth:`toolchain_env`), the recipe's ``env``,
        the site's ``build.env`` and ``MAKEFLAGS=-j<jobs>``, later ones winning."""
        return {**self.toolchain_env(ctx), **self.env, **ctx.site.build_env, "MAKEFLAGS": f"-j{ctx.jobs}"}

    def build_prepend(self, ctx: PlanContext) -> dict[str, str]:
        """Path-like variables to prepend to during the build."""
        return {}

    def sanity_actions(self, ctx: PlanContext) -> list:
        """The sanity check's actions: :attr:`imports` and :attr:`checks` in the recipe's one
        interpreter (none when both are empty)."""
        from hpcstack.install.components.sanity import PythonCheck

        if not (self.imports or self.checks):
            return []
        return [PythonCheck(ctx.python, tuple(self.imports), checks=tuple(self.checks),
                            prepend=self.build_prepend(ctx))]

    # -- the build key (see CachedWheelBuild); subclasses add probes
    def key_packages(self, ctx: PlanContext) -> tuple[str, ...]:
        """Packages of the venv the binary is built against (:attr:`built_against`); their
        versions enter the key."""
        return tuple(self.built_against)

    def key_fixed(self, ctx: PlanContext) -> tuple[str, ...]:
        """Key lines known when planning: key format, package, sdist and patch sha256s."""
        return (KEY_FORMAT, f"package {self.package} {self.version}",
                f"sdist {os.path.basename(self.url)} sha256 {self.sha256}",
                *(f"patch {p.file} sha256 {p.sha256}" for p in self.patches))

    def key_variables(self, ctx: PlanContext) -> str:
        """The ``grep -E`` pattern of the variables whose values enter the key: those of
        :data:`KEY_VARIABLES` and every variable of :meth:`build_env` but ``MAKEFLAGS``/``TMPDIR``,
        those of :data:`PACKAGE_SOURCE_VARIABLES` (where packages are fetched from), the site's
        secrets and the variables that expand one (``build.env`` values marked ``secret``: the
        key's text is logged and kept in the build cache, and a secret is written nowhere;
        :func:`hpcstack.secrets.secret_names`).

        Raises:
            ConfigError: a variable of :data:`KEY_VARIABLES` expands a secret
                (:func:`hpcstack.secrets.check_key`; the site config's own are refused earlier).
        """
        specs = getattr(ctx.site, "secrets", None) or {}
        env = self.build_env(ctx)
        secrets.check_key(env, specs, f"{getattr(ctx.recipe, 'full_name', 'recipe')}: the build of {self.package}")
        secret = secrets.secret_names(env, specs)
        names = sorted(n for n in env
                       if n not in _NOT_IN_KEY and n not in secret and not re.fullmatch(KEY_VARIABLES, n)
                       and not re.fullmatch(PACKAGE_SOURCE_VARIABLES, n))
        return "|".join([KEY_VARIABLES, *(re.escape(n) for n in names)])

    def key_probes(self, ctx: PlanContext) -> tuple[tuple[str, str], ...]:
        """``(label, bash command)`` pairs run in the build environment whose output enters the
        key: the venv's Python (version, base prefix, platform, ABI: ``SOABI``, ``EXT_SUFFIX``)
        and the versions of :meth:`key_packages`; the build's variables (:meth:`key_variables`);
        the C, C++ (and Fortran, where the toolchain has one) compilers' ``--version``; the MPI
        behind the wrapper (:data:`MPI_PROBE`); cmake's version; then :meth:`gpu_probes`."""
        code = ("import importlib.metadata as m, sys, sysconfig; print(sys.version); "
                "print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); "
                'print("abi", sysconfig.get_config_var("SOABI"), sysconfig.get_config_var("EXT_SUFFIX"), '
                'getattr(sys, "abiflags", "")); '
                f"[print(p, m.version(p)) for p in {json.dumps(list(self.key_packages(ctx)))}]")
        probes = [("python", f"{shlex.quote(ctx.python)} -c {shlex.quote(code)}"),
                  ("variables", f"env | LC_ALL=C grep -E '^({self.key_variables(ctx)})=' | LC_ALL=C sort"),
                  ("C compiler", '"${CC:-cc}" --version'),
                  ("C++ compiler", '"${CXX:-c++}" --version')]
        if ctx.toolchain.fc:
            probes.append(("Fortran compiler", '"${FC:-gfortran}" --version'))
        probes += [("MPI", MPI_PROBE), ("cmake", "cmake --version")]
        return (*probes, *self.gpu_probes(ctx))

    def gpu_probes(self, ctx: PlanContext) -> tuple[tuple[str, str], ...]:
        """Key probes of CUDA and NCCL: with :attr:`cuda` set on a site with CUDA, the toolkit's
        ``nvcc --version`` and the ``NCCL_*`` version lines of its ``nccl.h``; none otherwise."""
        tc = ctx.toolchain
        if not (self.cuda and tc.has_cuda):
            return ()
        probes = [("CUDA", f"{bash_word(tc.cuda_home + '/bin/nvcc')} --version")]
        if tc.nccl_home:
            probes.append(("NCCL", 'grep -E "^#define NCCL_(MAJOR|MINOR|PATCH|SUFFIX)" '
                                   f"{bash_word(tc.nccl_home + '/include/nccl.h')}"))
        return tuple(probes)

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
            FETCH: [sdist_fetch(ctx.site, self.package, self.url, self.sha256, self.sdist(ctx))],
            PATCH: patch_step,
            BUILD: build_step,
            INSTALL: [install_run(ctx, "--no-deps", "--no-index", "--find-links", dist,
                                  f"{self.package}=={self.version}", reinstall=(self.package,))],
            SANITYCHECK: self.sanity_actions(ctx),
        }
