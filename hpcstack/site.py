"""Site configs: load ``site-configs/<name>.yaml``, check it (:func:`check_config`), and expose it as dataclasses.

A site describes one machine, and only the machine: where stacks and modulefiles go,
which module tool it runs, which modules make the build environment, its compilers, CUDA and
NCCL (the :class:`Toolchain`), how jobs are scheduled and launched, and who may write the
stacks. What to build there and how to judge it (Horovod's operations and required flags, the
lock file, the validation workload and performance references) belongs to the recipe.
Validation follows ReFrame's site configuration: a JSON schema, and one error line per problem
with its key path (``toolchain.cuda.version: '12' does not match …``), exit status 2, before
anything is written.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from hpcstack.errors import ConfigError
from hpcstack.modules.modsys import TOOLS
from hpcstack.modules.syntax import SYNTAXES
from hpcstack.schema import load_yaml, value_problems
from hpcstack.secrets import key_problems, split_env
from hpcstack.schema import problems as schema_problems
from hpcstack.repos import SITES, SearchPath, default_search_path

#: One line of printable text (no control characters: :data:`hpcstack.schema.CONTROL`).
_TEXT = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]*$"
_STR = {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": _TEXT}
_NULL_STR = {**_STR, "type": ["string", "null"], "minLength": 0}
_STR_LIST = {"type": "array", "items": _STR, "maxItems": 256}
#: A module name as ``module load`` takes it: ``python/3.12.1-gpu``, ``PrgEnv-gnu/8.5.0``,
#: ``NCCL/default-CUDA-12`` (letters, digits and ``._+-/@:``; no white space, quotes or ``$[;``).
MODULE_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_.+/@:-]*$"
_MODULE = {"type": "string", "maxLength": 256, "pattern": MODULE_NAME}
_MODULE_LIST = {"type": "array", "items": _MODULE, "maxItems": 256}
#: An environment variable's name (POSIX: letters, digits and underscores, not starting with a digit).
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: A secret value (:mod:`hpcstack.secrets`): read when a command runs, from a variable or a file,
#: and never written anywhere.
_SECRET = {"type": "object", "additionalProperties": False, "required": ["secret"],
           "properties": {"secret": {"const": True},
                          "from_env": {"type": "string", "pattern": ENV_NAME, "maxLength": 256},
                          "from_file": {"type": "string", "minLength": 1, "maxLength": 4096,
                                        "pattern": r"^[^\x00-\x1f\x7f]+$"}},
           "oneOf": [{"required": ["from_env"]}, {"required": ["from_file"]}]}
_ENV = {"type": "object", "maxProperties": 1024,
        "propertyNames": {"pattern": ENV_NAME, "maxLength": 256},
        "additionalProperties": {"type": "string", "maxLength": 65536, "pattern": _TEXT}}
_SECRET_ENV = {**_ENV, "additionalProperties": {"oneOf": [_ENV["additionalProperties"], _SECRET]}}
_POS_INT = {"type": "integer", "minimum": 1}
#: A Slurm name (partition, QOS, account): letters, digits and ``._-``.
_SLURM_NAME = {"type": ["string", "null"], "maxLength": 256, "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"}
#: Sane upper bounds of counts (more is a typing error, and an int of 10**40 breaks code that
#: passes it on to C or to a scheduler).
MAX_RANKS = 1_048_576
MAX_NODES = 100_000
MAX_JOBS = 4096
#: A directory path: no control characters, no white space (venv scripts cannot hold it).
_PATH = {"type": "string", "minLength": 1, "maxLength": 4096, "pattern": r"^[^\x00-\x20\x7f-\x9f\u2028\u2029]+$"}


#: A directory hpcstack creates and writes into other languages (install and module roots,
#: caches, stage and output directories, ``--prefix``): letters, digits and ``._+@%~,=/-``. No
#: ``$`` (the build expands ``${NAME}`` in its commands' words: ``${IFS}`` in an install root
#: would be expanded), no ``:`` (it separates ``PATH`` entries: ``/a:b`` would add the relative
#: entry ``b/bin``), no quotes, backslashes, white space or shell characters (venv activate scripts
#: write the path inside double quotes, where `` ` `` and ``$`` run).
DIR_PATH = re.compile(r"[\w.+@%~,=/-]+")
#: Site config keys that hold such a directory.
DIR_KEYS = (("install_root",), ("module_root",), ("cache_dir",), ("stage_root",), ("slurm", "output_root"),
            ("lifecycle", "usage_log"))


def dir_problem(value: str, what: str) -> str | None:
    """The line that refuses ``value`` as a directory hpcstack writes (:data:`DIR_PATH`), or None.

    Args:
        value (str): the path.
        what (str): where it comes from (``"site.yaml: install_root"``, ``"--prefix"``).
    """
    if DIR_PATH.fullmatch(value):
        return None
    bad = "".join(sorted({c for c in value if not DIR_PATH.fullmatch(c)}))
    return (f"{what}: {value[:80]!r}: a directory path holds letters, digits and ._+@%~,=/- only, not "
            f"{bad[:20]!r} (it is written into scripts, modulefiles and PATH, and the build expands ${{NAME}})")


def _dir_problems(data: dict, where: str) -> list[str]:
    """:func:`dir_problem` lines for the :data:`DIR_KEYS` of a config the schema accepted."""
    lines = []
    for keys in DIR_KEYS:
        value = data
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str):
            line = dir_problem(value, f"{where}: {'.'.join(keys)}")
            if line:
                lines.append(line)
    return lines


#: What an ``#SBATCH`` line's value may not hold. sbatch reads those lines itself, not a shell:
#: white space ends the value (the rest becomes more options: ``--output=/x a --export=ALL``),
#: quotes and ``\\`` are read as quoting, an unquoted ``#`` ends the line (Slurm's
#: ``src/sbatch/opt.c``, ``_get_argument``), and control characters end the line in the script.
#: hpcstack refuses these rather than quote them (here for ``slurm.extra_options``; the job
#: scripts' own values: :func:`hpcstack.validate.scheduler.check_sbatch_value`).
SBATCH_UNSAFE = re.compile(r"[\s\"'\\#\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: The memory keys of ``slurm``, each the sbatch option of its name (``mem_per_cpu`` is
#: ``--mem-per-cpu``): per node, per allocated CPU, per allocated GPU. sbatch(1)
#: (https://slurm.schedmd.com/sbatch.html, ``--mem``): "The --mem, --mem-per-cpu and
#: --mem-per-gpu options are mutually exclusive", so a site gives at most one.
MEMORY_KEYS = ("mem", "mem_per_cpu", "mem_per_gpu")
#: A memory size as sbatch takes it: an integer, megabytes unless a suffix K, M, G or T says
#: otherwise (sbatch(1), ``--mem``: "Different units can be specified using the suffix [K|M|G|T]";
#: ``--mem=0`` asks for all the memory of each node).
MEMORY_SIZE = r"^[0-9]{1,15}[KMGT]?$"
_MEMORY = {"type": ["string", "integer", "null"], "maxLength": 16, "pattern": MEMORY_SIZE,
           "minimum": 0, "maximum": 10 ** 15}

#: The ``#SBATCH`` options hpcstack's jobs write themselves, each with the key (or command-line
#: option) that sets it: ``slurm.extra_options`` may not give them (a second ``--time`` line would
#: silently win over ``slurm.time_limit``, an ``--output`` move the file the validation reads).
#: Aliases count (``--tasks-per-node``), and so do abbreviations: sbatch reads its options with
#: ``getopt_long``, which takes any unambiguous prefix of a long option (``--part=gpu``).
SBATCH_OWN = {
    "job-name": "none (hpcstack names its jobs hpcstack-validate-<recipe>-n<nodes>)",
    "partition": "slurm.partition (or --partition)",
    "qos": "slurm.qos (or --qos)",
    "account": "slurm.account (or --account)",
    "nodes": "none (the node counts are the recipe's, or hpcstack validate --nodes)",
    "ntasks": "slurm.tasks_per_node",
    "ntasks-per-node": "slurm.tasks_per_node",
    "tasks-per-node": "slurm.tasks_per_node",
    "ntasks-per-gpu": "slurm.tasks_per_node and slurm.gpu_request",
    "cpus-per-task": "slurm.cpus_per_task",
    "cpus-per-gpu": "slurm.cpus_per_task",
    "gres": "slurm.gpus_per_node and slurm.gpu_request",
    "gpus": "slurm.gpus_per_node and slurm.gpu_request",
    "gpus-per-node": "slurm.gpus_per_node and slurm.gpu_request",
    "gpus-per-task": "slurm.gpus_per_node and slurm.gpu_request",
    "gpus-per-socket": "slurm.gpus_per_node and slurm.gpu_request",
    "constraint": "slurm.constraint",
    "exclusive": "slurm.exclusive",
    "mem": "slurm.mem",
    "mem-per-cpu": "slurm.mem_per_cpu",
    "mem-per-gpu": "slurm.mem_per_gpu",
    "time": "slurm.time_limit",
    "output": "slurm.output_root (or hpcstack validate --output-dir)",
    "error": "slurm.output_root (stdout and stderr both go to hpcstack's --output)",
    "chdir": "slurm.output_root (or hpcstack validate --output-dir)",
    "export": "slurm.env (the jobs start from --export=NONE and load their modules)",
}
#: A long option of ``slurm.extra_options``: ``--name`` or ``--name=value``.
_LONG_OPTION = re.compile(r"--([a-z][a-z0-9-]*)(=.+)?")


def extra_option_problem(option: str) -> str | None:
    """Why ``option`` cannot be one of ``slurm.extra_options``, or None when it can.

    Args:
        option (str): the option as the site gives it, e.g. ``"--reservation=maint"``.

    Returns:
        str | None: the reason (without the key path): a character an ``#SBATCH`` line cannot
        hold (:data:`SBATCH_UNSAFE`), no long option, or an option hpcstack sets itself
        (:data:`SBATCH_OWN`, with the key to use instead).

    Example:
        >>> extra_option_problem("--time=2:00:00")
        'hpcstack sets --time itself: use slurm.time_limit'
        >>> extra_option_problem("--reservation=maint") is None
        True
    """
    if SBATCH_UNSAFE.search(option):
        return ("an #SBATCH line cannot hold white space, quotes, backslashes, # or control characters "
                "(sbatch reads the line itself, not a shell); write one option as --name=value")
    match = _LONG_OPTION.fullmatch(option)
    if not match:
        return "not a long option: write --name or --name=value (sbatch(1)'s long form)"
    name = match.group(1)
    full = name if name in SBATCH_OWN else next((o for o in SBATCH_OWN if o.startswith(name)), None)
    if full is None:
        return None
    what = f"--{name}" if name == full else f"--{name} (sbatch reads it as --{full})"
    return f"hpcstack sets {what} itself: use {SBATCH_OWN[full]}"


def memory_option(slurm: dict) -> str | None:
    """The sbatch memory option a site's ``slurm`` section asks for (:data:`MEMORY_KEYS`), or None.

    Args:
        slurm (dict): the ``slurm`` section, checked (at most one memory key is set).

    Example:
        >>> memory_option({"partition": "gpu", "mem_per_gpu": "120G"})
        '--mem-per-gpu=120G'
    """
    for key in MEMORY_KEYS:
        if slurm.get(key) is not None:
            return f"--{key.replace('_', '-')}={slurm[key]}"
    return None


def _slurm_problems(data: dict, where: str) -> list[str]:
    """Lines for ``slurm`` values the schema accepts one by one but not together, or that sbatch
    cannot take:

    * ``gpu_request: gpus-per-task`` asks for one GPU per task (``--gpus-per-task=1``) with one
      task per GPU (``--ntasks-per-node`` = ``gpus_per_node``) and needs the task count as
      ``#SBATCH`` options (sbatch(1), ``--gpus-per-task``: "This option requires an explicit task
      count").
    * at most one of ``mem``, ``mem_per_cpu``, ``mem_per_gpu`` (:data:`MEMORY_KEYS`).
    * each of ``extra_options`` (:func:`extra_option_problem`), one line each.
    """
    slurm = data.get("slurm") if isinstance(data.get("slurm"), dict) else {}
    lines = []
    memory = [key for key in MEMORY_KEYS if slurm.get(key) is not None]
    if len(memory) > 1:
        lines.append(f"{where}: slurm.{memory[1]}: give one of slurm.mem, slurm.mem_per_cpu, slurm.mem_per_gpu, "
                     f"not {' and '.join('slurm.' + k for k in memory)} (sbatch: --mem, --mem-per-cpu and "
                     "--mem-per-gpu are mutually exclusive, https://slurm.schedmd.com/sbatch.html)")
    for i, option in enumerate(slurm.get("extra_options") or ()):
        why = extra_option_problem(option)
        if why:
            lines.append(f"{where}: slurm.extra_options.{i}: {option[:80]!r}: {why}")
    if slurm.get("gpu_request") != "gpus-per-task":
        return lines
    gpus, tasks = slurm.get("gpus_per_node", 0), slurm.get("tasks_per_node", 1)
    key = f"{where}: slurm.gpu_request"
    if not gpus:
        return lines + [f"{key}: gpus-per-task needs slurm.gpus_per_node > 0"]
    if tasks != gpus:
        lines.append(f"{key}: gpus-per-task runs one task per GPU: slurm.tasks_per_node is {tasks}, "
                     f"slurm.gpus_per_node {gpus}; make them equal")
    if slurm.get("task_options") == "srun":
        lines.append(f"{key}: gpus-per-task needs the task count as #SBATCH options (sbatch: "
                     "--gpus-per-task requires an explicit task count); slurm.task_options is srun")
    return lines


#: The ``srun`` options of ``build.batch_job``'s step that hpcstack writes itself, each with the
#: key that sets it (:func:`hpcstack.install.batch.srun_argv`); ``build.batch_job.srun_options``
#: may not give them, nor an abbreviation (srun reads its options with ``getopt_long`` too).
SRUN_OWN = {
    "partition": "build.batch_job.partition",
    "time": "build.batch_job.time_limit",
    "cpus-per-task": "build.batch_job.cpus_per_task",
    "qos": "build.batch_job.qos",
    "account": "build.batch_job.account",
    "nodes": "none (the build is one task on one node)",
    "ntasks": "none (the build is one task on one node)",
    "ntasks-per-node": "none (the build is one task on one node)",
    "job-name": "none (the step is named hpcstack-build)",
    "export": "none (the step gets the login node's environment and hpcstack's marker)",
    "quit-on-interrupt": "none (hpcstack sets it: one Ctrl-C cancels the step)",
    "output": "none (the step's output is streamed to the terminal)",
    "error": "none (the step's output is streamed to the terminal)",
    "input": "none (the step reads no input)",
    "pty": "none (the step's output is streamed to the terminal)",
    "jobid": "none (the step gets an allocation of its own)",
    "mpi": "none (the build is no MPI job: --mpi=none, and its processes do not see the step's variables)",
}


def batch_option_problem(option: str) -> str | None:
    """Why ``option`` cannot be one of ``build.batch_job.srun_options``, or None when it can.

    Args:
        option (str): the option as the site gives it (the schema checked its form), e.g.
            ``"--mem=16G"``.

    Returns:
        str | None: the reason (without the key path): an option hpcstack sets itself
        (:data:`SRUN_OWN`), or an abbreviation of one, with the key to use instead.

    Example:
        >>> batch_option_problem("--time=2:00:00")
        'hpcstack sets --time itself: use build.batch_job.time_limit'
        >>> batch_option_problem("--mem=16G") is None
        True
    """
    name = option[2:].split("=", 1)[0]
    full = name if name in SRUN_OWN else next((o for o in SRUN_OWN if o.startswith(name)), None)
    if full is None:
        return None
    what = f"--{name}" if name == full else f"--{name} (srun reads it as --{full})"
    return f"hpcstack sets {what} itself: use {SRUN_OWN[full]}"


def _batch_job_problems(data: dict, where: str) -> list[str]:
    """Lines for ``build.batch_job.srun_options`` that hpcstack sets itself (:func:`batch_option_problem`)."""
    job = (data.get("build") or {}).get("batch_job") if isinstance(data.get("build"), dict) else None
    if not isinstance(job, dict):
        return []
    return [f"{where}: build.batch_job.srun_options.{i}: {option[:80]!r}: {why}"
            for i, option in enumerate(job.get("srun_options") or ()) if (why := batch_option_problem(option))]


#: Keys a site config held before sites described only the machine, and where they went.
_MOVED = {
    "horovod": " (Horovod's operations and flags are the recipe's HorovodBuild; compilers, CUDA and "
               "NCCL go in toolchain)",
    "python.index": " (the recipe picks its lock file from the site's CUDA and Python)",
    "validation": " (the workload is the recipe's: its Validation component)",
    "references": " (performance references are the recipe's: its Validation component)",
}


#: A site's name (and so its file's stem): lower-case letters, digits, ``_`` and ``-``.
SITE_NAME = "^[a-z0-9][a-z0-9_-]*$"
#: The deepest chain of ``extends`` a site config may have (a twin of a twin of a site is 2).
MAX_EXTENDS = 8


def _obj(required: list[str], properties: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": properties}


def _tool_reads(tool: str, syntaxes: tuple[str, ...]) -> dict:
    """Schema clause: with ``modules.tool`` = ``tool`` and a known ``modules.syntax``, the syntax
    is one of ``syntaxes`` (an unknown syntax gets only the enum's error)."""
    allowed = {"const": syntaxes[0]} if len(syntaxes) == 1 else {"enum": list(syntaxes)}
    return {"if": {"properties": {"tool": {"const": tool}, "syntax": {"enum": list(SYNTAXES)}},
                   "required": ["tool", "syntax"]},
            "then": {"properties": {"syntax": allowed}}}


#: The fabrics ``network.fabric`` names: the inter-node transport NCCL must use on each
#: (:mod:`hpcstack.validate.transport`); ``none`` checks nothing.
FABRICS = ("infiniband", "slingshot", "ethernet", "none")


#: JSON schema of a site config (draft 2020-12). What each key is for, its default and what reads it:
#: hpcstack/site_keys.py (a new key gets a line there); the site-config reference of the
#: documentation site is generated from both (docs/hooks/reference.py).
SCHEMA = _obj(["name", "description", "install_root", "module_root", "modules", "launcher"], {
    "name": {"type": "string", "maxLength": 64, "pattern": SITE_NAME},
    # the site this one overlays (resolved by load_site before the schema sees the merged config;
    # a merged config keeps it only as Site.bases): a site twin is `extends: cirrus` plus a few keys
    "extends": {"type": "string", "maxLength": 64, "pattern": SITE_NAME},
    "description": _STR,
    "install_root": _PATH,
    "module_root": _PATH,
    "cache_dir": {**_PATH, "type": ["string", "null"]},
    "stage_root": {**_PATH, "type": ["string", "null"]},
    "modules": {**_obj(["tool", "syntax", "base"], {
        "tool": {"enum": list(TOOLS)},
        "syntax": {"enum": list(SYNTAXES)},
        "command": _NULL_STR,
        "init": {"type": "object", "additionalProperties": False,
                 "properties": {sh: _PATH for sh in ("bash", "zsh", "csh", "fish", "sh")}},
        "use": {"type": "array", "items": _PATH, "maxItems": 256},
        # the site's module profiles: modules loaded first, in this order, before the hierarchy
        # (CINECA: `module load profile/deeplrn` makes the deep-learning modules visible)
        "profiles": _MODULE_LIST,
        # the site's module hierarchy: modules loaded, in this order, before the base module,
        # each making the next visible (JSC: Stages/2024, then GCC/12.3.0, then ParaStationMPI)
        "hierarchy": _MODULE_LIST,
        "base": _MODULE,
        "build": _MODULE_LIST,
        "runtime": _MODULE_LIST,
        # variables every stack's modulefile sets for users, e.g. launcher defaults the way
        # users launch on this machine (SLURM_MPI_TYPE: pmix where Slurm's MpiDefault is none)
        "env": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4096},
                "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": 128}},
    }),
        # each tool reads only its syntaxes (Environment Modules: Tcl only; Lmod: Lua and Tcl)
        "allOf": [_tool_reads(name, cls.syntaxes) for name, cls in TOOLS.items()]},
    "python": _obj([], {
        "version": {"type": ["string", "null"], "pattern": r"^3\.[0-9]+$"},
    }),
    # The compilers and libraries of the build environment (after the modules are loaded), as
    # hpccm's toolchain: what recipes build against. CUDA and NCCL only on GPU sites.
    "toolchain": _obj([], {
        "cc": _STR, "cxx": _STR, "fc": _STR,
        "cuda": {**_obj(["home", "version"], {
            "home": _STR,
            "version": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+$"},
            "cc_list": {"type": "array", "items": {"type": "integer", "minimum": 10, "maximum": 1000},
                        "maxItems": 64},
            "stubs": _NULL_STR,
            "static_runtime": {"type": "boolean"},
        }), "type": ["object", "null"]},
        "nccl": {**_obj(["home"], {"home": _STR}), "type": ["object", "null"]},
    }),
    "build": _obj([], {
        "jobs": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_JOBS},
        # values may be secrets: {secret: true, from_env: VAR} or {secret: true, from_file: PATH}
        "env": _SECRET_ENV,
        # build in one Slurm job step on a compute node, not on the login node (login nodes that
        # limit CPU time: CINECA's allow 10 minutes); what needs the network stays on the login
        # node (a bundle). hpcstack/install/batch.py; options checked by _batch_job_problems
        "batch_job": {**_obj(["partition", "time_limit", "cpus_per_task"], {
            "partition": {**_SLURM_NAME, "type": "string"},
            "time_limit": {"type": "string", "pattern": r"^([0-9]+-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}$"},
            "cpus_per_task": {**_POS_INT, "maximum": MAX_JOBS},
            "qos": _SLURM_NAME,
            "account": _SLURM_NAME,
            "srun_options": {"type": "array", "maxItems": 64, "items": {
                "type": "string", "maxLength": 256, "pattern": r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=+/@%-]+)?$"}},
        }), "type": ["object", "null"]},
    }),
    # How packages get into the stack's venv: uv (default) or pip, the wheel cache
    # (keep it on the prefixes' filesystem so uv hard-links instead of copying), bytecode at
    # install time (a read-only stack then writes no .pyc), and the cache of built source wheels.
    "installer": _obj([], {
        "backend": {"enum": ["uv", "pip"]},
        "wheel_cache": _NULL_STR,
        "link_mode": {"enum": ["hardlink", "copy", "clone"]},
        "compile_bytecode": {"type": "boolean"},
        # bytecode also for these optimisation levels (python -O: 1, -OO: 2), compiled after the
        # last package is installed: without it a read-only stack compiles every module in memory
        # at every `python -O` start (docs/benchmarks.md, "Start-up at scale")
        "optimization_levels": {"type": "array", "uniqueItems": True, "items": {"enum": [1, 2]}},
        "build_cache": {"type": "boolean"},
        # the site's package index (a devpi, Nexus or Artifactory mirror the login nodes reach)
        # for the lock's wheels and the recipes' sdists; the lock's hashes are still enforced
        "index_url": {"type": ["string", "null"], "pattern": r"^(https?|file)://[^\s]+$"},
    }),
    # Who owns an installed stack and who may write it: a shared software group and a
    # symbolic chmod mode on top of hpcstack's own (world-readable, nothing world-writable).
    "permissions": _obj([], {
        "group": {"type": ["string", "null"], "maxLength": 256, "pattern": r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$"},
        # read for compatibility, and it does not count: a file under check cannot name who may
        # write it; the admin group comes from /etc/hpcstack/config.yaml or --admin-group
        # (hpcstack/trust.py, hpcstack/session.py: a note says so; docs/admin/security.md)
        "admin_group": {"type": ["string", "null"], "maxLength": 256, "pattern": r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$"},
        "mode": {"type": ["string", "null"], "pattern": r"^[ugoa]*([-+=]([rwxXst]*|[ugo]))+(,[ugoa]*([-+=]([rwxXst]*|[ugo]))+)*$"},
    }),
    # How a published build lies on the file system: ``directory`` (default),
    # or ``squashfs``: the venv packed into one image (mksquashfs) and mounted read-only at its
    # path (squashfuse), so an import makes its metadata calls inside the image, not on the
    # (parallel) file system. See hpcstack/install/image.py.
    "layout": {"enum": ["directory", "squashfs"]},
    # The file system the install root lies on: ``parallel`` (Lustre, GPFS, BeeGFS, NFS shared by
    # the compute nodes) makes ``layout: squashfs`` the default (hpcstack/install/image.py).
    "filesystem": {"enum": ["local", "parallel"]},
    "squashfs": _obj([], {
        "compression": {"enum": ["gzip", "lz4", "lzo", "xz", "zstd"]},
        "processors": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_JOBS},
    }),
    "launcher": _obj(["command"], {
        # a launcher of hpcstack.validate.launchers (srun, mpirun, horovodrun, torchrun);
        # checked against that registry where it is used, so a new launcher is one class there
        "command": {"type": "string", "maxLength": 256, "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"},
        "ranks": {**_POS_INT, "maximum": MAX_RANKS},
        "env": _ENV,
    }),
    # The stack as a container image (`hpcstack export --format docker|apptainer`):
    # the image is a machine of its own. One of base_image and rootfs; see hpcstack/export/container.py.
    "container": _obj(["python"], {
        "base_image": {"type": "string", "maxLength": 512, "pattern": r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"},  # FROM / Bootstrap: docker
        "rootfs": _PATH,                 # a root filesystem tar: FROM scratch + ADD
        "distro": {"enum": ["debian12", "ubuntu22", "ubuntu24", "rockylinux8", "rockylinux9"]},
        "python": {"type": "string", "pattern": r"^3\.[0-9]+$"},   # X.Y of the image's python3
        # distribution package names (apt, dnf): letters, digits and .+:_- (one word each)
        "packages": _obj([], {role: {"type": "array", "maxItems": 256, "items": {
            "type": "string", "maxLength": 256, "pattern": r"^[A-Za-z0-9][A-Za-z0-9.+:_-]*$"}}
            for role in ("compilers", "mpi", "modules", "python", "other")}),
        "setup": _STR_LIST,              # shell commands after hpcstack is in ($HPCSTACK_DATA: its data)
        "site_changes": {"type": "object", "maxProperties": 64},   # top-level keys of this config that differ inside
    }),
    # module usage recorded by the module tools' own hooks (hpcstack/lifecycle/usage.py)
    "lifecycle": _obj([], {"usage_log": {**_PATH, "type": ["string", "null"]},
                           "usage_users": {"enum": ["name", "hash"]}}),
    "slurm": _obj(["partition"], {
        "partition": {**_SLURM_NAME, "type": "string"},
        "qos": _SLURM_NAME,
        "account": _SLURM_NAME,
        "account_required": {"type": "boolean"},
        "gpus_per_node": {"type": "integer", "minimum": 0, "maximum": 1024},
        # how the GPUs are asked for: --gres=gpu:N (default), --gpus-per-node=N (NERSC's form), or
        # --gpus-per-task=1 with one task per GPU (Slurm binds each task to its own GPU)
        "gpu_request": {"enum": ["gres", "gpus-per-node", "gpus-per-task"]},
        "constraint": {"type": ["string", "null"], "maxLength": 1024,
                       "pattern": r"^[A-Za-z0-9_.,:&|*()\[\]-]+$"},         # --constraint (e.g. NERSC's -C gpu); null: none
        # false: the partition only names the node class (references, workloads), no --partition
        # line (Perlmutter picks GPU nodes by constraint and QOS, not by partition)
        "partition_option": {"type": "boolean"},
        "tasks_per_node": {**_POS_INT, "maximum": 65536},
        "cpus_per_task": {**_POS_INT, "maximum": 65536},
        "time_limit": {"type": "string", "pattern": r"^([0-9]+-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}$"},
        "exclusive": {"type": "boolean"},
        "launcher": {"type": "string", "maxLength": 256, "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"},
        "mpi": {"type": ["string", "null"], "maxLength": 64, "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$"},
        "submit_as": {"type": ["string", "null"], "maxLength": 256, "pattern": r"^[A-Za-z_][A-Za-z0-9_.-]*\$?$"},
        "output_root": {**_PATH, "type": ["string", "null"]},
        # where the shape of the tasks goes: #SBATCH --ntasks-per-node/--cpus-per-task (sbatch,
        # the default) or only srun's options (Cirrus's GPU nodes refuse them as #SBATCH options)
        "task_options": {"enum": ["sbatch", "srun"]},
        # options every srun step of the jobs gets (Cirrus: --hint=nomultithread)
        "srun_options": {"type": "array", "maxItems": 64, "items": {
            "type": "string", "maxLength": 256, "pattern": r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:=+-]+)?$"}},
        # directories of the login nodes that batch jobs do not see (Cirrus: /home): a validation's
        # directory under one of them is refused
        "login_only_paths": {"type": "array", "items": _PATH, "maxItems": 64},
        # false: no slurmdbd, so no sacct (localhost); ReFrame checks then poll with squeue
        "accounting": {"type": "boolean"},
        "env": _ENV,
        # memory per node, per CPU or per GPU, as sbatch's --mem, --mem-per-cpu, --mem-per-gpu
        # (at most one: _slurm_problems); every job hpcstack writes carries the line
        **{key: _MEMORY for key in MEMORY_KEYS},
        # more #SBATCH options, after hpcstack's own: long options, none that hpcstack sets
        # itself (SBATCH_OWN) nor with characters an #SBATCH line cannot hold (_slurm_problems)
        "extra_options": {"type": "array", "maxItems": 64,
                          "items": {"type": "string", "minLength": 1, "maxLength": 1024}},
    }),
    # The GPU driver of the compute nodes: wheels built for a newer CUDA than it runs are refused
    # before anything is written (hpcstack/install/driver.py). Either key, or both; none: no check.
    "gpu": _obj([], {
        # nvidia-smi's "Driver Version", e.g. "535.104.05"
        "driver_version": {"type": ["string", "null"], "maxLength": 32,
                           "pattern": r"^[0-9]{2,4}\.[0-9]{1,4}(\.[0-9]{1,4})?$"},
        # nvidia-smi's "CUDA Version": the newest CUDA driver API the driver has, e.g. "12.2"
        "cuda_driver_api": {"type": ["string", "null"], "maxLength": 16, "pattern": r"^[0-9]{1,3}\.[0-9]{1,3}$"},
    }),
    # The fabric between the GPU nodes and NVLink within one: the transport NCCL must pick in the
    # validation jobs (hpcstack/validate/transport.py). Default none: no check.
    "network": _obj([], {
        "fabric": {"enum": list(FABRICS)},
        "nvlink": {"type": "boolean"},
    }),
    # What follows a scheduled validation's verdict (hpcstack/validate/actions.py): apprise URLs
    # told of a change to DEGRADED or FAILED, and the opt-in deprecation of a FAILED stack.
    "revalidation": _obj([], {
        "notify": {"type": "array", "maxItems": 32, "items": {
            "type": "string", "minLength": 3, "maxLength": 2048, "pattern": r"^[A-Za-z][A-Za-z0-9+.-]*://\S+$"}},
        "deprecate_on_failed": {"type": "boolean"},
        # the tiers' cron lines on this site, over the recipe's (hpcstack/validate/schedule.py)
        "schedule": {"type": "object", "additionalProperties": False, "patternProperties": {
            "^(smoke|full|probe)$": {"type": "string", "maxLength": 120,
                                     "pattern": r"^[0-9*/,-]+( [0-9*/,-]+){4}$"}}},   # cron's five fields
        # the history's and the schedule's directory, when not <install_root>/.hpcstack (history.state_root)
        "state_dir": {**_PATH, "pattern": r"^/[^\x00-\x20\x7f-\x9f\u2028\u2029]*$"},   # absolute
        # how far a run's medians may move before its verdict is DEGRADED (hpcstack/validate/verdict.py)
        "degraded": _obj([], {
            "throughput_drop": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "startup_rise": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
        }),
    }),
})


