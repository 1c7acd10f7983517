"""The :class:`Validation` component and its file: the program ``hpcstack validate`` runs, the backends it offers, its
workloads, the figures it reports with their units, how sanity is judged, and the performance
references per ``<site>:<partition>`` and node count — kept with the recipe, as ReFrame keeps a
test's ``reference`` with the test, not in the site config. Nothing here names a package: the
PyTorch trainer and mpi4py's benchmarks are declared by their recipes' files. It lives with the
other components (a recipe imports it from :mod:`hpcstack.recipe_api`); :mod:`hpcstack.validate`
plans, runs and judges what it declares.

A recipe lists a :class:`Validation` component naming a YAML file next to it
(``recipes/mpi4py/4.1.2.validation.yaml``)::

    program:                           # what every rank runs (placeholders: Program.argv)
      command: ["{bin}/mpi4py-validate", "{options}", --output, "{output}"]
      interpreter: python              # --local runs `python <command>`
      files: [mpi4py-validate]      # copied from the recipe directory into <prefix>/bin
      options: {ring_loops: --ring-loops}      # workload key -> option
      workload: {type: object, ...}    # JSON schema of a workload entry (default: scalars)
    nodes: [1, 2]                      # node counts of the Slurm jobs
    backends: [mpi]                    # default backends by name, or the recipe's own declared
                                       # as mappings (hpcstack.install.components.backends)
    workloads:                         # the program's settings
      cpu: {ring_loops: 1000}
      gpu: {...}                       # optional: where the partition has GPUs
      "cirrus:gpu": {...}              # optional: one system's own
      digits: {...}                    # optional: named, picked with --workload digits
    figures:                           # JSON-lines record and field, unit, report heading
      latency: {record: pingpong, field: latency_us, unit: us, label: latency 1 B}
      bandwidth_scaling: {scaling_of: bandwidth}   # value(N) / (N * value(1))
    sanity:
      every_rank: startup              # a record kind every rank reports
      cuda_transport: nccl             # on a site with CUDA, the transport every run must use
    references:                        # [value, lower, upper, unit], relative tolerances
      "localhost:debug": {"*": {latency: [40, null, 9.0, us]}, "2": {...}}

The program writes JSON lines (rank 0): ``config`` (``world_size``, ``transport``), the records
its figures name, one ``startup`` per rank (``imports_s``, ``first_step_s``) and ``result``
(``ok``, ``reasons``); :mod:`hpcstack.validate.judge` judges them.

The workload of a run is the system's own (``<site>:<partition>``, then ``<site>:*``), else
``gpu`` where the partition has GPUs (the site's ``slurm.gpus_per_node``) or the site's toolchain
has CUDA and the file has one, else ``cpu``. ``hpcstack validate --workload NAME`` picks a named
workload instead (any other lower-case key); it takes the ``device`` of the workload the run
would have had unless it names its own, so one entry serves CPU and GPU sites. A site with no
references is judged on sanity alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


from hpcstack.errors import ConfigError
from hpcstack.install.components.backends import BACKEND_SCHEMA, BACKENDS, Backend, get_backend, setup_problems
from hpcstack.install.components.base import Component
from hpcstack.install.actions import Run
from hpcstack.install.plan import INSTALL
from hpcstack.schema import load_yaml, value_problems
from hpcstack.schema import problems as schema_problems

_POS_INT = {"type": "integer", "minimum": 1}
_SYSTEM_KEY = r"^([a-z0-9][a-z0-9_-]*|\*):([A-Za-z0-9_.-]+|\*)$"
_NODES_KEY = r"^([1-9][0-9]*|\*)$"
_KEY_HINTS = {_SYSTEM_KEY: "'<site>:<partition>', '*' for any", _NODES_KEY: "a node count or '*'",
              r"^[a-z][a-z0-9_-]*$": "a workload name (lower case) or '<site>:<partition>'"}
#: One performance reference: [value, lower, upper, unit] (tolerances relative, ReFrame style).
_REFERENCE = {"type": "array", "minItems": 4, "maxItems": 4, "prefixItems": [
    {"type": "number", "exclusiveMinimum": 0},
    {"type": ["number", "null"], "maximum": 0, "minimum": -1},
    {"type": ["number", "null"], "minimum": 0},
    {"type": "string"},
]}
#: A workload entry where the program declares no schema of its own: scalar settings.
_ANY_WORKLOAD = {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean"]}}
#: A named workload (``hpcstack validate --workload NAME``), e.g. ``digits``.
_NAME_KEY = r"^[a-z][a-z0-9_-]*$"
_FIGURE_NAME = r"^[a-z][a-z0-9_]*$"
#: Placeholders a program's command may hold (:func:`program_argv`).
PLACEHOLDERS = ("prefix", "bin", "backend", "ranks", "nodes", "device", "threads", "output", "options")

#: JSON schema (draft 2020-12) of the ``program`` section.
_PROGRAM = {"type": "object", "additionalProperties": False, "required": ["command"], "properties": {
    "command": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
    "interpreter": {"type": "string", "minLength": 1},
    "options": {"type": "object", "additionalProperties": {"type": "string", "pattern": "^-"}},
    "files": {"type": "array", "items": {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"}},
    "workload": {"type": "object"},
}}
#: One figure: read from a record's field (``per_rank``: divided by the record's world_size;
#: ``over_ranks``: the max or median of the field over every record of the kind, one per rank), or
#: the scaling efficiency of another figure against the 1-node run (``scaling_of``).
_FIGURE = {"type": "object", "additionalProperties": False, "properties": {
    "record": {"type": "string", "minLength": 1},
    "field": {"type": "string", "minLength": 1},
    "per_rank": {"type": "boolean"},
    "over_ranks": {"enum": ["max", "median"]},
    "scaling_of": {"type": "string", "pattern": _FIGURE_NAME},
    "unit": {"type": "string"},
    "label": {"type": "string", "minLength": 1},
}, "oneOf": [{"required": ["record", "field", "unit"]}, {"required": ["scaling_of"]}]}
_SANITY = {"type": "object", "additionalProperties": False, "properties": {
    "every_rank": {"type": "string", "minLength": 1},
    "cuda_transport": {"type": "string", "minLength": 1},
}}


_TIER = {"type": "object", "additionalProperties": False, "properties": {
    "schedule": {"type": "string", "maxLength": 120,
                 "pattern": r"^[0-9*/,-]+( [0-9*/,-]+){4}$"},   # cron's five time fields
    "nodes": {"type": "array", "items": _POS_INT, "minItems": 1},
    "workload": {"type": "string", "pattern": _NAME_KEY},       # a named workload of the file
}}


def schema(workload: dict | None = None) -> dict:
    """JSON schema (draft 2020-12) of a recipe's validation file whose program's workload entries
    follow ``workload`` (a JSON schema; None: scalar settings)."""
    entry = workload or _ANY_WORKLOAD
    return {"type": "object", "additionalProperties": False, "required": ["program", "workloads", "figures"],
            "properties": {
        "program": _PROGRAM,
        "nodes": {"type": "array", "items": _POS_INT, "minItems": 1},
        "backends": {"type": "array", "minItems": 1, "items": {"oneOf": [
            {"type": "string", "minLength": 1}, BACKEND_SCHEMA]}},
        "workloads": {"type": "object", "required": ["cpu"], "additionalProperties": False,
                      "properties": {"cpu": entry, "gpu": entry},
                      "patternProperties": {_SYSTEM_KEY: entry, _NAME_KEY: entry}},
        "figures": {"type": "object", "minProperties": 1, "additionalProperties": False,
                    "patternProperties": {_FIGURE_NAME: _FIGURE}},
        "sanity": _SANITY,
        # re-validation tiers (hpcstack/validate/schedule.py): when each runs and what
        "tiers": {"type": "object", "additionalProperties": False, "patternProperties": {
            "^(smoke|full|probe)$": _TIER}},
        "references": {"type": "object", "additionalProperties": False, "patternProperties": {
            _SYSTEM_KEY: {"type": "object", "additionalProperties": False, "patternProperties": {
                _NODES_KEY: {"type": "object", "additionalProperties": _REFERENCE},
            }},
        }},
    }}


#: JSON schema of a validation file with scalar workload settings (the program gives its own).
SCHEMA = schema()


@dataclass(frozen=True)
class Figure:
    """A figure the validation reports, with its unit.

    Attributes:
        name (str): e.g. ``throughput_total``, ``latency``.
        unit (str): e.g. ``img/s``, ``us``; empty for a fraction (shown as a percentage).
        record, field (str | None): the JSON-lines record (``"record": NAME``) and its field that
            hold the value; None for a scaling efficiency.
        per_rank (bool): divide the field by the record's ``world_size``.
        over_ranks (str | None): ``max`` or ``median`` of the field over every record of the
            kind (one per rank, e.g. the trainer's ``startup`` records); None: the first record.
        scaling_of (str | None): the figure whose scaling efficiency against the 1-node run of the
            same backend this is: ``value(N) / (N * value(1))`` (Horovod's definition).
        label (str): the report's column heading.
    """

    name: str
    unit: str
    record: str | None = None
    field: str | None = None
    per_rank: bool = False
    scaling_of: str | None = None
    label: str = ""
    over_ranks: str | None = None

    def value(self, records: list[dict]) -> float | None:
        """The figure in a run's records (the first record of its kind, or the max or median
        over all of them with ``over_ranks``); None when absent."""
        if self.over_ranks:
            import statistics

            values = [float(r[self.field]) for r in records
                      if r.get("record") == self.record and r.get(self.field) is not None]
            if not values:
                return None
            return max(values) if self.over_ranks == "max" else statistics.median(values)
        rec = next((r for r in records if r.get("record") == self.record), None)
        if rec is None or rec.get(self.field) is None:
            return None
        value = float(rec[self.field])
        if self.per_rank:
            if not rec.get("world_size"):
                return None
            value /= int(rec["world_size"])
        return value


@dataclass(frozen=True)
class Program:
    """The validation program: the command every rank runs, and what it is given.

    Attributes:
        command (list[str]): words with placeholders ``{prefix}``, ``{bin}`` (``<prefix>/bin``),
            ``{backend}``, ``{ranks}``, ``{nodes}``, ``{device}`` (the workload's), ``{threads}``
            (cores per rank), ``{output}`` (the JSON-lines file it writes); a word ``{options}``
            becomes the workload's settings as options (see ``options``).
        interpreter (str | None): ``--local`` runs ``<interpreter> <command>`` (e.g. ``python``).
        options (dict[str, str]): workload key -> option; a true boolean gives the bare option,
            false none.
        files (list[str]): files next to the recipe that the install copies into ``<prefix>/bin``
            (the program itself, where the stack does not bring it).
    """

    command: list
    interpreter: str | None = None
    options: dict = field(default_factory=dict)
    files: list = field(default_factory=list)

    def argv(self, workload: dict, *, prefix: str, backend: str, output: str, threads: int,
             ranks: int, nodes: int) -> list[str]:
        """The command line of one run.

        Args:
            workload (dict): the run's workload settings.
            prefix (str): the stack's prefix.
            backend (str): the backend's name.
            output (str): the JSON-lines file the program writes.
            threads (int): cores (threads) per rank.
            ranks (int): the run's ranks in all.
            nodes (int): the run's node count.

        Example:
            ``Program(["{bin}/bench", "{options}", "--out", "{output}"], options={"size": "-n"})
            .argv({"size": 8}, prefix="/p", backend="mpi", output="o", threads=1, ranks=2,
            nodes=1)`` gives ``["/p/bin/bench", "-n", "8", "--out", "o"]``.
        """
        values = {"prefix": prefix, "bin": os.path.join(prefix, "bin"), "backend": backend,
                  "ranks": str(ranks), "nodes": str(nodes), "device": str(workload.get("device", "")),
                  "threads": str(threads), "output": output}
        argv: list[str] = []
        for word in self.command:
            if word == "{options}":
                argv += self.option_words(workload)
            else:
                argv.append(word.format(**values))
        return argv

    def option_words(self, workload: dict) -> list[str]:
        """The workload's settings as options, in the order of :attr:`options`."""
        words: list[str] = []
        for key, option in self.options.items():
            if isinstance(workload.get(key), bool):  # a flag: given when true
                words += [option] if workload[key] else []
            elif key in workload:
                words += [option, str(workload[key])]
        return words

    def executable(self, prefix: str) -> str | None:
        """The installed file the command starts with, where it lies in the stack (else None)."""
        first = self.command[0]
        if first.startswith(("{bin}/", "{prefix}/")):
            return first.format(prefix=prefix, bin=os.path.join(prefix, "bin"))
        return None


@dataclass(frozen=True)
class ValidationSpec:
    """A recipe's validation file, loaded and checked.

    Attributes:
        nodes (list[int]): default node counts of the Slurm jobs.
        backends (list[str]): default backends, by name (``horovod``, ``ddp``).
        workloads (dict[str, dict]): ``cpu``, ``gpu`` and per-system workloads.
        references (dict): per ``<site>:<partition>`` and node count (``"*"`` any), figure name ->
            ``[value, lower, upper, unit]`` (:func:`hpcstack.validate.judge.lookup_references`).
        program (Program): the command every rank runs.
        figures (dict[str, Figure]): the figures it reports, in report order.
        every_rank (str | None): a record every rank must report (``"rank": R``), e.g.
            ``throughput``; None: no such check.
        cuda_transport (str | None): on a site whose toolchain has CUDA, what the ``config``
            record's ``transport`` of every run must contain (``nccl``: GPU tensors between
            ranks over NCCL, not Gloo); None: no such check.
        declared_backends (dict[str, Backend]): the backends the file declares itself (by
            name); the others are :data:`hpcstack.install.components.backends.DEFAULT_BACKENDS`.
        tiers (dict[str, dict]): the file's ``tiers`` (``smoke``, ``full``, ``probe``: ``schedule``,
            ``nodes``, ``workload``), read by :func:`hpcstack.validate.schedule.tiers_of`.
    """

    nodes: list
    backends: list
    workloads: dict
    references: dict
    program: Program = None
    figures: dict = field(default_factory=dict)
    every_rank: str | None = None
    cuda_transport: str | None = None
    declared_backends: dict = field(default_factory=dict)
    tiers: dict = field(default_factory=dict)

    def backend(self, name: str) -> Backend:
        """The backend ``name``: the file's own declaration, else a default one.

        Raises:
            ValueError: neither knows it.
        """
        return get_backend(name, self.declared_backends)

    @property
    def local_backends(self) -> list[str]:
        """The backends ``hpcstack validate --local`` can run (:attr:`Backend.local`)."""
        return [b for b in self.backends if self.backend(b).local]

    def names(self) -> list[str]:
        """The named workloads (``--workload``): every key but the system ones, sorted."""
        return sorted(k for k in self.workloads if ":" not in k)

    def workload(self, site, partition: str | None, name: str | None = None) -> dict:
        """The training settings for a run on ``site`` (its ``partition``; None for ``--local``).

        Args:
            site (hpcstack.site.Site): gives its name, ``slurm.gpus_per_node`` and toolchain.
            partition (str | None): the Slurm partition; None for a run on this host.
            name (str | None): a named workload (``--workload``); None: the site's own.

        Raises:
            ConfigError: ``name`` is not a workload of the file (the message lists them).
        """
        default = None
        for key in (f"{site.name}:{partition or '*'}", f"{site.name}:*"):
            if key in self.workloads:
                default = dict(self.workloads[key])
                break
        if default is None:
            gpus = (site.slurm or {}).get("gpus_per_node", 0) or site.toolchain.has_cuda
            default = dict(self.workloads["gpu" if gpus and "gpu" in self.workloads else "cpu"])
        if name is None:
            return default
        if name not in self.names():
            raise ConfigError([f"--workload {name}: no such workload in the recipe's validation "
                               f"(known: {', '.join(self.names())})"])
        named = dict(self.workloads[name])
        if "device" not in named and "device" in default:
            named["device"] = default["device"]
        return named


@dataclass(frozen=True)
class Validation(Component):
    """Recipe component: the validation workload and performance references of the stack.

    It adds nothing to the install; ``hpcstack validate`` reads it from the recipe.

    Args:
        file (str): the validation YAML next to the recipe, e.g. ``"2.3.1-gpu.validation.yaml"``.

    Example:
        ``Validation("2.3.1-gpu.validation.yaml")``
    """

    file: str

    def contribute(self, ctx) -> dict[str, list]:
        """Checks the file when the recipe is resolved (a bad file fails the install's resolve
        too, not only a later validation); installs the program's ``files`` into ``<prefix>/bin``
        (each a copy, its content an input of the install step)."""
        spec = self.load(Path(ctx.recipe.directory))
        copies = []
        for name in spec.program.files:
            source = str(ctx.recipe_file(name))
            copies.append(Run(("install", "-m", "0755", source, os.path.join(ctx.bin_dir, name)),
                              input_files=(source,)))
        return {INSTALL: copies} if copies else {}

    def load(self, directory: Path) -> ValidationSpec:
        """Read and check the file.

        Raises:
            ConfigError: missing or unreadable file, bad YAML, or schema problems (one line each,
                with the key path).
        """
        path = Path(directory) / self.file
        data = _normalise(load_yaml(path, "validation file"))
        problems = value_problems(data, str(path), text_keys=False) or schema_problems(SCHEMA, data, str(path), hints=_KEY_HINTS)
        workload = ((data.get("program") or {}).get("workload") if isinstance(data, dict) else None)
        if not problems and workload:
            problems = schema_problems(schema(workload), data, str(path), hints=_KEY_HINTS)
        if problems:
            raise ConfigError(problems)
        problems = _meaning_problems(data, str(path))
        if problems:
            raise ConfigError(problems)
        p = data["program"]
        figures = {name: Figure(name, f.get("unit", ""), f.get("record"), f.get("field"),
                                bool(f.get("per_rank")), f.get("scaling_of"), f.get("label", name),
                                f.get("over_ranks"))
                   for name, f in data["figures"].items()}
        declared = {b["name"]: Backend.from_data(b) for b in data.get("backends", []) if isinstance(b, dict)}
        return ValidationSpec(nodes=list(data.get("nodes", [1, 2])),
                              backends=[b["name"] if isinstance(b, dict) else b for b in data.get("backends", ["mpi"])],
                              workloads=dict(data["workloads"]), references=dict(data.get("references", {})),
                              program=Program(list(p["command"]), p.get("interpreter"),
                                              dict(p.get("options", {})), list(p.get("files", []))),
                              figures=figures, every_rank=(data.get("sanity") or {}).get("every_rank"),
                              cuda_transport=(data.get("sanity") or {}).get("cuda_transport"),
                              declared_backends=declared, tiers=dict(data.get("tiers") or {}))


def _meaning_problems(data: dict, where: str) -> list[str]:
    """What the schema cannot say: backends registered, placeholders known, figures declared."""
    problems = []
    entries = data.get("backends", [])
    declared = [b["name"] for b in entries if isinstance(b, dict)]
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        name = entry["name"] if isinstance(entry, dict) else entry
        if name in seen:
            problems.append(f"{where}: backends.{i}: backend {name!r} named twice")
        seen.add(name)
        if isinstance(entry, dict):
            problems += setup_problems(Backend.from_data(entry), f"{where}: backends.{i}")
        elif name not in BACKENDS:
            problems.append(f"{where}: backends.{i}: unknown backend {name!r} (known: "
                            f"{', '.join(sorted({*BACKENDS, *declared}))}); or declare it here, "
                            f"as a mapping: {{name: {name}, ...}}")
    for i, word in enumerate(data["program"]["command"]):
        try:
            word.format(**{k: "" for k in PLACEHOLDERS})
        except (KeyError, IndexError, ValueError) as exc:
            problems.append(f"{where}: program.command.{i}: {word!r}: unknown placeholder {exc} "
                            f"(known: {', '.join('{' + k + '}' for k in PLACEHOLDERS)})")
    figures = data["figures"]
    for name, f in figures.items():
        if f.get("scaling_of") and f["scaling_of"] not in figures:
            problems.append(f"{where}: figures.{name}.scaling_of: {f['scaling_of']!r} is not a figure of the file")
    for system, per_nodes in (data.get("references") or {}).items():
        for nodes, refs in per_nodes.items():
            for name in refs:
                if name not in figures:
                    problems.append(f"{where}: references.{system}.{nodes}.{name}: unknown key "
                                    f"(figures: {', '.join(figures)})")
    return sorted(problems)


def _normalise(data: object) -> object:
    """The node-count keys of ``references`` as strings (YAML reads ``1:`` as an integer)."""
    if not isinstance(data, dict) or not isinstance(data.get("references"), dict):
        return data
    refs = {str(system): ({str(n): figs for n, figs in per_nodes.items()} if isinstance(per_nodes, dict)
                          else per_nodes)
            for system, per_nodes in data["references"].items()}
    return {**data, "references": refs}


def validation_of(recipe) -> ValidationSpec:
    """The :class:`ValidationSpec` of a recipe (its :class:`Validation` component).

    Raises:
        ConfigError: the recipe has no Validation component, or its file is bad.
    """
    found = recipe.component(Validation)
    if found is None:
        raise ConfigError([f"recipe {recipe.full_name} has no Validation component: nothing to validate with"])
    return found.load(Path(recipe.directory))
