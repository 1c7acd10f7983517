"""One session per command: the one way in to recipes, site configs and repositories, and the one
holder of whom the command trusts.

:func:`hpcstack.cli.main` builds one :class:`Session` from the parsed command line and hands it
to the command's handler; everything under the CLI takes the session or what it loaded (no
loader cached on the arguments, no fallback policy, no callback that loads later). The session
holds, each made at most once and only when the command asks for it:

1. the trust policy (:func:`hpcstack.trust.policy`): the admin group from the root-owned
   ``/etc/hpcstack/config.yaml`` or ``--admin-group``, never from a file under check;
2. the search path, and every repository on it that is not built in (``--repo``,
   ``HPCSTACK_PATH``), with its ``recipes/`` and ``site-configs/``, checked;
3. the command's site (``--site`` with ``--prefix`` and ``--module-root``): its file checked
   before it is parsed, and the file of each site it ``extends``, and what it names that root
   runs (:func:`site_code_paths`);
4. the command's recipe for that site: its file (as named and as resolved) and every entry of
   its directory (locks, patches, validation files) checked before any of its code runs;
5. the file gate bound to the policy (:attr:`Session.gate`, :mod:`hpcstack.gate`), and the check
   of the directories the command writes to or reads back (:meth:`Session.check_dirs`).

Nothing else in hpcstack calls the raw loaders (:func:`hpcstack.site.load_site`,
:func:`hpcstack.recipe.load_recipe`, the search path of :mod:`hpcstack.repos`):
``tests/test_import_graph.py`` enforces it. docs/admin/security.md describes the rule as a
threat model.
"""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from hpcstack import gate as _gate
from hpcstack import trust
from hpcstack.errors import ConfigError

if TYPE_CHECKING:     # loaded when a command first needs a site or a recipe (jsonschema, the recipes)
    from hpcstack.recipe import Recipe
    from hpcstack.repos import Entry, Repo, SearchPath
    from hpcstack.site import Site

#: The search path's kinds of entry (:data:`hpcstack.repos.RECIPES`, :data:`hpcstack.repos.SITES`).
RECIPES, SITES = "recipes", "site-configs"

#: Recipe files a session checked in this process, with the policy and search path they passed
#: under: a recipe run again for another site (the site inside a container image) is run from
#: here (:func:`rerun_recipe`), never checked again under another policy.
_CHECKED: dict[str, tuple[trust.Policy, SearchPath]] = {}


def _note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


