"""Judge validation runs the way ReFrame judges a regression test: sanity first, then performance.

This module only judges: runs in (:class:`RunOutcome`), verdicts out (:class:`Verdict`, with a
:class:`RunVerdict` per run and a :class:`FigureOutcome` per figure); it never renders.
:mod:`hpcstack.validate.render` turns a verdict's document (:meth:`Verdict.to_dict`, the
``report.json`` format) into markdown and a PNG.

A *run* is one backend (``horovod`` or ``ddp``) of the training program in one Slurm job on N
nodes. Its **sanity** comes from the job (it must end COMPLETED, or at least this backend must have
finished with exit status 0), from the program's own checks (its ``result`` record: the loss fell
below the threshold, parameters identical on all ranks) and from the ranks it ran on. Its
**performance figures** are

* ``throughput_total`` (img/s): the sum over ranks of each rank's mean img/s;
* ``throughput_per_rank`` (img/s): ``throughput_total / ranks`` (per GPU on GPU sites);
* ``scaling_efficiency`` (fraction): ``throughput_total(N) / (N * throughput_total(1))``, against
  the 1-node run of the same backend in the same validation (absent without a 1-node run).

Each figure is compared with the site's **performance references**, kept as data in the site
config (``references:``), in ReFrame's form ``(value, lower, upper, unit)`` with tolerances relative
to the value (``lower=-0.1`` allows 10 % below; ``None`` means unbounded). References are looked up
per ``"<site>:<partition>"`` and node count, with ``*`` for any (see :func:`lookup_references`).

Sources: ReFrame's ``reference`` / ``@performance_function`` / ``@sanity_function``
(https://reframe-hpc.readthedocs.io/en/stable/regression_test_api.html); Horovod's definition of
scaling efficiency (https://horovod.readthedocs.io/en/stable/benchmarks_include.html).

Only the standard library is imported, so that :mod:`hpcstack.site` can import :data:`FIGURES`
cheaply.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, field

#: The PyTorch trainer's figures, with their units (``scaling_efficiency`` is a fraction, 0.9 =
#: 90 %): the defaults of :func:`judge` for callers that pass no figures of a validation file
#: (a recipe's validation file declares its own, :class:`hpcstack.validate.workload.Figure`).
FIGURES = {"throughput_total": "img/s", "throughput_per_rank": "img/s", "scaling_efficiency": ""}


def _default_figures() -> dict:
    from hpcstack.validate.workload import Figure

    return {"throughput_total": Figure("throughput_total", "img/s", "throughput_total", "img_per_sec",
                                       label="img/s total"),
            "throughput_per_rank": Figure("throughput_per_rank", "img/s", "throughput_total", "img_per_sec",
                                          per_rank=True, label="img/s per rank"),
            "scaling_efficiency": Figure("scaling_efficiency", "", scaling_of="throughput_total",
                                         label="scaling efficiency")}


def startup_summary(records: list[dict]) -> dict | None:
    """Start-up time of a run's ranks from their ``startup`` records (one per rank: ``rank``,
    ``imports_s``: process start to imports done, ``first_step_s``: process start to the end of
    the first measured step, in seconds): median and max over the ranks, the figure sites watch
    for import storms on parallel file systems.

    Returns:
        dict | None: ``{"ranks", "imports_s": {"median", "max"}, "first_step_s": {"median",
        "max"}}``; None without startup records.
    """
    import statistics

    rows = [r for r in records if r.get("record") == "startup"]
    if not rows:
        return None
    out: dict = {"ranks": len(rows)}
    for key in ("imports_s", "first_step_s"):
        values = [float(r[key]) for r in rows if r.get(key) is not None]
        out[key] = ({"median": statistics.median(values), "max": max(values)} if values
                    else {"median": None, "max": None})
    return out


#: The fields of a ``gpu`` record that the report keeps, per rank.
GPU_FIELDS = ("rank", "host", "local_rank", "cuda_visible_devices", "device", "physical_gpu", "uses")


def gpu_summary(records: list[dict]) -> list[dict]:
    """Per rank, the GPU it uses or would use, from the ``gpu`` records (:data:`GPU_FIELDS`),
    sorted by rank; empty when the program writes none."""
    rows = [r for r in records if r.get("record") == "gpu"]
    return [{key: r.get(key) for key in GPU_FIELDS}
            for r in sorted(rows, key=lambda r: _int_or(r.get("rank")))]


@dataclass(frozen=True)
class Reference:
    """A performance reference ``(value, lower, upper, unit)``, ReFrame style.

    Args:
        value (float): the expected figure, in ``unit``.
        lower (float | None): relative lower tolerance, ``<= 0`` (``-0.1``: at least 90 % of the
            value); None: no lower bound.
        upper (float | None): relative upper tolerance, ``>= 0``; None: no upper bound.
        unit (str): e.g. ``img/s``; empty for a fraction.

    Example:
        >>> Reference(300.0, -0.1, None, "img/s").bounds()
        (270.0, None)
    """

    value: float
    lower: float | None
    upper: float | None
    unit: str

    @classmethod
    def from_data(cls, item) -> "Reference":
        """Build from the site config's ``[value, lower, upper, unit]`` list (already validated)."""
        value, lower, upper, unit = item
        return cls(float(value), None if lower is None else float(lower),
                   None if upper is None else float(upper), str(unit))

    def bounds(self) -> tuple[float | None, float | None]:
        """Return the absolute ``(low, high)`` bounds; None where unbounded."""
        low = None if self.lower is None else self.value * (1 + self.lower)
        high = None if self.upper is None else self.value * (1 + self.upper)
        return low, high

    def check(self, name: str, measured: float) -> str | None:
        """Compare a measured figure with this reference.

        Args:
            name (str): the figure's name, for the message.
            measured (float): the measured value, in ``unit``.

        Returns:
            str | None: None within bounds, else which bound it missed and by how much, e.g.
            ``"throughput_per_rank 120.3 img/s is 29.7 img/s (19.8 %) below the lower bound
            150.0 img/s (reference 300.0 img/s, -50 %)"``.
        """
        low, high = self.bounds()
        if not math.isfinite(measured):
            return f"{name} is {measured}"
        if low is not None and measured < low:
            return self._miss(name, measured, low, "below the lower", self.lower)
        if high is not None and measured > high:
            return self._miss(name, measured, high, "above the upper", self.upper)
        return None

    def _miss(self, name: str, measured: float, bound: float, where: str, tol: float) -> str:
        by = abs(measured - bound)
        rel = f" ({100 * by / bound:.1f} %)" if bound else ""
        return (f"{name} {fmt(measured, self.unit)} is {fmt(by, self.unit)}{rel} {where} bound "
                f"{fmt(bound, self.unit)} (reference {fmt(self.value, self.unit)}, {100 * tol:+.0f} %)")


