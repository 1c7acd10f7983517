"""The install service: the lifecycle of one recipe's stack at one site.

``hpcstack install`` and ``hpcstack uninstall`` parse their arguments and print; this service
does the work in one place, in order:

1. **choose** the build (:func:`hpcstack.install.layout.choose`): up to date, in place, resume or
   new, reading the disk only;
2. **resolve** the recipe for that build, once per stage prefix (memoised: choosing a build asks
   for the same plan more than once);
3. **check** the plan's commands and compilers before anything is written
   (:func:`hpcstack.install.runner.preflight`);
4. **run** the pending steps under the stack's lock, recording provenance (the module step
   publishes the build by an atomic rename);
5. **finish**: keep the build it replaced, remove older ones;

and **uninstall**: modulefile first, then the prefix and its builds, under the same lock.

Every path comes from the :class:`hpcstack.install.layout.StackLayout` of the stack.
"""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hpcstack import gate
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.install import image, layout, provenance
from hpcstack.install.actions import describe_os_error
from hpcstack.install.plan import PERMISSIONS, Plan
from hpcstack import secrets
from hpcstack.install.permissions import permission_settings, reapply_permissions, stack_umask
from hpcstack.install.resolve import build_environment, detect_python_version, loaded_modules, resolve
from hpcstack.install.runner import Runner, install_lock, pending_steps, plan_checks, preflight


@dataclass
class InstallOutcome:
    """What :meth:`InstallService.install` did.

    Attributes:
        plan (Plan): the plan of the build it worked on.
        kind (str): ``up to date``, ``in place``, ``resume`` or ``new`` (:class:`layout.Choice`).
        ran (list[str]): the steps that ran, in order (empty when up to date).
        complete (bool): every step of the build is done (published).
        removed (list[str]): ids of earlier builds removed after the publish.
        timings (dict[str, float]): seconds per step that ran.
    """

    plan: Plan
    kind: str
    ran: list = field(default_factory=list)
    complete: bool = False
    removed: list = field(default_factory=list)
    timings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class InstalledStack:
    """A published stack, as :meth:`InstallService.installed` finds it.

    Attributes:
        prefix (str): the stable prefix users see.
        build (str): the build it points at.
        modulefile (str): its modulefile.
        provenance (dict): the build's ``.hpcstack/provenance.json`` (site, recipe, hpcstack version…).
    """

    prefix: str
    build: str
    modulefile: str
    provenance: dict

    def path(self, *parts: str) -> str:
        """A path under the stable prefix, e.g. ``path("bin", "hpcstack-train-benchmark")``."""
        return os.path.join(self.prefix, *parts)


def _lock_file_mode(st: os.stat_result) -> int | None:
    """A lock file's mode without group and other write, or None when it has neither."""
    return stat.S_IMODE(st.st_mode) & 0o755 if st.st_mode & 0o022 else None


def tighten_lock_files(dirs: list[str], pol=None) -> int:
    """Take group and other write off every ``*.lock`` file below ``dirs`` (uv makes its lock
    files 0666 whatever the umask), through :mod:`hpcstack.gate`: each directory reached by
    descriptor (the trust rule checked from ``/``, resolved as :func:`hpcstack.trust.check_dirs`
    checked it), each subdirectory entered without following a link, each file changed by
    ``fchmod`` on a descriptor of the file itself, opened with ``O_NOFOLLOW``. A link, a
    non-regular file or a file with other hard links is left alone: in a cache the site's group
    can write, a member who swaps a lock file for a link to another file changes nothing of that
    file. ``archive-v*`` (uv's unpacked wheels: no lock files) is not entered.

    Args:
        dirs (list[str]): hpcstack's own directories of the site (caches, stage root, locks).
        pol (hpcstack.trust.Policy | None): whom to trust on the way to them (default
            :func:`hpcstack.gate.current_policy`).

    Returns:
        int: how many files it changed. Errors are not raised: a directory the gate refuses,
        or a file that vanished, is skipped (this runs after the install, whose outcome stands).
    """
    changed = 0
    for d in dirs:
        try:
            top = gate.open_dir(os.path.realpath(d), pol)
        except (OSError, HpcstackError):
            continue
        try:
            for fd, names in gate.walk_files(top, skip_dir=lambda n: n.startswith("archive-v")):
                for name in names:
                    if not name.endswith(".lock"):
                        continue
                    try:
                        st = gate.fchmod(fd, name, _lock_file_mode)
                        changed += _lock_file_mode(st) is not None
                    except (OSError, HpcstackError):
                        pass
        finally:
            os.close(top)
    return changed


