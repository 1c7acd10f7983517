"""Secret values of a site config's ``build.env``: read when a command runs, never written.

A site config marks a value secret by naming where it is read from instead of giving it::

    build:
      env:
        PIP_INDEX_URL: {secret: true, from_env: SITE_INDEX_URL}     # a variable of the caller
        NETRC_TOKEN: {secret: true, from_file: /root/.hpcstack-token}  # a file's first line

Everywhere the plan is written down (``plan.json``, ``install.sh``, the dry-run output, logs,
provenance, the copies ``site.yaml`` and ``site.json``) the value is a reference that bash and
hpcstack expand when the command runs: ``${SITE_INDEX_URL}``, or ``${HPCSTACK_SECRET_<NAME>}``
for a file, which the install reads into its build environment (and the dry-run script reads
with ``$(cat FILE)``). The value itself exists only in the build environment of the running
install.

Two rules keep it there (the site-config reference, docs/admin/site-config.md, says the same):

1. **Redaction by value.** Whatever hpcstack writes while an install runs (each step's log,
   the output of the commands it runs, its own error lines) and whatever it prints for a plan
   (``--dry-run``, ``--json``) passes through a :class:`Redactor` that replaces every secret's
   value with :data:`MARKER`, also where the value sits inside another value after ``${...}``
   expansion (``PIP_INDEX_URL: "https://ci:${MY_TOKEN}@pypi.example.org/simple"``), and
   whatever the build tool printed.
2. **No secret in a build key.** A source build's key records the values of the variables that
   change its binary (:data:`BUILD_KEY_VARIABLES`: ``CC``, ``CFLAGS``, ``LDFLAGS``,
   ``HOROVOD_*`` ...) and of every other ``build.env`` variable; the key's text is logged and
   kept in the build cache, and the key is a hash of it, so a secret there would be written
   down, or guessable from the hash. A secret named like a build-key variable, read from one
   (``from_env: LDFLAGS``), or expanded inside one (``CFLAGS: "-O2 ${MY_TOKEN}"``) is refused
   when the site config is loaded (:func:`key_problems`), with the reason; a secret expanded
   inside another ``build.env`` variable makes that variable secret too: it stays out of the key
   (:func:`secret_names`), as a secret does.

A ``from_file`` secret is read as root, into the build environment of everything the install
runs: whoever can change or swap that file chooses, say, the package index root installs from.
So the file, and every directory above it (as named and with its links resolved), must pass the
trust rule of :mod:`hpcstack.trust` before it is read, and it is read through
:func:`hpcstack.gate.read_file` (no link followed on the resolved path, a regular file only, at
most :data:`MAX_SECRET_FILE` bytes); a file another account can change is refused in one line
naming it and whose it is (:func:`file_problems`), exit status 2 (docs/admin/security.md).
"""

from __future__ import annotations

import io
import os
import re
import select
import threading

from hpcstack import gate, trust
from hpcstack.errors import ConfigError, HpcstackError

#: Prefix of the variable a ``from_file`` secret is read into while an install runs.
SECRET_VARIABLE_PREFIX = "HPCSTACK_SECRET_"

#: What a secret's value is replaced with wherever hpcstack writes or prints (:class:`Redactor`).
MARKER = "[secret]"

#: Variables whose values enter a source build's key whatever the component sets (the key's
#: text is logged and kept in the build cache): no secret may be one (:func:`key_problems`).
#: :mod:`hpcstack.install.components.source` builds its key from this pattern.
BUILD_KEY_VARIABLES = (r"HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS"
                       r"|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS")

#: The largest secret file read (only its first line is used): a larger one is refused, not read
#: in part (a device or a file that never ends is not a secret).
MAX_SECRET_FILE = 64 * 1024

_VAR_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def is_secret(value: object) -> bool:
    """True when ``value`` is a secret's specification (``{secret: true, from_env|from_file: ...}``)."""
    return isinstance(value, dict) and value.get("secret") is True


