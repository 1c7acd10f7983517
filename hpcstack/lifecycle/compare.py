"""``hpcstack compare A B``: are two deliveries of a stack the same stack, and what changed between
two stacks.

A and B are each an installed stack (its prefix, or ``NAME/VERSION`` of the site's install root),
a container image built from ``hpcstack export`` (``image:REF`` or an OCI archive: the stack
installed in the image, read through ``buildah mount``, :mod:`hpcstack.lifecycle.images`) or an
offline bundle (``hpcstack bundle``'s directory). Of each it reads:

- the distributions and versions its SBOM lists (``.hpcstack/sbom.cdx.json``), and for an
  installed stack (or an image's) every distribution of its venv (``*.dist-info``): one the SBOM
  leaves out is a difference of its own (the SBOM must be complete);
- the files its SBOM lists for each distribution with their sha256
  (:func:`hpcstack.install.components.manifest.distribution_files`), checked against the files on
  disk: a file changed, added to or missing from a distribution since the SBOM was written is a
  difference (an SBOM written before it listed files gives a note, not a difference);
- the files of every distribution: for an installed stack each file its ``RECORD`` names, hashed
  on disk (sha256); for a bundle the ``RECORD`` of each wheel (whose own sha256 the bundle's
  manifest and the lock vouch for). Left out on both sides, as the installer writes them and they
  differ between two correct installs: ``__pycache__``/``*.pyc`` (compiled at install; the same
  files give the same bytes, :mod:`hpcstack.install.bytecode`, but each names its source's
  path, which differs between two prefixes), files outside ``site-packages`` (entry-point
  scripts carry the venv's path in their ``#!`` line) and the installer's own ``RECORD``,
  ``INSTALLER``, ``REQUESTED``, ``direct_url.json``. A distribution built from its sdist on the site (Horovod) is compared by
  version only: its binary depends on the build machine;
- what it was built for (Python, CUDA, MPI: the SBOM's build environment and the site config the
  stack records) and its validation figures (``.hpcstack/validation.json``, or ``--report`` of
  each: ``hpcstack validate``'s ``report.json``).

It prints every difference, one line each, then a summary; exit 1 when anything differs, 0 when
nothing does, 2 for bad input. Two ``NAME/VERSION`` (two recipes' stacks for the site, e.g.
``pytorch/2.3.1-gpu pytorch/2.14.1-gpu``) give the admin's announcement: added, removed and
changed distributions, what each was built for and the validation figures side by side, without
hashing files (``--files`` hashes those of the same version on both sides).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack.errors import ConfigError, HpcstackError

#: Written by the installer, not the wheel: left out of the comparison of files.
INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"}
_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
_SDIST = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+?)-(?P<version>\d[^-]*)\.(tar\.gz|zip|tar\.bz2)$")
#: The most files named per distribution whose files differ.
SHOWN = 3


def norm(name: str) -> str:
    """A distribution's normalized name (PEP 503): lower case, runs of ``-_.`` as ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Side:
    """What one side of the comparison holds.

    Attributes:
        label (str): how the output names it.
        kind (str): ``stack`` or ``bundle``.
        dists (dict[str, str]): normalized name -> version, from the SBOM (a bundle: its wheels
            and sdists).
        installed (dict[str, str]): an installed stack's venv: normalized name -> version.
        built (set[str]): distributions built from their sdist on the site.
        files (dict[str, dict[str, str]]): normalized name -> {path: sha256}, once hashed.
        built_for (dict[str, str]): ``Python``, ``CUDA``, ``MPI`` -> version (``-`` unknown).
        figures (dict[str, str]): validation figure -> value with unit.
        root (Path): the prefix or the bundle directory.
        sbom_files (dict[str, dict[str, str]] | None): normalized name -> {path: sha256 or
            ``missing``} as the SBOM lists them (None: an SBOM that lists no files).
    """

    label: str
    kind: str
    root: Path
    dists: dict = field(default_factory=dict)
    installed: dict = field(default_factory=dict)
    built: set = field(default_factory=set)
    files: dict = field(default_factory=dict)
    built_for: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    sbom_files: dict | None = None
    _records: dict = field(default_factory=dict)

    def hash_files(self, name: str) -> dict[str, str] | None:
        """``{path: sha256}`` of distribution ``name`` (None when it has none to compare)."""
        if name not in self.files:
            self.files[name] = (_installed_files(*self._records[name]) if self.kind == "stack"
                                else _wheel_files(self._records[name])) if name in self._records else None
        return self.files[name]


