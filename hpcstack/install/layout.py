"""The builds of one stack: stage prefixes, atomic publish, resume and clean-up (uninstall:
:mod:`hpcstack.install.records`).

A venv cannot be moved once made (its scripts and ``pyvenv.cfg`` hold absolute paths), so a
stack is never built where users see it. Each build gets its own real directory, the *stage
prefix*, beside the stack's prefix, and the prefix is a symbolic link to the published one::

    <install_root>/pytorch/2.3.1-gpu -> .2.3.1-gpu-3f9c0a1b2c4d             the prefix (stable path)
    <install_root>/pytorch/.2.3.1-gpu-3f9c0a1b2c4d/                         a build: venv/ bin/ .hpcstack/
    <install_root>/.hpcstack/state/pytorch-2.3.1-gpu.json                   build in progress, build replaced
    <install_root>/.hpcstack/locks/pytorch-2.3.1-gpu.lock                   one install at a time

A build sits at the depth of the prefix, so the real path of a file of the stack has as many
components as its path through the prefix: torch resolves the real path of every module it
loads (``os.path.realpath``, one ``lstat`` per component), and a build deeper than the prefix
made 688 x 3 extra metadata calls per ``import torch`` (docs/benchmarks.md). Builds
made by earlier versions of hpcstack, under ``<install_root>/<name>/.builds/<version>/<id>``,
are still found, resumed, kept as the previous build and removed.

The module step publishes a complete build by renaming a new link over the old one (atomic),
then writes the modulefile atomically; the modulefile names the stable prefix, so it is the same
text for every build and a user's venv made on the stack (``pyvenv.cfg`` ``home``) survives a
rebuild. While a new build runs, the published one and its module stay as they were.

Build ids are the first 12 hex digits of the sha256 of the plan (resolved with a placeholder
stage prefix), so a dry run prints the paths the real run uses; a rebuild of an identical plan
(``--force``) gets ``<id>-2``. The state file names the build in progress, so a re-run after a
crash resumes it (the runner skips its completed steps) even when the plan has changed since.

After a successful publish hpcstack keeps the published build and the one it replaced (jobs
started before the switch still run from it, and an admin can roll back by pointing the link at
it), and removes every other build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import write_atomic
from hpcstack.install import image
from hpcstack.install.actions import PRE_STAGING, describe_os_error
from hpcstack.install.plan import IN_PLACE_STEPS, Plan, data_neutral
from hpcstack.install.runner import pending_steps

__all__ = ["PRE_STAGING", "StackLayout", "Choice", "choose", "start", "finish", "default_marker"]


#: The directory of hpcstack's own files: in an install root (state, locks, caches, stage dirs)
#: and in every build (provenance, logs, step records).
STATE_DIR = ".hpcstack"


class StackLayout:
    """Every path of one stack: the one place that knows them.

    The prefix ``<install_root>/<name>/<version>`` (projection ``{name}/{version}``), its builds
    ``<install_root>/<name>/.<version>-<id>`` beside it (those of earlier hpcstack versions in
    ``<install_root>/<name>/.builds/<version>/<id>``: :attr:`legacy_builds_dir`), the state and lock files under
    ``<install_root>/.hpcstack/``, and, for a layout made with :meth:`for_site`, the stage dir
    ``<stage_root>/<name>-<version>`` and the modulefile ``<module_root>/<name>/<version>[.lua]``.

    Args:
        install_root (str): the site's install root (or ``--prefix``).
        name, version (str): the stack, e.g. ``"pytorch"``, ``"2.3.1-gpu"``.
        stage_dir (str | None): scratch directory of its builds (sources, the build tree).
        modulefile (str | None): its modulefile.
        site (str | None): the site installing it: part of the build identity; the state records
            which site published the prefix, and another site's install does not silently
            replace it (:func:`choose`).

    Example:
        ``StackLayout("/opt/hpcstack/software", "pytorch", "2.3.1-gpu").published()``
    """

    def __init__(self, install_root: str, name: str, version: str, stage_dir: str | None = None,
                 modulefile: str | None = None, site: str | None = None):
        self.install_root = os.path.abspath(install_root)
        self.name = name
        self.version = version
        self.top = os.path.join(self.install_root, name)
        self.prefix = os.path.join(self.top, version)
        #: where the builds are: beside the prefix, ``<top>/.<version>-<id>``
        self.builds_dir = self.top
        #: where earlier versions of hpcstack put them, ``<top>/.builds/<version>/<id>``
        self.legacy_builds_dir = os.path.join(self.top, ".builds", version)
        self._build_re = re.compile(rf"\.{re.escape(version)}-([0-9a-f]{{12}}(?:-[0-9]+)?|{PRE_STAGING})")
        self.state_file = os.path.join(self.install_root, STATE_DIR, "state", f"{name}-{version}.json")
        self.lock_file = os.path.join(self.install_root, STATE_DIR, "locks", f"{name}-{version}.lock")
        self.stage_dir = stage_dir
        self.modulefile = modulefile
        self.site = site

    @classmethod
    def for_site(cls, site, name: str, version: str) -> "StackLayout":
        """The layout of stack ``name/version`` at ``site`` (its install, stage and module roots,
        and its modulefile syntax)."""
        from hpcstack.modules.writer import modulefile_path

        return cls(site.install_root, name, version,
                   stage_dir=os.path.join(site.stage_root, f"{name}-{version}"),
                   modulefile=modulefile_path(site.module_root, name, version, site.modules.syntax),
                   site=site.name)

    def provenance_dir(self, build: str) -> str:
        """``<build>/.hpcstack``: what a build records about itself."""
        return os.path.join(build, STATE_DIR)

    def build_path(self, build_id: str) -> str:
        """The stage prefix of build ``build_id``: ``<top>/.<version>-<id>``, or the build's
        directory under :attr:`legacy_builds_dir` where only that one exists."""
        path = os.path.join(self.top, f".{self.version}-{build_id}")
        legacy = os.path.join(self.legacy_builds_dir, build_id)
        if not os.path.lexists(path) and os.path.lexists(legacy):
            return legacy
        return path

    def published(self) -> str | None:
        """The build the prefix points at (the prefix itself for the layout before staging), or
        None when nothing is published: no link, a dangling one, or a link to anything but a
        build directory of this stack in the install root (``<top>/.<version>-<id>``, or a
        legacy ``<top>/.builds/<version>/<id>``) that is a real directory, not a link: what the
        prefix names is mounted on and read back as root (:meth:`foreign_link` says what it
        names instead)."""
        if os.path.islink(self.prefix):
            target = os.path.normpath(os.path.join(self.top, os.readlink(self.prefix)))
            if self.foreign_link():
                return None
            return target if os.path.isdir(target) and not os.path.islink(target) else None
        if os.path.isdir(self.prefix):
            return self.prefix
        return None

    def foreign_link(self) -> str | None:
        """Where the prefix's link points when that is not a build of this stack in the install
        root (``/etc``, ``../../other``, another stack's build), else None."""
        try:
            link = os.readlink(self.prefix)
        except OSError:
            return None
        target = os.path.normpath(os.path.join(self.top, link))
        return None if self.id_of(target) else target

    def id_of(self, path: str | None) -> str:
        """The build id of a stage prefix (``""`` for the prefix itself, None, or another path)."""
        if not path:
            return ""
        parent, base = os.path.split(os.path.normpath(path))
        if parent == self.top:
            m = self._build_re.fullmatch(base)
            return m.group(1) if m else ""
        return base if parent == self.legacy_builds_dir else ""

    def builds(self) -> list[str]:
        """Ids of the build directories on disk (both layouts; leftovers of clean-ups excluded)."""
        ids = set()
        for directory, legacy in ((self.top, False), (self.legacy_builds_dir, True)):
            try:
                entries = os.listdir(directory)
            except OSError:
                continue
            for entry in entries:
                if legacy and not entry.startswith("."):
                    ids.add(entry)
                elif not legacy and (m := self._build_re.fullmatch(entry)):
                    ids.add(m.group(1))
        return sorted(ids)

    # -- state file
    def read_state(self) -> dict:
        """The state file: ``building`` (id in progress), ``replaces`` (id it will replace),
        ``previous`` (id kept after the last publish), ``published_for`` (the site whose build
        the prefix points at); missing keys are None."""
        try:
            data = json.loads(Path(self.state_file).read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        return {k: data.get(k) if isinstance(data.get(k), str) else None
                for k in ("building", "replaces", "previous", "published_for")}

    def write_state(self, state: dict) -> None:
        """Write the state file atomically."""
        try:
            write_atomic(Path(self.state_file), json.dumps(state, indent=1) + "\n")
        except OSError as exc:
            raise HpcstackError(f"cannot write {self.state_file}: {describe_os_error(exc)}") from None

    # -- clean-up
    def remove_build(self, build_id: str) -> None:
        """Remove one build: its image unmounted and deleted (``layout: squashfs``), then the
        directory renamed aside (atomic) and deleted."""
        path = self.build_path(build_id)
        if os.path.isdir(path):
            image.release(path)
        if os.path.lexists(path):
            trash = os.path.join(os.path.dirname(path), self._trash_prefix() + f"{build_id}-{os.getpid()}")
            os.rename(path, trash)
            shutil.rmtree(trash, ignore_errors=True)

    def _trash_prefix(self) -> str:
        return f".{self.version}.trash-"

    def prune(self, keep: set[str]) -> list[str]:
        """Remove every build but those in ``keep``, and leftovers of earlier clean-ups.

        Returns:
            list[str]: the ids removed.
        """
        removed = []
        for directory, leftover in ((self.top, self._trash_prefix()), (self.legacy_builds_dir, ".")):
            try:
                for entry in os.listdir(directory):
                    if entry.startswith(leftover):
                        shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
            except OSError:
                pass
        tmp_link = os.path.join(self.top, f".{self.version}.publish-tmp")
        if os.path.islink(tmp_link):
            os.unlink(tmp_link)
        for build_id in self.builds():
            if build_id not in keep:
                self.remove_build(build_id)
                removed.append(build_id)
        return removed


@dataclass
class Choice:
    """Which build an install works on, and why.

    Attributes:
        plan (Plan): the plan for that build.
        kind (str): ``"up to date"`` (the published build, nothing to do), ``"in place"`` (the
            published build, only :data:`hpcstack.install.plan.IN_PLACE_STEPS` to redo), ``"resume"``
            (the build in progress), ``"new"`` (a new stage prefix).
        pending (list[str]): the steps a run would do.
        replaces (str | None): id of the published build a new build replaces
            (:data:`PRE_STAGING` for a prefix that is a real directory).
    """

    plan: Plan
    kind: str
    pending: list[str] = field(default_factory=list)
    replaces: str | None = None


def choose(layout: StackLayout, resolve_at: Callable[[str, str], Plan], force: bool = False) -> Choice:
    """Decide which build an install works on; reads the disk, changes nothing.

    1. A published build whose steps are all done is up to date; if only steps that may run in
       place are pending (a new modulefile template, a new sanity check), they run on it.
    2. Else a build in progress (named in the state file) is resumed.
    3. Else a new build starts in a new stage prefix; the published one stays untouched.

    The site is part of a build's identity: its id hashes the plan together with the site's
    name, and the prefix records the site it was published for. An install for another site
    into the same install root would replace that site's stack under its modulefile (the two
    sites' builds differ: an ``extend-venv-activate`` for another module tool, a modulefile of
    another syntax), so it is refused unless ``force``: such sites need install roots of their
    own (``localhost`` and ``localhost-lmod`` have, and module roots of their own too, so that
    a module name means one stack whichever tool reads it).

    Args:
        layout (StackLayout): the stack.
        resolve_at (Callable[[str, str], Plan]): returns the plan for a stage prefix and build id.
        force (bool): redo every step (never in place: a forced install builds anew or redoes
            the build in progress), also over another site's published stack.

    Raises:
        ConfigError: the prefix is published for another site (and not ``force``).
    """
    current = layout.published()
    state = layout.read_state()
    owner = state["published_for"]
    if current and not force and owner and layout.site and owner != layout.site:
        raise ConfigError([f"{layout.prefix} is published for site {owner!r}; an install for site "
                           f"{layout.site!r} would replace it under {owner}'s modulefile: give site "
                           f"{layout.site} an install_root of its own (or --prefix), uninstall it for "
                           f"{owner} first, or use --force"])
    if current and not force:
        plan = resolve_at(current, layout.id_of(current))
        pending = pending_steps(plan)
        if not pending:
            return Choice(plan, "up to date")
        if set(pending) <= set(IN_PLACE_STEPS):
            return Choice(plan, "in place", pending)
    building = state["building"]
    if building and _valid_id(building) and layout.build_path(building) != current:
        plan = resolve_at(layout.build_path(building), building)
        return Choice(plan, "resume", pending_steps(plan, force), replaces=state["replaces"])
    probe = resolve_at(layout.build_path("new"), "")
    # hpcstack's own data directory written neutrally: the same stack gets the same id whichever
    # copy of hpcstack installs it (hpcstack.install.plan.data_neutral)
    base = hashlib.sha256(f"site {layout.site}\n{data_neutral(probe.to_bash(''))}".encode()).hexdigest()[:12]
    taken = {layout.id_of(current), state["previous"]}
    build_id, n = base, 1
    while build_id in taken:
        n += 1
        build_id = f"{base}-{n}"
    plan = resolve_at(layout.build_path(build_id), build_id)
    replaces = (layout.id_of(current) or PRE_STAGING) if current else None
    return Choice(plan, "new", [s.name for s in plan.steps], replaces=replaces)


def _valid_id(build_id: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{12}(-[0-9]+)?", build_id))


def start(layout: StackLayout, choice: Choice) -> None:
    """Before a new build runs: record it as the build in progress and clear away stale builds.

    Keeps the published build and the previous one; a stale directory with the new build's id
    (from a build whose state was lost) is removed so the new build starts clean.
    """
    if choice.kind != "new":
        return
    state = layout.read_state()
    keep = {layout.id_of(layout.published()), state["previous"]} - {None, ""}
    try:
        layout.prune(keep)
        if choice.plan.build_id not in keep:
            layout.remove_build(choice.plan.build_id)
    except OSError as exc:
        raise HpcstackError(f"cannot clear old builds in {layout.builds_dir}: {describe_os_error(exc)}") from None
    layout.write_state({"building": choice.plan.build_id, "replaces": choice.replaces,
                        "previous": state["previous"], "published_for": state["published_for"]})


def finish(layout: StackLayout, plan: Plan) -> list[str]:
    """After every step of ``plan`` is done: forget the build in progress, keep the build it
    replaced as the previous one, remove all others.

    Returns:
        list[str]: the build ids removed.
    """
    state = layout.read_state()
    if not plan.build_id or state["building"] != plan.build_id:
        return []
    previous = state["replaces"] if state["replaces"] != plan.build_id else state["previous"]
    if previous and not os.path.isdir(layout.build_path(previous)):
        previous = None
    layout.write_state({"building": None, "replaces": None, "previous": previous,
                        "published_for": layout.site or state["published_for"]})
    try:
        return layout.prune({plan.build_id, previous} - {None})
    except OSError as exc:
        raise HpcstackError(f"published, but cannot remove old builds in {layout.builds_dir}: "
                            f"{describe_os_error(exc)}") from None


# ------------------------------------------------------------------------------- uninstall

def default_marker(module_dir: str, name: str, version: str) -> str | None:
    """Return the file that makes ``version`` the default of ``name`` in ``module_dir``, if any.

    Recognised: a ``.version`` file with ``set ModulesVersion "<version>"`` (Environment
    Modules, Lmod), a ``default`` symbolic link to ``<version>`` (or ``<version>.lua``), and a
    ``.modulerc`` / ``.modulerc.lua`` that marks ``<name>/<version>`` as ``default``.
    """
    def read(path: str) -> str:
        try:
            return Path(path).read_text(errors="replace")
        except OSError:
            return ""

    dot_version = os.path.join(module_dir, ".version")
    m = re.search(r"^\s*set\s+ModulesVersion\s+[\"{]?([^\"}\s]+)", read(dot_version), re.M)
    if m and m.group(1) == version:
        return dot_version
    link = os.path.join(module_dir, "default")
    if os.path.islink(link) and os.path.basename(os.readlink(link)).removesuffix(".lua") == version:
        return link
    full = re.escape(f"{name}/{version}")
    short = re.escape(f"/{version}")
    rc = os.path.join(module_dir, ".modulerc")
    if re.search(rf"^\s*module-version\s+[\"{{]?({full}|{short})[\"}}]?\s+.*\bdefault\b", read(rc), re.M):
        return rc
    rc_lua = rc + ".lua"
    if re.search(rf"module_version\(\s*\"({full}|{short})\"\s*,\s*\"default\"", read(rc_lua)):
        return rc_lua
    return None
