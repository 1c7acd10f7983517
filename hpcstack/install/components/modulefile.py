"""The ``Modulefile`` component: the stack's modulefile, written last (it publishes the stack)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpcstack.install.components.base import Component, PlanContext, hook
from hpcstack.install.actions import WriteFile
from hpcstack.install.plan import MODULE
from hpcstack.modules import writer
from hpcstack.modules.envchange import EnvChange, SetEnv, check_changes

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
Python and ipykernel; the kernel loads this module when it starts (run it with
this module loaded: it finds the site itself):
    hpcstack kernel install {full_name} --user
(add --venv ~/myvenv for a venv extended as above); undo it with
    hpcstack kernel remove {full_name} --user"""


#: The fence ``extend-venv-activate`` writes around its block in a venv's ``bin/activate``
#: (``FENCE_OPEN`` of ``templates/extend-venv-activate.j2``).
VENV_FENCE = "# >>> hpcstack {full_name} >>>"
VENV_WARNING = ("{full_name}: the active venv @VENV@ is not extended for this module, so `python` is now "
                "the stack's while `pip` installs into the venv, where that python does not look; "
                "fix: module unload {full_name}; deactivate; module load {full_name}; "
                "extend-venv-activate @VENV@; source @VENV@/bin/activate")


@dataclass(frozen=True)
class Modulefile(Component):
    """Render the stack's modulefile (Tcl, or Lua for Lmod sites) and write it atomically.

    It ``depends-on`` the site's base Python module and runtime modules (by the exact names the
    build environment loaded them under: :meth:`depends_on`), prepends the stack's
    ``bin/`` and the venv's ``bin/`` to PATH and its site-packages to PYTHONPATH, sets
    ``HPCSTACK_<NAME>_ROOT``, and has ``conflict``/``family`` on the name. Nothing from the build
    environment (CUDA stubs, compilers) reaches it.

    Any component of the recipe adds to the modulefile's environment by having a method
    ``module_environment(ctx: PlanContext) -> list[EnvChange]`` (``PrependPath``, ``AppendPath``,
    ``SetEnv``, ``UnsetEnv`` from :mod:`hpcstack.modules.envchange`); the changes follow the
    stack's own PATH and PYTHONPATH entries, in recipe order. ``ctx`` there names the stack at
    its stable prefix, as users see it.

    It also explains itself: ``whatis`` lines with the stack's key packages and their versions
    (the recipe's top-level requirements as the lock pins them, and its source builds) and
    keywords, which ``module search`` / ``module keyword`` find; ``module help`` lists those
    packages and where the full list is, what each variable it sets changes for the user (a
    component says so with ``module_help(ctx) -> list[str]``), how to launch on the site (from
    the site's ``slurm`` section and :attr:`launch`), where the examples are, and, on a site
    without CUDA, that the stack runs on CPUs there. On load it checks its ground: the stack's
    venv must be readable (else one line and a failed load), a venv active but not extended for
    it gets one line with the fix, and ``SLURM_EXPORT_ENV=NONE`` becomes ``ALL``.

    Args:
        launch (tuple[tuple[str, str], ...]): ``(what, command)`` lines for ``module help``'s
            "how to launch" section, after the generic ``srun`` one; a command may hold
            ``{ranks_per_node}`` (the site's GPUs per node, else its tasks per node).
        cpu_note (str): the line ``module help`` shows on a site without CUDA (the recipe says
            what that means for its packages).

    Example:
        ``Modulefile(launch=(("Horovod on one node", "horovodrun -np {ranks_per_node} python train.py"),))``
    """

    launch: tuple = ()
    cpu_note: str = ("This site has no GPUs (no CUDA in its toolchain): the stack's GPU builds run "
                     "on the CPUs here.")

    def environment(self, ctx: PlanContext) -> tuple[EnvChange, ...]:
        """Return the environment changes the recipe's components contribute, in recipe order.

        Raises:
            ValueError: a component returned something that is not an environment change (the
                component is named).
        """
        changes: list[EnvChange] = []
        for component in ctx.recipe.components:
            changes.extend(check_changes(hook(component, "module_environment")(ctx), type(component).__name__))
        changes.extend(SetEnv(k, v) for k, v in (getattr(ctx.site.modules, "env", None) or {}).items())
        return tuple(changes)

    def depends_on(self, ctx: PlanContext) -> list[str]:
        """The modules this one ``depends-on``, in load order: the site's profiles, module hierarchy, base
        and runtime modules (:meth:`hpcstack.site.ModulesConfig.stack_modules`), by the exact
        names the build environment loaded them under (``ctx.depends_on``, e.g. ``python/3.11``
        for a site's ``python``), else by the site's names as they are."""
        return list(ctx.depends_on) or ctx.site.modules.stack_modules()

    def help_lines(self, ctx: PlanContext) -> list[str]:
        """``module help``: :data:`HELP`, then what is inside, what the variables change, how to
        launch and where the examples are (:mod:`hpcstack.install.components.userhelp`)."""
        from hpcstack.install.components import userhelp

        r, site = ctx.recipe, ctx.site
        root_var = writer.root_variable(r.name)
        deps = self.depends_on(ctx)
        first = len(site.modules.preloads)    # the base comes after the profiles and the hierarchy
        text = HELP.format(full_name=r.full_name, whatis=r.whatis,
                           base=deps[first] if len(deps) > first else site.modules.base,
                           site=site.name, prefix=ctx.prefix, root_variable=root_var)
        contributed = []
        for component in r.components:
            contributed.extend(hook(component, "module_help")(ctx))
        return [*text.splitlines(), *userhelp.help_sections(ctx, self, contributed)]

    def context(self, ctx: PlanContext) -> writer.ModuleContext:
        """Return the template context for this stack."""
        from hpcstack.install.components import userhelp
        from hpcstack.site import status_file_path

        r, site = ctx.recipe, ctx.site
        root_var = writer.root_variable(r.name)
        return writer.ModuleContext(
            name=r.name, version=r.version, whatis=r.whatis, help_lines=self.help_lines(ctx),
            prefix=ctx.prefix, root_variable=root_var,
            depends_on=self.depends_on(ctx),
            # prepend-path puts each entry first, so the last listed ends up first on PATH
            path_prepend=[ctx.bin_dir, f"{ctx.venv}/bin"],
            pythonpath_prepend=[ctx.site_packages],
            environment=self.environment(ctx),
            recipe=r.full_name, site=site.name, **_image_check(ctx),
            whatis_lines=tuple(userhelp.whatis_lines(ctx)),
            status_file=status_file_path(site),
            venv_fence=VENV_FENCE.format(full_name=r.full_name),
            venv_warning=VENV_WARNING.format(full_name=r.full_name), export_all=True)

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
    """The file a load requires and the line it fails with: on a ``layout: squashfs`` site the
    image's (:func:`hpcstack.install.image.module_check`); else the venv's ``pyvenv.cfg``, which
    is missing or unreadable when the stack's directory is (removed, not mounted on this node,
    permissions): the load then fails with one line instead of leaving the base Python on PATH."""
    from hpcstack.install import image

    if image.settings(ctx.site) is None:
        return {"load_requires": os.path.join(ctx.venv, "pyvenv.cfg"),
                "load_error": f"{ctx.recipe.full_name}: its stack {ctx.prefix} is missing or unreadable "
                              "on this machine; tell the site's admins (`module avail "
                              f"{ctx.recipe.name}` lists the other versions)"}
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
    component = recipe.component(Modulefile) or Modulefile()
    return writer.render_modulefile(component.context(ctx), syntax)
