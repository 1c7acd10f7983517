#!/usr/bin/env python3
"""``hpcstack doctor``: check a user's venv on top of a stack, so that it cannot break the stack.

Three kinds of problem, one line each (exit 1 when there is any, 0 when the venv is clean):

- **shadows**: a distribution in the venv with the name of one of the stack's, at another version
  (the extended venv's site-packages come before the stack's: first on PYTHONPATH, and in the
  venv's own python, whose start-up file ``00-hpcstack-venv.pth`` puts both after the standard
  library, in that order; so the venv's copy is imported);
  the venv's own ``pip``, ``setuptools`` and ``wheel`` (:data:`VENV_TOOLS`) do not count;
- **conflicts**: a distribution in the venv whose version breaks the stack's constraints
  (``<prefix>/.hpcstack/constraints.txt``), or whose requirements the stack's packages do not
  meet (e.g. it needs ``torch>=2.4``; the stack has 2.3.1), which ``pip install --no-deps`` or a
  uv install lets through;
- **user site**: distributions in the user site directory (``~/.local/lib/pythonX.Y/site-packages``,
  or under ``PYTHONUSERBASE``) of the venv's Python, which any Python run without
  ``PYTHONNOUSERSITE=1`` (the module sets it) imports (ARCHER2 docs PR #525; Horovod #1059);
- **no pip**: a venv without its own ``bin/pip`` (``uv venv`` without ``--seed``; ``ensurepip``
  without ``--default-pip`` makes only ``pip3``): ``pip`` there is
  another one (the stack's, which refuses, or the system's), which does not install into it.

With no venv (none active, no ``--venv``) it checks the user site of the stack's Python: what
``pip install --user`` put there is not imported under the module (``PYTHONNOUSERSITE=1``) but is
by every other Python of that version. Stacks have no user base of their own: packages on top of
a stack go into a venv extended for it (``<prefix>/bin/pip`` says so).

The stack is found from ``--stack PREFIX`` or the loaded modules' ``HPCSTACK_<NAME>_ROOT``
variables; the venv from ``--venv DIR`` or ``VIRTUAL_ENV``. Distributions are read from their
``.dist-info`` metadata with :mod:`importlib.metadata`; versions, specifiers and markers are
compared with :mod:`packaging` (PEP 440, PEP 508), markers evaluated for the venv's Python.

The same file is installed into each stack as ``<prefix>/bin/hpcstack-doctor`` (by
:class:`~hpcstack.install.components.manifest.StackManifest`), so that users, who may not have
the ``hpcstack`` command, get it with the module: there it checks against its own stack and runs
with the standard library and ``packaging`` (the stack's, else the copy inside pip).
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version
except ImportError:  # standalone in a stack without packaging: the copy every pip carries
    try:
        from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
        from pip._vendor.packaging.utils import canonicalize_name
        from pip._vendor.packaging.version import InvalidVersion, Version
    except ImportError:  # neither (a stack made by uv has no pip): --help works, a check says why not
        Requirement = None  # type: ignore[assignment,misc]

try:
    from hpcstack.errors import ConfigError
except ImportError:  # standalone (<prefix>/bin/hpcstack-doctor)
    class ConfigError(Exception):
        """Bad input: one line per problem (``lines``), exit status 2."""

        def __init__(self, lines):
            super().__init__("; ".join(lines))
            self.problems = list(lines)

        def lines(self):
            return self.problems

#: The name of the copy installed into each stack's ``bin/``.
SCRIPT = "hpcstack-doctor"

#: The installer tools ``python -m venv`` puts into every venv (ensurepip); they belong to the
#: venv, and a fresh venv would otherwise never be clean (pip 23 and setuptools 65 of a Python
#: 3.11 venv against the stack's own), so they are not counted as shadowing or conflicting.
VENV_TOOLS = frozenset({"pip", "setuptools", "wheel"})

#: Printed by the venv's python: what PEP 508 markers and the user site depend on.
_PROBE = r"""
import json, os, platform, site, sys, sysconfig
# run with -S (no site, no .pth file run): a venv's own paths from its prefix, as site would set them
venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
    scheme = "venv" if "venv" in sysconfig.get_scheme_names() else "posix_prefix"
    paths = {k: sysconfig.get_path(k, scheme, {"base": venv, "platbase": venv}) for k in ("purelib", "platlib")}
