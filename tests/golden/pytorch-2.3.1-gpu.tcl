#%Module1.0
##
## pytorch/2.3.1-gpu: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1
## Written by hpcstack 0.1.0 from recipe pytorch/2.3.1-gpu for site cirrus.
##
proc ModulesHelp { } {
    puts stderr {pytorch/2.3.1-gpu: PyTorch with Horovod}
    puts stderr ""
    puts stderr {  extend-venv-activate ~/myvenv}
}

module-whatis {Description: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1}

conflict pytorch

depends-on python/3.12.1-gpu

set root {/sw/pytorch/2.3.1-gpu}
setenv HPCSTACK_PYTORCH_ROOT $root
prepend-path PATH {/sw/pytorch/2.3.1-gpu/bin}
prepend-path PATH {/sw/pytorch/2.3.1-gpu/venv/bin}
prepend-path PYTHONPATH {/sw/pytorch/2.3.1-gpu/venv/lib/python3.12/site-packages}