def fmt(value: float | None, unit: str) -> str:
    """Format a figure with its unit (fractions as fractions: ``0.873``)."""
    if value is None:
        return "n/a"
    if not unit:
        return f"{value:.3f}"
    return f"{value:.1f} {unit}"


def lookup_references(references: dict, site: str, partition: str, nodes: int) -> dict[str, Reference]:
    """Return the references that apply to ``nodes`` nodes of ``site:partition``.

    Systems are tried from the most general to the most specific — ``*:*``, ``*:<partition>``,
    ``<site>:*``, ``<site>:<partition>`` — and within each, node count ``"*"`` then ``"<nodes>"``;
    a later (more specific) entry replaces an earlier one figure by figure.

    Args:
        references (dict): the site config's ``references`` section (node keys as strings).
        site (str): the site's name.
        partition (str): the Slurm partition the jobs ran in.
        nodes (int): node count.

    Returns:
        dict[str, Reference]: figure name -> reference.
    """
    found: dict[str, Reference] = {}
    for system in ("*:*", f"*:{partition}", f"{site}:*", f"{site}:{partition}"):
        per_nodes = references.get(system) or {}
        for key in ("*", str(nodes)):
            for name, item in (per_nodes.get(key) or {}).items():
                found[name] = Reference.from_data(item)
    return found


