"""The collectives check: every collective the backend offers, on its training device, against
exact results (the rules are in :mod:`.collective_cases`).

Allreduce sum/average/min/max, a fused batch of small allreduces, allgather of equal and unequal
sizes, broadcast from the last rank, alltoall with unequal splits, reducescatter; float32/16,
bfloat16, float64, int32/64; 1 to 2^20 + 1 elements. Tensors are torch tensors (int64 patterns on
the host, cast to each dtype and moved to the device).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Optional, Sequence

import torch

from . import PROGRAM
from .collective_cases import (CHECK_DTYPES, CHECK_SIZES, COLLECTIVES, DATA_MAX, EXACT_LIMIT, FUSED_COUNT,
                               FUSED_SPAN, GATHER_MAX_ELEMENTS, INJECT_AT, MESSAGE_BYTES, alltoall_splits,
                               mismatch_message, reducescatter_rows, reduction_amplitudes, size_key)
from .timing import synchronize

if TYPE_CHECKING:
    from .backends import Comm


def exact_pattern(count: int, stream: int, amplitude: int, offset: int = 0) -> torch.Tensor:
    """Reproducible non-zero integers in ``[-amplitude, -1] U [1, amplitude]`` (int64, host).

    Element i is a multiplicative hash of ``(offset + i, stream)``, so neighbouring elements,
    chunks and streams (ranks) differ and a slice ``[offset, offset + count)`` costs only its
    length. Results are cached (treat them as read-only).

    Args:
        count (int): elements.
        stream (int): which sequence (0 <= stream < 2^20), e.g. a rank.
        amplitude (int): largest |value|, >= 1.
        offset (int): index of the first element in the sequence.

    Returns:
        torch.Tensor: 1-D int64 tensor of ``count`` elements.

    Example:
        >>> exact_pattern(4, 0, 1).abs().tolist()
        [1, 1, 1, 1]
    """
    key = (count, stream, amplitude, offset)
    if key not in _PATTERNS:
        if len(_PATTERNS) >= PATTERN_CACHE:
            _PATTERNS.pop(next(iter(_PATTERNS)))
        _PATTERNS[key] = _hashed_pattern(count, stream, amplitude, offset)
    return _PATTERNS[key]


#: exact_pattern's results, oldest first: every dtype of a check uses the same patterns.
_PATTERNS: dict[tuple[int, int, int, int], torch.Tensor] = {}
PATTERN_CACHE = 64


def _hashed_pattern(count: int, stream: int, amplitude: int, offset: int) -> torch.Tensor:
    """exact_pattern without its cache: a multiplicative hash of index and stream."""
    index = torch.arange(offset, offset + count, dtype=torch.int64)
    key = (index * 65537 + stream * 7919 + 12345) % (1 << 31)
    hashed = (key * 2654435761) % (1 << 32) >> 7
    value = hashed % (2 * amplitude) - amplitude
    return value + (value >= 0).to(torch.int64)


def reduction_input(rank: int, world_size: int, count: int, base: int, spread: int,
                    offset: int = 0) -> torch.Tensor:
    """Rank ``rank``'s contribution ``x(r, i) = a(i) + c(i) (2r - N + 1)`` (int64, host)."""
    a = exact_pattern(count, 0, base, offset)
    c = spread * (exact_pattern(count, 1, 1, offset) > 0).to(torch.int64)
    return a + c * (2 * rank - world_size + 1)


def reduction_expected(op: str, world_size: int, count: int, base: int, spread: int,
                       offset: int = 0) -> torch.Tensor:
    """The exact reduction over all ranks of reduction_input, in closed form (int64, host).

    Args:
        op (str): ``sum`` (N a), ``average`` (a), ``min`` (a - c (N-1)), ``max`` (a + c (N-1)).
        world_size, count, base, spread, offset: as for reduction_input.

    Raises:
        ValueError: unknown op.
    """
    a = exact_pattern(count, 0, base, offset)
    c = spread * (exact_pattern(count, 1, 1, offset) > 0).to(torch.int64)
    if op == "sum":
        return a * world_size
    if op == "average":
        return a
    if op == "min":
        return a - c * (world_size - 1)
    if op == "max":
        return a + c * (world_size - 1)
    raise ValueError(f"unknown reduction {op!r}")


def first_mismatch(got: torch.Tensor, want: torch.Tensor, tolerance: float = 0.0
                   ) -> Optional[tuple[int, int, float, float]]:
    """``(wrong elements, first wrong index, got, want)``, or None when ``got`` equals ``want``.

    Args:
        got (torch.Tensor): the collective's result (any device; compared on the host).
        want (torch.Tensor): the exact result, same dtype.
        tolerance (float): allowed absolute difference (0: exact; NaN is always wrong).

    Returns:
        tuple | None: a shape mismatch reports index -1 with the element counts as got/want.
    """
    got = got.detach().reshape(-1).cpu()
    want = want.reshape(-1)
    if got.numel() != want.numel():
        return (max(got.numel(), want.numel()), -1, float(got.numel()), float(want.numel()))
    if tolerance:
        wrong = ~((got.double() - want.double()).abs() <= tolerance)
    else:
        wrong = got != want
    count = int(wrong.sum())
    if not count:
        return None
    index = int(wrong.nonzero()[0, 0])
    return count, index, float(got[index]), float(want[index])