else:
    paths = {k: sysconfig.get_path(k) for k in ("purelib", "platlib")}
impl = sys.implementation
iver = "{0.major}.{0.minor}.{0.micro}".format(impl.version)
print(json.dumps({
    "markers": {"implementation_name": impl.name, "implementation_version": iver,
                "os_name": os.name, "platform_machine": platform.machine(),
                "platform_release": platform.release(), "platform_system": platform.system(),
                "platform_version": platform.version(),
                "python_full_version": platform.python_version(),
                "platform_python_implementation": platform.python_implementation(),
                "python_version": ".".join(platform.python_version_tuple()[:2]),
                "sys_platform": sys.platform},
    "purelib": paths["purelib"], "platlib": paths["platlib"],
    "user_site": site.getusersitepackages(),
}))
"""


@dataclass(frozen=True)
class Dist:
    """A distribution found on disk: canonical name, version, where, and its requirements."""

    name: str
    version: str
    location: str
    requires: tuple = ()


#: The most bytes doctor reads of one file of a stack or a module root (a record, a
#: constraints file, a default file, a distribution's ``METADATA``).
MAX_READ = 4 << 20


def _as_root() -> bool:
    """True where reads below a stack go through :mod:`hpcstack.gate`: run as root, with the
    hpcstack package (the standalone copy in a stack's ``bin/`` runs as the stack's user)."""
    if os.geteuid() != 0:
        return False
    try:
        from hpcstack import gate  # noqa: F401
    except ImportError:
        return False
    return True


def _any_owner():
    """The gate's walk without its owner rule (as ``hpcstack show`` reads anyone's build): every
    component from ``/`` opened without following a link, the file a regular one."""
    from hpcstack import trust

    return trust.Policy(uid=os.geteuid(), trust_writable=True)


def _gated(path) -> str:
    """``path`` with the links on it resolved only where trusted accounts alone can have put
    them (:func:`hpcstack.gate.resolved`: a root-owned prefix link in a root-owned install
    root); any other link stays, for the gate to refuse."""
    from hpcstack import gate, trust

    return gate.resolved(os.path.abspath(path), trust.policy())


def read_small(path) -> str | None:
    """The text of a file below a stack or a module root, None when it is missing, unreadable, not
    a regular file (a FIFO neither blocks nor is read) or larger than :data:`MAX_READ`. As root
    (:func:`_as_root`), through :func:`hpcstack.gate.read_file`: no link anywhere on the way
    (but a trusted account's), whoever owns it; else opened ``O_NONBLOCK`` and checked by
    ``fstat`` (the caller's own files)."""
    if _as_root():
        from hpcstack import gate
        from hpcstack.errors import HpcstackError

        try:
            return gate.read_file(_gated(path), MAX_READ, _any_owner()).decode("utf-8", "replace")
        except (OSError, HpcstackError):
            return None
    return _read_plain(path)


def _read_plain(path) -> str | None:
    """:func:`read_small` for a user on their own files (not root): ``O_NONBLOCK``, ``fstat``
    regular, size-capped."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_READ:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_READ + 1)[:MAX_READ].decode("utf-8", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _list_dir(path) -> list[tuple[str, bool]] | None:
    """``(name, is a regular file)`` of each entry of a directory (no link followed), None when it
    is not one. As root through :func:`hpcstack.gate.directory` (no link on the way)."""
    if _as_root():
        from hpcstack import gate
        from hpcstack.errors import HpcstackError

        try:
            with gate.directory(_gated(path), _any_owner()) as fd, os.scandir(fd) as it:
                return [(e.name, e.is_file(follow_symlinks=False)) for e in it]
        except (OSError, HpcstackError):
            return None
    try:
        with os.scandir(path) as it:
            return [(e.name, e.is_file()) for e in it]
    except OSError:
        return None


def _metadata_dists(path: str) -> list[tuple[str, str, tuple]]:
    """As root: ``(name, version, requirements)`` of each ``*.dist-info`` of ``path``, its
    ``METADATA`` read through the gate (:func:`read_small`); not :mod:`importlib.metadata`,
    which opens by name (a FIFO at a ``METADATA`` would hang root)."""
    from email.parser import HeaderParser

    out = []
    for name, _ in sorted(_list_dir(path) or []):
        if not name.endswith(".dist-info"):
            continue
        text = read_small(os.path.join(path, name, "METADATA"))
        if text is None:
            continue
        meta = HeaderParser().parsestr(text)
        if meta.get("Name"):
            out.append((meta["Name"], meta.get("Version") or "", tuple(meta.get_all("Requires-Dist") or ())))
    return out


def distributions(paths) -> dict[str, Dist]:
    """The distributions in ``paths`` (site-packages directories), first found wins, by canonical
    name; as root read through the gate (:func:`_metadata_dists`)."""
    found: dict[str, Dist] = {}
    for path in paths:
        if not path or not os.path.isdir(path):
            continue
        if _as_root():
            for name, version, requires in _metadata_dists(path):
                found.setdefault(canonicalize_name(name), Dist(canonicalize_name(name), version, path, requires))
            continue
        for dist in md.distributions(path=[path]):
            name = dist.metadata["Name"]
            if not name:
                continue
            key = canonicalize_name(name)
            found.setdefault(key, Dist(key, dist.version, path, tuple(dist.requires or ())))
    return found


def stack_prefixes(environ) -> list[Path]:
    """The prefixes of the loaded stacks: every ``HPCSTACK_<NAME>_ROOT`` whose directory has ``venv/``."""
    out = []
    for key, value in sorted(environ.items()):
        if re.fullmatch(r"HPCSTACK_[A-Z0-9_]+_ROOT", key) and value and (Path(value) / "venv").is_dir():
            out.append(Path(value))
    return out


def stack_site_packages(prefix: Path) -> list[str]:
    """The stack venv's site-packages (``venv/lib/python*/site-packages``)."""
    return [str(p) for p in sorted((prefix / "venv" / "lib").glob("python*/site-packages"))]


def read_constraints(prefix: Path) -> tuple[list[Requirement], str]:
    """The stack's constraints and where they came from: ``.hpcstack/constraints.txt``, else
    (stacks installed before it existed) the pins of ``.hpcstack/pip-freeze.txt``."""
    for name in ("constraints.txt", "pip-freeze.txt"):
        path = prefix / ".hpcstack" / name
        text = read_small(path)
        if text is not None:
            reqs = []
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if not line or line.startswith("-"):
                    continue
                try:
                    reqs.append(Requirement(line))
                except InvalidRequirement:
                    continue
            return reqs, str(path)
    return [], ""


def _simple_problem(path: Path) -> str | None:
    """The trust rule without the hpcstack package (the copy in a stack's ``bin/``): ``path``
    and every directory above it, as named and resolved, owned by root or the running account and
    writable by no one else (a sticky directory such as ``/tmp`` excepted)."""
    import stat

    uid = os.geteuid()
    seen = []
    for p in (Path(os.path.abspath(path)), Path(os.path.realpath(path))):
        for q in (p, *p.parents):
            if q in seen:
                continue
            seen.append(q)
            try:
                st = os.lstat(q)
            except OSError:
                continue
            if st.st_uid not in (0, uid):
                return f"{q}: owned by uid {st.st_uid}"
            if (stat.S_ISDIR(st.st_mode) and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
                    and not stat.S_ISLNK(st.st_mode)):
                return f"{q}: writable by others"
    return None


def python_problem(python: Path) -> str | None:
    """Why running ``python`` (a venv's ``bin/python``) would run code that an account hpcstack does
    not trust can change, or None.

    The rule of :mod:`hpcstack.trust` (the same check as ``hpcstack kernel install --venv``):
    the interpreter and every directory above it must be changeable only by root, the running
    account or the admin group. A user's venv checked by root would otherwise run the user's
    ``bin/python`` as root; its ``.pth`` files are not run anyway (:func:`probe_venv` starts the
    interpreter with ``-I -S``).

    Args:
        python (Path): the interpreter.

    Raises:
        ConfigError: the system configuration of :mod:`hpcstack.trust` is not root's (exit 2).
    """
    try:
        from hpcstack import trust
    except ImportError:  # standalone (<prefix>/bin/hpcstack-doctor)
        return _simple_problem(python)
    return trust.path_problem(python, trust.policy())


def probe_venv(venv: Path) -> dict:
    """Ask the venv's python for its marker environment, site-packages and user site.

    The interpreter runs only when an untrusted account cannot change it
    (:func:`python_problem`), isolated (``-I``: no working directory, ``PYTHON*`` variable or
    user site on ``sys.path``) and without ``site`` (``-S``: the venv's ``.pth`` files are not
    run), in ``/``.

    Raises:
        ConfigError: no ``bin/python`` in ``venv``, it fails, or another user can change it
            (docs/admin/security.md: run ``hpcstack doctor`` as the venv's owner instead).
    """
    python = venv / "bin" / "python"
    if not os.access(python, os.X_OK):
        raise ConfigError([f"--venv {venv}: no {python}; is it a venv?"])
    problem = python_problem(python)
    if problem:
        raise ConfigError([f"--venv {venv}: {problem}; checking it would run that venv's python as "
                           f"{'root' if os.geteuid() == 0 else 'you'}: let its owner run `hpcstack doctor`"])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONNOUSERSITE", "PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(python), "-I", "-S", "-c", _PROBE], capture_output=True, text=True, env=env,
                          cwd="/")
    if proc.returncode != 0:
        raise ConfigError([f"--venv {venv}: {python} fails: {proc.stderr.strip()[-300:]}"])
    return json.loads(proc.stdout)


