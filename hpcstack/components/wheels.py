"""The ``PipWheels`` component: pinned wheels from a lock file with hashes, in one resolution."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigError
from ..plan import SANITYCHECK, WHEELS, Run
from .base import PlanContext


@dataclass(frozen=True)
class PipWheels:
    """Install every package of a lock file with ``pip install --require-hashes``, then ``pip check``.

    The lock (``<stem>.<index>.lock`` next to the recipe, one per package index; the site's
    ``python.index`` picks it) is written by ``hpcstack lock`` (``uv pip compile
    --generate-hashes --universal``): every transitive package pinned with its sha256, the index
    it comes from recorded in its header and per pin. One ``pip install`` resolves them all, and
    pip refuses any file whose hash is not in the lock.

    Args:
        stem (str): lock file stem, e.g. ``"2.3.1-gpu"`` for ``2.3.1-gpu.pypi.lock``; the
            top-level requirements are in ``<stem>.in``.
        min_python (str): lowest ``X.Y`` the lock supports (it is universal: markers cover newer).
        exclude_newer (str | None): ``YYYY-MM-DD``; ``hpcstack lock`` resolves as of that date.

    Example:
        ``PipWheels("2.3.1-gpu")``

    Raises:
        ConfigError: the lock for the site's index does not exist.
    """

    stem: str
    min_python: str = "3.10"
    exclude_newer: str | None = None

    def lock_file(self, ctx: PlanContext) -> str:
        """The lock file for the site's index."""
        return str(ctx.recipe_file(f"{self.stem}.{ctx.site.index}.lock"))

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        lock = self.lock_file(ctx)
        if not os.path.isfile(lock):
            raise ConfigError([f"{lock}: no lock file for index '{ctx.site.index}' "
                               f"(run: hpcstack lock {ctx.recipe.full_name} --site {ctx.site.name})"])
        cache = os.path.join(ctx.cache_dir, "pip")
        return {
            WHEELS: [Run(ctx.pip("install", "--require-hashes", "--cache-dir", cache, "-r", lock),
                         inputs=(lock,))],
            SANITYCHECK: [Run(ctx.pip("check"))],
        }