@contextmanager
def _umask(mask: int):
    """Run under the file-mode creation mask ``mask`` (this process and what it starts), then
    restore the caller's."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


class InstallService:
    """Install, re-install, resume and uninstall one recipe's stack for one site.

    Args:
        site (hpcstack.site.Site): the validated site (``--prefix``/``--module-root`` applied).
        recipe (hpcstack.recipe.Recipe): the loaded recipe (to uninstall, any object with ``name``
            and ``version`` will do).
        recipe_file (Path | None): the recipe's file, recorded in the stack's provenance (install).
        jobs (int | None): parallel build jobs (``--jobs``); default the site's, else the core count.
        trust (hpcstack.trust.Policy | None): whom the directories it makes and reads back
            must belong to (:mod:`hpcstack.trust`); default root and the running account only.

    Raises:
        ConfigError: ``jobs`` below 1.

    Example:
        ``InstallService(site, recipe, path).install(announce=print)``
    """

    def __init__(self, site, recipe, recipe_file: Path | None = None, jobs: int | None = None,
                 trust=None):
        if jobs is not None and jobs < 1:
            raise ConfigError(["--jobs: must be at least 1"])
        self.site, self.recipe, self.recipe_file, self.jobs = site, recipe, recipe_file, jobs
        self.trust = trust
        self.name, self.version = recipe.name, recipe.version
        self.layout = layout.StackLayout.for_site(site, self.name, self.version)
        self.modulefile, self.stage_dir = self.layout.modulefile, self.layout.stage_dir
        self._plans: dict[tuple[str, str], Plan] = {}
        self._env: dict[str, str] | None = None
        self._python: str | None = None
        #: what the last :meth:`uninstall` kept: directories no record names
        self.kept: list[str] = []

    # ------------------------------------------------------------------ resolving, once
    def build_environment(self) -> dict[str, str]:
        """This process's environment with the site's modules loaded (real module tool); once."""
        if self._env is None:
            self._env = build_environment(self.site)
        return self._env

    def _python_version(self) -> str:
        if self._python is None:
            self._python = self.site.python_version or detect_python_version(self.build_environment())
        return self._python

    def _depends_on(self) -> tuple[str, ...]:
        """The exact base and runtime modules (:func:`loaded_modules`) once the build environment
        is loaded; before that (a dry-run of a site that states its Python version loads no
        modules) the site's names."""
        return loaded_modules(self.site, self._env) if self._env is not None else ()

    def _resolver(self) -> Callable[[str, str], Plan]:
        def resolve_at(stage_prefix: str, build_id: str) -> Plan:
            key = (stage_prefix, build_id)
            if key not in self._plans:
                self._plans[key] = resolve(self.recipe, self.site, python_version=self._python_version(),
                                           jobs=self.jobs, stage_prefix=stage_prefix, build_id=build_id,
                                           depends_on=self._depends_on())
            return self._plans[key]
        return resolve_at

    def choose(self, force: bool = False) -> layout.Choice:
        """The build an install would work on now, and its plan; writes nothing."""
        return layout.choose(self.layout, self._resolver(), force=force)

    # ------------------------------------------------------------------ install
    def dry_run(self, force: bool = False, checks: bool = True) -> Plan:
        """The plan an install would run now (for ``--dry-run``); loads no modules when the
        site states its Python version, writes nothing. ``checks=False`` leaves out
        :func:`plan_checks` (for callers that only read the plan's shape).

        Raises:
            ConfigError: a check of the preflight that needs no build environment fails (the
                GPU architectures of a locked wheel, :func:`plan_checks`).
        """
        plan = self.choose(force).plan
        if checks:
            plan_checks(plan, str(self.site.path))
        return plan

    def install(self, stop_after: str | None = None, force: bool = False, wait: bool = True,
                announce: Callable[[str], None] = print) -> InstallOutcome:
        """Build in a stage prefix and publish it, or resume, or do nothing when up to date.

        Args:
            stop_after (str | None): stop after this step (``--stop-after``); the build is then
                not published and a later install continues it.
            force (bool): redo every step.
            wait (bool): wait for another install of the stack to end, else fail at once.
            announce (Callable[[str], None]): receives one line saying which build is worked on.

        Returns:
            InstallOutcome: what was done.

        Raises:
            ConfigError: a missing command or compiler, an unknown permissions group, a
                ``from_file`` secret's file that an untrusted account can change
                (:func:`hpcstack.secrets.read`) (exit 2, nothing written).
            HpcstackError: a step failed (its log is named), the lock is held (``wait=False``),
                provenance cannot be recorded. No line holds a secret's value
                (:class:`hpcstack.secrets.Redactor`: the step logs too).
        """
        env = self.build_environment()
        # the site's secret values, into the build environment only (hpcstack.secrets)
        specs = getattr(self.site, "secrets", {}) or {}
        # each from_file secret's file is refused unless only trusted accounts can change it
        env.update(secrets.read(specs, env, str(self.site.path), self.trust))
        redactor = secrets.Redactor(secrets.values(specs, env))
        try:
            return self._install(env, redactor, stop_after, force, wait, announce)
        except HpcstackError as exc:  # no secret's value in hpcstack's own error line (rule 1)
            raise redactor.error(exc) from None

    def _install(self, env: dict[str, str], redactor, stop_after: str | None, force: bool, wait: bool,
                 announce: Callable[[str], None]) -> InstallOutcome:
        """:meth:`install` once the build environment holds the secrets."""
        first = self.choose(force)                      # read-only: nothing written yet
        preflight(first.plan, env, first.pending, str(self.site.path))
        group = permission_settings(self.site)[0]
        if group and first.pending:
            import grp

            try:
                grp.getgrnam(group)
            except KeyError:
                raise ConfigError([f"{self.site.path}: permissions.group: no group {group!r} on this "
                                   "machine; create it, or set group: null"]) from None
        with _umask(stack_umask(self.site)), self._private_dirs() as private, \
                install_lock(self.layout, wait=wait, mode=self._lock_mode()):
            choice = self.choose(force)                 # again: another install may have run meanwhile
            if image.restart_packed(self.layout, choice):  # layout: squashfs, a packed build to redo
                self._plans.clear()
                choice = self.choose(force)
            elif image.unpacked_again(self.layout, choice, self.site):  # squashfs -> directory: a new build
                choice = self.choose(True)
            plan = choice.plan
            if choice.pending:
                preflight(plan, env, choice.pending, str(self.site.path))
                where = {"new": f"new build {plan.build_id} in {plan.build_prefix}; the published stack "
                                "stays as it is until the module step",
                         "resume": f"resuming build {plan.build_id} in {plan.build_prefix}",
                         "in place": f"the published build {plan.build_prefix}, in place"}[choice.kind]
                announce(f"{self.recipe.full_name}: {where}")
                layout.start(self.layout, choice)
                try:
                    provenance.record_inputs(plan, self.recipe_file, self.site)
                except OSError as exc:
                    raise HpcstackError(f"cannot record provenance in {plan.state_dir}: "
                                        f"{describe_os_error(exc)}") from None
            runner = Runner(plan, env, stop_after=stop_after, force=force, redactor=redactor)
            try:
                ran = runner.run()
                private["ran"] = bool(ran)
            finally:
                if runner.timings:
                    try:
                        provenance.record_timings(plan, runner.timings)
                    except OSError:
                        pass  # the error that stopped the run is the one to report
                if runner.timings and os.path.exists(os.path.join(plan.state_dir, "steps", f"{PERMISSIONS}.json")):
                    reapply_permissions(self.site, plan.state_dir)  # what was written after the step
            complete = not pending_steps(plan)
            removed = layout.finish(self.layout, plan) if complete else []  # also ends one cut short before
        return InstallOutcome(plan, choice.kind, list(ran or []), complete, removed, dict(runner.timings))

    def _lock_mode(self) -> int:
        """0600 (only the installing user may lock, so no other user can block an install);
        0660 where the site lets its group write the stacks (any of its admins installs)."""
        return 0o660 if stack_umask(self.site) == 0o002 else 0o600

    @contextmanager
    def _private_dirs(self):
        """hpcstack's own directories of the site (download and build caches, stage dirs, locks)
        are the installing user's only (0700; 0770 where the site's group installs), made so
        when hpcstack makes them and tightened when they are the user's own: the build tools
        write files that others could replace or lock there (uv's ``.lock`` files are 0666
        whatever the umask). What a stack is made of reaches users through the stack itself
        (hard links keep the modes the permissions step gives). Afterwards uv's lock files
        lose group and other write; not after an install that ran no step (nothing of uv ran:
        a no-op re-install walks no cache). Yields a dict whose ``ran`` the caller sets.

        Each directory, once made, must belong to an account the trust rule trusts
        (:func:`hpcstack.trust.check_dirs`): one another user made first, or under a parent
        another user can write, is refused before anything is written into it.

        Raises:
            ConfigError: such a directory (one line, naming whose it is and the fix).
        """
        from hpcstack import trust

        mode = 0o770 if self._lock_mode() == 0o660 else 0o700
        inst = self.site.installer
        labelled = [("cache_dir", self.site.cache_dir), ("stage_root", self.site.stage_root),
                    ("install root", os.path.dirname(self.layout.lock_file)),
                    *([("installer.wheel_cache", inst.wheel_cache)] if getattr(inst, "wheel_cache", None) else [])]
        dirs = [d for _, d in labelled]
        pol = (self.trust or trust.Policy(uid=os.geteuid())).for_site_dirs(permission_settings(self.site)[0])
        checked = [*labelled, ("install root", self.site.install_root), ("install root", self.layout.top)]
        trust.check_dirs(checked, pol)      # before a directory is made in a place another user owns
        for d in dirs:                      # mkdirat in each checked parent's descriptor: no link followed
            try:
                gate.mkdir(gate.resolved(os.path.abspath(d), pol), mode, parents=True, pol=pol)
            except (OSError, HpcstackError):
                pass  # the step that writes there names the problem (the check below, a refusal)
        trust.check_dirs(checked, pol)      # and again: one another user made meanwhile
        for d in dirs:                      # through a descriptor: a link at the name is not followed
            try:
                named = os.path.join(os.path.realpath(os.path.dirname(d)), os.path.basename(d))
                with gate.directory(named, pol) as fd:
                    st = os.fstat(fd)
                    if st.st_uid == os.geteuid() and st.st_mode & 0o777 != mode:
                        os.fchmod(fd, mode)
            except (OSError, HpcstackError):
                pass  # the step that writes there names the problem
        state = {"ran": True}
        try:
            with gate.trusting(pol):
                yield state
        finally:
            if state["ran"]:
                tighten_lock_files(dirs, pol)

    # ------------------------------------------------------------------ the installed stack
    def installed(self) -> "InstalledStack":
        """The published stack, found through the layout and what it records about itself.

        Raises:
            HpcstackError: nothing published, no modulefile, or the published build has no
                provenance (not installed by hpcstack); the message says how to install it.
        """
        build = self.layout.published()
        hint = (f"run: hpcstack install {getattr(self.recipe, 'ref', '') or f'{self.name}/{self.version}'} "
                f"--site {self.site.ref or self.site.name}")
        if not build or not os.path.isfile(self.modulefile):
            raise HpcstackError(f"{self.name}/{self.version} is not installed for site {self.site.name} "
                                f"(no {'modulefile ' + self.modulefile if build else self.layout.prefix}); {hint}")
        record_file = os.path.join(self.layout.provenance_dir(build), "provenance.json")
        try:
            import json

            from hpcstack import trust

            # through the gate: the build is the stack group's to write; a FIFO, a device or a
            # link there is refused, never opened by name
            pol = (self.trust or trust.Policy(uid=os.geteuid())).for_site_dirs(permission_settings(self.site)[0])
            record = json.loads(gate.read_file(gate.resolved(record_file, pol), provenance.MAX_RECORDED, pol))
        except (OSError, ValueError, RecursionError):
            raise HpcstackError(f"{self.layout.prefix} -> {build} was not installed by hpcstack (no readable "
                                f"{record_file}); {hint}") from None
        return InstalledStack(self.layout.prefix, build, self.modulefile, record)

    # ------------------------------------------------------------------ uninstall
    def uninstall(self, force: bool = False, wait: bool = True, dry_run: bool = False) -> list[str]:
        """Remove what the stack's records say it published (:mod:`hpcstack.install.records`):
        the modulefile, then the prefix and every build, then the stage dir.

        Args:
            force (bool): also when it is the module's default version (its marker goes too).
            wait (bool): wait for an install of the stack to end, else fail at once.
            dry_run (bool): only return what would be removed.

        Returns:
            list[str]: what was (or would be) removed.

        Raises:
            ConfigError: (exit 2) a path on the way is another user's or a link, a recorded path
                is not where the record says, something at the prefix has no record.
            HpcstackError: not installed for this site; the default version without ``force``.
        """
        from hpcstack.install import records

        name, version = self.name, self.version
        found = records.uninstall(self.layout, dry_run=True)   # every check, nothing removed
        self.kept = found.kept
        foreign = (f"; the modulefile {self.modulefile} is another stack's (no build under "
                   f"{self.layout.top} records it): kept"
                   if not found.recorded_modulefile and os.path.lexists(self.modulefile) else "")
        if not found.found:
            raise HpcstackError(f"{name}/{version} is not installed for site {self.site.name} (no "
                                f"{self.layout.prefix}, no modulefile {self.modulefile}{foreign}); check --site, "
                                "--prefix and --module-root")
        # the default marker goes only with a modulefile that this stack published
        marker = records.marker_of(self.layout, found)
        if marker and not force:
            raise HpcstackError(f"refusing to uninstall {name}/{version}: it is the default version of "
                                f"{name} ({marker}); make another version the default first, or use --force")
        if dry_run:
            return found.removed + ([marker] if marker else [])
        with _umask(stack_umask(self.site)), install_lock(self.layout, wait=wait, mode=self._lock_mode()):
            done = records.uninstall(self.layout)   # again, under the lock: checked and removed by descriptor
            removed = list(done.removed)
            self.kept = done.kept
            if marker and records.remove_marker(self.layout, marker):
                removed.append(f"{marker} (the default marker)")
        return removed
