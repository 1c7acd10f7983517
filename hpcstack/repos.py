"""The search path for recipes and site configs: a site's own repositories before the built-in ones.

A *repository* is a directory (often a git checkout a site keeps) that holds ``recipes/`` (as
``recipes/<name>/<version>.py`` with their lock files and ``patches/``) and/or ``site-configs/``
(``<site>.yaml``), laid out like hpcstack's own. The search path is, first match wins:

1. every ``--repo DIR`` on the command line, in the order given;
2. every directory of the environment variable ``HPCSTACK_PATH`` (``:``-separated);
3. the built-in data shipped in the package (:func:`hpcstack.data_root`).

A directory named more than once (``--repo`` and ``HPCSTACK_PATH``, or the built-in data) is
searched once, at its first place, so that no entry is listed as shadowing itself.

So a site's ``recipes/pytorch/2.3.1-gpu.py`` *shadows* the built-in one of the same name, as a
Spack repository listed in ``repos.yaml`` shadows ``builtin`` and EasyBuild's ``--robot-paths``
come before its own easyconfigs. ``hpcstack list`` shows each entry with the repository it comes
from and what it shadows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from hpcstack import data_root
from hpcstack.errors import ConfigError

#: Environment variable with extra repositories, ``:``-separated, searched after ``--repo``.
PATH_VARIABLE = "HPCSTACK_PATH"

#: The kinds of entry a repository holds: directory name and how its entries are named.
RECIPES = "recipes"
SITES = "site-configs"


@dataclass(frozen=True)
class Repo:
    """One directory of the search path.

    Args:
        path (Path): the repository's absolute directory.
        origin (str): where it was named: ``"--repo"``, ``"HPCSTACK_PATH"`` or ``"built-in"``.
    """

    path: Path
    origin: str

    def describe(self) -> str:
        """``"built-in (/…/hpcstack/data)"`` or ``"--repo /site/repo"``: for listings and errors."""
        return f"{self.origin} {self.path}" if self.origin != "built-in" else f"built-in ({self.path})"


@dataclass(frozen=True)
class Entry:
    """A recipe or site config found on the search path.

    Args:
        name (str): ``name/version`` for a recipe, the site name for a site config.
        path (Path): its file.
        repo (Repo): the repository it comes from (the first on the search path that has it).
        shadows (tuple[Repo, ...]): later repositories that hold an entry of the same name.
    """

    name: str
    path: Path
    repo: Repo
    shadows: tuple = field(default_factory=tuple)


@dataclass(frozen=True)
class SearchPath:
    """The ordered repositories searched for recipes and site configs.

    Build it with :meth:`from_args`; the built-in repository is always last.

    Args:
        repos (tuple[Repo, ...]): the repositories, first match wins.
    """

    repos: tuple

    @classmethod
    def from_args(cls, repo_dirs: list[str] | tuple = (), environ: dict | None = None) -> "SearchPath":
        """The search path from ``--repo`` options and ``HPCSTACK_PATH``, then the built-in data.

        Args:
            repo_dirs (list[str]): directories given with ``--repo``, in order.
            environ (dict | None): environment to read ``HPCSTACK_PATH`` from (default ``os.environ``).

        Raises:
            ConfigError: a directory that does not exist, holds neither ``recipes/`` nor
                ``site-configs/``, or whose path holds a ``$`` (the build expands ``${NAME}`` in
                its commands' words, so the lock or patch it applies would be another file than
                the one checked); one line each, naming where it was given.
        """
        environ = os.environ if environ is None else environ
        named = [(d, "--repo") for d in repo_dirs]
        named += [(d, PATH_VARIABLE) for d in environ.get(PATH_VARIABLE, "").split(":") if d]
        problems, repos = [], []
        builtin = Repo(data_root(), "built-in")
        seen = {builtin.path.resolve()}  # a directory named twice is searched once, where first named
        for directory, origin in named:
            path = Path(directory).expanduser()
            if not path.is_dir():
                problems.append(f"{origin} {directory}: no such directory")
            elif not ((path / RECIPES).is_dir() or (path / SITES).is_dir()):
                problems.append(f"{origin} {directory}: not an hpcstack repository (it holds neither "
                                f"{RECIPES}/ nor {SITES}/)")
            elif "$" in str(path.resolve()):
                problems.append(f"{origin} {directory}: its path {str(path.resolve())!r} holds a $, which the "
                                "build would expand in the commands that read its files; move or link it elsewhere")
            elif path.resolve() not in seen:
                seen.add(path.resolve())
                repos.append(Repo(path.resolve(), origin))
        if problems:
            raise ConfigError(problems)
        return cls(tuple(repos) + (builtin,))

    def describe(self) -> str:
        """The search path in one line, for "unknown recipe/site" errors."""
        return "; ".join(r.describe() for r in self.repos)

    def entries(self, kind: str) -> list[Entry]:
        """Every recipe (``kind="recipes"``) or site config (``kind="site-configs"``), first match wins.

        Returns:
            list[Entry]: sorted by name; ``shadows`` names the later repositories with the same entry.
        """
        found: dict[str, list[tuple[Path, Repo]]] = {}
        for repo in self.repos:
            for name, path in _scan(repo.path, kind):
                found.setdefault(name, []).append((path, repo))
        return [Entry(name, hits[0][0], hits[0][1], tuple(r for _, r in hits[1:]))
                for name, hits in sorted(found.items())]

    def find(self, kind: str, name: str) -> Entry | None:
        """The entry ``name`` of ``kind`` (see :meth:`entries`), or None."""
        rel = Path(name + (".py" if kind == RECIPES else ".yaml"))
        if rel.is_absolute() or ".." in rel.parts:
            return None
        hits = [(repo.path / kind / rel, repo) for repo in self.repos if (repo.path / kind / rel).is_file()]
        if not hits:
            return None
        return Entry(name, hits[0][0], hits[0][1], tuple(r for _, r in hits[1:]))


def _scan(root: Path, kind: str) -> list[tuple[str, Path]]:
    base = root / kind
    if kind == RECIPES:
        return [(str(p.relative_to(base).with_suffix("")), p) for p in sorted(base.glob("*/*.py"))]
    return [(p.stem, p) for p in sorted(base.glob("*.yaml"))]


def default_search_path() -> SearchPath:
    """``HPCSTACK_PATH`` then the built-in data (no ``--repo``): what library calls use by default."""
    return SearchPath.from_args(())