@dataclass(frozen=True)
class ModulesConfig:
    """The site's module tool (section ``modules``).

    Attributes:
        tool (str): ``environment-modules`` (4.x/5.x) or ``lmod`` (8.x); switching a site
            between them is this key, ``syntax`` and ``init`` (see site-configs/localhost-lmod.yaml).
        syntax (str): ``tcl`` or ``lua``: the modulefile syntax hpcstack writes (and the default
            file: ``.version`` or ``.modulerc.lua``); ``lua`` needs ``tool: lmod``. The names
            come from :data:`hpcstack.modules.modsys.TOOLS` and :data:`hpcstack.modules.syntax.SYNTAXES`.
        base (str): the cluster Python module the venv is built on, e.g. ``python/3.12.1-gpu``.
        build (list[str]): modules loaded only to build (e.g. ``cmake/3.25.2``).
        runtime (list[str]): modules the stack's modulefile ``depends-on`` besides ``base``.
        profiles (list[str]): the site's module profiles, loaded first, in this order, before
            ``hierarchy`` (CINECA's ``profile/deeplrn``, which makes a domain's modules visible,
            https://docs.hpc.cineca.it/hpc/hpc_enviroment.html); everywhere the hierarchy is
            loaded, they come before it (:attr:`preloads`).
        hierarchy (list[str]): the site's module hierarchy, loaded in this order before ``base``
            (an Lmod hierarchy as JSC builds it, https://apps.fz-juelich.de/jsc/hps/juwels/environment.html:
            ``Stages/2024`` resets MODULEPATH and shows the compilers, ``GCC/12.3.0`` shows the
            MPIs and the GCCcore modules such as ``Python/3.11.3``, ``ParaStationMPI/5.9.2-1``
            what is built with MPI). The install's build environment, the modulefile's
            ``depends-on`` (first, in this order) and the jobs, kernels and ReFrame checks load them
            before the stack; the stack's module root is put on MODULEPATH after them, as the first
            may reset it. See :meth:`stack_modules`.
        use (list[str]): directories added to MODULEPATH to find those modules.
        command (str | None): path of ``modulecmd.tcl`` / ``lmod``; default from ``$MODULES_CMD`` /
            ``$LMOD_CMD`` or the distribution's path.
        init (dict[str, str]): per shell, the module tool's init script (for extend-venv-activate).
        env (dict[str, str]): variables every stack's modulefile sets for its users (``setenv``),
            in the order given: launcher defaults such as ``SLURM_MPI_TYPE: pmix`` where the
            site's Slurm has ``MpiDefault=none``, so that a plain ``srun python …`` starts MPI
            ranks. ``module help`` lists them.
    """

    tool: str
    syntax: str
    base: str
    build: list[str] = field(default_factory=list)
    runtime: list[str] = field(default_factory=list)
    use: list[str] = field(default_factory=list)
    command: str | None = None
    init: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    hierarchy: list[str] = field(default_factory=list)
    profiles: list[str] = field(default_factory=list)

    @property
    def preloads(self) -> list[str]:
        """The modules loaded before the base module and before the stack's module root goes on
        ``MODULEPATH``, in load order: the profiles, then the hierarchy. Every place that loads
        the site's modules ahead of the stack reads this list (jobs, the build, kernels, ReFrame
        checks, the modulefile's ``depends-on``).

        Example:
            >>> ModulesConfig("environment-modules", "tcl", "python/3.11.6", profiles=["profile/deeplrn"],
            ...               hierarchy=["gcc/12.2.0"]).preloads
            ['profile/deeplrn', 'gcc/12.2.0']
        """
        return [*self.profiles, *self.hierarchy]

    def stack_modules(self) -> list[str]:
        """The modules a stack runs with, in load order: the profiles and the hierarchy
        (:attr:`preloads`), the base, the runtime modules (what its modulefile ``depends-on``).

        Example:
            >>> ModulesConfig("lmod", "lua", "Python/3.11.3", runtime=["CUDA/12"],
            ...               hierarchy=["Stages/2024", "GCC/12.3.0"]).stack_modules()
            ['Stages/2024', 'GCC/12.3.0', 'Python/3.11.3', 'CUDA/12']
        """
        return [*self.preloads, self.base, *self.runtime]

    def build_modules(self) -> list[str]:
        """The modules of the build environment, in load order: :meth:`stack_modules`, then the
        build-only ones."""
        return [*self.stack_modules(), *self.build]


