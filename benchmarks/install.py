#!/usr/bin/env python3
"""How fast does hpcstack install pytorch/2.3.1-gpu, against the Cirrus method and uv alone.

One run on one machine measures, and prints as a table with ratios:

  (a) the Cirrus method as written (docs/notes.md, "The Cirrus install by hand"): eleven ``pip install --user`` calls with
      PYTHONUSERBASE in the prefix, then Horovod built from source with ``pip install --user`` —
      here the PyPI sdist with our patch, CPU operations (the localhost site's settings);
  (b) ``hpcstack install`` cold: empty caches (uv's wheel cache, the Horovod wheel cache, the
      download cache), a new prefix;
  (c) ``hpcstack install`` warm: caches filled by (b), another new prefix;
  (d) ``uv pip install`` of the same lock, with the same options, into a fresh venv, alone; and
      the Horovod wheel reuse (install of the cached wheel) on top — the floor for (c);
  (e) ``hpcstack install`` again when up to date (no-op), median of several, with where the
      time goes (cProfile);
  (f) ``module load pytorch/2.3.1-gpu`` against a trivial modulefile, median of many;
  (g) ``python -c "import torch, horovod.torch"`` under the module against a plain venv holding
      the same packages (installed by uv with its defaults: no bytecode): wall time, open and
      stat system calls (``strace -f``), ``.pyc`` files written.

and says whether each of its targets holds: (c) <= 1.25 x ((d) + reuse); (c) at least 5x
faster than (a); (e) < 2 s; (f) <= 1.2 x trivial; (g) 0 ``.pyc`` written and no more open/stat
calls than the plain venv.

Phase ``w`` (not in the default order) measures the warm install against its floor in
one run, without a cold install first: with ``--warm-from CACHE_DIR`` (a site's cache_dir, e.g. /var/cache/hpcstack) the
warm uv cache of an installed stack is used in place and its Horovod build cache is copied;
``--repeat`` rounds of the uv floor (the lock into a ``--without-pip`` venv, plus the cached
Horovod wheel) and ``hpcstack install`` into an empty install root, alternating which goes
first (5 by default); then the no-op re-install. It prints the medians with their spread
(min-max, IQR: ``benchmarks/stats.py``), the ratio per round, the steps' times, and whether the
warm install is within 1.25x the floor (the median of the rounds' ratios, and whether the rounds
straddle it) and the no-op under 0.5 s. The default phases run each variant once: their target
lines say ``in 1 run``, observations rather than verdicts of 5 alternating rounds. Phase ``g``
also counts ``readlink`` calls and the distinct paths an import names.
Phase ``o`` (not in the default order) measures what overlapping Horovod's
sources (fetch, unpack, patch) with the venv and wheels steps saves, on a cold source cache:
``--stop-after patch`` (nothing overlaps) against the install killed as the build step starts,
``--repeat`` rounds, alternating.

Downloads every variant shares are served from local caches, as the output says: (a) reads
wheels from a pip HTTP cache filled beforehand (``pip download``, not timed); (b) downloads from
PyPI (that is what cold means); (c) and (d) use the uv cache (b) filled.

Everything lives under ``--root`` (default /var/tmp/hpcstack-bench), removed at the end unless
``--keep``; about 20 GB at the peak. Needs root (as the localhost site), the localhost
prerequisites (``scripts/localhost-setup``), ``strace`` and the network. Takes 10 minutes on a
quiet 2-core machine, 25 or more under load, most of it the two Horovod builds of (a) and (b).

Usage:
    python3 benchmarks/install.py [--root DIR] [--keep] [--phases b,c,e,d,g,f,a] [--json FILE] [--raw FILE]
    python3 benchmarks/install.py --root DIR --keep --phases w,o,plain,g --repeat 5 \
        --warm-from /var/cache/hpcstack
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stats import fmt, verdict as rounds_verdict  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "recipes" / "pytorch" / "2.3.1-gpu.pypi.lock"
PATCH = REPO / "recipes" / "pytorch" / "patches" / "horovod-0.28.1-cxx17.patch"
SITE = REPO / "site-configs" / "localhost.yaml"
MODULES_INIT = "/usr/share/modules/init/bash"
STACK = "pytorch/2.3.1-gpu"
IMPORT = "import torch, horovod.torch"
FORBIDDEN = ("/opt/hpcstack", "/var/tmp/hpcstack-e2e")

#: The Cirrus instructions' pip calls (docs/notes.md), against PyPI: its torch 2.3.1 is the same
#: cu121 build the PyTorch index serves as 2.3.1+cu121 (which cannot be reached from here).
CIRRUS_PIP = ["torch==2.3.1", "torchaudio==2.3.1", "torchmetrics==1.0.3", "torchtext==0.18.0",
              "torchvision==0.18.1", "tensorboard", "tensorboard_plugin_profile",
              "tensorboard-plugin-wit", "tensorboard-pytorch", "torch-tb-profiler"]
#: What the Horovod build needs besides torch when built with --no-build-isolation (docs/notes.md);
#: Cirrus's Miniconda has these, Debian's python3 lacks wheel.
CIRRUS_BUILD_PREREQS = ["wheel", "packaging", "cffi", "cloudpickle", "psutil", "pyyaml"]
#: The localhost site's Horovod settings (site-configs/localhost.yaml), as the Cirrus line sets its own.
HOROVOD_ENV = {"CC": "mpicc", "CXX": "mpicxx", "HOROVOD_WITH_PYTORCH": "1",
               "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
               "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_CPU_OPERATIONS": "MPI",
               "HOROVOD_WITHOUT_CUDA": "1"}

OPEN_CALLS = {"open", "openat", "openat2", "creat"}
READLINK_CALLS = {"readlink", "readlinkat"}
STAT_CALLS = {"stat", "lstat", "fstat", "newfstatat", "statx", "fstatat64", "stat64", "lstat64",
              "fstat64"}


# ------------------------------------------------------------------------------------ helpers

def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without module state, BASH_ENV (docs/notes.md), PYTHON*/PIP_*/UV_*."""
    drop = ("BASH_ENV", "LOADEDMODULES", "_LMFILES_", "PYTHONPATH", "PYTHONUSERBASE",
            "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(("PIP_", "UV_", "__MODULES_", "BASH_FUNC_"))}
    env.update(extra)
    return env


def run(argv, *, env=None, cwd=None, check=True, capture=False, logfile=None) -> subprocess.CompletedProcess:
    """Run a command; its output goes to ``logfile`` (appended) unless captured."""
    if logfile:
        with open(logfile, "a") as f:
            f.write(f"$ {shlex.join(map(str, argv))}\n")
            f.flush()
            proc = subprocess.run(list(map(str, argv)), env=env, cwd=cwd, stdout=f,
                                  stderr=subprocess.STDOUT, text=True)
    else:
        proc = subprocess.run(list(map(str, argv)), env=env, cwd=cwd, text=True,
                              capture_output=capture)
    if check and proc.returncode != 0:
        where = f" (log: {logfile})" if logfile else ""
        tail = (proc.stderr or "")[-2000:] if capture else ""
        raise RuntimeError(f"`{shlex.join(map(str, argv))[:300]}` exited {proc.returncode}{where}\n{tail}")
    return proc


def timed(argv, **kw) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    proc = run(argv, **kw)
    return time.monotonic() - start, proc


def bash(script: str, **kw) -> subprocess.CompletedProcess:
    return run(["bash", "--norc", "--noprofile", "-c", script], **kw)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def du_bytes(path: Path) -> int:
    out = run(["du", "-sb", str(path)], capture=True, check=False).stdout.split()
    return int(out[0]) if out else 0


class Bench:
    """The benchmark's state: paths, tools, and results (kept in ``<root>/results.json``)."""

    def __init__(self, root: Path, hpcstack: list[str], uv: str):
        self.root, self.hpcstack, self.uv = root, hpcstack, uv
        self.cache = root / "cache"
        self.uv_cache = self.cache / "uv"   # --warm-from: another install root's warm uv cache
        self.site = root / "site.yaml"
        self.results_file = root / "results.json"
        self.results = json.loads(self.results_file.read_text()) if self.results_file.is_file() else {}
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)

    def save(self, key: str, value) -> None:
        self.results[key] = value
        self.results_file.write_text(json.dumps(self.results, indent=1) + "\n")

    # -- layout
    def install_root(self, name: str) -> Path:
        return self.root / name / "sw"

    def module_root(self, name: str) -> Path:
        return self.root / name / "mf"

    def stack_args(self, name: str) -> list[str]:
        return ["--site", str(self.site), "--prefix", str(self.install_root(name)),
                "--module-root", str(self.module_root(name))]

    def stack_prefix(self, name: str) -> Path:
        return self.install_root(name) / STACK

    def horovod_wheel(self) -> Path:
        found = sorted(glob.glob(str(self.cache / "builds" / "horovod-0.28.1" / "*" / "horovod-*.whl")))
        if not found:
            raise RuntimeError(f"no Horovod wheel in {self.cache}/builds (run phase b first)")
        return Path(found[0])

    def uv_install(self, python: Path, *args: str, compile_bytecode: bool = True,
                   link_mode: str | None = "hardlink") -> list[str]:
        argv = [self.uv, "pip", "install", "--python", str(python), "--no-config",
                "--cache-dir", str(self.uv_cache)]
        if link_mode:
            argv += ["--link-mode", link_mode]
        if compile_bytecode:
            argv.append("--compile-bytecode")
        return argv + list(args)

    def module_script(self, mod_root: Path, body: str) -> str:
        """A bash script with Environment Modules initialised and MODULEPATH set to ours only
        (the stack's module root, then the site's base module directories)."""
        return (f"source {MODULES_INIT}\nmodule purge >/dev/null 2>&1\n"
                f"export MODULEPATH={shlex.quote(str(mod_root))}\n"
                + "".join(f"module use --append {shlex.quote(d)}\n" for d in self.base_module_dirs())
                + body)

    def base_module_dirs(self) -> list[str]:
        import yaml
        return list(yaml.safe_load(self.site.read_text())["modules"].get("use", []))