def _version(text: str):
    try:
        return Version(text)
    except InvalidVersion:
        return None


def check(venv: Path, stacks: list[Path]) -> list[str]:
    """Return one line per problem of ``venv`` on top of ``stacks`` (empty: clean).

    Args:
        venv (Path): the user's venv.
        stacks (list[Path]): stack prefixes (each with ``venv/`` and ``.hpcstack/``).

    Raises:
        ConfigError: the venv's python is missing or fails.
    """
    info = probe_venv(venv)
    env = info["markers"]
    mine = distributions(dict.fromkeys([info["purelib"], info["platlib"]]))
    stack: dict[str, Dist] = {}
    constraints: list[tuple[Requirement, str]] = []
    for prefix in stacks:
        for key, dist in distributions(stack_site_packages(prefix)).items():
            stack.setdefault(key, dist)
        reqs, where = read_constraints(prefix)
        constraints += [(r, where) for r in reqs if r.marker is None or r.marker.evaluate(env)]
    problems = []
    shadowing = set()
    mine = {k: v for k, v in mine.items() if k not in VENV_TOOLS}
    for key, dist in sorted(mine.items()):
        theirs = stack.get(key)
        if theirs and _version(dist.version) != _version(theirs.version):
            shadowing.add(key)
            problems.append(f"shadows: {dist.name} {dist.version} in {dist.location} hides the stack's "
                            f"{theirs.name} {theirs.version} ({theirs.location})")
    for key, dist in sorted(mine.items()):
        if key in shadowing:
            continue
        version = _version(dist.version)
        for req, where in constraints:
            if canonicalize_name(req.name) == key and version is not None \
                    and not req.specifier.contains(version, prereleases=True):
                problems.append(f"conflict: {dist.name} {dist.version} in {dist.location} breaks the "
                                f"stack's constraint {req} ({where})")
    for key, dist in sorted(mine.items()):
        for text in dist.requires:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            target = stack.get(canonicalize_name(req.name))
            if target is None or canonicalize_name(req.name) in mine:
                continue
            version = _version(target.version)
            if version is not None and not req.specifier.contains(version, prereleases=True):
                problems.append(f"conflict: {dist.name} {dist.version} requires {req}; the stack has "
                                f"{target.name} {target.version}")
    if not (venv / "bin" / "pip").exists():
        problems.append(f"no pip: {venv} has no pip of its own (made by `uv venv` without --seed?), so "
                        f"`pip` there is another one that does not install into it; run `{venv}/bin/python "
                        "-m ensurepip --default-pip`, or install with `uv pip install`")
    problems += user_site_problems(info["user_site"], {**mine, **stack})
    return problems