@dataclass(frozen=True)
class Toolchain:
    """The compilers and libraries a site builds with (section ``toolchain``): the one object
    through which machine facts reach the components, as hpccm's ``toolchain`` does
    (https://github.com/NVIDIA/hpc-container-maker/blob/master/docs/misc_api.md#toolchain).

    Values may hold ``${VAR}`` references to the build environment after the site's modules are
    loaded (e.g. ``${NVHPC_ROOT}/cuda/12.4``); they are expanded when a command runs.

    Attributes:
        cc, cxx (str): the C and C++ compilers; the MPI wrappers (``mpicc``, ``mpicxx``) by default.
        fc (str | None): the Fortran compiler, if the site names one.
        cuda_home (str | None): the CUDA toolkit; None on sites without GPUs.
        cuda_version (str | None): ``X.Y`` of that toolkit (lock files and builds are chosen by it).
        cuda_cc_list (tuple[int, ...]): the GPUs' compute capabilities, e.g. ``(70,)`` for V100.
        cuda_stubs (str | None): directory with ``libcuda.so`` stubs, for builds on a login node
            without a GPU driver; used at build and sanity check only, never in a modulefile.
        nccl_home (str | None): NCCL (``include/nccl.h``, ``lib/libnccl.so``).
        cuda_static_runtime (bool): the toolkit has ``libcudart_static.a`` (NVIDIA's and NVHPC's
            do; default True). False for a toolkit with the shared runtime only (one put together
            from PyPI's CUDA wheels, ``scripts/localhost-cuda-toolkit``): builds then link
            ``libcudart.so``, as torch's extensions do.
    """

    cc: str = "mpicc"
    cxx: str = "mpicxx"
    fc: str | None = None
    cuda_home: str | None = None
    cuda_version: str | None = None
    cuda_cc_list: tuple = ()
    cuda_stubs: str | None = None
    nccl_home: str | None = None
    cuda_static_runtime: bool = True

    @property
    def has_cuda(self) -> bool:
        """True when the site builds for NVIDIA GPUs (a CUDA toolkit is named)."""
        return self.cuda_home is not None

    @classmethod
    def from_config(cls, section: dict) -> "Toolchain":
        """Build it from a validated ``toolchain`` section (missing keys take the defaults)."""
        cuda, nccl = section.get("cuda") or {}, section.get("nccl") or {}
        return cls(cc=section.get("cc", "mpicc"), cxx=section.get("cxx", "mpicxx"), fc=section.get("fc"),
                   cuda_home=cuda.get("home"), cuda_version=cuda.get("version"),
                   cuda_cc_list=tuple(cuda.get("cc_list", ())), cuda_stubs=cuda.get("stubs"),
                   nccl_home=nccl.get("home"), cuda_static_runtime=cuda.get("static_runtime", True))