# ------------------------------------------------------------------------------------- phases

def setup(b: Bench) -> None:
    """Write the benchmark's site config: localhost with our install root and one shared cache dir."""
    import yaml

    data = yaml.safe_load(SITE.read_text())
    data["install_root"] = str(b.install_root("default"))
    data["module_root"] = str(b.module_root("default"))
    data["cache_dir"] = str(b.cache)    # shared by every prefix: cold fills it, warm reads it
    data.pop("stage_root", None)         # default: under each install root (a new prefix, a new stage)
    data.setdefault("installer", {})
    if b.uv_cache != b.cache / "uv":
        data["installer"]["wheel_cache"] = str(b.uv_cache)
    b.site.write_text(yaml.safe_dump(data, sort_keys=False))
    base = bash(f"source {MODULES_INIT}\n" + "".join(f"module use {shlex.quote(d)}\n" for d in b.base_module_dirs())
                + f"module load {shlex.quote(data['modules']['base'])} && command -v python3",
                env=clean_env(), capture=True)
    b.save("base_python", base.stdout.strip().splitlines()[-1])
    b.save("machine", {
        "os": _os_release(), "kernel": platform.release(), "cpus": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": run([b.results["base_python"], "--version"], capture=True).stdout.strip(),
        "uv": run([b.uv, "--version"], capture=True).stdout.strip(),
        "pip": run([b.results["base_python"], "-m", "pip", "--version"], capture=True,
                   check=False).stdout.split(" from ")[0],
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
    })


def _os_release() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def _hpcstack_install(b: Bench, name: str, logname: str) -> dict:
    load = load_average()
    seconds, proc = timed([*b.hpcstack, "install", STACK, *b.stack_args(name)], env=clean_env(),
                          logfile=b.logs / f"{logname}.log")
    text = (b.logs / f"{logname}.log").read_text()
    steps = {}
    for line in reversed(text.splitlines()):  # "  fetch 0.0 s, venv 4.1 s, …"
        found = re.findall(r"(\w+) ([0-9.]+) s", line)
        if len(found) >= 3 and line.startswith("  "):
            steps = {k: float(v) for k, v in found}
            break
    return {"seconds": round(seconds, 2), "steps": steps, "load_before": load, "load_after": load_average()}


def phase_b(b: Bench) -> None:
    """(b) cold: every cache empty, a new prefix; wheels come from PyPI."""
    for d in (b.cache, b.root / "cold"):
        shutil.rmtree(d, ignore_errors=True)
    log("(b) hpcstack cold: empty caches, downloads from PyPI, Horovod compiled …")
    b.save("b", _hpcstack_install(b, "cold", "b-cold"))
    b.save("cache_bytes", du_bytes(b.cache))


def phase_c(b: Bench) -> None:
    """(c) warm: the caches of (b), a new prefix (and so a new stage dir)."""
    shutil.rmtree(b.root / "warm", ignore_errors=True)
    log("(c) hpcstack warm: caches filled, new prefix …")
    result = _hpcstack_install(b, "warm", "c-warm")
    logs = b.install_root("warm").rglob("build.log")  # pathlib's glob enters hidden directories
    result["horovod_reused"] = any("reusing the wheel built before" in _read(f) for f in logs)
    b.save("c", result)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def phase_e(b: Bench, runs: int = 5) -> None:
    """(e) no-op re-run of the warm stack: median of ``runs``, then one under cProfile."""
    log(f"(e) no-op re-run × {runs} …")
    times = []
    for i in range(runs):
        seconds, proc = timed([*b.hpcstack, "install", STACK, *b.stack_args("warm")], env=clean_env(),
                              capture=True)
        if "up to date" not in proc.stderr:
            raise RuntimeError(f"re-run {i} was not a no-op:\n{proc.stderr[-2000:]}")
        times.append(seconds)
    b.save("e", {"median": round(statistics.median(times), 3), "runs": [round(t, 3) for t in times],
                 "breakdown": _noop_profile(b)})