def variable_of(name: str, spec: dict) -> str:
    """The variable whose value a secret is at run time: its ``from_env``, or
    ``HPCSTACK_SECRET_<name>`` for ``from_file``."""
    return spec["from_env"] if "from_env" in spec else SECRET_VARIABLE_PREFIX + name


def split_env(section: dict) -> tuple[dict[str, str], dict[str, dict]]:
    """Split a validated ``build.env`` into what the plan uses and the secrets' specifications.

    Args:
        section (dict): ``build.env`` of a site config (values: strings or secret specifications).

    Returns:
        tuple[dict[str, str], dict[str, dict]]: ``{name: value}`` with each secret as a
        ``${VARIABLE}`` reference (:func:`variable_of`), and ``{name: specification}`` of the secrets.
    """
    plain, secrets = {}, {}
    for name, value in section.items():
        if is_secret(value):
            secrets[name] = dict(value)
            plain[name] = "${" + variable_of(name, value) + "}"
        else:
            plain[name] = value
    return plain, secrets


def secret_files(secrets: dict[str, dict]) -> dict[str, str]:
    """``{variable: file}`` of the ``from_file`` secrets (for the dry-run script's preamble)."""
    return {variable_of(n, s): s["from_file"] for n, s in secrets.items() if "from_file" in s}


def _policy(pol) -> "trust.Policy":
    return pol if pol is not None else gate.current_policy()


def file_problem(path: str, pol: "trust.Policy | None" = None) -> str | None:
    """Why a secret's file must not be read: an account the trust rule does not trust can change
    or swap it, or a directory above it (:func:`hpcstack.trust.path_problem`, both the named and
    the resolved chain); None when it may be read (or ``--trust-writable``).

    Args:
        path (str): the ``from_file`` path (a relative one counts from the working directory).
        pol (hpcstack.trust.Policy | None): whom to trust (default
            :func:`hpcstack.gate.current_policy`: root and the running account).

    Returns:
        str | None: e.g. ``"/home/alice/token: owned by alice"``.
    """
    pol = _policy(pol)
    if pol.trust_writable:
        return None
    return trust.path_problem(os.path.abspath(path), pol)


def file_problems(secrets: dict[str, dict], pol: "trust.Policy | None" = None,
                  where: str = "site config") -> list[str]:
    """One line per ``from_file`` secret whose file an untrusted account can change
    (:func:`file_problem`), naming the key, the file, whose it is and the fix; never a value.

    Args:
        secrets (dict[str, dict]): from :func:`split_env`.
        pol (hpcstack.trust.Policy | None): whom to trust (default
            :func:`hpcstack.gate.current_policy`).
        where (str): the site config, for messages.

    Returns:
        list[str]: e.g. ``"s.yaml: build.env.TOKEN: the secret's file /home/alice/token: owned by
        alice; ..."``; empty when every file may be read.
    """
    pol = _policy(pol)
    lines = []
    for name, spec in secrets.items():
        if "from_file" not in spec:
            continue
        path = spec["from_file"]
        problem = file_problem(path, pol)
        if problem:
            at, _, what = problem.partition(": ")
            subject = what if os.path.abspath(at) == os.path.abspath(path) else problem
            lines.append(f"{where}: build.env.{name}: the secret's file {path}: {subject}; hpcstack reads a "
                         f"secret only from a file that {pol.who()} alone can change (it goes into the "
                         f"environment of everything the install runs): chown root and chmod go-w it and "
                         f"the directories above it, or pass {trust.OVERRIDE}")
    return lines


def _read_first_line(path: str, pol: "trust.Policy") -> str:
    """The first line of the secret file ``path`` (without its end of line), read through
    :func:`hpcstack.gate.read_file` on its resolved path (the named and resolved chains passed
    :func:`file_problem` before).

    Raises:
        GateError: a link, not a regular file, an untrusted owner or writer on the resolved
            path (one that appeared since the check), or larger than :data:`MAX_SECRET_FILE`.
        OSError: missing or unreadable.
        UnicodeDecodeError: not UTF-8.
    """
    data = gate.read_file(os.path.realpath(os.path.abspath(path)), MAX_SECRET_FILE, pol)
    return data.decode("utf-8").split("\n", 1)[0].rstrip("\r")


