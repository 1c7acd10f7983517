"""Resolve recipe + site into one :class:`hpcstack.plan.Plan` (paths, environment, commands)."""

from __future__ import annotations

import os
import subprocess

from . import modsys
from .components.base import PlanContext
from .errors import HpcstackError
from .modules import modulefile_path
from .plan import PERMISSIONS, STEP_DESCRIPTIONS, STEP_ORDER, Plan, Run, Step
from .recipe import Recipe
from .site import Site


def build_modules(site: Site) -> list[str]:
    """The modules loaded into the build environment: base, runtime, then build-only ones."""
    return [site.modules.base, *site.modules.runtime, *site.modules.build]


def build_environment(site: Site) -> dict[str, str]:
    """Return this process's environment with the site's modules loaded (real module tool).

    Raises:
        HpcstackError: the module tool or a module is missing.
    """
    return modsys.build_environment(site.modules.tool, site.modules.command, site.modules.use,
                                    build_modules(site))


def detect_python_version(env: dict[str, str]) -> str:
    """Return ``X.Y`` of the ``python3`` on the PATH of ``env``.

    Raises:
        HpcstackError: no ``python3`` there.
    """
    try:
        out = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             env=env, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise HpcstackError(f"no python3 after loading module {env.get('LOADEDMODULES', '')!r} "
                            "(modules.base in the site config)")
    return out.stdout.strip()


def resolve(recipe: Recipe, site: Site, python_version: str | None = None,
            jobs: int | None = None) -> Plan:
    """Turn a recipe and a site into a plan.

    Args:
        recipe (Recipe): loaded recipe.
        site (Site): validated site.
        python_version (str | None): ``X.Y`` of the base module's Python; default the site's
            ``python.version``, else found by loading the base module (real module tool).
        jobs (int | None): parallel build jobs; default the site's ``build.jobs``, else the core count.

    Returns:
        Plan: steps in :data:`hpcstack.plan.STEP_ORDER`, empty steps left out.

    Raises:
        ConfigError: from a component (e.g. a missing lock file).
        HpcstackError: the Python version cannot be found.
    """
    prefix = os.path.join(site.install_root, recipe.name, recipe.version)
    version = python_version or site.python_version or detect_python_version(build_environment(site))
    ctx = PlanContext(
        site=site, recipe=recipe, prefix=prefix,
        stage_dir=os.path.join(site.stage_root, f"{recipe.name}-{recipe.version}"),
        cache_dir=site.cache_dir, python_version=version,
        jobs=jobs or site.jobs or os.cpu_count() or 1,
        modulefile=modulefile_path(site.module_root, recipe.name, recipe.version, site.modules.syntax))
    actions: dict[str, list] = {name: [] for name in STEP_ORDER}
    for component in recipe.components:
        for step, acts in component.contribute(ctx).items():
            actions[step].extend(acts)
    actions[PERMISSIONS].append(Run(("chmod", "-R", "u+rwX,go+rX,go-w", prefix)))
    steps = [Step(name, STEP_DESCRIPTIONS[name], acts) for name, acts in actions.items() if acts]
    steps[-1].outputs.append(ctx.modulefile)
    return Plan(title=f"{recipe.full_name} for site {site.name}", prefix=prefix,
                modules=build_modules(site), module_use=list(site.modules.use), steps=steps,
                env={}, modulefile=ctx.modulefile)