def _noop_profile(b: Bench) -> dict:
    """Where a no-op's time goes: cProfile's cumulative seconds of the main phases."""
    prof = b.root / "noop.prof"
    code = ("import cProfile, sys, time\n"
            "t0 = time.perf_counter()\n"
            "import hpcstack.cli\n"
            "t1 = time.perf_counter()\n"
            f"sys.argv = ['hpcstack', 'install', {STACK!r}] + {b.stack_args('warm')!r}\n"
            f"cProfile.run('hpcstack.cli.main(sys.argv[1:])', {str(prof)!r})\n"
            "print('IMPORT', t1 - t0)\n")
    interp = _hpcstack_python(b)
    start = time.monotonic()
    proc = run([interp, "-c", code], env=clean_env(), capture=True, check=False)
    total = time.monotonic() - start
    out = {"total_with_profiler": round(total, 3)}
    m = re.search(r"IMPORT ([0-9.]+)", proc.stdout)
    if m:
        out["import_hpcstack"] = round(float(m.group(1)), 3)
    start = time.monotonic()
    run([interp, "-c", "pass"], env=clean_env(), capture=True)
    out["python_startup"] = round(time.monotonic() - start, 3)
    if not prof.is_file():
        return out
    import pstats

    stats = pstats.Stats(str(prof))
    wanted = {"build_environment": "module tool: site modules into the build environment (each call)",
              "detect_python_version": "python3 version detection",
              "module_env": "one modulecmd call",
              "load_site": "site config", "load_recipe": "recipe", "resolve": "resolve the plan",
              "step_hashes": "step hashes", "pending": "done-checks", "pending_steps": "done-checks"}
    for (file, line, func), (cc, nc, tt, ct, callers) in stats.stats.items():
        if func in wanted and re.search(r"/hpcstack/(components/)?[^/]+\.py$", file):
            key = f"{func} ({os.path.basename(file)})"
            out[key] = {"seconds": round(ct, 3), "calls": nc, "what": wanted[func]}
    return out


def _hpcstack_python(b: Bench) -> str:
    """The interpreter of the hpcstack command (its shebang), for the profile."""
    first = b.hpcstack[0]
    if first.endswith(("python", "python3")) or re.search(r"python3?(\.\d+)?$", first):
        return first
    with open(first) as f:
        line = f.readline()
    return line[2:].strip().split()[0] if line.startswith("#!") else sys.executable


def _floor_once(b: Bench, tag: str) -> dict:
    """The uv floor once: the lock into a fresh ``--without-pip`` venv (made before the clock
    starts), then the cached Horovod wheel (copy + ``uv pip install``), as hpcstack's install does."""
    base = b.results["base_python"]
    work = b.root / f"floor-{tag}"
    shutil.rmtree(work, ignore_errors=True)
    venv = work / "venv"
    run([base, "-m", "venv", "--without-pip", str(venv)], env=clean_env())
    py = venv / "bin" / "python"
    lock_s, _ = timed(b.uv_install(py, "--require-hashes", "-r", str(LOCK)), env=clean_env(),
                      logfile=b.logs / "w-floor.log")
    start = time.monotonic()
    (work / "dist").mkdir()
    shutil.copy(b.horovod_wheel(), work / "dist")
    run(b.uv_install(py, "--reinstall-package", "horovod", "--no-deps", "--no-index", "--find-links",
                     str(work / "dist"), "horovod==0.28.1"), env=clean_env(), logfile=b.logs / "w-floor.log")
    reuse_s = time.monotonic() - start
    return {"lock": round(lock_s, 2), "reuse": round(reuse_s, 2), "floor": round(lock_s + reuse_s, 2)}


def phase_w(b: Bench, repeat: int = 5) -> None:
    """Warm install against its floor, side by side: ``repeat`` rounds of the uv floor
    (:func:`_floor_once`) and ``hpcstack install`` into a new, empty install root with the same
    warm caches, so that the load of a shared machine weighs on both alike; then the no-op
    re-install of the last one (median of 5). Reports medians and the ratio of medians.

    Each round first removes what the last one made and flushes it to disk (``sync``), and the
    two alternate which goes first, so that neither pays for the other's deletions, dirty pages
    or a warmer page cache."""
    rounds = []
    for i in range(repeat):
        first = "floor" if i % 2 == 0 else "install"
        log(f"(w) round {i + 1}/{repeat}: uv floor and hpcstack install into an empty install root "
            f"({first} first) …")
        result = {}
        for what in (("floor", "install") if first == "floor" else ("install", "floor")):
            for old in b.root.glob("floor-*"):
                shutil.rmtree(old, ignore_errors=True)
            if what == "install":
                shutil.rmtree(b.root / "warm", ignore_errors=True)
            os.sync()
            if what == "floor":
                result["floor"] = _floor_once(b, str(i))
            else:
                inst = _hpcstack_install(b, "warm", f"w-install-{i}")
                logs = b.install_root("warm").rglob("build.log")
                inst["horovod_reused"] = any("reusing the wheel built before" in _read(f) for f in logs)
                result["install"] = inst
        rounds.append({**result, "first": first, "load": load_average()})
    noop = []
    for _ in range(5):
        seconds, proc = timed([*b.hpcstack, "install", STACK, *b.stack_args("warm")], env=clean_env(),
                              capture=True)
        if "up to date" not in proc.stderr:
            raise RuntimeError(f"re-install was not a no-op:\n{proc.stderr[-2000:]}")
        noop.append(round(seconds, 3))
    b.save("w", {"rounds": rounds, "noop": noop})


def _records(prefix_root: Path) -> dict[str, float]:
    """The seconds of each step recorded under an install root (``.hpcstack/steps/*.json``)."""
    out = {}
    for rec in prefix_root.rglob(".hpcstack/steps/*.json"):
        try:
            data = json.loads(rec.read_text())
            out[data["step"]] = data["seconds"]
        except (OSError, ValueError, KeyError):
            pass
    return out


