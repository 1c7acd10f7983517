"""The resolved plan: named steps made of actions, with two renderings that cannot disagree.

A recipe and a site resolve into one :class:`Plan`. ``hpcstack install`` executes it and
``hpcstack install --dry-run`` prints it with :meth:`Plan.to_bash`; both walk the same objects,
so the printed script is exactly what the real run does (one plan, two renderings).

Every action has two methods: ``to_bash()`` (its line(s) in the dry-run script) and
``execute(ctx)`` (doing it). Environment values may refer to variables of the build environment
as ``${NAME}`` (e.g. ``${NVHPC_ROOT}/cuda/12.4``, as in the Cirrus instructions); they are expanded
at run time against the environment in which the site's modules were loaded, and printed
unexpanded in the script.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import re
import shlex
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from hpcstack.errors import HpcstackError
from hpcstack.fsutil import fsync_dir, write_atomic  # builds and provenance import them from here too

#: Standard step names, in the order they run (EasyBuild-style ``<verb>_step`` names).
FETCH, VENV, WHEELS, PATCH, BUILD, INSTALL, SANITYCHECK, PERMISSIONS, MODULE = (
    "fetch", "venv", "wheels", "patch", "build", "install", "sanitycheck", "permissions", "module")
STEP_ORDER = (FETCH, VENV, WHEELS, PATCH, BUILD, INSTALL, SANITYCHECK, PERMISSIONS, MODULE)
STEP_DESCRIPTIONS = {
    FETCH: "download sources and check their sha256",
    VENV: "create the venv on top of the site's Python module",
    WHEELS: "install the pinned wheels from the lock file in one resolution",
    PATCH: "unpack sources into the stage dir and apply patches",
    BUILD: "build from source with the site's compilers and libraries",
    INSTALL: "install built packages and the stack's tools",
    SANITYCHECK: "check imports, build flags and dependencies",
    PERMISSIONS: "make the stack world-readable and not world-writable",
    MODULE: "publish the stack (switch its prefix link atomically) and write the modulefile",
}
#: Steps that may run again on a published build without a new stage prefix: they read the
#: stack, change its permission bits or publish it, but never change what it runs. A change in
#: any other step builds a new stage prefix, and the published stack stays untouched meanwhile.
IN_PLACE_STEPS = (SANITYCHECK, PERMISSIONS, MODULE)
#: Where a prefix that is a real directory (the layout before stage prefixes) goes when a staged
#: build replaces it: ``<install_root>/<name>/.builds/<version>/pre-staging``.
PRE_STAGING = "pre-staging"

_VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand(value: str, env: dict[str, str]) -> str:
    """Expand ``${NAME}`` references in ``value`` from ``env`` (unset names expand to ``""``).

    Args:
        value (str): text possibly holding ``${NAME}`` references; a bare ``$NAME`` is left alone.
        env (dict[str, str]): the environment to read.

    Returns:
        str: the expanded text.
    """
    return _VAR_REF.sub(lambda m: env.get(m.group(1), ""), value)


def bash_word(value: str) -> str:
    """Quote ``value`` as one bash word, keeping ``${NAME}`` references live.

    Args:
        value (str): text; ``${NAME}`` references are left for bash to expand.

    Returns:
        str: ``shlex.quote(value)`` when there is no reference, else a double-quoted word.
    """
    if not _VAR_REF.search(value):
        return shlex.quote(value)
    return '"' + _dq_live(value) + '"'


def _dq_live(value: str) -> str:
    """Escape ``value`` for use inside bash double quotes, keeping ``${NAME}`` references live."""
    out, last = [], 0
    for m in _VAR_REF.finditer(value):
        out.append(re.sub(r'([\\"`$])', r"\\\1", value[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(re.sub(r'([\\"`$])', r"\\\1", value[last:]))
    return "".join(out)


class ExecContext(Protocol):
    """What an action needs while it executes (implemented by :class:`hpcstack.runner.Runner`)."""

    env: dict[str, str]
    log: IO[str]
    dry_run: bool
    #: ``<stage prefix>/.hpcstack``: where actions leave provenance (e.g. the check-build output).
    state_dir: Path


# --------------------------------------------------------------------------------------- actions

@dataclass(frozen=True)
class Run:
    """Run one command.

    Args:
        argv (tuple[str, ...]): the command and its arguments; may hold ``${NAME}`` references.
        env (dict[str, str]): variables set for this command only (``NAME=value cmd`` in bash).
        prepend (dict[str, str]): path-like variables to prepend to, with ``:`` only when the
            variable is already non-empty (never an empty element, which means "current dir").
        cwd (str | None): working directory.
        unset (tuple[str, ...]): variables removed from this command's environment.
        inputs (tuple[str, ...]): files the command reads whose content, not only their path,
            decides whether its step is up to date (e.g. a lock file).

    Raises:
        HpcstackError: from :meth:`execute` when the command is missing or exits non-zero; the
            message gives the exit status and the tail of the output.
    """

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    prepend: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    unset: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()

    def to_bash(self) -> str:
        words = []
        if self.cwd:
            words.append(f"cd {bash_word(self.cwd)} &&")
        if self.unset:
            words.append("env " + " ".join(f"-u {n}" for n in self.unset))
        for name, value in self.env.items():
            words.append(f"{name}={bash_word(value)}")
        for name, value in self.prepend.items():
            words.append(f'{name}="{_dq_live(value)}${{{name}:+:${{{name}}}}}"')
        words.extend(bash_word(a) for a in self.argv)
        return " ".join(words)

    def command_env(self, base: dict[str, str]) -> dict[str, str]:
        """Return the environment this command runs with, built from ``base`` (not modified)."""
        env = dict(base)
        for name in self.unset:
            env.pop(name, None)
        for name, value in self.env.items():
            env[name] = expand(value, base)
        for name, value in self.prepend.items():
            old = env.get(name, "")
            env[name] = expand(value, base) + (":" + old if old else "")
        return env

    def execute(self, ctx: ExecContext) -> None:
        env = self.command_env(ctx.env)
        argv = [expand(a, env) for a in self.argv]
        ctx.log.write(f"$ {self.to_bash()}\n")
        ctx.log.flush()
        if self.cwd and not os.path.isdir(self.cwd):
            raise HpcstackError(f"working directory {self.cwd} of `{argv[0]}` does not exist")
        try:
            proc = subprocess.run(argv, env=env, cwd=self.cwd, stdout=ctx.log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcstackError(f"command not found: {argv[0]} (is the site's module loaded? "
                                "modules.build in the site config loads build tools)")
        except (OSError, ValueError) as exc:
            raise HpcstackError(f"cannot run {argv[0]}: {describe_os_error(exc)}")
        if proc.returncode != 0:
            raise HpcstackError(f"`{shlex.join(argv)[:200]}` exited with status {proc.returncode}")


@dataclass(frozen=True)
class Fetch:
    """Download ``url`` to ``dest`` and check its sha256; a file already there with the right hash is kept.

    Args:
        url (str): https URL.
        sha256 (str): the expected sha256, 64 hex digits (from the recipe).
        dest (str): absolute destination path.

    Raises:
        HpcstackError: no network, an HTTP error, or a hash mismatch (both hashes and the file
            are named; the bad download is removed).
    """

    url: str
    sha256: str
    dest: str

    def to_bash(self) -> str:
        dest = shlex.quote(self.dest)
        return (f"mkdir -p {shlex.quote(os.path.dirname(self.dest))} && "
                f"curl -fsSL -o {dest} {shlex.quote(self.url)} && "
                f"echo {shlex.quote(self.sha256 + '  ' + self.dest)} | sha256sum -c -")

    def execute(self, ctx: ExecContext) -> None:
        dest = Path(self.dest)
        if dest.is_file() and sha256_file(dest) == self.sha256:
            ctx.log.write(f"cached: {dest}\n")
            return
        ctx.log.write(f"$ {self.to_bash()}\n")
        tmp = None
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
            with os.fdopen(fd, "wb") as out:
                try:
                    resp = urllib.request.urlopen(self.url, timeout=60)
                except (urllib.error.URLError, http.client.HTTPException, ValueError, OSError) as exc:
                    reason = getattr(exc, "reason", None) or exc
                    raise HpcstackError(
                        f"cannot download {self.url}: {reason} (no network? check the URL, the "
                        f"proxy variables, or put the file in the download cache as {dest})") from None
                with resp:
                    while chunk := resp.read(1 << 20):
                        out.write(chunk)
            check_sha256(Path(tmp), self.sha256, shown_as=self.url)
            os.replace(tmp, dest)
        except (OSError, http.client.HTTPException) as exc:
            raise HpcstackError(f"cannot download {self.url} to {dest}: {describe_os_error(exc)}") from None
        finally:
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)


@dataclass(frozen=True)
class VerifySha256:
    """Check that a file of the project (a patch, a lock) has its recorded sha256.

    Args:
        path (str): absolute path.
        sha256 (str): expected sha256 (64 hex digits).

    Raises:
        HpcstackError: the file is missing or its hash differs (both hashes shown).
    """

    path: str
    sha256: str

    def to_bash(self) -> str:
        return f"echo {shlex.quote(self.sha256 + '  ' + self.path)} | sha256sum -c -"

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        check_sha256(Path(self.path), self.sha256)


@dataclass(frozen=True)
class Unpack:
    """Unpack a ``.tar.gz`` into a fresh directory (removed first), refusing unsafe member paths.

    Args:
        archive (str): path of the archive.
        dest (str): directory to unpack into; the archive's top directory lands inside it.
    """

    archive: str
    dest: str

    def to_bash(self) -> str:
        dest = shlex.quote(self.dest)
        return f"rm -rf {dest} && mkdir -p {dest} && tar -xzf {shlex.quote(self.archive)} -C {dest}"

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        subprocess.run(["rm", "-rf", self.dest], check=True)
        os.makedirs(self.dest)
        with tarfile.open(self.archive) as tar:
            members = tar.getmembers()
            for m in members:  # the checks of tarfile's "data" filter (absent before Python 3.11.4)
                target = os.path.realpath(os.path.join(self.dest, m.name))
                link = os.path.realpath(os.path.join(self.dest, os.path.dirname(m.name), m.linkname))
                if (not target.startswith(os.path.realpath(self.dest) + os.sep)
                        or (m.issym() or m.islnk()) and not link.startswith(os.path.realpath(self.dest))
                        or m.isdev()):
                    raise HpcstackError(f"{self.archive}: unsafe member {m.name!r}; refusing to unpack")
            tar.extractall(self.dest, members=members)


@dataclass(frozen=True)
class WriteFile:
    """Write a text file atomically (temporary file in the same directory, then rename).

    Args:
        path (str): absolute path.
        content (str): the text.
        mode (int): permission bits, e.g. ``0o755`` for a script.
    """

    path: str
    content: str
    mode: int = 0o644

    def to_bash(self) -> str:
        marker = "HPCSTACK_EOF"
        while marker in self.content:
            marker += "_"
        path = shlex.quote(self.path)
        body = self.content if self.content.endswith("\n") else self.content + "\n"
        return (f"mkdir -p {shlex.quote(os.path.dirname(self.path))} && cat > {path} <<'{marker}'\n"
                f"{body}{marker}\nchmod {self.mode:o} {path}")

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"write {self.path}\n")
        write_atomic(Path(self.path), self.content, self.mode)


@dataclass(frozen=True)
class CheckBuild:
    """Run ``horovodrun --check-build`` and require flags (sanity check, issue 2).

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

    def to_bash(self) -> str:
        return self._run().to_bash()

    def execute(self, ctx: ExecContext) -> None:
        from hpcstack.validate.checkbuild import check_build

        env = self._run().command_env(ctx.env)
        ctx.log.write(f"$ {self.to_bash()}\n")
        output = check_build(self.horovodrun, self.required, env)
        ctx.log.write(output)
        state_dir = getattr(ctx, "state_dir", None)
        if state_dir is not None:  # provenance: the stack records what its Horovod was built with
            write_atomic(Path(state_dir) / "check-build.txt", output)


