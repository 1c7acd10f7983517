"""Actions: what the steps of a plan do, each with one definition for its two renderings.

An action is anything with the five methods of :class:`Action` (a protocol, not a closed
list): ``to_bash()`` gives its line(s) in the ``--dry-run`` script and ``execute(ctx)`` does
it; ``commands()``, ``inputs()`` and ``outputs()`` say what it runs, reads and writes, so that the
runner and the preflight never need to know its class. Components may define their own
(:class:`hpcstack.install.components.source.CachedWheelBuild`, ``CheckBuild``).

The two renderings cannot drift apart, because each action takes one of three ways:

- **one description, two faithful renderings** of the same fields, where bash and Python are
  equally simple and do the same thing: :class:`Run`, :class:`Capture`, :class:`VerifySha256`;
- **execution runs the printed bash** (``bash -euo pipefail -c``), for actions that are plain
  shell (``mkdir``, ``mktemp``, ``cat``, ``chmod``, ``mv``, ``ln``): :class:`WriteFile` (and the
  modulefile component's ``WriteDefault`` built on it) and :class:`Publish`. Python adds only an ``fsync`` of
  what the bash renamed, which changes nothing a reader can see;
- **the printed bash calls the Python code** (``hpcstack action VERB …``,
  :mod:`hpcstack.install.verbs`), for actions whose checks bash cannot make as well:
  :class:`Fetch` (a cached download is kept, a download is checked before it is renamed into
  place, no ``curl`` needed) and :class:`Unpack` (:mod:`hpcstack.install.archive`: unsafe tar
  members are refused, as Python's ``tarfile`` ``data`` filter does; GNU ``tar`` run as root
  would create device files and keep the archive's owners).

Environment values may refer to variables of the build environment as ``${NAME}`` (e.g.
``${NVHPC_ROOT}/cuda/12.4``, as in the Cirrus instructions); they are expanded at run time against
the environment in which the site's modules were loaded, and printed unexpanded in the script.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, runtime_checkable

from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD, fsync_dir, fsync_file, sha256_file
from hpcstack.install.archive import safe_unpack
from hpcstack.templates import _dq_live, bash_word  # noqa: F401 (bash_word: also imported from here)

#: Where a prefix that is a real directory (the layout before stage prefixes) goes when a staged
#: build replaces it: ``<install_root>/<name>/.<version>-pre-staging``.
PRE_STAGING = "pre-staging"

#: The command that runs one action of the dry-run script with hpcstack's own code
#: (:func:`hpcstack.install.verbs.cli`).
ACTION_COMMAND = ("hpcstack", "action")

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


class ExecContext(Protocol):
    """What an action needs while it executes (implemented by :class:`hpcstack.install.runner.Runner`).

    Attributes:
        env (dict[str, str]): the build environment (the site's modules loaded).
        log (IO[str]): the step's log; actions write what they do and their commands' output.
        state_dir (Path | None): ``<stage prefix>/.hpcstack``, where actions leave provenance
            (e.g. the check-build output); None outside an install (``hpcstack action``).
    """

    env: dict[str, str]
    log: IO[str]
    state_dir: Path | None


@runtime_checkable
class Action(Protocol):
    """What every action of a step has; the runner, the preflight and the plan use nothing else.

    - ``commands() -> tuple[Run, ...]``: the programs :meth:`execute` may run, nested ones
      included (a cached build's unpack, patch and compile), as :class:`Run` objects: the
      preflight looks for ``argv[0]`` and for the compilers of ``env`` (``CC``, ``CXX``, …) on the
      build environment's PATH before anything is written.
    - ``inputs() -> tuple[str, ...]``: files of the project (lock files, patches, scripts) whose
      content, not only their path, decides whether the step is up to date; they exist before
      the install starts (a file made by an earlier step must not be one: its hash would change
      between the check and the run). Provenance copies them into the build.
    - ``outputs() -> tuple[str, ...]``: files or directories it writes (named when a write
      fails, e.g. on a full filesystem).
    - ``to_bash() -> str``: its line(s) in the dry-run script.
    - ``execute(ctx: ExecContext) -> None``: do it; raises :class:`HpcstackError` on failure.

    Components define their own actions freely; :class:`ActionBase` gives the three queries an
    empty default.
    """

    def commands(self) -> tuple["Run", ...]: ...

    def inputs(self) -> tuple[str, ...]: ...

    def outputs(self) -> tuple[str, ...]: ...

    def to_bash(self) -> str: ...

    def execute(self, ctx: ExecContext) -> None: ...


class ActionBase:
    """Defaults for :class:`Action`'s queries: runs no program, reads and writes nothing declared."""

    def commands(self) -> tuple["Run", ...]:
        """The programs :meth:`execute` runs (none by default)."""
        return ()

    def inputs(self) -> tuple[str, ...]:
        """Project files whose content decides whether the step is up to date (none by default)."""
        return ()

    def outputs(self) -> tuple[str, ...]:
        """Files or directories written (none declared by default)."""
        return ()


def run_bash(script: str, ctx: ExecContext, what: str) -> None:
    """Run ``script`` with ``bash -euo pipefail -c`` in the build environment; used by actions
    whose execution is exactly the bash they print.

    ``BASH_ENV`` and ``ENV`` are left out, as in the dry-run script, which reads them once when it
    starts and not again for each line.

    Args:
        script (str): the action's :meth:`to_bash`.
        ctx (ExecContext): its log receives the script's output; its ``env`` is the environment
            (``os.environ`` when the context has none).
        what (str): what the script does, for the error (``"write /p/f"``).

    Raises:
        HpcstackError: bash is missing or the script fails; the message ends with the script's
            last line of error output.
    """
    env = {k: v for k, v in (getattr(ctx, "env", None) or os.environ).items() if k not in ("BASH_ENV", "ENV")}
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, cwd=CHILD_CWD,
                              text=True, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise HpcstackError(f"cannot {what}: cannot run bash: {describe_os_error(exc)}") from None
    ctx.log.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise HpcstackError(f"cannot {what}: " + (lines[-1] if lines else f"bash exited with status {proc.returncode}"))


#: The programs the bash of :class:`WriteFile` and :class:`Publish` runs (for the preflight).
_WRITE_TOOLS = ("bash", "mkdir", "mktemp", "cat", "head", "chmod", "mv")
_PUBLISH_TOOLS = ("bash", "mv", "ln")


# --------------------------------------------------------------------------------------- actions

@dataclass(frozen=True)
class Run(ActionBase):
    """Run one command. Bash and Python render the same fields: ``to_bash`` prints
    ``env -u … NAME=value … argv`` (in a subshell ``(cd CWD && …)`` when ``cwd`` is given, so
    that the script's own directory stays :data:`~hpcstack.fsutil.CHILD_CWD`) and ``execute``
    builds that environment and argv itself (:meth:`command_env`); tests run both and compare.

    Without ``cwd`` the command runs in :data:`~hpcstack.fsutil.CHILD_CWD` (``/``), where the
    dry-run script ``cd``'s first, never in the caller's working directory: a ``python -m``/``-c``
    would import a user's files from there (docs/admin/security.md).

    Args:
        argv (tuple[str, ...]): the command and its arguments; may hold ``${NAME}`` references.
        env (dict[str, str]): variables set for this command only (``NAME=value cmd`` in bash).
        prepend (dict[str, str]): path-like variables to prepend to, with ``:`` only when the
            variable is already non-empty (never an empty element, which means "current dir").
        cwd (str | None): working directory (a directory of hpcstack's own, e.g. in the stage
            dir); None: :data:`~hpcstack.fsutil.CHILD_CWD`.
        unset (tuple[str, ...]): variables removed from this command's environment.
        input_files (tuple[str, ...]): files the command reads whose content, not only their
            path, decides whether its step is up to date (e.g. a lock file): :meth:`inputs`.

    Raises:
        HpcstackError: from :meth:`execute` when the command is missing or exits non-zero; the
            message gives the exit status and the tail of the output.
    """

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    prepend: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    unset: tuple[str, ...] = ()
    input_files: tuple[str, ...] = ()

    def commands(self) -> tuple["Run", ...]:
        return (self,)

    def inputs(self) -> tuple[str, ...]:
        return tuple(self.input_files)

    def to_bash(self) -> str:
        words = []
        if self.unset:
            words.append("env " + " ".join(f"-u {n}" for n in self.unset))
        for name, value in self.env.items():
            words.append(f"{name}={bash_word(value)}")
        for name, value in self.prepend.items():
            words.append(f'{name}="{_dq_live(value)}${{{name}:+:${{{name}}}}}"')
        words.extend(bash_word(a) for a in self.argv)
        if self.cwd:
            return f"(cd {bash_word(self.cwd)} && {' '.join(words)})"
        return " ".join(words)

    def command_env(self, base: dict[str, str]) -> dict[str, str]:
        """Return the environment this command runs with, built from ``base`` (not modified).

        Args:
            base (dict[str, str]): the build environment.
        """
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
            proc = subprocess.run(argv, env=env, cwd=self.cwd or CHILD_CWD, stdout=ctx.log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcstackError(f"command not found: {argv[0]} (is the site's module loaded? "
                                "modules.build in the site config loads build tools)")
        except (OSError, ValueError) as exc:
            raise HpcstackError(f"cannot run {argv[0]}: {describe_os_error(exc)}")
        if proc.returncode != 0:
            raise HpcstackError(f"`{shlex.join(argv)[:200]}` exited with status {proc.returncode}")


@dataclass(frozen=True)
class Fetch(ActionBase):
    """Download ``url`` to ``dest`` and check its sha256; a file already there with the right hash is kept.

    One implementation: :meth:`execute` (Python's ``urllib``: no ``curl`` needed; the download
    goes to a temporary file beside ``dest``, is checked, then renamed into place, so a bad or
    cut download never sits at ``dest``), and the dry-run line calls it,
    ``hpcstack action fetch --sha256 SHA URL DEST`` (:func:`hpcstack.install.verbs.cli`).

    Args:
        url (str): https (or file) URL.
        sha256 (str): the expected sha256, 64 hex digits (from the recipe).
        dest (str): absolute destination path.

    Raises:
        HpcstackError: no network, an HTTP error, or a hash mismatch (both hashes and the file
            are named; the bad download is removed).
    """

    url: str
    sha256: str
    dest: str
    #: A PEP 503 project page of the site's package index (``installer.index_url``): the file
    #: named like ``url``'s last part is downloaded from where that page links it.
    page: str = ""

    def outputs(self) -> tuple[str, ...]:
        return (self.dest,)

    def to_bash(self) -> str:
        page = ["--page", self.page] if self.page else []
        return shlex.join([*ACTION_COMMAND, "fetch", *page, "--sha256", self.sha256, self.url, self.dest])

    def execute(self, ctx: ExecContext) -> None:
        dest = Path(self.dest)
        if dest.is_file() and sha256_file(dest) == self.sha256:
            ctx.log.write(f"cached: {dest}\n")
            return
        ctx.log.write(f"$ {self.to_bash()}\n")
        import http.client  # here, not at the top: a no-op install downloads nothing (~25 ms of imports)
        import urllib.error
        import urllib.request

        url = self.url
        if self.page:
            url = find_on_page(self.page, os.path.basename(self.url))
        tmp = None
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".part-")
            with os.fdopen(fd, "wb") as out:
                try:
                    resp = urllib.request.urlopen(url, timeout=60)
                except (urllib.error.URLError, http.client.HTTPException, ValueError, OSError) as exc:
                    reason = getattr(exc, "reason", None) or exc
                    raise HpcstackError(
                        f"cannot download {url}: {reason} (no network? check the URL, the "
                        f"proxy variables, or put the file in the download cache as {dest})") from None
                with resp:
                    while chunk := resp.read(1 << 20):
                        out.write(chunk)
            check_sha256(Path(tmp), self.sha256, shown_as=url)
            os.replace(tmp, dest)
        except (OSError, http.client.HTTPException) as exc:
            raise HpcstackError(f"cannot download {url} to {dest}: {describe_os_error(exc)}") from None
        finally:
            if tmp and os.path.exists(tmp):
                os.unlink(tmp)


@dataclass(frozen=True)
class VerifySha256(ActionBase):
    """Check that a file of the project (a patch, a lock) has its recorded sha256.

    Bash and Python render the same two fields and make the same check: ``sha256sum -c`` and
    :func:`check_sha256` both refuse a missing file and a different hash.

    Args:
        path (str): absolute path.
        sha256 (str): expected sha256 (64 hex digits).

    Raises:
        HpcstackError: the file is missing or its hash differs (both hashes shown).
    """

    path: str
    sha256: str

    def inputs(self) -> tuple[str, ...]:
        return (self.path,)

    def to_bash(self) -> str:
        return f"echo {shlex.quote(self.sha256 + '  ' + self.path)} | sha256sum -c -"

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        check_sha256(Path(self.path), self.sha256)


@dataclass(frozen=True)
class Unpack(ActionBase):
    """Unpack a tar archive into a fresh directory (removed first), refusing unsafe members.

    One implementation: :func:`hpcstack.install.archive.safe_unpack`, which :meth:`execute` calls
    and the dry-run line calls too (``hpcstack action unpack ARCHIVE DEST``,
    :func:`hpcstack.install.verbs.cli`). Every member is checked before anything is unpacked,
    with the rules of Python's ``tarfile`` ``data`` filter
    (https://docs.python.org/3/library/tarfile.html#tarfile.data_filter; Python 3.11.2, Debian
    12's, predates it): no absolute names, nothing outside ``dest`` (``..`` or through a link),
    no link pointing outside ``dest``, no device files or FIFOs. Members get the unpacking
    user's ownership (GNU tar's ``--no-same-owner``) and lose set-id bits and group/other write.

    Args:
        archive (str): path of the archive (``.tar``, ``.tar.gz``, ``.tar.bz2``, ``.tar.xz``).
        dest (str): directory to unpack into; the archive's top directory lands inside it.

    Raises:
        HpcstackError: an unsafe member (named; nothing of the archive is unpacked), or an
            archive that cannot be read.
    """

    archive: str
    dest: str

    def outputs(self) -> tuple[str, ...]:
        return (self.dest,)

    def to_bash(self) -> str:
        return shlex.join([*ACTION_COMMAND, "unpack", self.archive, self.dest])

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        safe_unpack(self.archive, self.dest)


@dataclass(frozen=True)
class WriteFile(ActionBase):
    """Write a text file atomically (temporary file in the same directory, then rename).

    :meth:`execute` runs exactly :meth:`to_bash` (``mkdir -p``, ``mktemp`` beside the file,
    ``cat`` from a quoted here-document (``head -c -1`` for a text without a final newline), ``chmod``, ``mv -fT`` over the file: readers see the old
    file or the new one, never half), then flushes the file and its directory to disk.

    Args:
        path (str): absolute path.
        content (str): the text, written as it is (UTF-8).
        mode (int): permission bits, e.g. ``0o755`` for a script.
        unless_exists (tuple[str, ...]): write only when none of these paths exists (a dangling
            symbolic link counts as existing), e.g. the files that set a module's default.

    Raises:
        HpcstackError: the directory cannot be written (the last error line of the shell).
    """

    path: str
    content: str
    mode: int = 0o644
    unless_exists: tuple[str, ...] = ()

    def commands(self) -> tuple[Run, ...]:
        return tuple(Run((tool,)) for tool in _WRITE_TOOLS)

    def outputs(self) -> tuple[str, ...]:
        return (self.path,)

    def to_bash(self) -> str:
        marker = "HPCSTACK_EOF"
        while marker in self.content:
            marker += "_"
        # a here-document ends with a newline; `head -c -1` drops it when the content has none
        body, copy = (self.content, "cat") if self.content.endswith("\n") else (self.content + "\n", "head -c -1")
        directory, name = os.path.split(self.path)
        tmp = '"$hpcstack_tmp"'
        lines = [f"mkdir -p {shlex.quote(directory)}",
                 f"hpcstack_tmp=$(mktemp {shlex.quote(os.path.join(directory, '.' + name + '.XXXXXX'))})",
                 f"{copy} > {tmp} <<'{marker}'\n{body}{marker}",
                 f"chmod {self.mode:o} {tmp}",
                 f"mv -fT {tmp} {shlex.quote(self.path)}"]
        if not self.unless_exists:
            return "\n".join(lines)
        tests = " || ".join(f"[ -e {p} ] || [ -L {p} ]" for p in map(shlex.quote, self.unless_exists))
        return "\n".join([f"if ! {{ {tests}; }}; then", *lines, "fi"])

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"write {self.path}\n")
        run_bash(self.to_bash(), ctx, f"write {self.path}")
        fsync_file(self.path)
        fsync_dir(os.path.dirname(self.path))


@dataclass(frozen=True)
class Capture(ActionBase):
    """Run a command and keep its standard output in a file (written atomically).

    Used for provenance, e.g. ``pip freeze`` into ``<stage prefix>/.hpcstack/pip-freeze.txt``.
    Bash and Python render the same fields (the command as :class:`Run` prints it, ``> dest``).

    Args:
        argv (tuple[str, ...]): the command; may hold ``${NAME}`` references.
        dest (str): absolute path of the file that receives the output.

    Raises:
        HpcstackError: the command is missing or exits non-zero (its error output is in the log).
    """

    argv: tuple[str, ...]
    dest: str

    def commands(self) -> tuple[Run, ...]:
        return (Run(self.argv),)

    def outputs(self) -> tuple[str, ...]:
        return (self.dest,)

    def to_bash(self) -> str:
        # the directory first, as write_atomic makes it (the script has no state directory of its own)
        return (f"mkdir -p {shlex.quote(os.path.dirname(self.dest))} && "
                f"{Run(self.argv).to_bash()} > {shlex.quote(self.dest)}")

    def execute(self, ctx: ExecContext) -> None:
        from hpcstack.fsutil import write_atomic

        ctx.log.write(f"$ {self.to_bash()}\n")
        ctx.log.flush()
        argv = [expand(a, ctx.env) for a in self.argv]
        try:
            proc = subprocess.run(argv, env=ctx.env, capture_output=True, text=True, cwd=CHILD_CWD,
                                  stdin=subprocess.DEVNULL)
        except (OSError, ValueError) as exc:
            raise HpcstackError(f"cannot run {argv[0]}: {describe_os_error(exc)}")
        ctx.log.write(proc.stderr)
        if proc.returncode != 0:
            raise HpcstackError(f"`{shlex.join(argv)[:200]}` exited with status {proc.returncode}")
        write_atomic(Path(self.dest), proc.stdout)


@dataclass(frozen=True)
class Publish(ActionBase):
    """Publish a complete build: point the stack's prefix (a symlink) at it, atomically.

    A venv cannot be moved after it is made (absolute paths in its scripts), so each build has
    its own stage prefix and the stable prefix ``<install_root>/<name>/<version>`` is a
    symbolic link to it, relative (``.<version>-<id>``, beside it). Publishing makes a new link
    beside the old one and renames it over the old one (``rename(2)`` is atomic, ``mv -T``): a
    reader sees the old build or the new one, never neither and never a half one.

    A prefix that is a real directory (the layout before stage prefixes) is moved to
    ``.<version>-pre-staging`` beside it first; that move and the link that follows it are two
    renames, not one (the only non-atomic moment, once per stack). When ``target`` is the
    prefix itself (such a directory being updated in place) there is nothing to do.

    :meth:`execute` runs exactly :meth:`to_bash`, one command a line (so that ``set -e`` stops at
    the first that fails), then flushes the link's directory to disk.

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
        """Where a prefix that is a real directory goes: the build ``pre-staging`` of
        :class:`hpcstack.install.layout.StackLayout`."""
        return os.path.join(os.path.dirname(self.link), f".{os.path.basename(self.link)}-{PRE_STAGING}")

    def _in_place(self) -> bool:
        return os.path.normpath(self.link) == os.path.normpath(self.target)

    def commands(self) -> tuple[Run, ...]:
        return () if self._in_place() else tuple(Run((tool,)) for tool in _PUBLISH_TOOLS)

    def outputs(self) -> tuple[str, ...]:
        return (self.link,)

    def to_bash(self) -> str:
        if self._in_place():
            return f"true  # {self.link} is a build directory itself (layout before staging): nothing to switch"
        tmp, link = shlex.quote(self._tmp()), shlex.quote(self.link)
        return "\n".join([f"[ -L {link} ] || [ ! -d {link} ] || mv -T {link} {shlex.quote(self._aside())}",
                          f"ln -sfn {shlex.quote(self.relative_target())} {tmp}",
                          f"mv -T {tmp} {link}"])

    def execute(self, ctx: ExecContext) -> None:
        ctx.log.write(f"$ {self.to_bash()}\n")
        if self._in_place():
            return
        run_bash(self.to_bash(), ctx, f"publish {self.target} as {self.link}")
        fsync_dir(os.path.dirname(self.link))


# --------------------------------------------------------------------------------------- helpers

def walk_commands(actions) -> list[Run]:
    """Every command the ``actions`` may run, nested ones included, in order.

    Args:
        actions (Iterable[Action]): actions of one or more steps.
    """
    return [run for action in actions for run in action.commands()]


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

    Args:
        exc (BaseException): usually an :class:`OSError`.
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


def find_on_page(page: str, filename: str) -> str:
    """The URL a PEP 503 ("simple") project page links for ``filename``.

    Args:
        page (str): the project page, e.g. ``https://mirror.example.org/simple/horovod/``.
        filename (str): the file, e.g. ``horovod-0.28.1.tar.gz``.

    Returns:
        str: the absolute URL of the file (without its ``#sha256=`` fragment).

    Raises:
        HpcstackError: the page cannot be read, or it does not list the file.
    """
    import html.parser
    import urllib.error
    import urllib.parse
    import urllib.request

    from hpcstack.errors import HpcstackError

    class Links(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.hrefs = []

        def handle_starttag(self, tag, attrs):
            if tag == "a":
                self.hrefs += [v for k, v in attrs if k == "href" and v]

    try:
        with urllib.request.urlopen(urllib.request.Request(page, headers={"Accept": "text/html"}),
                                    timeout=60) as resp:
            text = resp.read().decode(errors="replace")
            base = resp.geturl()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HpcstackError(f"cannot read the package index page {page}: {getattr(exc, 'reason', None) or exc} "
                            "(installer.index_url of the site config)") from None
    parser = Links()
    parser.feed(text)
    for href in parser.hrefs:
        absolute = urllib.parse.urljoin(base, href)
        if urllib.parse.unquote(urllib.parse.urlparse(absolute).path).rsplit("/", 1)[-1] == filename:
            return urllib.parse.urldefrag(absolute)[0]
    raise HpcstackError(f"the package index page {page} lists no {filename} (installer.index_url of the site config)")
