# ===== @VALIDATION_DIR@/n1/job.sh (1 node(s)) =====
#!/bin/bash
# hpcstack validation of mpi4py/4.1.2 on cirrus:gpu, 1 node(s) x 4 rank(s): mpi
# Written by hpcstack 0.3.0: hpcstack validate mpi4py/4.1.2 --site cirrus.
# Submit with: sbatch job.sh. Its directory (--chdir, --output) must exist first and be writable on the compute nodes; hpcstack validate creates it.
# No account given, and this site charges jobs to a budget: pass --account=BUDGET to hpcstack, add #SBATCH --account=BUDGET, or export SBATCH_ACCOUNT=BUDGET before sbatch.
#SBATCH --job-name=hpcstack-validate-mpi4py-n1
#SBATCH --partition=gpu
#SBATCH --qos=gpu
#SBATCH --nodes=1
#SBATCH --gres=gpu:4
#SBATCH --exclusive
#SBATCH --time=00:20:00
#SBATCH --output=@VALIDATION_DIR@/n1/slurm-%j.out
#SBATCH --chdir=@VALIDATION_DIR@/n1
#SBATCH --export=NONE

# The job does not inherit the `module` function (--export=NONE, or a login-less batch shell):
# source the module tool's init, then load the stack (its base python module comes with it).
unset BASH_ENV   # Lmod's /etc/profile.d/lmod.sh would switch child shells to Lmod
source /usr/share/Modules/init/bash || { echo "hpcstack: cannot source "/usr/share/Modules/init/bash >&2; exit 97; }
module use /work/y07/shared/cirrus-modulefiles
module load mpi4py/4.1.2 || { echo "hpcstack: module load "mpi4py/4.1.2" failed" >&2; exit 98; }