def _kept(path: str) -> bool:
    parts = path.split("/")
    return not (path.startswith("..") or path.startswith("/") or "__pycache__" in parts or path.endswith(".pyc")
                or (len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] in INSTALLER_FILES))


def _record_rows(text: str):
    import csv
    import io

    for row in csv.reader(io.StringIO(text)):
        if row and _kept(row[0]):
            yield row


def _installed_files(site_packages: Path, record: Path) -> dict[str, str]:
    """Every kept file a venv's ``RECORD`` names, hashed on disk (a missing file: ``missing``)."""
    out = {}
    for row in _record_rows(record.read_text(errors="replace")):
        path = site_packages / row[0]
        try:
            h = hashlib.sha256()
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            out[row[0]] = h.hexdigest()
        except OSError:
            out[row[0]] = "missing"
    return out


def _wheel_files(wheel: Path) -> dict[str, str]:
    """Every kept file of a wheel, as its ``RECORD`` gives it (sha256 as hex)."""
    with zipfile.ZipFile(wheel) as zf:
        record = next((n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)), None)
        if record is None:
            raise HpcstackError(f"{wheel}: no .dist-info/RECORD: not a wheel")
        text = zf.read(record).decode("utf-8", "replace")
    out = {}
    for row in _record_rows(text):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256="):]
            out[row[0]] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
        elif not row[0].endswith(".data") and len(row) >= 2:
            out[row[0]] = row[1] or "unhashed"
    # a wheel's .data/purelib and platlib land in site-packages
    return {re.sub(r"^[^/]+\.data/(purelib|platlib)/", "", k): v for k, v in out.items()
            if not re.match(r"^[^/]+\.data/(scripts|headers|data)/", k)}


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HpcstackError(f"{path}: cannot read the {what}: {exc}") from None
    if not isinstance(data, dict):
        raise HpcstackError(f"{path}: the {what} is not a JSON object")
    return data


def _figures(report: dict) -> dict[str, str]:
    out = {}
    for run in report.get("runs") or []:
        if not isinstance(run, dict):
            continue
        for key, fig in (run.get("figures") or {}).items():
            if isinstance(fig, dict) and isinstance(fig.get("value"), (int, float)):
                out[f"{run.get('backend')} {run.get('nodes')} node(s) {key}"] = f"{fig['value']:.4g} {fig.get('unit') or ''}".strip()
    return out


def _venv_python(venv: Path) -> str | None:
    """``X.Y.Z`` of a venv's Python, from its ``pyvenv.cfg`` (``version`` or ``version_info``)."""
    try:
        text = (venv / "pyvenv.cfg").read_text()
    except OSError:
        return None
    m = re.search(r"^version(?:_info)?\s*=\s*(\d+\.\d+\.\d+)", text, re.M)
    return m.group(1) if m else None


def _marker_holds(marker: object, python: str | None) -> bool:
    """Whether a lock pin's environment marker holds for a Linux stack of ``python`` (``X.Y.Z``);
    a marker that cannot be read holds (the pin is kept, and a difference shows)."""
    from packaging.markers import InvalidMarker, Marker

    try:
        env = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
        if python:
            env.update(python_version=".".join(python.split(".")[:2]), python_full_version=python)
        return Marker(str(marker)).evaluate(env)
    except (InvalidMarker, ValueError, TypeError):
        return True


def _sbom_files(sbom: dict) -> dict | None:
    """normalized name -> {path: sha256 or ``missing``} of the files each ``pkg:pypi``
    component lists (nested ``file`` components), kept as :func:`_kept` keeps them; None when no
    component lists any (an SBOM written before the SBOM listed files)."""
    out: dict = {}
    for c in sbom.get("components") or []:
        if not (isinstance(c, dict) and str(c.get("purl") or "").startswith("pkg:pypi/") and c.get("name")):
            continue
        files = {}
        for f in c.get("components") or []:
            if isinstance(f, dict) and f.get("type") == "file" and isinstance(f.get("name"), str) and _kept(f["name"]):
                digest = next((h.get("content") for h in f.get("hashes") or []
                               if isinstance(h, dict) and h.get("alg") == "SHA-256"), None)
                files[f["name"]] = str(digest) if digest else "missing"
        if "components" in c:
            out[norm(c["name"])] = files
    return out or None


