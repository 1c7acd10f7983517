"""The ``Modulefile`` component: the stack's modulefile, written last (it publishes the stack)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcstack.install.components.base import PlanContext
from hpcstack.install.plan import MODULE, WriteFile
from hpcstack.modules import writer
from hpcstack.modules.envchange import EnvChange, check_changes

HELP = """\
{full_name}: {whatis}

Load it with `module load {full_name}`; it loads {base} first (depends-on).
The stack lives in {prefix} ({root_variable}); its python is on PATH and its
site-packages on PYTHONPATH.

Your own packages on top of the stack: make a venv and extend it, e.g.
    module load {full_name}
    python -m venv ~/myvenv
    extend-venv-activate ~/myvenv
Then `source ~/myvenv/bin/activate` loads this module (if it is not loaded yet) and
puts the venv first, and `deactivate` unloads it again (only if activate loaded it).
`extend-venv-activate --help` says more; `extend-venv-activate --undo ~/myvenv`
restores the venv's original activate scripts.

As a Jupyter kernel (JupyterLab, JupyterHub, Open OnDemand), in the stack's own
Python and ipykernel; the kernel loads this module when it starts:
    hpcstack kernel install {full_name} --site {site} --user
(add --venv ~/myvenv for a venv extended as above); undo it with
    hpcstack kernel remove {full_name} --site {site} --user"""


@dataclass(frozen=True)
class Modulefile:
    """Render the stack's modulefile (Tcl, or Lua for Lmod sites) and write it atomically.

    It ``depends-on`` the site's base Python module and runtime modules, prepends the stack's
    ``bin/`` and the venv's ``bin/`` to PATH and its site-packages to PYTHONPATH, sets
    ``HPCSTACK_<NAME>_ROOT``, and has ``conflict``/``family`` on the name. Nothing from the build
    environment (CUDA stubs, compilers) reaches it.

    Any component of the recipe adds to the modulefile's environment by having a method
    ``module_environment(ctx: PlanContext) -> list[EnvChange]`` (``PrependPath``, ``AppendPath``,
    ``SetEnv``, ``UnsetEnv`` from :mod:`hpcstack.modules.envchange`); the changes follow the
    stack's own PATH and PYTHONPATH entries, in recipe order. ``ctx`` there names the stack at
    its stable prefix, as users see it.

    Example:
        ``Modulefile()``
    """

    def environment(self, ctx: PlanContext) -> tuple[EnvChange, ...]:
        """Return the environment changes the recipe's components contribute, in recipe order.

        Raises:
            ValueError: a component returned something that is not an environment change (the
                component is named).
        """
        changes: list[EnvChange] = []
        for component in ctx.recipe.components:
            contribute = getattr(component, "module_environment", None)
            if contribute is not None:
                changes.extend(check_changes(contribute(ctx), type(component).__name__))
        return tuple(changes)

    def context(self, ctx: PlanContext) -> writer.ModuleContext:
        """Return the template context for this stack."""
        r, site = ctx.recipe, ctx.site
        root_var = writer.root_variable(r.name)
        help_text = HELP.format(full_name=r.full_name, whatis=r.whatis, base=site.modules.base, site=site.name,
                                prefix=ctx.prefix, root_variable=root_var)
        return writer.ModuleContext(
            name=r.name, version=r.version, whatis=r.whatis, help_lines=help_text.splitlines(),
            prefix=ctx.prefix, root_variable=root_var,
            depends_on=[site.modules.base, *site.modules.runtime],
            # prepend-path puts each entry first, so the last listed ends up first on PATH
            path_prepend=[ctx.bin_dir, f"{ctx.venv}/bin"],
            pythonpath_prepend=[ctx.site_packages],
            environment=self.environment(ctx),
            recipe=r.full_name, site=site.name, **_image_check(ctx))

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component: the modulefile, then the
        module's default version if it has none yet (``hpcstack module set-default`` moves it)."""
        syntax = ctx.site.modules.syntax
        text = writer.render_modulefile(self.context(ctx), syntax)
        default = WriteDefault(os.path.dirname(ctx.modulefile), ctx.recipe.name,
                               ctx.recipe.version, syntax, ctx.site.name)
        return {MODULE: [WriteFile(ctx.modulefile, text), default]}


