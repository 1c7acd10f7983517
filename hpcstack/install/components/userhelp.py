"""What a stack's module tells its users: ``whatis`` lines and the sections of ``module help``.

Users meet a stack through ``module avail``, ``module search`` (Environment Modules), ``module
keyword``/``module spider`` (Lmod) and ``module help``. These look through the ``whatis`` lines
and the help text only, so the module carries what users ask first: which packages at which
versions (the recipe's top-level requirements as its lock file pins them, and its source
builds), where the full list is (``<prefix>/.hpcstack/pip-freeze.txt``), what loading it changes
(each variable and its effect), how to launch on the site (from the site's ``slurm`` section
and the recipe's :attr:`~hpcstack.install.components.modulefile.Modulefile.launch` lines), where
the examples installed with the stack are, and, on a site without CUDA, that the stack's GPU
builds run on the CPUs there.
"""

from __future__ import annotations

import os
import textwrap

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from hpcstack.errors import ConfigError
from hpcstack.install.components.base import PlanContext, examples_of
from hpcstack.modules.writer import root_variable
from hpcstack.site import memory_option

#: The installer tools every venv has; not "key packages" of a stack.
_TOOLS = frozenset({"pip", "setuptools", "wheel"})
_WIDTH = 76


def key_packages(ctx: PlanContext) -> list[tuple[str, str]]:
    """The stack's key packages and their versions, in the recipe's order.

    The top-level requirements of the recipe's first :class:`~hpcstack.install.components.wheels.PipWheels`
    (``<stem>.in`` next to the recipe; every pin of the lock when there is none), at the versions
    the lock that fits the site pins, then the recipe's source builds (``SourceBuild``).

    Args:
        ctx (PlanContext): the install.

    Returns:
        list[tuple[str, str]]: ``(name, version)``; empty when the recipe has no lock (or its
        lock file is missing: the wheels step then fails with its own message).
    """
    from hpcstack.install.components.manifest import read_lock
    from hpcstack.install.components.source import SourceBuild
    from hpcstack.install.components.wheels import PipWheels

    out: list[tuple[str, str]] = []
    wheels = ctx.recipe.component(PipWheels)
    if wheels and ctx.recipe.directory is not None:
        try:
            lock = wheels.lock_file(ctx)
        except ConfigError:           # no lock fits the site: PipWheels says so itself
            lock = ""
        pins = read_lock(lock) if lock and os.path.isfile(lock) else []
        pinned: dict[str, str] = {}
        for pin in pins:
            # a universal lock pins some packages once per Python range (``numpy==2.2.6 ;
            # python_full_version < '3.11'``): the pin whose marker holds for the stack's Python
            if _pin_applies(pin, ctx.python_version):
                pinned.setdefault(canonicalize_name(pin.name), pin.version)
        wanted = _top_level(os.path.join(str(ctx.recipe.directory), f"{wheels.stem}.in"))
        names = wanted if wanted is not None else [pin.name for pin in pins]
        for name in dict.fromkeys(names):
            key = canonicalize_name(name)
            if key in pinned and key not in _TOOLS:
                out.append((name, pinned[key]))
    seen = {canonicalize_name(n) for n, _ in out}
    out += [(b.package, b.version) for b in ctx.recipe.components_of(SourceBuild) if canonicalize_name(b.package) not in seen]
    return out


def _pin_applies(pin, python_version: str | None) -> bool:
    """:meth:`~hpcstack.install.lockfile.Pin.applies`, and True where the stack's Python is not
    known or the marker cannot be read (module help then lists the first pin)."""
    from packaging.markers import InvalidMarker

    try:
        return not python_version or pin.applies(python_version)
    except InvalidMarker:
        return True


def _top_level(path: str) -> list[str] | None:
    """The requirement names of a ``.in`` file (comments and options skipped), None when absent."""
    if not os.path.isfile(path):
        return None
    names = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith("-"):
                continue
            try:
                names.append(Requirement(line).name)
            except InvalidRequirement:
                continue
    return names


def whatis_lines(ctx: PlanContext) -> list[str]:
    """The ``whatis`` lines after the description: version, packages, keywords, hardware.

    Returns:
        list[str]: e.g. ``["Version: 2.3.1-gpu", "Packages: torch 2.3.1, …", "Keywords: …",
        "Hardware: CPUs only on this site (no GPUs)"]``.
    """
    r, toolchain = ctx.recipe, ctx.site.toolchain
    packages = key_packages(ctx)
    lines = [f"Version: {r.version}"]
    if packages:
        lines.append("Packages: " + ", ".join(f"{n} {v}" for n, v in packages))
    words = [r.name, *(n for n, _ in packages), *getattr(r, "keywords", ())]
    lines.append("Keywords: " + ", ".join(dict.fromkeys(words)))
    if toolchain.has_cuda:
        lines.append(f"Hardware: GPUs, CUDA {toolchain.cuda_version} (site {ctx.site.name})")
    else:
        lines.append(f"Hardware: CPUs only on site {ctx.site.name} (no GPUs): GPU builds run on the CPUs")
    return lines


