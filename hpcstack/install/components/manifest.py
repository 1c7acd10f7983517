"""The ``StackManifest`` component: what the stack holds, for pip, uv and for people.

It writes two files into the stack's ``.hpcstack/`` (next to the provenance), installs
``<prefix>/bin/hpcstack-doctor`` (``hpcstack doctor`` for users, :mod:`hpcstack.doctor`) and sets
three variables in the modulefile:

``constraints.txt``
    every pin of the stack, ``name==version`` with its environment marker, one a line: the pins
    of the lock file the site got (:class:`~hpcstack.install.components.wheels.PipWheels`) and
    the packages built from source (``horovod==0.28.1``). No hashes: pip turns on hash-checking
    mode for a whole install as soon as one requirement carries a hash, so a hashed constraints
    file would make ``pip install rich`` fail.
``sbom.cdx.json``
    a CycloneDX 1.6 SBOM (JSON, written with ``cyclonedx-python-lib``): every pin of the lock with
    its package URL and the sha256 of every file the lock allows, the lock file itself, each
    source build (``horovod``) with its sdist URL and sha256 and its patches (pedigree, and each
    patch as a file component with its sha256), and the build environment's compilers, MPI, CUDA
    and NCCL, probed when the step runs (the probes of the build key, :meth:`SourceBuild.key_probes`).

Modulefile: ``PYTHONNOUSERSITE=1`` (packages in ``~/.local`` are not seen: ARCHER2 docs PR #525,
Horovod issue #1059), and ``PIP_CONSTRAINT`` and ``UV_CONSTRAINT`` naming ``constraints.txt``.

Why the module sets the constraint variables for every user of the module, not only in venvs
extended with ``extend-venv-activate``: with the module loaded, every Python sees the stack
through PYTHONPATH, ahead of any venv's own site-packages (PYTHONPATH entries come before
site-packages in ``sys.path``). A package of another version that pip or uv puts into *any* venv,
extended or not, either hides the stack's copy (extended venvs put their site-packages first) or
is hidden by it while its dependents expect it; so every install made while the module is loaded
must agree with the stack's pins. The cost, written down in docs/user/venvs.md: the module replaces a
``PIP_CONSTRAINT``/``UV_CONSTRAINT`` of the user's own (and ``module unload`` unsets it), and pip
(but not uv, which has ``UV_BUILD_CONSTRAINT`` for that) applies ``PIP_CONSTRAINT`` in its
isolated build environments too, so an sdist whose build needs e.g. ``setuptools>=73`` fails to
build until the user runs that one ``pip install`` with ``PIP_CONSTRAINT=``.

How pip and uv see the stack (checked with pip 23 and uv 0.13; ``tests/test_user_venv.py``):
pip lists the installed distributions of ``sys.path``, PYTHONPATH included, so in an extended
venv ``pip install torchvision`` is "Requirement already satisfied" by the stack and
``pip install 'torch>=2.4'`` fails with pip's ``ResolutionImpossible`` naming the constraint
``torch==2.3.1``. uv reads only the target venv's own site-packages (it queries the interpreter
with ``-I``, which ignores PYTHONPATH: astral-sh/uv#16540, #1397), so it cannot be made to see the
stack: ``uv pip install 'torch>=2.4'`` fails with uv's own "your requirements are
unsatisfiable" naming ``torch==2.3.1``, but ``uv pip install torchvision`` installs copies of the
stack's packages, at the stack's versions, into the venv (gigabytes; ``hpcstack doctor`` does not
count a same-version copy as a problem). Use pip in venvs on top of the stack.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from hpcstack import data_root, doctor
from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD, sha256_file, write_atomic
from hpcstack.install.actions import ACTION_COMMAND, ActionBase, Run, WriteFile, expand
from hpcstack.install.verbs import ACTION_VERBS
from hpcstack.install.components.base import Component, PlanContext
from hpcstack.install.components.source import SourceBuild
from hpcstack.install.components.wheels import PipWheels
from hpcstack.install.lockfile import read_lock
from hpcstack.install.plan import INSTALL, SANITYCHECK
from hpcstack.modules.envchange import SetEnv

#: Names of the files in ``<prefix>/.hpcstack/``.
CONSTRAINTS = "constraints.txt"
SBOM = "sbom.cdx.json"

def constraints_text(title: str, pins, builds) -> str:
    """The text of ``constraints.txt``.

    Args:
        title (str): the stack, e.g. ``pytorch/2.3.1-gpu``, for the header.
        pins (Iterable[hpcstack.install.lockfile.Pin]): the lock's pins.
        builds (Iterable[tuple[str, str]]): ``(package, version)`` of each source build.

    Returns:
        str: a pip/uv constraints file: comment header, then one ``name==version[ ; marker]`` a line.
    """
    # This header is part of a step's text and so of every installed build's step hashes: a
    # change to it makes every installed stack redo that step on its next install.
    lines = [f"# Constraints of the stack {title}: every package it holds, at its version.",
             "# Set as PIP_CONSTRAINT and UV_CONSTRAINT by its module (hpcstack), so that a pip",
             "# or uv install next to the stack cannot bring another version of them."]
    lines += [p.constraint() for p in pins]
    lines += [f"{name}=={version}" for name, version in builds]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class StackManifest(Component):
    """Write ``constraints.txt`` and the CycloneDX SBOM into ``<prefix>/.hpcstack/``, install
    ``<prefix>/bin/hpcstack-doctor`` (:mod:`hpcstack.doctor`, for users without the ``hpcstack``
    command) and set ``PYTHONNOUSERSITE``, ``PIP_CONSTRAINT`` and ``UV_CONSTRAINT`` in the
    modulefile (see the module's docstring for why, and for what pip and uv then do).

    Both files are written in the ``install`` step, after the components before it in the recipe
    (list it after the wheels and source builds). The lock is the one
    :class:`~hpcstack.install.components.wheels.PipWheels` chose for the site; a recipe without
    PipWheels gets the source builds only.

    Example:
        ``StackManifest()``

    Raises:
        ConfigError: (from PipWheels) no lock fits the site.
    """

    def _lock(self, ctx: PlanContext) -> str | None:
        wheels = ctx.recipe.component(PipWheels)
        return wheels.lock_file(ctx) if wheels else None

    def module_environment(self, ctx: PlanContext) -> list:
        """``PYTHONNOUSERSITE=1``, ``PIP_CONSTRAINT`` and ``UV_CONSTRAINT`` = ``<prefix>/.hpcstack/constraints.txt``."""
        path = os.path.join(ctx.prefix, ".hpcstack", CONSTRAINTS)
        return [SetEnv("PYTHONNOUSERSITE", "1"), SetEnv("PIP_CONSTRAINT", path),
                SetEnv("UV_CONSTRAINT", path)]

    def module_help(self, ctx: PlanContext) -> list[str]:
        """What :meth:`module_environment`'s variables change for users (``module help``)."""
        from hpcstack.modules.writer import root_variable

        path = os.path.join("$" + root_variable(ctx.recipe.name), ".hpcstack", CONSTRAINTS)
        return ["PYTHONNOUSERSITE=1: packages in your user site (~/.local, `pip install --user`) "
                "are not imported; a value of your own is replaced",
                f"PIP_CONSTRAINT, UV_CONSTRAINT={path}: replace your own settings; pip and uv keep "
                "the stack's versions of its packages in your venv (and refuse what breaks them)"]

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}``: ``install``: write ``constraints.txt``, the SBOM and
        ``bin/hpcstack-doctor``; ``sanitycheck``: ``hpcstack-doctor --help`` with the stack's python."""
        state = os.path.join(ctx.build_prefix, ".hpcstack")
        lock = self._lock(ctx)
        pins = read_lock(lock) if lock and os.path.isfile(lock) else []
        builds = ctx.recipe.components_of(SourceBuild)
        text = constraints_text(ctx.recipe.full_name, pins, [(b.package, b.version) for b in builds])
        spec = {
            "name": ctx.recipe.name, "version": ctx.recipe.version,
            "description": getattr(ctx.recipe, "whatis", "") or "",
            "site": ctx.site.name, "prefix": ctx.prefix, "lock": lock, "site_packages": ctx.site_packages,
            "builds": [{
                "package": b.package, "version": b.version, "url": b.url, "sha256": b.sha256,
                "patches": [{"file": b.patch_path(ctx, p), "sha256": p.sha256} for p in b.patches],
                # MAKEFLAGS (parallelism) changes nothing in the binary, as in the build key
                "env": {k: v for k, v in b.build_env(ctx).items() if k != "MAKEFLAGS"},
                "probes": [list(p) for p in b.key_probes(ctx)],
            } for b in builds],
        }
        # the doctor's source named from the package's data directory, as StackTools names the
        # trainer, so that the dry-run reads the same wherever hpcstack is installed
        source = os.path.join(str(data_root()), os.pardir, os.path.basename(doctor.__file__))
        script = os.path.join(ctx.bin_dir, doctor.SCRIPT)
        return {
            INSTALL: [WriteFile(os.path.join(state, CONSTRAINTS), text),
                      WriteSbom(os.path.join(state, SBOM), json.dumps(spec, sort_keys=True)),
                      # `hpcstack doctor` for users without the hpcstack command
                      Run(("install", "-D", "-m", "0755", source, script), input_files=(source,))],
            SANITYCHECK: [Run((ctx.python, script, "--help"))],
        }