@dataclass
class RunOutcome:
    """What one backend's run in one job left behind, as input to :func:`judge`.

    Args:
        backend (str): ``horovod`` or ``ddp``.
        nodes (int): the job's node count.
        ranks (int): ranks expected (nodes x tasks per node).
        job_id (str | None): Slurm job id (None for a job that was never submitted).
        job_state (str): the job's final ``JobState`` (``COMPLETED``, ``FAILED``, ``TIMEOUT``, ...).
        job_exit_code (str): the job's ``ExitCode`` (``status:signal``).
        exit_status (int | None): this backend's own exit status, as the job script recorded it;
            None when the job ended before the backend finished.
        records (list[dict]): the training program's JSON-lines records.
        output (str | None): path of the job's output file.
        output_tail (list[str]): its last lines.
    """

    backend: str
    nodes: int
    ranks: int
    job_id: str | None
    job_state: str
    job_exit_code: str
    exit_status: int | None
    records: list[dict] = field(default_factory=list)
    output: str | None = None
    output_tail: list[str] = field(default_factory=list)


def measured_figures(records: list[dict], figures: dict | None = None) -> dict[str, float]:
    """Extract the figures a run's records hold (not the scaling efficiencies: they need the
    1-node run).

    Args:
        records (list[dict]): the program's JSON-lines records.
        figures (dict[str, Figure] | None): the validation file's figures; None: the PyTorch
            trainer's (``throughput_total`` and ``throughput_per_rank``, img/s).

    Returns:
        dict[str, float]: the figures found (empty when the program did not report).
    """
    found = {}
    for name, figure in (figures or _default_figures()).items():
        if figure.record:
            value = figure.value(records)
            if value is not None:
                found[name] = value
    return found


def scaling_efficiency(throughput_n: float, throughput_1: float, nodes: int) -> float:
    """Scaling efficiency ``throughput(N) / (N * throughput(1))`` (Horovod's definition).

    Args:
        throughput_n (float): total img/s on ``nodes`` nodes.
        throughput_1 (float): total img/s on 1 node (same backend, same sizes).
        nodes (int): N.

    Returns:
        float: the efficiency as a fraction (1.0 = perfect linear scaling).

    Raises:
        ValueError: ``nodes < 1`` or ``throughput_1 <= 0``.
    """
    if nodes < 1 or throughput_1 <= 0:
        raise ValueError(f"scaling efficiency needs nodes >= 1 and throughput(1) > 0 "
                         f"(got {nodes}, {throughput_1})")
    return throughput_n / (nodes * throughput_1)


def gpu_binding_reasons(records: list[dict], gpus_per_node: int) -> list[str]:
    """Why a run's ranks would not each have a GPU of their own (empty when they would).

    Reads the training program's ``gpu`` records (one per rank: ``rank``, ``host``,
    ``local_rank``, ``cuda_visible_devices``, ``visible``, ``device``, ``physical_gpu``,
    ``problem``; see ``hpcstack_train.launch.choose_gpu``). They state what each rank uses, or on
    a node without CUDA (a site twin, a CPU test partition) what it *would* use, given the
    ``CUDA_VISIBLE_DEVICES`` Slurm set for it. A run fails, one line per problem, when

    * a rank has no GPU of its own or would pick an index it cannot see: its ``problem``, a
      ``cuda:N`` with N at or past the GPUs it sees (``visible``), or, with
      ``CUDA_VISIBLE_DEVICES`` unset, past the node's ``slurm.gpus_per_node``;
    * two ranks of one node would use the same physical GPU (the N-th entry of their
      ``CUDA_VISIBLE_DEVICES``, or N where it is unset): e.g. four ranks that each see ``0,1,2,3``
      and all pick ``cuda:0``, or ranks bound to one GPU each that pick ``cuda:<local rank>``.

    Each line names the ranks, the node and the ``CUDA_VISIBLE_DEVICES`` they saw. The rule is
    off (no lines) on a site without GPUs (``gpus_per_node == 0``) and for a program that writes
    no ``gpu`` records.

    Args:
        records (list[dict]): the run's JSON-lines records.
        gpus_per_node (int): the site's ``slurm.gpus_per_node``.

    Returns:
        list[str]: one line per problem.

    Example:
        >>> recs = [{"record": "gpu", "rank": r, "host": "n1", "local_rank": r,
        ...          "cuda_visible_devices": "0,1", "visible": 2, "device": "cuda:0",
        ...          "physical_gpu": "0"} for r in (0, 1)]
        >>> gpu_binding_reasons(recs, 4)
        ["ranks 0, 1 on n1 would share GPU 0 (cuda:0; CUDA_VISIBLE_DEVICES '0,1', '0,1')"]
    """
    if not gpus_per_node:
        return []
    rows = [r for r in records if r.get("record") == "gpu"]

    def seen(r: dict) -> str:
        value = r.get("cuda_visible_devices")
        return "unset" if value is None else repr(str(value))

    def who(r: dict) -> str:
        return f"rank {r.get('rank')} on {r.get('host')} (local rank {r.get('local_rank')})"

    reasons = []
    shared: dict[tuple[str, str], list[dict]] = {}
    for r in sorted(rows, key=lambda r: (str(r.get("host")), _int_or(r.get("rank")))):
        device, visible = r.get("device"), r.get("visible")
        index = _int_or(str(device).rpartition(":")[2], None) if device else None
        if r.get("problem") or index is None:
            reasons.append(f"{who(r)} has no GPU to use: "
                           f"{r.get('problem') or 'no device reported'} (CUDA_VISIBLE_DEVICES {seen(r)})")
            continue
        if isinstance(visible, int) and index >= visible:
            reasons.append(f"{who(r)} would pick {device} but sees {visible} GPU(s) "
                           f"(CUDA_VISIBLE_DEVICES {seen(r)})")
            continue
        if visible is None and r.get("cuda_visible_devices") is None and index >= gpus_per_node:
            reasons.append(f"{who(r)} would pick {device} but the node has {gpus_per_node} GPU(s) "
                           f"(slurm.gpus_per_node; CUDA_VISIBLE_DEVICES unset)")
            continue
        shared.setdefault((str(r.get("host")), str(r.get("physical_gpu"))), []).append(r)
    for (host, physical), group in shared.items():
        if len(group) > 1:
            devices = sorted({str(r.get("device")) for r in group})
            reasons.append(f"ranks {', '.join(str(r.get('rank')) for r in group)} on {host} would share "
                           f"GPU {physical} ({', '.join(devices)}; CUDA_VISIBLE_DEVICES "
                           f"{', '.join(seen(r) for r in group)})")
    return reasons