def read(secrets: dict[str, dict], environ: dict[str, str], where: str = "site config",
         pol: "trust.Policy | None" = None) -> dict[str, str]:
    """Read the secrets for a run: the ``from_file`` ones from their files (first line, without
    its end of line), and check that every ``from_env`` variable is set.

    Each file is checked by the trust rule before it is read (:func:`file_problems`), then read
    through the gate (:func:`_read_first_line`): a file that an account the rule does not trust
    can change or swap is refused, not read.

    Args:
        secrets (dict[str, dict]): from :func:`split_env`.
        environ (dict[str, str]): the build environment the run gets.
        where (str): the site config, for messages.
        pol (hpcstack.trust.Policy | None): whom to trust (the run's policy,
            :attr:`hpcstack.install.service.InstallService.trust`); default
            :func:`hpcstack.gate.current_policy` (root and the running account).

    Returns:
        dict[str, str]: ``{HPCSTACK_SECRET_<NAME>: value}`` to add to the build environment.

    Raises:
        ConfigError: a secret's file (or a directory above it) that an untrusted account can
            change: one line per file, naming it and whose it is (exit status 2, nothing read).
        HpcstackError: a variable not set or empty, a file that cannot be read or is empty (one
            line naming the key and where it is read from, never a value).
    """
    pol = _policy(pol)
    refused = file_problems(secrets, pol, where)
    if refused:
        raise ConfigError(refused)
    out, problems = {}, []
    for name, spec in secrets.items():
        if "from_env" in spec:
            if not environ.get(spec["from_env"]):
                problems.append(f"{where}: build.env.{name}: the secret's variable {spec['from_env']} "
                                "is not set (export it before the install)")
            continue
        path = spec["from_file"]
        try:
            value = _read_first_line(path, pol)
        except gate.GateError as exc:
            problems.append(f"{where}: build.env.{name}: the secret's file {path}: refused: {exc.problem}")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{where}: build.env.{name}: cannot read the secret's file {path}: "
                            f"{getattr(exc, 'strerror', None) or type(exc).__name__}")
            continue
        if not value:
            problems.append(f"{where}: build.env.{name}: the secret's file {path} is empty")
            continue
        out[variable_of(name, spec)] = value
    if problems:
        raise HpcstackError("; ".join(problems))
    return out


def values(secrets: dict[str, dict], environ: dict[str, str] | None = None) -> list[str]:
    """The secrets' values in ``environ`` (default: this process's), e.g. to check that none
    was written anywhere."""
    environ = os.environ if environ is None else environ
    return [environ[v] for v in (variable_of(n, s) for n, s in secrets.items()) if environ.get(v)]


# ------------------------------------------------------------------------ secrets in build keys

def referenced(value: str) -> set[str]:
    """The variables ``value`` refers to (``${NAME}``, also a bare ``$NAME`` as bash reads it)."""
    return {a or b for a, b in _VAR_REF.findall(value)}


def is_key_variable(name: str) -> bool:
    """True when ``name`` is one of :data:`BUILD_KEY_VARIABLES`."""
    return re.fullmatch(BUILD_KEY_VARIABLES, name) is not None


def secret_names(env: dict[str, str], secrets: dict[str, dict]) -> set[str]:
    """The variables of a build environment whose value is secret: the secrets themselves, and
    every variable whose value expands one (``${MY_TOKEN}``, ``${HPCSTACK_SECRET_<NAME>}``).

    Args:
        env (dict[str, str]): a build environment as planned (values may hold ``${NAME}``).
        secrets (dict[str, dict]): the site's secrets (:func:`split_env`).

    Returns:
        set[str]: names to keep out of a build key.
    """
    variables = {variable_of(n, s) for n, s in secrets.items()}
    return set(secrets) | {n for n, v in env.items() if isinstance(v, str) and referenced(v) & variables}


