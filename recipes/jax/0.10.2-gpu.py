"""JAX 0.10.2 for NVIDIA GPUs: jax, jaxlib and PyPI's CUDA 12 plugin wheels, one process per GPU.

What ``pip install "jax[cuda12]==0.10.2"`` installs, pinned with hashes: jax-cuda12-pjrt (XLA's
PJRT plugin, ``xla_cuda_plugin.so``), jax-cuda12-plugin (JAX's own CUDA kernels) and NVIDIA's CUDA
12.9 libraries from PyPI (cuBLAS, cuDNN, NCCL, the ptxas XLA compiles its kernels with), so the
site's CUDA module only has to bring a driver. Processes meet through
``jax.distributed.initialize()`` (srun's or mpirun's variables), GPUs talk over NCCL.

Measured from the wheels (cuobjdump 13.5; 0.10.2-gpu.cuda12.gpu-archs.json, docs/recipe-jax.md):
both plugin wheels carry SASS sm_50, 60, 70, 80, 90, 100, 101, 120 and PTX compute_120, so
cirrus's V100 (7.0) is served as well as the A100s (8.0) of perlmutter and juwels-booster;
NCCL 2.32.3 and cuBLAS 12.9.3.13 carry sm_70 too, ptxas 12.9.86 compiles for it, and cuDNN is
pinned to 9.10.2.21, the release with Volta kernels (0.10.2-gpu.in). The CUDA 13 wheels
(jax-cuda13-*) start at sm_75: no V100. Why 0.10.2 and not PyPI's newest: 0.10.2-cpu.py.
"""

import os

from hpcstack.recipe_api import (CudaWheelArchs, Imports, Lock, Modulefile, PipWheels, Recipe, StackManifest,
                                 StackTools, Validation, Venv)

#: The installed plugin's architectures, read by jax-gpu-archs (beside this file) in the stack's
#: python from the fat binaries of the libraries named: no GPU, no CUDA tool needed.
ARCHS_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax-gpu-archs")
PJRT_LIBRARIES = ("jax_plugins/xla_cuda12/xla_cuda_plugin.so",)
PLUGIN_LIBRARIES = ("jax_cuda12_plugin/*.so",)


def installed_archs(libraries):
    """The ``archs`` expression of a CudaWheelArchs component for the installed ``libraries``."""
    return f"__import__('runpy').run_path({ARCHS_PROGRAM!r}, init_globals={{'LIBRARIES': {list(libraries)!r}}})['ARCHS']"


def recipe(site):
    return Recipe("jax", "0.10.2-gpu", whatis="JAX 0.10.2 with CUDA 12 (jax-cuda12-plugin) for NVIDIA GPUs, NCCL between processes",
                  keywords=("machine learning", "automatic differentiation", "XLA", "GPU", "CUDA"),
                  components=[
        # a venv on the site's Python module
        Venv(),
        # every wheel pinned with hashes in 0.10.2-gpu.cuda12.lock (universal for Python >= 3.11,
        # jax's requires-python); for sites whose toolchain has CUDA >= 12.1 (the CUDA 12 runtime
        # the plugin asks for), the wheels bringing CUDA 12.9's libraries
        PipWheels("0.10.2-gpu", min_python="3.11", exclude_newer="2026-11-01",
                  locks=(Lock("cuda12", cuda="12.1"),)),
        # the GPU architectures of both plugin wheels (read with cuobjdump, recorded in
        # 0.10.2-gpu.cuda12.gpu-archs.json) against the site's cc_list before anything is
        # written, and of the installed plugin in the sanity check (jax-gpu-archs)
        CudaWheelArchs("jax-cuda12-pjrt", libraries=PJRT_LIBRARIES, archs=installed_archs(PJRT_LIBRARIES)),
        CudaWheelArchs("jax-cuda12-plugin", libraries=PLUGIN_LIBRARIES, archs=installed_archs(PLUGIN_LIBRARIES)),
        # extend-venv-activate and a pip that says where packages go, in <prefix>/bin
        StackTools(),
        # <prefix>/.hpcstack/constraints.txt and the SBOM; PYTHONNOUSERSITE=1 in the module
        StackManifest(),
        # sanity check: JAX and both plugin packages import (on a login node without a GPU: the
        # plugin's libraries load when JAX first asks for a GPU)
        Imports(("jax", "jax.numpy", "jax.experimental.multihost_utils", "jax_plugins.xla_cuda12",
                 "jax_cuda12_plugin.version")),
        # the modulefile jax/0.10.2-gpu; `module help` shows how to launch one process per GPU
        Modulefile(launch=(
            ("JAX, one process per GPU: call jax.distributed.initialize() first (under srun or "
             "mpirun each process then sees one GPU)", "srun --ntasks-per-node={ranks_per_node} python train.py"),
        ), cpu_note="This site has no GPUs: JAX falls back to its CPU backend here (a warning says "
                    "so); jax/0.10.2-cpu is the stack for CPU nodes."),
        # `hpcstack validate`: jax-validate on the GPUs (NCCL required), as for jax/0.10.2-cpu
        Validation("0.10.2-gpu.validation.yaml"),
    ])
