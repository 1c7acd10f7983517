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
