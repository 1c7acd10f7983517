"""The resolved plan: named steps made of actions, with two renderings that cannot disagree.

A recipe and a site resolve into one :class:`Plan`. ``hpcstack install`` executes it and
``hpcstack install --dry-run`` prints it with :meth:`Plan.to_bash`; both walk the same objects,
so the printed script is exactly what the real run does (one plan, two renderings).

The actions themselves (:class:`~hpcstack.install.actions.Action`, a protocol: ``commands()``,
``inputs()``, ``outputs()``, ``to_bash()``, ``execute(ctx)``) live in
:mod:`hpcstack.install.actions`, which says how each keeps its two renderings one; import them
from there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
from dataclasses import dataclass, field

from hpcstack.fsutil import CHILD_CWD, sha256_file

__all__ = ["FETCH", "VENV", "WHEELS", "PATCH", "BUILD", "INSTALL", "SANITYCHECK", "PERMISSIONS", "IMAGE", "MODULE",
           "STEP_ORDER", "STEP_DESCRIPTIONS", "IN_PLACE_STEPS", "BACKGROUND_STEPS", "REDO_WITH", "Step", "Plan",
           "data_neutral"]

#: Standard step names, in the order they run (EasyBuild-style ``<verb>_step`` names). ``image``
#: has actions only on a site with ``layout: squashfs`` (:mod:`hpcstack.install.image`); a step
#: without actions is left out of the plan, so other plans and their hashes are as before.
FETCH, VENV, WHEELS, PATCH, BUILD, INSTALL, SANITYCHECK, PERMISSIONS, IMAGE, MODULE = (
    "fetch", "venv", "wheels", "patch", "build", "install", "sanitycheck", "permissions", "image", "module")
STEP_ORDER = (FETCH, VENV, WHEELS, PATCH, BUILD, INSTALL, SANITYCHECK, PERMISSIONS, IMAGE, MODULE)
STEP_DESCRIPTIONS = {
    FETCH: "download sources and check their sha256",
    VENV: "create the venv on top of the site's Python module",
    WHEELS: "install the pinned wheels from the lock file in one resolution",
    PATCH: "unpack sources into the stage dir and apply patches",
    BUILD: "build from source with the site's compilers and libraries",
    INSTALL: "install built packages and the stack's tools",
    SANITYCHECK: "check imports, build flags and dependencies",
    PERMISSIONS: "make the stack world-readable and not world-writable",
    IMAGE: "pack the venv into a squashfs image, mount it at its path, check the imports from it",
    MODULE: "publish the stack (switch its prefix link atomically) and write the modulefile",
}
#: Steps that may run again on a published build without a new stage prefix: they read the
#: stack, change its permission bits or publish it, but never change what it runs. A change in
#: any other step builds a new stage prefix, and the published stack stays untouched meanwhile.
IN_PLACE_STEPS = (SANITYCHECK, PERMISSIONS, MODULE)
#: Steps that need nothing the venv and wheels steps make (the sources: download, unpack,
#: patch): a run does them in the background, one after the other, while the steps between them
#: (venv, wheels: the downloads of the wheels) run, and the first step after them (build) waits
#: for them (the wheels download while Horovod's sdist is unpacked and patched).
#: See :meth:`Plan.overlap`.
BACKGROUND_STEPS = (FETCH, PATCH)
#: A step that has to run again takes these earlier steps with it, so that it starts from a
#: clean state: the wheels step installs into a new venv (the venv step's ``--clear``), since
#: an installer cut short leaves packages whose ``.dist-info`` is there without all their files
#: (uv writes it first), which the next installer run would take as installed. See
#: :func:`hpcstack.install.runner.pending_steps`.
REDO_WITH = {WHEELS: VENV}

# ----------------------------------------------------------------------------------------- plan


def data_neutral(text: str) -> str:
    """``text`` with hpcstack's data directory (:func:`hpcstack.data_root`, as given and resolved)
    and the package directory above it written ``@HPCSTACK_DATA@``, for the texts whose hash
    names a step or a build (:meth:`Step.fingerprint`, :func:`hpcstack.install.layout.choose`).

    Args:
        text (str): a step's fingerprint or a plan's script.

    Returns:
        str: the text, the same whichever copy of hpcstack wrote it.
    """
    from hpcstack import data_root

    root = str(data_root())
    for form in dict.fromkeys((root, os.path.realpath(root), os.path.dirname(root))):
        text = text.replace(form.rstrip("/") + "/", "@HPCSTACK_DATA@/")
    return text


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
        sha256 of every input file its actions declare (so an edited lock file redoes it).

        hpcstack's own data directory (:func:`hpcstack.data_root`: built-in recipes, patches,
        templates, the trainer) is written ``@HPCSTACK_DATA@`` there: its files enter by their
        sha256, so hpcstack installed somewhere else (another venv, ``uv tool``, a checkout) finds
        the same stacks up to date instead of building each anew."""
        digests = [f"{p}={sha256_file(p) if os.path.isfile(p) else 'missing'}"
                   for a in self.actions for p in a.inputs()]
        return data_neutral(self.to_bash() + "\n" + "\n".join(digests))

    def to_bash(self) -> str:
        """Return the step as a commented block of bash.

        An action with ``background = True`` is started with ``&`` and the step ends by waiting
        for it, as :func:`hpcstack.install.runner.run_actions` runs it.
        """
        lines = [f"# --- step {self.name}: {self.description}"]
        waits = []
        for a in self.actions:
            if getattr(a, "background", False):
                waits.append(f"hpcstack_{self.name}_{len(waits) + 1}")
                lines += ["# in the background, while the actions after it run; the step waits for it at its end",
                          f"{a.to_bash()} &", f"{waits[-1]}=$!"]
            else:
                lines.append(a.to_bash())
        lines += [f'wait "${w}"' for w in waits]
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
        modulefile (str): the path of the modulefile the plan publishes.
        stage_prefix (str): the real directory this build is made in,
            ``<install_root>/<name>/.<version>-<id>``; ``""`` means ``prefix`` itself.
        build_id (str): the ``<id>`` of ``stage_prefix``.
        secret_files (dict[str, str]): variable -> file of the site's ``from_file`` secrets
            (:mod:`hpcstack.secrets`); the script reads them, the plan holds only the path.
    """

    title: str
    prefix: str
    modules: list[str]
    module_use: list[str]
    steps: list[Step]
    modulefile: str
    stage_prefix: str = ""
    build_id: str = ""
    secret_files: dict[str, str] = field(default_factory=dict)

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

        So a changed input redoes that step and the ones after it, and nothing else.
        """
        hashes, running = {}, hashlib.sha256(self.preamble().encode())
        for step in self.steps:
            running.update(step.fingerprint().encode())
            hashes[step.name] = running.hexdigest()
        return hashes

    def overlap(self, names: list[str] | None = None) -> tuple[list[str], list[str], str | None]:
        """Which steps run concurrently: ``(background, alongside, joined_by)``.

        The steps of :data:`BACKGROUND_STEPS` among ``names`` run one after the other in the
        background; the other steps of ``names`` from the first background step to the last
        (``alongside``: venv and wheels) run meanwhile; ``joined_by``, the first step of
        ``names`` after the last background step (build), starts once the background is done.
        Without a step alongside, nothing overlaps: ``([], [], None)``.

        Args:
            names (list[str] | None): the steps that will run, in plan order (default: all).
        """
        names = [s.name for s in self.steps] if names is None else list(names)
        at = [i for i, n in enumerate(names) if n in BACKGROUND_STEPS]
        if not at:
            return [], [], None
        alongside = [n for n in names[at[0]:at[-1] + 1] if n not in BACKGROUND_STEPS]
        if not alongside:
            return [], [], None
        after = names[at[-1] + 1:]
        return [names[i] for i in at], alongside, (after[0] if after else None)

    def preamble(self) -> str:
        """Return the script lines that set up the build environment."""
        lines = [f"module use {shlex.quote(d)}" for d in self.module_use]
        lines += [f"module load {shlex.quote(m)}" for m in self.modules]
        # secret values from files (hpcstack.secrets): read when the script runs, never written
        lines += [f'{var}="$(head -n1 {shlex.quote(path)})"; export {var}' for var, path in self.secret_files.items()]
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
            f"cd {CHILD_CWD}  # every command runs in a directory of root's, never the caller's",
            self.preamble(),
        ]
        background, alongside, joined_by = self.overlap()
        for s in self.steps:
            if s.name in background:
                continue
            if background and s.name == alongside[0]:
                parts.append(_background_bash([x for x in self.steps if x.name in background], alongside, joined_by))
            if s.name == joined_by:
                parts.append(f"\n# --- wait for the background: {' and '.join(background)} "
                             "(a failure there stops the script here)\n"
                             'wait "$hpcstack_background"')
            parts.append("\n" + s.to_bash())
        if background and joined_by is None:
            parts.append('\n# --- wait for the background\nwait "$hpcstack_background"')
        parts.append("\n# afterwards hpcstack removes earlier builds of the stack but the one this replaced")
        return "\n".join(p for p in parts if p) + "\n"

    def to_json(self, version: str) -> str:
        """Render the plan as JSON: the same objects as :meth:`to_bash`, for provenance and tools.

        Args:
            version (str): hpcstack's version, recorded in the document.

        Returns:
            str: a JSON object with ``title``, ``prefix``, ``stage_prefix``, ``build_id``,
            ``modulefile``, ``modules``, ``module_use``, ``hpcstack`` and ``steps``
            (each ``name``, ``description``, ``hash``, ``outputs``, ``script`` and ``actions``,
            each action its ``type`` and fields), and ``background`` when steps overlap
            (:meth:`overlap`: ``steps``, ``alongside``, ``joined_by``).
        """
        hashes = self.step_hashes()
        steps = [{"name": s.name, "description": s.description, "hash": hashes[s.name],
                  "outputs": list(s.outputs), "script": s.to_bash(),
                  "actions": [{"type": type(a).__name__, **_fields(a)} for a in s.actions]}
                 for s in self.steps]
        doc = {"hpcstack": version, "title": self.title, "prefix": self.prefix,
               "stage_prefix": self.build_prefix, "build_id": self.build_id,
               "modulefile": self.modulefile, "modules": list(self.modules),
               "module_use": list(self.module_use), "steps": steps}
        background, alongside, joined_by = self.overlap()
        if background:
            doc["background"] = {"steps": background, "alongside": alongside, "joined_by": joined_by}
        return json.dumps(doc, indent=1) + "\n"


def _background_bash(steps: list[Step], alongside: list[str], joined_by: str | None) -> str:
    """The background steps as one bash subshell started with ``&`` (see :meth:`Plan.overlap`)."""
    names = " and ".join(s.name for s in steps)
    then = f"; step {joined_by} waits for them" if joined_by else ""
    body = "\n".join(s.to_bash() for s in steps)
    return (f"\n# --- background: {names}, one after the other, while "
            f"{' and '.join(alongside)} run{then}\n(\n{body}\n# --- end of the background\n) &\n"
            "hpcstack_background=$!")


def _fields(action) -> dict:
    """An action's fields as JSON values (tuples become lists, nested actions objects); an
    action that is not a dataclass gives none."""
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

    if not dataclasses.is_dataclass(action):
        return {}
    return {f.name: plain(getattr(action, f.name)) for f in dataclasses.fields(action)}