def user_site_problems(user_site: str, known: dict) -> list[str]:
    """One line per distribution in ``user_site`` (``known``: the stack's and venv's, by name)."""
    problems = []
    for key, dist in sorted(distributions([user_site]).items()):
        theirs = known.get(key)
        also = f" (the stack or venv has {theirs.version})" if theirs else ""
        problems.append(f"user site: {dist.name} {dist.version} in {user_site} is imported by any Python "
                        f"without PYTHONNOUSERSITE=1{also}")
    return problems


# ------------------------------------------------------------- deprecated and retired stacks
# ``hpcstack module deprecate`` records each deprecation in <module root>/.hpcstack/deprecations.json
# (hpcstack.lifecycle.deprecation); read here with the standard library, as this file runs alone.

DEPRECATIONS = os.path.join(".hpcstack", "deprecations.json")


def _deprecations(module_root: str) -> dict:
    try:
        return json.loads(read_small(os.path.join(module_root, DEPRECATIONS)) or "{}").get("modules") or {}
    except (ValueError, AttributeError, RecursionError):
        return {}


def _line(module: str, entry: dict, retired: bool) -> str:
    """The deprecation line (or the retired one) as ``hpcstack module deprecate`` words it."""
    repl, after, message = entry.get("replacement"), entry.get("after"), entry.get("message")
    if retired:
        import datetime

        past = bool(after) and str(after) <= datetime.date.today().isoformat()
        text = f"{module} was retired" + (f" on {after}" if past else "")
        text += f": use {repl} instead" if repl else ": no replacement was named"
    else:
        text = "; ".join([f"{module} is deprecated"] + ([f"use {repl} instead"] if repl else [])
                         + ([f"it cannot be loaded from {after} on"] if after else []))
    return text + (f" ({message})" if message else "")


