"""Provenance: what a stack records about how it was made, in ``<stage prefix>/.hpcstack/``.

==========================  ==========================================================
``provenance.json``         hpcstack version, when, who, where, the command line, the
                            recipe and site (file and sha256), the build id and paths
``plan.json``               the resolved plan (:meth:`hpcstack.install.plan.Plan.to_json`)
``install.sh``              the same plan as a bash script (what ``--dry-run`` prints)
``recipe/``                 the recipe file as used, with its lock file and patches
``site.yaml``               the site config file as used
``site.json``               the site config as used, with ``--prefix``/``--module-root`` applied
``steps/<step>.json``       each completed step: hash of its inputs, seconds, when
``logs/<step>.log``         each step's output
``pip-freeze.txt``          ``uv pip freeze`` (``pip freeze --all`` with the pip backend) of the stack's venv
``check-build.txt``         Horovod's build flags as ``horovodrun --check-build`` prints them (sanity check)
``timings.json``            seconds per step, summed over the runs that made the build
``constraints.txt``         every pin of the stack (``PIP_CONSTRAINT``/``UV_CONSTRAINT``;
                            :mod:`hpcstack.install.components.manifest`)
``sbom.cdx.json``           the stack as a CycloneDX 1.6 SBOM (JSON): packages, sdists and
                            patches with hashes, the build environment's compilers, MPI, CUDA, NCCL
==========================  ==========================================================

``hpcstack show PREFIX`` or ``hpcstack show NAME/VERSION --site S`` prints them.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import sys
import time
from pathlib import Path

from hpcstack import __version__, gate, trust
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import current_user, sha256_file, write_atomic
from hpcstack.install.plan import Plan
from hpcstack.schema import CONTROL

#: The files ``hpcstack show`` prints in full, in this order (the others it lists).
SHOWN_IN_FULL = ("check-build.txt", "pip-freeze.txt")

#: The most bytes of a recorded file that ``show`` reads; a larger one is refused, not cut.
MAX_RECORDED = 64 << 20

#: The provenance files ``show`` lists (besides ``recipe/`` and ``logs/``).
RECORDED = ("provenance.json", "plan.json", "install.sh", "site.yaml", "site.json", "pip-freeze.txt",
            "check-build.txt", "timings.json", "constraints.txt", "sbom.cdx.json", "audit.cdx.json")

#: Whom ``show`` reads a build of: anyone's (a user shows their own stack, root a group's), so
#: the gate's walk is used without its owner rule: every component from ``/`` to the file
#: opened without following a link, the file a regular one (:func:`read_recorded`).
_ANY_OWNER = trust.Policy(uid=os.geteuid(), trust_writable=True)


def recipe_inputs(plan: Plan) -> list[str]:
    """Files of the recipe the plan reads: every action's :meth:`~hpcstack.install.actions.Action.inputs`
    (lock files, verified patches, scripts), nested actions' included, each once, in order."""
    return list(dict.fromkeys(p for step in plan.steps for action in step.actions for p in action.inputs()))