def phase_o(b: Bench, repeat: int = 5) -> None:
    """(o) The cold-source overlap: Horovod's sdist downloaded from PyPI into an
    empty download cache, with an empty build cache (so the patch step unpacks and patches it),
    and the wheels from the warm uv cache (the 2.8 GB need not come again): ``sequential`` runs
    ``--stop-after patch`` (fetch, venv, wheels, patch one after the other: with --stop-after
    nothing overlaps); ``overlapped`` runs the install and kills it at the first action of the
    build step (``HPCSTACK_FAILPOINT=build:0``), which starts only once the background (fetch,
    patch) has finished. Each from an empty install root, ``repeat`` rounds, alternating."""
    import yaml

    site = b.root / "site-cold.yaml"
    data = yaml.safe_load(b.site.read_text())
    data["cache_dir"] = str(b.root / "cold-cache")
    data.setdefault("installer", {})["wheel_cache"] = str(b.uv_cache)
    site.write_text(yaml.safe_dump(data, sort_keys=False))
    rounds = []
    for i in range(repeat):
        result = {}
        for mode in (("sequential", "overlapped") if i % 2 == 0 else ("overlapped", "sequential")):
            for old in (b.root / "cold-cache", b.root / "cold"):
                shutil.rmtree(old, ignore_errors=True)
            os.sync()
            log(f"(o) round {i + 1}/{repeat}: {mode}, Horovod's sources cold …")
            argv = [*b.hpcstack, "install", STACK, "--site", str(site), "--prefix", str(b.root / "cold" / "sw"),
                    "--module-root", str(b.root / "cold" / "mf")]
            env = clean_env()
            if mode == "sequential":
                argv += ["--stop-after", "patch"]
            else:
                env["HPCSTACK_FAILPOINT"] = "build:0"
            load = load_average()
            seconds, proc = timed(argv, env=env, check=False, logfile=b.logs / f"o-{mode}-{i}.log")
            steps = _records(b.root / "cold" / "sw")
            ok = set(steps) >= {"fetch", "venv", "wheels", "patch"} and not (b.root / "cold" / "mf" / STACK).exists()
            if not ok:
                raise RuntimeError(f"(o) {mode}: the steps up to patch did not all run: {steps} (log {b.logs})")
            result[mode] = {"seconds": round(seconds, 2), "steps": steps, "load": load}
        rounds.append(result)
    b.save("o", {"rounds": rounds})


def report_o(o: dict | None) -> list[str]:
    """Lines for phase o: what the overlap of the sources with the wheels saves."""
    if not o:
        return []
    med = statistics.median
    rounds = o["rounds"]
    seq = med(x["sequential"]["seconds"] for x in rounds)
    ovl = med(x["overlapped"]["seconds"] for x in rounds)
    hidden = med(x["sequential"]["steps"]["fetch"] + x["sequential"]["steps"]["patch"] for x in rounds)
    hidden_o = med(x["overlapped"]["steps"]["fetch"] + x["overlapped"]["steps"]["patch"] for x in rounds)
    alongside = med(x["overlapped"]["steps"]["venv"] + x["overlapped"]["steps"]["wheels"] for x in rounds)
    return ["", f"  (o) Horovod's sources cold (sdist from PyPI, unpack, 3 patches), wheels warm; {len(rounds)} rounds (medians):",
            f"      one after the other (--stop-after patch): {seq:.2f} s, of which fetch + patch {hidden:.2f} s",
            f"      overlapped (fetch, patch in the background; killed as build starts): {ovl:.2f} s; "
            f"fetch + patch {hidden_o:.2f} s ran beside venv + wheels {alongside:.2f} s",
            f"      saved: {seq - ovl:.2f} s end to end (per round: "
            + ", ".join(f"{x['sequential']['seconds'] - x['overlapped']['seconds']:.2f}" for x in rounds) + "); "
            f"the overlapped work itself: {hidden:.2f} s",
            "      steps per round (s): " + "; ".join(
                f"{m[:3]} " + ", ".join(f"{k} {v}" for k, v in x[m]["steps"].items() if k in ("fetch", "venv", "wheels", "patch"))
                for x in rounds for m in ("sequential", "overlapped"))]


def phase_d(b: Bench) -> None:
    """(d) uv alone: the lock into a fresh venv with hpcstack's uv options; then the Horovod wheel."""
    base = b.results["base_python"]
    venv = b.root / "uv-alone" / "venv"
    shutil.rmtree(venv.parent, ignore_errors=True)
    log("(d) uv pip install of the lock into a fresh venv …")
    venv_seconds, _ = timed([base, "-m", "venv", str(venv)], env=clean_env())
    py = venv / "bin" / "python"
    seconds, _ = timed(b.uv_install(py, "--require-hashes", "-r", str(LOCK)), env=clean_env(),
                       logfile=b.logs / "d-uv.log")
    wheel = b.horovod_wheel()
    dist = b.root / "uv-alone" / "dist"
    start = time.monotonic()
    dist.mkdir(parents=True)
    shutil.copy(wheel, dist)
    run(b.uv_install(py, "--reinstall-package", "horovod", "--no-deps", "--no-index", "--find-links",
                     str(dist), "horovod==0.28.1"), env=clean_env(), logfile=b.logs / "d-uv.log")
    reuse = time.monotonic() - start
    b.save("d", {"seconds": round(seconds, 2), "venv_seconds": round(venv_seconds, 2),
                 "reuse_seconds": round(reuse, 2), "load": load_average()})


def plain_venv(b: Bench) -> Path:
    """The plain venv of (g), as deep in the tree as the stack's venv: torch's imports call
    ``os.path.realpath`` on every module file (``inspect.getmodule``), one ``lstat`` per path
    component, so a shallower venv would make fewer stat calls for that reason alone."""
    return b.root / "plain" / "sw" / "pytorch" / "2.3.1-gpu" / "venv"


def phase_plain(b: Bench) -> None:
    """The plain venv of (g): same lock and Horovod wheel, uv's defaults (no bytecode, no PYTHONPATH)."""
    base = b.results["base_python"]
    venv = plain_venv(b)
    shutil.rmtree(b.root / "plain", ignore_errors=True)
    log("(g) plain venv: the same packages with uv's defaults …")
    run([base, "-m", "venv", "--without-pip", str(venv)], env=clean_env())
    py = venv / "bin" / "python"
    run(b.uv_install(py, "--require-hashes", "-r", str(LOCK), compile_bytecode=False, link_mode=None),
        env=clean_env(), logfile=b.logs / "plain.log")
    run(b.uv_install(py, "--no-deps", str(b.horovod_wheel()), compile_bytecode=False, link_mode=None),
        env=clean_env(), logfile=b.logs / "plain.log")


