"""The resolved plan: named steps made of actions, with two renderings that cannot disagree.

A recipe and a site resolve into one :class:`Plan`. ``hpcstack install`` executes it and
``hpcstack install --dry-run`` prints it with :meth:`Plan.to_bash`; both walk the same objects,
so the printed script is exactly what the real run does (design.md, "Data should flow one way").

Every action has two methods: ``to_bash()`` (its line(s) in the dry-run script) and
``execute(ctx)`` (doing it). Environment values may refer to variables of the build environment
as ``${NAME}`` (e.g. ``${NVHPC_ROOT}/cuda/12.4``, as in the Cirrus instructions); they are expanded
at run time against the environment in which the site's modules were loaded, and printed
unexpanded in the script.
"""

from __future__ import annotations

import hashlib
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

from .errors import HpcstackError

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
    MODULE: "write the modulefile (publishes the stack)",
}

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
        try:
            proc = subprocess.run(argv, env=env, cwd=self.cwd, stdout=ctx.log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcstackError(f"command not found: {argv[0]} (is the site's module loaded?)")
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
        dest.parent.mkdir(parents=True, exist_ok=True)
        ctx.log.write(f"$ {self.to_bash()}\n")
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(self.url, timeout=60) as resp:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
            check_sha256(Path(tmp), self.sha256, shown_as=self.url)
            os.replace(tmp, dest)
        except (urllib.error.URLError, OSError) as exc:
            raise HpcstackError(f"cannot download {self.url}: {getattr(exc, 'reason', exc)} "
                                "(check the network or put the file in the download cache)")
        finally:
            if os.path.exists(tmp):
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
        from .checkbuild import check_build

        env = self._run().command_env(ctx.env)
        ctx.log.write(f"$ {self.to_bash()}\n")
        output = check_build(self.horovodrun, self.required, env)
        ctx.log.write(output)


Action = Run | Fetch | VerifySha256 | Unpack | WriteFile | CheckBuild


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
        prefix (str): the stack's prefix (install root + projection ``{name}/{version}``).
        modules (list[str]): modules loaded into the build environment, in order (base first).
        module_use (list[str]): directories added to MODULEPATH before loading them.
        steps (list[Step]): in :data:`STEP_ORDER`.
        env (dict[str, str]): variables set for every command (``export`` in the script).
        modulefile (str): the path of the modulefile the plan publishes.
    """

    title: str
    prefix: str
    modules: list[str]
    module_use: list[str]
    steps: list[Step]
    env: dict[str, str]
    modulefile: str

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
            f"# prefix: {self.prefix}",
            f"# modulefile: {self.modulefile}",
            "set -euo pipefail",
            self.preamble(),
        ]
        parts += ["\n" + s.to_bash() for s in self.steps]
        return "\n".join(p for p in parts if p) + "\n"


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


def write_atomic(path: Path, content: str, mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` so that readers see the old file or the new one, never half.

    Args:
        path (Path): destination; its parent directories are created.
        content (str): text, written as UTF-8.
        mode (int): permission bits.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