@dataclass(frozen=True)
class WriteDefault:
    """Install action: write the default-version file for a module if it has no default yet.

    Runs in the ``module`` step, after the modulefile is written, so the first stack installed
    under a name becomes ``module load <name>``'s choice, and a later install never moves an
    existing default (that is ``hpcstack module set-default``'s job).

    It is a :class:`hpcstack.install.actions.WriteFile` with ``unless_exists`` (any file of
    :data:`hpcstack.modules.writer.DEFAULT_CANDIDATES`), so its dry-run bash and its execution
    are one: execution runs the printed bash, an atomic write. The writer renders the text
    (:func:`hpcstack.modules.writer.render_default`); this component's action writes it.

    Args:
        module_dir (str): ``<module root>/<name>``.
        name (str), version (str): the module, e.g. ``"pytorch"``, ``"2.3.1-gpu"``.
        syntax (str): ``tcl`` (writes ``.version``) or ``lua`` (``.modulerc.lua``).
        site (str | None): the site's name, for the file's "change it with" line.
    """

    module_dir: str
    name: str
    version: str
    syntax: str
    site: str | None = None

    @property
    def path(self) -> str:
        """The file this action writes."""
        return os.path.join(self.module_dir, writer.DEFAULT_FILES[self.syntax])

    def write(self):
        """The :class:`~hpcstack.install.actions.WriteFile` this action is."""
        return WriteFile(self.path, writer.render_default(self.name, self.version, self.syntax, self.site), 0o644,
                         unless_exists=tuple(os.path.join(self.module_dir, f) for f in writer.DEFAULT_CANDIDATES))

    def commands(self) -> tuple:
        return self.write().commands()

    def inputs(self) -> tuple[str, ...]:
        return ()

    def outputs(self) -> tuple[str, ...]:
        return (self.path,)

    def to_bash(self) -> str:
        return f"# default version, only if {self.name} has none yet\n{self.write().to_bash()}"

    def execute(self, ctx) -> None:
        ctx.log.write(f"default of {self.name}: {self.version} unless one is set in {self.module_dir}\n")
        self.write().execute(ctx)


def _image_check(ctx: PlanContext) -> dict:
    """On a ``layout: squashfs`` site: the file a load requires and the line it fails with
    (:func:`hpcstack.install.image.module_check`); else nothing."""
    from hpcstack.install import image

    if image.settings(ctx.site) is None:
        return {}
    site = ctx.site
    command = f"hpcstack mount {getattr(ctx.recipe, 'ref', '') or ctx.recipe.full_name} --site {getattr(site, 'ref', '') or site.name}"
    required, message = image.module_check(ctx.prefix, command)
    return {"load_requires": required, "load_error": message}


def render_for_prefix(site, recipe, prefix: str, python_version: str, syntax: str | None = None) -> str:
    """Render the modulefile an install of ``recipe`` at ``prefix`` writes, without installing.

    For an installed stack seen through another site config (e.g. the Lua modulefile of a
    stack that a Tcl site installed, to load it under Lmod); the prefix is only named, not read.

    Args:
        site (hpcstack.site.Site): the site (its base/runtime modules become ``depends-on``).
        recipe (hpcstack.recipe.Recipe): the loaded recipe.
        prefix (str): the stack's prefix.
        python_version (str): ``X.Y`` of the stack's venv (its ``lib/pythonX.Y``).
        syntax (str | None): ``tcl`` or ``lua``; default the site's ``modules.syntax``.

    Returns:
        str: the modulefile's text.
    """
    syntax = syntax or site.modules.syntax
    ctx = PlanContext(site=site, recipe=recipe, prefix=prefix, stage_dir="", cache_dir="",
                      python_version=python_version, jobs=1,
                      modulefile=writer.modulefile_path(site.module_root, recipe.name,
                                                         recipe.version, syntax))
    return writer.render_modulefile(Modulefile().context(ctx), syntax)
