"""``hpcstack audit``: the known vulnerabilities of a stack's packages, from OSV advisories.

What is audited: every pin of the lock file a site gets (:class:`~hpcstack.install.components.wheels.PipWheels`)
and every package the recipe builds from an sdist (``horovod 0.28.1``); or, for an installed stack
(``--stack PREFIX``), the packages its SBOM (``.hpcstack/sbom.cdx.json``) lists.

Where the advisories come from, in the `OSV format <https://ossf.github.io/osv-schema/>`_:

* ``--db DIR``: a local copy of an OSV advisory database, for sites without internet: a clone of
  the PyPA advisory database (https://github.com/pypa/advisory-database, YAML records under
  ``vulns/<package>/``), or any directory of OSV records (``*.yaml``, ``*.yml``, ``*.json``, e.g.
  the PyPI part of OSV's ``all.zip``, unpacked);
* otherwise the live OSV service (``https://api.osv.dev``, ``/v1/querybatch`` then
  ``/v1/vulns/ID``; another one with ``--osv-url``): when it cannot be reached the audit says so
  in one line and exits 3.

Which versions an advisory affects follows the OSV rules: a version listed in ``affected[].versions``,
or inside an ``ECOSYSTEM`` range (``introduced`` … ``fixed``/``last_affected`` events, compared as
PEP 440 versions with :mod:`packaging`); records with ``withdrawn`` are skipped.

A record is data from outside: YAML is read with PyYAML's safe loader and refused when it uses an
alias (OSV records never need one; nested aliases expand a few KB into billions of values), when
it is larger than :data:`MAX_RECORD_BYTES`, nested too deeply, or when a field hpcstack reads has
the wrong type (:data:`OSV_SCHEMA`, a subset of the OSV schema, https://ossf.github.io/osv-schema/):
one line per file, exit 2. A file that is not a record at all (no ``id``) is skipped. A local version
label (``2.3.1+cu121``) is audited as its public version (``2.3.1``): the same release, built for
another platform. "Fixed in" is the first ``fixed`` event above the version in the range that
matched (an advisory fixed on two branches, such as urllib3 1.26.17 and 2.0.6, names the branch's).

The result of auditing an installed stack is recorded next to its SBOM as
``.hpcstack/audit.cdx.json``: a CycloneDX 1.6 BOM with the audited packages (the SBOM's
``bom-ref`` values) and a ``vulnerabilities`` section; ``hpcstack show`` says when it was written.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.schema import CONTROL

#: The file of an installed stack's ``.hpcstack/`` that records its last audit.
AUDIT_RECORD = "audit.cdx.json"
#: The live OSV service.
OSV_URL = "https://api.osv.dev"
#: Where to get a local advisory database (said when the live service cannot be reached).
PYPA_DB = "https://github.com/pypa/advisory-database"


#: The largest OSV record file read (the PyPA database's largest is about 17 KB).
MAX_RECORD_BYTES = 4 * 1024 * 1024
#: The deepest nesting of lists and mappings in a record (OSV's is 5).
MAX_RECORD_DEPTH = 32
_OSV_VERSION = {"type": ["string", "number"]}   # YAML reads an unquoted 1.0 as a number
_OSV_LIST = {"type": ["array", "null"]}
#: The fields of an OSV record that hpcstack reads, with their types (OSV schema 1.6); other
#: fields are not read and not checked.
OSV_SCHEMA = {
    "type": "object", "required": ["id"],
    "properties": {
        "id": {"type": "string", "minLength": 1, "maxLength": 256},
        "aliases": {**_OSV_LIST, "items": {"type": "string", "maxLength": 256}},
        "summary": {"type": ["string", "null"]},
        "details": {"type": ["string", "null"]},
        "affected": {**_OSV_LIST, "items": {"type": "object", "properties": {
            "package": {"type": ["object", "null"], "properties": {
                "ecosystem": {"type": ["string", "null"]}, "name": {"type": ["string", "null"]}}},
            "versions": {**_OSV_LIST, "items": _OSV_VERSION},
            "ranges": {**_OSV_LIST, "items": {"type": "object", "properties": {
                "type": {"type": ["string", "null"]},
                "events": {**_OSV_LIST, "items": {"type": "object", "additionalProperties": _OSV_VERSION}},
            }}},
        }}},
    },
}


def check_record(record: object, where: str) -> list[str]:
    """Problems of one OSV record: the fields hpcstack reads, against :data:`OSV_SCHEMA`.

    Args:
        record (object): the parsed record.
        where (str): the file (or URL) it came from, to start each line with.

    Returns:
        list[str]: ``"<where>: <key.path>: <message>"`` lines (the first problem only: one line
        per record); empty when it can be read.
    """
    from hpcstack.schema import problems

    found = problems(OSV_SCHEMA, record, where)
    return [f"{found[0]} (not an OSV record hpcstack can read)"] if found else []


def load_record_text(text: str, where: str, json_text: bool = False) -> object:
    """Parse one OSV record: JSON, or YAML with the safe loader, no alias allowed.

    Args:
        text (str): the file's text.
        where (str): the file, for the error line.
        json_text (bool): JSON (``.json``) rather than YAML.

    Returns:
        object: what the text holds (a dict for a record).

    Raises:
        ConfigError: not valid JSON/YAML, an alias, nested deeper than :data:`MAX_RECORD_DEPTH`;
            one line naming ``where``.
    """
    import yaml

    try:
        if json_text:
            data = json.loads(text)
            _check_depth(data, where)
            return data
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_nodes(node, where)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError([f"{where}: {loc}not valid YAML: {CONTROL.sub('?', problem)[:200]}"]) from None
    except ValueError as exc:      # JSON's errors; an integer of more than 4300 digits
        raise ConfigError([f"{where}: not valid JSON: {CONTROL.sub('?', ' '.join(str(exc).split()))[:200]}"]) from None
    except RecursionError:
        raise ConfigError([f"{where}: nested too deeply"]) from None


def _check_nodes(root, where: str) -> None:
    """Refuse a YAML node graph where one node is reached twice (an alias) or that is nested
    deeper than :data:`MAX_RECORD_DEPTH`; the graph of an alias bomb is small, so this is quick."""
    import yaml

    seen: set[int] = set()
    todo = [(root, 0)]
    while todo:
        node, depth = todo.pop()
        if id(node) in seen:
            raise ConfigError([f"{where}: a YAML alias (*name) repeats the value of line {node.start_mark.line + 1}; "
                               "an OSV record has none (write the values out)"])
        seen.add(id(node))
        if depth > MAX_RECORD_DEPTH:
            raise ConfigError([f"{where}: nested more than {MAX_RECORD_DEPTH} levels deep"])
        if isinstance(node, yaml.SequenceNode):
            todo.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            todo.extend((child, depth + 1) for pair in node.value for child in pair)


def _check_depth(data, where: str) -> None:
    """Refuse JSON nested deeper than :data:`MAX_RECORD_DEPTH`."""
    todo = [(data, 0)]
    while todo:
        item, depth = todo.pop()
        if depth > MAX_RECORD_DEPTH:
            raise ConfigError([f"{where}: nested more than {MAX_RECORD_DEPTH} levels deep"])
        if isinstance(item, dict):
            todo.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            todo.extend((v, depth + 1) for v in item)


class AuditUnavailable(HpcstackError):
    """No advisory source could be read (the live service is unreachable); exit status 3, so that
    a script can tell "could not audit" from "vulnerable" (1)."""

    exit_status = 3


@dataclass(frozen=True)
class Package:
    """One audited package.

    Attributes:
        name (str): the distribution name as the lock spells it.
        version (str): its exact version.
        origin (str): ``lock`` (a wheel pinned by the lock) or ``sdist`` (built from source on the site).
    """

    name: str
    version: str
    origin: str = "lock"

    @property
    def bom_ref(self) -> str:
        """The ``bom-ref`` the stack's SBOM gives this package."""
        return f"pypi:{self.name}=={self.version}"