def read_stack(prefix: Path, label: str, report: str | None = None) -> Side:
    """An installed stack: its SBOM, its venv's distributions and ``RECORD`` files, its records.

    Raises:
        ConfigError: no SBOM there (not an installed stack).
    """
    state = prefix / ".hpcstack"
    sbom_path = state / "sbom.cdx.json"
    if not sbom_path.is_file():
        raise ConfigError([f"{label}: {prefix} holds no .hpcstack/sbom.cdx.json: not an installed stack"])
    sbom = _read_json(sbom_path, "SBOM")
    side = Side(label, "stack", prefix)
    python = _venv_python(prefix / "venv")
    if python:
        side.built_for["Python"] = python
    side.sbom_files = _sbom_files(sbom)
    for c in sbom.get("components") or []:
        if not isinstance(c, dict):
            continue
        purl = str(c.get("purl") or "")
        markers = [p.get("value") for p in c.get("properties") or []
                   if isinstance(p, dict) and p.get("name") == "hpcstack:marker"]
        if markers and not all(_marker_holds(m, python) for m in markers):
            continue    # a pin for another platform or Python (pywin32, appnope): not this stack's
        if purl.startswith("pkg:pypi/") and c.get("name") and c.get("version"):
            side.dists[norm(c["name"])] = str(c["version"])
            if "built from its sdist" in str(c.get("description") or ""):
                side.built.add(norm(c["name"]))
        roles = {p.get("value") for p in c.get("properties") or [] if isinstance(p, dict)}
        if "build environment" in roles and (c.get("name") == "CUDA" or str(c.get("name", "")).startswith("MPI")):
            side.built_for[str(c["name"]).split(" ")[0]] = f"{c.get('version')}" + (
                f" ({c['name'].split('(', 1)[1].rstrip(')')})" if "(" in str(c.get("name")) else "")
    for sp in sorted((prefix / "venv" / "lib").glob("python3.*/site-packages")):
        side.built_for.setdefault("Python", sp.parent.name[len("python"):])
        for info in sorted(sp.glob("*.dist-info")):
            m = re.match(r"^(.+?)-([^-]+)\.dist-info$", info.name)
            if m and (info / "RECORD").is_file():
                side.installed[norm(m.group(1))] = m.group(2)
                side._records[norm(m.group(1))] = (sp, info / "RECORD")
    try:
        site = json.loads((state / "site.json").read_text())
        cuda = ((site.get("toolchain") or {}).get("cuda") or {}).get("version")
        side.built_for.setdefault("CUDA", f"{cuda} (toolkit)" if cuda else "none (CPU build)")
    except (OSError, ValueError, AttributeError):
        pass
    torch = side.dists.get("torch")
    if torch:
        side.built_for["torch"] = torch
    rep = Path(report) if report else state / "validation.json"
    if rep.is_file():
        side.figures = _figures(_read_json(rep, "validation report"))
    return side


def read_bundle(path: Path, label: str) -> Side:
    """An offline bundle: its manifest (checked first: :func:`hpcstack.lifecycle.bundle.verify_bundle`),
    the wheels' names, versions and ``RECORD``, the sdists' names and versions."""
    from hpcstack.lifecycle.bundle import verify_bundle

    manifest = verify_bundle(str(path))
    side = Side(label, "bundle", path)
    side.built_for["Python"] = str(manifest.get("python") or "-")
    for rel in sorted(manifest["files"]):
        top, _, name = rel.partition("/")
        m = _WHEEL.match(name) if top == "wheels" else _SDIST.match(name) if top == "sdists" else None
        if not m:
            continue
        key = norm(m.group("name"))
        side.dists[key] = m.group("version")
        if top == "wheels":
            side._records[key] = path / rel
        else:
            side.built.add(key)
    return side


@dataclass
class Comparison:
    """The differences, one line each (empty: the same stack), and the announcement's rows."""

    lines: list = field(default_factory=list)
    added: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    changed: list = field(default_factory=list)
    same: int = 0
    files_checked: int = 0


