"""What the collectives check covers and how its exact results are built, without torch.

Every rank fills its tensors with small integers, computes the exact result of the collective
in closed form (int64 on the host, then cast: every value is exactly representable in every
dtype checked) and compares element by element. Reductions use
    x(r, i) = a(i) + c(i) * (2r - N + 1),   a(i) != 0, c(i) in {0, spread}
on rank r of N, so that sum = N a, average = a, min = a - c (N - 1), max = a + c (N - 1) exactly,
and every partial sum stays within the dtype's exact integers (see reduction_amplitudes).
Motivation: a Horovod build whose float32 CUDA Average returned 0 in the last element of 4,913
while training still converged: training alone does not see a collective that is wrong now and then.

This module holds the ops, dtypes and sizes checked, the amplitudes and partitions, and the
message of a mismatch; :mod:`.collectives` runs the check with torch.
"""

from __future__ import annotations

import math
from typing import Optional

REDUCE_OPS = ("sum", "average", "min", "max")
#: The collectives checked, in order. ``allreduce_fused_*`` is a batch of many small allreduces
#: in flight at once (Horovod fuses them into one buffer).
COLLECTIVES = (tuple(f"allreduce_{op}" for op in REDUCE_OPS)
               + ("allreduce_fused_sum", "allreduce_fused_average", "allgather_equal",
                  "allgather_unequal", "broadcast", "alltoall", "reducescatter_sum",
                  "reducescatter_average"))
CHECK_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64")
#: Largest |n| such that every integer up to it is exact: 2^(significand bits) for floats.
EXACT_LIMIT = {"float32": 2 ** 24, "float16": 2 ** 11, "bfloat16": 2 ** 8, "float64": 2 ** 53,
               "int32": 2 ** 31 - 1, "int64": 2 ** 63 - 1}
#: Element counts: 1, odd, primes, just below/above 2^10 and 2^16, 17^3 (the size of that wrong
#: Average), and 2^20 + 1 (4 MiB in float32).
CHECK_SIZES = (1, 17, 1023, 1025, 4913, 65521, 65537, 1048577)
#: Largest |a(i)| of a reduction and |value| of the other collectives.
BASE_MAX = 16
DATA_MAX = 120
#: The fused batch: FUSED_COUNT tensors of 1 + (37 k mod FUSED_SPAN) elements.
FUSED_COUNT = 64
FUSED_SPAN = 257
#: allgather and alltoall results grow with the world size: they use the sizes for which
#: world size x size stays below this many elements.
GATHER_MAX_ELEMENTS = 1 << 23
#: --inject-collective-mismatch: the last rank's result of this check gets one wrong element.
INJECT_AT = ("allreduce_sum", "float32", 4913)


def reduction_amplitudes(world_size: int, limit: int) -> Optional[tuple[int, int]]:
    """``(base, spread)`` of the reduction pattern for ``world_size`` ranks and a dtype.

    Every |x(r, i)| <= base + spread (N - 1), so every partial sum of N of them stays within
    ``limit`` (``N (base + spread (N - 1)) <= limit``) and is exact in the dtype. spread is 1
    (rank-dependent values) when ``N^2 <= limit``, else 0.

    Args:
        world_size (int): N >= 1.
        limit (int): the dtype's exact-integer limit (EXACT_LIMIT).

    Returns:
        tuple[int, int] | None: None when not even base 1 fits (N > limit): the dtype cannot be
        reduced exactly on so many ranks.

    Example:
        >>> reduction_amplitudes(2, 2 ** 8), reduction_amplitudes(16, 2 ** 8)
        ((16, 1), (1, 1))
    """
    spread = 1 if world_size * world_size <= limit else 0
    base = min(BASE_MAX, limit // world_size - spread * (world_size - 1))
    return (base, spread) if base >= 1 else None


def reducescatter_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(first row, row count)`` of ``rank``'s part of a reducescatter over ``rows`` rows.

    Horovod 0.28.1 gives each rank ``rows // N`` rows and the first ``rows % N`` ranks one more
    (torch's reduce_scatter_tensor needs ``rows % N == 0``, which this also covers).
    """
    share, extra = divmod(rows, world_size)
    first = rank * share + min(rank, extra)
    return first, share + (1 if rank < extra else 0)


def alltoall_splits(count: int, world_size: int, sender: int) -> list[int]:
    """Elements ``sender`` sends to each rank: ``count // N + (sender + 2 j) mod 3`` to rank j.

    Unequal (and for count < N, zero-length) chunks exercise the split bookkeeping.
    """
    return [count // world_size + (sender + 2 * j) % 3 for j in range(world_size)]


def _number(value: float) -> str:
    """``value`` as an integer where it is one (``3``), else its repr (``2.5``, ``nan``)."""
    return str(int(value)) if math.isfinite(value) and value == int(value) else repr(value)


def mismatch_message(backend: str, collective: str, dtype: str, size, rank: int,
                     found: tuple[int, int, float, float]) -> str:
    """One line naming backend, op, dtype, size, rank and the first wrong index with got/want.

    Example:
        >>> mismatch_message("horovod", "allreduce_sum", "float32", 4913, 1, (1, 4912, 3.0, 2.0))
        'horovod allreduce_sum float32 size 4913 on rank 1: element 4912 is 3, want 2 (1 of 4913 elements wrong)'
    """
    count, index, got, want = found
    where = f"{backend} {collective} {dtype} size {size} on rank {rank}"
    if index < 0:
        return f"{where}: {int(got)} elements, want {int(want)}"
    total = size if isinstance(size, int) else "?"
    return (f"{where}: element {index} is {_number(got)}, want {_number(want)} "
            f"({count} of {total} elements wrong)")


#: Bytes of a failure message gathered from each rank.
MESSAGE_BYTES = 400


def size_key(size: str) -> tuple[int, str]:
    """Sort key of a checked size: numbers in order (``"17"`` < ``"1023"``), then named batches
    such as ``"64x1..257"`` (the fused allreduce)."""
    return (int(size), "") if size.isdigit() else (1 << 62, size)
