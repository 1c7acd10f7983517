#!/bin/bash
# hpcstack 0.3.0: install mpi4py/4.1.2 for site perlmutter
# prefix: /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2 (published by the module step)
# stage prefix: /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@ (build @BUILD@)
# modulefile: /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/4.1.2.lua
set -euo pipefail
cd /  # every command runs in a directory of root's, never the caller's
module load python
module load cudatoolkit/12.2
module load cray-mpich
module load nccl/2.21.5

# --- background: fetch and patch, one after the other, while venv and wheels run; step build waits for them
(
# --- step fetch: download sources and check their sha256
hpcstack action fetch --sha256 56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02 https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz /global/common/software/PROJECT/hpcstack/.hpcstack/cache/sources/mpi4py-4.1.2.tar.gz
# --- step patch: unpack sources into the stage dir and apply patches
# no wheel of this version in the build cache: the build step will compile; unpack and
# patch now, while the wheels install, and leave the stamp the build step looks for
if ! ls /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/mpi4py-4.1.2/*/*.whl >/dev/null 2>&1; then
  rm -f /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared
  hpcstack action unpack /global/common/software/PROJECT/hpcstack/.hpcstack/cache/sources/mpi4py-4.1.2.tar.gz /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src
  echo dcaf81ad7808d87bd6c9841ab19f49b306f5905a7e238e28d17e947e48c311f6 > /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared
fi
# --- end of the background
) &
hpcstack_background=$!

# --- step venv: create the venv on top of the site's Python module
python3 -m venv --clear --without-pip /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv
mkdir -p /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages/.00-hpcstack-paths.pth.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
# hpcstack: this stack's site-packages by its real path, after the standard library (fewer file-system calls per import, and the build a process started with)
import sys; sys.path[:] = [p for p in sys.path if p not in ('/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/venv/lib/python3.11/site-packages', '/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages')] + ['/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages']
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages/00-hpcstack-paths.pth

# --- step wheels: install the pinned wheels from the lock file in one resolution
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE PYC_INVALIDATION_MODE=UNCHECKED_HASH @UV@ pip install --python /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config --cache-dir /global/common/software/PROJECT/hpcstack/.hpcstack/cache/uv --link-mode hardlink --compile-bytecode --require-hashes -r @HPCSTACK_DATA@/recipes/mpi4py/4.1.2.pypi.lock

# --- wait for the background: fetch and patch (a failure there stops the script here)
wait "$hpcstack_background"

# --- step build: build from source with the site's compilers and libraries
# the wheel cache: the key hashes everything that changes the mpi4py binary
hpcstack_build_key_mpi4py() {
  (
    set +eu -o pipefail
    export CC=cc
    export CXX=CC
    export MPICC=cc
    export MPICXX=CC
    export FC=ftn
    export MPIFC=ftn
    export MPICH_GPU_SUPPORT_ENABLED=0
    export MAKEFLAGS=-j8
    echo 'hpcstack build key v2'
    echo 'package mpi4py 4.1.2'
    echo 'sdist mpi4py-4.1.2.tar.gz sha256 56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02'
    echo '--- python'; { /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python -c 'import importlib.metadata as m, sys, sysconfig; print(sys.version); print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); print("abi", sysconfig.get_config_var("SOABI"), sysconfig.get_config_var("EXT_SUFFIX"), getattr(sys, "abiflags", "")); [print(p, m.version(p)) for p in []]'; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- variables'; { env | LC_ALL=C grep -E '^(HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS|MPICH_GPU_SUPPORT_ENABLED)=' | LC_ALL=C sort; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- C compiler'; { "${CC:-cc}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- C++ compiler'; { "${CXX:-c++}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- Fortran compiler'; { "${FC:-gfortran}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- MPI'; { mpi="${MPICC:-${CC:-mpicc}}"; if "$mpi" -showme:version >/dev/null 2>&1; then "$mpi" -showme; "$mpi" -showme:version; else "$mpi" -show; "$mpi" -v 2>&1 | sed -n 1p; fi; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- cmake'; { cmake --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- MPI'; { cc -show 2>&1; cc --showme:version 2>&1 || cc -v 2>&1; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
  )
}
hpcstack_build_key_mpi4py_key=$(hpcstack_build_key_mpi4py | sha256sum | cut -c1-24)
if hpcstack action reuse-wheel mpi4py /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/mpi4py-4.1.2/"${hpcstack_build_key_mpi4py_key}" /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/dist; then
  echo "mpi4py: build key ${hpcstack_build_key_mpi4py_key}"
else
  if [ "$(cat /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared 2>/dev/null)" = dcaf81ad7808d87bd6c9841ab19f49b306f5905a7e238e28d17e947e48c311f6 ]; then
    rm -f /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared  # unpacked and patched by the patch step
  else
    hpcstack action unpack /global/common/software/PROJECT/hpcstack/.hpcstack/cache/sources/mpi4py-4.1.2.tar.gz /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src
  fi
  rm -rf /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/dist
  env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE CC=cc CXX=CC MPICC=cc MPICXX=CC FC=ftn MPIFC=ftn MPICH_GPU_SUPPORT_ENABLED=0 MAKEFLAGS=-j8 TMPDIR=/global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2 @UV@ build --no-config --cache-dir /global/common/software/PROJECT/hpcstack/.hpcstack/cache/uv --python /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-build-isolation --wheel --out-dir /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/dist /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/src/mpi4py-4.1.2
  mkdir -p /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/mpi4py-4.1.2 && tmp=$(mktemp -d /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/mpi4py-4.1.2/.new-XXXXXX) && chmod 755 "$tmp" && cp /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/dist/*.whl "$tmp"/ \
    && (cd "$tmp" && sha256sum -- *.whl > SHA256SUMS && chmod 644 -- *.whl SHA256SUMS) \
    && hpcstack_build_key_mpi4py > "$tmp/key.txt" && { mv -T "$tmp" /global/common/software/PROJECT/hpcstack/.hpcstack/cache/builds/mpi4py-4.1.2/"${hpcstack_build_key_mpi4py_key}" 2>/dev/null || rm -rf "$tmp"; }
fi

# --- step install: install built packages and the stack's tools
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE PYC_INVALIDATION_MODE=UNCHECKED_HASH @UV@ pip install --python /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config --cache-dir /global/common/software/PROJECT/hpcstack/.hpcstack/cache/uv --link-mode hardlink --compile-bytecode --reinstall-package mpi4py --no-deps --no-index --find-links /global/common/software/PROJECT/hpcstack/.hpcstack/stage/mpi4py-4.1.2/dist mpi4py==4.1.2
bash -c 'printf "[mpi]\nmpicc = %s\n" "$(command -v "$1")" > "$2"' mpi.cfg cc /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages/mpi4py/mpi.cfg
mkdir -p /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/.hpcstack
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/.hpcstack/.constraints.txt.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
# Constraints of the stack mpi4py/4.1.2: every package it holds, at its version.
# Set as PIP_CONSTRAINT and UV_CONSTRAINT by its module (hpcstack), so that a pip
# or uv install next to the stack cannot bring another version of them.
build==1.6.1
colorama==0.4.6 ; os_name == 'nt'
cython==3.3.1
importlib-metadata==9.0.1 ; python_full_version < '3.10.2'
packaging==26.4
pyproject-hooks==1.3.3
setuptools==84.2.1
tomli==2.5.0 ; python_full_version < '3.11'
wheel==0.48.0
zipp==4.1.2 ; python_full_version < '3.10.2'
mpi4py==4.1.2
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/.hpcstack/constraints.txt
hpcstack action sbom --spec '{"builds": [{"env": {"CC": "cc", "CXX": "CC", "FC": "ftn", "MPICC": "cc", "MPICH_GPU_SUPPORT_ENABLED": "0", "MPICXX": "CC", "MPIFC": "ftn"}, "package": "mpi4py", "patches": [], "probes": [["python", "/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python -c '"'"'import importlib.metadata as m, sys, sysconfig; print(sys.version); print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); print(\"abi\", sysconfig.get_config_var(\"SOABI\"), sysconfig.get_config_var(\"EXT_SUFFIX\"), getattr(sys, \"abiflags\", \"\")); [print(p, m.version(p)) for p in []]'"'"'"], ["variables", "env | LC_ALL=C grep -E '"'"'^(HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS|MPICH_GPU_SUPPORT_ENABLED)='"'"' | LC_ALL=C sort"], ["C compiler", "\"${CC:-cc}\" --version"], ["C++ compiler", "\"${CXX:-c++}\" --version"], ["Fortran compiler", "\"${FC:-gfortran}\" --version"], ["MPI", "mpi=\"${MPICC:-${CC:-mpicc}}\"; if \"$mpi\" -showme:version >/dev/null 2>&1; then \"$mpi\" -showme; \"$mpi\" -showme:version; else \"$mpi\" -show; \"$mpi\" -v 2>&1 | sed -n 1p; fi"], ["cmake", "cmake --version"], ["MPI", "cc -show 2>&1; cc --showme:version 2>&1 || cc -v 2>&1"]], "sha256": "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02", "url": "https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz", "version": "4.1.2"}], "description": "mpi4py 4.1.2 (MPI for Python) built against the site'"'"'s MPI", "lock": "@HPCSTACK_DATA@/recipes/mpi4py/4.1.2.pypi.lock", "name": "mpi4py", "prefix": "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2", "site": "perlmutter", "site_packages": "/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.11/site-packages", "version": "4.1.2"}' /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/.hpcstack/sbom.cdx.json
install -D -m 0755 @HPCSTACK_DATA@/../doctor.py /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/bin/hpcstack-doctor
install -m 0755 @HPCSTACK_DATA@/recipes/mpi4py/mpi4py-validate /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/bin/mpi4py-validate

# --- step sanitycheck: check imports, build flags and dependencies
# in the background, while the actions after it run; the step waits for it at its end
/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python -c 'import os, sys
import mpi4py
import mpi4py.MPI
import mpi4py.bench
print("imports ok: mpi4py, mpi4py.MPI, mpi4py.bench")
sys.stdout.flush(); sys.stderr.flush(); os._exit(0)' &
hpcstack_sanitycheck_1=$!
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE @UV@ pip check --python /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config
/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python @HPCSTACK_DATA@/recipes/mpi4py/mpi4py-sanity cc
/global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/bin/hpcstack-doctor --help
mkdir -p /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/.hpcstack && @UV@ pip freeze --python /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config > /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@/.hpcstack/pip-freeze.txt
wait "$hpcstack_sanitycheck_1"

# --- step permissions: make the stack world-readable and not world-writable
chmod -R u+rwX,go+rX,go-w /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-@BUILD@
find /global/common/software/PROJECT/hpcstack/mpi4py -maxdepth 0 -user @USER@ -exec chmod u+rwX,go+rX,go-w '{}' +

# --- step module: publish the stack (switch its prefix link atomically) and write the modulefile
[ -L /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2 ] || [ ! -d /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2 ] || mv -T /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2 /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2-pre-staging
ln -sfn .4.1.2-@BUILD@ /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2.publish-tmp
mv -T /global/common/software/PROJECT/hpcstack/mpi4py/.4.1.2.publish-tmp /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2
mkdir -p /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.4.1.2.lua.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
-- mpi4py/4.1.2: mpi4py 4.1.2 (MPI for Python) built against the site's MPI
-- Written by hpcstack 0.3.0 from recipe mpi4py/4.1.2 for site perlmutter.

help([[
mpi4py/4.1.2: mpi4py 4.1.2 (MPI for Python) built against the site's MPI

Load it with `module load mpi4py/4.1.2`; it loads python first (depends-on).
The stack lives in /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2 (HPCSTACK_MPI4PY_ROOT); its python is on PATH and its
site-packages on PYTHONPATH.

Your own packages on top of the stack: make a venv and extend it, e.g.
    module load mpi4py/4.1.2
    python -m venv ~/myvenv
    extend-venv-activate ~/myvenv
Then `source ~/myvenv/bin/activate` loads this module (if it is not loaded yet) and
puts the venv first, and `deactivate` unloads it again (only if activate loaded it).
`extend-venv-activate --help` says more; `extend-venv-activate --undo ~/myvenv`
restores the venv's original activate scripts.

As a Jupyter kernel (JupyterLab, JupyterHub, Open OnDemand), in the stack's own
Python and ipykernel; the kernel loads this module when it starts (run it with
this module loaded: it finds the site itself):
    hpcstack kernel install mpi4py/4.1.2 --user
(add --venv ~/myvenv for a venv extended as above); undo it with
    hpcstack kernel remove mpi4py/4.1.2 --user

What is in it (every package and its version: /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/.hpcstack/pip-freeze.txt):
    build 1.6.1, cython 3.3.1, mpi4py 4.1.2

What loading it changes (unloading restores each):
    HPCSTACK_MPI4PY_ROOT:
    /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2, the stack
    PATH: $HPCSTACK_MPI4PY_ROOT/venv/bin and $HPCSTACK_MPI4PY_ROOT/bin
    first: the stack's python, extend-venv-activate, hpcstack-doctor, and a
    `pip` that says where your packages go (the stack itself is read-only)
    PYTHONPATH: $HPCSTACK_MPI4PY_ROOT/venv/lib/python3.11/site-packages (an
    extended venv puts its own first)
    PYTHONNOUSERSITE=1: packages in your user site (~/.local, `pip install
    --user`) are not imported; a value of your own is replaced
    PIP_CONSTRAINT,
    UV_CONSTRAINT=$HPCSTACK_MPI4PY_ROOT/.hpcstack/constraints.txt: replace
    your own settings; pip and uv keep the stack's versions of its packages
    in your venv (and refuse what breaks them)
    NCCL_SOCKET_IFNAME=hsn: set for everyone on this site (its modules.env;
    your own value after `module load` wins)
    MPICH_GPU_SUPPORT_ENABLED=0: set for everyone on this site (its
    modules.env; your own value after `module load` wins)
    SLURM_EXPORT_ENV: NONE (a job of `sbatch --export=NONE`) becomes ALL, so
    the tasks srun starts get this module's environment

Your own packages: not with `pip install --user` (this module hides ~/.local,
PYTHONNOUSERSITE=1) but in a venv extended for this module:
    python -m venv ~/myvenv && extend-venv-activate ~/myvenv
    source ~/myvenv/bin/activate && pip install PACKAGE
`hpcstack-doctor` checks that venv (or, with none active, ~/.local).

How to launch on perlmutter (a batch script; `sbatch script`):
    #SBATCH --qos=regular --constraint=gpu --nodes=2 --ntasks-per-node=4 --cpus-per-task=32 --gpus-per-node=4 --exclusive
    module load mpi4py/4.1.2
    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
    srun python train.py                   # one rank per task (MPI, Horovod)
]])

whatis("Description: mpi4py 4.1.2 (MPI for Python) built against the site's MPI")

family("mpi4py")
whatis("Version: 4.1.2")
whatis("Packages: build 1.6.1, cython 3.3.1, mpi4py 4.1.2")
whatis("Keywords: mpi4py, build, cython")
whatis("Hardware: GPUs, CUDA 12.2 (site perlmutter)")

depends_on("python")
depends_on("cudatoolkit/12.2")
depends_on("cray-mpich")
depends_on("nccl/2.21.5")

if mode() == "load" and (os.getenv("VIRTUAL_ENV") or "") ~= "" then
    local venv = os.getenv("VIRTUAL_ENV")
    local activate = pathJoin(venv, "bin", "activate")
    local found, P = pcall(require, "posix")
    local checked = found and type(P) == "table" and P.open and P.read and P.close and P.O_NONBLOCK
    local text = ""
    if checked and venv:sub(1, 1) == "/" and activate:sub(1, 1) == "/" then
        local fd = P.open(activate, P.O_RDONLY + P.O_NONBLOCK)
        if fd then
            local ok, chunk = pcall(P.read, fd, 1048576)
            text = ok and type(chunk) == "string" and chunk or ""
            P.close(fd)
        end
    end
    if checked and not text:find("# >>> hpcstack mpi4py/4.1.2 >>>", 1, true) then
        local shown = venv:gsub("%c", "?")
        LmodMessage((("mpi4py/4.1.2: the active venv @VENV@ is not extended for this module, so `python` is now the stack's while `pip` installs into the venv, where that python does not look; fix: module unload mpi4py/4.1.2; deactivate; module load mpi4py/4.1.2; extend-venv-activate @VENV@; source @VENV@/bin/activate"):gsub("@VENV@", function() return shown end)))
    end
end

if mode() == "load" then
    local ok, verdict = pcall(function()
        if lfs.attributes("/global/common/software/PROJECT/hpcstack/modulefiles/.hpcstack-status.json", "mode") ~= "file" then return nil end
        local fh = io.open("/global/common/software/PROJECT/hpcstack/modulefiles/.hpcstack-status.json", "r")
        if not fh then return nil end
        local text = fh:read(65536) or ""
        fh:close()
        local needle = "\n\"mpi4py/4.1.2\": \""
        local at = text:find(needle, 1, true)
        if not at then return nil end
        return text:match('^([^"\n]+)"', at + #needle)
    end)
    if ok and verdict then
        LmodMessage("mpi4py/4.1.2: " .. verdict .. " (hpcstack status for details)")
    end
end

if mode() == "load" and os.getenv("SLURM_EXPORT_ENV") == "NONE" then
    setenv("SLURM_EXPORT_ENV", "ALL")
end

if mode() == "load" and not isFile("/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/venv/pyvenv.cfg") then
    LmodError("mpi4py/4.1.2: its stack /global/common/software/PROJECT/hpcstack/mpi4py/4.1.2 is missing or unreadable on this machine; tell the site's admins (`module avail mpi4py` lists the other versions)")
end

local root = "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2"
setenv("HPCSTACK_MPI4PY_ROOT", root)
prepend_path("PATH", "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/bin")
prepend_path("PATH", "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/venv/bin")
prepend_path("PYTHONPATH", "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/venv/lib/python3.11/site-packages")
setenv("PYTHONNOUSERSITE", "1")
setenv("PIP_CONSTRAINT", "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/.hpcstack/constraints.txt")
setenv("UV_CONSTRAINT", "/global/common/software/PROJECT/hpcstack/mpi4py/4.1.2/.hpcstack/constraints.txt")
setenv("NCCL_SOCKET_IFNAME", "hsn")
setenv("MPICH_GPU_SUPPORT_ENABLED", "0")
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/4.1.2.lua
# default version, only if mpi4py has none yet
if ! { [ -e /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.modulerc ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.modulerc ] || [ -e /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.version ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.version ] || [ -e /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.modulerc.lua ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.modulerc.lua ] || [ -e /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/default ] || [ -L /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/default ]; }; then
mkdir -p /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py
hpcstack_tmp=$(mktemp /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/..modulerc.lua.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
-- The default version of mpi4py: `module load mpi4py` loads mpi4py/4.1.2.
-- Written by hpcstack module set-default; read by Lmod (before .modulerc and .version).
-- Change it with: hpcstack module set-default mpi4py/VERSION --site perlmutter
module_version("mpi4py/4.1.2", "default")
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /global/common/software/PROJECT/hpcstack/modulefiles/mpi4py/.modulerc.lua
fi

# afterwards hpcstack removes earlier builds of the stack but the one this replaced
