"""Site configs: load ``site-configs/<name>.yaml``, validate it, and expose it as dataclasses.

A site describes one cluster: where stacks and modulefiles go, which module tool it runs, which
modules make the build environment, how Horovod is built there, how jobs are launched, and its
performance references. Validation follows ReFrame's site configuration: a JSON schema, and one
error line per problem with its key path (``horovod.cpu_operations: 'FOO' is not one of …``),
exit status 2, before anything is written (issue 2, item 10).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

from . import data_root
from .errors import ConfigError

_STR = {"type": "string", "minLength": 1}
_NULL_STR = {"type": ["string", "null"]}
_STR_LIST = {"type": "array", "items": _STR}
_ENV = {"type": "object", "additionalProperties": {"type": "string"}}
_POS_INT = {"type": "integer", "minimum": 1}


def _obj(required: list[str], properties: dict) -> dict:
    return {"type": "object", "additionalProperties": False, "required": required,
            "properties": properties}


#: JSON schema of a site config (draft 2020-12). Every key is documented in site-configs/*.yaml.
SCHEMA = _obj(["name", "description", "install_root", "module_root", "modules", "horovod", "launcher"], {
    "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]*$"},
    "description": _STR,
    "install_root": _STR,
    "module_root": _STR,
    "cache_dir": _NULL_STR,
    "stage_root": _NULL_STR,
    "modules": _obj(["tool", "syntax", "base"], {
        "tool": {"enum": ["environment-modules", "lmod"]},
        "syntax": {"enum": ["tcl", "lua"]},
        "command": _NULL_STR,
        "init": {"type": "object", "additionalProperties": False,
                 "properties": {sh: _STR for sh in ("bash", "zsh", "csh", "fish", "sh")}},
        "use": _STR_LIST,
        "base": _STR,
        "build": _STR_LIST,
        "runtime": _STR_LIST,
    }),
    "python": _obj([], {
        "version": {"type": ["string", "null"], "pattern": r"^3\.[0-9]+$"},
        "index": {"enum": ["pypi", "cu121"]},
    }),
    "build": _obj([], {
        "jobs": {"type": ["integer", "null"], "minimum": 1},
        "env": _ENV,
    }),
    "horovod": _obj(["cpu_operations", "required_flags"], {
        "cc": _STR, "cxx": _STR, "fc": _STR,
        "cpu_operations": {"enum": ["MPI", "Gloo", "CCL"]},
        "gpu_operations": {"enum": ["NCCL", "MPI", None]},
        "gpu": {"enum": ["CUDA", "ROCM", None]},
        "cuda_home": _NULL_STR,
        "nccl_home": _NULL_STR,
        "cuda_cc_list": {"type": "array", "items": _POS_INT},
        "cuda_stubs": _NULL_STR,
        "required_flags": _STR_LIST,
        "env": _ENV,
    }),
    "launcher": _obj(["command"], {
        "command": {"enum": ["horovodrun", "mpirun", "srun"]},
        "ranks": _POS_INT,
        "env": _ENV,
    }),
    "slurm": _obj(["partition"], {
        "partition": _STR,
        "qos": _NULL_STR,
        "account": _NULL_STR,
        "gpus_per_node": {"type": "integer", "minimum": 0},
        "tasks_per_node": _POS_INT,
        "cpus_per_task": _POS_INT,
        "time_limit": {"type": "string", "pattern": r"^([0-9]+-)?[0-9]{1,2}:[0-9]{2}:[0-9]{2}$"},
    }),
    "validation": _obj([], {
        "model": _STR,
        "image_size": _POS_INT,
        "batch_size": _POS_INT,
        "precision": {"enum": ["fp32", "amp"]},
        "iterations": _POS_INT,
    }),
    "references": {"type": "object"},
})


@dataclass(frozen=True)
class ModulesConfig:
    """The site's module tool (section ``modules``).

    Attributes:
        tool (str): ``environment-modules`` (4.x/5.x) or ``lmod`` (8.x).
        syntax (str): ``tcl`` or ``lua``: the modulefile syntax hpcstack writes.
        base (str): the cluster Python module the venv is built on, e.g. ``python/3.12.1-gpu``.
        build (list[str]): modules loaded only to build (e.g. ``cmake/3.25.2``).
        runtime (list[str]): modules the stack's modulefile ``depends-on`` besides ``base``.
        use (list[str]): directories added to MODULEPATH to find those modules.
        command (str | None): path of ``modulecmd.tcl`` / ``lmod``; default from ``$MODULES_CMD`` /
            ``$LMOD_CMD`` or the distribution's path.
        init (dict[str, str]): per shell, the module tool's init script (for extend-venv-activate).
    """

    tool: str
    syntax: str
    base: str
    build: list[str] = field(default_factory=list)
    runtime: list[str] = field(default_factory=list)
    use: list[str] = field(default_factory=list)
    command: str | None = None
    init: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HorovodConfig:
    """How Horovod is built at the site (section ``horovod``); see Horovod's install docs
    (https://horovod.readthedocs.io/en/stable/install_include.html) for the HOROVOD_* variables.

    Attributes:
        cc, cxx, fc (str): compilers (the MPI wrappers).
        cpu_operations (str): ``HOROVOD_CPU_OPERATIONS``.
        gpu_operations (str | None): ``HOROVOD_GPU_OPERATIONS``; None builds CPU operations only.
        gpu (str | None): ``HOROVOD_GPU``.
        cuda_home, nccl_home (str | None): ``HOROVOD_CUDA_HOME`` / ``HOROVOD_NCCL_HOME``; may hold
            ``${VAR}`` references to the build environment (e.g. ``${NVHPC_ROOT}``).
        cuda_cc_list (list[int]): compute capabilities, e.g. ``[70]`` for V100.
        cuda_stubs (str | None): directory with ``libcuda.so.1`` stubs for a build on a login node
            without a driver; used at build and sanity check only, never in the modulefile.
        required_flags (list[str]): ``horovodrun --check-build`` flags that must be ``[X]``.
        env (dict[str, str]): further variables for the build.
    """

    cpu_operations: str
    required_flags: list[str]
    cc: str = "mpicc"
    cxx: str = "mpicxx"
    fc: str | None = None
    gpu_operations: str | None = None
    gpu: str | None = None
    cuda_home: str | None = None
    nccl_home: str | None = None
    cuda_cc_list: list[int] = field(default_factory=list)
    cuda_stubs: str | None = None
    env: dict[str, str] = field(default_factory=dict)


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
class Site:
    """A validated site config.

    Attributes:
        name (str): the site's name (file stem).
        path (Path): the YAML file it came from.
        raw (dict): the config as loaded (recorded as provenance).
        description, install_root, module_root (str): see ``site-configs/localhost.yaml``.
        cache_dir (str): download cache; default ``<install_root>/.hpcstack/cache``.
        stage_root (str): stage dirs; default ``<install_root>/.hpcstack/stage``.
        modules, horovod, launcher: sections as dataclasses.
        python_version (str | None): ``X.Y`` of the base module's Python if the site states it.
        index (str): which lock file to install from (``pypi`` or ``cu121``).
        jobs (int | None): parallel build jobs; None means the core count.
        build_env (dict[str, str]): variables for every build command.
        slurm, validation, references (dict): for ``hpcstack validate``.
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
    horovod: HorovodConfig
    launcher: LauncherConfig
    python_version: str | None
    index: str
    jobs: int | None
    build_env: dict[str, str]
    slurm: dict
    validation: dict
    references: dict


def site_path(name_or_path: str) -> Path:
    """Resolve ``--site``: a file path, or a name under ``site-configs/``.

    Raises:
        ConfigError: unknown site (the known ones are listed).
    """
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.is_file():
        return candidate
    path = data_root() / "site-configs" / f"{name_or_path}.yaml"
    if path.is_file():
        return path
    raise ConfigError([f"unknown site '{name_or_path}' (known: {', '.join(known_sites())}; "
                       "or give the path of a site config .yaml)"])


def known_sites() -> list[str]:
    """Return the names of the site configs shipped in ``site-configs/``."""
    return sorted(p.stem for p in (data_root() / "site-configs").glob("*.yaml"))


def validate(data: object, where: str) -> list[str]:
    """Validate a loaded site config against :data:`SCHEMA`.

    Args:
        data (object): what ``yaml.safe_load`` returned.
        where (str): the file name, to start each line with.

    Returns:
        list[str]: one line per problem, ``"<file>: <key.path>: <message>"``; empty when valid.
    """
    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = []
    for err in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
        key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        if err.validator == "additionalProperties":
            extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
            for name in extra:
                full = f"{key}.{name}" if err.absolute_path else name
                problems.append(f"{where}: {full}: unknown key")
            continue
        if err.validator == "required":
            missing = err.message.split("'")[1]
            full = f"{key}.{missing}" if err.absolute_path else missing
            problems.append(f"{where}: {full}: missing key")
            continue
        problems.append(f"{where}: {key}: {err.message}")
    return problems


def load_site(name_or_path: str, install_root: str | None = None,
              module_root: str | None = None) -> Site:
    """Load and validate a site config.

    Args:
        name_or_path (str): a site name (``localhost``, ``cirrus``) or a path to a YAML file.
        install_root (str | None): overrides ``install_root`` (``--prefix`` on the command line).
        module_root (str | None): overrides ``module_root`` (``--module-root``).

    Returns:
        Site: the validated site.

    Raises:
        ConfigError: unreadable file, bad YAML (with line and column), or schema problems,
            one line each.
    """
    path = site_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror}"])
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError([f"{path}: {loc}not valid YAML: {getattr(exc, 'problem', exc)}"])
    problems = validate(data, str(path))
    if problems:
        raise ConfigError(problems)
    if data["name"] != path.stem and path.parent == data_root() / "site-configs":
        raise ConfigError([f"{path}: name: '{data['name']}' differs from the file name '{path.stem}'"])
    return _build(data, path, install_root, module_root)


def _build(data: dict, path: Path, install_root: str | None, module_root: str | None) -> Site:
    root = os.path.abspath(install_root or data["install_root"])
    python = data.get("python", {})
    build = data.get("build", {})
    return Site(
        name=data["name"], path=path, raw=data, description=data["description"],
        install_root=root,
        module_root=os.path.abspath(module_root or data["module_root"]),
        cache_dir=data.get("cache_dir") or os.path.join(root, ".hpcstack", "cache"),
        stage_root=data.get("stage_root") or os.path.join(root, ".hpcstack", "stage"),
        modules=ModulesConfig(**data["modules"]),
        horovod=HorovodConfig(**data["horovod"]),
        launcher=LauncherConfig(**data["launcher"]),
        python_version=python.get("version"),
        index=python.get("index", "pypi"),
        jobs=build.get("jobs"),
        build_env=dict(build.get("env", {})),
        slurm=dict(data.get("slurm", {})),
        validation=dict(data.get("validation", {})),
        references=dict(data.get("references", {})),
    )
