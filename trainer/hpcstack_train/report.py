"""What the trainer says: JSON-lines records and summary lines on stderr (rank 0 only), and
the reasons a record fails its checks. No torch (tests run it without).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Optional, Sequence, TextIO

from . import PROGRAM
from .collective_cases import COLLECTIVES


def classifier_reasons(classifier: dict) -> list[str]:
    """Why the ``classifier`` record fails (empty when it passes): a test accuracy below the
    threshold (on any rank), or parameters that differ between ranks."""
    reasons = []
    worst = min(classifier["test_accuracy_per_rank"])
    if not worst >= classifier["threshold"]:
        reasons.append(f"test accuracy {worst:.4f} below the threshold {classifier['threshold']} "
                       f"({classifier['test_images']} test images, {classifier['epochs']} epoch(s))")
    if not classifier["params_identical"]:
        reasons.append(f"parameters differ between ranks: {len(set(classifier['param_hashes']))} "
                       f"distinct sha256 digests on {len(classifier['param_hashes'])} ranks")
    return reasons


def collectives_summary(record: dict) -> str:
    """The stderr line of a ``collectives`` record, e.g. ``collectives: 356 checks (11 ops x 5
    dtypes x 9 sizes) on cpu in 2.1 s: OK; skipped: ...``."""
    line = (f"collectives: {record['checks']} checks ({len(record['ops'])} ops x "
            f"{len(record['dtypes'])} dtypes x {len(record['sizes'])} sizes) on "
            f"{record['device']} in {record['seconds']:.1f} s: "
            + ("OK" if record["ok"] else "FAILED: " + "; ".join(record["failures"])))
    return line + "".join(f"; skipped {what}" for what in skipped_summary(record["skipped"]))


def skipped_summary(skipped: Sequence[dict]) -> list[str]:
    """One phrase per distinct reason of the ``skipped`` list: ``"<ops> on <dtypes>: <reason>"``
    (``all ops`` when every op of COLLECTIVES is skipped for those dtypes)."""
    by_reason: dict[str, tuple[list[str], list[str]]] = {}
    for item in skipped:
        ops, dtypes = by_reason.setdefault(item["reason"], ([], []))
        ops += [item["op"]] if item["op"] not in ops else []
        dtypes += [item["dtype"]] if item["dtype"] not in dtypes else []
    return [("all ops" if len(ops) == len(COLLECTIVES) else ", ".join(ops))
            + f" on {', '.join(dtypes)}: {reason}" for reason, (ops, dtypes) in by_reason.items()]


def failure_reasons(convergence: dict) -> list[str]:
    """Human-readable reasons the convergence record fails its checks (empty when it passes)."""
    reasons = []
    if not math.isfinite(convergence["final_loss"]):
        reasons.append(f"final loss is {convergence['final_loss']}")
    if not convergence["loss_fell"]:
        reasons.append(f"loss did not fall: {convergence['initial_loss']:.4f} -> "
                       f"{convergence['final_loss']:.4f}")
    if not convergence["below_threshold"]:
        reasons.append(f"final loss {convergence['final_loss']:.4f} not below threshold "
                       f"{convergence['threshold']}")
    if not convergence["params_identical"]:
        distinct = len(set(convergence["param_hashes"]))
        reasons.append(f"parameters differ between ranks: {distinct} distinct sha256 digests "
                       f"on {len(convergence['param_hashes'])} ranks")
    return reasons


#: Bytes of one rank's ``gpu`` record as gathered (JSON, zero-padded): ample for a host name and
#: eight ``GPU-<uuid>`` entries of ``CUDA_VISIBLE_DEVICES``.
GPU_RECORD_BYTES = 2048


def pack_fields(fields: dict, width: int = GPU_RECORD_BYTES) -> list[int]:
    """``fields`` as JSON bytes, zero-padded to ``width`` (for an allgather of equal shapes).

    A ``cuda_visible_devices`` value too long for ``width`` is cut (and ``truncated`` set), so that
    the record still says what the rank chose.

    Raises:
        ValueError: the record does not fit even then.
    """
    data = json.dumps(fields).encode()
    if len(data) > width and isinstance(fields.get("cuda_visible_devices"), str):
        fields = {**fields, "cuda_visible_devices": fields["cuda_visible_devices"][:256],
                  "truncated": True}
        data = json.dumps(fields).encode()
    if len(data) > width:
        raise ValueError(f"record of {len(data)} bytes exceeds {width}")
    return list(data) + [0] * (width - len(data))


def unpack_fields(values: Sequence[float]) -> dict:
    """The dict :func:`pack_fields` packed (trailing zeros dropped)."""
    return json.loads(bytes(int(v) for v in values).rstrip(b"\0").decode())


def gpu_problem_lines(records: Sequence[dict]) -> list[str]:
    """One line per rank whose ``gpu`` record holds a problem (no GPU of its own)."""
    return [f"rank {r['rank']} on {r['host']}: {r['problem']}" for r in records if r.get("problem")]


class Report:
    """JSON lines (one object per record) and a stderr summary, written by rank 0 only.

    Args:
        enabled: True on rank 0.
        path: JSON-lines file to write (truncated), or None for stdout.
    """

    def __init__(self, enabled: bool, path: Optional[str]) -> None:
        self.enabled = enabled
        self.stream: Optional[TextIO] = None
        if enabled:
            self.stream = open(path, "w", encoding="utf-8") if path else sys.stdout

    def record(self, kind: str, **fields) -> None:
        """Write ``{"record": kind, **fields}`` as one line."""
        if self.enabled:
            self.stream.write(json.dumps({"record": kind, **fields}, sort_keys=False) + "\n")
            self.stream.flush()

    def say(self, text: str) -> None:
        """One line of the human-readable summary on stderr."""
        if self.enabled:
            print(f"{PROGRAM}: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Close the ``--output`` file (stdout stays open)."""
        if self.stream is not None and self.stream is not sys.stdout:
            self.stream.close()