@dataclass(frozen=True)
class InstallerConfig:
    """How packages are installed into the stack's venv (section ``installer``).

    Attributes:
        backend (str): ``uv`` (default; https://docs.astral.sh/uv/pip/) or ``pip`` (the fallback).
        wheel_cache (str | None): uv's (or pip's) cache directory; default
            ``<cache_dir>/uv`` (``<cache_dir>/pip``). Keep it on the filesystem of the prefixes:
            uv hard-links installed files from it, and falls back to copying across filesystems.
        link_mode (str): uv's ``--link-mode``: ``hardlink`` (default), ``copy`` or ``clone``.
            ``symlink`` is refused: a pruned cache would break the stack.
        compile_bytecode (bool): compile ``.pyc`` files at install time (uv
            ``--compile-bytecode``; with pip, after the last package), so importing from a
            read-only stack writes none; ``unchecked-hash`` (:mod:`hpcstack.install.bytecode`),
            so the same files give the same bytes. Default True.
        build_cache (bool): reuse wheels built from source (Horovod) whose build key (sdist and
            patch hashes, torch, Python, MPI, compilers, CUDA/NCCL, HOROVOD_* settings) matches;
            ``<cache_dir>/builds/<package>-<version>/<key>/``. Default True.
    """

    backend: str = "uv"
    wheel_cache: str | None = None
    link_mode: str = "hardlink"
    compile_bytecode: bool = True
    build_cache: bool = True
    #: ``installer.optimization_levels``: bytecode also for ``python -O`` (1) and ``-OO`` (2),
    #: compiled with ``compileall`` in the install step; empty (the default): level 0 only.
    optimization_levels: tuple = ()
    #: The site's package index (``installer.index_url``): wheels and sdists come from it
    #: instead of the indexes the lock and the recipe name; their sha256 are checked as always.
    index_url: str | None = None
    #: Set by ``install --from DIR`` only (not a site config key): the bundle every package comes from.
    bundle: str | None = None


