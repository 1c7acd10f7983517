"""The recipe's validation: what ``hpcstack validate`` trains, and the performance references it is
judged against, per ``<site>:<partition>`` — kept with the recipe, as ReFrame keeps a test's
``reference`` with the test (issue 16), not in the site config.

A recipe lists a :class:`Validation` component naming a YAML file next to it
(``recipes/pytorch/2.3.1-gpu.validation.yaml``)::

    nodes: [1, 2]                      # node counts of the Slurm jobs
    backends: [horovod, ddp]
    workloads:                         # the training program's settings
      cpu: {model: tiny, image_size: 32, batch_size: 16, precision: fp32, device: cpu}
      gpu: {model: resnet50, image_size: 224, batch_size: 32, precision: fp32, device: cuda}
      "cirrus:gpu": {...}              # optional: one system's own
      digits: {model: digits, batch_size: 32, epochs: 20, lr: 0.01, accuracy_threshold: 0.95}
                                       # optional: named, picked with --workload digits
    references:                        # [value, lower, upper, unit], relative tolerances
      "cirrus:gpu": {"*": {throughput_per_rank: [367, -0.25, 0.15, img/s]}, "2": {...}}

The workload of a run is the system's own (``<site>:<partition>``, then ``<site>:*``), else
``gpu`` where the partition has GPUs (the site's ``slurm.gpus_per_node``) or the site's toolchain
has CUDA, else ``cpu``. ``hpcstack validate --workload NAME`` picks a named workload instead
(any other lower-case key, e.g. ``digits``: the real image classifier); it takes the ``device``
of the workload the run would have had unless it names its own, so one entry serves CPU and GPU
sites. A site with no references is judged on sanity alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


from hpcstack.errors import ConfigError
from hpcstack.schema import load_yaml, value_problems
from hpcstack.schema import problems as schema_problems
from hpcstack.validate.judge import FIGURES

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
_WORKLOAD = {"type": "object", "additionalProperties": False, "properties": {
    "model": {"type": "string", "minLength": 1},
    "image_size": _POS_INT,
    "batch_size": _POS_INT,
    "precision": {"enum": ["fp32", "amp"]},
    "channels_last": {"type": "boolean"},
    "device": {"enum": ["auto", "cpu", "cuda"]},
    "warmup_batches": {"type": "integer", "minimum": 0},
    "batches_per_iter": _POS_INT,
    "iterations": _POS_INT,
    "convergence_steps": _POS_INT,
    "loss_threshold": {"type": "number", "exclusiveMinimum": 0},
    "epochs": _POS_INT,
    "lr": {"type": "number", "exclusiveMinimum": 0},
    "accuracy_threshold": {"type": "number", "minimum": 0, "maximum": 1},
}}
#: A named workload (``hpcstack validate --workload NAME``), e.g. ``digits``.
_NAME_KEY = r"^[a-z][a-z0-9_-]*$"

#: JSON schema (draft 2020-12) of a recipe's validation file.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["workloads"], "properties": {
    "nodes": {"type": "array", "items": _POS_INT, "minItems": 1},
    "backends": {"type": "array", "minItems": 1, "items": {"enum": ["horovod", "ddp"]}},
    "workloads": {"type": "object", "required": ["cpu", "gpu"], "additionalProperties": False,
                  "properties": {"cpu": _WORKLOAD, "gpu": _WORKLOAD},
                  "patternProperties": {_SYSTEM_KEY: _WORKLOAD, _NAME_KEY: _WORKLOAD}},
    "references": {"type": "object", "additionalProperties": False, "patternProperties": {
        _SYSTEM_KEY: {"type": "object", "additionalProperties": False, "patternProperties": {
            _NODES_KEY: {"type": "object", "additionalProperties": False,
                         "properties": {name: _REFERENCE for name in FIGURES}},
        }},
    }},
}}


@dataclass(frozen=True)
class ValidationSpec:
    """A recipe's validation file, loaded and checked.

    Attributes:
        nodes (list[int]): default node counts of the Slurm jobs.
        backends (list[str]): default backends (``horovod``, ``ddp``).
        workloads (dict[str, dict]): ``cpu``, ``gpu`` and per-system workloads.
        references (dict): per ``<site>:<partition>`` and node count (``"*"`` any), figure name ->
            ``[value, lower, upper, unit]`` (:func:`hpcstack.validate.judge.lookup_references`).
    """

    nodes: list
    backends: list
    workloads: dict
    references: dict

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
            default = dict(self.workloads["gpu" if gpus else "cpu"])
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
class Validation:
    """Recipe component: the validation workload and performance references of the stack.

    It adds nothing to the install; ``hpcstack validate`` reads it from the recipe.

    Args:
        file (str): the validation YAML next to the recipe, e.g. ``"2.3.1-gpu.validation.yaml"``.

    Example:
        ``Validation("2.3.1-gpu.validation.yaml")``
    """

    file: str

    def contribute(self, ctx) -> dict[str, list]:
        """Nothing to install; checks the file when the recipe is resolved (a bad file fails
        the install's resolve too, not only a later validation)."""
        self.load(Path(ctx.recipe.directory))
        return {}

    def load(self, directory: Path) -> ValidationSpec:
        """Read and check the file.

        Raises:
            ConfigError: missing or unreadable file, bad YAML, or schema problems (one line each,
                with the key path).
        """
        path = Path(directory) / self.file
        data = _normalise(load_yaml(path, "validation file"))
        problems = value_problems(data, str(path), text_keys=False) or schema_problems(SCHEMA, data, str(path), hints=_KEY_HINTS)
        if problems:
            raise ConfigError(problems)
        return ValidationSpec(nodes=list(data.get("nodes", [1, 2])),
                              backends=list(data.get("backends", ["horovod", "ddp"])),
                              workloads=dict(data["workloads"]), references=dict(data.get("references", {})))


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
    found = [c for c in recipe.components if isinstance(c, Validation)]
    if not found:
        raise ConfigError([f"recipe {recipe.full_name} has no Validation component: nothing to validate with"])
    return found[0].load(Path(recipe.directory))
