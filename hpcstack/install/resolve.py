"""Resolve recipe + site into one :class:`hpcstack.install.plan.Plan` (paths, environment, commands)."""

from __future__ import annotations

import os
import re
import subprocess

from hpcstack.modules import modsys
from hpcstack.install.components.base import PlanContext, hook
from hpcstack.secrets import secret_files
from hpcstack.install.components.sanity import merge_python_checks
from hpcstack.install.components.wheels import freeze_argv
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD, current_user
from hpcstack.install import image
from hpcstack.install.plan import (IMAGE, INSTALL, MODULE, PERMISSIONS, SANITYCHECK, STEP_DESCRIPTIONS, STEP_ORDER, VENV, Capture, Plan,
                   Publish, Run, Step)
from hpcstack.recipe import Recipe
from hpcstack.site import Site

#: The permissions every stack gets: everything readable by all, directories searchable by all,
#: nothing writable by group or others; a site's ``permissions.mode`` comes after it.
BASE_MODE = "u+rwX,go+rX,go-w"
#: A symbolic ``chmod`` mode (``g+rwX``, ``g+s``, ``u=rwX,g=rX``); octal modes are refused, as
#: they would also clear the execute bits of scripts.
_SYMBOLIC_MODE = re.compile(r"^[ugoa]*([-+=]([rwxXst]*|[ugo]))+(,[ugoa]*([-+=]([rwxXst]*|[ugo]))+)*$")


def build_modules(site: Site) -> list[str]:
    """The modules loaded into the build environment: the site's hierarchy (``modules.hierarchy``,
    in its order), base, runtime, then build-only ones (:meth:`hpcstack.site.ModulesConfig.build_modules`)."""
    return site.modules.build_modules()


def build_environment(site: Site) -> dict[str, str]:
    """Return this process's environment with the site's modules loaded (real module tool).

    Raises:
        HpcstackError: the module tool or a module is missing; the message names the site file.
    """
    try:
        return modsys.build_environment(site.modules.tool, site.modules.command, site.modules.use,
                                        build_modules(site))
    except HpcstackError as exc:
        raise HpcstackError(f"{exc} [modules in {site.path}]") from None
    except ValueError as exc:  # e.g. a NUL character in a module name
        raise HpcstackError(f"cannot load the site's modules: {exc} [modules in {site.path}]") from None


def loaded_modules(site: Site, env: dict[str, str]) -> tuple[str, ...]:
    """The exact names under which the site's hierarchy, base and runtime modules were loaded in ``env``.

    A site may name a module without its version (``python``: the tool's default); the stack is
    built on the one the tool loaded, and its modulefile must ``depends-on`` that one, not
    whatever ``python`` means later. Both tools list loaded modules in ``LOADEDMODULES`` by full
    name (``python/3.11``).

    Args:
        site (Site): its ``modules.hierarchy``, ``modules.base`` and ``modules.runtime``.
        env (dict[str, str]): the build environment (:func:`build_environment`).

    Returns:
        tuple[str, ...]: per module of the site, the loaded full name (``name`` or ``name/…``),
        else the site's name as it is.
    """
    loaded = [m for m in env.get("LOADEDMODULES", "").split(":") if m]
    out = []
    for want in site.modules.stack_modules():
        out.append(next((m for m in reversed(loaded) if m == want or m.startswith(want + "/")), want))
    return tuple(out)