def record_inputs(plan: Plan, recipe_file: Path, site, argv: list[str] | None = None) -> Path:
    """Write the plan, recipe, site config and provenance record into the build's ``.hpcstack``.

    Called before the steps run (every run that has steps to do), so an interrupted build
    already says what it was built from.

    Args:
        plan (Plan): the resolved plan.
        recipe_file (Path): the recipe file.
        site (hpcstack.site.Site): the site as loaded.
        argv (list[str] | None): the command line (default ``sys.argv``).

    Returns:
        Path: the ``.hpcstack`` directory.

    Raises:
        OSError: the directory cannot be written (the caller reports it).
    """
    state = Path(plan.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    write_atomic(state / "plan.json", plan.to_json(__version__))
    write_atomic(state / "install.sh", plan.to_bash(__version__), 0o644)
    recipe_dir = state / "recipe"
    if recipe_dir.exists():
        shutil.rmtree(recipe_dir)
    recipe_dir.mkdir()
    shutil.copy2(recipe_file, recipe_dir / recipe_file.name)
    copied = {}
    for name in recipe_inputs(plan):
        src = Path(name)
        if not src.is_file():
            continue
        try:
            rel = src.resolve().relative_to(recipe_file.resolve().parent)
        except ValueError:
            rel = Path(src.name)
        (recipe_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, recipe_dir / rel)
        copied[str(rel)] = sha256_file(src)
    try:
        write_atomic(state / "site.yaml", site.path.read_text())
    except OSError:
        pass
    used = {**site.raw, "install_root": site.install_root, "module_root": site.module_root,
            "cache_dir": site.cache_dir, "stage_root": site.stage_root}
    write_atomic(state / "site.json", json.dumps(used, indent=1, default=str) + "\n")
    record = {
        "hpcstack": __version__,
        "python": sys.version.split()[0],
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "user": current_user(),
        "host": socket.gethostname(),
        "command": ["hpcstack", *(sys.argv[1:] if argv is None else argv)],
        "title": plan.title,
        "recipe": {"file": str(recipe_file), "sha256": sha256_file(recipe_file), "inputs": copied},
        "site": {"name": site.name, "file": str(site.path),
                 "sha256": sha256_file(site.path) if site.path.is_file() else None},
        "prefix": plan.prefix,
        "stage_prefix": plan.build_prefix,
        "build_id": plan.build_id,
        "modulefile": plan.modulefile,
    }
    from hpcstack.install.batch import job_record

    job = job_record()      # built in the job step of build.batch_job: which job, which node
    if job:
        record["batch_job"] = job
    write_atomic(state / "provenance.json", json.dumps(record, indent=1) + "\n")
    return state


def record_timings(plan: Plan, timings: dict[str, float]) -> None:
    """Add this run's seconds per step to ``timings.json`` (a resumed build sums its runs)."""
    path = Path(plan.state_dir) / "timings.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        old = {}
    seconds = old.get("seconds", {}) if isinstance(old, dict) else {}
    runs = old.get("runs", 0) if isinstance(old, dict) else 0
    for step, value in timings.items():
        seconds[step] = round(seconds.get(step, 0) + value, 1)
    doc = {"hpcstack": __version__, "runs": runs + 1, "seconds": seconds,
           "total": round(sum(seconds.values()), 1)}
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def describe(build_dir: Path, prefix: Path | None = None) -> dict:
    """Collect what a build records about itself, reading only what the build holds: its
    directory (as resolved: ``hpcstack show DIR`` may name a prefix that links to it) is opened,
    and everything below it by descriptor, each component opened with ``O_NOFOLLOW`` relative to
    the one above (``openat(2)``). A link at ``.hpcstack`` is refused; a link at ``steps``,
    ``logs``, ``recipe`` or at an entry in them is not followed (a file that is a link is not
    listed; a step's record that is one is listed as unreadable). The paths returned are read
    again with :func:`read_recorded`, which follows no link from ``/`` down.

    Args:
        build_dir (Path): the build's directory (a stage prefix), or a link to it.
        prefix (Path | None): the stable prefix it was reached by, if any.

    Returns:
        dict: ``provenance`` (the record, or None), ``steps`` (name → record), ``files``
        (name → path of each provenance file present, below the resolved build directory),
        ``build_dir``, ``prefix``.

    Raises:
        ConfigError: ``.hpcstack`` in it is a symbolic link or not a directory (one line, exit
            status 2): what it points at is not this build's record.
    """
    real = Path(os.path.realpath(build_dir))
    state = real / ".hpcstack"
    info = {"build_dir": str(build_dir), "prefix": str(prefix) if prefix else None,
            "provenance": None, "steps": {}, "files": {}}
    try:
        top = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return info
    try:
        sfd = _open_below(top, ".hpcstack")
        if sfd is None:
            what = _kind_at(top, ".hpcstack")
            if what in ("a symbolic link", "not a directory"):
                raise ConfigError([f"{Path(build_dir) / '.hpcstack'}: {what}; hpcstack show reads only what "
                                   "the build holds, never what a link in it points at (show the build's "
                                   "real directory)"])
            return info
    finally:
        os.close(top)
    try:
        record = _json_at(sfd, "provenance.json")
        info["provenance"] = record if isinstance(record, dict) else None
        steps_fd = _open_below(sfd, "steps")
        if steps_fd is not None:
            try:
                for name in sorted(n for n in _names(steps_fd) if n.endswith(".json") and not n.startswith(".")):
                    step = _json_at(steps_fd, name)      # a link: not followed, listed as unreadable
                    stem = name[:-len(".json")]
                    info["steps"][stem] = step if isinstance(step, dict) else {"step": stem, "unreadable": True}
            finally:
                os.close(steps_fd)
        files = info["files"]
        for name in RECORDED:
            if _kind_at(sfd, name) == "a regular file":
                files[name] = str(state / name)
        for rel in _regular_files_below(sfd, "recipe"):
            files[f"recipe/{rel}"] = str(state / "recipe" / rel)
        logs_fd = _open_below(sfd, "logs")
        if logs_fd is not None:
            try:
                for name in sorted(n for n in _names(logs_fd) if n.endswith(".log") and not n.startswith(".")):
                    if _kind_at(logs_fd, name) == "a regular file":
                        files[f"logs/{name}"] = str(state / "logs" / name)
            finally:
                os.close(logs_fd)
    finally:
        os.close(sfd)
    return info


def _open_below(dir_fd: int, name: str) -> int | None:
    """A descriptor of the directory ``name`` of ``dir_fd`` (``O_DIRECTORY|O_NOFOLLOW``), or None
    when it is missing, a link or not a directory."""
    try:
        return os.open(name, gate.DIR_READ, dir_fd=dir_fd)
    except OSError:
        return None


def _kind_at(dir_fd: int, name: str) -> str | None:
    """What the entry ``name`` of ``dir_fd`` is, by ``lstat``: ``"a regular file"``, ``"a
    symbolic link"``, ``"a directory"``, ``"not a directory"`` (anything else); None when missing."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a directory" if stat.S_ISDIR(mode) else "not a directory"


def _names(dir_fd: int) -> list[str]:
    try:
        return os.listdir(dir_fd)
    except OSError:
        return []


def _read_at(dir_fd: int, name: str, limit: int = MAX_RECORDED) -> bytes:
    """The content of the regular file ``name`` of ``dir_fd``, opened ``O_NOFOLLOW|O_NONBLOCK``;
    as root, with one hard link only.

    Raises:
        OSError: missing, a link (``ELOOP``), not a regular file, larger than ``limit``, or (as
            root) more than one hard link.
    """
    fd = os.open(name, gate.FILE_READ, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise OSError(errno.EINVAL, "not a regular file" if not stat.S_ISREG(st.st_mode)
                          else f"larger than {limit} bytes", name)
        if st.st_nlink > 1 and os.geteuid() == 0:   # as read_recorded: not another file linked here
            raise OSError(errno.EINVAL, f"has {st.st_nlink} hard links", name)
        chunks, left = [], limit + 1
        while left > 0 and (block := os.read(fd, min(left, 1 << 20))):
            chunks.append(block)
            left -= len(block)
        return b"".join(chunks)[:limit]
    finally:
        os.close(fd)


def _json_at(dir_fd: int, name: str) -> object:
    """A recorded JSON file of ``dir_fd``'s, None when missing, a link or not JSON."""
    try:
        return json.loads(_read_at(dir_fd, name))
    except (OSError, ValueError, RecursionError):
        return None


def _regular_files_below(dir_fd: int, name: str, limit: int = 20000) -> list[str]:
    """The regular files below the directory ``name`` of ``dir_fd``, as paths relative to it,
    sorted; each directory opened ``O_DIRECTORY|O_NOFOLLOW`` relative to its parent (a link is
    neither entered nor listed); at most ``limit`` of them."""
    found: list[str] = []
    first = _open_below(dir_fd, name)
    if first is None:
        return found
    todo = [(first, "")]
    try:
        while todo and len(found) < limit:
            fd, rel = todo.pop()
            try:
                for entry in sorted(_names(fd)):
                    kind = _kind_at(fd, entry)
                    path = f"{rel}{entry}"
                    if kind == "a regular file":
                        found.append(path)
                    elif kind == "a directory":
                        sub = _open_below(fd, entry)
                        if sub is not None:
                            todo.append((sub, path + "/"))
            finally:
                os.close(fd)
    finally:
        for fd, _ in todo:
            os.close(fd)
    return sorted(found[:limit])


def read_recorded(path: str | Path, limit: int = MAX_RECORDED) -> str:
    """The text of a recorded file (a path :func:`describe` returned), read through the gate
    (:func:`hpcstack.gate.read_file`) without its owner rule: every component from ``/`` down
    opened without following a link, the file itself a regular file of at most ``limit`` bytes;
    as root, with one hard link only (a user's hard link to a root-only file in their ``DIR`` is
    not shown).

    Raises:
        OSError: it cannot be read.
        hpcstack.gate.GateError: a link on the way or at the file, not a regular file, larger
            than ``limit``, or (as root) more than one hard link (one line).
    """
    path = os.path.abspath(path)
    return gate.read_file(path, limit, _ANY_OWNER, one_link=os.geteuid() == 0).decode(errors="replace")


def read_json(path: Path) -> object:
    """A recorded JSON file's content, None when missing, a link (anywhere on its path) or not JSON."""
    try:
        return json.loads(read_recorded(path))
    except (OSError, ValueError, RecursionError, HpcstackError):
        return None


def shown(text: str, keep: str = "") -> str:
    """``text`` with every control character (:data:`hpcstack.schema.CONTROL`: escape sequences
    that would drive the terminal, carriage returns that hide a line, a newline inside one
    value) written as its escape, as hpcstack's error lines do; the characters of ``keep``
    (``"\\n\\t"`` for a file printed whole) are left as they are."""
    return CONTROL.sub(lambda m: m.group() if m.group() in keep else ascii(m.group())[1:-1], text)


def _audited_line(info: dict) -> str:
    """``audited: WHEN: N known vulnerabilities (SOURCE)`` from ``audit.cdx.json`` (written by
    ``hpcstack audit --stack``), or ``audited: never`` with the command that does it."""
    doc = read_json(Path(info["files"]["audit.cdx.json"])) if "audit.cdx.json" in info["files"] else None
    if not isinstance(doc, dict):
        return f"audited:       never (hpcstack audit --stack {info['prefix'] or info['build_dir']} --db DIR)"
    meta = _field(doc, "metadata", default={})
    props = {_field(p, "name"): _field(p, "value") for p in _list(meta, "properties")}
    n = len(_list(doc, "vulnerabilities"))
    return (f"audited:       {_field(meta, 'timestamp')}: "
            f"{n or 'no'} known vulnerabilit{'y' if n == 1 else 'ies'} ({props.get('hpcstack:audit-source')})")


def _field(doc: object, key: str, default: object = None) -> object:
    """``doc[key]`` when ``doc`` is a mapping that has it (a record written by someone else may
    hold anything), else ``default``."""
    return doc.get(key, default) if isinstance(doc, dict) else default


def _list(doc: object, key: str) -> list:
    value = _field(doc, key, [])
    return value if isinstance(value, list) else []


def render(info: dict, order: list[str] | None = None) -> str:
    """Render :func:`describe`'s result for a terminal.

    Args:
        info (dict): from :func:`describe`.
        order (list[str] | None): step names in plan order (default: as recorded).
    """
    rec = info["provenance"] if isinstance(info["provenance"], dict) else {}
    recipe, site = _field(rec, "recipe", {}), _field(rec, "site", {})
    lines = []
    title = rec.get("title") or info["build_dir"]
    lines.append(f"==> {title}")
    if info["prefix"] and info["prefix"] == info["build_dir"]:
        lines.append(f"prefix:        {info['prefix']} (a build directory itself: the layout before staging)")
    elif info["prefix"]:
        lines.append(f"prefix:        {info['prefix']} -> {info['build_dir']}")
    else:
        lines.append(f"build:         {info['build_dir']}")
    if rec:
        lines += [
            f"built by:      hpcstack {rec.get('hpcstack')} (python {rec.get('python')}), "
            f"{rec.get('user')}@{rec.get('host')}, {rec.get('recorded')}",
            f"command:       {' '.join(str(w) for w in _list(rec, 'command'))}",
            f"recipe:        {_field(recipe, 'file')} (sha256 {str(_field(recipe, 'sha256'))[:16]}…)",
            f"site:          {_field(site, 'name')} ({_field(site, 'file')})",
            f"modulefile:    {rec.get('modulefile')}",
            f"build id:      {rec.get('build_id') or '(built in place)'}",
        ]
        inputs = _field(recipe, "inputs", {})
        for name, sha in sorted((inputs if isinstance(inputs, dict) else {}).items()):
            lines.append(f"recipe input:  {name} (sha256 {str(sha)[:16]}…)")
    if "sbom.cdx.json" in info["files"]:
        lines.append(f"sbom:          {info['files']['sbom.cdx.json']} (CycloneDX 1.6 JSON)")
    lines.append(_audited_line(info))
    if "constraints.txt" in info["files"]:
        lines.append(f"constraints:   {info['files']['constraints.txt']} (PIP_CONSTRAINT, UV_CONSTRAINT)")
    names = order or list(info["steps"])
    lines.append("steps:")
    for name in names:
        s = info["steps"].get(name)
        if isinstance(s, dict) and s and not s.get("unreadable"):
            lines.append(f"  {name:<12} done   {s.get('seconds', '?'):>7} s  {s.get('finished', '')}  "
                         f"hash {str(s.get('hash'))[:12]}")
        else:
            lines.append(f"  {name:<12} not done")
    lines.append("files:")
    for name, path in info["files"].items():
        lines.append(f"  {name:<22} {path}")
    lines = [shown(line) for line in lines]   # one line each, whatever a record holds
    for name in SHOWN_IN_FULL:
        if name in info["files"]:
            lines.append(f"==> {name}")
            try:
                text = read_recorded(info["files"][name])
            except OSError:
                text = "(unreadable)"
            lines.append(shown(text.rstrip("\n"), keep="\n\t"))
    return "\n".join(lines) + "\n"
