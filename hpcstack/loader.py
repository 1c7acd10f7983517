"""The one way in: every recipe, site config and repository a command reads, and every directory
it writes to or reads back, passes the trust rule of :mod:`hpcstack.trust` here.

A command builds one :class:`Loader` from its options (``--repo``, ``--trust-writable``,
``--admin-group``, ``--system-config``) and asks it for the search path's entries, the site and
the recipe; nothing else in hpcstack calls the raw loaders (:func:`hpcstack.site.load_site`,
:func:`hpcstack.recipe.load_recipe`, the search path of :mod:`hpcstack.repos`):
``tests/test_import_graph.py`` enforces it. In order:

1. the trust policy (:func:`hpcstack.trust.policy`): the admin group from
   ``/etc/hpcstack/config.yaml`` or ``--admin-group``, never from a file under check;
2. the search path, and every repository on it that is not built in (``--repo``,
   ``HPCSTACK_PATH``), with its ``recipes/`` and ``site-configs/``;
3. the site config's file, before it is parsed, and the file of each site it ``extends``;
4. the recipe's file (as named and as resolved) and every entry of its directory (locks,
   patches, validation files), before any of its code runs;
5. the directories the command writes to or reads back (:meth:`Loader.check_dirs`).

docs/admin/security.md describes the rule as a threat model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from hpcstack import trust
from hpcstack.recipe import Recipe, load_recipe, recipe_path
from hpcstack.repos import RECIPES, SITES, Entry, Repo, SearchPath
from hpcstack.site import Site, load_site, site_path

#: Recipe files that passed the check in this process, and the policy they passed under (a
#: recipe run again for another site, e.g. the one inside a container image, is run from here).
_CHECKED: dict[str, trust.Policy] = {}


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


class Loader:
    """The search path, the site and the recipe of one command, each checked before it is read.

    Args:
        repo_dirs (list[str] | tuple): ``--repo`` directories, in order.
        pol (hpcstack.trust.Policy): whom to trust (:func:`hpcstack.trust.policy`).
        environ (dict | None): where ``HPCSTACK_PATH`` is read (default ``os.environ``).
        note (Callable[[str], None]): receives ``note:`` lines (default: printed on stderr).

    Raises:
        ConfigError: a repository that does not exist, is no repository, or that an untrusted
            account can change (one line each, exit status 2).

    Example:
        ``loader = Loader.from_args(args); site = loader.site(args.site); recipe = loader.recipe(args.recipe, site)``
    """

    def __init__(self, repo_dirs=(), pol: trust.Policy | None = None, environ: dict | None = None,
                 note: Callable[[str], None] = _note):
        self.policy = pol or trust.policy()
        self._search = SearchPath.from_args(list(repo_dirs), environ)
        self._note = note
        self._noted: set[str] = set()
        repos = [r.path for r in self.repos]
        trust.check_inputs([*repos, *(r / d for r in repos for d in (RECIPES, SITES) if (r / d).is_dir())],
                           self.policy)

    @classmethod
    def from_args(cls, args) -> "Loader":
        """The loader of a parsed command line (``repo``, ``trust_writable``, ``admin_group``,
        ``system_config``; missing ones count as not given), built once per ``args``.

        Raises:
            ConfigError: see :class:`Loader` and :func:`hpcstack.trust.policy`.
        """
        loader = getattr(args, "_loader", None)
        if loader is None:
            pol = trust.policy(getattr(args, "admin_group", None), getattr(args, "system_config", None),
                               bool(getattr(args, "trust_writable", False)))
            loader = cls(getattr(args, "repo", None) or (), pol)
            try:
                args._loader = loader
            except AttributeError:
                pass
        return loader

    # ------------------------------------------------------------------ the search path
    @property
    def repos(self) -> list[Repo]:
        """The repositories of the search path that are not built in (``--repo``, ``HPCSTACK_PATH``)."""
        return [r for r in self._search.repos if r.origin != "built-in"]

    @property
    def search_repos(self) -> tuple:
        """Every repository of the search path, built-in last."""
        return self._search.repos

    def describe(self) -> str:
        """The search path in one line."""
        return self._search.describe()

    def entries(self, kind: str) -> list[Entry]:
        """Every recipe (``kind="recipes"``) or site (``"site-configs"``) on the search path
        (:meth:`hpcstack.repos.SearchPath.entries`); names only, nothing is run."""
        return self._search.entries(kind)

    def find(self, kind: str, name: str) -> Entry | None:
        """The entry ``name`` of ``kind`` on the search path, or None."""
        return self._search.find(kind, name)

    # ------------------------------------------------------------------ the site
    def site_file(self, spec: str) -> Path:
        """The site config ``spec`` names, checked (not read).

        Raises:
            ConfigError: unknown site; a file an untrusted account can change.
        """
        path = site_path(spec, self._search)
        trust.check_inputs([Path(os.path.abspath(path))], self.policy)
        return path

    def site(self, spec: str, install_root: str | None = None, module_root: str | None = None) -> Site:
        """Load the site ``spec`` (a name on the search path or a YAML file), checked first.

        Args:
            spec (str): ``--site``.
            install_root (str | None): ``--prefix``.
            module_root (str | None): ``--module-root``.

        Returns:
            Site: the validated site. A site that sets ``permissions.admin_group`` gets a
            ``note:`` that the key does not widen whom hpcstack trusts.

        Raises:
            ConfigError: unknown site, a file an untrusted account can change, a bad config.
        """
        self.site_file(spec)
        site = load_site(spec, install_root=install_root, module_root=module_root, search=self._search,
                         check_file=lambda base: trust.check_inputs([Path(os.path.abspath(base))], self.policy))
        trust.check_inputs(site_code_paths(site), self.policy)
        named = (site.raw.get("permissions") or {}).get("admin_group")
        if named and named != self.policy.admin_group and str(site.path) not in self._noted:
            self._noted.add(str(site.path))
            self._note(f"{site.path}: permissions.admin_group ({named}) does not change whom hpcstack trusts "
                       f"(a file under check cannot name who may write it); name the admin group in "
                       f"{trust.SYSTEM_CONFIG} (admin_group) or pass {trust.ADMIN_OPTION}")
        return site

    # ------------------------------------------------------------------ the recipe
    def recipe_file(self, spec: str) -> Path:
        """The recipe file ``spec`` names, checked with every entry of its directory (not run).

        Raises:
            ConfigError: unknown recipe; a file an untrusted account can change.
        """
        path = recipe_path(spec, self._search)
        named = Path(os.path.abspath(spec)) if Path(spec).suffix == ".py" and Path(spec).is_file() else path
        trust.check_inputs([named, path], self.policy, recurse=(path.parent,))
        _CHECKED[str(path)] = self.policy
        return path

    def recipe(self, spec: str, site: Site) -> Recipe:
        """Check, then run the recipe ``spec`` for ``site`` (:func:`hpcstack.recipe.load_recipe`).

        Raises:
            ConfigError: a file an untrusted account can change; the recipe's own problems.
        """
        self.recipe_file(spec)
        return load_recipe(spec, site, self._search)

    # ------------------------------------------------------------------ what a command writes
    def check_dirs(self, dirs: list[tuple[str, str | os.PathLike | None]], site: Site | None = None) -> None:
        """Refuse directories the command writes to or reads back that an untrusted account can
        change (:func:`hpcstack.trust.check_dirs`).

        Args:
            dirs (list[tuple[str, path]]): ``(label, directory)`` pairs.
            site (Site | None): the site whose directories they are: the group its
                ``permissions`` give its stacks may write them too (:meth:`trust.Policy.for_site_dirs`).

        Raises:
            ConfigError: one line per directory, naming whose it is and how to fix it.
        """
        trust.check_dirs(dirs, self.policy.for_site_dirs(stack_group(site)) if site else self.policy)

    def check_input_dir(self, label: str, path: str | os.PathLike) -> None:
        """Refuse a directory read as input (a bundle, an advisory database) that an untrusted
        account can change, with every entry in it.

        Raises:
            ConfigError: one line naming the path (exit status 2).
        """
        if os.path.isdir(path):
            trust.check_inputs([Path(os.path.abspath(path))], self.policy, recurse=(path,))
        else:
            trust.check_inputs([Path(os.path.abspath(path))], self.policy)


def site_code_paths(site: Site) -> list[Path]:
    """What a site config names that hpcstack runs, as root too, besides recipes: its module
    directories (``modules.use``, each with its entries one level down: a modulefile is Tcl or
    Lua that ``module load`` runs), its module command and init files, and the absolute paths of
    its toolchain (compilers, ``cuda.home`` with its ``bin/`` and stubs, ``nccl.home``). Only
    paths that exist and name no ``${VARIABLE}`` (those come from the site's own modules).

    Each is then checked as a site config is (:func:`hpcstack.trust.check_inputs`): a module
    directory a user created first, or could write, would have root run the user's modulefile.

    Args:
        site (Site): the loaded site.

    Returns:
        list[Path]: absolute paths, in the order the config names them.
    """
    raw = site.raw
    mods = raw.get("modules") or {}
    tc = raw.get("toolchain") or {}
    cuda, nccl = tc.get("cuda") or {}, tc.get("nccl") or {}
    named = [*(mods.get("use") or []), mods.get("command"), *(mods.get("init") or {}).values(),
             *(tc.get(k) for k in ("cc", "cxx", "fc")), cuda.get("home"), cuda.get("stubs"), nccl.get("home")]
    if cuda.get("home"):
        named.append(os.path.join(cuda["home"], "bin"))
    out: list[Path] = []
    for value in named:
        if not isinstance(value, str) or not os.path.isabs(value) or "$" in value or not os.path.lexists(value):
            continue
        out.append(Path(value))
        if value in (mods.get("use") or []) and os.path.isdir(value):
            try:
                out += sorted(Path(value).iterdir())[:10000]
            except OSError:
                pass
    return out


def stack_group(site: Site) -> str | None:
    """The group a site gives its stacks (``permissions.group``), None when none."""
    group = (site.raw.get("permissions") or {}).get("group")
    return group if isinstance(group, str) and group else None


def site_dirs(site: Site, stack: tuple[str, str] | None = None, *, install: bool = True,
              modules: bool = True, caches: bool = False) -> list[tuple[str, str | None]]:
    """The ``(label, directory)`` pairs of a site that a command writes to or reads back.

    Args:
        site (Site): the site (``--prefix``/``--module-root`` applied).
        stack (tuple[str, str] | None): ``(name, version)``: the stack's own directories too.
        install (bool): the install root (and hpcstack's state under it).
        modules (bool): the module root.
        caches (bool): the cache, stage and wheel cache directories.
    """
    out: list[tuple[str, str | None]] = []
    if install:
        out += [("install root", site.install_root),
                ("install root", os.path.join(site.install_root, ".hpcstack")),
                ("install root", os.path.join(site.install_root, ".hpcstack", "state")),
                ("install root", os.path.join(site.install_root, ".hpcstack", "locks"))]
        if stack:
            out.append(("install root", os.path.join(site.install_root, stack[0])))
    if modules:
        out.append(("module root", site.module_root))
        if stack:
            out.append(("module root", os.path.join(site.module_root, stack[0])))
    if caches:
        out += [("cache_dir", site.cache_dir), ("stage_root", site.stage_root),
                ("installer.wheel_cache", getattr(site.installer, "wheel_cache", None))]
    # The usage log's hooks run in every `module load` (root's too) and its records are read and
    # written by root: checked like an install root, by every command that checks the site's
    # directories, whichever of them it writes (its spool is world-writable by design, the
    # directories above and beside it are not).
    usage = ((getattr(site, "raw", None) or {}).get("lifecycle") or {}).get("usage_log")
    if usage:
        top = os.path.abspath(usage)
        out += [("lifecycle.usage_log", top), ("lifecycle.usage_log", os.path.join(top, "hooks"))]
    return out


def reload_recipe(recipe: Recipe, site: Site) -> Recipe:
    """Run an already loaded recipe again, for another site (the site inside a container image):
    from the same file, which passed the check in this process (else it is checked now, with
    the default policy).

    Raises:
        ConfigError: a file an untrusted account can change; the recipe's own problems.
    """
    path = recipe.file
    if path is None:      # made by hand: found again as its name says, through a loader
        again = Loader(pol=trust.policy()).recipe(recipe.ref or recipe.full_name, site)
        again.ref = recipe.ref
        return again
    if str(path) not in _CHECKED:
        Loader(pol=trust.policy()).recipe_file(str(path))
    again = load_recipe(str(path), site)
    again.ref = recipe.ref
    return again