class BoundGate:
    """The file gate (:mod:`hpcstack.gate`) with the session's policy: the path operations of
    the gate, each walking from ``/`` by descriptor and checking every component against
    :attr:`policy`.

    Args:
        pol (hpcstack.trust.Policy): whom to trust.
    """

    def __init__(self, pol: trust.Policy):
        self.policy = pol

    def read_file(self, path: str | os.PathLike, max_bytes: int) -> bytes:
        """:func:`hpcstack.gate.read_file` under the session's policy (a regular file, at most
        ``max_bytes`` bytes). Raises :class:`hpcstack.gate.GateError` or :class:`OSError`."""
        return _gate.read_file(path, max_bytes, self.policy)

    def write_atomic(self, path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
        """:func:`hpcstack.gate.write_atomic` under the session's policy."""
        _gate.write_atomic(path, data, mode, self.policy)

    def mkdir(self, path: str | os.PathLike, mode: int, *, parents: bool = False, exact: bool = True):
        """:func:`hpcstack.gate.mkdir` under the session's policy."""
        return _gate.mkdir(path, mode, parents=parents, exact=exact, pol=self.policy)

    def directory(self, path: str | os.PathLike):
        """:func:`hpcstack.gate.directory` (a context manager giving a checked directory
        descriptor) under the session's policy."""
        return _gate.directory(path, self.policy)

    def trusting(self):
        """:func:`hpcstack.gate.trusting` with the session's policy: gate operations in the block
        that name no policy use it."""
        return _gate.trusting(self.policy)


class Session:
    """The policy, search path, site, recipe and file gate of one command, each checked before
    it is read and made at most once.

    Args:
        repo_dirs (list[str] | tuple): ``--repo`` directories, in order.
        pol (hpcstack.trust.Policy | None): whom to trust; None: :func:`hpcstack.trust.policy`
            with ``policy_args`` (made when first needed).
        policy_args (tuple): ``(admin_group, system_config, trust_writable)`` for
            :func:`hpcstack.trust.policy`.
        site (str | None): ``--site``: a name on the search path or a YAML file.
        recipe (str | None): the command's recipe (``NAME/VERSION`` or a recipe file).
        install_root (str | None): ``--prefix``.
        module_root (str | None): ``--module-root``.
        environ (dict | None): where ``HPCSTACK_PATH`` is read (default ``os.environ``).
        note (Callable[[str], None]): receives ``note:`` lines (default: printed on stderr).

    Attributes:
        loads (collections.Counter): how many times this session loaded a site (``"site"``) and
            a recipe (``"recipe"``): each of the command's own is loaded once.

    Example:
        ``session = Session.from_args(args); site, recipe = session.load(install=True)``
    """

    def __init__(self, repo_dirs=(), pol: trust.Policy | None = None, *, policy_args=(None, None, False),
                 site: str | None = None, recipe: str | None = None, install_root: str | None = None,
                 module_root: str | None = None, environ: dict | None = None,
                 note: Callable[[str], None] = _note):
        self._repo_dirs = list(repo_dirs)
        self._pol = pol
        self._policy_args = policy_args
        self.site_spec, self.recipe_spec = site, recipe
        self.install_root, self.module_root = install_root, module_root
        self._environ = environ
        self._note = note
        self._noted: set[str] = set()
        self.loads: Counter = Counter()

    @classmethod
    def from_args(cls, args) -> "Session":
        """The session of a parsed command line: ``repo``, ``admin_group``, ``system_config``,
        ``trust_writable``, ``site``, ``recipe``, ``prefix``, ``module_root`` (missing ones count
        as not given). ``--prefix`` and ``--module-root`` are checked here
        (:func:`check_dir_options`); the rest when first needed.

        Raises:
            ConfigError: a bad ``--prefix``/``--module-root`` (one line, exit status 2).
        """
        check_dir_options(args)
        return cls(getattr(args, "repo", None) or (),
                   policy_args=(getattr(args, "admin_group", None), getattr(args, "system_config", None),
                                bool(getattr(args, "trust_writable", False))),
                   site=getattr(args, "site", None), recipe=getattr(args, "recipe", None),
                   install_root=getattr(args, "prefix", None), module_root=getattr(args, "module_root", None))

    # ------------------------------------------------------------------ whom to trust
    @cached_property
    def policy(self) -> trust.Policy:
        """Whom this command trusts (:func:`hpcstack.trust.policy`), made once.

        Raises:
            ConfigError: a system configuration that is not root's alone or not valid; an
                unknown group (exit status 2).
        """
        return self._pol or trust.policy(*self._policy_args)

    @cached_property
    def gate(self) -> BoundGate:
        """The file gate with this command's policy (:class:`BoundGate`)."""
        return BoundGate(self.policy)

    # ------------------------------------------------------------------ the search path
    @cached_property
    def search(self) -> SearchPath:
        """The search path (``--repo``, ``HPCSTACK_PATH``, built-in), every repository on it that
        is not built in checked, made once.

        Raises:
            ConfigError: a repository that does not exist, is no repository, or that an untrusted
                account can change (one line each, exit status 2).
        """
        from hpcstack.repos import SearchPath

        search = SearchPath.from_args(self._repo_dirs, self._environ)
        repos = [r.path for r in search.repos if r.origin != "built-in"]
        trust.check_inputs([*repos, *(r / d for r in repos for d in (RECIPES, SITES) if (r / d).is_dir())],
                           self.policy)
        return search

    @property
    def repos(self) -> list[Repo]:
        """The repositories of the search path that are not built in (``--repo``, ``HPCSTACK_PATH``)."""
        return [r for r in self.search.repos if r.origin != "built-in"]

    @property
    def search_repos(self) -> tuple:
        """Every repository of the search path, built-in last."""
        return self.search.repos

    def describe(self) -> str:
        """The search path in one line."""
        return self.search.describe()

    def entries(self, kind: str) -> list[Entry]:
        """Every recipe (``kind="recipes"``) or site (``"site-configs"``) on the search path
        (:meth:`hpcstack.repos.SearchPath.entries`); names only, nothing is run."""
        return self.search.entries(kind)

    def find(self, kind: str, name: str) -> Entry | None:
        """The entry ``name`` of ``kind`` on the search path, or None."""
        return self.search.find(kind, name)

    def shadowing(self) -> list[str]:
        """``note:`` lines naming the command's recipe and site where they shadow built-in ones."""
        lines = []
        for kind, name, what in ((RECIPES, self.recipe_spec, "recipe"), (SITES, self.site_spec, "site")):
            entry = self.find(kind, name) if name else None
            if entry and any(r.origin == "built-in" for r in entry.shadows):
                lines.append(f"note: {what} {name} is {entry.path} from {entry.repo.describe()}; it shadows the "
                             f"built-in {what} of that name")
        return lines

    # ------------------------------------------------------------------ sites
    def site_file(self, spec: str) -> Path:
        """The site config ``spec`` names, checked (not read).

        Raises:
            ConfigError: unknown site; a file an untrusted account can change.
        """
        from hpcstack.site import site_path

        path = site_path(spec, self.search)
        trust.check_inputs([Path(os.path.abspath(path))], self.policy)
        return path

    @cached_property
    def site(self) -> Site:
        """The command's site (``--site``, with ``--prefix`` and ``--module-root``), loaded once
        (:meth:`load_site`).

        Raises:
            ConfigError: no ``--site`` on this command; see :meth:`load_site`.
        """
        if not self.site_spec:
            raise ConfigError(["this command has no --site"])
        return self.load_site(self.site_spec, install_root=self.install_root, module_root=self.module_root)

    def load_site(self, spec: str, install_root: str | None = None, module_root: str | None = None) -> Site:
        """Load the site ``spec`` (a name on the search path or a YAML file), checked first: the
        command's own is :attr:`site`; this is for a command that looks at other sites too (the
        site a kernel's stack was installed for).

        Args:
            spec (str): a site name or file.
            install_root (str | None): ``--prefix``.
            module_root (str | None): ``--module-root``.

        Returns:
            Site: the validated site. A site that sets ``permissions.admin_group`` gets a
            ``note:`` that the key does not widen whom hpcstack trusts.

        Raises:
            ConfigError: unknown site, a file an untrusted account can change, a bad config.
        """
        from hpcstack.site import load_site

        path = self.site_file(spec)
        site = load_site(spec, install_root=install_root, module_root=module_root, search=self.search,
                         check_file=lambda base: trust.check_inputs([Path(os.path.abspath(base))], self.policy),
                         path=path)
        self.loads["site"] += 1
        trust.check_inputs(site_code_paths(site), self.policy)
        named = (site.raw.get("permissions") or {}).get("admin_group")
        if named and named != self.policy.admin_group and str(site.path) not in self._noted:
            self._noted.add(str(site.path))
            self._note(f"{site.path}: permissions.admin_group ({named}) does not change whom hpcstack trusts "
                       f"(a file under check cannot name who may write it); name the admin group in "
                       f"{trust.SYSTEM_CONFIG} (admin_group) or pass {trust.ADMIN_OPTION}")
        return site

    # ------------------------------------------------------------------ recipes
    def recipe_file(self, spec: str) -> Path:
        """The recipe file ``spec`` names, checked with every entry of its directory (not run).

        Raises:
            ConfigError: unknown recipe; a file an untrusted account can change.
        """
        from hpcstack.recipe import recipe_path

        path = recipe_path(spec, self.search)
        named = Path(os.path.abspath(spec)) if Path(spec).suffix == ".py" and Path(spec).is_file() else path
        trust.check_inputs([named, path], self.policy, recurse=(path.parent,))
        _CHECKED[str(path)] = (self.policy, self.search)
        return path

    @cached_property
    def recipe(self) -> Recipe:
        """The command's recipe, run once for the command's :attr:`site` (:meth:`load_recipe`).

        Raises:
            ConfigError: no recipe on this command; see :meth:`load_recipe`.
        """
        if not self.recipe_spec:
            raise ConfigError(["this command has no recipe"])
        return self.load_recipe(self.recipe_spec, self.site)

    def load_recipe(self, spec: str, site: Site) -> Recipe:
        """Check, then run the recipe ``spec`` for ``site`` (:func:`hpcstack.recipe.load_recipe`):
        the command's own is :attr:`recipe`.

        Raises:
            ConfigError: a file an untrusted account can change; the recipe's own problems.
        """
        from hpcstack.recipe import load_recipe

        path = self.recipe_file(spec)
        recipe = load_recipe(spec, site, self.search, path=path)
        self.loads["recipe"] += 1
        return recipe

    def load(self, **dirs) -> tuple[Site, Recipe]:
        """The command's site and recipe, and (with ``dirs``, the keywords of :func:`site_dirs`)
        the directories the command writes to or reads back, each checked once: the site's
        before any code of the recipe runs (:meth:`check_site_dirs`), the stack's own once the
        recipe has named it (:meth:`check_stack_dirs`), both before anything is written.

        Returns:
            tuple[Site, Recipe]: :attr:`site` and :attr:`recipe`.

        Raises:
            ConfigError: see :attr:`site`, :attr:`recipe` and :meth:`check_dirs`.
        """
        site = self.site
        if dirs:
            self.check_site_dirs(site, **dirs)
        recipe = self.recipe
        if dirs:
            self.check_stack_dirs(site, (recipe.name, recipe.version), **dirs)
        return site, recipe

    def stack_of(self, target: str, site: Site | None = None) -> tuple[str, str]:
        """``(name, version)`` from ``NAME/VERSION`` or a recipe file (run once for ``site``,
        default :attr:`site`, checked first).

        Raises:
            ConfigError: a target of neither form (exit status 2).
        """
        if target.endswith(".py") and Path(target).is_file():
            if target == self.recipe_spec and (site is None or site is self.site):
                recipe = self.recipe
            else:
                recipe = self.load_recipe(target, site or self.site)
            return recipe.name, recipe.version
        parts = target.split("/")
        if len(parts) != 2 or not all(parts) or any(p in (".", "..") or p.startswith(".") for p in parts):
            raise ConfigError([f"{target!r}: expected NAME/VERSION (e.g. pytorch/2.3.1-gpu), a stack prefix "
                               "or a recipe file"])
        return parts[0], parts[1]

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

    def check_site_dirs(self, site: Site, stack: tuple[str, str] | None = None, **which) -> None:
        """Refuse the site's directories (:func:`site_dirs`: ``which`` are its keywords) that this
        command writes to or reads back when an untrusted account can change them.

        Raises:
            ConfigError: one line per directory (exit status 2).
        """
        self.check_dirs(site_dirs(site, stack, **which), site)

    def check_stack_dirs(self, site: Site, stack: tuple[str, str], **which) -> None:
        """Refuse the stack's own directories (those :func:`site_dirs` adds for ``stack``), after
        :meth:`check_site_dirs` checked the site's: each directory is checked once.

        Raises:
            ConfigError: one line per directory (exit status 2).
        """
        known = set(site_dirs(site, None, **which))
        self.check_dirs([d for d in site_dirs(site, stack, **which) if d not in known], site)

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


def check_dir_options(args) -> None:
    """Refuse ``--prefix``/``--module-root`` values that no venv or modulefile can hold.

    Raises:
        ConfigError: one line naming the option (exit status 2).
    """
    for opt in ("prefix", "module_root"):
        value = getattr(args, opt, None)
        if value is None:
            continue
        if not value or re.search(r"[\x00-\x20\x7f]", value):
            raise ConfigError([f"--{opt.replace('_', '-')}: {value!r}: give a directory path without "
                               "white space or control characters"])
        from hpcstack.site import dir_problem

        problem = dir_problem(value, f"--{opt.replace('_', '-')}")
        if problem:
            raise ConfigError([problem])


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


def stack_group(site: Site | None) -> str | None:
    """The group a site gives its stacks (``permissions.group``), None when none."""
    group = ((getattr(site, "raw", None) or {}).get("permissions") or {}).get("group")
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


def rerun_recipe(recipe: Recipe, site: Site) -> Recipe:
    """Run a recipe a session loaded in this process again, for another site (the site inside a
    container image): from the same file, with the search path and under the policy it was
    checked with. A recipe no session checked is refused, never checked again under a default
    policy.

    Args:
        recipe (Recipe): the recipe as the command's session loaded it.
        site (Site): the other site.

    Returns:
        Recipe: the recipe run for ``site`` (its ``ref`` kept).

    Raises:
        ConfigError: a recipe that no session of this process checked (made by hand, or read
            around the session); the recipe's own problems.
    """
    path = recipe.file
    checked = _CHECKED.get(str(path)) if path is not None else None
    if checked is None:
        raise ConfigError([f"recipe {recipe.ref or recipe.full_name}: not loaded through this command's "
                           "session, so it is not run again for another site"])
    from hpcstack.recipe import load_recipe

    again = load_recipe(str(path), site, checked[1], path=path)
    again.ref = recipe.ref
    return again