def _int_or(value, default: int | None = -1) -> int | None:
    """``int(value)``, or ``default`` when it is not an integer."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def sanity_reasons(run: RunOutcome, required_transport: str | None = None, *,
                   every_rank: str | None = "throughput", check_ranks: bool = True,
                   gpus_per_node: int = 0, records: tuple = ()) -> list[str]:
    """Why a run fails its sanity checks (empty when it passes).

    Checks, in order: the backend finished (else the job's id, state and exit code are named),
    with exit status 0; its collectives check (``collectives`` record), if it ran, found every
    result exact (each failing rank's message is passed on: backend, op, dtype, size, rank, first
    wrong element); the test accuracy of its ``classifier`` record (``--model digits``), if any,
    reached its threshold (every rank's; the lowest is named); its ``result`` record exists and is ok (the training program's own
    reasons are passed on); it ran on the expected number of ranks, and reported the throughput
    of every rank; its transport contains ``required_transport`` (e.g. ``nccl`` on GPU sites);
    on a site with GPUs, every rank has a GPU of its own (:func:`gpu_binding_reasons`).

    Args:
        run (RunOutcome): the run.
        required_transport (str | None): substring the ``config`` record's transport must hold.
        every_rank (str | None): a record kind every rank reports (``"rank": R``), from the
            validation file's ``sanity.every_rank`` (default the trainer's ``throughput``).
        check_ranks (bool): compare the ``config`` record's world size with ``run.ranks``.
        gpus_per_node (int): the site's ``slurm.gpus_per_node``; 0 turns the GPU rule off.
        records (tuple[str, ...]): record kinds the run must have written, from its backend's
            declaration (checked once its result record is there).
    """
    if run.exit_status is None:
        return [f"did not finish: job {run.job_id} ended {run.job_state} "
                f"(exit code {run.job_exit_code})"]
    reasons = []
    if run.exit_status != 0:
        reasons.append(f"exit status {run.exit_status}")
    result = next((r for r in run.records if r.get("record") == "result"), None)
    collectives = CollectivesOutcome.from_records(run.records)
    if collectives.ok is False:
        # named even when the program stopped before its result record
        reasons += [f"collectives check failed: {message}"
                    for message in collectives.failures or ["a result was wrong"]]
    classifier = ClassifierOutcome.from_records(run.records)
    if classifier.ok is False:
        accuracy = "n/a" if classifier.test_accuracy is None else f"{classifier.test_accuracy:.4f}"
        reasons.append(f"test accuracy {accuracy} below the threshold "
                       f"{classifier.threshold} (digits classifier, {classifier.test_images} test "
                       f"images, {classifier.epochs} epoch(s))")
    if result is None:
        reasons.append("no result record in its output (it stopped before the end)")
    elif not result.get("ok"):
        reasons += [reason for reason in result.get("reasons") or ["result not ok"]
                    if not (collectives.ok is False and reason.startswith("collectives check:"))
                    and not (classifier.ok is False and reason.startswith("test accuracy"))]
    config = next((r for r in run.records if r.get("record") == "config"), None)
    if check_ranks and config is not None and config.get("world_size") != run.ranks:
        reasons.append(f"ran on {config.get('world_size')} ranks, expected {run.ranks}")
    per_rank = {r.get("rank") for r in run.records if r.get("record") == every_rank}
    if every_rank and result is not None and per_rank != set(range(run.ranks)):
        reasons.append(f"{every_rank} reported for ranks {sorted(per_rank)}, expected 0..{run.ranks - 1}")
    if required_transport and config is not None and required_transport not in str(config.get("transport")):
        reasons.append(f"transport {config.get('transport')!r} does not use {required_transport}")
    kinds = {r.get("record") for r in run.records}
    if result is not None:
        reasons += [f"no {kind} record in its output (its backend writes one)" for kind in records if kind not in kinds]
    reasons += gpu_binding_reasons(run.records, gpus_per_node)
    return reasons


@dataclass(frozen=True)
class CollectivesOutcome:
    """The training program's collectives check of one run (its ``collectives`` record).

    Attributes:
        ran (bool): the record exists (False: the program ran with ``--no-collectives-check`` or
            stopped before it).
        ok (bool | None): every result exact; None when it did not run.
        checks (int): op x dtype x size combinations compared on each rank.
        ops, dtypes, sizes (int): how many of each were checked.
        seconds (float | None): how long the check took (the slowest rank), in s.
        failures (list[str]): one message per failing rank, naming backend, op, dtype, size,
            rank and the first wrong element with got/want.
        skipped (list[dict]): ``{"op", "dtype", "reason"}`` for what the backend lacks.
    """

    ran: bool
    ok: bool | None = None
    checks: int = 0
    ops: int = 0
    dtypes: int = 0
    sizes: int = 0
    seconds: float | None = None
    failures: list[str] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)

    @classmethod
    def from_records(cls, records: list[dict]) -> "CollectivesOutcome":
        """Read the ``collectives`` record of a run's records (``ran=False`` without one)."""
        rec = next((r for r in records if r.get("record") == "collectives"), None)
        if rec is None:
            return cls(ran=False)
        return cls(ran=True, ok=bool(rec.get("ok")), checks=int(rec.get("checks", 0)),
                   ops=len(rec.get("ops") or []), dtypes=len(rec.get("dtypes") or []),
                   sizes=len(rec.get("sizes") or []), seconds=rec.get("seconds"),
                   failures=list(rec.get("failures") or []), skipped=list(rec.get("skipped") or []))

    def to_dict(self) -> dict:
        """``{"ran", "ok", "checks", "ops", "dtypes", "sizes", "seconds", "failures", "skipped"}``."""
        return {"ran": self.ran, "ok": self.ok, "checks": self.checks, "ops": self.ops,
                "dtypes": self.dtypes, "sizes": self.sizes, "seconds": self.seconds,
                "failures": list(self.failures), "skipped": list(self.skipped)}


