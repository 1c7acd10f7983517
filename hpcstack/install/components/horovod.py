"""Horovod built from its sdist against the site's MPI, NCCL and CUDA: :class:`HorovodBuild`, a
small specialisation of the generic :class:`hpcstack.install.components.source.SourceBuild`.

It adds Horovod's build settings (``HOROVOD_*``), the CUDA stubs of a login node, the CUDA
architectures check (:class:`CudaArchCheck`) and the build-flags sanity check
(``horovodrun --check-build``: :class:`CheckBuild`, or in the recipe's one interpreter). Both
actions follow :class:`hpcstack.install.actions.Action`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from functools import partial

from hpcstack.errors import HpcstackError
from hpcstack.fsutil import CHILD_CWD
from hpcstack.install.actions import ActionBase, ExecContext, Run, bash_word
from hpcstack.install.plan import BUILD
from hpcstack.install.components.base import PlanContext
from hpcstack.install.components.checkbuild import missing_flags, parse_check_build
from hpcstack.install.components.sanity import PythonCheck, PythonSnippet
from hpcstack.install.components.source import Patch, SourceBuild


#: Horovod's part of the one-interpreter sanity check: the report ``horovodrun --check-build``
#: prints (Horovod 0.28.1, ``horovod/runner/launch.py`` ``check_build``), made from the same
#: ``*_built()`` functions of ``horovod.torch`` in this process, then the required flags
#: (``REQUIRED``) with the rules of :func:`hpcstack.install.components.checkbuild.missing_flags`.
#: A framework other than PyTorch counts as built when its extension library is there (nothing
#: of it is imported). It also imports ``horovod.runner.launch``, the module ``horovodrun`` runs.
_BUILD_FLAGS = '''
import glob, os, horovod, horovod.torch as hvd, horovod.runner.launch
def _ext(fw):
    return bool(glob.glob(os.path.join(os.path.dirname(horovod.__file__), fw, "mpi_lib*.so")))
flags = {"Frameworks": {"TensorFlow": _ext("tensorflow"), "PyTorch": True, "MXNet": _ext("mxnet")},
         "Controllers": {"MPI": bool(hvd.mpi_built()), "Gloo": bool(hvd.gloo_built())},
         "Operations": {"NCCL": bool(hvd.nccl_built()), "DDL": bool(hvd.ddl_built()),
                        "CCL": bool(hvd.ccl_built()), "MPI": bool(hvd.mpi_built()),
                        "Gloo": bool(hvd.gloo_built())}}
headings = {"Frameworks": "Available Frameworks", "Controllers": "Available Controllers",
            "Operations": "Available Tensor Operations"}
print("Horovod v%s:" % horovod.__version__)
for section, names in flags.items():
    print("\\n%s:" % headings[section])
    for name, built in names.items():
        print("    [%s] %s" % ("X" if built else " ", name))
missing = []
for req in REQUIRED:
    section, _, name = req.rpartition(":")
    sections = [section] if section else [s for s in flags if name in flags[s]]
    if not sections:
        missing.append(name)
    missing += ["%s:%s" % (s, name) for s in sections if not flags.get(s, {}).get(name, False)]
if missing:
    sys.exit("horovod build flags: missing " + ", ".join("[X] " + m for m in missing))
'''


def _verify_flags(required: tuple[str, ...], report: str) -> list[str]:
    """Parse the report the snippet printed (from its ``Horovod vX.Y.Z:`` line on) and require
    the flags again, failing closed."""
    missing = missing_flags(parse_check_build(report), required)
    return ["missing " + ", ".join(f"[X] {m}" for m in missing)] if missing else []


def build_flags_check(required: tuple[str, ...]) -> PythonSnippet:
    """Horovod's contribution to the one-interpreter sanity check: the ``horovodrun
    --check-build`` report made in-process, requiring ``required`` (``Name`` or
    ``Section:Name``, as for ``hpcstack check-build``), kept as ``check-build.txt``.

    Args:
        required (tuple[str, ...]): flags that must be ``[X]``, e.g. ``("PyTorch", "MPI", "Gloo")``.
    """
    required = tuple(required)
    code = f"REQUIRED = {json.dumps(list(required))}\n" + _BUILD_FLAGS.strip("\n")
    return PythonSnippet("horovod build flags", code, verify=partial(_verify_flags, required),
                         record="check-build.txt", start=r"^Horovod v")


@dataclass(frozen=True)
class HorovodBuild(SourceBuild):
    """Horovod from its PyPI sdist, built against the site's MPI (and NCCL and CUDA on GPU sites).

    What Horovod is built *with* is this component's (the recipe's) choice: PyTorch only, the MPI
    and Gloo controllers, ``cpu_operations`` for CPU tensors, and on a site whose toolchain has
    CUDA, ``gpu_operations`` for GPU tensors. What it is built *against* comes from the site's
    :class:`hpcstack.site.Toolchain`: the compilers (``CC``/``CXX``/``FC``, the MPI wrappers),
    ``HOROVOD_CUDA_HOME``, ``HOROVOD_NCCL_HOME``, ``HOROVOD_BUILD_CUDA_CC_LIST``. The variables
    follow Horovod's install guide (https://horovod.readthedocs.io/en/stable/install_include.html).
    On a site without CUDA the build sets ``HOROVOD_WITHOUT_CUDA=1`` (our patch): Horovod would
    otherwise turn CUDA on by itself when torch is a CUDA build and any CUDA toolkit can be found
    (``nvcc`` on PATH, ``/usr/local/cuda``). A site's CUDA stubs directory is prepended to
    ``LD_LIBRARY_PATH`` for the build and the sanity check only (a login node has no driver); it
    never reaches the modulefile. The sanity check reads the flags ``horovodrun --check-build``
    reports (in the recipe's import process by default, see ``check_build``) and requires
    :meth:`required_flags`: ``required`` plus the GPU operations on CUDA sites (a Gloo-only GPU
    build halves per-GPU throughput, Horovod issue #2686).

    The build key is :class:`SourceBuild`'s (the MPI behind the compiler wrappers, the
    compilers, Python's ABI, the CUDA compiler and NCCL's version on CUDA sites, every build
    variable, ``HOROVOD_*`` among them) with the torch version (``built_against``);
    ``MAKEFLAGS`` does not count. Not in the key: the venv's path. Horovod's CMake
    gives its ``.so`` files a RUNPATH to the building venv's ``torch/lib``; a wheel reused in
    another prefix keeps that path. It works, also once the first build is gone:
    ``horovod.torch`` imports torch first, so the loader matches ``libtorch.so`` and
    ``libc10.so`` by name among the libraries already loaded, and it looks for ``libmpi*.so`` in
    that directory in vain (23 failed lookups in the benchmark's strace) before the system
    directories. A prefix-free wheel needs the RUNPATH dropped at build time (docs/benchmarks.md).

    Args:
        cpu_operations (str): ``HOROVOD_CPU_OPERATIONS``: ``MPI``, ``Gloo`` or ``CCL``.
        gpu_operations (str): ``HOROVOD_GPU_OPERATIONS`` on CUDA sites: ``NCCL`` or ``MPI``.
        required (tuple[str, ...]): ``horovodrun --check-build`` flags every site must show.
        check_build (str): how the sanity check reads the flags: ``"in-process"`` (default)
            from ``horovod.torch``'s ``mpi_built()``, ``gloo_built()``, ``nccl_built()``, … in the
            one interpreter that also runs the recipe's imports (:class:`PythonCheck`: 1.5 s, where
            ``horovodrun --check-build`` forks about 13 processes that each import torch: 6 s on
            2 cores); ``"horovodrun"`` runs ``horovodrun --check-build`` itself.

    Example:
        ``HorovodBuild("horovod", "0.28.1", url=..., sha256=..., patches=(Patch("horovod-0.28.1-cxx17.patch", "…"),))``
    """

    package: str = "horovod"
    version: str = "0.28.1"
    url: str = ""
    sha256: str = ""
    patches: tuple[Patch, ...] = field(default=())
    built_against: tuple[str, ...] = ("torch",)
    cuda: bool = True
    cpu_operations: str = "MPI"
    gpu_operations: str = "NCCL"
    required: tuple[str, ...] = ("PyTorch", "MPI", "Gloo")
    check_build: str = "in-process"

    def __post_init__(self):
        if self.check_build not in ("in-process", "horovodrun"):
            raise ValueError(f"check_build {self.check_build!r}: one of in-process, horovodrun")
        if self.cpu_operations not in ("MPI", "Gloo", "CCL"):
            raise ValueError(f"cpu_operations {self.cpu_operations!r}: one of MPI, Gloo, CCL")
        if self.gpu_operations not in ("NCCL", "MPI"):
            raise ValueError(f"gpu_operations {self.gpu_operations!r}: one of NCCL, MPI")

    def required_flags(self, ctx: PlanContext) -> tuple[str, ...]:
        """The check-build flags this site's build must show: ``required``, plus
        ``gpu_operations`` where the toolchain has CUDA."""
        extra = (self.gpu_operations,) if ctx.toolchain.has_cuda else ()
        return tuple(dict.fromkeys(self.required + extra))

    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        """:meth:`SourceBuild.build_env` with Horovod's settings after the toolchain's compilers:
        PyTorch only, the MPI and Gloo controllers, the operations, and on CUDA sites the
        toolkit, NCCL and the GPUs' compute capabilities (``HOROVOD_WITHOUT_CUDA=1`` elsewhere).
        ``CUDA_HOME`` comes from :meth:`SourceBuild.toolchain_env` (``cuda=True``): torch's
        cpp_extension, which Horovod's CMake asks for the CUDA libraries, finds the toolkit by it
        (else ``CUDA_PATH``, else ``nvcc`` on PATH, else ``/usr/local/cuda``)."""
        tc = ctx.toolchain
        env = {
            "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
            "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
            "HOROVOD_CPU_OPERATIONS": self.cpu_operations,
        }
        if tc.has_cuda:
            env["HOROVOD_GPU"] = "CUDA"
            env["HOROVOD_GPU_OPERATIONS"] = self.gpu_operations
            env["HOROVOD_CUDA_HOME"] = tc.cuda_home
            if tc.nccl_home:
                env["HOROVOD_NCCL_HOME"] = tc.nccl_home
            if tc.cuda_cc_list:
                env["HOROVOD_BUILD_CUDA_CC_LIST"] = ",".join(str(c) for c in tc.cuda_cc_list)
            if not tc.cuda_static_runtime:
                # our patch's knob; nvcc's own links follow NVCC_APPEND_FLAGS. CMake's probe of
                # the CUDA compiler's link directories links libcudart_static.a whatever the
                # setting, fails without it, and leaves the toolkit's lib64 off the final link
                # line: LDFLAGS puts it there (CMake starts its linker flags from LDFLAGS).
                env["HOROVOD_CUDA_RUNTIME_LIBRARY"] = "Shared"
                env["NVCC_APPEND_FLAGS"] = "--cudart shared"
                site_ldflags = ctx.site.build_env.get("LDFLAGS", "")
                env["LDFLAGS"] = f"-L{tc.cuda_home}/lib64" + (f" {site_ldflags}" if site_ldflags else "")
        else:
            env["HOROVOD_WITHOUT_CUDA"] = "1"
        base = super().build_env(ctx)
        toolchain = {n: base.pop(n) for n in self.toolchain_env(ctx) if n in base}
        if "LDFLAGS" in env:
            base.pop("LDFLAGS", None)
        return {**toolchain, **env, **base}

    def stub_dir(self, ctx: PlanContext) -> str:
        """A directory of ours in the stage dir holding ``libcuda.so.1`` -> the site's stub."""
        return os.path.join(ctx.stage_dir, "cuda-stubs")

    def build_prepend(self, ctx: PlanContext) -> dict[str, str]:
        stubs = ctx.toolchain.cuda_stubs
        return {"LD_LIBRARY_PATH": f"{self.stub_dir(ctx)}:{stubs}"} if stubs else {}

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """As :meth:`SourceBuild.contribute`, plus the ``libcuda.so.1`` stub link on GPU sites.

        The Cirrus instructions ask the admin to check that ``libcuda.so.1`` links to
        ``libcuda.so`` in NVHPC's stubs; we make that link in the stage dir instead of touching
        the NVHPC tree.
        """
        steps = super().contribute(ctx)
        tc = ctx.toolchain
        if tc.has_cuda and tc.cuda_cc_list:
            steps[BUILD][:0] = [CudaArchCheck(f"{tc.cuda_home}/bin/nvcc", tuple(tc.cuda_cc_list), tc.cuda_version)]
        stubs = ctx.toolchain.cuda_stubs
        if stubs:
            stub_dir = self.stub_dir(ctx)
            steps[BUILD][:0] = [Run(("test", "-e", f"{stubs}/libcuda.so")),
                                Run(("mkdir", "-p", stub_dir)),
                                Run(("ln", "-sfn", f"{stubs}/libcuda.so", f"{stub_dir}/libcuda.so.1"))]
        return steps

    def sanity_actions(self, ctx: PlanContext) -> list:
        """The build flags of :meth:`required_flags`, checked in the recipe's one interpreter
        (:func:`build_flags_check` in a :class:`PythonCheck`, with ``imports`` and ``checks``), or
        by ``horovodrun --check-build`` itself (:class:`CheckBuild`) when ``check_build="horovodrun"``."""
        required = self.required_flags(ctx)
        if self.check_build == "horovodrun":
            return [*super().sanity_actions(ctx),
                    CheckBuild(os.path.join(ctx.venv, "bin", "horovodrun"), required,
                               prepend=self.build_prepend(ctx))]
        return [PythonCheck(ctx.python, tuple(self.imports), checks=(*self.checks, build_flags_check(required)),
                            prepend=self.build_prepend(ctx))]


@dataclass(frozen=True)
class CudaArchCheck(ActionBase):
    """Check that the site's CUDA toolkit compiles for every compute capability it lists.

    CUDA 13 dropped compute capability 7.0 (V100): ``nvcc --list-gpu-arch`` of 13.0 starts at
    ``compute_75``, so a site with ``cuda.cc_list: [70]`` needs a CUDA 12.x toolkit (the CUDA
    13.0 release notes). The install's preflight runs :meth:`preflight` before anything
    is written; the dry-run prints the same check as bash (``nvcc --list-gpu-arch`` and a
    ``grep`` for each capability), and :meth:`execute` runs that bash, so the three agree.

    Args:
        nvcc (str): the toolkit's ``nvcc``; may hold ``${VAR}`` references to the build
            environment (``${NVHPC_ROOT}/cuda/12.4/bin/nvcc``).
        cc_list (tuple[int, ...]): compute capabilities, e.g. ``(70,)``.
        cuda_version (str | None): the site's CUDA ``X.Y``, named in the message.

    Raises:
        HpcstackError: (execute) a capability the toolkit does not offer, or no usable nvcc.
    """

    nvcc: str
    cc_list: tuple[int, ...]
    cuda_version: str | None = None

    def commands(self) -> tuple[Run, ...]:
        return (Run((self.nvcc, "--list-gpu-arch")),)

    def problems(self, env: dict[str, str]) -> list[str]:
        """One line naming the toolkit and every unsupported capability; empty when all are offered.

        Args:
            env (dict[str, str]): the build environment (the site's modules loaded).
        """
        from hpcstack.install.actions import expand

        nvcc = expand(self.nvcc, env)
        where = f"CUDA {self.cuda_version} ({nvcc})" if self.cuda_version else nvcc
        try:
            proc = subprocess.run([nvcc, "--list-gpu-arch"], env=env, capture_output=True, text=True, cwd=CHILD_CWD,
                                  timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return [f"toolchain.cuda: cannot run {nvcc} --list-gpu-arch ({exc}); check toolchain.cuda.home"]
        offered = sorted({int(m) for m in re.findall(r"compute_(\d+)", proc.stdout)})
        if proc.returncode != 0 or not offered:
            return [f"toolchain.cuda: {nvcc} --list-gpu-arch listed no architectures (exit "
                    f"{proc.returncode}); check toolchain.cuda.home"]
        missing = [cc for cc in self.cc_list if cc not in offered]
        if not missing:
            return []
        shown = ", ".join(f"{cc // 10}.{cc % 10} (compute_{cc})" for cc in missing)
        return [f"toolchain.cuda.cc_list: {where} does not compile for compute capability {shown}; "
                f"it offers compute_{offered[0]} to compute_{offered[-1]}: use a toolkit that has "
                "them (CUDA 12.x for 7.0, V100) or drop them from cc_list"]

    def preflight(self, env: dict[str, str]) -> list[str]:
        """The install's preflight calls this before anything is written (:func:`hpcstack.install.runner.preflight`)."""
        return self.problems(env)

    def to_bash(self) -> str:
        nvcc = bash_word(self.nvcc)
        ccs = " ".join(str(c) for c in self.cc_list)
        return (f"hpcstack_archs=$({nvcc} --list-gpu-arch)\n"
                f"for cc in {ccs}; do\n"
                f'  grep -qx "compute_$cc" <<<"$hpcstack_archs" || '
                f'{{ echo "{self.nvcc} does not compile for compute_$cc" >&2; exit 2; }}\n'
                "done")

    def execute(self, ctx: ExecContext) -> None:
        problems = self.problems(getattr(ctx, "env", None) or dict(os.environ))
        ctx.log.write(f"$ {self.nvcc} --list-gpu-arch: {'; '.join(problems) or 'every capability offered'}\n")
        if problems:
            raise HpcstackError(problems[0])


@dataclass(frozen=True)
class CheckBuild(ActionBase):
    """Run ``horovodrun --check-build`` and require flags (the Horovod build's sanity check).

    The dry-run line is ``hpcstack check-build --horovodrun … --require …``, which calls the same
    :func:`hpcstack.install.components.checkbuild.check_build` as :meth:`execute`, in the environment built
    from the same ``env`` and ``prepend`` (:meth:`Run.command_env`). :meth:`execute` also keeps
    the output as ``check-build.txt`` in the build's ``.hpcstack`` (provenance).

    Args:
        horovodrun (str): path of ``horovodrun`` in the stack.
        required (tuple[str, ...]): flags that must be ``[X]``, as ``Section:Name`` or ``Name``
            (any section), e.g. ``("PyTorch", "Controllers:MPI", "Controllers:Gloo", "Operations:NCCL")``.
        env (dict[str, str]) / prepend (dict[str, str]): as for :class:`Run`.

    Raises:
        HpcstackError: names every required flag that is missing.
    """

    horovodrun: str
    required: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    prepend: dict[str, str] = field(default_factory=dict)

    def _run(self) -> Run:
        return Run(("hpcstack", "check-build", "--horovodrun", self.horovodrun,
                    "--require", ",".join(self.required)), env=self.env, prepend=self.prepend)

    def commands(self) -> tuple[Run, ...]:
        """``horovodrun --check-build``, with the variables it runs with (hpcstack's own code
        runs it, not the ``hpcstack`` command)."""
        return (Run((self.horovodrun, "--check-build"), env=self.env, prepend=self.prepend),)

    def to_bash(self) -> str:
        return self._run().to_bash()

    def execute(self, ctx: ExecContext) -> None:
        from hpcstack.fsutil import write_atomic
        from hpcstack.install.components.checkbuild import check_build

        env = self._run().command_env(ctx.env)
        ctx.log.write(f"$ {self.to_bash()}\n")
        output = check_build(self.horovodrun, self.required, env)
        ctx.log.write(output)
        state_dir = getattr(ctx, "state_dir", None)
        if state_dir is not None:  # provenance: the stack records what its Horovod was built with
            write_atomic(os.path.join(state_dir, "check-build.txt"), output)