def _wrap(text: str, indent: str = "    ") -> list[str]:
    return textwrap.wrap(text, _WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def _variable(name: str, what: str) -> list[str]:
    return _wrap(f"{name}: {what}")


def ranks_per_node(site) -> int:
    """Ranks a node runs: the site's GPUs per node, else its Slurm tasks per node (default 1)."""
    slurm = site.slurm or {}
    return int(slurm.get("gpus_per_node") or 0) or int(slurm.get("tasks_per_node") or 1)


def sbatch_options(site) -> list[str]:
    """The ``#SBATCH`` options of a 2-node job on the site, from its ``slurm`` section: a job the
    site accepts (its QOS, whole nodes where it wants them, a budget placeholder where it charges
    one), with the tasks' shape only where ``slurm.task_options`` is ``sbatch`` (Cirrus's GPU
    nodes reject ``#SBATCH --ntasks``/``--cpus-per-task``: :func:`srun_options`), its memory option
    (``slurm.mem``, ``mem_per_cpu`` or ``mem_per_gpu``: :func:`hpcstack.site.memory_option`) and,
    last, its ``slurm.extra_options``."""
    slurm = site.slurm or {}
    opts = []
    if slurm.get("partition") and slurm.get("partition_option", True):
        opts.append(f"--partition={slurm['partition']}")
    if slurm.get("qos"):
        opts.append(f"--qos={slurm['qos']}")
    if slurm.get("account"):
        opts.append(f"--account={slurm['account']}")
    elif slurm.get("account_required"):
        opts.append("--account=BUDGET")
    if slurm.get("constraint"):
        opts.append(f"--constraint={slurm['constraint']}")
    opts.append("--nodes=2")
    if slurm.get("task_options", "sbatch") == "sbatch":
        opts.append(f"--ntasks-per-node={ranks_per_node(site)}")
        if slurm.get("cpus_per_task"):
            opts.append(f"--cpus-per-task={slurm['cpus_per_task']}")
    gpus = int(slurm.get("gpus_per_node") or 0)
    if gpus and slurm.get("gpu_request") == "gpus-per-task":   # one GPU bound to each task
        opts += [f"--ntasks={2 * ranks_per_node(site)}", "--gpus-per-task=1"]
    elif gpus:
        opts.append(f"--gpus-per-node={gpus}" if slurm.get("gpu_request") == "gpus-per-node" else f"--gres=gpu:{gpus}")
    if slurm.get("exclusive"):
        opts.append("--exclusive")
    memory = memory_option(slurm)   # slurm.mem / mem_per_cpu / mem_per_gpu: the site's jobs carry it
    opts += [memory] if memory else []
    return opts + list(slurm.get("extra_options") or ())   # slurm.extra_options, after hpcstack's own


def srun_options(site) -> list[str]:
    """The options of ``srun`` in that 2-node job: the tasks' shape where ``slurm.task_options`` is
    ``srun`` (as Cirrus's GPU examples give it: ``srun --ntasks=8 --tasks-per-node=4``), then the
    site's ``slurm.srun_options``."""
    slurm = site.slurm or {}
    opts = []
    if slurm.get("task_options", "sbatch") == "srun":
        n = ranks_per_node(site)
        opts += [f"--ntasks={2 * n}", f"--ntasks-per-node={n}"]
        if slurm.get("cpus_per_task"):
            opts.append(f"--cpus-per-task={slurm['cpus_per_task']}")
    return opts + list(slurm.get("srun_options") or ())


def examples_dir(ctx: PlanContext) -> tuple[str, tuple[str, ...]]:
    """Where the recipe's examples are installed (``<prefix>/examples``) and their names; ``("", ())``
    when no component installs any (a component's :attr:`~hpcstack.install.components.base.Component.examples`)."""
    for component in ctx.recipe.components:
        names = examples_of(component)
        if names:
            return os.path.join(ctx.prefix, "examples"), names
    return "", ()


def help_sections(ctx: PlanContext, modulefile, contributed: list[str]) -> list[str]:
    """The sections of ``module help`` after the stack's general text.

    Args:
        ctx (PlanContext): the install, as users see it (stable prefix).
        modulefile (hpcstack.install.components.modulefile.Modulefile): for its ``launch`` lines
            and ``cpu_note``.
        contributed (list[str]): the components' ``module_help`` lines (``NAME: what it changes``).

    Returns:
        list[str]: lines, sections separated by empty lines.
    """
    r, site = ctx.recipe, ctx.site
    full = r.full_name
    out: list[str] = [""]
    packages = key_packages(ctx)
    freeze = os.path.join(ctx.prefix, ".hpcstack", "pip-freeze.txt")
    out.append(f"What is in it (every package and its version: {freeze}):")
    if packages:
        out += _wrap(", ".join(f"{n} {v}" for n, v in packages))
    if not site.toolchain.has_cuda:
        out += _wrap(modulefile.cpu_note, "")
    root = root_variable(r.name)

    def rel(path: str) -> str:     # a path under the prefix, by the root variable
        return "$" + root + path[len(ctx.prefix):]

    out += ["", "What loading it changes (unloading restores each):"]
    out += _variable(root, f"{ctx.prefix}, the stack")
    out += _variable("PATH", f"{rel(ctx.venv)}/bin and {rel(ctx.bin_dir)} first: the stack's python, "
                             "extend-venv-activate, hpcstack-doctor, and a `pip` that says where your "
                             "packages go (the stack itself is read-only)")
    out += _variable("PYTHONPATH", f"{rel(ctx.site_packages)} (an extended venv puts its own first)")
    for line in contributed:
        out += _wrap(line)
    for name, value in (getattr(site.modules, "env", None) or {}).items():
        out += _variable(f"{name}={value}", "set for everyone on this site (its modules.env; "
                                            "your own value after `module load` wins)")
    out += _variable("SLURM_EXPORT_ENV", "NONE (a job of `sbatch --export=NONE`) becomes ALL, so the "
                                         "tasks srun starts get this module's environment")
    out += ["", "Your own packages: not with `pip install --user` (this module hides ~/.local,",
            "PYTHONNOUSERSITE=1) but in a venv extended for this module:",
            "    python -m venv ~/myvenv && extend-venv-activate ~/myvenv",
            "    source ~/myvenv/bin/activate && pip install PACKAGE",
            "`hpcstack-doctor` checks that venv (or, with none active, ~/.local)."]
    out += ["", f"How to launch on {site.name} (a batch script; `sbatch script`):"]
    opts = sbatch_options(site)
    out.append(f"    #SBATCH {' '.join(opts)}")
    out += hierarchy_lines(site)
    out.append(f"    module load {full}")
    srun = srun_options(site)
    if (site.slurm or {}).get("task_options", "sbatch") == "srun":    # no SLURM_CPUS_PER_TASK in the batch shell
        out.append(f"    export OMP_NUM_THREADS={(site.slurm or {}).get('cpus_per_task') or 1}")
    else:
        out.append("    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}")
    out.append(f"    {' '.join(['srun', *srun, 'python', 'train.py']):<38} # one rank per task (MPI, Horovod)")
    n = ranks_per_node(site)
    for what, command in modulefile.launch:
        out.append(f"  {what}:")
        out.append("    " + command.replace("{ranks_per_node}", str(n)))
    where, names = examples_dir(ctx)
    if where:
        out += ["", f"Examples: {where} ({', '.join(names)}); copy one to run it, e.g.",
                f"    cp -r {where}/{names[0]} ~/ && cd ~/{names[0]}"]
    return out


def hierarchy_lines(site) -> list[str]:
    """The lines of a batch script that load the site's own profiles and module hierarchy before
    the stack.

    Described from the site config, never from one site's tool: the modules of
    ``modules.profiles`` in their order, named as the site's profiles (Leonardo's
    ``profile/deeplrn``), then those of ``modules.hierarchy`` (JUWELS Booster's ``Stages/2024
    GCC/12.3.0 ParaStationMPI/5.9.2-1``), then ``module use`` of the module root after them, so
    that whatever they do to ``MODULEPATH`` (a JSC Stage sets it anew, a CINECA profile adds to
    it) leaves the root on it. The load order is :attr:`hpcstack.site.ModulesConfig.preloads`.

    Args:
        site (Site): the site; reads ``name``, ``module_root``, ``modules.profiles`` and
            ``modules.hierarchy``.

    Returns:
        list[str]: no lines for a site with neither, else one ``module load`` line for the
        profiles, one for the hierarchy, and the ``module use`` line, indented as the help's
        launch example.

    Example:
        >>> hierarchy_lines(load_site("juwels-booster"))[0]
        "    module load Stages/2024 GCC/12.3.0 ParaStationMPI/5.9.2-1   # juwels-booster's module hierarchy (modules.hierarchy), in order"
    """
    modules = site.modules
    if not modules.preloads:
        return []
    lines = []
    if modules.profiles:
        lines.append(f"    module load {' '.join(modules.profiles)}   # {site.name}'s profiles (modules.profiles), in order")
    if modules.hierarchy:
        lines.append(f"    module load {' '.join(modules.hierarchy)}   # {site.name}'s module hierarchy (modules.hierarchy), "
                     "in order")
    return [*lines, f"    module use {site.module_root}   # after them: whatever they do to MODULEPATH, the root stays on it"]