@dataclass(frozen=True)
class Finding:
    """A known vulnerability of one package.

    Attributes:
        package (str), version (str), origin (str): the :class:`Package`.
        id (str): the advisory's OSV id, e.g. ``PYSEC-2022-43015``.
        aliases (list[str]): its other ids (``CVE-…``, ``GHSA-…``).
        fixed_in (list[str]): versions that fix it (empty: no fix is known).
        summary (str): the advisory's summary, else the first line of its details.
    """

    package: str
    version: str
    origin: str
    id: str
    aliases: list = field(default_factory=list)
    fixed_in: list = field(default_factory=list)
    summary: str = ""

    def line(self) -> str:
        """One line: ``package version: ID (aliases): fixed in X``."""
        aka = f" ({', '.join(self.aliases)})" if self.aliases else ""
        built = " (built from its sdist)" if self.origin == "sdist" else ""
        fixed = f"fixed in {', '.join(self.fixed_in)}" if self.fixed_in else "no fixed version known"
        return f"{self.package} {self.version}{built}: {self.id}{aka}: {fixed}"


def _version(text) -> Version | None:
    try:
        return Version(str(text))
    except InvalidVersion:
        return None


def _public(version: str) -> Version | None:
    v = _version(version)
    return Version(v.public) if v is not None else None


