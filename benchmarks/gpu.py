#!/usr/bin/env python3
"""The recipe's GPU Horovod built and trained on a machine with a GPU.

On a GPU node whose Python already holds a CUDA build of PyTorch (an NGC-style image, a site's
own PyTorch module) and which may have no network, this script:

1. describes the machine as a site config (``<out>/gpu-host.yaml``: the CUDA toolkit of ``nvcc``
   on PATH, the compute capability of GPU 0 as ``cuda.cc_list``, NCCL from the ``nvidia-nccl``
   wheel beside torch, the MPI compiler wrappers when there are any) and loads it with
   :func:`hpcstack.site.load_site`, so the schema checks it as any site;
2. resolves ``pytorch/2.3.1-gpu`` for that site (:func:`hpcstack.install.resolve.resolve`) and
   builds Horovod with exactly the build step's variables (:class:`CachedWheelBuild`'s ``env``:
   ``HOROVOD_GPU_OPERATIONS=NCCL``, ``HOROVOD_CUDA_HOME``, ``HOROVOD_NCCL_HOME``,
   ``HOROVOD_BUILD_CUDA_CC_LIST``, …), from the recipe's sdist and patches, each checked against
   the recipe's sha256, with ``pip wheel --no-build-isolation`` against the machine's torch;
3. reads ``horovodrun --check-build`` with :mod:`hpcstack.install.components.checkbuild` and requires the
   recipe's flags for the site (``[X] NCCL`` included);
4. trains with ``hpcstack-train-benchmark`` on the GPU for each backend (the plain loop with no
   wrapper, Horovod, DDP) and each
   workload of the recipe's validation (``gpu``: ResNet-50 fp32 batch 32; ``gpu-amp``: AMP batch
   128 channels-last; and AMP at batch 32, the setting the ``gpu-amp`` workload replaced),
   launched by hpcstack's own launchers (``horovodrun``, ``torchrun``), the collectives check
   first, and judges each run with :func:`hpcstack.validate.judge.sanity_reasons` (NCCL
   transport required), as ``hpcstack validate`` does.

It is not ``hpcstack install``: the recipe's lock (torch 2.3.1 cu121, 2.8 GB) cannot reach a
machine without network, so the machine's torch stands in for the venv, and the stack's
modulefile and publish are not exercised here (the CI's ``localhost-gpu-build`` site does those
without a GPU). Usage, as on the lent GPU machines (docs/benchmarks.md, "On a GPU")::

    PYTHONPATH=. python3 benchmarks/gpu.py --sdist horovod-0.28.1.tar.gz --out /tmp/gpu-bench \
        [--wheels DIR] [--skip-train] [--runs horovod:gpu,ddp:gpu,...]

Prints a table of img/s per run, the collectives check's verdict and the judge's reasons; writes
``summary.json``, the site config, every run's JSON-lines records and the build log to ``--out``.
Exit status 0 when the build shows every required flag (the runs' verdicts are figures to
record, not a pass/fail of this script).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
RECIPE = "pytorch/2.3.1-gpu"
TRAINER = CHECKOUT / "trainer" / "hpcstack-train-benchmark"
#: (backend, workload) pairs; "gpu-amp32" is the gpu workload with --precision amp; "plain" is the
#: trainer's loop with no wrapper (one process, no launcher), the reference of DDP and Horovod.
DEFAULT_RUNS = ("plain:gpu", "horovod:gpu", "ddp:gpu", "plain:gpu-amp", "horovod:gpu-amp", "ddp:gpu-amp",
                "plain:gpu-amp32", "horovod:gpu-amp32", "ddp:gpu-amp32")
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def sh(command: str) -> str:
    """Run a shell command; return its stdout and stderr, stripped ('' when it fails)."""
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    return (proc.stdout + proc.stderr).strip() if proc.returncode == 0 else ""


def probe(out: Path) -> dict:
    """What the machine offers: GPU, torch, CUDA toolkit, NCCL, MPI and compilers.

    Returns:
        dict: ``gpu`` (name), ``cc`` (e.g. 90), ``torch``, ``torch_cuda``, ``cuda_home``,
        ``nvcc`` (release), ``nccl_dir`` (a directory of ours: ``include/`` and ``lib/`` with
        ``libnccl.so`` linked to the wheel's ``libnccl.so.2``), ``nccl_version``, ``mpicc`` (path
        or None), ``static_cudart`` (bool), ``gcc``, ``cmake``, ``python``.

    Raises:
        SystemExit: no CUDA device, no ``nvcc``, or no ``nccl.h`` beside torch.
    """
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("gpu.py: torch sees no CUDA device")
    major, minor = torch.cuda.get_device_capability(0)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if not nvcc:
        raise SystemExit("gpu.py: no nvcc on PATH or in /usr/local/cuda")
    cuda_home = str(Path(nvcc).resolve().parents[1])
    release = sh(f"{nvcc} --version | sed -n 's/.*release \\([0-9.]*\\).*/\\1/p'")
    headers = [p for base in sys.path if base and os.path.isdir(base)
               for p in glob.glob(os.path.join(base, "nvidia", "**", "nccl.h"), recursive=True)]
    if not headers:
        raise SystemExit("gpu.py: no nvidia/**/nccl.h beside torch (the nvidia-nccl wheel)")
    wheel_root = Path(headers[0]).parents[1]
    library = next(iter(sorted(wheel_root.glob("lib*/libnccl.so*"))), None)
    if library is None:
        raise SystemExit(f"gpu.py: no libnccl.so* under {wheel_root}")
    nccl_dir = out / "nccl"
    shutil.rmtree(nccl_dir, ignore_errors=True)
    (nccl_dir / "lib").mkdir(parents=True)
    (nccl_dir / "include").symlink_to(Path(headers[0]).parent)
    for name in ("libnccl.so", "libnccl.so.2"):
        (nccl_dir / "lib" / name).symlink_to(library)
    defines = dict(line.split()[1:3] for line in Path(headers[0]).read_text().splitlines()
                   if line.startswith("#define NCCL_") and len(line.split()) >= 3)
    return {
        "gpu": torch.cuda.get_device_name(0), "cc": major * 10 + minor,
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_home": cuda_home, "nvcc": release,
        "nccl_dir": str(nccl_dir),
        "nccl_version": ".".join(defines.get(k, "?") for k in ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")),
        "mpicc": shutil.which("mpicc"), "mpirun": sh("mpirun --version | head -1"),
        "static_cudart": os.path.exists(os.path.join(cuda_home, "lib64", "libcudart_static.a")),
        "gcc": sh("gcc --version | head -1"), "cmake": sh("cmake --version | head -1"),
        "python": platform.python_version(), "driver": sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader"),
        "cpus": os.cpu_count(),
    }


def site_config(facts: dict, out: Path) -> Path:
    """Write the machine's site config (``gpu-host``) from :func:`probe`'s facts; return its path."""
    import yaml

    mpi = bool(facts["mpicc"])
    site = {
        "name": "gpu-host",
        "description": f"{facts['gpu']} (CC {facts['cc'] / 10:.1f}); CUDA {facts['nvcc']}, "
                       f"NCCL {facts['nccl_version']}, torch {facts['torch']} of the machine's Python",
        "install_root": str(out / "software"), "module_root": str(out / "modulefiles"),
        "modules": {"tool": "environment-modules", "syntax": "tcl", "init": {}, "use": [],
                    "base": "python", "build": [], "runtime": []},
        "build": {"jobs": None},
        "installer": {"backend": "pip", "wheel_cache": None, "link_mode": "copy",
                      "compile_bytecode": True, "build_cache": False},
        "toolchain": {"cc": "mpicc" if mpi else "gcc", "cxx": "mpicxx" if mpi else "g++",
                      "cuda": {"home": facts["cuda_home"], "version": facts["nvcc"],
                               "cc_list": [facts["cc"]], "static_runtime": facts["static_cudart"]},
                      "nccl": {"home": facts["nccl_dir"]}},
        "launcher": {"command": "horovodrun", "ranks": 1, "env": ROOT_ENV},
    }
    path = out / "gpu-host.yaml"
    path.write_text("# written by benchmarks/gpu.py from this machine's probes\n"
                    + yaml.safe_dump(site, sort_keys=False))
    return path


def build_env(site_path: Path, facts: dict) -> tuple[object, Path, dict]:
    """The recipe's HorovodBuild, its patch directory and the build step's variables for the site.

    Where the machine has no MPI, ``HOROVOD_WITH_MPI`` becomes ``HOROVOD_WITHOUT_MPI`` and CPU
    operations Gloo (said in the summary: the recipe requires ``[X] MPI``, so such a build is a
    GPU-path measurement, not a stack the recipe would publish).
    """
    from hpcstack.install.components.horovod import CudaArchCheck, HorovodBuild
    from hpcstack.install.components.source import CachedWheelBuild
    from hpcstack.install.resolve import resolve
    from hpcstack.recipe import load_recipe, recipe_path
    from hpcstack.site import load_site

    site = load_site(str(site_path))
    recipe = load_recipe(RECIPE, site)
    build = recipe.component(HorovodBuild)
    version = ".".join(facts["python"].split(".")[:2])
    plan = resolve(recipe, site, python_version=version, jobs=facts["cpus"])
    # the build step's wheel build: a CachedWheelBuild, or a plain Run where the build cache is off
    action = next(a for s in plan.steps if s.name == "build" for a in s.actions
                  if isinstance(a, CachedWheelBuild) or "HOROVOD_WITH_PYTORCH" in (getattr(a, "env", None) or {}))
    env = dict(action.env)
    # the build step's preflight: the site's CC list against what this nvcc compiles for
    for check in (a for s in plan.steps if s.name == "build" for a in s.actions if isinstance(a, CudaArchCheck)):
        problems = check.problems(dict(os.environ))
        if problems:
            raise SystemExit("gpu.py: " + "; ".join(problems))
    if not facts["mpicc"]:
        env.pop("HOROVOD_WITH_MPI", None)
        env.update(HOROVOD_WITHOUT_MPI="1", HOROVOD_CPU_OPERATIONS="Gloo")
    return build, recipe_path(RECIPE).parent / "patches", env


def build_horovod(build, patches: Path, env: dict, sdist: Path, out: Path, site_dir: Path) -> dict:
    """Unpack, patch (sha256-checked) and build the wheel; install it into ``site_dir``.

    Returns:
        dict: ``seconds`` (the ``pip wheel`` wall time), ``wheel`` (bytes), ``ok``, ``error``.
    """
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != build.sha256:
        raise SystemExit(f"gpu.py: {sdist}: sha256 {digest}, the recipe says {build.sha256}")
    work = out / "build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    src = work / f"horovod-{build.version}"
    for patch in build.patches:
        path = patches / patch.file
        if hashlib.sha256(path.read_bytes()).hexdigest() != patch.sha256:
            raise SystemExit(f"gpu.py: {path}: sha256 differs from the recipe's")
        if shutil.which("patch"):
            subprocess.run(["patch", "-p1", "-s", "-i", str(path)], cwd=src, check=True)
        else:  # a minimal image: git's patch machinery outside a repository
            subprocess.run(["git", "apply", "-p1", str(path)], cwd=src, check=True)
    run_env = {**os.environ, **env}
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site_dir), os.environ.get("PYTHONPATH")]))
    log = out / "build.log"
    started = time.perf_counter()
    with open(log, "w") as handle:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation",
                               "--no-deps", "--no-index", "-w", str(work / "dist"), str(src)],
                              env=run_env, stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        from hpcstack.install.runner import diagnose

        return {"ok": False, "seconds": seconds, "error": diagnose(log.read_text(errors="replace")) or f"see {log}"}
    wheel = next((work / "dist").glob("horovod-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-compile", "--target", str(site_dir), "--upgrade", str(wheel)], check=True)
    shutil.rmtree(src, ignore_errors=True)
    return {"ok": True, "seconds": seconds, "wheel": wheel.stat().st_size}


def required_flags(build, facts: dict) -> tuple[str, ...]:
    """The ``--check-build`` flags the recipe requires on a CUDA site (``required`` plus the GPU
    operations, as :meth:`HorovodBuild.required_flags`), less MPI on a machine without it."""
    flags = tuple(dict.fromkeys(build.required + (build.gpu_operations,)))
    return flags if facts["mpicc"] else tuple(f for f in flags if f != "MPI")


def check_build(site_dir: Path, required: tuple[str, ...], env: dict) -> dict:
    """``horovodrun --check-build`` of the installed wheel, required as the install requires it
    (:func:`hpcstack.install.components.checkbuild.check_build`: fails closed on output that does not parse).

    Returns:
        dict: ``text`` (the report, or the one-line error) and ``ok``.
    """
    from hpcstack.errors import HpcstackError
    from hpcstack.install.components.checkbuild import check_build as require

    try:
        return {"text": require(str(site_dir / "bin" / "horovodrun"), list(required), env), "ok": True}
    except HpcstackError as error:
        return {"text": str(error), "ok": False}


def plan_of(site):
    """The recipe's validation plan for a run on this host (:func:`hpcstack.validate.plan.plan_validation`)."""
    from hpcstack.recipe import load_recipe
    from hpcstack.validate.plan import PlanOptions, plan_validation

    return plan_validation(site, load_recipe(RECIPE, site), PlanOptions(local=True))