@dataclass(frozen=True)
class LauncherConfig:
    """How validation ranks are started (section ``launcher``).

    Attributes:
        command (str): ``horovodrun``, ``mpirun`` or ``srun``.
        ranks (int): ranks of the local validation run.
        env (dict[str, str]): variables for the launcher.
    """

    command: str
    ranks: int = 2
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuConfig:
    """The GPU driver of the compute nodes (section ``gpu``), as ``nvidia-smi`` prints it there.

    Attributes:
        driver_version (str | None): the NVIDIA driver, "Driver Version" (``"535.104.05"``).
        cuda_driver_api (str | None): "CUDA Version", the newest CUDA driver API that driver has
            (``"12.2"``).

    Either, both or neither: where one is given, an install refuses wheels built for a CUDA the
    driver cannot run (:mod:`hpcstack.install.driver`) before anything is written; with neither,
    nothing is checked.
    """

    driver_version: str | None = None
    cuda_driver_api: str | None = None

    @property
    def known(self) -> bool:
        """True when the site states its driver (either key)."""
        return bool(self.driver_version or self.cuda_driver_api)


@dataclass(frozen=True)
class NetworkConfig:
    """The fabric the GPU jobs run on (section ``network``).

    Attributes:
        fabric (str): one of :data:`FABRICS`: ``infiniband`` (NCCL's ``NET/IB``), ``slingshot``
            (``NET/OFI``, libfabric provider ``cxi``), ``ethernet`` (TCP sockets are expected),
            ``none`` (default: no check).
        nvlink (bool): the GPUs of a node talk over NVLink: NCCL's intra-node channels must go
            peer to peer (``P2P/IPC``, ``P2P/CUMEM``), not through host shared memory.

    The validation jobs of a GPU site log NCCL's choice (``NCCL_DEBUG=INFO``) and the judge holds
    it to these (:func:`hpcstack.validate.transport.judge_nccl`).
    """

    fabric: str = "none"
    nvlink: bool = False


