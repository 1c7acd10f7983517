-- pytorch/2.3.1-gpu: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1
-- Written by hpcstack 0.1.0 from recipe pytorch/2.3.1-gpu for site cirrus.

help([[
pytorch/2.3.1-gpu: PyTorch with Horovod

  extend-venv-activate ~/myvenv
]])

whatis("Description: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1")

family("pytorch")

depends_on("python/3.12.1-gpu")

local root = "/sw/pytorch/2.3.1-gpu"
setenv("HPCSTACK_PYTORCH_ROOT", root)
prepend_path("PATH", "/sw/pytorch/2.3.1-gpu/bin")
prepend_path("PATH", "/sw/pytorch/2.3.1-gpu/venv/bin")
prepend_path("PYTHONPATH", "/sw/pytorch/2.3.1-gpu/venv/lib/python3.12/site-packages")