class CollectivesCheck:
    """Run every collective of COLLECTIVES x CHECK_DTYPES x CHECK_SIZES the backend offers on
    its training device and compare each rank's result with the exact one.

    Results are exact, except for a float Average on a world size that is not a power of two,
    where a backend may scale each input by 1/N (NCCL does): it may differ by N ulps of the
    largest input.

    Args:
        comm (Comm): the initialised backend.
        inject (bool): testing aid: the last rank's result of INJECT_AT gets +1 in its last
            element (before the comparison).
        sizes (Sequence[int]): element counts to check.

    Example:
        ``CollectivesCheck(comm).run()`` -> the fields of the ``collectives`` record.
    """

    def __init__(self, comm: Comm, inject: bool = False,
                 sizes: Sequence[int] = CHECK_SIZES) -> None:
        self.comm = comm
        self.inject = inject
        self.sizes = tuple(sizes)
        self.failures: list[str] = []
        self.checked: list[tuple[str, str, str]] = []
        self.skipped: dict[tuple[str, str], str] = {}

    # -- one comparison --------------------------------------------------------------------

    def _compare(self, collective: str, dtype: torch.dtype, size, got: torch.Tensor,
                 want: torch.Tensor, tolerance: float = 0.0) -> None:
        comm = self.comm
        name = str(dtype).replace("torch.", "")
        if (self.inject and comm.rank == comm.size - 1 and (collective, name, size) == INJECT_AT):
            got = got.clone()
            got.view(-1)[-1] += 1
        self.checked.append((collective, name, str(size)))
        found = first_mismatch(got, want.to(dtype), tolerance)
        if found:
            self.failures.append(mismatch_message(comm.name, collective, name, size, comm.rank,
                                                  found))

    def _put(self, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return values.to(dtype).to(self.comm.device)

    # -- the collectives -------------------------------------------------------------------

    def _allreduce(self, op: str, dtype: torch.dtype, fused: bool) -> None:
        comm, n = self.comm, self.comm.size
        base, spread = reduction_amplitudes(n, EXACT_LIMIT[_dtype_name(dtype)])
        if fused:
            shapes = [(1 + (37 * k) % FUSED_SPAN, k * FUSED_SPAN) for k in range(FUSED_COUNT)]
            size = f"{FUSED_COUNT}x1..{FUSED_SPAN}"
        else:
            shapes = [(count, 0) for count in self.sizes]
        inputs = [self._put(reduction_input(comm.rank, n, count, base, spread, offset), dtype)
                  for count, offset in shapes]
        tolerance = 0.0
        if op == "average" and dtype.is_floating_point and n & (n - 1):
            tolerance = n * torch.finfo(dtype).eps * (base + spread * (n - 1))
        collective = "allreduce_fused_" + op if fused else "allreduce_" + op
        if fused:
            results = comm.c_allreduce(inputs, op, f"check.{collective}.{dtype}")
            got = torch.cat([r.reshape(-1) for r in results])
            want = torch.cat([reduction_expected(op, n, count, base, spread, offset)
                              for count, offset in shapes])
            self._compare(collective, dtype, size, got, want, tolerance)
            return
        for (count, _), tensor in zip(shapes, inputs):
            got = comm.c_allreduce([tensor], op, f"check.{collective}.{dtype}.{count}")[0]
            self._compare(collective, dtype, count, got,
                          reduction_expected(op, n, count, base, spread), tolerance)

    def _allgather(self, dtype: torch.dtype, equal: bool) -> None:
        comm, n = self.comm, self.comm.size
        collective = "allgather_equal" if equal else "allgather_unequal"
        for size in self._gather_sizes():
            counts = [size if equal else size + (r % 3) for r in range(n)]
            tensor = self._put(exact_pattern(counts[comm.rank], comm.rank, DATA_MAX), dtype)
            got = comm.c_allgather(tensor, counts, f"check.{collective}.{dtype}.{size}")
            want = torch.cat([exact_pattern(counts[r], r, DATA_MAX) for r in range(n)])
            self._compare(collective, dtype, size, got, want)

    def _broadcast(self, dtype: torch.dtype) -> None:
        comm = self.comm
        root = comm.size - 1  # non-zero whenever there are two ranks or more
        for size in self.sizes:
            tensor = self._put(exact_pattern(size, comm.rank, DATA_MAX), dtype)
            got = comm.c_broadcast(tensor, root, f"check.broadcast.{dtype}.{size}")
            self._compare("broadcast", dtype, size, got, exact_pattern(size, root, DATA_MAX))

    def _alltoall(self, dtype: torch.dtype) -> None:
        comm, n = self.comm, self.comm.size

        def chunk(sender: int, receiver: int, size: int) -> torch.Tensor:
            return exact_pattern(alltoall_splits(size, n, sender)[receiver],
                                 sender * n + receiver, DATA_MAX)

        for size in self._gather_sizes():
            send = alltoall_splits(size, n, comm.rank)
            receive = [alltoall_splits(size, n, r)[comm.rank] for r in range(n)]
            tensor = self._put(torch.cat([chunk(comm.rank, j, size) for j in range(n)]), dtype)
            got = comm.c_alltoall(tensor, send, receive, f"check.alltoall.{dtype}.{size}")
            want = torch.cat([chunk(r, comm.rank, size) for r in range(n)])
            self._compare("alltoall", dtype, size, got, want)

    def _reducescatter(self, op: str, dtype: torch.dtype) -> None:
        comm, n = self.comm, self.comm.size
        base, spread = reduction_amplitudes(n, EXACT_LIMIT[_dtype_name(dtype)])
        tolerance = 0.0
        if op == "average" and dtype.is_floating_point and n & (n - 1):
            tolerance = n * torch.finfo(dtype).eps * (base + spread * (n - 1))
        for size in self._gather_sizes():
            rows = -(-size // n) * n if comm.equal_reducescatter else max(size, n)
            tensor = self._put(reduction_input(comm.rank, n, rows, base, spread), dtype)
            got = comm.c_reducescatter(tensor, op, f"check.reducescatter_{op}.{dtype}.{size}")
            first, count = reducescatter_rows(rows, n, comm.rank)
            want = reduction_expected(op, n, count, base, spread, offset=first)
            self._compare("reducescatter_" + op, dtype, size, got, want, tolerance)

    def _gather_sizes(self) -> list[int]:
        return [size for size in self.sizes if size * self.comm.size <= GATHER_MAX_ELEMENTS]

    # -- driver ----------------------------------------------------------------------------

    def run(self) -> dict:
        """Run every check; gather every rank's failures to every rank.

        Returns:
            dict: the fields of the ``collectives`` record: ``ok``, ``checks`` (op x dtype x
            size combinations compared on each rank), ``ops``, ``dtypes``, ``sizes`` (those
            checked), ``skipped`` (``{"op", "dtype", "reason"}`` for each op the backend lacks),
            ``failures`` (one message per failing rank: its first mismatch), ``failed_checks``
            (over all ranks), ``device`` and ``seconds``.
        """
        comm = self.comm
        started = time.perf_counter()
        for dtype_name in CHECK_DTYPES:
            dtype = getattr(torch, dtype_name)
            for collective in COLLECTIVES:
                reason = comm.lacks(collective, dtype)
                if reason is None and collective.startswith(("allreduce", "reducescatter")) \
                        and reduction_amplitudes(comm.size, EXACT_LIMIT[dtype_name]) is None:
                    reason = f"{comm.size} ranks: sums of {dtype_name} cannot stay exact"
                if reason:
                    self.skipped[(collective, dtype_name)] = reason
                    continue
                kind, _, op = collective.partition("_")
                if kind == "allreduce":
                    fused = op.startswith("fused_")
                    self._allreduce(op.replace("fused_", ""), dtype, fused)
                elif kind == "allgather":
                    self._allgather(dtype, equal=op == "equal")
                elif kind == "broadcast":
                    self._broadcast(dtype)
                elif kind == "alltoall":
                    self._alltoall(dtype)
                else:
                    self._reducescatter(op, dtype)
            comm.c_settle()
        synchronize(comm.device)
        _PATTERNS.clear()
        seconds = time.perf_counter() - started
        for message in self.failures[:20]:
            print(f"{PROGRAM}: rank {comm.rank}: collective mismatch: {message}",
                  file=sys.stderr, flush=True)
        first = (self.failures[0] if self.failures else "").encode()[:MESSAGE_BYTES]
        encoded = torch.zeros(MESSAGE_BYTES + 1, dtype=torch.int64)
        encoded[0] = len(self.failures)
        encoded[1:1 + len(first)] = torch.tensor(list(first), dtype=torch.int64)
        gathered = comm.allgather(encoded, "check.failures")
        failures = [bytes(row[1:].tolist()).rstrip(b"\0").decode(errors="replace")
                    for row in gathered if int(row[0])]
        seconds_all = comm.allgather(torch.tensor([seconds], dtype=torch.float64),
                                     "check.seconds")
        return {
            "backend": comm.name,
            "device": comm.device.type,
            "ok": not failures,
            "checks": len(self.checked),
            "ops": sorted({c for c, _, _ in self.checked}, key=COLLECTIVES.index),
            "dtypes": [d for d in CHECK_DTYPES if any(x == d for _, x, _ in self.checked)],
            "sizes": sorted({s for _, _, s in self.checked}, key=size_key),
            "skipped": [{"op": c, "dtype": d, "reason": r} for (c, d), r in self.skipped.items()],
            "failures": failures,
            "failed_checks": int(sum(int(row[0]) for row in gathered)),
            "seconds": float(seconds_all.max()),
        }


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).replace("torch.", "")
