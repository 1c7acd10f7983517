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

from hpcstack import __version__
from hpcstack.fsutil import current_user, sha256_file, write_atomic
from hpcstack.install.plan import Plan
from hpcstack.schema import CONTROL

#: The files ``hpcstack show`` prints in full, in this order (the others it lists).
SHOWN_IN_FULL = ("check-build.txt", "pip-freeze.txt")


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
    """Collect what a build records about itself.

    Args:
        build_dir (Path): the build's real directory (a stage prefix).
        prefix (Path | None): the stable prefix it was reached by, if any.

    Returns:
        dict: ``provenance`` (the record, or None), ``steps`` (name → record), ``files``
        (name → path of each provenance file present), ``build_dir``, ``prefix``.
    """
    state = build_dir / ".hpcstack"
    record = read_json(state / "provenance.json")
    if not isinstance(record, dict):
        record = None
    steps = {}
    for path in sorted((state / "steps").glob("*.json")) if _plain_dir(state / "steps") else []:
        step = read_json(path)
        steps[path.stem] = step if isinstance(step, dict) else {"step": path.stem, "unreadable": True}
    files = {}
    for name in ("provenance.json", "plan.json", "install.sh", "site.yaml", "site.json",
                 "pip-freeze.txt", "check-build.txt", "timings.json", "constraints.txt", "sbom.cdx.json", "audit.cdx.json"):
        if _plain_file(state / name):
            files[name] = str(state / name)
    if _plain_dir(state / "recipe"):
        for top, dirs, names in os.walk(state / "recipe"):  # links are not followed
            for n in sorted(names):
                path = Path(top, n)
                if _plain_file(path):
                    files[f"recipe/{path.relative_to(state / 'recipe')}"] = str(path)
    for path in sorted((state / "logs").glob("*.log")) if _plain_dir(state / "logs") else []:
        if _plain_file(path):
            files[f"logs/{path.name}"] = str(path)
    return {"build_dir": str(build_dir), "prefix": str(prefix) if prefix else None,
            "provenance": record, "steps": steps, "files": files}


def _plain_file(path: Path) -> bool:
    """A regular file, not reached through a symbolic link of its own (``show`` reads only
    what the build holds, never a file a link in a user's directory points at)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def read_recorded(path: str | Path, limit: int = 64 << 20) -> str:
    """The text of a recorded file, opened without following a link (at most ``limit`` bytes).

    Raises:
        OSError: it cannot be read, or it is a link (``ELOOP``).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return f.read(limit).decode(errors="replace")


def read_json(path: Path) -> object:
    """A recorded JSON file's content, None when missing, a link or not JSON."""
    try:
        return json.loads(read_recorded(path))
    except (OSError, ValueError, RecursionError):
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