def affected_by(record: dict, name: str, version: str) -> list[str] | None:
    """Whether an OSV record affects ``name`` at ``version``, and which versions fix it.

    Args:
        record (dict): one OSV record (parsed YAML or JSON).
        name (str): a PyPI distribution name (any spelling: compared canonicalised).
        version (str): the installed version (its local label is ignored).

    Returns:
        list[str] | None: None when not affected; else the fixing versions (may be empty).
    """
    if record.get("withdrawn"):
        return None
    want = canonicalize_name(name)
    v = _public(version)
    hit, fixes = False, []
    for entry in record.get("affected") or ():
        pkg = entry.get("package") or {}
        if pkg.get("ecosystem") != "PyPI" or canonicalize_name(str(pkg.get("name", ""))) != want:
            continue
        listed = {str(x) for x in entry.get("versions") or ()}
        listed_hit = version in listed or (v is not None and str(v) in listed)
        range_fixes, range_hit = [], False
        for rng in entry.get("ranges") or ():
            if rng.get("type") != "ECOSYSTEM" or v is None:
                continue
            found = _in_range(rng.get("events") or (), v)
            if found is not None:
                range_hit = True
                range_fixes += found
        if range_hit:
            hit = True
            fixes += range_fixes
        elif listed_hit:
            hit = True
            fixes += [str(e["fixed"]) for rng in entry.get("ranges") or () if rng.get("type") == "ECOSYSTEM"
                      for e in rng.get("events") or () if "fixed" in e
                      and (_version(e["fixed"]) is None or v is None or _version(e["fixed"]) > v)]
    if not hit:
        return None
    return sorted(set(fixes), key=lambda f: (_version(f) is None, _version(f) or Version("0"), f))


def _in_range(events, v: Version) -> list[str] | None:
    """OSV's range rule for one ``ECOSYSTEM`` range: None when ``v`` is outside it, else the
    ``fixed`` version that ends the stretch ``v`` is in (a list of one, or empty)."""
    parsed = []
    for event in events:
        for kind in ("introduced", "fixed", "last_affected", "limit"):
            if kind in event:
                ver = Version("0") if str(event[kind]) == "0" else _version(event[kind])
                if ver is not None:
                    parsed.append((ver, kind, str(event[kind])))
    order = {"introduced": 0, "fixed": 1, "last_affected": 1, "limit": 1}
    parsed.sort(key=lambda e: (e[0], order[e[1]]))
    inside = False
    for ver, kind, _ in parsed:
        if ver > v:
            break
        if kind == "introduced":
            inside = True
        elif kind == "fixed":
            inside = False
        elif kind == "last_affected" and v > ver:
            inside = False
    if not inside:
        return None
    later = [text for ver, kind, text in parsed if kind == "fixed" and ver > v]
    return later[:1]


def _summary(record: dict) -> str:
    text = record.get("summary") or (record.get("details") or "").strip().split("\n")[0]
    return " ".join(str(text).split())


def findings_for(records, packages) -> list[Finding]:
    """Match advisories with packages.

    Args:
        records (Iterable[dict]): OSV records.
        packages (Iterable[Package]): what to audit.

    Returns:
        list[Finding]: sorted by package, then advisory id.
    """
    by_name: dict[str, list[dict]] = {}
    for record in records:
        for entry in record.get("affected") or ():
            pkg = entry.get("package") or {}
            if pkg.get("ecosystem") == "PyPI" and pkg.get("name"):
                lst = by_name.setdefault(canonicalize_name(str(pkg["name"])), [])
                if not lst or lst[-1] is not record:
                    lst.append(record)
    out = []
    for p in packages:
        for record in by_name.get(canonicalize_name(p.name), ()):
            fixed = affected_by(record, p.name, p.version)
            if fixed is not None:
                out.append(Finding(p.name, p.version, p.origin, str(record.get("id")),
                                   [str(a) for a in record.get("aliases") or ()], fixed, _summary(record)))
    return sorted(out, key=lambda f: (canonicalize_name(f.package), f.id))