def _strace_counts(trace: Path, foreign: str | None = None) -> dict:
    """Count open and stat calls (all processes) and .pyc files written, from an ``strace -f`` log;
    with ``foreign``, also the calls that touch paths under it (another stack's prefix)."""
    opens = stats = readlinks = pyc = elsewhere = 0
    files: set[str] = set()
    for line in trace.read_text(errors="replace").splitlines():
        if foreign and foreign in line:
            elsewhere += 1
        m = re.match(r"^(?:\[pid\s+)?\d*\]?\s*(\w+)\(", line)
        if not m:
            continue
        call = m.group(1)
        if call in OPEN_CALLS:
            opens += 1
        elif call in STAT_CALLS:
            stats += 1
        elif call in READLINK_CALLS:
            readlinks += 1
        if call in OPEN_CALLS | STAT_CALLS | READLINK_CALLS:
            path = re.search(r'"([^"]*)"', line)
            if path:
                files.add(path.group(1))
        elif call.startswith("rename") and re.search(r'\.pyc"\)?\s*=\s*0', line):
            pyc += 1  # Python writes <name>.pyc.<id> and renames it over <name>.pyc
    out = {"open": opens, "stat": stats, "readlink": readlinks, "open_stat": opens + stats,
           "metadata": opens + stats + readlinks, "paths": len(files), "pyc_written": pyc}
    if foreign:
        out["calls_under_" + os.path.basename(foreign)] = elsewhere
    return out


def _strace_import(b: Bench, script_prefix: str, name: str, env: dict) -> dict:
    trace = b.root / f"strace-{name}.txt"
    calls = ",".join(sorted(OPEN_CALLS | STAT_CALLS | READLINK_CALLS | {"rename", "renameat", "renameat2"}))
    bash(script_prefix + f"strace -f -qq -e trace={calls} -o {shlex.quote(str(trace))} "
         f"python -c {shlex.quote(IMPORT)}\n", env=env, cwd=b.root / "empty")
    return _strace_counts(trace, foreign=str(b.root / "cold"))


def _wall_import(b: Bench, script_prefix: str, env: dict, runs: int) -> list[float]:
    out = bash(script_prefix + f"for i in $(seq {runs}); do t0=$EPOCHREALTIME; python -c {shlex.quote(IMPORT)}; "
               "t1=$EPOCHREALTIME; echo \"T $t0 $t1\"; done\n", env=env, cwd=b.root / "empty", capture=True)
    return [float(b_) - float(a_) for a_, b_ in re.findall(r"^T ([0-9.]+) ([0-9.]+)$", out.stdout, re.M)]


def phase_g(b: Bench, runs: int = 5) -> None:
    """(g) import torch, horovod.torch: under the module vs the plain venv; syscalls and .pyc."""
    if not shutil.which("strace"):
        raise RuntimeError("strace missing (apt-get install strace)")
    (b.root / "empty").mkdir(exist_ok=True)
    prefix = b.stack_prefix("warm")
    markers = [m for m in b.install_root("warm").rglob("install.json") if m.parent.name == "steps"]
    written_by_install = _pyc_newer_than(prefix, markers[0]) if markers else None
    env = clean_env()
    under_module = b.module_script(b.module_root("warm"), f"module load {STACK} || exit 1\n")
    plain_bin = plain_venv(b) / "bin"
    plain = f"export PATH={shlex.quote(str(plain_bin))}:$PATH\nunset PYTHONPATH\n"
    log("(g) import under the module and in the plain venv (strace, wall time) …")
    result = {"module_first": _strace_import(b, under_module, "module-1", env),
              "module": _strace_import(b, under_module, "module-2", env),
              "plain_first": _strace_import(b, plain, "plain-1", env),
              "plain": _strace_import(b, plain, "plain-2", env)}
    result["module_wall"] = _wall_import(b, under_module, env, runs)
    result["plain_wall"] = _wall_import(b, plain, env, runs)
    result["pyc_written_after_install_step"] = written_by_install
    result["stack_py_without_pyc"] = _py_without_pyc(prefix)
    b.save("g", result)


def _pyc_newer_than(prefix: Path, marker: Path) -> int | None:
    """``.pyc`` files in the stack written after the install step (e.g. by the sanity check's imports)."""
    if not marker.exists():
        return None
    proc = run(["find", "-L", str(prefix / "venv"), "-name", "*.pyc", "-newer", str(marker)],
               capture=True, check=False)
    return len(proc.stdout.split())


def _py_without_pyc(prefix: Path) -> int:
    """``.py`` files under the stack's site-packages without a ``__pycache__/<name>.cpython-*.pyc``."""
    missing = 0
    for sp in glob.glob(str(prefix / "venv" / "lib" / "python*" / "site-packages")):
        for dirpath, _dirs, files in os.walk(sp, followlinks=True):
            pyc = set(os.listdir(os.path.join(dirpath, "__pycache__"))) if "__pycache__" in _dirs else set()
            for f in files:
                if f.endswith(".py") and not any(p.startswith(f[:-3] + ".") and p.endswith(".pyc") for p in pyc):
                    missing += 1
    return missing


def phase_f(b: Bench, runs: int = 40) -> None:
    """(f) ``module load pytorch/2.3.1-gpu`` vs a trivial modulefile, interleaved, median of ``runs``.

    Also, to see where a difference comes from: the site's base Python module alone (which the
    stack's modulefile ``depends-on``), and a trivial modulefile that ``depends-on`` it too.
    """
    import yaml

    base_module = yaml.safe_load(b.site.read_text())["modules"]["base"]
    trivial = b.root / "trivial-mf"
    (trivial / "trivial").mkdir(parents=True, exist_ok=True)
    (trivial / "trivial" / "1.0").write_text("#%Module1.0\nsetenv HPCSTACK_BENCH_TRIVIAL 1\n")
    (trivial / "trivial" / "dep").write_text(f"#%Module1.0\ndepends-on {base_module}\n"
                                             "setenv HPCSTACK_BENCH_TRIVIAL 1\n")
    log(f"(f) module load × {runs} …")
    cases = {"S": STACK, "T": "trivial/1.0", "B": base_module, "D": "trivial/dep"}
    loop = "".join(f"  t0=$EPOCHREALTIME; module load {m}; t1=$EPOCHREALTIME; module purge; echo \"{k} $t0 $t1\"\n"
                   for k, m in cases.items())
    body = (f"module use --append {shlex.quote(str(trivial))}\n"
            f"module load {STACK} && [ -n \"$HPCSTACK_PYTORCH_ROOT\" ] || exit 3\nmodule purge\n"
            f"for i in $(seq {runs}); do\n{loop}done\n")
    out = bash(b.module_script(b.module_root("warm"), body), env=clean_env(), capture=True).stdout

    def median_ms(key: str) -> float:
        times = [float(y) - float(x) for x, y in re.findall(rf"^{key} ([0-9.]+) ([0-9.]+)$", out, re.M)]
        return round(1000 * statistics.median(times), 1)

    b.save("f", {"stack_ms": median_ms("S"), "trivial_ms": median_ms("T"), "base_ms": median_ms("B"),
                 "trivial_dep_ms": median_ms("D"), "base_module": base_module, "runs": runs})