# sbatch --export=NONE sets SLURM_EXPORT_ENV=NONE, which srun would pass on to every step:
# the ranks would lose the loaded modules. Steps get this script's environment instead.
export SLURM_EXPORT_ENV=ALL
# one torch/OpenMP thread per core of the task (torch would start one per core of the node)
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-10}
export SRUN_CPUS_PER_TASK=10   # srun >= 22.05 does not inherit --cpus-per-task
export NCCL_DEBUG=WARN
python -c 'import json, os, platform, subprocess, sys
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
    fp["os"] = rel.get("PRETTY_NAME", "").strip('"'"'"'"'"') or None
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
    raise' @VALIDATION_DIR@/n1/fingerprint.json >/dev/null 2>&1 || echo "hpcstack: no environment fingerprint written (continuing)" >&2

echo "hpcstack: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST} (${SLURM_NNODES} node(s)) as $(id -un); $(command -v python)"
# No `set -e`: every step runs, and the job's exit status is the last failing step's.
# Each step's status file is made anew beside the old name and renamed over it: a link left at
# that name is replaced, never written through.
status=0

echo "==> hpcstack: step "mpi": starting $(date -u +%H:%M:%S)"
srun --nodes=1 --ntasks-per-node=4 --cpus-per-task=10 --ntasks=4 --hint=nomultithread /work/y07/shared/cirrus-software/mpi4py/4.1.2/bin/mpi4py-validate --ring-bytes 1 --ring-loops 1000 --pingpong-loops 1000 --pingpong-max-bytes 4194304 --output @VALIDATION_DIR@/n1/mpi.jsonl
rc=$?
hpcstack_tmp=$(mktemp @VALIDATION_DIR@/n1/mpi.exit.XXXXXX) && echo "$rc" > "$hpcstack_tmp" \
  && chmod 644 "$hpcstack_tmp" && mv -fT "$hpcstack_tmp" @VALIDATION_DIR@/n1/mpi.exit
echo "==> hpcstack: step "mpi": exit status $rc"
[ "$rc" -eq 0 ] || status=$rc
exit "$status"

# ===== @VALIDATION_DIR@/n2/job.sh (2 node(s)) =====
#!/bin/bash
# hpcstack validation of mpi4py/4.1.2 on cirrus:gpu, 2 node(s) x 4 rank(s): mpi
# Written by hpcstack 0.3.0: hpcstack validate mpi4py/4.1.2 --site cirrus.
# Submit with: sbatch job.sh. Its directory (--chdir, --output) must exist first and be writable on the compute nodes; hpcstack validate creates it.
# No account given, and this site charges jobs to a budget: pass --account=BUDGET to hpcstack, add #SBATCH --account=BUDGET, or export SBATCH_ACCOUNT=BUDGET before sbatch.
#SBATCH --job-name=hpcstack-validate-mpi4py-n2
#SBATCH --partition=gpu
#SBATCH --qos=gpu
#SBATCH --nodes=2
#SBATCH --gres=gpu:4
#SBATCH --exclusive
#SBATCH --time=00:20:00
#SBATCH --output=@VALIDATION_DIR@/n2/slurm-%j.out
#SBATCH --chdir=@VALIDATION_DIR@/n2
#SBATCH --export=NONE

# The job does not inherit the `module` function (--export=NONE, or a login-less batch shell):
# source the module tool's init, then load the stack (its base python module comes with it).
unset BASH_ENV   # Lmod's /etc/profile.d/lmod.sh would switch child shells to Lmod
source /usr/share/Modules/init/bash || { echo "hpcstack: cannot source "/usr/share/Modules/init/bash >&2; exit 97; }
module use /work/y07/shared/cirrus-modulefiles
module load mpi4py/4.1.2 || { echo "hpcstack: module load "mpi4py/4.1.2" failed" >&2; exit 98; }

# sbatch --export=NONE sets SLURM_EXPORT_ENV=NONE, which srun would pass on to every step:
# the ranks would lose the loaded modules. Steps get this script's environment instead.
export SLURM_EXPORT_ENV=ALL
# one torch/OpenMP thread per core of the task (torch would start one per core of the node)
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-10}
export SRUN_CPUS_PER_TASK=10   # srun >= 22.05 does not inherit --cpus-per-task
export NCCL_DEBUG=WARN
python -c 'import json, os, platform, subprocess, sys
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
    fp["os"] = rel.get("PRETTY_NAME", "").strip('"'"'"'"'"') or None
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
    raise' @VALIDATION_DIR@/n2/fingerprint.json >/dev/null 2>&1 || echo "hpcstack: no environment fingerprint written (continuing)" >&2

echo "hpcstack: job ${SLURM_JOB_ID} on ${SLURM_JOB_NODELIST} (${SLURM_NNODES} node(s)) as $(id -un); $(command -v python)"
# No `set -e`: every step runs, and the job's exit status is the last failing step's.
# Each step's status file is made anew beside the old name and renamed over it: a link left at
# that name is replaced, never written through.
status=0

echo "==> hpcstack: step "mpi": starting $(date -u +%H:%M:%S)"
srun --nodes=2 --ntasks-per-node=4 --cpus-per-task=10 --ntasks=8 --hint=nomultithread /work/y07/shared/cirrus-software/mpi4py/4.1.2/bin/mpi4py-validate --ring-bytes 1 --ring-loops 1000 --pingpong-loops 1000 --pingpong-max-bytes 4194304 --output @VALIDATION_DIR@/n2/mpi.jsonl
rc=$?
hpcstack_tmp=$(mktemp @VALIDATION_DIR@/n2/mpi.exit.XXXXXX) && echo "$rc" > "$hpcstack_tmp" \
  && chmod 644 "$hpcstack_tmp" && mv -fT "$hpcstack_tmp" @VALIDATION_DIR@/n2/mpi.exit
echo "==> hpcstack: step "mpi": exit status $rc"
[ "$rc" -eq 0 ] || status=$rc
exit "$status"

