"""Clocks of the trainer: this rank's start-up points, the mean and spread of a rate, and the
device synchronisation before a clock reading. No torch at import (tests run it without).

Times are seconds: points since the epoch (``time.time()``), durations from ``time.perf_counter()``.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Mapping, Optional, Sequence


def process_start_time() -> float:
    """This process's start, in seconds since the epoch: field 22 of ``/proc/self/stat`` (clock
    ticks after boot) plus the boot time (``btime`` of ``/proc/stat``); the time of this call
    where ``/proc`` has neither (proc(5))."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


#: Start-up points of this rank, seconds since the epoch: set as the run gets there.
STARTUP = {"process_start": process_start_time(), "imports_done": None, "first_step": None}


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 1.96 x population standard deviation, as Horovod's benchmark reports them.

    (``np.mean`` and ``1.96 * np.std`` in pytorch_synthetic_benchmark.py v0.28.1.)
    """
    return statistics.fmean(values), 1.96 * statistics.pstdev(values)


#: The start-up points after the process start, in the order of the ``startup`` record.
STARTUP_POINTS = ("imports_done", "first_step")


def startup_seconds(startup: Mapping[str, Optional[float]] = STARTUP) -> list[float]:
    """Seconds from the process start to each of :data:`STARTUP_POINTS`, -1.0 for a point not
    reached (a float list, so that the ranks can gather it as one tensor).

    Args:
        startup (Mapping[str, float | None]): ``process_start`` and the points, seconds since the
            epoch (default :data:`STARTUP`).

    Returns:
        list[float]: ``[imports_s, first_step_s]``.

    Example:
        >>> startup_seconds({"process_start": 10.0, "imports_done": 12.5, "first_step": None})
        [2.5, -1.0]
    """
    start = startup["process_start"]
    return [(startup[key] - start) if startup[key] is not None else -1.0 for key in STARTUP_POINTS]


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (a ``torch.device``) when it is a GPU, so that a
    clock reading after it counts that work; nothing on a CPU."""
    if device.type == "cuda":
        import torch
        torch.cuda.synchronize(device)
