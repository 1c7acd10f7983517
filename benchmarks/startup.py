#!/usr/bin/env python3
"""Start-up of many ranks at once from a stack on a network file system, on the local Slurm.

Every rank of a job imports thousands of files at the same moment (an "import storm"); on a
parallel file system each ``stat``/``open``/``readlink`` that misses the node's cache is a round
trip to the metadata server. This benchmark serves an installed stack to the two nodes of
``scripts/localhost-slurm`` (n1, n2: network namespaces) over a real network file system and
counts, at the server, the requests that reach it.

The file system: SFTP, read by ``sshfs`` on each node. ``sshfs -o directport=PORT`` speaks plain
SFTP to a TCP port (no ssh, no encryption). On the host this script listens on that port
(``10.77.0.1``, the bridge of the local cluster) and, for each connection, starts
``/usr/lib/openssh/sftp-server`` on pipes: between the two it parses the SFTP packets, counts the
requests by type (STAT, LSTAT, FSTAT, OPEN, OPENDIR, READDIR, READLINK, REALPATH apart from READ,
the data reads, whose bytes are counted too) and delays every packet by ``--latency`` ms in each
direction (the kernel here has no ``netem``, so the delay is added in this relay; it keeps the
packets' order and overlaps their delays, as a link does). The relay uses threads and
``time.sleep`` (``clock_nanosleep``): an asyncio loop rounds its timers to whole milliseconds
(``epoll_wait``), too coarse for 0.2 ms.

Each node, in one Slurm job step (``srun``, one task per node), makes a mount namespace of its own
(``unshare -m --propagation private``), mounts there, starts its ranks and unmounts:

- ``local``: no mount; the stack on the node's own disk (the installed stack, page cache warm);
- ``directory``: the server's ``/opt/hpcstack/software`` mounted by sshfs at the same path;
- ``squashfs``: a ``layout: squashfs`` software tree (the build directory with ``venv.sqsh``,
  packed with the options of the install's ``image`` step, :func:`hpcstack.install.image.pack_argv`)
  mounted by sshfs at ``/opt/hpcstack/software``, then the image mounted at the build's venv with
  the command ``hpcstack mount`` runs (:func:`hpcstack.install.image.mount_argv`): squashfuse
  reads the image over sshfs; the lookups inside it are answered on the node;
- ``loop``: as ``squashfs``, but the kernel's squashfs on a loop device over the image on sshfs
  (as CSCS's squashfs-mount does) instead of squashfuse;
- ``prefetch``: as ``squashfs``, after ``dd bs=16M`` has read the whole image over sshfs into
  the node's page cache (``kernel_cache`` keeps it);
- ``staged``: what ``hpcstack mount --stage DIR`` does (:func:`hpcstack.install.image.mount_build`
  with ``stage``): the image copied in 16 MiB reads into a node-local tmpfs (mounted in the
  node's namespace, :data:`STAGE_SIZE`) and the copy mounted by the kernel's squashfs on a loop
  device;
- ``unpacked``: what ``hpcstack mount --stage DIR --unpack`` does: the image read whole in 16 MiB
  reads (the page cache keeps it), unpacked by ``unsquashfs`` into the node-local tmpfs and the
  tree bound read-only at the venv.

The mounts (and the staging in them) run before the ranks start and are timed apart
(``mount_s_by_node``, "mount s" in the table): a site runs them once per node in a job prolog.
As Slurm starts a job only when the prolog is done on all its nodes, every node waits until all
nodes have mounted before it starts its ranks (a file per node in the results directory).

sshfs options (:data:`SSHFS_OPTIONS`): read-only, ``no_contain_symlinks`` (a venv's ``bin/python``
is an absolute link to the base Python), ``kernel_cache`` (a read-only stack's pages stay cached
across opens on the node), and sshfs's own caches at their defaults: directory/attribute cache on
(``dir_cache=yes``, ``dcache_timeout=20`` s), the kernel's entry and attribute timeouts 1 s,
negative lookups not cached. One sshfs connection per node. The server's page cache is warm (the
files were read before); each node's cache starts empty (a fresh mount per run).

Ranks: N = 1 (on n1), 2, 4, 8 (half on each node). Each rank runs the stack's ``venv/bin/python``
with :data:`RANK_PROGRAM`: ``import torch, horovod.torch, torchvision``, initialise the process
group (``torch.distributed``, gloo, rendezvous on n1 by TCP), one training step of a small model
with its gradients all-reduced, then a JSON line. Start-up is the seconds from the node's launch
of its ranks (after its mounts) to the end of the rank's first step. This machine has 2 cores:
above 2 ranks start-up is bound by the CPU (the ranks share the cores), not by the file system.

``--rounds N`` repeats the matrix with the layouts alternating within each round and prints the
medians over the rounds (the machine's load changes from minute to minute). Prints a table and, with ``--json FILE``, writes every run (per rank times, the server's counts
per node). Needs root (mount namespaces, FUSE), the local Slurm up (``scripts/localhost-slurm
up``), ``sshfs``, ``squashfuse``, ``mksquashfs`` and ``/usr/lib/openssh/sftp-server``
(apt: sshfs squashfuse squashfs-tools openssh-sftp-server). The full matrix takes 20–40 minutes
on a loaded 2-core machine: most of it the data of ``import torch`` (about 1 GB of shared
libraries) through the relay.

``--report FILE`` prints the table and summary of a kept ``--json`` file again (a stopped run's
file too: it holds every run that finished), and ``--model`` the arithmetic of many nodes
starting at once from counts given on the command line (:func:`model`); neither runs anything
nor needs root.

Usage:
    python3 benchmarks/startup.py [--stack /opt/hpcstack/software/pytorch/2.3.1-gpu]
        [--work /var/tmp/h-startup] [--ranks 1,2,4,8] [--layouts local,directory,squashfs]
        [--latency 0.2,1] [--rounds 3] [--json FILE]
    python3 benchmarks/startup.py --report FILE.json
    python3 benchmarks/startup.py --model --model-requests directory=24626,squashfs=98
        [--model-mb staged=4029] [--model-bandwidth 100,1000] [--model-nodes 2,100,1000]
        [--model-rate 500000]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/stats.py
from hpcstack.install import image as stack_image  # noqa: E402

DEFAULT_STACK = "/opt/hpcstack/software/pytorch/2.3.1-gpu"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
HOST_ADDR = "10.77.0.1"  # the bridge of scripts/localhost-slurm
NODE_ADDR = {"n1": "10.77.0.11", "n2": "10.77.0.12"}
SSHFS_OPTIONS = "ro,allow_other,no_contain_symlinks,kernel_cache"
LAYOUTS = ("local", "directory", "squashfs", "loop", "prefetch", "staged", "unpacked")
#: the node-local tmpfs a ``staged`` node copies the image into (mounted in its own namespace)
STAGE_SIZE = "8g"
#: SFTP packet types (draft-ietf-secsh-filexfer-02, the version OpenSSH speaks)
SFTP_TYPES = {1: "INIT", 3: "OPEN", 4: "CLOSE", 5: "READ", 6: "WRITE", 7: "LSTAT", 8: "FSTAT",
              9: "SETSTAT", 10: "FSETSTAT", 11: "OPENDIR", 12: "READDIR", 13: "REMOVE", 14: "MKDIR",
              15: "RMDIR", 16: "REALPATH", 17: "STAT", 18: "RENAME", 19: "READLINK", 20: "SYMLINK",
              200: "EXTENDED"}
#: the requests that ask the server about names and attributes (not data)
METADATA = ("STAT", "LSTAT", "FSTAT", "OPEN", "OPENDIR", "READDIR", "READLINK", "REALPATH", "EXTENDED")
SSH_FXP_DATA = 103

RANK_PROGRAM = r'''
import json, os, sys, time
t_start = time.time()
import torch, horovod.torch, torchvision
t_imports = time.time()
import torch.distributed as dist
dist.init_process_group("gloo", init_method=os.environ["BENCH_INIT"],
                        rank=int(os.environ["BENCH_RANK"]), world_size=int(os.environ["BENCH_WORLD"]))
t_group = time.time()
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss = torch.nn.functional.cross_entropy(model(torch.randn(32, 64)), torch.randint(0, 10, (32,)))
loss.backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
opt.step()
t_step = time.time()
t0 = float(os.environ["BENCH_T0"])
record = {"record": "rank", "rank": dist.get_rank(), "node": os.uname().nodename,
          "python_s": round(t_start - t0, 3), "imports_s": round(t_imports - t0, 3),
          "group_s": round(t_group - t0, 3), "startup_s": round(t_step - t0, 3),
          "executable": sys.executable}
with open(os.path.join(os.environ["BENCH_RESULTS"], f"rank-{dist.get_rank()}.json"), "w") as f:
    json.dump(record, f)
dist.destroy_process_group()
'''

NODE_SCRIPT = r'''
set -euo pipefail
node=$(hostname)
per_node=$BENCH_PER_NODE
first=$(( SLURM_NODEID * per_node ))
cleanup() { for m in $BENCH_UNMOUNT; do fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done; }
trap cleanup EXIT
t_mount=$(date +%s.%N)
BENCH_MOUNTS
t_mounted=$(date +%s.%N)
# as Slurm starts a job only once every node's prolog is done: the ranks start when all nodes are ready
touch "$BENCH_RESULTS/ready-$node"
while [ "$(ls "$BENCH_RESULTS" | grep -c '^ready-')" -lt "$SLURM_NNODES" ]; do sleep 0.05; done
export BENCH_T0=$(date +%s.%N)
echo "$t_mount $t_mounted" > "$BENCH_RESULTS/mount-$node.txt"
pids=()
for i in $(seq 0 $(( per_node - 1 ))); do
    BENCH_RANK=$(( first + i )) GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 PYTHONNOUSERSITE=1 \
        "$BENCH_PYTHON" "$BENCH_PROGRAM" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
'''


def log(msg: str) -> None:
    """Print ``msg`` to stderr as a progress line (``[startup] …``)."""
    print(f"[startup] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- the relay

class Counts:
    """Requests per SFTP type and the data bytes, per node (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_node: dict[str, dict[str, int]] = {}

    def add(self, node: str, key: str, n: int = 1) -> None:
        with self.lock:
            d = self.by_node.setdefault(node, {})
            d[key] = d.get(key, 0) + n

    def take(self) -> dict[str, dict[str, int]]:
        """The counts so far, and start again from zero."""
        with self.lock:
            out, self.by_node = self.by_node, {}
        return out


def _packets(buf: bytearray):
    """Split whole SFTP packets (uint32 length, then type) off the front of ``buf``."""
    while len(buf) >= 5:
        (length,) = struct.unpack(">I", buf[:4])
        if len(buf) < 4 + length:
            return
        kind = buf[4]
        del buf[:4 + length]
        yield kind, length


def _pump(src, dst, delay_s: float, count) -> None:
    """Copy ``src`` to ``dst`` (file objects), each chunk held ``delay_s`` after it arrived;
    ``count(chunk)`` sees every chunk. Reading and writing are two threads, so the delays of
    chunks in flight overlap (a link's latency, not a slower link)."""
    q: queue.Queue = queue.Queue()

    def writer() -> None:
        while True:
            due, chunk = q.get()
            if chunk is None:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.write(chunk)
                dst.flush()
            except OSError:
                break
        try:
            dst.close()
        except OSError:
            pass

    w = threading.Thread(target=writer, daemon=True)
    w.start()
    while True:
        try:
            chunk = src.read(1 << 16)
        except (OSError, ValueError):
            chunk = b""
        if not chunk:
            break
        count(chunk)
        q.put((time.monotonic() + delay_s, chunk))
    q.put((0, None))
    w.join()


class SftpRelay:
    """Listen on ``addr:port``; for each connection start ``sftp-server`` and relay the SFTP
    packets both ways, each delayed by ``latency_ms`` and the client's requests counted by type
    (:class:`Counts`, keyed by the node's name from :data:`NODE_ADDR`)."""

    def __init__(self, addr: str, latency_ms: float) -> None:
        self.latency_s = latency_ms / 1000.0
        self.counts = Counts()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.procs: list[subprocess.Popen] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        names = {v: k for k, v in NODE_ADDR.items()}
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            node = names.get(peer[0], peer[0])
            proc = subprocess.Popen([SFTP_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
            self.procs.append(proc)
            up, down = bytearray(), bytearray()

            def count_up(chunk: bytes, node=node, buf=up) -> None:
                buf += chunk
                for kind, _ in _packets(buf):
                    self.counts.add(node, SFTP_TYPES.get(kind, str(kind)))

            def count_down(chunk: bytes, node=node, buf=down) -> None:
                buf += chunk
                for kind, length in _packets(buf):
                    if kind == SSH_FXP_DATA:
                        self.counts.add(node, "READ_bytes", length - 9)

            rfile, wfile = conn.makefile("rb", buffering=0), conn.makefile("wb", buffering=0)
            threading.Thread(target=_pump, args=(rfile, proc.stdin, self.latency_s, count_up), daemon=True).start()
            threading.Thread(target=_pump, args=(proc.stdout, wfile, self.latency_s, count_down),
                             daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()


# ------------------------------------------------------------------------------- one run

def node_mounts(layout: str, port: int, work: Path, build: str) -> tuple[str, list[str]]:
    """The bash lines that mount ``layout`` on a node, and the mount points to unmount after
    (innermost first)."""
    sshfs = ["sshfs", "-o", f"directport={port},{SSHFS_OPTIONS}"]
    if layout == "local":
        return "", []
    if layout == "directory":
        return shlex.join([*sshfs, f"{HOST_ADDR}:/opt/hpcstack/software", "/opt/hpcstack/software"]), \
            ["/opt/hpcstack/software"]
    tree = work / "squashfs-tree" / "software"
    venv, image = stack_image.mount_point_of(build), stack_image.image_of(build)
    lines = [shlex.join([*sshfs, f"{HOST_ADDR}:{tree}", "/opt/hpcstack/software"])]
    unmount = [venv, "/opt/hpcstack/software"]
    if layout == "squashfs":
        lines.append(shlex.join(stack_image.mount_argv(build)))
    elif layout == "loop":  # the kernel's squashfs on a loop device over the image on sshfs
        lines.append(shlex.join(["mount", "-t", "squashfs", "-o", "ro,nodev,nosuid,loop", image, venv]))
    elif layout == "prefetch":  # the image read whole into the node's page cache, then squashfuse
        lines.append(shlex.join(["dd", f"if={image}", "of=/dev/null", "bs=16M", "status=none"]))
        lines.append(shlex.join(stack_image.mount_argv(build)))
    elif layout in ("staged", "unpacked"):  # hpcstack mount --stage [--unpack] into a node-local tmpfs
        stage = str(work / "stage")
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
                f"from hpcstack.install import image; "
                f"image.mount_build({build!r}, stage={stage!r}, unpack={layout == 'unpacked'})")
        lines = [shlex.join(["mount", "-t", "tmpfs", "-o", f"size={STAGE_SIZE},mode=0700", "tmpfs", stage]),
                 lines[0], shlex.join([sys.executable, "-c", code])]
        unmount.append(stage)
    return "\n".join(lines), unmount


def run_once(layout: str, ranks: int, latency_ms: float, stack: str, work: Path, timeout: int) -> dict:
    """One job: ``ranks`` ranks (1 on n1, else half per node) starting from ``layout``.

    Returns:
        dict: ``ranks`` (one record per rank), ``server`` (the relay's counts per node), the
        medians and maxima.

    Raises:
        RuntimeError: the job step failed (its output ends the message).
    """
    build = os.path.realpath(stack)
    if layout not in ("local", "directory"):  # the tree's own build (the installed stack may have been replaced since)
        tree_link = work / "squashfs-tree" / "software" / os.path.relpath(stack, "/opt/hpcstack/software")
        build = os.path.join(os.path.dirname(stack), os.readlink(tree_link))
    relay = SftpRelay(HOST_ADDR, latency_ms) if layout != "local" else None
    try:
        mounts, unmount = node_mounts(layout, relay.port if relay else 0, work, build)
        script = work / "node.sh"
        script.write_text(NODE_SCRIPT.replace("BENCH_MOUNTS", mounts))
        program = work / "rank.py"
        program.write_text(RANK_PROGRAM)
        nodes = 1 if ranks == 1 else 2
        results = work / "results"
        shutil.rmtree(results, ignore_errors=True)
        results.mkdir()
        env = {**os.environ, "BENCH_PER_NODE": str(ranks // nodes), "BENCH_WORLD": str(ranks),
               "BENCH_INIT": f"tcp://{NODE_ADDR['n1']}:{29500 + int(time.time()) % 1000}",
               "BENCH_PYTHON": os.path.join(stack, "venv", "bin", "python"), "BENCH_PROGRAM": str(program), "BENCH_RESULTS": str(results),
               "BENCH_UNMOUNT": " ".join(unmount)}
        argv = ["srun", f"-N{nodes}", "--ntasks-per-node=1", "-w", ",".join(list(NODE_ADDR)[:nodes]),
                "--export=ALL", "--exclusive", "unshare", "-m", "--propagation", "private", "bash", str(script)]
        t0 = time.monotonic()
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.monotonic() - t0
        server = relay.counts.take() if relay else {}
    finally:
        if relay:
            relay.close()
    records = [json.loads(p.read_text()) for p in sorted(results.glob("rank-*.json"))]
    mount_s = {}
    for p in results.glob("mount-*.txt"):
        t_mount, t0 = (float(x) for x in p.read_text().split())
        mount_s[p.stem.removeprefix("mount-")] = round(t0 - t_mount, 2)
    if proc.returncode != 0 or len(records) != ranks:
        raise RuntimeError(f"{layout} N={ranks}: job step failed (status {proc.returncode}, "
                           f"{len(records)}/{ranks} ranks): {(proc.stderr or proc.stdout)[-2000:]}")
    startup = [r["startup_s"] for r in records]
    total: dict[str, int] = {}
    for per_node in server.values():
        for key, n in per_node.items():
            total[key] = total.get(key, 0) + n
    metadata = sum(total.get(k, 0) for k in METADATA)
    return {"layout": layout, "ranks": ranks, "nodes": nodes, "latency_ms": latency_ms if relay else 0.0,
            "startup_median_s": round(statistics.median(startup), 2), "startup_max_s": round(max(startup), 2),
            "imports_median_s": round(statistics.median(r["imports_s"] for r in records), 2),
            "metadata_requests": metadata, "metadata_per_rank": round(metadata / ranks, 1),
            "read_requests": total.get("READ", 0), "read_bytes": total.get("READ_bytes", 0),
            "server_total": total, "server_by_node": server, "job_wall_s": round(wall, 1),
            "mount_s_by_node": mount_s, "mount_max_s": max(mount_s.values(), default=0.0),
            "rank_records": sorted(records, key=lambda r: r["rank"])}


def make_tree(stack: str, work: Path, processors: int | None) -> None:
    """The ``layout: squashfs`` software tree the server exports: ``<work>/squashfs-tree/software``
    with the stack's build directory (its ``bin/``, an empty ``venv/`` and ``venv.sqsh`` packed
    from the installed venv as the install's ``image`` step packs it), and the stack's name
    linked to it. Kept between runs (rebuilt if the image is missing)."""
    build = os.path.realpath(stack)
    rel = os.path.relpath(build, "/opt/hpcstack/software")
    dest = work / "squashfs-tree" / "software" / rel
    link = work / "squashfs-tree" / "software" / os.path.relpath(stack, "/opt/hpcstack/software")
    image = dest / stack_image.IMAGE_NAME
    (dest / stack_image.VENV_DIR).mkdir(parents=True, exist_ok=True)
    for old in link.parent.glob(".*"):  # builds of the stack that was installed before
        if old.name != dest.name and old.is_dir():
            shutil.rmtree(old)
    if link.is_symlink() and os.readlink(link) != dest.name:
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(dest.name)
    if image.is_file():
        return
    (dest / stack_image.VENV_DIR).mkdir(parents=True, exist_ok=True)
    shutil.copytree(os.path.join(build, "bin"), dest / "bin", symlinks=True, dirs_exist_ok=True)
    tmp = Path(str(image) + ".tmp")
    settings = stack_image.ImageSettings(processors=processors)
    log(f"packing {build}/venv into {image} ({settings.compression}) …")
    subprocess.run(stack_image.pack_argv(os.path.join(build, "venv"), str(tmp), settings), check=True)
    tmp.rename(image)


def _local_of(results: list[dict]) -> dict[tuple[int, int], float]:
    """The slowest rank's start-up of each ``local`` run, by (round, rank count)."""
    return {(r.get("round", 1), r["ranks"]): r["startup_max_s"] for r in results if r["layout"] == "local"}


def table(results: list[dict]) -> str:
    """The results as a text table, one row per run.

    :param results: the runs, as :func:`run_once` returns them (with ``round`` where
        ``--rounds`` was given; a run without one counts as round 1).
    :returns: the table; ``x local`` is the run's slowest rank against the slowest rank of the
        ``local`` run of the same round and rank count (``-`` where there is none), ``mount s``
        the slowest node's mounts, and the last column the metadata requests by type and each
        node's mounts in seconds.
    """
    head = (f"{'layout':10} {'lat ms':>6} {'N':>2} {'median s':>9} {'max s':>7} {'x local':>7} "
            f"{'meta/rank':>9} {'READs':>7} {'MB read':>8} {'mount s':>7}  requests by type (all ranks); "
            "mount s by node")
    local = _local_of(results)
    rows = [head]
    for r in results:
        base = local.get((r.get("round", 1), r["ranks"]))
        ratio = f"{r['startup_max_s'] / base:.2f}" if base else "-"
        kinds = " ".join(f"{k}={v}" for k, v in sorted(r["server_total"].items())
                         if k in METADATA and v)
        mounts = " ".join(f"{node}={s:.2f}" for node, s in sorted(r.get("mount_s_by_node", {}).items())
                          if r["layout"] != "local")
        rows.append((f"{r['layout']:10} {r['latency_ms']:>6} {r['ranks']:>2} {r['startup_median_s']:>9.2f} "
                     f"{r['startup_max_s']:>7.2f} {ratio:>7} {r['metadata_per_rank']:>9} "
                     f"{r['read_requests']:>7} {r['read_bytes'] / 1e6:>8.0f} {r['mount_max_s']:>7.2f}  "
                     f"{kinds}{'; ' + mounts if mounts else ''}").rstrip())
    return "\n".join(rows)


def summary(results: list[dict]) -> str:
    """Medians over the rounds per layout, latency and rank count, then each layout against
    ``local`` round by round.

    The table: start-up (the slowest rank of each run), its ratio to the median of ``local`` at
    the same rank count (``x local``: a ratio of medians), the mounts' time (before the ranks
    start: staging is there), the metadata requests per rank, the data reads and the MB read.
    Below it, for each layout other than ``local``: the ratio of its slowest rank to that of the
    ``local`` run of the same round and rank count, every round where both ran, as a median with
    its spread (:func:`stats.fmt`): the figure a verdict rests on.

    :param results: the runs (see :func:`table`).
    :returns: the text, one line per group and one per paired layout.
    """
    from stats import fmt  # benchmarks/stats.py

    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["layout"], r["latency_ms"], r["ranks"]), []).append(r)
    med = {k: statistics.median(r["startup_max_s"] for r in v) for k, v in groups.items()}
    local = {k[2]: v for k, v in med.items() if k[0] == "local"}
    rows = [f"{'layout':10} {'lat ms':>6} {'N':>2} {'runs':>4} {'median max s':>12} {'x local':>7} "
            f"{'mount s':>7} {'meta/rank':>9} {'READs':>7} {'MB read':>8}  (medians over rounds)"]
    order = sorted(groups, key=lambda k: (k[2], LAYOUTS.index(k[0]), k[1]))
    for k in order:
        v = groups[k]
        ratio = f"{med[k] / local[k[2]]:.2f}" if local.get(k[2]) else "-"
        rows.append(f"{k[0]:10} {k[1]:>6} {k[2]:>2} {len(v):>4} {med[k]:>12.2f} {ratio:>7} "
                    f"{statistics.median(r['mount_max_s'] for r in v):>7.2f} "
                    f"{statistics.median(r['metadata_per_rank'] for r in v):>9} "
                    f"{statistics.median(r['read_requests'] for r in v):>7.0f} "
                    f"{statistics.median(r['read_bytes'] for r in v) / 1e6:>8.0f}")
    local_of = _local_of(results)
    paired = []
    for k in order:
        if k[0] == "local":
            continue
        values = [r["startup_max_s"] / local_of[(r.get("round", 1), r["ranks"])] for r in groups[k]
                  if local_of.get((r.get("round", 1), r["ranks"]))]
        if values:
            paired.append(f"  {k[0]} {k[1]} ms, N {k[2]}: {fmt(values, 'x', 2)}; "
                          f"per round {', '.join(f'{x:.2f}' for x in values)}")
    if paired:
        rows += ["", "max s / local's max s of the same round and N (paired rounds):", *paired]
    return "\n".join(rows)


def report(path: Path) -> str:
    """The table and, for more than one round, the summary of a kept ``--json`` file: what the run
    printed, printed again (by this version of :func:`table` and :func:`summary`) without
    running anything.

    :param path: a file written by ``--json`` (also one a stopped run left: it holds every run
        that finished).
    :returns: the text.
    :raises OSError: the file cannot be read.
    :raises ValueError: it is not such a file (no ``runs``, or a run without the fields).
    """
    data = json.loads(path.read_text())
    results = data.get("runs") if isinstance(data, dict) else None
    if not results or not all(isinstance(r, dict) and {"layout", "ranks", "startup_max_s"} <= set(r)
                              for r in results):
        raise ValueError(f"{path}: not a --json file of benchmarks/startup.py (no runs)")
    out = [f"{len(results)} runs from {path.name}", table(results)]
    if max(r.get("round", 1) for r in results) > 1:
        out += ["", summary(results)]
    return "\n".join(out)


def _sig(x: float) -> str:
    """``x`` with 3 significant digits, thousands separated (``0.0985``, ``4.93``, ``49.3``, ``493``,
    ``4,930``)."""
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{round(x):,}"
    return f"{x:.3g}"


def model(nodes: list[int], requests_per_node: dict[str, float], rate: float,
          mb_per_node: dict[str, float] | None = None, bandwidths_gb_s: list[float] | None = None) -> str:
    """Start-up at scale as arithmetic on measured counts, not a measurement: every node starts at
    once against one metadata server and the storage that serves the data.

    For each node count: the metadata requests of all nodes (``nodes x requests per node``) and
    the seconds the server alone needs at ``rate`` (``requests / rate``); the bytes all nodes
    read (``nodes x MB per node``) and the seconds at each aggregate bandwidth.

    :param nodes: node counts, e.g. ``[2, 100, 1000]``.
    :param requests_per_node: metadata requests one node sends, by layout (``{"directory": 24626}``).
    :param rate: requests per second the metadata server answers (R), > 0.
    :param mb_per_node: MB (10^6 bytes) one node reads, by layout (``{"staged": 4029}``).
    :param bandwidths_gb_s: aggregate bandwidths in GB/s (10^9 bytes per second), each > 0.
    :returns: the model's assumptions and one table each for the metadata and the data.
    :raises ValueError: a rate or bandwidth that is not positive, or no node count.
    """
    mb_per_node, bandwidths_gb_s = mb_per_node or {}, bandwidths_gb_s or []
    if not nodes or rate <= 0 or any(b <= 0 for b in bandwidths_gb_s):
        raise ValueError("the model needs node counts, a positive rate and positive bandwidths")
    rows = ["model (arithmetic, not a measurement): every node starts at once",
            "per node: " + "; ".join([f"{k} {_sig(v)} metadata requests" for k, v in requests_per_node.items()]
                                     + [f"{k} {_sig(v)} MB read" for k, v in mb_per_node.items()])]
    if requests_per_node:
        rows += ["", f"metadata server at R = {_sig(rate)} requests/s: requests = nodes x requests per node, "
                 "seconds = requests / R",
                 f"{'nodes':>7}" + "".join(f"  {k + ' requests':>20} {'s at R':>9}" for k in requests_per_node)]
        for n in nodes:
            rows.append(f"{n:>7,}" + "".join(f"  {_sig(n * v):>20} {_sig(n * v / rate):>9}"
                                             for v in requests_per_node.values()))
    if mb_per_node:
        rows += ["", "data: GB = nodes x MB per node / 1000, seconds = GB / B",
                 f"{'nodes':>7}" + "".join(f"  {k + ' GB':>14}" + "".join(f" {f's at {_sig(b)} GB/s':>16}"
                                                                           for b in bandwidths_gb_s)
                                           for k in mb_per_node)]
        for n in nodes:
            rows.append(f"{n:>7,}" + "".join(f"  {_sig(n * v / 1000):>14}" + "".join(
                f" {_sig(n * v / 1000 / b):>16}" for b in bandwidths_gb_s) for v in mb_per_node.values()))
    return "\n".join(rows)


def _named_numbers(text: str, what: str) -> dict[str, float]:
    """``NAME=NUMBER,NAME=NUMBER`` as a dict (empty for an empty text).

    :raises ValueError: an item without ``=`` or with a value that is not a number, naming ``what``.
    """
    out: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise ValueError(f"{what}: {item!r} is not NAME=NUMBER")
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the matrix (or, with ``--report`` or ``--model``, only print); the exit status.

    :param argv: the command line without the program name (default: ``sys.argv[1:]``).
    :returns: 0, or 2 when an option or a prerequisite is wrong (each problem on stderr).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default=DEFAULT_STACK, help="an installed stack (its published name)")
    ap.add_argument("--work", default="/var/tmp/h-startup", help="the image, scripts and results go here")
    ap.add_argument("--ranks", default="1,2,4,8", help="rank counts, comma-separated (1 or even)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help=f"of {', '.join(LAYOUTS)}")
    ap.add_argument("--latency", default="0.2,1", help="one-way delays in ms, comma-separated")
    ap.add_argument("--processors", type=int, default=1, help="mksquashfs -processors")
    ap.add_argument("--timeout", type=int, default=900, help="seconds one job step may take")
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat the whole matrix, layouts alternating within each round; prints medians")
    ap.add_argument("--json", metavar="FILE", help="write every run as JSON")
    ap.add_argument("--report", metavar="FILE", type=Path,
                    help="print the table and summary of a kept --json FILE and exit (runs nothing)")
    ap.add_argument("--model", action="store_true",
                    help="print the model at --model-nodes from the counts given and exit (runs nothing)")
    ap.add_argument("--model-nodes", default="2,100,1000", help="node counts of the model")
    ap.add_argument("--model-rate", type=float, default=500_000.0,
                    help="metadata requests/s the server answers (R)")
    ap.add_argument("--model-requests", default="", metavar="LAYOUT=N,…",
                    help="metadata requests per node, by layout (e.g. directory=24626,squashfs=98)")
    ap.add_argument("--model-mb", default="", metavar="LAYOUT=MB,…",
                    help="MB read per node, by layout (e.g. staged=4029,squashfs=196)")
    ap.add_argument("--model-bandwidth", default="", metavar="GB/S,…",
                    help="aggregate bandwidths in GB/s for the data (e.g. 100,1000)")
    args = ap.parse_args(argv)
    if args.report or args.model:
        try:
            if args.report:
                print(report(args.report))
            if args.model:
                print(model([int(x) for x in args.model_nodes.split(",")],
                            _named_numbers(args.model_requests, "--model-requests"), args.model_rate,
                            _named_numbers(args.model_mb, "--model-mb"),
                            [float(x) for x in args.model_bandwidth.split(",") if x]))
        except (OSError, ValueError) as e:
            print(f"startup.py: {e}", file=sys.stderr)
            return 2
        return 0
    errors = []
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
        latencies = [float(x) for x in args.latency.split(",")]
    except ValueError:
        ranks, latencies = [], []
        errors.append("--ranks and --latency take comma-separated numbers")
    if any(n < 1 or (n > 1 and n % 2) for n in ranks):
        errors.append("--ranks: each count is 1 or even (half the ranks on each node)")
    layouts = args.layouts.split(",")
    errors += [f"--layouts: unknown layout {x!r} (one of {', '.join(LAYOUTS)})" for x in layouts if x not in LAYOUTS]
    if os.geteuid() != 0:
        errors.append("needs root (mount namespaces and FUSE mounts on the nodes)")
    for tool in ("srun", "sshfs", "squashfuse", "mksquashfs", "unsquashfs", "unshare", "fusermount3", "losetup"):
        if not shutil.which(tool):
            errors.append(f"{tool} missing (apt-get install sshfs squashfuse squashfs-tools slurm-client)")
    if not os.path.exists(SFTP_SERVER):
        errors.append(f"{SFTP_SERVER} missing (apt-get install openssh-sftp-server)")
    if not os.path.isfile(os.path.join(args.stack, "venv", "pyvenv.cfg")):
        errors.append(f"{args.stack}: no installed stack there")
    if errors:
        for e in errors:
            print(f"startup.py: {e}", file=sys.stderr)
        return 2
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if set(layouts) - {"local", "directory"}:
        (work / "stage").mkdir(mode=0o700, exist_ok=True)
        make_tree(args.stack, work, args.processors)
    results = []
    for rnd in range(1, args.rounds + 1):  # rounds outermost, layouts alternating within a round
        for n in ranks:
            for layout in layouts:
                for lat in (latencies if layout != "local" else [0.0]):
                    log(f"round {rnd}: {layout}, {lat} ms each way, {n} rank(s) …")
                    r = run_once(layout, n, lat, args.stack, work, args.timeout)
                    r["round"] = rnd
                    log(f"  max {r['startup_max_s']} s, {r['metadata_per_rank']} metadata requests per rank, "
                        f"mounts {r['mount_max_s']} s")
                    results.append(r)
                    if args.json:
                        Path(args.json).write_text(json.dumps({"sshfs_options": SSHFS_OPTIONS, "runs": results},
                                                              indent=1) + "\n")
    print(table(results))
    if args.rounds > 1:
        print()
        print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