def phase_a(b: Bench) -> None:
    """(a) the Cirrus method: separate ``pip install --user`` calls, then Horovod from source.

    As in the Cirrus instructions (docs/notes.md): PYTHONUSERBASE, PATH and PYTHONPATH into the prefix, PIP_CACHE_DIR in it,
    one ``pip install --user`` per package, Horovod with ``pip install --user --no-cache-dir``.
    Differences, all in the baseline's favour or forced by this machine: PyPI instead of the
    cu121 index (same torch binary); the user's pip config is ignored (``PIP_CONFIG_FILE``: this
    machine's adds local mirrors with other versions); Debian's Python needs
    ``PIP_BREAK_SYSTEM_PACKAGES`` (PEP 668) and lacks ``wheel``, installed in one more call with
    Horovod's build requirements, so the build can use ``--no-build-isolation`` (docs/notes.md); the
    wheels come from a local wheelhouse (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``) that the same
    calls filled beforehand with ``pip download`` against PyPI (not timed) — pip's HTTP cache
    stores nothing here, and pip prefers an index's copy of a file to a find-links one; Horovod
    gets the localhost site's settings and ``MAKEFLAGS=-j<cores>``.
    """
    base = b.results["base_python"]
    sdist = b.cache / "sources" / "horovod-0.28.1.tar.gz"
    if not sdist.is_file():
        raise RuntimeError(f"{sdist} missing (run phase b first: it downloads the sdist)")
    work = b.root / "cirrus"
    shutil.rmtree(work, ignore_errors=True)
    wheelhouse = b.root / "wheelhouse"
    pyver = run([base, "-c", "import platform; print(platform.python_version())"], capture=True).stdout.strip()
    python_dir = work / "python"
    userbase = python_dir / pyver
    site = userbase / "lib" / f"python{pyver.rsplit('.', 1)[0]}" / "site-packages"
    env = clean_env(PIP_CACHE_DIR=str(python_dir / ".cache" / "pip"), PYTHONUSERBASE=str(userbase),
                    PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS=str(wheelhouse),
                    PIP_BREAK_SYSTEM_PACKAGES="1",       # Debian's python3 is externally managed (PEP 668)
                    PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env["PATH"] = f"{userbase / 'bin'}:{env['PATH']}"
    env["PYTHONPATH"] = str(site)
    if not (wheelhouse / ".primed").exists():
        # Not timed. Each call is resolved with the torch family pinned as the calls before it
        # installed them, so the wheelhouse holds what the sequence of installs picks.
        log("(a) filling a wheelhouse for the Cirrus method (pip download, not timed) …")
        wheelhouse.mkdir(parents=True, exist_ok=True)
        pins = b.root / "cirrus-pins.txt"
        pins.write_text("torch==2.3.1\ntorchvision==0.18.1\ntorchaudio==2.3.1\n")
        for req in [*CIRRUS_PIP, " ".join(CIRRUS_BUILD_PREREQS)]:
            run([base, "-m", "pip", "download", "--dest", str(wheelhouse), "-c", str(pins), *req.split()],
                env=env, logfile=b.logs / "a-prime.log")
        (wheelhouse / ".primed").touch()
    env.update(PIP_NO_INDEX="1")  # from here on: the wheelhouse only, no network
    src_parent = work / "src"
    src_parent.mkdir(parents=True)
    run(["tar", "-xzf", str(sdist), "-C", str(src_parent)])
    src = src_parent / "horovod-0.28.1"
    run(["patch", "-p1", "-i", str(PATCH)], cwd=src, logfile=b.logs / "a-cirrus.log")
    log("(a) the Cirrus method: 10 pip install --user calls + build prerequisites + Horovod …")
    load = load_average()
    times = {}
    start = time.monotonic()
    for req in CIRRUS_PIP:
        t, _ = timed([base, "-m", "pip", "install", "--user", req], env=env, cwd=work,
                     logfile=b.logs / "a-cirrus.log")
        times[req] = round(t, 1)
    t, _ = timed([base, "-m", "pip", "install", "--user", *CIRRUS_BUILD_PREREQS], env=env,
                 logfile=b.logs / "a-cirrus.log")
    times["build prerequisites"] = round(t, 1)
    t, _ = timed([base, "-m", "pip", "install", "--user", "--no-cache-dir", "--no-build-isolation", str(src)],
                 env={**env, **HOROVOD_ENV, "MAKEFLAGS": f"-j{os.cpu_count()}"}, cwd=work,
                 logfile=b.logs / "a-cirrus.log")
    times["horovod"] = round(t, 1)
    total = time.monotonic() - start
    check = run([base, "-c", IMPORT + "; print('ok')"], env=env, capture=True, check=False)
    b.save("a", {"seconds": round(total, 2), "calls": times, "imports_ok": check.returncode == 0,
                 "load_before": load, "load_after": load_average(),
                 "downloaded_from_network": _network_downloads(b.logs / "a-cirrus.log")})


def _network_downloads(logfile: Path) -> int:
    """How many files pip downloaded from an index during (a) (not from the wheelhouse)."""
    return len(re.findall(r"^\s*Downloading ", _read(logfile), re.M))


# ------------------------------------------------------------------------------------- report

def report(r: dict) -> str:
    """The table, the targets and the notes, as text (also what docs/benchmarks.md records)."""
    lines = []
    m = r.get("machine", {})
    lines.append(f"machine: {m.get('os')}, kernel {m.get('kernel')}, {m.get('cpus')} cores, "
                 f"{m.get('memory_gib')} GiB; {m.get('python')}; {m.get('uv')}; {m.get('pip')}; {m.get('date')}")
    a = r.get("a", {}).get("seconds")

    def row(label, seconds, extra="", ratio=True):
        if seconds is None:
            lines.append(f"  {label:<58} {'—':>9}")
            return
        ratio = f"{a / seconds:8.1f}x" if ratio and a and seconds else ""
        lines.append(f"  {label:<58} {seconds:9.{2 if seconds < 10 else 1}f} {ratio:>9}  {extra}".rstrip())

    lines.append("")
    lines.append(f"  {'variant':<58} {'seconds':>9} {'vs (a)':>9}")
    row("(a) Cirrus method: 10+1 pip --user calls + Horovod build", a,
        "(baseline)" if a else "")
    b = r.get("b", {})
    row("(b) hpcstack cold (empty caches, wheels from PyPI)", b.get("seconds"))
    c = r.get("c", {})
    row("(c) hpcstack warm (caches filled, new prefix)", c.get("seconds"),
        "Horovod wheel reused" if c.get("horovod_reused") else ("Horovod REBUILT" if c else ""))
    d = r.get("d", {})
    row("(d) uv pip install of the lock, fresh venv, alone", d.get("seconds"))
    row("    + Horovod wheel reuse (copy + uv install)", d.get("reuse_seconds"), ratio=False)
    floor = (d["seconds"] + d["reuse_seconds"]) if d else None
    row("    = floor for (c)", floor)
    e = r.get("e", {})
    row(f"(e) no-op re-run (median of {len(e.get('runs', []))})", e.get("median"), ratio=False)
    lines.append("")
    f = r.get("f")
    if f:
        lines.append(f"  (f) module load {STACK}: {f['stack_ms']:.1f} ms, trivial modulefile: "
                     f"{f['trivial_ms']:.1f} ms (median of {f['runs']}), ratio {f['stack_ms'] / f['trivial_ms']:.2f}")
        if "base_ms" in f:
            lines.append(f"      for comparison: {f['base_module']} alone (the stack's depends-on) {f['base_ms']:.1f} ms; "
                         f"a trivial modulefile that depends-on it {f['trivial_dep_ms']:.1f} ms "
                         f"(stack / that: {f['stack_ms'] / f['trivial_dep_ms']:.2f})")
    g = r.get("g")
    if g:
        mw = statistics.median(g["module_wall"]) if g["module_wall"] else float("nan")
        pw = statistics.median(g["plain_wall"]) if g["plain_wall"] else float("nan")
        lines.append(f"  (g) python -c \"{IMPORT}\"")
        lines.append(f"      {'':<36} {'under module':>14} {'plain venv':>12} {'plain, 1st':>11}")
        lines.append(f"      {'wall time, median of %d (s)' % len(g['module_wall']):<36} {mw:14.2f} {pw:12.2f}")
        for key, label in (("open", "open/openat calls"), ("stat", "stat-family calls"),
                           ("readlink", "readlink calls"), ("open_stat", "open + stat"),
                           ("metadata", "open + stat + readlink"), ("paths", "distinct paths named"),
                           ("pyc_written", ".pyc files written")):
            if key in g["module"]:
                lines.append(f"      {label:<36} {g['module'][key]:14d} {g['plain'][key]:12d} {g['plain_first'][key]:11d}")
        lines.append(f"      (first import under the module: {g['module_first']['pyc_written']} .pyc written; "
                     f"stack .py files without a .pyc: {g['stack_py_without_pyc']}; "
                     f".pyc written after the install step: {g['pyc_written_after_install_step']})")
        if "calls_under_cold" in g["module"]:
            lines.append(f"      (calls under the module touching the cold stack, whose venv built the reused "
                         f"Horovod wheel: {g['module']['calls_under_cold']})")
    lines += report_w(r.get("w"))
    lines += report_o(r.get("o"))
    lines.append("")
    lines.append("targets:")
    lines += targets(r)
    if b.get("steps") or c.get("steps"):
        lines.append("")
        lines.append("hpcstack steps (s):")
        for name, res in (("cold", b), ("warm", c)):
            if res.get("steps"):
                lines.append(f"  {name:<5} " + ", ".join(f"{k} {v:.1f}" for k, v in res["steps"].items()))
    if e.get("breakdown"):
        lines.append("")
        lines.append("no-op re-run, where the time goes (cProfile, cumulative s):")
        for k, v in e["breakdown"].items():
            lines.append(f"  {k}: {v['seconds']} s in {v['calls']} call(s) — {v['what']}" if isinstance(v, dict)
                         else f"  {k}: {v} s")
    if r.get("a", {}).get("calls"):
        lines.append("")
        lines.append("(a) per call (s): " + ", ".join(f"{k} {v}" for k, v in r["a"]["calls"].items()))
    lines.append("")
    lines.append("notes: downloads shared by the variants come from local caches: (a) from a wheelhouse "
                 "filled by `pip download` beforehand (not timed; pip's HTTP cache stores nothing here) — "
                 f"files (a) still downloaded: {r.get('a', {}).get('downloaded_from_network', '?')}; (c) and "
                 "(d) from the uv cache that (b) filled. (b) downloads the lock's wheels (~2.8 GB) from PyPI. Load averages "
                 f"(1/5/15 min) — (a): {r.get('a', {}).get('load_before', '?')}, (b): "
                 f"{b.get('load_before', '?')}, (c): {c.get('load_before', '?')}: the machine is shared "
                 "and the timings are noisy.")
    return "\n".join(lines)


def report_w(w: dict | None) -> list[str]:
    """Lines for phase w: the warm install against the uv floor, medians of the rounds."""
    if not w:
        return []
    rounds = w["rounds"]
    med = statistics.median
    floor = med(x["floor"]["floor"] for x in rounds)
    inst = med(x["install"]["seconds"] for x in rounds)
    ratios = [x["install"]["seconds"] / x["floor"]["floor"] for x in rounds]
    lines = ["", f"  (w) warm install against the uv floor, side by side, {len(rounds)} rounds (medians):",
             f"      uv floor: uv pip install --require-hashes -r {LOCK.name} into a --without-pip venv "
             f"{med(x['floor']['lock'] for x in rounds):.2f} s + cached Horovod wheel "
             f"{med(x['floor']['reuse'] for x in rounds):.2f} s = {floor:.2f} s",
             f"      hpcstack install {STACK} (new build, empty install root, warm caches): {inst:.2f} s"
             f"{'' if all(x['install'].get('horovod_reused') for x in rounds) else '  (Horovod REBUILT in some round)'}",
             f"      ratio: {inst / floor:.2f}x (per round: {', '.join(f'{x:.2f}' for x in ratios)})",
             f"      spread: floor {fmt([x['floor']['floor'] for x in rounds])}",
             f"              install {fmt([x['install']['seconds'] for x in rounds])}",
             f"              install / floor per round {fmt(ratios, 'x')}"]
    steps: dict[str, list[float]] = {}
    for x in rounds:
        for k, v in x["install"].get("steps", {}).items():
            steps.setdefault(k, []).append(v)
    if steps:
        lines.append("      steps (median s): " + ", ".join(f"{k} {med(v):.1f}" for k, v in steps.items()))
        # the wheels step is the floor's own uv command: what hpcstack adds is everything else
        extra = med(x["install"]["seconds"] - x["install"]["steps"].get("wheels", 0) for x in rounds)
        lines.append(f"      hpcstack besides its uv command (install minus the wheels step, median): {extra:.2f} s; "
                     f"floor + that: {(floor + extra) / floor:.2f}x the floor")
    lines.append(f"      no-op re-install: median {med(w['noop']):.3f} s of {len(w['noop'])} ({', '.join(map(str, w['noop']))}); "
                 f"{fmt(w['noop'], 's', 3)}")
    lines.append("      load averages after each round: " + "; ".join(x["load"] for x in rounds))
    return lines


def targets(r: dict) -> list[str]:
    out = []

    def verdict(ok: bool | None, text: str) -> None:
        # one run of each side: an observation, not a verdict of 5 alternating rounds
        out.append(f"  [{'below in 1 run' if ok else 'above in 1 run' if ok is not None else 'n/a'}] {text}")

    w = r.get("w")
    if w:
        med = statistics.median
        ratios = [x["install"]["seconds"] / x["floor"]["floor"] for x in w["rounds"]]
        out.append("  " + rounds_verdict(ratios, 1.25, "(w) warm install / the uv floor, per round"))
        noop = w["noop"]
        word = "HOLDS" if med(noop) < 0.5 else "MISSED"
        out.append(f"  [{word}] (w) no-op re-install < 0.5 s: {fmt(noop, 's', 3)}; "
                   f"{sum(x < 0.5 for x in noop)} of {len(noop)} runs under 0.5 s")
    a, c, d = r.get("a", {}).get("seconds"), r.get("c", {}).get("seconds"), r.get("d")
    if c and d:
        floor = d["seconds"] + d["reuse_seconds"]
        verdict(c <= 1.25 * floor, f"(c) <= 1.25 x ((d) + reuse): {c:.1f} s vs 1.25 x {floor:.1f} = "
                                   f"{1.25 * floor:.1f} s ({c / floor:.2f}x the floor)")
    else:
        verdict(None, "(c) <= 1.25 x ((d) + reuse)")
    if a and c:
        verdict(a / c >= 5, f"(c) at least 5x faster than (a): {a / c:.1f}x ({a:.0f} s vs {c:.1f} s)")
    else:
        verdict(None, "(c) at least 5x faster than (a)")
    e = r.get("e", {}).get("median")
    verdict(None if e is None else e < 2, f"(e) no-op re-run < 2 s: {e} s" if e is not None else "(e) < 2 s")
    f = r.get("f")
    if f:
        ratio = f["stack_ms"] / f["trivial_ms"]
        verdict(ratio <= 1.2, f"(f) module load <= 1.2 x trivial: {ratio:.2f}x "
                              f"({f['stack_ms']:.1f} ms vs {f['trivial_ms']:.1f} ms)")
    else:
        verdict(None, "(f) module load <= 1.2 x trivial")
    g = r.get("g")
    if g:
        verdict(g["module"]["pyc_written"] == 0 and g["module_first"]["pyc_written"] == 0,
                f"(g) 0 .pyc written under the module: {g['module_first']['pyc_written']} (plain venv, "
                f"first import: {g['plain_first']['pyc_written']})")
        key = "metadata" if "metadata" in g["module"] else "open_stat"
        verdict(g["module"][key] <= g["plain"][key],
                f"(g) {'open+stat+readlink' if key == 'metadata' else 'open+stat'} under the module <= plain venv "
                f"(at most the plain venv's): {g['module'][key]} vs {g['plain'][key]} ({g['module'][key] - g['plain'][key]:+d})")
    else:
        verdict(None, "(g) 0 .pyc written, open/stat <= plain venv")
    return out


# --------------------------------------------------------------------------------------- main

PHASES = {"b": phase_b, "c": phase_c, "e": phase_e, "d": phase_d, "plain": phase_plain,
          "g": phase_g, "f": phase_f, "a": phase_a, "w": phase_w, "o": phase_o}
DEFAULT_ORDER = ["b", "c", "e", "d", "plain", "g", "f", "a"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", default="/var/tmp/hpcstack-bench", help="scratch directory (default: %(default)s)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (default: remove it at the end)")
    p.add_argument("--phases", default=",".join(DEFAULT_ORDER),
                   help="phases to run, in order (default: all: %(default)s); results of earlier "
                        "runs in ROOT/results.json are kept, so single phases can be redone with --keep")
    p.add_argument("--hpcstack", default=None, help="the hpcstack command (default: `hpcstack` on PATH)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON here")
    p.add_argument("--report-only", action="store_true", help="print the table of ROOT/results.json and exit")
    p.add_argument("--warm-from", metavar="CACHE_DIR",
                   help="take warm caches from a site's cache dir (e.g. the machine cache /var/cache/hpcstack): "
                        "its uv cache is used in place (installer.wheel_cache; only read and linked from), its "
                        "Horovod build cache and sources are copied; then `--phases w` measures the warm install "
                        "against the uv floor without a cold install first")
    p.add_argument("--repeat", type=int, default=5, help="alternating rounds of phases w and o (default: %(default)s)")
    p.add_argument("--raw", metavar="FILE", help="also write the printed report to FILE (docs/benchmarks/raw/)")
    args = p.parse_args(argv)

    root = Path(args.root).resolve()
    if any(str(root).startswith(f) for f in FORBIDDEN):
        p.error(f"--root {root}: in use by others ({', '.join(FORBIDDEN)}); pick a scratch directory")
    if args.report_only:
        text = report(json.loads((root / "results.json").read_text()))
        print(text)
        if args.raw:
            Path(args.raw).write_text(text + "\n")
        return 0
    if os.geteuid() != 0:
        p.error("run as root (the localhost site, like scripts/run-tests)")
    hpcstack_cmd = [args.hpcstack] if args.hpcstack else ([shutil.which("hpcstack")] if shutil.which("hpcstack")
                                                           else [sys.executable, "-m", "hpcstack"])
    uv = _find_uv(hpcstack_cmd[0])
    phases = [x for x in args.phases.split(",") if x]
    unknown = [x for x in phases if x not in PHASES]
    if unknown:
        p.error(f"--phases: unknown {unknown} (known: {', '.join(PHASES)})")
    root.mkdir(parents=True, exist_ok=True)
    bench = Bench(root, hpcstack_cmd, uv)
    if args.warm_from:
        src = Path(args.warm_from).resolve()
        if not (src / "uv").is_dir() or not list(src.glob("builds/horovod-*/*/*.whl")):
            p.error(f"--warm-from {src}: no uv/ cache or no cached Horovod wheel under builds/")
        bench.uv_cache = src / "uv"
        for sub in ("builds", "sources"):
            if not (bench.cache / sub).exists():
                shutil.copytree(src / sub, bench.cache / sub)
    PHASES["w"] = lambda b: phase_w(b, args.repeat)
    PHASES["o"] = lambda b: phase_o(b, args.repeat)
    setup(bench)
    failed = []
    for name in phases:
        try:
            PHASES[name](bench)
        except Exception as exc:  # report, go on with the phases that do not need this one
            log(f"phase {name} failed: {exc}")
            failed.append(name)
            bench.save(f"failed_{name}", str(exc)[:2000])
    text = report(bench.results)
    print(text)
    (root / "report.txt").write_text(text + "\n")
    if args.raw:
        Path(args.raw).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(bench.results, indent=1) + "\n")
    if not args.keep:
        log(f"removing {root}")
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


def _find_uv(hpcstack: str) -> str:
    """The uv hpcstack uses: the one installed beside it (its ``uv`` requirement), else this
    interpreter's ``uv`` package, else ``uv`` on PATH."""
    beside = Path(os.path.realpath(hpcstack)).parent / "uv"
    if beside.is_file():
        return str(beside)
    try:
        import uv

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if not found:
            sys.exit("uv not found: pip install uv (hpcstack installs it)")
        return found


if __name__ == "__main__":
    sys.exit(main())