@dataclass(frozen=True)
class Site:
    """A validated site config.

    Attributes:
        name (str): the site's name (file stem).
        path (Path): the YAML file it came from.
        raw (dict): the config as loaded (recorded as provenance).
        description, install_root, module_root (str): see ``site-configs/localhost.yaml``.
        cache_dir (str): downloads, the wheel cache and source builds; default the machine's
            cache, shared by every site on it (:func:`default_cache_dir`), except for an
            install root given on the command line (``--prefix``: a private or test install
            keeps everything it writes under it, ``<prefix>/.hpcstack/cache``).
        stage_root (str): stage dirs; default ``<install_root>/.hpcstack/stage``.
        modules, launcher: sections as dataclasses.
        toolchain (Toolchain): compilers, CUDA and NCCL: what components build against.
        python_version (str | None): ``X.Y`` of the base module's Python if the site states it.
        jobs (int | None): parallel build jobs; None means the core count.
        build_env (dict[str, str]): variables for every build command; a secret is a
            ``${VARIABLE}`` reference here, expanded when a command runs (:mod:`hpcstack.secrets`).
        secrets (dict[str, dict]): the secret values of ``build.env``: name -> ``{secret: true,
            from_env: VAR}`` or ``{secret: true, from_file: PATH}``; read by an install, never written.
        slurm (dict): the Slurm scheduler and partition, for ``hpcstack validate``.
        installer (InstallerConfig): uv or pip, wheel cache, bytecode, build cache.
        ref (str): how a later command line names this site: its name where the search path
            finds it without ``--repo``, else its file's absolute path.
        bases (tuple[Path, ...]): the files of the sites it ``extends``, nearest first.
        gpu (GpuConfig): the compute nodes' GPU driver (section ``gpu``; empty: not stated).
        network (NetworkConfig): the fabric between GPU nodes and NVLink within one (section
            ``network``; default: not stated, no transport check).
    """

    name: str
    path: Path
    raw: dict
    description: str
    install_root: str
    module_root: str
    cache_dir: str
    stage_root: str
    modules: ModulesConfig
    toolchain: Toolchain
    launcher: LauncherConfig
    python_version: str | None
    jobs: int | None
    build_env: dict[str, str]
    slurm: dict
    installer: InstallerConfig = field(default_factory=InstallerConfig)
    ref: str = ""
    secrets: dict = field(default_factory=dict)
    #: The site configs this one ``extends``, nearest first (:func:`merge_config`); ``raw`` is
    #: the merged config, without ``extends``.
    bases: tuple = ()
    gpu: GpuConfig = field(default_factory=GpuConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)


