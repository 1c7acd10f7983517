"""Source builds: ``SourceBuild`` (a Python sdist built into a wheel) and ``HorovodBuild`` on it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..plan import (BUILD, FETCH, INSTALL, PATCH, SANITYCHECK, CheckBuild, Fetch, Run, Unpack,
                    VerifySha256)
from .base import PlanContext


@dataclass(frozen=True)
class Patch:
    """A patch file of the project, under the recipe's ``patches/``, with its sha256.

    Args:
        file (str): file name under ``patches/``.
        sha256 (str): 64 hex digits; a patch that differs is refused.
    """

    file: str
    sha256: str


@dataclass(frozen=True)
class SourceBuild:
    """Download a Python sdist, check its sha256, patch it, build a wheel, install the wheel.

    Building a wheel (``pip wheel --no-build-isolation``) and installing that avoids pip's
    fallback to a legacy ``setup.py install`` that doubles the time of a failed build (facts.md).

    Args:
        package (str): distribution name, e.g. ``"horovod"``.
        version (str): e.g. ``"0.28.1"``.
        url (str): the sdist's URL (PyPI's files.pythonhosted.org).
        sha256 (str): the sdist's sha256 (64 hex digits), as PyPI lists it.
        patches (tuple[Patch, ...]): applied in order with ``patch -p1``.

    Example:
        ``SourceBuild("foo", "1.0", "https://…/foo-1.0.tar.gz", "ab12…")``
    """

    package: str
    version: str
    url: str
    sha256: str
    patches: tuple[Patch, ...] = ()

    # -- paths
    def sdist(self, ctx: PlanContext) -> str:
        """Where the sdist lands in the download cache."""
        return os.path.join(ctx.cache_dir, "sources", os.path.basename(self.url))

    def src_dir(self, ctx: PlanContext) -> str:
        """The unpacked source tree in the stage dir."""
        return os.path.join(ctx.stage_dir, "src", f"{self.package}-{self.version}")

    def dist_dir(self, ctx: PlanContext) -> str:
        """Where the built wheel goes."""
        return os.path.join(ctx.stage_dir, "dist")

    def patch_path(self, ctx: PlanContext, patch: Patch) -> str:
        return str(ctx.recipe_file(os.path.join("patches", patch.file)))

    # -- what the build needs; subclasses add to it
    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        """Variables for the build: the site's ``build.env`` and ``MAKEFLAGS=-j<jobs>``."""
        return {**ctx.site.build_env, "MAKEFLAGS": f"-j{ctx.jobs}"}

    def build_prepend(self, ctx: PlanContext) -> dict[str, str]:
        """Path-like variables to prepend to during the build."""
        return {}

    def sanity_actions(self, ctx: PlanContext) -> list:
        """Sanity-check actions; none by default."""
        return []

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """Return ``{step name: actions}`` for this component."""
        src, dist = self.src_dir(ctx), self.dist_dir(ctx)
        return {
            FETCH: [Fetch(self.url, self.sha256, self.sdist(ctx))],
            PATCH: [VerifySha256(self.patch_path(ctx, p), p.sha256) for p in self.patches]
                   + [Unpack(self.sdist(ctx), os.path.dirname(src))]
                   + [Run(("patch", "-p1", "-i", self.patch_path(ctx, p)), cwd=src) for p in self.patches],
            BUILD: [Run(("rm", "-rf", dist)),
                    Run(ctx.pip("wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                                "-w", dist, src),
                        env=self.build_env(ctx), prepend=self.build_prepend(ctx))],
            INSTALL: [Run(ctx.pip("install", "--no-deps", "--no-index", "--force-reinstall",
                                  "--find-links", dist, f"{self.package}=={self.version}"))],
            SANITYCHECK: self.sanity_actions(ctx),
        }


@dataclass(frozen=True)
class HorovodBuild(SourceBuild):
    """Horovod from its PyPI sdist, built against the site's MPI (and NCCL and CUDA on GPU sites).

    The HOROVOD_* variables follow Horovod's install guide
    (https://horovod.readthedocs.io/en/stable/install_include.html) and the site's ``horovod``
    section: frameworks (PyTorch only), controllers (MPI, Gloo), CPU operations, and on GPU sites
    ``HOROVOD_GPU``, ``HOROVOD_GPU_OPERATIONS``, CUDA and NCCL homes, ``HOROVOD_BUILD_CUDA_CC_LIST``.
    ``CC``/``CXX`` are the MPI compiler wrappers. A site's ``cuda_stubs`` directory is prepended to
    ``LD_LIBRARY_PATH`` for the build and the sanity check only (a login node has no driver); it
    never reaches the modulefile. The sanity check runs ``horovodrun --check-build`` and requires
    the site's ``required_flags``.

    Example:
        ``HorovodBuild("0.28.1", url=..., sha256=..., patches=(Patch("horovod-0.28.1-cxx17.patch", "…"),))``
    """

    package: str = "horovod"
    version: str = "0.28.1"
    url: str = ""
    sha256: str = ""
    patches: tuple[Patch, ...] = field(default=())

    def build_env(self, ctx: PlanContext) -> dict[str, str]:
        h = ctx.site.horovod
        env = {"CC": h.cc, "CXX": h.cxx}
        if h.fc:
            env["FC"] = h.fc
        env.update({
            "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1",
            "HOROVOD_WITH_MPI": "1", "HOROVOD_WITH_GLOO": "1",
            "HOROVOD_CPU_OPERATIONS": h.cpu_operations,
        })
        if h.gpu:
            env["HOROVOD_GPU"] = h.gpu
        if h.gpu_operations:
            env["HOROVOD_GPU_OPERATIONS"] = h.gpu_operations
        if h.cuda_home:
            env["HOROVOD_CUDA_HOME"] = h.cuda_home
        if h.nccl_home:
            env["HOROVOD_NCCL_HOME"] = h.nccl_home
        if h.cuda_cc_list:
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = ",".join(str(c) for c in h.cuda_cc_list)
        env.update(h.env)
        return {**env, **super().build_env(ctx)}

    def stub_dir(self, ctx: PlanContext) -> str:
        """A directory of ours in the stage dir holding ``libcuda.so.1`` -> the site's stub."""
        return os.path.join(ctx.stage_dir, "cuda-stubs")

    def build_prepend(self, ctx: PlanContext) -> dict[str, str]:
        stubs = ctx.site.horovod.cuda_stubs
        return {"LD_LIBRARY_PATH": f"{self.stub_dir(ctx)}:{stubs}"} if stubs else {}

    def contribute(self, ctx: PlanContext) -> dict[str, list]:
        """As :meth:`SourceBuild.contribute`, plus the ``libcuda.so.1`` stub link on GPU sites.

        The Cirrus instructions ask the admin to check that ``libcuda.so.1`` links to
        ``libcuda.so`` in NVHPC's stubs; we make that link in the stage dir instead of touching
        the NVHPC tree.
        """
        steps = super().contribute(ctx)
        stubs = ctx.site.horovod.cuda_stubs
        if stubs:
            stub_dir = self.stub_dir(ctx)
            steps[BUILD][:0] = [Run(("test", "-e", f"{stubs}/libcuda.so")),
                                Run(("mkdir", "-p", stub_dir)),
                                Run(("ln", "-sfn", f"{stubs}/libcuda.so", f"{stub_dir}/libcuda.so.1"))]
        return steps

    def sanity_actions(self, ctx: PlanContext) -> list:
        return [CheckBuild(os.path.join(ctx.venv, "bin", "horovodrun"),
                           tuple(ctx.site.horovod.required_flags),
                           prepend=self.build_prepend(ctx))]
