#!/usr/bin/env python3
"""The validation program of the mpi4py stack: mpi4py's own benchmarks as JSON-lines figures.

Every rank runs, in one process, the commands of ``python -m mpi4py.bench`` (the functions its
``main`` dispatches to, with their output): ``helloworld`` (each rank must say "I am process R
of N"), ``ringtest`` (a message around the ring of ranks) and ``pingpong`` between ranks 0 and 1
(on one rank: to itself). Rank 0 writes JSON lines to ``--output``:

    {"record": "config", "backend", "transport", "world_size", "versions"}
    {"record": "helloworld", "ok", "ranks"}
    {"record": "ringtest", "bytes", "loops", "time_per_loop_us"}
    {"record": "pingpong", "latency_us", "latency_bytes", "bandwidth_mb_s", "bandwidth_bytes"}
    {"record": "startup", "rank", "imports_s", "first_step_s", "unit"}   (one per rank)
    {"record": "result", "ok", "reasons"}

Start-up: seconds from the process start (/proc/self/stat) to ``from mpi4py import MPI`` done
(MPI initialised) and to the end of helloworld (the first measured step). Exit status 0 when
every check passed, 1 otherwise.
"""

import argparse
import json
import os
import sys
import time


def process_start_time():
    """Seconds since the epoch when this process started (proc(5)); now where /proc lacks it."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


STARTED = process_start_time()

import mpi4py  # noqa: E402
from mpi4py import MPI, bench  # noqa: E402

IMPORTED = time.time()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mpi4py-validate", description=__doc__.split("\n")[0])
    parser.add_argument("--output", required=True, help="JSON-lines file rank 0 writes")
    parser.add_argument("--ring-bytes", type=int, default=1, help="ringtest message size (bytes)")
    parser.add_argument("--ring-loops", type=int, default=1000, help="ringtest iterations")
    parser.add_argument("--pingpong-loops", type=int, default=1000, help="pingpong iterations per size")
    parser.add_argument("--pingpong-max-bytes", type=int, default=1 << 22, help="largest pingpong message")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    records, reasons = [], []

    def record(kind, **fields):
        records.append({"record": kind, **fields})

    library = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
    record("config", backend="mpi", transport=library, world_size=size,
           versions={"python": sys.version.split()[0], "mpi4py": mpi4py.__version__,
                     "mpi": "%d.%d" % MPI.Get_version()})

    message = bench.helloworld(comm, [])                      # python -m mpi4py.bench helloworld
    first_step = time.time()
    messages = comm.gather(message, root=0)
    if rank == 0:
        wrong = [r for r, m in enumerate(messages) if f"I am process {r:{len(str(size - 1))}d} of {size} " not in m]
        record("helloworld", ok=not wrong, ranks=size)
        reasons += [f"helloworld: rank {r} said {messages[r].strip()!r}" for r in wrong]

    loops = args.ring_loops
    elapsed = bench.ringtest(comm, ["-n", str(args.ring_bytes), "-l", str(loops), "-s", str(max(1, loops // 10))])
    record("ringtest", bytes=args.ring_bytes, loops=loops, time_per_loop_us=1e6 * elapsed / loops)

    result = bench.pingpong(comm, ["-a", "none", "-m", "1", "-n", str(args.pingpong_max_bytes),
                                   "-l", str(args.pingpong_loops), "-s", str(max(1, args.pingpong_loops // 10)),
                                   "--loop-large", str(max(10, args.pingpong_loops // 10)),
                                   "--loop-huge", str(max(10, args.pingpong_loops // 100))])
    (small, t_small, _), (large, t_large, _) = result[0], result[-1]
    record("pingpong", latency_us=1e6 * t_small, latency_bytes=small,
           bandwidth_mb_s=large / t_large / 1e6, bandwidth_bytes=large)

    times = comm.gather((IMPORTED - STARTED, first_step - STARTED), root=0)
    if rank == 0:
        for r, (imports, first) in enumerate(times):
            record("startup", rank=r, imports_s=imports, first_step_s=first, unit="s")
        record("result", ok=not reasons, reasons=reasons)
        with open(args.output, "w") as f:
            f.writelines(json.dumps(rec) + "\n" for rec in records)
        print("mpi4py-validate: " + ("OK" if not reasons else "FAILED: " + "; ".join(reasons)), file=sys.stderr)
    return 1 if comm.bcast(bool(reasons), root=0) else 0


if __name__ == "__main__":
    sys.exit(main())
