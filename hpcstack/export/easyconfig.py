"""``hpcstack export RECIPE --site S --format easyconfig``: the recipe as an EasyBuild easyconfig.

For sites that build their software with EasyBuild (4.9 or 5.x). The easyconfig installs the
same stack on the site's Python module with the ``PythonBundle`` easyblock: one ``pip install``
per extension into the install directory, then ``pip check`` (``sanity_pip_check``), which is
what hpcstack's venv + locked wheels + source build amount to. ``PythonBundle`` fits better than
``PythonPackage`` (one package) or ``Bundle`` of ``PythonPackage`` components (no shared Python
extension handling, no ``pip check``); the EasyBuild community's own PyTorch bundles
(``PyTorch-bundle``) use it too.

What goes where (EasyBuild's easyconfig parameters, https://docs.easybuild.io/version-specific/easyconfig-parameters/):

* ``exts_list``: every pin of the lock file the site would install (:meth:`PipWheels.lock_for`,
  as the install picks it) whose marker holds on the site, with its version, the file the site
  installs (wheel, else sdist), its URL and sha256 (:func:`hpcstack.export.pins.site_files`);
  then the recipe's source builds (Horovod from its sdist) with their patches and checksums and
  their build environment (``HOROVOD_*``, compilers) as ``preinstallopts``.
* ``dependencies``/``builddependencies``: the site's modules (``modules.profiles``, ``modules.hierarchy``,
  ``modules.base`` and ``modules.runtime``, in that order; ``modules.build``) as EasyBuild software names and versions
  (``python/3.12.1-gpu`` -> ``('Python', '3.12.1', '-gpu')``); ``toolchain = SYSTEM``: the
  compilers and MPI are the site's (its toolchain's ``CC``/``CXX``, set in ``preinstallopts``).
* ``sanity_check_commands``: the recipe's imports and ``horovodrun --check-build`` with each flag
  the site requires; ``sanity_check_paths``.
* ``modextrapaths``/``modextravars``: the environment of hpcstack's modulefile, with the stack's
  venv mapped onto EasyBuild's install directory (``<prefix>/venv/bin`` -> ``bin``,
  ``<prefix>/venv/lib/pythonX.Y/site-packages`` -> ``lib/python%(pyshortver)s/site-packages``).

What an easyconfig cannot express is said in a comment at the top of the file (and in
docs/exports/easybuild.md): the hpcstack-only files (``extend-venv-activate``, the validation trainer), the single
resolution with ``--require-hashes``, and the atomic publish.

The export reads each pin's index (the simple repository API) to find the file names and URLs
the lock's hashes stand for; it needs network access to those indexes.
"""

from __future__ import annotations

import os

from hpcstack import __version__
from hpcstack.errors import ConfigError
from hpcstack.export.formats import register_exporter
from hpcstack.secrets import secret_files
from hpcstack.templates import add_filters, eb_shell

#: Module names (lower case) -> EasyBuild software names, for the site's modules.
EASYBUILD_NAMES = {"python": "Python", "cmake": "CMake", "cuda": "CUDA", "nccl": "NCCL", "openmpi": "OpenMPI",
                   "gcc": "GCC", "gcccore": "GCCcore", "nvhpc": "NVHPC", "intel": "intel", "foss": "foss"}

_PYPI_FILES = "https://files.pythonhosted.org/packages/"


def easybuild_dependency(module: str, python_version: str) -> tuple:
    """An EasyBuild dependency tuple for a site module: ``(name, version[, versionsuffix])``.

    ``python/3.12.1-gpu`` -> ``('Python', '3.12.1', '-gpu')``; a module without a version
    (``python``, the localhost base module whose default is ``python/X.Y``) takes
    ``python_version`` when it is Python.

    Raises:
        ConfigError: a module other than Python without a version.
    """
    name, _, version = module.partition("/")
    eb_name = EASYBUILD_NAMES.get(name.lower(), name)
    if not version:
        if eb_name != "Python":
            raise ConfigError([f"module {module!r}: an easyconfig dependency needs a version (NAME/VERSION)"])
        version = python_version
    version, dash, suffix = version.partition("-")
    return (eb_name, version, dash + suffix) if suffix else (eb_name, version)


def pywrap(text: str, indent: int = 8, column: int | None = None, width: int = 100) -> str:
    """A Python string literal of ``text`` that keeps lines within EasyBuild's style limit (120):
    as is where it fits, else adjacent literals in parentheses, split after spaces (else after
    ``.``, ``-``, ``_`` or ``/``); the template filter ``pywrap``.

    Args:
        text (str): the string.
        indent (int): indentation of the line the literal starts on (the pieces get 4 more).
        column (int | None): the column the literal starts at (default ``indent``).
        width (int): the longest line wanted.

    Example:
        >>> pywrap("a" * 10)
        "'aaaaaaaaaa'"
    """
    if (indent if column is None else column) + len(repr(text)) <= width:
        return repr(text)
    pieces, rest, room = [], text, max(40, width - indent - 8)
    while len(rest) > room:
        cut = max(rest.rfind(" ", 0, room), rest.rfind(";", 0, room))
        if cut < room // 2:
            cut = max(rest.rfind(sep, 0, room) for sep in (".", "-", "_", "/"))
        cut = cut + 1 if cut > 0 else room
        pieces.append(rest[:cut])
        rest = rest[cut:]
    pieces.append(rest)
    pad = " " * (indent + 4)
    return "(\n" + "".join(f"{pad}{piece!r}\n" for piece in pieces) + " " * indent + ")"