@dataclass(frozen=True)
class Capture:
    """Run a command and keep its standard output in a file (written atomically).

    Used for provenance, e.g. ``pip freeze`` into ``<stage prefix>/.hpcstack/pip-freeze.txt``.

    Args:
        argv (tuple[str, ...]): the command; may hold ``${NAME}`` references.
        dest (str): absolute path of the file that receives the output.

    Raises:
        HpcstackError: the command is missing or exits non-zero (its error output is in the log).
    """

    argv: tuple[str, ...]
    dest: str

    def to_bash(self) -> str:
        return f"{Run(self.argv).to_bash()} > {shlex.quote(self.dest)}"

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        ctx.log.flush()
        argv = [expand(a, ctx.env) for a in self.argv]
        try:
            proc = subprocess.run(argv, env=ctx.env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL)
        except (OSError, ValueError) as exc:
            raise HpcstackError(f"cannot run {argv[0]}: {describe_os_error(exc)}")
        ctx.log.write(proc.stderr)
        if proc.returncode != 0:
            raise HpcstackError(f"`{shlex.join(argv)[:200]}` exited with status {proc.returncode}")
        write_atomic(Path(self.dest), proc.stdout)


@dataclass(frozen=True)
class Publish:
    """Publish a complete build: point the stack's prefix (a symlink) at it, atomically.

    A venv cannot be moved after it is made (absolute paths in its scripts), so each build has
    its own stage prefix and the stable prefix ``<install_root>/<name>/<version>`` is a
    symbolic link to it, relative (``.builds/<version>/<id>``). Publishing makes a new link
    beside the old one and renames it over the old one (``rename(2)`` is atomic): a reader sees
    the old build or the new one, never neither and never a half one.

    A prefix that is a real directory (the layout before stage prefixes) is moved to
    ``.builds/<version>/pre-staging`` first; that move and the link that follows it are two
    renames, not one (the only non-atomic moment, once per stack). When ``target`` is the
    prefix itself (such a directory being updated in place) there is nothing to do.

    Args:
        link (str): the stable prefix.
        target (str): the stage prefix of the complete build.

    Raises:
        HpcstackError: the link cannot be made (e.g. a full disk or no permission).
    """

    link: str
    target: str

    def _tmp(self) -> str:
        return os.path.join(os.path.dirname(self.link), f".{os.path.basename(self.link)}.publish-tmp")

    def relative_target(self) -> str:
        """The link's target, relative to the link's directory."""
        return os.path.relpath(self.target, os.path.dirname(self.link))

    def _aside(self) -> str:
        return os.path.join(os.path.dirname(self.target), PRE_STAGING)

    def to_bash(self) -> str:
        if os.path.normpath(self.link) == os.path.normpath(self.target):
            return f"true  # {self.link} is a build directory itself (layout before staging): nothing to switch"
        tmp, link = shlex.quote(self._tmp()), shlex.quote(self.link)
        return (f"{{ [ -L {link} ] || [ ! -d {link} ] || mv -T {link} {shlex.quote(self._aside())}; }} && "
                f"ln -sfn {shlex.quote(self.relative_target())} {tmp} && mv -T {tmp} {link}")

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        if os.path.normpath(self.link) == os.path.normpath(self.target):
            return
        try:
            if os.path.isdir(self.link) and not os.path.islink(self.link):
                aside = self._aside()
                ctx.log.write(f"move the build directory {self.link} (layout before staging) to {aside}\n")
                os.rename(self.link, aside)
            tmp = self._tmp()
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(self.relative_target(), tmp)
            os.replace(tmp, self.link)
            fsync_dir(os.path.dirname(self.link))
        except OSError as exc:
            raise HpcstackError(f"cannot publish {self.target} as {self.link}: {describe_os_error(exc)}")