def detect_python_version(env: dict[str, str]) -> str:
    """Return ``X.Y`` of the ``python3`` on the PATH of ``env``.

    Raises:
        HpcstackError: no ``python3`` there.
    """
    try:
        out = subprocess.run(["python3", "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             env=env, capture_output=True, text=True, check=True, cwd=CHILD_CWD)
    except (OSError, subprocess.CalledProcessError):
        raise HpcstackError(f"no python3 after loading module {env.get('LOADEDMODULES', '')!r} "
                            "(modules.base in the site config)")
    return out.stdout.strip()


def permission_settings(site: Site) -> tuple[str | None, str]:
    """Return ``(group, chmod mode)`` for the site's stacks, from its ``permissions`` section.

    ``permissions: {group: hpcsw, mode: "g+rwX,g+s"}`` gives the stack to a shared software
    group and lets the group write it; whatever the mode, nothing is world-writable
    (``o-w`` comes last) and everything stays world-readable.

    Raises:
        ConfigError: a mode that is not a symbolic chmod mode, or one that asks for world write.
    """
    section = site.raw.get("permissions") or {}
    group, mode = section.get("group"), section.get("mode")
    full = BASE_MODE
    if mode:
        if not _SYMBOLIC_MODE.match(mode):
            raise ConfigError([f"{site.path}: permissions.mode: {mode!r} is not a symbolic chmod mode "
                               "(e.g. 'g+rwX' or 'g+rwX,g+s')"])
        if any(_gives_world_write(clause) for clause in mode.split(",")):
            raise ConfigError([f"{site.path}: permissions.mode: {mode!r} makes the stack world-writable; "
                               "give write access to a group instead (group: NAME, mode: 'g+rwX')"])
        full += f",{mode},o-w"
    return group, full


def _gives_world_write(clause: str, whom: str = "o") -> bool:
    """True if one clause of a symbolic mode (``o+w``, ``+w``, ``a=rwX``, ``o=u``) lets others
    (``whom="o"``) or the group (``whom="g"``) write."""
    who = re.match(r"^[ugoa]*", clause).group(0)
    if who and not set(who) & {whom, "a"}:
        return False
    copies = {"o": ("u", "g"), "g": ("u",)}[whom]
    return any(op in "+=" and ("w" in perms or perms in copies)
               for op, perms in re.findall(r"([-+=])([rwxXstugo]*)", clause[len(who):]))


def stack_umask(site: Site) -> int:
    """The file-mode creation mask an install runs under, whatever the admin's own umask.

    ``0o022`` (directories 0755, files 0644: readable by every user, writable by the owner
    only), or ``0o002`` where the site's ``permissions.mode`` gives the group write access
    (``g+rwX``), so that what is written after the permissions step (logs, records, the
    modulefile) follows the same rule as the rest of the stack. Spack and EasyBuild set the
    umask of their installs in the same way (EasyBuild's ``--umask``).

    Raises:
        ConfigError: a bad ``permissions`` section (see :func:`permission_settings`).
    """
    permission_settings(site)
    mode = (site.raw.get("permissions") or {}).get("mode") or ""
    return 0o002 if any(_gives_world_write(c, "g") for c in mode.split(",") if c) else 0o022


def reapply_permissions(site: Site, directory: str) -> None:
    """Give ``directory`` (recursively) the group and mode of the permissions step again.

    For the files a run writes after that step (the step records, logs and timings of the
    module step in ``<build>/.hpcstack``): the permissions step covers every file of a stack.
    Best effort: a failure here leaves the umask's modes (see :func:`stack_umask`).
    """
    group, mode = permission_settings(site)
    if not os.path.isdir(directory):
        return
    if group:
        subprocess.run(["chgrp", "-R", "-P", group, directory], capture_output=True, cwd=CHILD_CWD)
    subprocess.run(["chmod", "-R", mode, directory], capture_output=True, cwd=CHILD_CWD)


def permission_actions(site: Site, ctx: PlanContext) -> list:
    """The permissions step: group (if the site names one) and mode on the build and its parents.

    The parents (``<install_root>/<name>``, and for a build of hpcstack 0.2.0's layout the
    ``.builds`` directories under it) get the
    same group and mode without recursion, so users can reach the stack whatever the admin's
    umask; only those the installing user owns (``find -user``), as another member of a shared
    group may have made them.
    """
    group, mode = permission_settings(site)
    top = os.path.join(site.install_root, ctx.recipe.name)
    parents = [top]
    parent = os.path.dirname(ctx.build_prefix)
    while ctx.build_prefix != ctx.prefix and parent.startswith(top + os.sep):
        parents.insert(1, parent)
        parent = os.path.dirname(parent)
    owned = ("find", *parents, "-maxdepth", "0", "-user", current_user())
    actions = []
    if group:
        actions += [Run(("chgrp", "-R", "-P", group, ctx.build_prefix)),
                    Run((*owned, "-exec", "chgrp", group, "{}", "+"))]
    actions += [Run(("chmod", "-R", mode, ctx.build_prefix)), Run((*owned, "-exec", "chmod", mode, "{}", "+"))]
    return actions


def resolve(recipe: Recipe, site: Site, python_version: str | None = None,
            jobs: int | None = None, stage_prefix: str = "", build_id: str = "",
            depends_on: tuple[str, ...] = ()) -> Plan:
    """Turn a recipe and a site into a plan.

    Args:
        recipe (Recipe): loaded recipe.
        site (Site): validated site.
        python_version (str | None): ``X.Y`` of the base module's Python; default the site's
            ``python.version``, else found by loading the base module (real module tool).
        jobs (int | None): parallel build jobs; default the site's ``build.jobs``, else the core count.
        stage_prefix (str): the real directory to build in (see :mod:`hpcstack.install.layout`);
            ``""`` builds in the prefix itself (the layout before staging).
        build_id (str): the name of that build, recorded in the plan.
        depends_on (tuple[str, ...]): the exact base and runtime modules loaded
            (:func:`loaded_modules`), for the modulefile's ``depends-on``; empty: the site's names.

    Returns:
        Plan: steps in :data:`hpcstack.install.plan.STEP_ORDER`, empty steps left out. The module step
        starts by publishing the stage prefix (:class:`hpcstack.install.plan.Publish`) and its own
        actions see the stack at its stable prefix (:meth:`PlanContext.published`).

    Raises:
        ConfigError: from a component (e.g. a missing lock file), or a bad ``permissions`` section.
        HpcstackError: the Python version cannot be found.
    """
    from hpcstack.install.layout import StackLayout

    layout = StackLayout.for_site(site, recipe.name, recipe.version)
    prefix = layout.prefix
    version = python_version or site.python_version or detect_python_version(build_environment(site))
    ctx = PlanContext(
        site=site, recipe=recipe, prefix=prefix,
        stage_dir=layout.stage_dir,
        cache_dir=site.cache_dir, python_version=version,
        jobs=jobs or site.jobs or os.cpu_count() or 1,
        modulefile=layout.modulefile,
        stage_prefix="" if stage_prefix == prefix else stage_prefix, depends_on=tuple(depends_on))
    published = ctx.published()
    actions: dict[str, list] = {name: [] for name in STEP_ORDER}
    for component in recipe.components:
        planned = hook(component, "actions")   # contribute(ctx) and the component's step hooks
        try:
            contributed = planned(ctx)
            if not isinstance(contributed, dict) or not all(
                    step in actions and isinstance(acts, list) for step, acts in contributed.items()):
                raise ValueError(f"contribute(ctx) returned {type(contributed).__name__}, not a dict "
                                 f"of step name ({', '.join(STEP_ORDER)}) -> list of actions")
            for step, acts in contributed.items():
                if step != MODULE:
                    actions[step].extend(acts)
            if MODULE in contributed:  # the modulefile names the stable prefix, never one build
                actions[MODULE].extend(planned(published).get(MODULE, []))
        except ValueError as exc:  # a value of the site or recipe the component cannot use
            raise ConfigError([f"{recipe.full_name}: {type(component).__name__}: {exc} "
                               f"(check the site config {site.path} and the recipe)"]) from None
    levels = sorted(site.installer.optimization_levels) if actions[VENV] else []
    if levels:  # after the last package: bytecode for python -O / -OO beside level 0
        actions[INSTALL].append(Run((ctx.python, "-m", "compileall", "-q", "-j", str(ctx.jobs),
                                     *[a for lvl in levels for a in ("-o", str(lvl))], ctx.site_packages)))
    actions[SANITYCHECK] = merge_python_checks(actions[SANITYCHECK])  # one interpreter, one import torch
    if actions[VENV]:
        actions[SANITYCHECK].append(
            Capture(freeze_argv(ctx), os.path.join(ctx.build_prefix, ".hpcstack", "pip-freeze.txt")))
    actions[PERMISSIONS].extend(permission_actions(site, ctx))
    packed = image.settings(site)
    if packed and ctx.build_prefix != prefix:  # layout: squashfs (a build in a stage prefix only)
        actions[IMAGE] = image.image_actions(packed, ctx.build_prefix, actions[SANITYCHECK])
    actions[MODULE].insert(0, Publish(prefix, ctx.build_prefix))
    steps = [Step(name, STEP_DESCRIPTIONS[name], acts) for name, acts in actions.items() if acts]
    steps[-1].outputs += [ctx.modulefile, prefix]
    return Plan(title=f"{recipe.full_name} for site {site.name}", prefix=prefix,
                modules=build_modules(site), module_use=list(site.modules.use), steps=steps,
                modulefile=ctx.modulefile, stage_prefix=ctx.build_prefix, build_id=build_id,
                secret_files=secret_files(getattr(site, "secrets", {}) or {}))