@dataclass(frozen=True)
class ClassifierOutcome:
    """The digits classifier of one run (the training program's ``classifier`` record, written
    with ``--model digits``).

    Attributes:
        ran (bool): the record exists (False for the synthetic workloads).
        test_accuracy (float | None): the lowest test accuracy over the ranks (fraction).
        threshold (float | None): the accuracy the run had to reach.
        test_images, train_images, epochs (int): the data set split and training length.
        seconds (float | None): training and evaluation time on rank 0, in s.
    """

    ran: bool
    test_accuracy: float | None = None
    threshold: float | None = None
    test_images: int = 0
    train_images: int = 0
    epochs: int = 0
    seconds: float | None = None

    @property
    def ok(self) -> bool | None:
        """The accuracy reached the threshold; None when the classifier did not run."""
        if not self.ran:
            return None
        return (self.test_accuracy is not None and self.threshold is not None
                and self.test_accuracy >= self.threshold)

    @classmethod
    def from_records(cls, records: list[dict]) -> "ClassifierOutcome":
        """Read the ``classifier`` record of a run's records (``ran=False`` without one)."""
        rec = next((r for r in records if r.get("record") == "classifier"), None)
        if rec is None:
            return cls(ran=False)
        per_rank = [float(a) for a in rec.get("test_accuracy_per_rank") or []]
        accuracy = min(per_rank) if per_rank else rec.get("test_accuracy")
        return cls(ran=True, test_accuracy=None if accuracy is None else float(accuracy),
                   threshold=rec.get("threshold"), test_images=int(rec.get("test_images", 0)),
                   train_images=int(rec.get("train_images", 0)), epochs=int(rec.get("epochs", 0)),
                   seconds=rec.get("seconds"))

    def to_dict(self) -> dict:
        """``{"ran", "ok", "test_accuracy", "threshold", "test_images", "train_images", "epochs",
        "seconds"}``."""
        return {"ran": self.ran, "ok": self.ok, "test_accuracy": self.test_accuracy,
                "threshold": self.threshold, "test_images": self.test_images,
                "train_images": self.train_images, "epochs": self.epochs, "seconds": self.seconds}