def _differing(fa: dict[str, str], fb: dict[str, str], la: str, lb: str) -> tuple[int, str]:
    """How many paths of two ``{path: sha256}`` differ, and the first :data:`SHOWN` of them named
    (``content``, or on which side the file is missing)."""
    differ = sorted(p for p in set(fa) | set(fb) if fa.get(p) != fb.get(p))
    shown = ", ".join(f"{p} ({'missing in ' + (la if p not in fa else lb) if p not in fa or p not in fb else 'content'})"
                      for p in differ[:SHOWN])
    return len(differ), shown + (" ..." if len(differ) > SHOWN else "")


def _against_sbom(side: Side) -> list[str]:
    """An installed stack's files on disk against the files its SBOM lists, per distribution."""
    if side.sbom_files is None:
        print(f"note: {side.label}: its SBOM lists no files (written by an older hpcstack): its files are "
              "compared with the other side only", file=sys.stderr)
        return []
    lines = []
    for name, version in sorted(side.installed.items()):
        listed = side.sbom_files.get(name)
        if listed is None:
            if side.dists.get(name) == version:
                lines.append(f"{side.label}: its SBOM lists no files of {name} {version}")
            continue
        on_disk = side.hash_files(name) or {}
        count, shown = _differing(listed, on_disk, "its SBOM", "its venv")
        if count:
            lines.append(f"{side.label}: files of {name} {version}: {count} differ from its SBOM: {shown}")
    return lines


def compare(a: Side, b: Side, files: bool = True) -> Comparison:
    """Compare two sides: distributions and versions, SBOM completeness, files (``files``), what
    they were built for.

    Args:
        a (Side), b (Side): from :func:`read_stack` / :func:`read_bundle`.
        files (bool): hash and compare the files of distributions of the same version on both sides.

    Returns:
        Comparison: every difference as a line, and the added/removed/changed lists.
    """
    out = Comparison()
    for side in (a, b):
        for name, version in sorted(side.installed.items()):
            if side.dists.get(name) != version:
                out.lines.append(f"{side.label}: {name} {version} is installed in its venv but "
                                 + (f"its SBOM says {side.dists[name]}" if name in side.dists else "not in its SBOM"))
        if side.kind == "stack":
            for name in sorted(set(side.dists) - set(side.installed)):
                out.lines.append(f"{side.label}: {name} {side.dists[name]} is in its SBOM but not installed in its venv")
            if files:
                out.lines += _against_sbom(side)
    for name in sorted(set(a.dists) | set(b.dists)):
        va, vb = a.dists.get(name), b.dists.get(name)
        if va is None:
            out.added.append((name, vb))
            out.lines.append(f"only in {b.label}: {name} {vb}")
        elif vb is None:
            out.removed.append((name, va))
            out.lines.append(f"only in {a.label}: {name} {va}")
        elif va != vb:
            out.changed.append((name, va, vb))
            out.lines.append(f"version of {name}: {va} in {a.label}, {vb} in {b.label}")
        else:
            out.same += 1
            if files and name not in a.built and name not in b.built:
                fa, fb = a.hash_files(name), b.hash_files(name)
                if fa is None or fb is None:
                    continue
                out.files_checked += len(fa)
                count, shown = _differing(fa, fb, a.label, b.label)
                if count:
                    out.lines.append(f"files of {name} {va}: {count} of {len(set(fa) | set(fb))} differ: {shown}")
    for key in sorted(set(a.built_for) | set(b.built_for)):
        if key == "torch":
            continue
        x, y = a.built_for.get(key, "-"), b.built_for.get(key, "-")
        if key == "Python" and "-" not in (x, y):   # a bundle knows X.Y only
            n = min(x.count("."), y.count(".")) + 1
            x, y = ".".join(x.split(".")[:n]), ".".join(y.split(".")[:n])
        if x != y and "-" not in (x, y):
            out.lines.append(f"built for {key}: {x} in {a.label}, {y} in {b.label}")
    return out