Action = Run | Fetch | VerifySha256 | Unpack | WriteFile | CheckBuild | Capture | Publish


# ----------------------------------------------------------------------------------------- plan

@dataclass
class Step:
    """One named step of a plan.

    Args:
        name (str): one of :data:`STEP_ORDER`.
        description (str): one line, shown when the step starts.
        actions (list[Action]): what the step does, in order.
        outputs (list[str]): files the step leaves; if one is missing the step is redone even
            when its inputs did not change.
    """

    name: str
    description: str
    actions: list = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)

    def fingerprint(self) -> str:
        """Return the text that decides whether the step is up to date: its script, and the
        sha256 of every input file its actions declare (so an edited lock file redoes it)."""
        digests = [f"{p}={sha256_file(Path(p)) if os.path.isfile(p) else 'missing'}"
                   for a in self.actions for p in getattr(a, "inputs", ())]
        return self.to_bash() + "\n" + "\n".join(digests)

    def to_bash(self) -> str:
        """Return the step as a commented block of bash."""
        lines = [f"# --- step {self.name}: {self.description}"]
        lines += [a.to_bash() for a in self.actions]
        return "\n".join(lines)


@dataclass
class Plan:
    """A resolved install: everything a run needs, all paths absolute.

    Args:
        title (str): e.g. ``"pytorch/2.3.1-gpu for site localhost"``.
        prefix (str): the stack's prefix (install root + projection ``{name}/{version}``): the
            stable path users and the modulefile see, a symbolic link to the published build.
        modules (list[str]): modules loaded into the build environment, in order (base first).
        module_use (list[str]): directories added to MODULEPATH before loading them.
        steps (list[Step]): in :data:`STEP_ORDER`.
        env (dict[str, str]): variables set for every command (``export`` in the script).
        modulefile (str): the path of the modulefile the plan publishes.
        stage_prefix (str): the real directory this build is made in,
            ``<install_root>/<name>/.builds/<version>/<id>``; ``""`` means ``prefix`` itself.
        build_id (str): the ``<id>`` of ``stage_prefix``.
    """

    title: str
    prefix: str
    modules: list[str]
    module_use: list[str]
    steps: list[Step]
    env: dict[str, str]
    modulefile: str
    stage_prefix: str = ""
    build_id: str = ""

    @property
    def build_prefix(self) -> str:
        """The directory the steps build in: ``stage_prefix``, else ``prefix``."""
        return self.stage_prefix or self.prefix

    @property
    def state_dir(self) -> str:
        """``<build prefix>/.hpcstack``: step records, logs and provenance of this build."""
        return os.path.join(self.build_prefix, ".hpcstack")

    def step_hashes(self) -> dict[str, str]:
        """Return ``{step name: hash}``; a step's hash covers its own text and every step before it.

        So a changed input redoes that step and the ones after it, and nothing else (issue 5).
        """
        hashes, running = {}, hashlib.sha256(self.preamble().encode())
        for step in self.steps:
            running.update(step.fingerprint().encode())
            hashes[step.name] = running.hexdigest()
        return hashes

    def preamble(self) -> str:
        """Return the script lines that set up the build environment."""
        lines = [f"module use {shlex.quote(d)}" for d in self.module_use]
        lines += [f"module load {shlex.quote(m)}" for m in self.modules]
        lines += [f"export {k}={bash_word(v)}" for k, v in self.env.items()]
        return "\n".join(lines)

    def to_bash(self, version: str) -> str:
        """Render the whole plan as a bash script.

        Args:
            version (str): hpcstack's version, recorded in the header.

        Returns:
            str: a script that ``bash -n`` accepts and that performs the install.
        """
        parts = [
            "#!/bin/bash",
            f"# hpcstack {version}: install {self.title}",
            f"# prefix: {self.prefix} (published by the module step)",
            f"# stage prefix: {self.build_prefix} (build {self.build_id or 'in place'})",
            f"# modulefile: {self.modulefile}",
            "set -euo pipefail",
            self.preamble(),
        ]
        parts += ["\n" + s.to_bash() for s in self.steps]
        parts.append("\n# afterwards hpcstack removes earlier builds of the stack but the one this replaced")
        return "\n".join(p for p in parts if p) + "\n"

    def to_json(self, version: str) -> str:
        """Render the plan as JSON: the same objects as :meth:`to_bash`, for provenance and tools.

        Args:
            version (str): hpcstack's version, recorded in the document.

        Returns:
            str: a JSON object with ``title``, ``prefix``, ``stage_prefix``, ``build_id``,
            ``modulefile``, ``modules``, ``module_use``, ``env``, ``hpcstack`` and ``steps``
            (each ``name``, ``description``, ``hash``, ``outputs``, ``script`` and ``actions``,
            each action its ``type`` and fields).
        """
        hashes = self.step_hashes()
        steps = [{"name": s.name, "description": s.description, "hash": hashes[s.name],
                  "outputs": list(s.outputs), "script": s.to_bash(),
                  "actions": [{"type": type(a).__name__, **_fields(a)} for a in s.actions]}
                 for s in self.steps]
        doc = {"hpcstack": version, "title": self.title, "prefix": self.prefix,
               "stage_prefix": self.build_prefix, "build_id": self.build_id,
               "modulefile": self.modulefile, "modules": list(self.modules),
               "module_use": list(self.module_use), "env": dict(self.env), "steps": steps}
        return json.dumps(doc, indent=1) + "\n"