# ------------------------------------------------------------------------------------ the SBOM

@dataclass(frozen=True)
class WriteSbom(ActionBase):
    """Write the stack's CycloneDX SBOM (an action; the dry-run prints ``hpcstack action sbom``,
    which runs this same code).

    Args:
        path (str): the JSON file to write (atomically).
        spec (str): JSON: ``name``, ``version``, ``description``, ``site``, ``prefix``, ``lock``
            (path or null), ``site_packages`` (the venv's: every file of every distribution
            installed there is listed with its sha256, :func:`distribution_files`) and ``builds`` (each: ``package``, ``version``, ``url``, ``sha256``,
            ``patches`` [{``file``, ``sha256``}], ``env`` (may hold ``${NAME}``) and ``probes``
            [[label, bash command]] run in the build environment).

    Raises:
        HpcstackError: the lock, a patch or a ``RECORD`` cannot be read, or the file cannot be written.
    """

    path: str
    spec: str

    def commands(self) -> tuple[Run, ...]:
        return (Run(("bash",)),)

    def inputs(self) -> tuple[str, ...]:
        data = json.loads(self.spec)
        return tuple(([data["lock"]] if data.get("lock") else [])
                     + [p["file"] for b in data["builds"] for p in b["patches"]])

    def outputs(self) -> tuple[str, ...]:
        return (self.path,)

    def to_bash(self) -> str:
        return " ".join(shlex.quote(w) for w in (*ACTION_COMMAND, "sbom", "--spec", self.spec, self.path))

    def execute(self, ctx) -> None:
        data = json.loads(self.spec)
        env = dict(getattr(ctx, "env", None) or os.environ)
        for build in data["builds"]:
            build_env = {**env, **{k: expand(v, env) for k, v in build["env"].items()}}
            build["probed"] = {label: run_probe(cmd, build_env) for label, cmd in build["probes"]}
        start = time.monotonic()
        try:
            text = sbom_json(data)
            write_atomic(Path(self.path), text, 0o644)
        except OSError as exc:
            raise HpcstackError(f"cannot write the SBOM {self.path}: {exc}") from None
        ctx.log.write(f"wrote the CycloneDX SBOM {self.path} ({time.monotonic() - start:.1f} s)\n")


