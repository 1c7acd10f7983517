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