def key_problems(section: object, where: str) -> list[str]:
    """Why a site config's ``build.env`` would put a secret into a build key (see the module's
    docstring, rule 2): one line per variable.

    Args:
        section (object): ``build.env`` as loaded (checked by the schema before).
        where (str): the file, to start each line with.

    Returns:
        list[str]: ``"<file>: build.env.<NAME>: ..."`` lines; empty when none.
    """
    if not isinstance(section, dict):
        return []
    plain, secrets = split_env(section)
    why = ("the build key records the values of the variables that change a built binary "
           f"({BUILD_KEY_VARIABLES.split('|', 1)[0]}, CC, CFLAGS, LDFLAGS, ...), and the key's text is "
           "logged and kept in the build cache")
    lines = []
    for name, spec in sorted(secrets.items()):
        if is_key_variable(name):
            lines.append(f"{where}: build.env.{name}: a secret cannot be a build-key variable: {why}; "
                         "give the secret a variable of its own")
        elif "from_env" in spec and is_key_variable(spec["from_env"]):
            lines.append(f"{where}: build.env.{name}: a secret cannot be read from the build-key variable "
                         f"{spec['from_env']}: {why}; read it from a variable of its own")
    variables = {variable_of(n, s): n for n, s in secrets.items()}
    for name, value in sorted(plain.items()):
        if name in secrets or not is_key_variable(name):
            continue
        used = sorted(variables[v] for v in referenced(value) if v in variables)
        if used:
            lines.append(f"{where}: build.env.{name}: expands the secret {used[0]}, but {name} is a build-key "
                         f"variable: {why}; keep the secret out of {name}")
    return lines


def check_key(env: dict[str, str], secrets: dict[str, dict], where: str) -> None:
    """Refuse a build environment (a component's, as planned) in which a build-key variable
    expands a secret (rule 2 of the module's docstring).

    Raises:
        ConfigError: one line per such variable.
    """
    variables = {variable_of(n, s): n for n, s in secrets.items()}
    lines = []
    for name, value in sorted(env.items()):
        used = sorted(variables[v] for v in referenced(value) if v in variables) if isinstance(value, str) else []
        if used and is_key_variable(name):
            lines.append(f"{where}: {name}: expands the secret {used[0]}, but {name} is a build-key variable "
                         f"(its value is logged and kept in the build cache); keep the secret out of {name}")
    if lines:
        raise ConfigError(lines)


# ---------------------------------------------------------------------------------- redaction

def known_values(secrets: dict[str, dict], environ: dict[str, str] | None = None,
                 pol: "trust.Policy | None" = None) -> list[str]:
    """The secrets' values this process can know without failing: ``from_env`` ones set in
    ``environ`` (default: this process's), ``from_file`` ones whose file passes the trust rule
    (:func:`file_problem`) and can be read through the gate; for redacting what a command prints
    when no install has read them (``--dry-run``). A file that fails the rule is not read (its
    value is then not known here: the install refuses it, :func:`read`).

    Args:
        secrets (dict[str, dict]): from :func:`split_env`.
        environ (dict[str, str] | None): the environment (default ``os.environ``).
        pol (hpcstack.trust.Policy | None): whom to trust (default
            :func:`hpcstack.gate.current_policy`).

    Returns:
        list[str]: the values found (never raises).
    """
    environ = os.environ if environ is None else environ
    pol = _policy(pol)
    found = []
    for name, spec in secrets.items():
        if "from_env" in spec:
            value = environ.get(spec["from_env"], "")
        else:
            value = environ.get(variable_of(name, spec), "")
            if not value and not file_problem(spec["from_file"], pol):
                try:
                    value = _read_first_line(spec["from_file"], pol)
                except (OSError, UnicodeDecodeError, HpcstackError):
                    value = ""
        if value:
            found.append(value)
    return found


