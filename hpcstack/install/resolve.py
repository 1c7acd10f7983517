"""Resolve recipe + site into one :class:`hpcstack.install.plan.Plan` (paths, environment, commands)."""

from __future__ import annotations

import os
import subprocess

from hpcstack.modules import modsys
from hpcstack.install.components.base import PlanContext, hook
from hpcstack.secrets import secret_files
from hpcstack.install.components.sanity import merge_python_checks
from hpcstack.install.components.wheels import bytecode_levels, compile_run, freeze_argv
from hpcstack.errors import ConfigError, HpcstackError
from hpcstack.fsutil import CHILD_CWD
from hpcstack.install import image
from hpcstack.install.actions import Capture, Publish
from hpcstack.install.permissions import permission_actions
from hpcstack.install.plan import (IMAGE, INSTALL, MODULE, PERMISSIONS, SANITYCHECK, STEP_DESCRIPTIONS, STEP_ORDER, VENV, Plan,
                                   Step)
from hpcstack.recipe import Recipe
from hpcstack.site import Site


def build_modules(site: Site) -> list[str]:
    """The modules loaded into the build environment: the site's profiles and hierarchy
    (``modules.profiles``, ``modules.hierarchy``, in their order), base, runtime, then build-only ones (:meth:`hpcstack.site.ModulesConfig.build_modules`)."""
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
    """The exact names under which the site's profiles, hierarchy, base and runtime modules were loaded in ``env``.

    A site may name a module without its version (``python``: the tool's default); the stack is
    built on the one the tool loaded, and its modulefile must ``depends-on`` that one, not
    whatever ``python`` means later. Both tools list loaded modules in ``LOADEDMODULES`` by full
    name (``python/3.11``).

    Args:
        site (Site): its ``modules.profiles``, ``modules.hierarchy``, ``modules.base`` and ``modules.runtime``.
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
        starts by publishing the stage prefix (:class:`hpcstack.install.actions.Publish`) and its own
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
    levels = bytecode_levels(site.installer) if actions[VENV] else ()
    if levels:  # after the last package: bytecode for python -O / -OO (and level 0 with pip), unchecked-hash
        actions[INSTALL].append(compile_run(ctx.python, (ctx.site_packages,), levels, ctx.jobs))
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