#: The variable that moves the machine cache (:func:`default_cache_dir`) for every site that
#: does not set ``cache_dir``.
CACHE_ENV = "HPCSTACK_CACHE_DIR"


def revalidation_of(site) -> dict:
    """The site's ``revalidation`` section (``{}`` without one): its schedule, margins, state
    directory and actions (docs/admin/status.md).

    Args:
        site (Site | object): a site, or any object with ``raw`` (the config as loaded).
    """
    return dict((getattr(site, "raw", None) or {}).get("revalidation") or {})


def state_dir_of(site) -> str | None:
    """The site's ``revalidation.state_dir`` where it names an absolute one (the schema refuses
    any other), else None: where the history, the schedule and the status file go instead of
    their defaults (docs/admin/status.md)."""
    raw = revalidation_of(site).get("state_dir")
    return raw if isinstance(raw, str) and os.path.isabs(raw) else None


#: The status files' directory under ``revalidation.state_dir``.
STATUS_DIR = "status"


def status_file_path(site) -> str:
    """The status file ``module load`` reads (:mod:`hpcstack.validate.statusfile`):
    ``<state_dir>/status/<site>.json`` where the site names ``revalidation.state_dir`` (the
    scheduled runs write it from the compute nodes, which may see the module root read-only),
    else ``<module_root>/.hpcstack-status.json``.

    Args:
        site (Site | object): a site, or any object with ``name``, ``module_root`` and ``raw``.
    """
    from hpcstack.modules.writer import STATUS_FILE

    state_dir = state_dir_of(site)
    if state_dir:
        return os.path.join(state_dir, STATUS_DIR, f"{site.name}.json")
    return os.path.join(site.module_root, STATUS_FILE)


def default_cache_dir() -> str:
    """The machine's hpcstack cache, shared by every site that does not set ``cache_dir``.

    Downloads (wheels, sdists), the uv/pip wheel cache and the cache of source builds are keyed
    by content (sha256, build keys that hash the toolchain), so sites on one machine can share
    them safely: a second site (``localhost-lmod`` after ``localhost``) then links the wheels it
    already has and reuses a source build whose key matches, instead of downloading gigabytes
    and compiling again. As uv and pip do, the cache belongs to the machine and the user, not to
    one install root: ``$HPCSTACK_CACHE_DIR`` if set, else ``/var/cache/hpcstack`` for root (the
    Filesystem Hierarchy Standard's place for application caches, section 5.5), else
    ``${XDG_CACHE_HOME:-~/.cache}/hpcstack`` (the XDG Base Directory specification).

    Returns:
        str: an absolute path; it need not exist yet.
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    if os.geteuid() == 0:
        return "/var/cache/hpcstack"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(xdg), "hpcstack")


def site_path(name_or_path: str, search: SearchPath | None = None) -> Path:
    """Resolve ``--site``: a path to a ``.yaml`` file, or a site name on the search path.

    Args:
        name_or_path (str): ``cirrus``, or ``./site-configs/cirrus.yaml``.
        search (SearchPath | None): where names are looked up (default: ``HPCSTACK_PATH``, then
            the built-in site configs).

    Raises:
        ConfigError: unknown site; the line names the search path and the known sites.
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        if candidate.is_file():
            return candidate
        raise ConfigError([f"site config {name_or_path}: no such file"])
    search = search or default_search_path()
    entry = search.find(SITES, name_or_path)
    if entry:
        return entry.path
    known = ", ".join(e.name for e in search.entries(SITES)) or "none"
    raise ConfigError([f"unknown site '{name_or_path}' (known: {known}; searched: {search.describe()}; "
                       "or give the path of a site config .yaml)"])


def check_config(data: object, where: str) -> list[str]:
    """Check a loaded site config against :data:`SCHEMA` (not ``hpcstack validate``, which runs a stack's
    validation program).

    Args:
        data (object): what :func:`hpcstack.schema.load_yaml` returned.
        where (str): the file name, to start each line with.

    Returns:
        list[str]: one line per problem, ``"<file>: <key.path>: <message>"``; empty when valid.
    """
    found = value_problems(data, where)
    if found:       # control characters first: the schema's lines would repeat them
        return found
    found = (schema_problems(SCHEMA, data, where, moved=_MOVED) or _dir_problems(data, where)
             + _slurm_problems(data, where) + _batch_job_problems(data, where))
    if found:
        return found
    # no secret in a build key (hpcstack.secrets, rule 2)
    return key_problems((data.get("build") or {}).get("env", {}), where)


