"""The pins of a lock file, and the one file of each that a site installs (its URL and sha256).

A lock file (``uv pip compile --generate-hashes --universal``) pins every package with the sha256
of each of its files (wheels for every platform, the sdist), but names no file. A tool that
downloads the files itself (EasyBuild) needs the file: :func:`site_files` asks each pin's
index for the files of the pinned version (the simple repository API: PEP 691 JSON where the
index speaks it, as PyPI does, else the PEP 503 HTML page with ``#sha256=`` links, as the PyTorch
index has), keeps those whose sha256 the lock holds, and picks what pip or uv would install on
the site: the wheel with the most specific tag the site's CPython ``X.Y`` on x86_64 Linux supports
(:mod:`packaging.tags`, manylinux up to glibc :data:`GLIBC`), else the sdist. Pins whose
environment marker does not hold there (``sys_platform == 'win32'``) are left out.

Sources: PEP 503, PEP 691 (simple repository API), PEP 425/600 (wheel tags), PEP 508 (markers).
"""

from __future__ import annotations

import html.parser
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from hpcstack.errors import HpcstackError
from hpcstack.install.lockfile import Pin, read_lock

#: Newest glibc the picked manylinux wheels may need (RHEL 8 and its rebuilds: 2.28).
GLIBC = (2, 28)



@dataclass(frozen=True)
class SiteFile:
    """The file of a pin that the site installs.

    Attributes:
        pin (Pin): the pin.
        filename (str): e.g. ``torch-2.3.1-cp311-cp311-manylinux1_x86_64.whl``.
        url (str): where to download it (the index's link, without its fragment).
        sha256 (str): its sha256 (one of ``pin.hashes``).
    """

    pin: Pin
    filename: str
    url: str
    sha256: str

    @property
    def is_wheel(self) -> bool:
        """A wheel (installed as is) rather than an sdist (built)."""
        return self.filename.endswith(".whl")


def applies(pin: Pin, python_version: str) -> bool:
    """Whether ``pin``'s marker holds for CPython ``X.Y`` on x86_64 Linux (:meth:`Pin.applies`)."""
    return pin.applies(python_version)


def supported_tags(python_version: str) -> list:
    """The wheel tags CPython ``X.Y`` on x86_64 Linux installs, most specific first."""
    from packaging import tags

    major, minor = (int(p) for p in python_version.split(".")[:2])
    platforms = [f"manylinux_{GLIBC[0]}_{m}_x86_64" for m in range(GLIBC[1], 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    platforms = [p for plat in platforms for p in (plat, legacy.get(int(plat.split("_")[2])))
                 if p] + ["linux_x86_64"]
    return [*tags.cpython_tags((major, minor), platforms=platforms),
            *tags.compatible_tags((major, minor), f"cp{major}{minor}", platforms=platforms)]


class _Links(html.parser.HTMLParser):
    """The ``<a href>`` links of a PEP 503 page."""

    def __init__(self):
        super().__init__()
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._href = dict(attrs).get("href")

    def handle_data(self, data):
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def index_files(index: str, name: str, timeout: float = 60) -> list[tuple[str, str, str]]:
    """The files of project ``name`` on a simple-API index, as ``(filename, url, sha256)``.

    Raises:
        HpcstackError: the index cannot be read (the URL and the reason are named).
    """
    normal = re.sub(r"[-_.]+", "-", name).lower()
    page = f"{index.rstrip('/')}/{normal}/"
    request = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
            kind = response.headers.get("Content-Type", "")
    except (urllib.error.URLError, OSError) as exc:
        raise HpcstackError(f"cannot read {page}: {getattr(exc, 'reason', exc)} (the export looks up "
                            "each pinned file's name and URL on its index)")
    if "json" in kind:
        data = json.loads(body)
        return [(f["filename"], urllib.parse.urljoin(page, f["url"]), f["hashes"].get("sha256", ""))
                for f in data.get("files", [])]
    links = _Links()
    links.feed(body.decode("utf-8", "replace"))
    files = []
    for text, href in links.links:
        url, _, fragment = urllib.parse.urljoin(page, href).partition("#")
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else ""
        files.append((text or urllib.parse.unquote(url.rsplit("/", 1)[-1]), url, sha))
    return files


def pick(pin: Pin, files: list[tuple[str, str, str]], python_version: str) -> SiteFile | None:
    """The file of ``pin`` the site installs: the best-ranked compatible wheel, else the sdist."""
    from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename

    rank = {tag: i for i, tag in enumerate(supported_tags(python_version))}
    best, sdist = None, None
    for filename, url, sha in files:
        if sha not in pin.hashes:
            continue
        if filename.endswith(".whl"):
            try:
                _, _, _, wheel_tags = parse_wheel_filename(filename)
            except InvalidWheelFilename:
                continue
            score = min((rank[t] for t in wheel_tags if t in rank), default=None)
            if score is not None and (best is None or score < best[0]):
                best = (score, SiteFile(pin, filename, url, sha))
        else:
            try:
                parse_sdist_filename(filename)
            except InvalidSdistFilename:
                continue
            sdist = sdist or SiteFile(pin, filename, url, sha)
    return best[1] if best else sdist


def site_files(lock_path: str, python_version: str, jobs: int = 8) -> list[SiteFile]:
    """The file each applicable pin of a lock installs on CPython ``X.Y``, x86_64 Linux.

    Args:
        lock_path (str): the lock file.
        python_version (str): ``X.Y`` of the site's Python.
        jobs (int): index pages read at once.

    Returns:
        list[SiteFile]: in lock order; pins whose marker does not hold are left out.

    Raises:
        ConfigError: a bad lock file.
        HpcstackError: an index cannot be read, or a pin has no file with a locked sha256 that
            the site can install (one line naming each).
    """
    pins = [p for p in read_lock(lock_path) if applies(p, python_version)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        listings = list(pool.map(lambda p: index_files(p.index, p.name), pins))
    chosen, missing = [], []
    for pin, files in zip(pins, listings):
        found = pick(pin, files, python_version)
        if found is None:
            missing.append(f"{pin.name}=={pin.version}")
        else:
            chosen.append(found)
    if missing:
        raise HpcstackError(f"{lock_path}: no file with a locked sha256 installs on CPython {python_version} "
                            f"x86_64 Linux for: {', '.join(missing)}")
    return chosen