# --------------------------------------------------------------------------- advisory sources

class OsvDatabase:
    """A local directory of OSV records (the PyPA advisory database, or OSV's PyPI dump).

    Args:
        path (str | Path): the directory. A PyPA-style tree (``vulns/<package>/``) is read only
            for the packages asked about; any other tree is read in full (``*.yaml``, ``*.yml``,
            ``*.json``, recursively).

    Raises:
        ConfigError: the directory does not exist or holds no OSV record (exit 2).
    """

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise ConfigError([f"--db {path}: no such directory (a local OSV advisory database, "
                               f"e.g. a clone of {PYPA_DB})"])
        self._per_package = (self.path / "vulns").is_dir()
        if not any(self._files(self.path)):
            raise ConfigError([f"--db {path}: no OSV records (*.yaml, *.json) in it"])

    def describe(self) -> str:
        """``local OSV database DIR``."""
        return f"local OSV database {self.path}"

    @staticmethod
    def _files(root: Path):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for f in sorted(filenames):
                if f.endswith((".yaml", ".yml", ".json")):
                    yield Path(dirpath) / f

    def _read(self, path: Path) -> dict | None:
        """One record file: the record, or None for a file that is not a record (no ``id``).

        Raises:
            ConfigError: unreadable, too large, not valid JSON/YAML, an alias, or a field of the
                wrong type; one line naming the file.
        """
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_RECORD_BYTES + 1)
        except OSError as exc:
            raise ConfigError([f"--db {self.path}: {path.relative_to(self.path)}: cannot read: {exc.strerror}"]) from None
        if len(raw) > MAX_RECORD_BYTES:
            raise ConfigError([f"--db {self.path}: {path.relative_to(self.path)}: larger than {MAX_RECORD_BYTES // 1024 // 1024} MiB; "
                               "not an OSV record"])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError([f"--db {self.path}: {path.relative_to(self.path)}: not UTF-8 text (byte {exc.start})"]) from None
        where = f"--db {self.path}: {path.relative_to(self.path)}"
        record = load_record_text(text, where, json_text=path.suffix == ".json")
        if not isinstance(record, dict) or "id" not in record:
            return None
        problems = check_record(record, where)
        if problems:
            raise ConfigError(problems)
        return record

    def records(self, packages) -> list[dict]:
        """The records that may concern ``packages`` (all of them for a flat tree)."""
        if self._per_package:
            wanted = {canonicalize_name(p.name) for p in packages}
            dirs = [d for d in (self.path / "vulns").iterdir() if d.is_dir() and canonicalize_name(d.name) in wanted]
            paths = [f for d in sorted(dirs) for f in self._files(d)]
        else:
            paths = list(self._files(self.path))
        records, problems = [], []
        for path in paths:
            try:
                record = self._read(path)
            except ConfigError as exc:
                problems += exc.problems
                continue
            if record is not None:
                records.append(record)
        if problems:
            raise ConfigError(problems)
        return records