@dataclass(frozen=True)
class FigureOutcome:
    """One performance figure of one run, judged against its reference.

    Attributes:
        name (str): a key of :data:`FIGURES`.
        value (float | None): measured, in ``unit``; None when not measured.
        unit (str): the figure's unit (empty for a fraction).
        reference (Reference | None): the reference that applies; None when there is none.
        ok (bool | None): within bounds; None when there is no reference or no value.
        message (str | None): which bound it missed and by how much, or why it was not measured.
    """

    name: str
    value: float | None
    unit: str
    reference: Reference | None = None
    ok: bool | None = None
    message: str | None = None
    label: str = ""

    def to_dict(self) -> dict:
        """``{"value", "unit", "label", "ok", "message", "reference", "bounds"}`` (lists for the JSON)."""
        ref = self.reference
        return {"value": self.value, "unit": self.unit, "label": self.label or self.name,
                "ok": self.ok, "message": self.message,
                "reference": None if ref is None else [ref.value, ref.lower, ref.upper, ref.unit],
                "bounds": None if ref is None else list(ref.bounds())}


@dataclass(frozen=True)
class RunVerdict:
    """The judgement of one backend on one node count.

    Attributes:
        run (RunOutcome): what was judged.
        sanity (list[str]): why sanity failed (empty: passed).
        figures (dict[str, FigureOutcome]): every figure of :data:`FIGURES`.
        transport (str | None): the transport the program reported.
        throughput_total_ci95 (float | None): 95 % confidence half-width of the total, img/s.
        collectives (CollectivesOutcome): the program's collectives check.
        classifier (ClassifierOutcome): the digits classifier's test accuracy (``ran`` False
            for the synthetic workloads).
        startup (dict | None): start-up time over the ranks (:func:`startup_summary`).
        gpus (list[dict]): per rank, the GPU it uses or would use (:func:`gpu_summary`).
    """

    run: RunOutcome
    sanity: list[str]
    figures: dict[str, FigureOutcome]
    transport: str | None = None
    throughput_total_ci95: float | None = None
    collectives: CollectivesOutcome = field(default_factory=lambda: CollectivesOutcome(ran=False))
    classifier: ClassifierOutcome = field(default_factory=lambda: ClassifierOutcome(ran=False))
    startup: dict | None = None
    gpus: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Sanity passed and no figure missed its reference."""
        return not self.sanity and all(f.ok is not False for f in self.figures.values())

    def failures(self) -> list[str]:
        """One line per failed check, naming backend, node count, job and figure."""
        where = f"{self.run.backend} on {self.run.nodes} node(s) (job {self.run.job_id})"
        return ([f"sanity: {where}: {reason}" for reason in self.sanity]
                + [f"performance: {where}: {f.message}" for f in self.figures.values() if f.ok is False])

    def to_dict(self) -> dict:
        """The run's entry of the report document."""
        r = self.run
        return {"backend": r.backend, "nodes": r.nodes, "ranks": r.ranks, "job_id": r.job_id,
                "job_state": r.job_state, "exit_status": r.exit_status, "transport": self.transport,
                "ok": self.ok, "sanity": list(self.sanity),
                "figures": {name: f.to_dict() for name, f in self.figures.items()},
                "throughput_total_ci95": self.throughput_total_ci95,
                "collectives": self.collectives.to_dict(), "classifier": self.classifier.to_dict(),
                "startup": self.startup, "gpus": list(self.gpus)}


