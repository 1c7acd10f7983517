"""The environment a validation ran in, as a flat dict: what changed when a stack slows down.

A stack breaks silently when something under it changes: a GPU driver, the CUDA driver, NCCL or
its network plugin, Slurm, MPI, the kernel, the OS, the modules a job loads, the nodes. Each
validation job writes what it can learn of these cheaply, on its first node, into
``<job dir>/fingerprint.json`` (:func:`job_line`: one line of the job script, a short
``python -c`` run by the stack's Python after ``module load``; a failure there never fails the
job); hpcstack reads the files back (:func:`read_job_fingerprints`), checks and merges them
(:func:`from_job`, :func:`merge`) and keeps the result beside the run in the history
(:mod:`hpcstack.validate.history`); :func:`diff` says what changed between two runs.

The keys (:data:`KEYS`), each a string or None where the node does not have it:

===================  ===========================================================================
``gpu.model``        ``nvidia-smi --query-gpu=name,driver_version --format=csv,noheader``: the
``gpu.driver``       distinct models and drivers, joined with ``", "``
``cuda.driver``      the CUDA driver API version, ``cuDriverGetVersion`` of ``libcuda.so.1``
                     (``12040`` -> ``12.4``)
``nccl.version``     left empty by the job: the NCCL actually loaded and its net plugin line, filled
``nccl.net_plugin``  from the run's NCCL logs (``NCCL_DEBUG=INFO``) as the transport checks read
                     them (:func:`nccl_of_report`)
``mpi``              the first line of ``mpirun --version``, else mpi4py's
                     ``MPI.Get_library_version()`` (without ``MPI_Init``)
``slurm``            ``sinfo --version``
``kernel``           ``os.uname().release``; ``os``: ``PRETTY_NAME`` of ``/etc/os-release``
``python``           the stack's Python (``platform.python_version()``)
``modules``          ``$LOADEDMODULES`` (``:``-separated, as both module tools keep it)
``nodes``            ``$SLURM_JOB_NODELIST`` of each job, merged over the jobs
``cpu.model``        the first ``model name`` of ``/proc/cpuinfo``
``cpu.affinity``     how many CPUs the job's first task may run on (``os.sched_getaffinity``)
``cpu.quota``        the CPU bandwidth limit of the job's control group and its parents, where
                     one is set: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` over
                     ``cpu.cfs_period_us``, as CPUs (``0.25 CPUs (/slow)``): a node whose jobs
                     were throttled after maintenance
``net.env``          the job's transport settings: every ``NCCL_*``, ``GLOO_*``, ``UCX_*``,
                     ``FI_*``, ``OMPI_MCA_*`` and ``HOROVOD_*`` variable as ``NAME=value``, sorted
                     (a module that sets ``NCCL_IB_DISABLE=1`` or a renamed interface in
                     ``GLOO_SOCKET_IFNAME``); hpcstack's own ``NCCL_DEBUG*`` left out
``stack.build``      the published build's id (added by hpcstack, not by the job)
===================  ===========================================================================

Everything read back is hostile until checked: only the keys above, strings of at most
:data:`MAX_VALUE` characters without control characters.

Sources: nvidia-smi(1) (``--query-gpu``, ``--format=csv,noheader``); the CUDA Driver API,
``cuDriverGetVersion`` (https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VERSION.html);
os-release(5); sinfo(1) ``--version``; MPI 4.0 standard section 9.1.1 (``MPI_Get_library_version``
may be called before ``MPI_Init``); mpi4py's ``mpi4py.rc.initialize``.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

#: The file each job writes in its directory.
FILENAME = "fingerprint.json"
#: The keys of a fingerprint, in the order a diff lists them.
KEYS = ("gpu.model", "gpu.driver", "cuda.driver", "nccl.version", "nccl.net_plugin", "mpi", "slurm",
        "kernel", "os", "python", "modules", "nodes", "cpu.model", "cpu.affinity", "cpu.quota", "net.env",
        "stack.build")
#: The longest value kept (a module list of a big hierarchy stays under it).
MAX_VALUE = 4096
#: The largest fingerprint.json read back.
MAX_FILE = 64 * 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: What the job runs (``python -c``, the output file as its argument). Every probe is guarded and
#: bounded (10 s a command): the job goes on whatever happens here.
COLLECTOR = r"""
import json, os, platform, subprocess, sys
def run(*argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return p.stdout.strip() if p.returncode == 0 else None
    except Exception:
        return None
def first(text):
    return text.splitlines()[0].strip() if text else None
fp = {"gpu.model": None, "gpu.driver": None, "cuda.driver": None, "nccl.version": None, "nccl.net_plugin": None}
gpus = run("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")
if gpus:
    rows = [[c.strip() for c in line.rsplit(",", 1)] for line in gpus.splitlines() if "," in line]
    fp["gpu.model"] = ", ".join(sorted({r[0] for r in rows})) or None
    fp["gpu.driver"] = ", ".join(sorted({r[1] for r in rows})) or None
try:
    import ctypes
    v = ctypes.c_int()
    if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0:
        fp["cuda.driver"] = "%d.%d" % (v.value // 1000, v.value % 1000 // 10)
except Exception:
    pass
fp["mpi"] = first(run("mpirun", "--version"))
if fp["mpi"] is None:
    try:
        import mpi4py
        mpi4py.rc.initialize = False
        from mpi4py import MPI
        fp["mpi"] = first(MPI.Get_library_version())
    except Exception:
        pass
fp["slurm"] = first(run("sinfo", "--version"))
fp["kernel"] = platform.release()
try:
    with open("/etc/os-release") as f:
        rel = dict(l.rstrip("\n").split("=", 1) for l in f if "=" in l)
    fp["os"] = rel.get("PRETTY_NAME", "").strip('"') or None
except Exception:
    fp["os"] = None
fp["python"] = platform.python_version()
fp["modules"] = os.environ.get("LOADEDMODULES") or None
fp["nodes"] = os.environ.get("SLURM_JOB_NODELIST") or platform.node()
try:
    with open("/proc/cpuinfo") as f:
        fp["cpu.model"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
except Exception:
    fp["cpu.model"] = None
try:
    fp["cpu.affinity"] = str(len(os.sched_getaffinity(0)))
except Exception:
    fp["cpu.affinity"] = None
def quota():
    try:
        with open("/proc/self/cgroup") as f:
            rows = [l.rstrip("\n").split(":", 2) for l in f]
    except Exception:
        return None
    for _, controllers, path in rows:
        v1 = "cpu" in controllers.split(",")
        if not (v1 or controllers == ""):
            continue
        base = "/sys/fs/cgroup/cpu" if v1 else "/sys/fs/cgroup"
        if v1 and not os.path.isdir(base):
            base = "/sys/fs/cgroup/cpu,cpuacct"
        limits = []
        while True:
            d = base + (path if path != "/" else "")
            try:
                if v1:
                    q = int(open(d + "/cpu.cfs_quota_us").read())
                    period = int(open(d + "/cpu.cfs_period_us").read())
                else:
                    q, period = open(d + "/cpu.max").read().split()
                    q = -1 if q == "max" else int(q)
                    period = int(period)
                if q > 0 and period > 0:
                    limits.append((q / period, path))
            except Exception:
                pass
            if path in ("/", ""):
                break
            path = os.path.dirname(path)
        if limits:
            cpus, where = min(limits)
            return "%.2f CPUs (%s)" % (cpus, where)
    return None
fp["cpu.quota"] = quota()
own = ("NCCL_DEBUG", "NCCL_DEBUG_FILE", "NCCL_DEBUG_SUBSYS")
net = sorted("%s=%s" % (k, v) for k, v in os.environ.items()
             if k.startswith(("NCCL_", "GLOO_", "UCX_", "FI_", "OMPI_MCA_", "HOROVOD_")) and k not in own)
fp["net.env"] = " ".join(net) or None
import tempfile
fd, tmp = tempfile.mkstemp(prefix=".fingerprint-", suffix=".tmp", dir=os.path.dirname(os.path.abspath(sys.argv[1])))
try:
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(fp, f, indent=1, sort_keys=True)
    os.replace(tmp, sys.argv[1])
except BaseException:
    os.unlink(tmp)
    raise
""".strip()


def job_line(path: str | Path) -> str:
    """The job script's line that writes the fingerprint to ``path`` (the job's directory,
    :data:`FILENAME`) with the stack's ``python``; it never changes the job's exit status.

    Example:
        ``job_line("/scratch/v/n2/fingerprint.json")`` ->
        ``python -c '...' /scratch/v/n2/fingerprint.json >/dev/null 2>&1 || echo "hpcstack: ..." >&2``
    """
    return (f"python -c {shlex.quote(COLLECTOR)} {shlex.quote(str(path))} >/dev/null 2>&1 "
            "|| echo \"hpcstack: no environment fingerprint written (continuing)\" >&2")


def _clean(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = ", ".join(str(v) for v in value)
    text = _CONTROL.sub(" ", str(value)).strip()
    return text[:MAX_VALUE] or None


def from_job(data) -> dict:
    """The fingerprint of a job's ``fingerprint.json`` (as loaded): the :data:`KEYS` only, each
    a string (control characters blanked, at most :data:`MAX_VALUE` characters) or None.

    Args:
        data (dict | object): what the job wrote; anything else gives an empty fingerprint.

    Returns:
        dict[str, str | None]: every key of :data:`KEYS`.
    """
    data = data if isinstance(data, dict) else {}
    return {key: _clean(data.get(key)) for key in KEYS}


def merge(prints: list[dict]) -> dict:
    """One fingerprint for a validation's jobs: per key, the distinct values joined with
    ``"; "`` in the order seen (``nodes`` of every job; a GPU model that differs between jobs
    shows both)."""
    out = {}
    for key in KEYS:
        values = list(dict.fromkeys(v for fp in prints if (v := fp.get(key)) is not None))
        out[key] = "; ".join(values)[:MAX_VALUE] if values else None
    return out


def nccl_of_report(report: dict) -> dict:
    """``nccl.version`` and ``nccl.net_plugin`` from a validation report's jobs (each job's
    ``transport.nccl``, :meth:`hpcstack.validate.transport.TransportVerdict.to_dict`): the
    versions the logs name, sorted and joined with ``", "``, and the first plugin line; None
    where no log says (a CPU site, a run without NCCL).

    Args:
        report (dict): the report (``report.json``); anything malformed counts as nothing.

    Returns:
        dict[str, str | None]: the two keys.
    """
    versions, plugin = set(), None
    for job in (report.get("jobs") if isinstance(report, dict) else None) or []:
        nccl = ((job.get("transport") if isinstance(job, dict) else None) or {}).get("nccl") or {}
        versions.update(v for v in nccl.get("loaded") or [] if isinstance(v, str))
        lines = [v for v in nccl.get("plugin") or [] if isinstance(v, str)]
        plugin = plugin or (lines[0] if lines else None)
    return {"nccl.version": _clean(", ".join(sorted(versions)) or None), "nccl.net_plugin": _clean(plugin)}


def read_job_fingerprints(directories: list[Path], under: Path) -> list[dict]:
    """The fingerprints the jobs wrote, ``<dir>/fingerprint.json`` of each job directory, read
    without following a link below ``under`` (the validation's directory, checked by the trust
    rule, as the jobs' records are read); a missing or unreadable file is skipped."""
    from hpcstack.fsutil import read_no_follow

    out = []
    for directory in directories:
        try:
            raw = read_no_follow(Path(directory) / FILENAME, under, last=MAX_FILE + 1)
        except (OSError, ValueError):
            continue
        if len(raw) > MAX_FILE:
            continue
        try:
            out.append(from_job(json.loads(raw.decode("utf-8", "replace"))))
        except ValueError:
            continue
    return out


def diff(old: dict | None, new: dict | None) -> list[str]:
    """What changed from ``old`` to ``new``, one line per key (in :data:`KEYS` order, then any
    other key sorted): ``changed KEY: OLD -> NEW``, ``added KEY: NEW``, ``removed KEY: OLD``.

    Example:
        ``diff({"gpu.driver": "535.104"}, {"gpu.driver": "550.54"})`` ->
        ``["changed gpu.driver: 535.104 -> 550.54"]``
    """
    old, new = old or {}, new or {}
    keys = [k for k in KEYS if k in old or k in new]
    keys += sorted((set(old) | set(new)) - set(KEYS))
    lines = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if a is None:
            lines.append(f"added {key}: {b}")
        elif b is None:
            lines.append(f"removed {key}: {a}")
        else:
            lines.append(f"changed {key}: {a} -> {b}")
    return lines