add_filters({"pywrap": pywrap})


def _template_safe(text: str) -> str:
    """``%`` doubled: EasyBuild resolves ``%(name)s`` templates in every string value."""
    return text.replace("%", "%%")


def _relative(path: str, prefix: str, python_version: str) -> str | None:
    """A path under the stack's prefix as EasyBuild's install directory has it, else None."""
    if path != prefix and not path.startswith(prefix + "/"):
        return None
    rel = os.path.relpath(path, prefix)
    rel = rel[len("venv/"):] if rel.startswith("venv/") else rel
    return rel.replace(f"python{python_version}", "python%(pyshortver)s")


@register_exporter
class EasyConfig:
    """The recipe as an EasyBuild easyconfig (``PythonBundle``) for the site; see the module's
    docstring for what maps to what."""

    name = "easyconfig"
    description = ("an EasyBuild easyconfig (PythonBundle; every locked file with URL and sha256) "
                   "installing the stack on the site's Python module; patches go next to it")
    suffix = ".eb"

    def extra_files(self, recipe, site, plan) -> dict[str, str]:
        """Files EasyBuild finds next to the easyconfig: the recipe's patches, name -> path."""
        from hpcstack.install.components.source import SourceBuild

        return {p.file: os.path.join(str(recipe.directory), "patches", p.file)
                for build in recipe.components_of(SourceBuild) for p in build.patches}

    def render(self, recipe, site, plan) -> str:
        """Return the easyconfig text.

        Args:
            recipe (hpcstack.recipe.Recipe): the recipe.
            site (hpcstack.site.Site): the site.
            plan (hpcstack.install.plan.Plan): the resolved plan (for the sanity check's
                environment).

        Raises:
            ConfigError: the recipe has no locked wheels, or a site module has no version.
            HpcstackError: a package index cannot be read, or a pin has no installable file.
        """
        from hpcstack.export.pins import site_files
        from hpcstack.install.components import Imports, PipWheels
        from hpcstack.install.components.base import PlanContext
        from hpcstack.install.layout import StackLayout
        from hpcstack.install.resolve import build_environment, detect_python_version
        from hpcstack.templates import render

        python_version = site.python_version or detect_python_version(build_environment(site))
        layout = StackLayout.for_site(site, recipe.name, recipe.version)
        ctx = PlanContext(site=site, recipe=recipe, prefix=layout.prefix, stage_dir=layout.stage_dir,
                          cache_dir=site.cache_dir, python_version=python_version,
                          jobs=site.jobs or 1, modulefile=layout.modulefile)
        wheels = recipe.component(PipWheels)
        if wheels is None:
            raise ConfigError([f"recipe {recipe.full_name}: no PipWheels component: nothing to export as extensions"])
        lock = wheels.lock_for(site.toolchain, python_version, f"site {site.name}")
        lock_path = wheels.lock_path(recipe.directory, lock)
        files = site_files(lock_path, python_version)

        extensions = _extensions(files)
        builds, flags = _builds(recipe, site, ctx)
        stubs = site.toolchain.cuda_stubs
        stub_env = (f"LD_LIBRARY_PATH=%(builddir)s/cuda-stubs:{eb_shell(stubs)}:$LD_LIBRARY_PATH " if stubs else "")
        imports = [m for c in recipe.components_of(Imports) for m in c.modules]
        commands = []
        if imports:
            commands.append(f"{stub_env}python -c '" + "; ".join(f"import {m}" for m in imports) + "'")
        commands += [f"{stub_env}horovodrun --check-build | grep -F '[X] {flag}'" for flag in flags]

        paths, extra_vars, left_out = _module_env(ctx, python_version)

        version, dash, suffix = recipe.version.partition("-")
        base_modules = site.modules.stack_modules()     # the hierarchy, the base, the runtime modules
        top = imports[0].split(".")[0] if imports else recipe.name
        return render(
            "templates/easyconfig.eb.j2", hpcstack_version=__version__, recipe=recipe.full_name,
            site=site.name, lock=os.path.basename(lock_path), name=recipe.name, version=version,
            versionsuffix=dash + suffix, homepage=f"https://pypi.org/project/{top}/",
            description=recipe.whatis or recipe.full_name,
            dependencies=[easybuild_dependency(m, python_version) for m in base_modules],
            builddependencies=[easybuild_dependency(m, python_version) for m in site.modules.build],
            extensions=extensions, builds=builds, sanity_commands=commands,
            sanity_files=["bin/horovodrun"] if flags else [],
            modextrapaths=paths, modextravars=extra_vars, left_out=left_out,
            constraints=([f"{e['name']}=={e['version']}" for e in extensions]
                         + [f"{b['name']}=={b['version']}" for b in builds])
            if "PIP_CONSTRAINT" in extra_vars else [],
            python_version=python_version, pypi_files=_PYPI_FILES)