@dataclass(frozen=True)
class Verdict:
    """The judgement of a whole validation.

    Attributes:
        site, partition, recipe (str): what was validated, where.
        runs (list[RunVerdict]): sorted by backend, then node count.
        failures (list[str]): one line per failed job or check.
        generated (str): when, ISO 8601 UTC.
        output_dir (str | None): where the jobs wrote their output.
        jobs (list[dict]): the jobs as recorded (``job_id``, ``nodes``, ``state``, ...).
        settings (dict): model, batch size etc., as they were.
    """

    site: str
    partition: str
    recipe: str
    runs: list[RunVerdict]
    failures: list[str]
    generated: str
    output_dir: str | None = None
    jobs: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    figure_specs: dict = field(default_factory=_default_figures)

    @property
    def system(self) -> str:
        """``<site>:<partition>``."""
        return f"{self.site}:{self.partition}"

    @property
    def ok(self) -> bool:
        """No failure, at least one run, every run ok."""
        return not self.failures and bool(self.runs) and all(r.ok for r in self.runs)

    def scaling(self) -> dict[str, dict[str, dict]]:
        """``{backend: {"<nodes>": {"value", "unit", "figure", "efficiency", "test_accuracy"}}}``
        for runs that measured the first figure that has a scaling efficiency
        (``img_per_sec`` too where its unit is img/s; ``test_accuracy`` None unless the digits
        classifier ran)."""
        out: dict[str, dict[str, dict]] = {}
        for r in self.runs:
            scaled = next(((name, f.scaling_of) for name, f in self.figure_specs.items() if f.scaling_of), None)
            if scaled is None or scaled[1] not in r.figures:
                continue
            base = r.figures[scaled[1]]
            if base.value is not None:
                point = {"value": base.value, "unit": base.unit, "figure": base.name,
                         "efficiency": r.figures[scaled[0]].value, "test_accuracy": r.classifier.test_accuracy}
                if base.unit == "img/s":
                    point = {"img_per_sec": base.value, **point}
                out.setdefault(r.run.backend, {})[str(r.run.nodes)] = point
        return out

    def to_dict(self) -> dict:
        """The report document (``report.json``): ``{"ok", "site", "system", "recipe",
        "generated", "output_dir", "settings", "jobs", "runs", "scaling", "failures"}``."""
        return {"ok": self.ok, "site": self.site, "system": self.system, "recipe": self.recipe,
                "generated": self.generated, "output_dir": self.output_dir,
                "settings": self.settings, "jobs": self.jobs,
                "runs": [r.to_dict() for r in self.runs], "scaling": self.scaling(),
                "failures": list(self.failures)}


def judge_figures(reasons: list[str], values: dict[str, float],
                  refs: dict[str, Reference], specs: dict | None = None) -> dict[str, FigureOutcome]:
    """Judge every figure of one run against its reference, if any.

    Args:
        reasons (list[str]): its sanity failures (figures are not measured when any).
        values (dict[str, float]): the measured figures.
        refs (dict[str, Reference]): the references that apply (:func:`lookup_references`).
        specs (dict[str, Figure] | None): the validation file's figures; None: the trainer's.
    """
    figures = {}
    for name, spec in (specs or _default_figures()).items():
        unit = spec.unit
        ref, value = refs.get(name), values.get(name)
        ok = message = None
        if ref is not None:
            if value is None:
                message = ("not measured: sanity failed" if reasons else
                           "not measured: needs a 1-node run of the same backend"
                           if spec.scaling_of else "not measured")
            else:
                message = ref.check(name, value)
                ok = message is None
        figures[name] = FigureOutcome(name, value, unit, ref, ok, message, spec.label or name)
    return figures