def deprecated_stack_lines(stacks, environ=None) -> list[str]:
    """One line per stack that is deprecated (found through its provenance's modulefile, read
    only where :func:`_module_of` accepts it; otherwise the line says why nothing was read)."""
    out = []
    for prefix in stacks:
        found = _module_of(prefix, environ)
        if isinstance(found, str):
            out.append(found)
            continue
        if not found:
            continue
        module_dir, version = found
        module = f"{module_dir.name}/{version}"
        entry = _deprecations(str(module_dir.parent)).get(module)
        if entry:
            out.append(_line(module, entry, retired=False))
    return out


#: The default-version files ``hpcstack module set-default`` writes in ``<module root>/<name>/``
#: and the pattern that finds the version in each: the same as
#: :attr:`hpcstack.modules.syntax.ModuleSyntax.default_pattern` of the Tcl and Lua syntaxes (a
#: test keeps them equal; this file also runs standalone, without hpcstack).
DEFAULT_FILES = {
    ".modulerc.lua": re.compile(r"^\s*module_version\(\s*\"[^\"/]+/([^\"]+)\"\s*,\s*\"default\"", re.M),
    ".version": re.compile(r"^\s*set\s+ModulesVersion\s+[{\"]?([^}\"\s]+)", re.M),
}


def _module_of(prefix, environ=None) -> tuple[Path, str] | str | None:
    """``(<module root>/<name>, version)`` of a stack, from its provenance's modulefile; None
    when the stack records none.

    As root the record is the stack's owner's to write, so the directory it names is read only
    where it lies inside the stack, or in a module root on ``MODULEPATH`` that passes the rule
    of :mod:`hpcstack.trust`, or where every user may list it (:func:`_anyone_lists`): else a
    line saying it was not read (str), and nothing of it is listed (a record naming
    ``/root/private/x/y`` used to print a file name from there)."""
    try:
        modulefile = json.loads(read_small(Path(prefix) / ".hpcstack" / "provenance.json") or "{}").get("modulefile")
    except (ValueError, AttributeError, RecursionError):
        return None
    if not modulefile or not isinstance(modulefile, str):
        return None
    path = Path(os.path.normpath(modulefile))
    found = path.parent, path.name[:-len(".lua")] if path.name.endswith(".lua") else path.name
    if not _as_root() or _inside(path.parent.parent, prefix, environ) or _anyone_lists(path.parent):
        return found
    return (f"{prefix}: its record names the modulefile {modulefile}, outside the stack and the trusted module "
            "roots on MODULEPATH: not read (run hpcstack doctor as the stack's owner)")


