"""PyTorch 2.14.1 (PyPI's CUDA 13.0 build) with torch.distributed, for GPU nodes; CPU-only where the site has no CUDA.

The next generation beside pytorch/2.3.1-gpu: the same package set without Horovod (no release
since 0.28.1 of 2023; EPCC's own later PyTorch builds train with torch.distributed alone), so
nothing is built from source: DDP over NCCL on GPUs, over Gloo on CPUs. torch 2.14.1 is the newest
torch for which PyPI serves the matching torchvision (0.29.x). Left out, and why (2.14.1-gpu.in):
torchaudio (PyPI stops at 2.11, the release for torch 2.11) and torchtext (discontinued after 0.18).

PyPI's torch 2.14.1 for Linux is the CUDA 13.0 build: its requires_dist pins
cuda-toolkit[cublas,cudart,...]==13.0.3, nvidia-nccl-cu13==2.30.7 and nvidia-cudnn-cu13==9.24.0.43.
Its libraries serve compute capability 8.0 (Ampere) and newer (libtorch_cuda.so has sm_75, but
libtorch_cuda_linalg.so starts at sm_80: 2.14.1-gpu.pypi.gpu-archs.json): no T4 (7.5), no V100 (7.0).
It runs on CPUs too.
"""

from hpcstack.recipe_api import (CudaWheelArchs, Imports, Lock, Modulefile, PipWheels, Recipe, StackManifest,
                                 StackTools, Trainer, Validation, Venv)


def recipe(site):
    return Recipe("pytorch", "2.14.1-gpu",
                  whatis="PyTorch 2.14.1 (CUDA 13.0) with torch.distributed (NCCL, Gloo) and TensorBoard",
                  keywords=("deep learning", "machine learning", "neural networks", "GPU", "CUDA",
                            "distributed training", "Jupyter"),
                  components=[
        # a venv on the site's Python module (python/3.12.1-gpu on Cirrus)
        Venv(),
        # every wheel pinned with hashes in 2.14.1-gpu.pypi.lock, one resolution, from PyPI as of
        # 2026-11-01 (after torchvision 0.29.2, the last 0.29 release, of 2026-10-28); universal
        # for Python >= 3.10 (localhost 3.11, cirrus 3.12, the Ubuntu 22.04 container image 3.10)
        PipWheels("2.14.1-gpu", exclude_newer="2026-11-01", locks=(Lock("pypi"),)),
        # the GPU architectures of the torch wheel (SASS sm_75 to sm_120, no PTX: read with
        # cuobjdump, recorded in 2.14.1-gpu.pypi.gpu-archs.json) against the site's cc_list,
        # before anything is written, and from the installed torch in the sanity check: a V100
        # site (cirrus, 7.0) is refused with the reason
        CudaWheelArchs("torch", libraries=("torch/lib/libtorch_cuda*.so",),
                       archs="torch._C._cuda_getArchFlags()", imports=("torch",)),
        # extend-venv-activate and a pip that says where packages go in <prefix>/bin; not
        # examples/digits, a Horovod program (the digits workload is the trainer's --model digits)
        StackTools(),
        # the validation's training program, <prefix>/bin/hpcstack-train-benchmark (ddp backend)
        Trainer(),
        # <prefix>/.hpcstack/constraints.txt (every pin, for PIP_CONSTRAINT/UV_CONSTRAINT) and the
        # CycloneDX SBOM sbom.cdx.json; the module sets PYTHONNOUSERSITE=1
        StackManifest(),
        # sanity check: everything imports, torch.distributed with it; sklearn brings the digits
        # data set; ipykernel runs the stack as a Jupyter kernel (`hpcstack kernel install`)
        Imports(("torch", "torch.distributed", "torchvision", "torchmetrics", "tensorboard", "sklearn",
                 "ipykernel")),
        # the modulefile pytorch/2.14.1-gpu, written last; `module help` shows the launcher
        Modulefile(launch=(
            ("PyTorch DDP with torchrun, one launcher per node",
             "srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node={ranks_per_node} "
             "--rdzv-backend=c10d --rdzv-endpoint=$(hostname):29500 train.py"),
            ("PyTorch DDP on one node, without Slurm",
             "torchrun --standalone --nproc-per-node={ranks_per_node} train.py"),
        ), cpu_note="This site has no GPUs: the CUDA build of torch runs on the CPUs here "
                    "(torch.cuda.is_available() is False; train with --device cpu, DDP over Gloo)."),
        # what `hpcstack validate` trains per site and partition, and the performance references
        Validation("2.14.1-gpu.validation.yaml"),
    ])