def workload_of(name: str, site) -> dict:
    """The recipe's validation workload ``name``; ``gpu-amp32``: ``gpu`` with AMP."""
    spec = plan_of(site).settings.spec
    if name == "gpu-amp32":
        return {**spec.workload(site, None, "gpu"), "precision": "amp"}
    return spec.workload(site, None, name)


def train(backend: str, workload: str, site, out: Path, env: dict, threads: int) -> dict:
    """One run of the trainer on 1 GPU rank with hpcstack's launcher; its records and verdict."""
    from hpcstack.validate.judge import RunOutcome, measured_figures, sanity_reasons
    from hpcstack.validate.launchers import Allocation, get_launcher

    settings = workload_of(workload, site)
    records_path = out / f"run-{backend}-{workload}.jsonl"
    records_path.unlink(missing_ok=True)
    argv = plan_of(site).program_argv(backend, str(records_path), ranks=1, nodes=1, threads=threads,
                                      prefix="/unused", workload=settings)
    program = [sys.executable, str(TRAINER), *argv[1:]]
    launcher = get_launcher("horovodrun" if backend == "horovod" else "torchrun")()
    command = launcher.argv(program, Allocation(1, 1, threads, hosts=("localhost",)))
    if backend == "plain":  # one process, no launcher
        command = program
    if command[0] == "torchrun" and not shutil.which("torchrun"):
        command = [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    (out / f"run-{backend}-{workload}.log").write_text(proc.stdout + proc.stderr)
    records = []
    if records_path.exists():
        records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    outcome = RunOutcome(backend, 1, 1, None, "local", "0:0", proc.returncode, records)
    by = {r.get("record"): r for r in records}
    convergence = by.get("convergence", {})
    collectives = by.get("collectives", {})
    return {
        "backend": backend, "workload": workload, "command": command, "wall_seconds": round(wall, 1),
        "settings": settings, "figures": measured_figures(records),
        "ci95": by.get("throughput_total", {}).get("img_per_sec_ci95"),
        "transport": by.get("config", {}).get("transport"),
        "collectives_ok": collectives.get("ok"), "collectives_checks": collectives.get("checks"),
        "collectives_failed": collectives.get("failed_checks"),
        "collectives_failures": collectives.get("failures"),
        "loss": [convergence.get("initial_loss"), convergence.get("final_loss")],
        "reasons": sanity_reasons(outcome, required_transport=None if backend == "plain" else "nccl"),
        "exit_status": proc.returncode,
        "tail": (proc.stdout + proc.stderr).splitlines()[-6:],
    }


def nccl_onerank_probe(counts=(17, 4913, 65537, 1048577)) -> dict:
    """NCCL alone, no Horovod: ``ncclAllReduce`` with ``ncclSum`` and ``ncclAvg`` on a
    communicator of one rank (CuPy's NCCL binding), for float32 and float64 and ``counts``.

    The input holds the integers 1..7, so the sum and the average of one rank equal the input
    exactly; the output buffer starts at -1, so an element NCCL leaves unwritten shows. Source of
    the fault it looks for: NVIDIA/nccl#1950 (one-rank ``ncclAvg`` leaves the last elements
    unwritten, 2.27 to 2.29.6).

    Returns:
        dict: ``nccl`` (the version CuPy's binding reports), ``torch_nccl`` (torch's), ``results``
        (``{"op", "dtype", "count", "wrong", "first_wrong"}`` each); ``skipped`` with the reason
        where CuPy is missing.
    """
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as error:
        return {"skipped": f"no CuPy with NCCL ({error})"}
    import torch

    comm = nccl.NcclCommunicator.initAll([0])[0]
    kinds = {"float32": (cupy.float32, nccl.NCCL_FLOAT32), "float64": (cupy.float64, nccl.NCCL_FLOAT64)}
    ops = {"sum": nccl.NCCL_SUM, "avg": getattr(nccl, "NCCL_AVG", 4)}  # ncclAvg = 4 in nccl.h
    results = []
    for op_name, op in ops.items():
        for dtype_name, (dtype, nccl_dtype) in kinds.items():
            for count in counts:
                send = (cupy.arange(count, dtype=cupy.int64) % 7 + 1).astype(dtype)
                recv = cupy.full(count, -1, dtype=dtype)
                comm.allReduce(send.data.ptr, recv.data.ptr, count, nccl_dtype, op,
                               cupy.cuda.Stream.null.ptr)
                cupy.cuda.Device().synchronize()
                wrong = cupy.flatnonzero(recv != send)
                results.append({"op": op_name, "dtype": dtype_name, "count": count,
                                "wrong": int(wrong.size),
                                "first_wrong": int(wrong[0]) if wrong.size else None})
    version = nccl.get_version()
    return {"nccl": f"{version // 10000}.{version // 100 % 100}.{version % 100}",
            "torch_nccl": ".".join(str(v) for v in torch.cuda.nccl.version()), "results": results}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdist", required=True, type=Path, help="horovod-0.28.1.tar.gz (the recipe's sha256)")
    parser.add_argument("--out", required=True, type=Path, help="where the site config, logs and summary go")
    parser.add_argument("--wheels", type=Path, help="wheels the build needs that the machine lacks (cffi)")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS), help="backend:workload pairs")
    parser.add_argument("--skip-train", action="store_true", help="build and check only")
    parser.add_argument("--nccl-probe", action="store_true",
                        help="first, NCCL alone: one-rank ncclSum and ncclAvg (CuPy), see nccl_onerank_probe")
    parser.add_argument("--skip-build", action="store_true", help="probe only: no Horovod build, no runs")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    site_dir = out / "site"
    site_dir.mkdir(exist_ok=True)
    if args.wheels:
        wheels = sorted(str(p) for p in args.wheels.glob("*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--no-compile", "--target", str(site_dir), "--upgrade", *wheels], check=True)
    sys.path.insert(0, str(site_dir))  # hpcstack's own needs (jsonschema) for this process too
    facts = probe(out)
    print("machine:", json.dumps(facts, indent=1), flush=True)
    site_path = site_config(facts, out)
    summary = {"machine": facts}
    if args.nccl_probe:
        summary["nccl_probe"] = probe_result = nccl_onerank_probe()
        print("NCCL alone, one rank:", json.dumps({k: v for k, v in probe_result.items() if k != "results"}))
        for row in probe_result.get("results", []):
            print(f"  nccl{row['op'].title():4} {row['dtype']:8} {row['count']:>8}: {row['wrong']} wrong"
                  + (f", first at {row['first_wrong']}" if row["wrong"] else ""), flush=True)
    if args.skip_build:
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return 0
    build, patches, env = build_env(site_path, facts)
    print("build env:", " ".join(f"{k}={v}" for k, v in sorted(env.items())), flush=True)
    summary["build_env"] = env
    built = build_horovod(build, patches, env, args.sdist.resolve(), out, site_dir)
    summary["build"] = built
    print(f"build: {'ok' if built['ok'] else 'FAILED'} in {built['seconds']:.0f} s"
          + (f", wheel {built['wheel'] / 1e6:.1f} MB" if built["ok"] else f": {built['error']}"), flush=True)
    run_env = {**os.environ, **ROOT_ENV,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(site_dir), os.environ.get("PYTHONPATH")])),
               "PATH": f"{site_dir / 'bin'}:{os.environ['PATH']}"}
    status = 1
    if built["ok"]:
        from hpcstack.site import load_site

        site = load_site(str(site_path))
        flags = check_build(site_dir, required_flags(build, facts), run_env)
        summary["check_build"] = flags
        print(flags["text"], "required flags:", "all shown" if flags["ok"] else "MISSING", flush=True)
        status = 0 if flags["ok"] else 1
        runs = []
        for pair in ([] if args.skip_train else args.runs.split(",")):
            backend, workload = pair.split(":")
            result = train(backend, workload, site, out, run_env, threads=min(8, facts["cpus"] or 1))
            runs.append(result)
            fig = result["figures"].get("throughput_total")
            print(f"{backend:8} {workload:10} {('%.0f img/s' % fig) if fig else 'no figure':>12} "
                  f"collectives {result['collectives_ok']} ({result['collectives_failed']} failed of "
                  f"{result['collectives_checks']}) loss {result['loss']} {result['wall_seconds']} s "
                  f"reasons: {result['reasons'] or 'none'}", flush=True)
            if result["collectives_failures"]:
                print("   first failure:", result["collectives_failures"][0][:300], flush=True)
        summary["runs"] = runs
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return status


if __name__ == "__main__":
    sys.exit(main())