def merge_config(base: dict, overlay: dict) -> dict:
    """The config ``overlay`` makes of ``base`` (``extends``): mappings are merged key by key, at
    every depth; a list or a scalar of the overlay replaces the base's; a key the overlay sets to
    null is removed, so the merged config reads as if the base had not set it (the key's default
    applies: for a key that takes null, that is null; ``build.env: {CUDA_PATH: null}`` drops one
    variable). Neither argument is changed.

    Args:
        base (dict): the base's config (already merged with its own bases).
        overlay (dict): the overlay's config, less ``extends``.

    Returns:
        dict: a new mapping (deep copies of both).

    Example:
        >>> merge_config({"a": {"x": 1, "y": [1, 2]}, "b": 2}, {"a": {"y": [3], "z": None}, "b": None})
        {'a': {'x': 1, 'y': [3]}}
    """
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _resolve_extends(data: object, path: Path, search: SearchPath,
                     check_file: Callable[[Path], None] | None) -> tuple[object, tuple[Path, ...]]:
    """Merge a site config with the chain of sites it ``extends`` (:func:`merge_config`).

    Each base is a site *name*, looked up on the same search path as ``--site`` and checked with
    ``check_file`` (the loader's trust rule) before it is read, as any site file is.

    Returns:
        tuple[object, tuple[Path, ...]]: the merged config (``data`` itself where it extends
        nothing or is no mapping) and the bases' files, nearest first.

    Raises:
        ConfigError: one line: an ``extends`` that is no site name, names an unknown site, closes a
            cycle or goes deeper than :data:`MAX_EXTENDS`; an overlay without its own ``name``;
            a base that is unreadable or no mapping.
    """
    if not isinstance(data, dict) or "extends" not in data:
        return data, ()
    chain: list[tuple[Path, dict]] = [(path, data)]
    seen = {os.path.realpath(path)}
    where = str(path)
    if not isinstance(data.get("name"), str):
        raise ConfigError([f"{path}: name: required in a config that extends another (its own name, "
                           f"the file's stem '{path.stem}')"])
    while "extends" in chain[-1][1]:
        current, cfg = chain[-1]
        name = cfg["extends"]
        if not isinstance(name, str) or not re.fullmatch(SITE_NAME, name):
            raise ConfigError([f"{current}: extends: {str(name)[:80]!r} is not a site name (the name of a "
                               "site config on the search path, e.g. cirrus)"])
        if len(chain) > MAX_EXTENDS:
            raise ConfigError([f"{where}: extends: a chain deeper than {MAX_EXTENDS} sites "
                               f"({' -> '.join(p.stem for p, _ in chain)})"])
        entry = search.find(SITES, name)
        if entry is None:
            known = ", ".join(e.name for e in search.entries(SITES)) or "none"
            raise ConfigError([f"{current}: extends: unknown site '{name}' (known: {known}; "
                               f"searched: {search.describe()})"])
        base_path = entry.path
        if os.path.realpath(base_path) in seen:
            cycle = " -> ".join([*(p.stem for p, _ in chain), name])
            raise ConfigError([f"{current}: extends: '{name}' closes a cycle ({cycle})"])
        seen.add(os.path.realpath(base_path))
        if check_file is not None:
            check_file(base_path)
        base = load_yaml(base_path, "site config")
        if not isinstance(base, dict):
            raise ConfigError([f"{base_path}: a site config is a mapping of keys (extended by {current})"])
        found = value_problems(base, str(base_path))
        if found:
            raise ConfigError(found)
        chain.append((base_path, base))
    merged: dict = {}
    for _, cfg in reversed(chain):
        merged = merge_config(merged, {k: v for k, v in cfg.items() if k != "extends"})
    return merged, tuple(p for p, _ in chain[1:])


def load_site(name_or_path: str, install_root: str | None = None,
              module_root: str | None = None, search: SearchPath | None = None,
              check_file: Callable[[Path], None] | None = None, path: Path | None = None) -> Site:
    """Load and validate a site config, merged with the sites it ``extends`` (:func:`merge_config`).

    Args:
        name_or_path (str): a site name (``localhost``, ``cirrus``) or a path to a YAML file.
        install_root (str | None): overrides ``install_root`` (``--prefix`` on the command line).
        module_root (str | None): overrides ``module_root`` (``--module-root``).
        search (SearchPath | None): where a site name (and a base named by ``extends``) is
            looked up (:mod:`hpcstack.repos`).
        check_file (Callable[[Path], None] | None): run on each base's file before it is read
            (:class:`hpcstack.session.Session` passes the trust rule); it raises to refuse one.
        path (Path | None): the file ``name_or_path`` names on ``search`` (:func:`site_path`),
            when the caller has looked it up (and checked it) already: it is not looked up again.

    Returns:
        Site: the validated site; ``Site.bases`` names the files it extends.

    Raises:
        ConfigError: unreadable file, bad YAML (with line and column), a duplicate key, aliases
            that expand too far, control characters, or schema problems (of the merged config,
            named by the overlay's file and its bases), a bad ``extends``, one line each.
    """
    search = search or default_search_path()
    path = path or site_path(name_or_path, search)
    by_name = path != Path(name_or_path)
    entry = search.find(SITES, name_or_path) if by_name else None
    # how a later command names this site: its name where that finds it again without --repo
    ref = name_or_path if entry and entry.repo.origin != "--repo" else str(path.resolve())
    data = load_yaml(path, "site config")
    found = value_problems(data, str(path))
    if found:
        raise ConfigError(found)
    data, bases = _resolve_extends(data, path, search, check_file)
    where = f"{path} (extends {', '.join(p.name for p in bases)})" if bases else str(path)
    problems = check_config(data, where)
    if problems:
        raise ConfigError(problems)
    if data["name"] != path.stem and by_name:
        raise ConfigError([f"{path}: name: '{data['name']}' differs from the file name '{path.stem}'"])
    site = _build(data, path, install_root, module_root, ref)
    return dataclasses.replace(site, bases=bases) if bases else site


def _build(data: dict, path: Path, install_root: str | None, module_root: str | None,
           ref: str | None = None) -> Site:
    root = os.path.abspath(install_root or data["install_root"])
    python = data.get("python", {})
    build = data.get("build", {})
    return Site(
        name=data["name"], path=path, raw=data, description=data["description"],
        install_root=root,
        module_root=os.path.abspath(module_root or data["module_root"]),
        cache_dir=data.get("cache_dir") or (os.path.join(root, ".hpcstack", "cache") if install_root
                                             else default_cache_dir()),
        stage_root=data.get("stage_root") or os.path.join(root, ".hpcstack", "stage"),
        modules=ModulesConfig(**data["modules"]),
        toolchain=Toolchain.from_config(data.get("toolchain") or {}),
        launcher=LauncherConfig(**data["launcher"]),
        python_version=python.get("version"),
        jobs=build.get("jobs"),
        build_env=split_env(build.get("env", {}))[0],
        secrets=split_env(build.get("env", {}))[1],
        slurm=dict(data.get("slurm", {})),
        installer=InstallerConfig(**{**data.get("installer", {}), "optimization_levels": tuple(
            (data.get("installer") or {}).get("optimization_levels") or ())}),
        ref=ref or str(path),
        gpu=GpuConfig(**(data.get("gpu") or {})),
        network=NetworkConfig(**(data.get("network") or {})),
    )
