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
install. A build tool that prints its environment can still show it: keep such values out of
the variables a build key records (``HOROVOD_*``, ``CC``, ``CFLAGS``, ...).
"""

from __future__ import annotations

import os

from hpcstack.errors import HpcstackError

#: Prefix of the variable a ``from_file`` secret is read into while an install runs.
SECRET_VARIABLE_PREFIX = "HPCSTACK_SECRET_"


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


def read(secrets: dict[str, dict], environ: dict[str, str], where: str = "site config") -> dict[str, str]:
    """Read the secrets for a run: the ``from_file`` ones from their files (first line, without
    its end of line), and check that every ``from_env`` variable is set.

    Args:
        secrets (dict[str, dict]): from :func:`split_env`.
        environ (dict[str, str]): the build environment the run gets.
        where (str): the site config, for messages.

    Returns:
        dict[str, str]: ``{HPCSTACK_SECRET_<NAME>: value}`` to add to the build environment.

    Raises:
        HpcstackError: a variable not set or empty, a file that cannot be read or is empty (one
            line naming the key and where it is read from, never a value).
    """
    out, problems = {}, []
    for name, spec in secrets.items():
        if "from_env" in spec:
            if not environ.get(spec["from_env"]):
                problems.append(f"{where}: build.env.{name}: the secret's variable {spec['from_env']} "
                                "is not set (export it before the install)")
            continue
        path = spec["from_file"]
        try:
            with open(path, encoding="utf-8") as f:
                value = f.readline().rstrip("\r\n")
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