class Redactor:
    """Replaces each secret's value with :data:`MARKER` (rule 1 of the module's docstring).

    Args:
        values (list[str]): the secrets' values (empty ones are ignored).

    Example:
        ``Redactor(["s3cr3t"]).text("https://ci:s3cr3t@host")`` is ``"https://ci:[secret]@host"``
    """

    def __init__(self, values):
        self.values = sorted({v for v in values if v}, key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(v) for v in self.values)) if self.values else None
        #: the longest value's length, less one: what a stream must hold back between writes
        self.overlap = max((len(v) for v in self.values), default=1) - 1

    def __bool__(self) -> bool:
        return bool(self.values)

    def text(self, text: str) -> str:
        """``text`` with every value replaced."""
        return self._pattern.sub(MARKER, text) if self._pattern and text else text

    def error(self, exc: HpcstackError) -> HpcstackError:
        """``exc`` with its lines redacted (the same class, step and exit status)."""
        if not self or not any(self.text(line) != line for line in exc.lines()):
            return exc
        if isinstance(exc, ConfigError):
            return ConfigError([self.text(line) for line in exc.lines()])
        new = HpcstackError(self.text(str(exc)), step=exc.step)
        new.exit_status = exc.exit_status
        return new

    def stream(self, raw) -> "RedactingLog":
        """A log that writes to the open file ``raw`` through this redactor."""
        return RedactingLog(raw, self)


class RedactingLog(io.TextIOBase):
    """A step's log with the secrets redacted, as an open text file with a real descriptor:
    what the commands of a step print goes through a pipe (:meth:`fileno`), what hpcstack
    writes through :meth:`write` into the same pipe, so the order is kept; a thread reads
    it, replaces the values by :data:`MARKER` (a line at a time, never splitting a value) and
    writes the file. :meth:`close` waits until all is written (a process that a step left
    running with the pipe open does not hold it up: after half a second of silence the log
    ends).

    Args:
        raw (IO[str]): the log file, open for writing (closed by its owner).
        redactor (Redactor): the values to replace.
    """

    def __init__(self, raw, redactor: Redactor):
        super().__init__()
        self.raw, self.redactor = raw, redactor
        self._read_fd, self._write_fd = os.pipe()
        self._ending = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True, name="hpcstack-redact")
        self._thread.start()

    def _pump(self) -> None:
        pending = b""
        keep = max(self.redactor.overlap, 0)
        while True:
            ready, _, _ = select.select([self._read_fd], [], [], 0.5)
            if not ready:
                if self._ending.is_set():
                    break  # ended, and quiet: only a process the step left running still holds the pipe
                continue
            chunk = os.read(self._read_fd, 1 << 16)
            if not chunk:
                break
            pending += chunk
            cut = pending.rfind(b"\n") + 1
            if not cut and len(pending) > (1 << 20) + keep:
                cut = len(pending) - keep
            if cut:
                self._emit(pending[:cut])
                pending = pending[cut:]
        self._emit(pending)
        os.close(self._read_fd)

    def _emit(self, data: bytes) -> None:
        if data:
            self.raw.write(self.redactor.text(data.decode(errors="replace")))
            self.raw.flush()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        """The pipe's write end: give it to a command as its output."""
        return self._write_fd

    def write(self, text: str) -> int:
        """Write ``text`` (after what was written before)."""
        data = text.encode(errors="replace")
        view = memoryview(data)
        while view:
            n = os.write(self._write_fd, view)
            view = view[n:]
        return len(text)

    def flush(self) -> None:
        """Nothing to do: the pipe has no buffer of hpcstack's; :meth:`close` waits for the thread."""

    def close(self) -> None:
        """End the stream and wait until everything is in the file."""
        if not self.closed:
            os.close(self._write_fd)
            self._ending.set()
            self._thread.join()
        super().close()