def judge(runs: list[RunOutcome], *, site: str, partition: str, recipe: str,
          references: dict, required_transport: str | None = None,
          output_dir: str | None = None, jobs: list[dict] | None = None,
          settings: dict | None = None, figures: dict | None = None,
          every_rank: str | None = "throughput", gpus_per_node: int = 0,
          records: dict | None = None, transports: dict | None = None) -> Verdict:
    """Judge every run: sanity, then each figure against the references.

    Args:
        runs (list[RunOutcome]): one per backend and node count.
        site (str): site name; partition (str): the partition the jobs ran in.
        recipe (str): ``name/version`` of the stack.
        references (dict): references per ``site:partition`` and node count.
        required_transport (str | None): see :func:`sanity_reasons`.
        output_dir (str | None): where the jobs wrote their output (recorded).
        jobs (list[dict] | None): per job: ``job_id``, ``nodes``, ``state``, ``exit_code``,
            ``output``, ``output_tail``, ``elapsed``; recorded, and failed jobs are named.
        settings (dict | None): model, batch size etc., recorded as they were.
        figures (dict[str, Figure] | None): the validation file's figures (None: the PyTorch
            trainer's, :data:`FIGURES`).
        every_rank (str | None): see :func:`sanity_reasons`.
        gpus_per_node (int): the site's ``slurm.gpus_per_node``: when > 0, two ranks of a node
            on one GPU, or a rank without a GPU it can see, fail the run
            (:func:`gpu_binding_reasons`).
        records (dict[str, tuple[str, ...]] | None): backend -> record kinds its runs must
            write (the backend's declaration, ``records``); see :func:`sanity_reasons`.
        transports (dict | None): job id -> the verdict on its NCCL logs
            (:class:`hpcstack.validate.transport.TransportVerdict`): each failure is one line
            ``transport: job J (N node(s)): ...``, and the job's entry of the report gets its
            ``transport`` (networks used, the NCCL loaded beside the one the site names).

    Returns:
        Verdict: its ``failures`` has one line per failed job or check, naming the backend,
        node count and figure.
    """
    failures: list[str] = []
    jobs = [dict(job) for job in jobs or []]
    for job in jobs:
        checked = (transports or {}).get(job.get("job_id"))
        if checked is not None:
            job["transport"] = checked.to_dict()
            failures += [f"transport: job {job.get('job_id')} ({job.get('nodes')} node(s)): {line}"
                         for line in checked.failures]
        if job.get("state") != "COMPLETED":
            failures.append(f"job {job.get('job_id')} ({job.get('nodes')} node(s)) ended "
                            f"{job.get('state')} with exit code {job.get('exit_code')}; see "
                            f"{job.get('output')}")
    verdicts = []
    specs = figures or _default_figures()
    one_node = {r.backend: measured_figures(r.records, specs) for r in runs if r.nodes == 1}
    for run in sorted(runs, key=lambda r: (r.backend, r.nodes)):
        reasons = sanity_reasons(run, required_transport, every_rank=every_rank,
                                 gpus_per_node=gpus_per_node, records=(records or {}).get(run.backend, ()))
        values = measured_figures(run.records, specs) if not reasons else {}
        for name, spec in specs.items():
            base = one_node.get(run.backend, {}).get(spec.scaling_of) if spec.scaling_of else None
            if base and spec.scaling_of in values:
                values[name] = scaling_efficiency(values[spec.scaling_of], base, run.nodes)
        figures_out = judge_figures(reasons, values, lookup_references(references, site, partition, run.nodes),
                                    specs)
        config = next((r for r in run.records if r.get("record") == "config"), {})
        verdict = RunVerdict(run, reasons, figures_out, config.get("transport"),
                             next((r.get("img_per_sec_ci95") for r in run.records
                                   if r.get("record") == "throughput_total"), None),
                             CollectivesOutcome.from_records(run.records),
                             ClassifierOutcome.from_records(run.records), startup_summary(run.records),
                             gpu_summary(run.records))
        failures += verdict.failures()
        verdicts.append(verdict)
    return Verdict(site, partition, recipe, verdicts, failures,
                   generated=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   output_dir=output_dir, jobs=list(jobs or []), settings=dict(settings or {}),
                   figure_specs=specs)


def build_report(runs: list[RunOutcome], **kwargs) -> dict:
    """Judge (:func:`judge`, same keyword arguments) and return the report document.

    Returns:
        dict: :meth:`Verdict.to_dict`; ``runs[i]["figures"][name]`` holds ``value``, ``unit``,
        ``reference``, ``bounds``, ``ok`` (None when there is no reference) and ``message``.
    """
    return judge(runs, **kwargs).to_dict()