def run_probe(command: str, env: dict[str, str]) -> str:
    """Run one probe with bash in ``env``; its stdout and stderr (``""`` when bash fails to start)."""
    try:
        proc = subprocess.run(["bash", "-c", command], env=env, stdout=subprocess.PIPE, cwd=CHILD_CWD,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.decode(errors="replace")


def probed_versions(probed: dict[str, str]) -> list[tuple[str, str, str]]:
    """Pick ``(component, version, raw first line)`` for Python, compilers, cmake, MPI, CUDA and
    NCCL out of probe output (GCC/Clang/NVHPC ``--version``, Open MPI ``-showme:version``, MPICH or
    Intel MPI ``-show`` output naming the library, ``nvcc --version``'s ``release X.Y, VX.Y.Z``,
    ``nccl.h``'s ``NCCL_MAJOR``/``MINOR``/``PATCH``).

    Args:
        probed (dict[str, str]): probe label -> output (labels of :meth:`SourceBuild.key_probes`:
            ``python`` (the stack's venv), ``C compiler``, ``C++ compiler``, ``Fortran compiler``,
            ``MPI``, ``CUDA``, ``NCCL``, ``cmake``).

    Returns:
        list[tuple[str, str, str]]: one entry per tool found; a tool that is absent (a CPU-only
        build has no CUDA or NCCL) gives none.
    """
    out = []
    m = re.match(r"\s*(\d+\.\d+\.\d+)", probed.get("python", ""))
    if m:
        out.append(("Python", m.group(1), probed["python"].strip().splitlines()[0]))
    for label in ("C compiler", "C++ compiler", "Fortran compiler", "cmake"):
        text = probed.get(label, "")
        first = text.strip().splitlines()[0] if text.strip() else ""
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", first)
        if m and "not found" not in first:
            out.append((label, m.group(1), first))
    mpi = probed.get("MPI", "")
    m = re.search(r"(Open MPI|MPICH|Intel\(R\) MPI|MVAPICH2?)\D*(\d+\.\d+(?:\.\d+)?)", mpi)
    if m:
        out.append((f"MPI ({m.group(1)})", m.group(2), m.group(0)))
    m = re.search(r"release (\d+\.\d+)[^\n]*?V(\d+\.\d+\.\d+)", probed.get("CUDA", ""))
    if m:
        out.append(("CUDA", m.group(2), m.group(0)))
    nccl = dict(re.findall(r"#define NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)", probed.get("NCCL", "")))
    if len(nccl) == 3:
        out.append(("NCCL", f"{nccl['MAJOR']}.{nccl['MINOR']}.{nccl['PATCH']}", "nccl.h"))
    return out


#: Files a distribution's ``RECORD`` names that the installer writes, not the wheel, and that differ
#: between two correct installs of the same wheel (``RECORD`` cannot hold its own hash; uv's
#: ``uv_cache.json`` holds a time): left out of the SBOM's file lists.
INSTALLER_WRITTEN = frozenset({"RECORD", "uv_cache.json"})


def _pypi_name(name: str) -> str:
    """A distribution's normalized name (PEP 503): lower case, runs of ``-_.`` as ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_files(site_packages: str) -> dict[str, dict]:
    """Every file of every distribution installed in ``site_packages``, hashed on disk.

    The files are those each ``*.dist-info/RECORD`` names (PEP 376/627: the installer lists every
    file it wrote), less :data:`INSTALLER_WRITTEN`; a path that leaves the venv (``../`` past its
    root) is left out. Each file's sha256 is that of its bytes on disk, not the one ``RECORD``
    gives: the SBOM says what the stack holds, and a file changed after the wheel was unpacked
    (a recipe's fix-up) must show. Where the two differ the ``RECORD``'s is kept beside it
    (``record_sha256``). Cost, measured on this project's 2-core machine: the
    ``pytorch/2.3.1-gpu`` venv (25,657 files, 5.6 GB) hashes in 5 s with a warm page cache and
    12 s with a cold one; listing the same files with ``RECORD``'s hashes alone (``stat`` only)
    would take 0.2 s, but could not see a changed file of the same size.

    Args:
        site_packages (str): the venv's ``site-packages`` directory.

    Returns:
        dict[str, dict]: normalized name -> ``{"name", "version", "files": [{"path", "sha256"
        (None: missing on disk), "record_sha256" (only where it differs)}]}``, paths as ``RECORD``
        writes them (relative to ``site_packages``), in ``RECORD``'s order.

    Raises:
        OSError: a ``RECORD`` cannot be read.
    """
    import base64
    import csv
    import io

    venv = os.path.normpath(os.path.join(site_packages, os.pardir, os.pardir, os.pardir))
    out: dict[str, dict] = {}
    try:
        infos = sorted(n for n in os.listdir(site_packages) if n.endswith(".dist-info"))
    except FileNotFoundError:
        return out
    for info in infos:
        m = re.match(r"^(.+?)-([^-]+)\.dist-info$", info)
        record = os.path.join(site_packages, info, "RECORD")
        if not m or not os.path.isfile(record):
            continue
        with open(record, encoding="utf-8", errors="replace", newline="") as fh:
            rows = list(csv.reader(io.StringIO(fh.read())))
        files = []
        for row in rows:
            if not row or not row[0] or os.path.basename(row[0]) in INSTALLER_WRITTEN and \
                    os.path.dirname(row[0]) == info:
                continue
            path = os.path.normpath(os.path.join(site_packages, row[0]))
            if not path.startswith(venv + os.sep):
                continue
            entry = {"path": row[0]}
            try:
                entry["sha256"] = sha256_file(path) if not os.path.islink(path) else None
            except OSError:
                entry["sha256"] = None
            recorded = row[1][len("sha256="):] if len(row) > 1 and row[1].startswith("sha256=") else ""
            if recorded:
                try:
                    recorded = base64.urlsafe_b64decode(recorded + "=" * (-len(recorded) % 4)).hex()
                except ValueError:      # binascii.Error: not base64; kept as RECORD writes it
                    recorded = row[1]
                if recorded != entry["sha256"]:
                    entry["record_sha256"] = recorded
            files.append(entry)
        out[_pypi_name(m.group(1))] = {"name": m.group(1), "version": m.group(2), "files": files}
    return out


def _sha256(value: str):
    from cyclonedx.model import HashAlgorithm, HashType

    return HashType(alg=HashAlgorithm.SHA_256, content=value)


def _purl(name: str, version: str):
    from packageurl import PackageURL

    return PackageURL(type="pypi", name=_pypi_name(name), version=version)


def _stack_component(data: dict):
    """The stack itself: the SBOM's metadata component."""
    from cyclonedx.model import Property
    from cyclonedx.model.component import Component, ComponentType

    return Component(name=f"{data['name']}/{data['version']}", version=data["version"],
                     type=ComponentType.APPLICATION, bom_ref=f"stack:{data['name']}/{data['version']}",
                     description=data.get("description") or None,
                     properties=[Property(name="hpcstack:site", value=data["site"]),
                                 Property(name="hpcstack:prefix", value=data["prefix"])])


def _lock_components(lock: str) -> list:
    """The lock file (with its sha256) and one component per pin (package URL, the sha256 of each
    file the lock allows, its marker, its index)."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, Property, XsUri
    from cyclonedx.model.component import Component, ComponentType

    out = [Component(name=os.path.basename(lock), type=ComponentType.FILE,
                     bom_ref=f"file:{os.path.basename(lock)}", hashes=[_sha256(sha256_file(lock))],
                     description="the lock file the stack's wheels were installed from")]
    for pin in read_lock(lock):
        props = [Property(name="hpcstack:allowed-file-sha256", value=h) for h in pin.hashes]
        if pin.marker:
            props.append(Property(name="hpcstack:marker", value=pin.marker))
        refs = [ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(pin.index))] if pin.index else []
        out.append(Component(name=pin.name, version=pin.version, purl=_purl(pin.name, pin.version),
                             bom_ref=f"pypi:{pin.name}=={pin.version}", properties=props,
                             external_references=refs))
    return out


def _build_components(build: dict) -> list:
    """A source build (its sdist with sha256, its patches in its pedigree, its build
    environment's variables) followed by each patch file with its sha256."""
    from cyclonedx.model import AttachedText, ExternalReference, ExternalReferenceType, Property, XsUri
    from cyclonedx.model.component import Component, ComponentType, Diff, Patch, PatchClassification, Pedigree

    patches, patch_files = [], []
    for p in build["patches"]:
        name = os.path.basename(p["file"])
        patch_files.append(Component(name=name, type=ComponentType.FILE, bom_ref=f"file:{name}",
                                     hashes=[_sha256(sha256_file(p["file"]))],
                                     description=f"patch applied to {build['package']} {build['version']}"))
        patches.append(Patch(type=PatchClassification.UNOFFICIAL,
                             diff=Diff(text=AttachedText(content=Path(p["file"]).read_text(errors="replace")))))
    sdist = ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(build["url"]),
                              hashes=[_sha256(build["sha256"])], comment="the sdist it was built from")
    return [Component(
        name=build["package"], version=build["version"], purl=_purl(build["package"], build["version"]),
        bom_ref=f"pypi:{build['package']}=={build['version']}", external_references=[sdist],
        pedigree=Pedigree(patches=patches) if patches else None,
        description="built from its sdist on the site",
        properties=[Property(name=f"hpcstack:build-env:{k}", value=v) for k, v in sorted(build["env"].items())],
    )] + patch_files


def _tool_components(builds: list) -> list:
    """The build environment's tools (compilers, MPI, CUDA, ...) probed for the source builds,
    one component per tool and version."""
    from cyclonedx.model import Property
    from cyclonedx.model.component import Component, ComponentType

    tools: dict = {}
    for build in builds:
        for label, version, line in probed_versions(build.get("probed", {})):
            tools.setdefault((label, version), line)
    return [Component(name=label, version=version, type=ComponentType.APPLICATION,
                      bom_ref=f"build-env:{label}", description=line or None,
                      properties=[Property(name="hpcstack:role", value="build environment")])
            for (label, version), line in sorted(tools.items())]


def _venv_components(installed: dict[str, dict], listed) -> list:
    """A component for each distribution of the venv that neither the lock nor a source build
    names at its installed version (what another step installed): the SBOM lists them all."""
    from cyclonedx.model import Property
    from cyclonedx.model.component import Component

    return [Component(name=d["name"], version=d["version"], purl=_purl(d["name"], d["version"]),
                      bom_ref=f"pypi:{d['name']}=={d['version']}",
                      description="installed in the stack's venv, named by neither the lock nor a source build",
                      properties=[Property(name="hpcstack:origin", value="venv")])
            for key, d in sorted(installed.items()) if (key, d["version"]) not in listed]


def build_bom(data: dict, installed: dict[str, dict] | None = None):
    """Build the CycloneDX :class:`cyclonedx.model.bom.Bom` of a stack (without the files of
    each distribution: :func:`sbom_json` adds those).

    Args:
        data (dict): the :class:`WriteSbom` spec, each build with ``probed`` (label -> output).
        installed (dict[str, dict] | None): the venv's distributions
            (:func:`distribution_files`); one that neither the lock nor a build names gets a
            component of its own.

    Returns:
        cyclonedx.model.bom.Bom: the stack as the metadata component; the lock's pins, the lock
            file, each source build (sdist with sha256, patches in its pedigree), each patch file,
            the venv's other distributions and the build environment's tools as components.

    Raises:
        OSError: the lock file or a patch cannot be read.
    """
    from cyclonedx.model.bom import Bom

    stack = _stack_component(data)
    bom = Bom()
    bom.metadata.component = stack
    components = _lock_components(data["lock"]) if data.get("lock") else []
    for build in data["builds"]:
        components += _build_components(build)
    listed = {(_pypi_name(c.name), c.version) for c in components if c.purl}
    components += _venv_components(installed or {}, listed)
    components += _tool_components(data["builds"])
    seen = set()
    for c in components:
        if str(c.bom_ref) not in seen:
            seen.add(str(c.bom_ref))
            bom.components.add(c)
    bom.register_dependency(stack, [c for c in bom.components
                                     if not str(c.bom_ref).startswith(("file:", "build-env:"))])
    return bom


def _file_component(entry: dict) -> dict:
    """One installed file as a CycloneDX file component (JSON)."""
    out: dict = {"type": "file", "name": entry["path"]}
    if entry["sha256"]:
        out["hashes"] = [{"alg": "SHA-256", "content": entry["sha256"]}]
    props = []
    if entry["sha256"] is None:
        props.append({"name": "hpcstack:missing", "value": "true"})
    if entry.get("record_sha256"):
        props.append({"name": "hpcstack:record-sha256", "value": entry["record_sha256"]})
    if props:
        out["properties"] = props
    return out


def sbom_json(data: dict) -> str:
    """The SBOM of :func:`build_bom` as CycloneDX 1.6 JSON text, with the files of each installed
    distribution (:func:`distribution_files` of the spec's ``site_packages``, when it gives one)
    as file components nested in its component.

    The file components are added to the JSON the library writes, not built as its objects:
    ``cyclonedx-python-lib`` 11 took 24 s to build and write 25,600 nested components (the
    PyTorch stack's file count) on this project's 2-core machine.

    Raises:
        OSError: the lock, a patch or a ``RECORD`` cannot be read.
    """
    from cyclonedx.output.json import JsonV1Dot6

    installed = distribution_files(data["site_packages"]) if data.get("site_packages") else {}
    doc = json.loads(JsonV1Dot6(build_bom(data, installed)).output_as_string())
    for component in doc.get("components", []):
        dist = installed.get(_pypi_name(component.get("name", "")))
        if component.get("purl", "").startswith("pkg:pypi/") and dist and dist["version"] == component.get("version"):
            component["components"] = [_file_component(f) for f in dist["files"]]
    return json.dumps(doc, indent=1) + "\n"


_S = {"type": "string", "maxLength": 4096}
#: JSON schema of :class:`WriteSbom`'s spec, as :meth:`StackManifest.contribute` makes it.
SBOM_SPEC_SCHEMA = {
    "type": "object", "required": ["name", "version", "site", "prefix", "builds"],
    "properties": {
        "name": _S, "version": _S, "description": _S, "site": _S, "prefix": _S, "site_packages": _S,
        "lock": {"type": ["string", "null"]},
        "builds": {"type": "array", "items": {
            "type": "object", "required": ["package", "version", "url", "sha256", "patches", "env", "probes"],
            "properties": {
                "package": _S, "version": _S,
                "url": {"type": "string", "pattern": r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s]+$"},
                "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                "patches": {"type": "array", "items": {
                    "type": "object", "required": ["file", "sha256"],
                    "properties": {"file": _S, "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}}},
                "env": {"type": "object", "additionalProperties": _S},
                "probes": {"type": "array", "items": {"type": "array", "items": _S, "minItems": 2, "maxItems": 2}},
            }}},
    }}


@ACTION_VERBS.register("sbom")
class SbomVerb:
    """``hpcstack action sbom --spec JSON PATH``: the dry-run's line for :class:`WriteSbom`."""

    help = "write a stack's CycloneDX SBOM to PATH (WriteSbom of the StackManifest component)"
    #: What it writes (checked by the trust rule before it runs).
    written = ("path",)

    @staticmethod
    def add_arguments(parser) -> None:
        """The verb's arguments: ``--spec JSON`` and ``PATH``."""
        parser.add_argument("--spec", required=True, help="the action's JSON spec, as the dry-run prints it")
        parser.add_argument("path", help="the SBOM file to write")

    @staticmethod
    def run(args) -> int:
        """Write the SBOM; 0 when done (errors raise :class:`HpcstackError`).

        Raises:
            ConfigError: the spec is not JSON or not of :data:`SBOM_SPEC_SCHEMA`'s shape (one line
                per problem, exit 2, nothing written).
        """
        import sys

        from hpcstack.errors import ConfigError
        from hpcstack.schema import problems

        try:
            spec = json.loads(args.spec)
        except ValueError as exc:
            raise ConfigError([f"--spec: not JSON: {exc}"]) from None
        found = problems(SBOM_SPEC_SCHEMA, spec, "--spec")
        if found:
            raise ConfigError(found)

        class _Ctx:
            env = dict(os.environ)
            log = sys.stdout
            state_dir = None

        WriteSbom(os.path.abspath(args.path), args.spec).execute(_Ctx())
        return 0