def _extensions(files) -> list[dict]:
    """The easyconfig's ``exts_list`` entries of the lock's pinned files."""
    extensions = []
    for f in files:
        base, _, download = f.url.rpartition("/")
        url_dir = base + "/"
        short = url_dir.startswith(_PYPI_FILES)
        extensions.append({
            "name": f.pin.name, "version": f.pin.version,
            "source_url": _template_safe(url_dir[len(_PYPI_FILES):] if short else url_dir),
            "pypi_files": short, "filename": _template_safe(f.filename), "sha256": f.sha256,
            # the name in the URL where it differs (torch-2.3.1%2Bcu121-…: '+' quoted)
            "download_filename": _template_safe(download) if download != f.filename else None,
            "wheel": f.is_wheel})
    return extensions


def _builds(recipe, site, ctx) -> tuple[list[dict], list[str]]:
    """The recipe's source builds as extensions (their build environment as ``preinstallopts``),
    and the Horovod flags the sanity check requires."""
    from hpcstack.install.components.horovod import HorovodBuild
    from hpcstack.install.components.source import SourceBuild

    builds = []
    stubs = site.toolchain.cuda_stubs
    stub_setup = ""
    if stubs:
        # as hpcstack's build: libcuda.so.1 -> the site's stub, for a login node without driver
        stub_setup = (f"mkdir -p %(builddir)s/cuda-stubs && ln -sfn {eb_shell(stubs + '/libcuda.so')} "
                      f"%(builddir)s/cuda-stubs/libcuda.so.1 && "
                      f"export LD_LIBRARY_PATH=%(builddir)s/cuda-stubs:{eb_shell(stubs)}:$LD_LIBRARY_PATH && ")
    flags: list[str] = []
    for build in recipe.components_of(SourceBuild):
        env = build.build_env(ctx)
        # each value one shell word (a CFLAGS of "-O2 -g" stays one; "$(...)" runs nothing)
        if not site.jobs:                     # the build host's cores, as hpcstack's default
            env["MAKEFLAGS"] = "-j$(nproc)"
        # a secret from a file is read when EasyBuild runs the build, as hpcstack's dry-run does
        files = {"${" + var + "}": path for var, path in secret_files(getattr(site, "secrets", {}) or {}).items()}
        settings = " ".join(
            f"{k}={v if (k, v) == ('MAKEFLAGS', '-j$(nproc)') else eb_shell(v)}" if v not in files
            else f'{k}="$(head -n1 {eb_shell(files[v])})"' for k, v in env.items())
        base, _, filename = build.url.rpartition("/")
        short = base.startswith(_PYPI_FILES)
        builds.append({
            "name": build.package, "version": build.version, "pypi_files": short,
            "source_url": base[len(_PYPI_FILES):] + "/" if short else base + "/",
            "filename": filename, "sha256": build.sha256,
            "patches": [{"file": p.file, "sha256": p.sha256} for p in build.patches],
            "preinstallopts": f"{stub_setup}{settings} "})
        if isinstance(build, HorovodBuild):
            flags += [f for f in build.required_flags(ctx) if f not in flags]
    return builds, flags


def _module_env(ctx, python_version: str) -> tuple[dict, dict, list[str]]:
    """The modulefile's paths and variables as ``modextrapaths`` and ``modextravars``, and the
    changes an easyconfig cannot say."""
    from hpcstack.install.components import Modulefile

    module = Modulefile().context(ctx.published())
    paths: dict[str, list[str]] = {}
    extra_vars = {module.root_variable: "%(installdir)s"}
    for var, entries in (("PATH", [*reversed(module.path_prepend)]), ("PYTHONPATH", module.pythonpath_prepend)):
        for entry in entries:
            rel = _relative(entry, module.prefix, python_version)
            if rel and rel not in paths.setdefault(var, []):
                paths[var].append(rel)
    left_out = []
    for change in module.environment:
        value = getattr(change, "value", None)
        rel = _relative(value, module.prefix, python_version) if value else None
        if change.kind in ("prepend-path", "append-path") and rel:
            paths.setdefault(change.name, []).append(rel)
        elif change.kind == "setenv":
            extra_vars[change.name] = _template_safe(value).replace(module.prefix, "%(installdir)s")
        else:
            left_out.append(f"{change.kind} {change.name}")
    return paths, extra_vars, left_out