class OsvService:
    """The live OSV API (https://google.github.io/osv.dev/api/): ``POST /v1/querybatch`` for the
    ids, then ``GET /v1/vulns/ID`` for each record.

    Args:
        url (str): the service's base URL (default :data:`OSV_URL`).
        timeout (float): seconds per request.

    Raises:
        AuditUnavailable: the service cannot be reached or answers with an error (exit 3).
    """

    def __init__(self, url: str = OSV_URL, timeout: float = 20.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def describe(self) -> str:
        """``OSV service URL``."""
        return f"OSV service {self.url}"

    def _get(self, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read().decode())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise AuditUnavailable(
                f"cannot reach the OSV service at {self.url} ({reason}); on a site without it give "
                f"--db DIR, a local copy of an OSV advisory database (e.g. a clone of {PYPA_DB})") from None

    def records(self, packages) -> list[dict]:
        """The records of every advisory OSV lists for ``packages``."""
        packages = list(packages)
        queries = [{"package": {"name": p.name, "ecosystem": "PyPI"}, "version": p.version} for p in packages]
        ids = []
        for i in range(0, len(queries), 1000):
            answer = self._get("/v1/querybatch", {"queries": queries[i:i + 1000]})
            try:
                ids += [str(v["id"]) for r in answer.get("results", ()) for v in (r or {}).get("vulns", ()) or ()]
            except (AttributeError, KeyError, TypeError):
                raise AuditUnavailable(f"the OSV service at {self.url} answered /v1/querybatch with something "
                                       "that is not an OSV answer") from None
        records = [self._get(f"/v1/vulns/{i}") for i in dict.fromkeys(ids)]
        problems = [line for i, r in zip(dict.fromkeys(ids), records)
                    for line in check_record(r, f"{self.url}/v1/vulns/{i}")]
        if problems:
            raise ConfigError(problems)
        return records


# --------------------------------------------------------------------------- what is audited

def recipe_packages(recipe, site) -> tuple[list[Package], str | None]:
    """The packages a recipe installs for a site: the pins of its lock, then its source builds.

    Args:
        recipe (hpcstack.recipe.Recipe): the loaded recipe.
        site (hpcstack.site.Site): chooses the lock (its CUDA and Python).

    Returns:
        tuple[list[Package], str | None]: the packages and the lock file (None without PipWheels).

    Raises:
        ConfigError: no lock fits the site, or its file is missing.
    """
    from hpcstack.install.components.manifest import read_lock
    from hpcstack.install.components.source import SourceBuild
    from hpcstack.install.components.wheels import PipWheels

    wheels = recipe.component(PipWheels)
    packages, lock = [], None
    if wheels:
        choice = wheels.lock_for(site.toolchain, site.python_version, f"site {site.name}")
        lock = wheels.lock_path(recipe.directory, choice)
        if not os.path.isfile(lock):
            raise ConfigError([f"{lock}: no such lock file (run: hpcstack lock {recipe.full_name} "
                               f"--site {site.name})"])
        packages += [Package(p.name, p.version, "lock") for p in read_lock(lock)]
    packages += [Package(b.package, b.version, "sdist") for b in recipe.components_of(SourceBuild)]
    return packages, lock


def stack_state_dir(prefix) -> Path:
    """The ``.hpcstack/`` directory of an installed stack (through its prefix link to the build).

    Raises:
        ConfigError: ``prefix`` is not a stack installed by hpcstack.
    """
    build = Path(os.path.realpath(prefix))
    state = build / ".hpcstack"
    if not state.is_dir():
        raise ConfigError([f"--stack {prefix}: not a stack installed by hpcstack (no .hpcstack/ in {build})"])
    return state


def stack_packages(prefix) -> list[Package]:
    """The packages an installed stack holds, from its SBOM (``sbom.cdx.json``; its
    ``constraints.txt`` for stacks without one).

    Raises:
        ConfigError: not a stack, or neither file can be read.
    """
    state = stack_state_dir(prefix)
    try:
        doc = json.loads((state / "sbom.cdx.json").read_text())
        out = []
        for c in doc.get("components", ()):
            if str(c.get("purl", "")).startswith("pkg:pypi/") and c.get("version"):
                origin = "sdist" if "sdist" in (c.get("description") or "") else "lock"
                out.append(Package(c["name"], c["version"], origin))
        return out
    except (OSError, ValueError):
        pass
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        lines = (state / "constraints.txt").read_text().splitlines()
    except OSError:
        raise ConfigError([f"--stack {prefix}: neither {state}/sbom.cdx.json nor constraints.txt "
                           "can be read"]) from None
    out = []
    for line in lines:
        try:
            req = Requirement(line.strip())
        except InvalidRequirement:
            continue
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if pins:
            out.append(Package(req.name, pins[0]))
    return out


# --------------------------------------------------------------------------- the record

def now_utc() -> str:
    """The time now, ISO 8601 in UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def record_json(title: str, packages, findings, source: str, when: str) -> str:
    """The audit as CycloneDX 1.6 JSON: the audited packages as components (the SBOM's ``bom-ref``
    values) and one entry of ``vulnerabilities`` per finding (advisory id, aliases as references,
    the affected version, the fixing versions as the recommendation).

    Args:
        title (str): the stack, e.g. ``pytorch/2.3.1-gpu``.
        packages (Iterable[Package]): what was audited.
        findings (Iterable[Finding]): what was found.
        source (str): where the advisories came from (:meth:`OsvDatabase.describe`).
        when (str): the audit's time, ISO 8601.
    """
    from cyclonedx.model import Property, XsUri
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.impact_analysis import ImpactAnalysisAffectedStatus
    from cyclonedx.model.vulnerability import (BomTarget, BomTargetVersionRange, Vulnerability,
                                               VulnerabilityReference, VulnerabilitySource)
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    bom = Bom()
    bom.metadata.timestamp = _dt.datetime.fromisoformat(when)
    bom.metadata.component = Component(name=title, type=ComponentType.APPLICATION, bom_ref=f"stack:{title}")
    bom.metadata.properties.add(Property(name="hpcstack:audit-source", value=source))
    bom.metadata.properties.add(Property(name="hpcstack:audit-packages", value=str(len(list(packages)))))
    for p in dict.fromkeys(packages):
        bom.components.add(Component(name=p.name, version=p.version, bom_ref=p.bom_ref,
                                     purl=PackageURL(type="pypi", name=str(canonicalize_name(p.name)),
                                                     version=p.version)))
    for f in findings:
        osv = "PyPA advisory database" if f.id.startswith("PYSEC-") else "OSV"
        bom.vulnerabilities.add(Vulnerability(
            bom_ref=f"vuln:{f.id}:{f.package}", id=f.id,
            source=VulnerabilitySource(name=osv, url=XsUri(f"https://osv.dev/vulnerability/{f.id}")),
            references=[VulnerabilityReference(id=a, source=VulnerabilitySource(
                name="NVD" if a.startswith("CVE-") else "GitHub" if a.startswith("GHSA-") else "other"))
                for a in f.aliases],
            description=f.summary or None,
            recommendation=(f"upgrade {f.package} to {' or '.join(f.fixed_in)}" if f.fixed_in
                            else "no fixed version is known"),
            affects=[BomTarget(ref=f"pypi:{f.package}=={f.version}", versions=[
                BomTargetVersionRange(version=f.version, status=ImpactAnalysisAffectedStatus.AFFECTED)])],
            properties=[Property(name="hpcstack:fixed-in", value=v) for v in f.fixed_in]))
    return JsonV1Dot6(bom).output_as_string(indent=1) + "\n"


# --------------------------------------------------------------------------- the command

@dataclass
class AuditResult:
    """What :func:`run_audit` found.

    Attributes:
        target (str): what was audited (the stack, or the recipe and its lock).
        source (str): where the advisories came from.
        when (str): ISO 8601 time of the audit.
        packages (list[Package]): the audited packages.
        findings (list[Finding]): the known vulnerabilities.
        recorded (str | None): the record written (``--stack``), else None.
        note (str | None): one line for the admin (a record that could not be written, …).
    """

    target: str
    source: str
    when: str
    packages: list
    findings: list
    recorded: str | None = None
    note: str | None = None

    def to_json(self) -> str:
        """The result as JSON (``hpcstack audit --json``)."""
        return json.dumps({"target": self.target, "source": self.source, "audited": self.when,
                           "packages": [asdict(p) for p in self.packages],
                           "findings": [asdict(f) for f in self.findings],
                           "recorded": self.recorded, "note": self.note}, indent=1) + "\n"


def run_audit(packages, source, target: str, state_dir=None, title: str | None = None) -> AuditResult:
    """Audit ``packages`` against ``source`` and, with ``state_dir``, record the result there.

    Args:
        packages (list[Package]): what to audit.
        source (OsvDatabase | OsvService): the advisories.
        target (str): what is audited, for people.
        state_dir (Path | None): an installed stack's ``.hpcstack/`` to write :data:`AUDIT_RECORD` into.
        title (str | None): the stack's name for the record (default ``target``).

    Raises:
        AuditUnavailable: the live service cannot be reached.
    """
    from hpcstack.fsutil import write_atomic

    when = now_utc()
    findings = findings_for(source.records(packages), packages)
    result = AuditResult(target, source.describe(), when, list(packages), findings)
    if state_dir is not None:
        path = Path(state_dir) / AUDIT_RECORD
        try:
            write_atomic(path, record_json(title or target, packages, findings, source.describe(), when), 0o644)
            result.recorded = str(path)
        except OSError as exc:
            result.note = f"not recorded: cannot write {path} ({exc.strerror or exc})"
    return result