def open_side(arg: str, label: str, site_loader, report: str | None = None, mounts=None,
              image_storage: tuple = (None, None)) -> Side:
    """``arg`` as a side: a container image (``image:REF`` or an OCI archive), a bundle directory
    (``manifest.json``), a stack prefix, or ``NAME/VERSION`` installed at the site
    (``site_loader()`` gives the site).

    Args:
        arg (str): the argument.
        label (str): how the output names it.
        site_loader (Callable[[], hpcstack.site.Site]): loads the site for ``NAME/VERSION``.
        report (str | None): its validation report.json.
        mounts (contextlib.ExitStack | None): keeps an image mounted until it closes (required
            for an image).
        image_storage (tuple[str | None, str | None]): buildah's storage driver and root.

    Raises:
        ConfigError: none of these.
        HpcstackError: buildah cannot read the image.
    """
    from hpcstack.lifecycle import images

    ref = images.image_reference(arg)
    if ref is not None:
        root, config = mounts.enter_context(images.mounted_image(ref, *image_storage))
        full, prefix = images.stack_prefix(root, config, ref)
        side = read_stack(prefix, label, report)
        side.kind, side.root = "stack", prefix
        return side
    path = Path(arg)
    if path.is_dir() and (path / "manifest.json").is_file():
        return read_bundle(path, label)
    if path.is_dir():
        return read_stack(path.resolve(), label, report)
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*/[A-Za-z0-9][A-Za-z0-9._+-]*", arg):
        site = site_loader()
        prefix = Path(site.install_root) / arg
        if not prefix.is_dir():
            raise ConfigError([f"{arg}: not installed for site {site.name} (no {prefix})"])
        return read_stack(prefix.resolve(), label, report)
    raise ConfigError([f"{arg}: give an installed stack's prefix, NAME/VERSION installed at --site, a "
                       "bundle directory (hpcstack bundle), or a container image (image:REF, an OCI archive)"])


def _side_by_side(rows: list[tuple[str, str, str]], a: str, b: str) -> list[str]:
    head = [("", a, b)] + rows
    w = [max(len(r[i]) for r in head) for i in range(3)]
    return ["  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip() for r in head]


def cmd_compare(args, load_site) -> int:
    """``hpcstack compare``: print the differences; 1 when any, 0 when none."""
    if len(args.report) > 2:
        raise ConfigError(["--report: give at most two (A's, then B's)"])
    reports = args.report + [None] * (2 - len(args.report))
    names = all(not os.path.exists(x) and "/" in x and not x.startswith("image:") for x in (args.a, args.b))
    files = (not names) if args.files is None else args.files
    def loader():
        return load_site(args, install_root=args.prefix)
    with contextlib.ExitStack() as mounts:
        storage = (getattr(args, "storage_driver", None), getattr(args, "storage_root", None))
        a = open_side(args.a, args.a, loader, reports[0], mounts, storage)
        b = open_side(args.b, args.b, loader, reports[1], mounts, storage)
        result = compare(a, b, files)
    return _print(args, a, b, result, files)


def _print(args, a: Side, b: Side, result: Comparison, files: bool) -> int:
    """Print the comparison (text, or ``--json``); 1 when anything differs, else 0."""
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "same": not result.lines, "differences": result.lines,
                          "added": result.added, "removed": result.removed, "changed": result.changed,
                          "built_for": {"a": a.built_for, "b": b.built_for},
                          "figures": {"a": a.figures, "b": b.figures}}, indent=1))
        return 1 if result.lines else 0
    for line in result.lines:
        print(line)
    print("\nbuilt for:")
    for line in _side_by_side([(k, a.built_for.get(k, "-"), b.built_for.get(k, "-"))
                               for k in sorted(set(a.built_for) | set(b.built_for))], a.label, b.label):
        print(line)
    if a.figures or b.figures:
        print("validation figures:")
        for line in _side_by_side([(k, a.figures.get(k, "-"), b.figures.get(k, "-"))
                                   for k in sorted(set(a.figures) | set(b.figures))], a.label, b.label):
            print(line)
    else:
        print("validation figures: none recorded (give each stack's report.json with --report)")
    verdict = ("the same stack" if not result.lines else f"{len(result.lines)} difference{'s' if len(result.lines) != 1 else ''}")
    print(f"\n{args.a} vs {args.b}: {verdict}: {len(result.added)} added, {len(result.removed)} removed, "
          f"{len(result.changed)} changed, {result.same} the same"
          + (f" ({result.files_checked} files hashed)" if files else " (files not compared)"), file=sys.stderr)
    return 1 if result.lines else 0