def _inside(module_root: Path, prefix, environ) -> bool:
    """As root: ``module_root`` (of a stack's record) lies inside the stack (its path as the
    gate resolves it) or is a module root on ``MODULEPATH`` that passes the trust rule."""
    from hpcstack import trust

    if not module_root.is_absolute():
        return False
    stack = _gated(prefix)
    if os.path.commonpath([stack, _gated(module_root)]) == stack:
        return True
    roots = [os.path.normpath(d) for d in ((os.environ if environ is None else environ).get("MODULEPATH") or "").split(":")
             if d.startswith("/")]
    return str(module_root) in roots and trust.path_problem(str(module_root), trust.policy()) is None


def _anyone_lists(module_dir: Path) -> bool:
    """Every user may list ``module_dir`` (``<module root>/<name>``) themselves: each directory
    from ``/`` to it, as resolved, searchable by others and the last one readable by them, so
    reading it as root tells the stack's owner nothing they could not see (a shared module root
    such as /opt/hpcstack/modulefiles, 0755 all the way; not a 0700 directory of root's)."""
    real = os.path.realpath(module_dir)
    parts = Path(real).parts
    for i in range(1, len(parts) + 1):
        try:
            st = os.stat(os.path.join(*parts[:i]))
        except OSError:
            return False
        need = 0o005 if i == len(parts) else 0o001
        if not stat.S_ISDIR(st.st_mode) or st.st_mode & need != need:
            return False
    return True


def _version_key(version: str):
    """Sort key of a module version: PEP 440 where it parses (``2.14.1-gpu`` as ``2.14.1``), else
    digit runs as numbers, as the module tools compare versions."""
    head = re.match(r"[0-9]+(?:\.[0-9]+)*", version)
    return [int(x) for x in head.group(0).split(".")] if head else [], version


def default_version(module_dir: Path) -> tuple[str | None, str]:
    """The version ``module load <name>`` picks in ``module_dir`` and why.

    Returns:
        tuple[str | None, str]: (version or None when the directory has no modulefile, "the
        default" where hpcstack's default file names it, else "the highest version", the
        module tools' choice without a default: Environment Modules' and Lmod's documented rule).
    """
    for name, pattern in DEFAULT_FILES.items():
        text = read_small(module_dir / name)
        m = pattern.search(text) if text is not None else None
        if m:
            return m.group(1), "the default"
    versions = [n[:-len(".lua")] if n.endswith(".lua") else n
                for n, regular in (_list_dir(module_dir) or []) if not n.startswith(".") and regular]
    if not versions:
        return None, ""
    return max(versions, key=_version_key), "the highest version"


def stack_version_lines(stacks, environ=None) -> list[str]:
    """One line per stack saying which module it is and, when ``module load <name>`` now loads
    another version, which one: a venv extended against a stack keeps loading that stack (its
    activate script names the full version), so its owner should know when the site's default
    has moved on (to rebuild the venv on the new one when they choose)."""
    out = []
    for prefix in stacks:
        found = _module_of(prefix, environ)
        if not found or isinstance(found, str):
            continue        # deprecated_stack_lines says why (the record names a place not read)
        module_dir, version = found
        name = module_dir.name
        default, why = default_version(module_dir)
        if default is None or default == version:
            out.append(f"on {name}/{version}, which `module load {name}` loads ({why})" if default
                       else f"on {name}/{version}")
            continue
        newer = _version_key(default) > _version_key(version)
        out.append(f"on {name}/{version}; `module load {name}` now loads {name}/{default} ({why}"
                   f"{', newer' if newer else ', older'}): this venv stays on {name}/{version}; to move, "
                   f"rebuild it: module load {name}/{default}; python -m venv NEWVENV; "
                   f"extend-venv-activate NEWVENV")
    return out


#: The most bytes of a venv's ``bin/activate``, a stand-in modulefile or a deprecation record
#: that :func:`retired_stack_lines` reads.
MAX_RETIRED_READ = 4 << 20