def _fields(action) -> dict:
    """An action's fields as JSON values (tuples become lists, nested actions objects)."""
    import dataclasses

    def plain(value):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {"type": type(value).__name__, **_fields(value)}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if value is None or isinstance(value, (str, int, float, bool)):
            return value
        return str(value)

    return {f.name: plain(getattr(action, f.name)) for f in dataclasses.fields(action)}


# --------------------------------------------------------------------------------------- helpers

def sha256_file(path: Path) -> str:
    """Return the sha256 of a file as 64 hex digits (read in 1 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def check_sha256(path: Path, expected: str, shown_as: str | None = None) -> None:
    """Refuse a file whose sha256 is not ``expected``.

    Args:
        path (Path): the file.
        expected (str): 64 hex digits.
        shown_as (str | None): name to show instead of the path (e.g. the URL of a download).

    Raises:
        HpcstackError: missing file, or mismatch (message shows both hashes and the file).
    """
    if not path.is_file():
        raise HpcstackError(f"missing file {path}")
    actual = sha256_file(path)
    if actual != expected:
        raise HpcstackError(f"sha256 mismatch for {shown_as or path}: expected {expected}, got {actual}; "
                            "refusing it (a tampered or corrupt file, or a recipe that needs updating)")


def describe_os_error(exc: BaseException) -> str:
    """Return one line for an operating-system error: what failed, on which file, what to do.

    A full disk, a read-only filesystem and a permission problem each get their own advice.
    """
    err = getattr(exc, "errno", None)
    where = getattr(exc, "filename", None)
    what = getattr(exc, "strerror", None) or str(exc)
    text = f"{what}: {where}" if where else what
    if err == errno.ENOSPC or err == errno.EDQUOT:
        return (f"{text} (the filesystem is full: free space there, or install elsewhere with "
                "--prefix; re-running resumes from the step that failed)")
    if err == errno.EROFS:
        return f"{text} (a read-only filesystem: install elsewhere with --prefix)"
    if err in (errno.EACCES, errno.EPERM):
        return f"{text} (no permission: run as the owner of the install root, or use --prefix)"
    return text
