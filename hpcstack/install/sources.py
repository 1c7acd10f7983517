"""Where an install gets its packages from: the indexes of the lock (default), or a bundle made
by ``hpcstack bundle`` (``install --from DIR``; :mod:`hpcstack.lifecycle.bundle`).

The files' hashes are checked the same way whatever the source: the lock's with
``--require-hashes``, an sdist's with the recipe's sha256.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The directories of a bundle that an install reads (the lock's wheels, the sdists).
WHEELS, SDISTS = "wheels", "sdists"


def source_url(site, url: str) -> str:
    """Where an install gets an sdist: the bundle's copy (``install --from``) when there is a
    bundle, else ``url``.

    Args:
        site (hpcstack.site.Site): the site (``installer.bundle``).
        url (str): the sdist's URL in the recipe.
    """
    bundle = getattr(site.installer, "bundle", None)
    if bundle:
        return (Path(bundle) / SDISTS / os.path.basename(url)).as_uri()
    return url


def wheel_source_args(site) -> tuple[str, ...]:
    """The installer options that make the lock's wheels come from the bundle (``--no-index
    --find-links <bundle>/wheels``; uv and pip take both), else none.

    Args:
        site (hpcstack.site.Site): the site (``installer.bundle``).
    """
    bundle = getattr(site.installer, "bundle", None)
    if bundle:
        return ("--no-index", "--find-links", str(Path(bundle) / WHEELS))
    return ()


def index_url(site) -> str | None:
    """The site's package index (``installer.index_url``), None when the lock's indexes are used
    (and always None with a bundle: it is the only source then)."""
    if getattr(site.installer, "bundle", None):
        return None
    return getattr(site.installer, "index_url", None)


def wheel_index_args(site) -> tuple[str, ...]:
    """``--index-url <the site's index>`` for the installer when the site names one: given on
    the command line, it replaces the ``--index-url`` line of the lock (uv and pip); the lock's
    hashes still decide which files are accepted (``--require-hashes``)."""
    url = index_url(site)
    return ("--index-url", url) if url else ()


def sdist_fetch(site, package: str, url: str, sha256: str, dest: str):
    """The action that gets a recipe's sdist: from the bundle, from the site's package index
    (found on its PEP 503 project page by the file's name), or from ``url``.

    Args:
        site (hpcstack.site.Site): the site.
        package (str): the distribution name (names the index's project page).
        url (str): the sdist's URL in the recipe; its last part is the file name.
        sha256 (str): the recipe's sha256 of the sdist, checked whatever the source.
        dest (str): where the sdist goes (the download cache).

    Returns:
        hpcstack.install.actions.Fetch: the action.
    """
    from packaging.utils import canonicalize_name

    from hpcstack.install.actions import Fetch

    index = index_url(site)
    if index:
        return Fetch(url, sha256, dest, page=f"{index.rstrip('/')}/{canonicalize_name(package)}/")
    return Fetch(source_url(site, url), sha256, dest)


def find_on_page(page: str, filename: str) -> str:
    """The URL a PEP 503 ("simple") project page links for ``filename``.

    Args:
        page (str): the project page, e.g. ``https://mirror.example.org/simple/horovod/``.
        filename (str): the file, e.g. ``horovod-0.28.1.tar.gz``.

    Returns:
        str: the absolute URL of the file (without its ``#sha256=`` fragment).

    Raises:
        HpcstackError: the page cannot be read, or it does not list the file.
    """
    import html.parser
    import urllib.error
    import urllib.parse
    import urllib.request

    from hpcstack.errors import HpcstackError

    class Links(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.hrefs = []

        def handle_starttag(self, tag, attrs):
            if tag == "a":
                self.hrefs += [v for k, v in attrs if k == "href" and v]

    try:
        with urllib.request.urlopen(urllib.request.Request(page, headers={"Accept": "text/html"}),
                                    timeout=60) as resp:
            text = resp.read().decode(errors="replace")
            base = resp.geturl()
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HpcstackError(f"cannot read the package index page {page}: {getattr(exc, 'reason', None) or exc} "
                            "(installer.index_url of the site config)") from None
    parser = Links()
    parser.feed(text)
    for href in parser.hrefs:
        absolute = urllib.parse.urljoin(base, href)
        if urllib.parse.unquote(urllib.parse.urlparse(absolute).path).rsplit("/", 1)[-1] == filename:
            return urllib.parse.urldefrag(absolute)[0]
    raise HpcstackError(f"the package index page {page} lists no {filename} (installer.index_url of the site config)")