def _read_checked(path: str, pol) -> str | None:
    """The text of ``path`` read through the gate (:func:`hpcstack.gate.read_file`: links on the
    way followed only where trusted accounts alone can have put them, every component from ``/``
    opened without following one, a regular file by ``fstat`` (a FIFO neither blocks nor is
    read), that only accounts ``pol`` trusts can change, at most :data:`MAX_RETIRED_READ`
    bytes); None when it is missing, unreadable or refused."""
    from hpcstack import gate
    from hpcstack.errors import HpcstackError

    try:
        return gate.read_file(gate.resolved(path, pol), MAX_RETIRED_READ, pol).decode("utf-8", "replace")
    except (OSError, HpcstackError):
        return None


def retired_stack_lines(venv: Path, environ) -> list[str]:
    """For a venv extended (``extend-venv-activate``) against a stack that is gone: one line
    naming the replacement and how to rebuild the venv on it; empty when its stack is not known
    to be retired (the module roots of ``MODULEPATH`` are searched for the record).

    It runs before the venv is checked (no stack is known yet), so what it reads, the venv's
    ``bin/activate``, each module root's deprecation record and stand-in modulefiles, is read
    through the gate (:func:`_read_checked`), trusting whom :func:`hpcstack.trust.policy`
    trusts: as root, a user's venv is not read (nothing is said about it here), and a FIFO or a
    link put in place of those files is never read or followed.

    Args:
        venv (Path): the venv (absolute).
        environ (Mapping): the environment (its ``MODULEPATH``).

    Returns:
        list[str]: the lines (empty: not retired, or nothing could be read).

    Raises:
        ConfigError: the system configuration of :mod:`hpcstack.trust` is not root's (exit 2).
    """
    try:
        from hpcstack import trust
    except ImportError:  # standalone (<prefix>/bin/hpcstack-doctor): it names its own stack, so not reached
        return []
    pol = trust.policy()
    text = _read_checked(str(venv / "bin" / "activate"), pol)
    if text is None:
        return []
    modules = re.findall(r"^[ \t]*# >>> hpcstack (\S+) >>>", text, re.M)
    out, records = [], {}
    for module in dict.fromkeys(modules):
        if module.startswith("/") or ".." in module.split("/"):
            continue  # NAME/VERSION only: nothing outside the module roots is read
        for root in [d for d in environ.get("MODULEPATH", "").split(":") if d]:
            if root not in records:
                raw = _read_checked(os.path.join(root, DEPRECATIONS), pol)
                try:
                    records[root] = json.loads(raw or "{}").get("modules") or {}
                except (ValueError, AttributeError):
                    records[root] = {}
            entry = records[root].get(module)
            if not isinstance(entry, dict):
                continue
            stand_in = next((t for t in (_read_checked(os.path.join(root, module + suffix), pol)
                                         for suffix in ("", ".lua")) if t is not None), None)
            if stand_in is None or "Written by hpcstack uninstall" not in stand_in[:300]:
                continue  # not retired here: the module still loads (or is not hpcstack's)
            site_packages = next(iter(sorted(venv.glob("lib/python*/site-packages"))), venv / "lib")
            repl = entry.get("replacement") or "another stack"
            out.append(f"{_line(module, entry, retired=True)}; rebuild this venv on it: module load {repl}; "
                       f"python -m venv NEWVENV; extend-venv-activate NEWVENV; then pip install again what "
                       f"`pip freeze --path {site_packages}` lists")
            break
    return out


