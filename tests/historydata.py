"""Synthetic validation reports and samples for the history, verdict and status tests: the
report as ``hpcstack validate --json`` prints it, with the runs, figures, references and
failures the judge writes."""

from __future__ import annotations

import random

FP = {"gpu.model": "NVIDIA A100-SXM4-40GB", "gpu.driver": "535.104.05", "cuda.driver": "12.2",
      "nccl.version": None, "nccl.net_plugin": None, "mpi": "mpirun (Open MPI) 4.1.5",
      "slurm": "slurm 23.02.7", "kernel": "5.14.0-362.el9.x86_64", "os": "Rocky Linux 9.3 (Blue Onyx)",
      "python": "3.11.7", "modules": "python/3.11:pytorch/2.3.1-gpu", "nodes": "gpu[01-02]",
      "stack.build": "0123456789ab"}


def report(ok: bool = True, value: float = 1000.0, failures: list | None = None, jobs_state: str = "COMPLETED",
           generated: str = "2026-01-01T00:00:00+00:00") -> dict:
    """A report with one horovod run on 2 nodes and its throughput reference (1000 img/s, -10 %)."""
    return {"ok": ok, "site": "testsite", "system": "testsite:gpu", "recipe": "pytorch/2.3.1-gpu",
            "generated": generated, "settings": {"model": "resnet50"},
            "jobs": [{"job_id": "11", "nodes": 2, "state": jobs_state, "exit_code": "0:0", "reason": None}],
            "runs": [{"backend": "horovod", "nodes": 2, "ok": ok, "sanity": [],
                      "figures": {"throughput_total": {"value": value, "unit": "img/s", "ok": ok,
                                                       "reference": [1000.0, -0.1, None, "img/s"],
                                                       "bounds": [900.0, None]}},
                      "startup": {"ranks": 2, "first_step_s": {"median": 10.0, "max": 11.0}}}],
            "scaling": {}, "failures": failures or []}


def sample(mean: float, rounds: int = 20, noise: float = 0.02, seed: int = 0, startup: float = 10.0) -> dict:
    """Per-round throughput around ``mean`` (relative noise ``noise``, uniform) for horovod:2."""
    rng = random.Random(seed)
    return {"horovod:2": {"throughput_total": [mean * (1 + rng.uniform(-noise, noise)) for _ in range(rounds)],
                          "unit": "img/s",
                          "startup_s": [startup * (1 + rng.uniform(-0.05, 0.05)) for _ in range(4)]}}


def day(n: int) -> str:
    """``2026-01-<n>`` at noon UTC, ISO 8601."""
    return f"2026-01-{n:02d}T12:00:00+00:00"
