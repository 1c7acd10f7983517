"""PyTorch 2.3.1 (CUDA 12.1 build) with Horovod 0.28.1, for GPU nodes; CPU-only where the site has no CUDA.

The package set of the Cirrus install by hand (README, "The recipe"): torch, torchvision,
torchaudio, torchmetrics, torchtext and the tensorboard packages (but tensorboard-pytorch), then
Horovod built from source against the site's MPI (and NCCL and CUDA on GPU sites).
"""

from hpcstack.recipe_api import (PYPI, CudaWheelArchs, HorovodBuild, Imports, Lock, Modulefile, Patch, PipWheels,
                                 Recipe, StackManifest, StackTools, Trainer, Validation, Venv)


def recipe(site):
    return Recipe("pytorch", "2.3.1-gpu",
                  whatis="PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard",
                  keywords=("deep learning", "machine learning", "neural networks", "GPU", "CUDA", "MPI",
                            "distributed training", "Jupyter"),
                  components=[
        # a venv on the site's Python module (python/3.12.1-gpu on Cirrus)
        Venv(),
        # every wheel pinned with hashes in 2.3.1-gpu.<lock>.lock, one resolution; resolved as of
        # the Cirrus install (mid 2024), so the set works with torch 2.3.1. The first lock that
        # fits the site's CUDA and Python is installed.
        PipWheels("2.3.1-gpu", exclude_newer="2024-08-01", locks=(
            # the +cu121 builds from the PyTorch index, for CUDA >= 12.1 sites on Python 3.12 (Cirrus)
            Lock("cu121", indexes=("https://download.pytorch.org/whl/cu121", PYPI), cuda="12.1",
                 python=("3.12",)),
            # PyPI's torch 2.3.1 is the same CUDA 12.1 build, and runs on CPUs too (localhost)
            Lock("pypi"),
        )),
        # on CUDA sites: torch's GPU architectures (SASS sm_50 ... sm_90, no PTX) against the
        # site's cuda.cc_list, before anything is written (recorded by `hpcstack lock` in
        # 2.3.1-gpu.<lock>.gpu-archs.json) and in the sanity check from the installed torch
        CudaWheelArchs("torch", libraries=("torch/lib/libtorch_cuda*.so",),
                       archs="torch._C._cuda_getArchFlags()", imports=("torch",)),
        # Horovod 0.28.1 from the PyPI sdist, with our patches (each file's header says why):
        # C++17 for torch >= 2.1 (upstream horovod PR #3998, merged after the last release);
        # GCC 13/14 and CMake 4; a choice of CUDA runtime for toolkits without the static one;
        # hvd.Average on one GPU rank without NCCL's broken one-rank ncclAvg (NVIDIA/nccl#1950).
        # MPI for CPU tensors, NCCL for GPU tensors where the site has CUDA (then [X] NCCL is
        # required too)
        HorovodBuild(
            "horovod", "0.28.1",
            url="https://files.pythonhosted.org/packages/e4/86/da559fcc1620ac7831a16ccb2ad3acb477a8da8a631f75a83b6410507210/horovod-0.28.1.tar.gz",
            sha256="92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0",
            patches=(Patch("horovod-0.28.1-cxx17.patch", sha256="35e4a5310f71bbcb607a0ffac6c2d2a9a686786c084d5e564e1181de1552b59a"),
                     Patch("horovod-0.28.1-gcc13-cmake4.patch", sha256="782ef1c2a0e548168a21554d3aee56f470a61959ebb32b6016f6074d2ead5867"),
                     Patch("horovod-0.28.1-cuda-runtime.patch", sha256="a926ab2bc624972c8b652283a726ae49b95ed14031e93d52fb28f1c84c0290c1"),
                     Patch("horovod-0.28.1-onerank-avg.patch", sha256="8ea0d41f6cbdbf2bfcc41e768a915b419b1b3134858089c7db6ba345fdbf0acc")),
            cpu_operations="MPI", gpu_operations="NCCL", required=("PyTorch", "MPI", "Gloo")),
        # extend-venv-activate and a pip that says where packages go in <prefix>/bin;
        # examples/digits in <prefix>/examples
        StackTools(examples=("digits",)),
        # the validation's training program, <prefix>/bin/hpcstack-train-benchmark
        Trainer(),
        # <prefix>/.hpcstack/constraints.txt (every pin, for PIP_CONSTRAINT/UV_CONSTRAINT) and the
        # CycloneDX SBOM sbom.cdx.json; the module sets PYTHONNOUSERSITE=1
        StackManifest(),
        # sanity check: everything imports (horovodrun --check-build runs in HorovodBuild);
        # sklearn brings the digits data set of the classifier workload and examples/digits;
        # ipykernel runs the stack as a Jupyter kernel (`hpcstack kernel install`)
        Imports(("torch", "torchvision", "torchaudio", "torchmetrics", "torchtext", "tensorboard",
                 "tensorboard_plugin_profile", "tensorboard_plugin_wit", "torch_tb_profiler",
                 "horovod.torch", "sklearn", "ipykernel")),
        # the modulefile pytorch/2.3.1-gpu, written last; `module help` shows these launchers
        Modulefile(launch=(
            ("PyTorch DDP with torchrun, one launcher per node",
             "srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES --nproc-per-node={ranks_per_node} "
             "--rdzv-backend=c10d --rdzv-endpoint=$(hostname):29500 train.py"),
            ("Horovod on one node, without Slurm",
             "horovodrun -np {ranks_per_node} -H localhost:{ranks_per_node} python train.py"),
        ), cpu_note="This site has no GPUs: the CUDA build of torch runs on the CPUs here "
                    "(torch.cuda.is_available() is False; train with --device cpu)."),
        # what `hpcstack validate` trains per site and partition, and the performance references
        Validation("2.3.1-gpu.validation.yaml"),
    ])