def run(venv: str | None, stack: list[str] | None, environ=None) -> tuple[list[str], list[str]]:
    """``hpcstack doctor``: resolve the venv and stacks, then :func:`check`.

    Args:
        venv (str | None): ``--venv``; default ``VIRTUAL_ENV``.
        stack (list[str] | None): ``--stack`` prefixes; default the loaded modules' ``HPCSTACK_*_ROOT``.
        environ (Mapping | None): the environment (default ``os.environ``).

    Without a venv it checks the user site of the stacks' Python (:func:`check_user_site`).

    Returns:
        tuple[list[str], list[str]]: (problems, [a header line naming what was checked, the
        line that says what "ok" means, then notes: which stack the venv is on and whether
        ``module load NAME`` now loads another version (:func:`stack_version_lines`)]).

    Raises:
        ConfigError: no stack given or found, a venv or stack that is not a directory (exit 2).
    """
    environ = os.environ if environ is None else environ
    errors = []
    venv = venv or environ.get("VIRTUAL_ENV")
    if venv and not os.path.isdir(venv):
        errors.append(f"--venv {venv}: no such directory")
    stacks = [Path(s) for s in stack] if stack else stack_prefixes(environ)
    if not stacks and venv and os.path.isdir(venv) and not errors:
        gone = retired_stack_lines(Path(os.path.abspath(venv)), environ)
        if gone:  # the venv's stack is gone: say what to use instead, and how to rebuild on it
            return gone, [f"checked {os.path.abspath(venv)}: its stack is gone"]
    if not stacks:
        errors.append("no stack: load its module (HPCSTACK_<NAME>_ROOT) or give --stack PREFIX")
    for s in stacks:
        if not (s / "venv").is_dir():
            errors.append(f"--stack {s}: not a stack prefix (no venv/ in it)")
    if errors:
        raise ConfigError(errors)
    if not venv:
        return check_user_site(stacks)
    venv_path = Path(os.path.abspath(venv))
    problems = deprecated_stack_lines(stacks, environ) + check(venv_path, stacks)
    header = f"checked {venv_path} on top of {', '.join(map(str, stacks))}"
    return problems, [header, "nothing shadows or conflicts with the stack, no user-site packages",
                      *stack_version_lines(stacks, environ)]


def check_user_site(stacks: list[Path]) -> tuple[list[str], list[str]]:
    """No venv: the user site (``~/.local/lib/pythonX.Y/site-packages``, or under
    ``PYTHONUSERBASE``) of each stack's Python.

    Returns:
        tuple[list[str], list[str]]: as :func:`run`.

    Raises:
        ConfigError: a stack's python is missing or fails.
    """
    problems, sites = [], []
    for prefix in stacks:
        info = probe_venv(prefix / "venv")
        if info["user_site"] in sites:
            continue
        sites.append(info["user_site"])
        known = distributions(stack_site_packages(prefix))
        problems += user_site_problems(info["user_site"], known)
    header = (f"no venv active; checked the user site {', '.join(sites)} of "
              f"{', '.join(map(str, stacks))}")
    return problems, [header, "nothing there (packages of your own go into a venv: "
                              "python -m venv DIR && extend-venv-activate DIR)"]


def main(argv=None) -> int:
    """``hpcstack-doctor [--venv DIR] [--stack PREFIX]``, the copy in a stack's ``bin/``: as
    ``hpcstack doctor``, the stack defaulting to the one the script lives in.

    Returns:
        int: 0 clean, 1 problems (one line each on stdout), 2 bad input (one ``error:`` line each).
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog=SCRIPT, description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", metavar="DIR", help="the venv (default: the active one, VIRTUAL_ENV)")
    parser.add_argument("--stack", metavar="PREFIX", action="append",
                        help="a stack prefix (default: the stack this script belongs to)")
    args = parser.parse_args(argv)
    if Requirement is None:
        print(f"{SCRIPT}: error: needs the 'packaging' distribution (or pip, which carries a copy) "
              "in the stack; this stack has neither", file=sys.stderr)
        return 2
    own = Path(os.path.abspath(__file__)).parent.parent
    try:
        problems, header = run(args.venv, args.stack or [str(own)])
    except ConfigError as exc:
        for line in exc.lines():
            print(f"{SCRIPT}: error: {line}", file=sys.stderr)
        return 2
    return report(problems, header)


def report(problems: list[str], header: list[str]) -> int:
    """Print what :func:`run` found, as ``hpcstack doctor`` and ``hpcstack-doctor`` both do: one line
    per problem, then a ``note:`` line for each of ``header[2:]`` (which stack, and whether ``module
    load NAME`` now loads another), then ``ok: …`` on stdout when clean, else the count on stderr.

    Args:
        problems (list[str]): the problem lines of :func:`run`.
        header (list[str]): :func:`run`'s header: what was checked, the verdict text, then notes.

    Returns:
        int: the exit status, 0 clean, 1 problems.
    """
    import sys

    for line in problems:
        print(line)
    for line in header[2:]:
        print(f"note: {line}")
    if not problems:
        print(f"ok: {header[0]}: {header[1]}")
        return 0
    print(f"{len(problems)} problem(s): {header[0]}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
