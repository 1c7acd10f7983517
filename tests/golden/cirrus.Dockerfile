# pytorch/2.3.1-gpu for site cirrus as a container image: PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard.
# Written by hpcstack @VERSION@: hpcstack export pytorch/2.3.1-gpu --site cirrus --format docker.
# Build context: this file, hpcstack-@VERSION@-py3-none-any.whl (`uv build` of hpcstack).
# Share a cache of wheels and builds: mount a directory at /var/cache/hpcstack while building, e.g.
#   buildah --storage-driver vfs bud --isolation chroot --volume $PWD/cache:/var/cache/hpcstack -t hpcstack-pytorch:2.3.1-gpu .
# Run: podman run --rm hpcstack-pytorch:2.3.1-gpu --ranks 2   (the validation; or any command after --entrypoint)

FROM nvcr.io/nvidia/cuda:12.1.1-cudnn8-devel-ubuntu22.04@sha256:21196d81f56b48dbee70494d5f10322e1a77cc47ffe202a3bf68eab81533c20f

# the image's tools trust the image's CA bundle (a site's CAs added at
# build time too)

ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

# compilers, MPI, the module tool and Python from the package manager

RUN apt-get update -y && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential \
        ca-certificates \
        cmake \
        curl \
        environment-modules \
        libopenmpi-dev \
        openmpi-bin \
        patch \
        python3 \
        python3-dev \
        python3-venv \
        tcl && \
    rm -rf /var/lib/apt/lists/*

# hpcstack @VERSION@ from its wheel

COPY hpcstack-@VERSION@-py3-none-any.whl /opt/hpcstack/dist/hpcstack-@VERSION@-py3-none-any.whl

RUN PIP_CACHE_DIR=/var/cache/hpcstack/pip python3 -m venv /opt/hpcstack/tool && \
    /opt/hpcstack/tool/bin/python -c 'import sys, zipfile; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read("hpcstack/data/requirements/hpcstack.txt").decode())' /opt/hpcstack/dist/hpcstack-@VERSION@-py3-none-any.whl > /opt/hpcstack/dist/requirements.txt && \
    PIP_CACHE_DIR=/var/cache/hpcstack/pip /opt/hpcstack/tool/bin/pip install --disable-pip-version-check -q --require-hashes -r /opt/hpcstack/dist/requirements.txt && \
    PIP_CACHE_DIR=/var/cache/hpcstack/pip /opt/hpcstack/tool/bin/pip install --disable-pip-version-check -q --no-deps /opt/hpcstack/dist/hpcstack-@VERSION@-py3-none-any.whl && \
    ln -sfn /opt/hpcstack/tool/bin/hpcstack /usr/local/bin/hpcstack && \
    if ! mountpoint -q /var/cache/hpcstack; then rm -rf /var/cache/hpcstack; fi

# make the image a machine of the site ($HPCSTACK_DATA: hpcstack's own
# recipes, site configs and scripts)

RUN export HPCSTACK_DATA=$(/opt/hpcstack/tool/bin/python -c 'import hpcstack; print(hpcstack.data_root())') && \
    bash "$HPCSTACK_DATA/scripts/localhost-setup" && \
    mkdir -p /opt/nccl/lib && ln -sfn /usr/include /opt/nccl/include && ln -sfn /usr/lib/x86_64-linux-gnu/libnccl.so* /opt/nccl/lib/

# the site config used inside (site cirrus: its
# container.site_changes, Python 3.10, the cache in
# /var/cache/hpcstack), then the install

RUN mkdir -p /opt/hpcstack/site-configs && \
    printf '%s\n' \
        'name: cirrus-image' \
        "description: Cirrus V100 nodes' stack as an image (Ubuntu 22.04, CUDA 12.1, Open MPI, Environment Modules)" \
        'install_root: /opt/hpcstack/software' \
        'module_root: /opt/hpcstack/modulefiles' \
        'cache_dir: /var/cache/hpcstack' \
        'modules:' \
        '  tool: environment-modules' \
        '  syntax: tcl' \
        '  init:' \
        '    bash: /usr/share/modules/init/bash' \
        '    sh: /usr/share/modules/init/sh' \
        '  use:' \
        '  - /opt/hpcstack/base-modulefiles' \
        '  base: python' \
        'python:' \
        "  version: '3.10'" \
        'build:' \
        '  jobs: null' \
        '  env: {}' \
        'installer:' \
        '  backend: uv' \
        '  wheel_cache: null' \
        '  link_mode: copy' \
        '  compile_bytecode: true' \
        '  build_cache: true' \
        'toolchain:' \
        '  cc: mpicc' \
        '  cxx: mpicxx' \
        '  cuda:' \
        '    home: /usr/local/cuda' \
        "    version: '12.1'" \
        '    cc_list:' \
        '    - 70' \
        '    stubs: /usr/local/cuda/lib64/stubs' \
        '  nccl:' \
        '    home: /opt/nccl' \
        'launcher:' \
        '  command: horovodrun' \
        '  ranks: 4' \
        '  env:' \
        "    OMPI_ALLOW_RUN_AS_ROOT: '1'" \
        "    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1'" \
        'network:' \
        '  fabric: infiniband' \
        '  nvlink: true' \
        > /opt/hpcstack/site-configs/cirrus-image.yaml && \
    hpcstack install pytorch/2.3.1-gpu --site /opt/hpcstack/site-configs/cirrus-image.yaml && \
    if ! mountpoint -q /var/cache/hpcstack; then rm -rf /var/cache/hpcstack; fi

# the module's environment, set directly (login shells can also
# `module load pytorch/2.3.1-gpu`)

ENV HPCSTACK_PYTORCH_ROOT=/opt/hpcstack/software/pytorch/2.3.1-gpu \
    PATH=/opt/hpcstack/software/pytorch/2.3.1-gpu/venv/bin:/opt/hpcstack/software/pytorch/2.3.1-gpu/bin:${PATH} \
    PIP_CONSTRAINT=/opt/hpcstack/software/pytorch/2.3.1-gpu/.hpcstack/constraints.txt \
    PYTHONNOUSERSITE=1 \
    PYTHONPATH=/opt/hpcstack/software/pytorch/2.3.1-gpu/venv/lib/python3.10/site-packages \
    UV_CONSTRAINT=/opt/hpcstack/software/pytorch/2.3.1-gpu/.hpcstack/constraints.txt

LABEL org.hpcstack.lock="2.3.1-gpu.pypi.lock" \
    org.hpcstack.lock.sha256="@LOCK_SHA256@" \
    org.hpcstack.recipe="pytorch/2.3.1-gpu" \
    org.hpcstack.site="cirrus" \
    org.hpcstack.version="@VERSION@" \
    org.opencontainers.image.description="PyTorch 2.3.1 (CUDA 12.1) with Horovod 0.28.1 and TensorBoard" \
    org.opencontainers.image.title="pytorch/2.3.1-gpu (cirrus)"

# the validation trainer on the site's launcher; arguments are
# appended (--ranks 2)

ENTRYPOINT ["hpcstack", "validate", "pytorch/2.3.1-gpu", "--site", "/opt/hpcstack/site-configs/cirrus-image.yaml", "--local"]
