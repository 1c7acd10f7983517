# pytorch/2.14.1-gpu for site localhost as a container image: PyTorch 2.14.1 (CUDA 13.0) with torch.distributed (NCCL, Gloo) and TensorBoard.
# Written by hpcstack @VERSION@: hpcstack export pytorch/2.14.1-gpu --site localhost --format docker.
# Build context: this file, hpcstack-@VERSION@-py3-none-any.whl (`uv build` of hpcstack) and rootfs.tar (mmdebstrap --variant=minbase bookworm rootfs.tar).
# Share a cache of wheels and builds: mount a directory at /var/cache/hpcstack while building, e.g.
#   buildah --storage-driver vfs bud --isolation chroot --volume $PWD/cache:/var/cache/hpcstack -t hpcstack-pytorch:2.14.1-gpu .
# Run: podman run --rm hpcstack-pytorch:2.14.1-gpu --ranks 2   (the validation; or any command after --entrypoint)

FROM scratch
ADD ["rootfs.tar", "/"]

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
    bash "$HPCSTACK_DATA/scripts/localhost-setup"

# the site config used inside (site localhost: Python 3.11, the cache
# in /var/cache/hpcstack), then the install

RUN mkdir -p /opt/hpcstack/site-configs && \
    printf '%s\n' \
        'name: localhost' \
        'description: Debian/Ubuntu machine without GPU; Environment Modules, OpenMPI, CPU-only Horovod' \
        'install_root: /opt/hpcstack/software' \
        'module_root: /opt/hpcstack/modulefiles' \
        'modules:' \
        '  tool: environment-modules' \
        '  syntax: tcl' \
        '  init:' \
        '    bash: /usr/share/modules/init/bash' \
        '    sh: /usr/share/modules/init/sh' \
        '    zsh: /usr/share/modules/init/zsh' \
        '    csh: /usr/share/modules/init/csh' \
        '    fish: /usr/share/modules/init/fish' \
        '  use:' \
        '  - /opt/hpcstack/base-modulefiles' \
        '  base: python' \
        '  build: []' \
        '  runtime: []' \
        '  env:' \
        '    SLURM_MPI_TYPE: pmix' \
        'build:' \
        '  jobs: null' \
        'permissions:' \
        '  group: null' \
        '  mode: null' \
        'installer:' \
        '  backend: uv' \
        '  wheel_cache: null' \
        '  link_mode: copy' \
        '  compile_bytecode: true' \
        '  build_cache: true' \
        '  index_url: null' \
        'toolchain:' \
        '  cc: mpicc' \
        '  cxx: mpicxx' \
        '  cuda: null' \
        '  nccl: null' \
        'launcher:' \
        '  command: horovodrun' \
        '  ranks: 2' \
        '  env:' \
        "    OMPI_ALLOW_RUN_AS_ROOT: '1'" \
        "    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1'" \
        'python:' \
        "  version: '3.11'" \
        'cache_dir: /var/cache/hpcstack' \
        > /opt/hpcstack/site-configs/localhost.yaml && \
    hpcstack install pytorch/2.14.1-gpu --site /opt/hpcstack/site-configs/localhost.yaml && \
    if ! mountpoint -q /var/cache/hpcstack; then rm -rf /var/cache/hpcstack; fi

# the module's environment, set directly (login shells can also
# `module load pytorch/2.14.1-gpu`)

ENV HPCSTACK_PYTORCH_ROOT=/opt/hpcstack/software/pytorch/2.14.1-gpu \
    PATH=/opt/hpcstack/software/pytorch/2.14.1-gpu/venv/bin:/opt/hpcstack/software/pytorch/2.14.1-gpu/bin:${PATH} \
    PIP_CONSTRAINT=/opt/hpcstack/software/pytorch/2.14.1-gpu/.hpcstack/constraints.txt \
    PYTHONNOUSERSITE=1 \
    PYTHONPATH=/opt/hpcstack/software/pytorch/2.14.1-gpu/venv/lib/python3.11/site-packages \
    SLURM_MPI_TYPE=pmix \
    UV_CONSTRAINT=/opt/hpcstack/software/pytorch/2.14.1-gpu/.hpcstack/constraints.txt

LABEL org.hpcstack.lock="2.14.1-gpu.pypi.lock" \
    org.hpcstack.lock.sha256="@LOCK_SHA256@" \
    org.hpcstack.recipe="pytorch/2.14.1-gpu" \
    org.hpcstack.site="localhost" \
    org.hpcstack.version="@VERSION@" \
    org.opencontainers.image.description="PyTorch 2.14.1 (CUDA 13.0) with torch.distributed (NCCL, Gloo) and TensorBoard" \
    org.opencontainers.image.title="pytorch/2.14.1-gpu (localhost)"

# the validation trainer on the site's launcher; arguments are
# appended (--ranks 2)

ENTRYPOINT ["hpcstack", "validate", "pytorch/2.14.1-gpu", "--site", "/opt/hpcstack/site-configs/localhost.yaml", "--local"]
