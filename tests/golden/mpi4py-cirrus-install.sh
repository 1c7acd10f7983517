#!/bin/bash
# hpcstack 0.3.0: install mpi4py/4.1.2 for site cirrus
# prefix: /work/y07/shared/cirrus-software/mpi4py/4.1.2 (published by the module step)
# stage prefix: /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@ (build @BUILD@)
# modulefile: /work/y07/shared/cirrus-modulefiles/mpi4py/4.1.2
set -euo pipefail
cd /  # every command runs in a directory of root's, never the caller's
module load python/3.12.1-gpu
module load cmake/3.25.2

# --- background: fetch and patch, one after the other, while venv and wheels run; step build waits for them
(
# --- step fetch: download sources and check their sha256
hpcstack action fetch --sha256 56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02 https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz /work/y07/shared/cirrus-software/.hpcstack/cache/sources/mpi4py-4.1.2.tar.gz
# --- step patch: unpack sources into the stage dir and apply patches
# no wheel of this version in the build cache: the build step will compile; unpack and
# patch now, while the wheels install, and leave the stamp the build step looks for
if ! ls /work/y07/shared/cirrus-software/.hpcstack/cache/builds/mpi4py-4.1.2/*/*.whl >/dev/null 2>&1; then
  rm -f /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared
  hpcstack action unpack /work/y07/shared/cirrus-software/.hpcstack/cache/sources/mpi4py-4.1.2.tar.gz /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src
  echo dcaf81ad7808d87bd6c9841ab19f49b306f5905a7e238e28d17e947e48c311f6 > /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared
fi
# --- end of the background
) &
hpcstack_background=$!

# --- step venv: create the venv on top of the site's Python module
python3 -m venv --clear --without-pip /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv
mkdir -p /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages
hpcstack_tmp=$(mktemp /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages/.00-hpcstack-paths.pth.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
# hpcstack: this stack's site-packages by its real path, after the standard library (fewer file-system calls per import, and the build a process started with)
import sys; sys.path[:] = [p for p in sys.path if p not in ('/work/y07/shared/cirrus-software/mpi4py/4.1.2/venv/lib/python3.12/site-packages', '/work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages')] + ['/work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages']
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages/00-hpcstack-paths.pth

# --- step wheels: install the pinned wheels from the lock file in one resolution
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE PYC_INVALIDATION_MODE=UNCHECKED_HASH @UV@ pip install --python /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config --cache-dir /work/y07/shared/cirrus-software/.hpcstack/cache/uv --link-mode hardlink --compile-bytecode --require-hashes -r @HPCSTACK_DATA@/recipes/mpi4py/4.1.2.pypi.lock

# --- wait for the background: fetch and patch (a failure there stops the script here)
wait "$hpcstack_background"

# --- step build: build from source with the site's compilers and libraries
# the wheel cache: the key hashes everything that changes the mpi4py binary
hpcstack_build_key_mpi4py() {
  (
    set +eu -o pipefail
    export CC=mpicc
    export CXX=mpicxx
    export MPICC=mpicc
    export MPICXX=mpicxx
    export FC=mpifort
    export MPIFC=mpifort
    export CUDA_PATH="${NVHPC_ROOT}/cuda/12.4"
    export MAKEFLAGS=-j8
    echo 'hpcstack build key v2'
    echo 'package mpi4py 4.1.2'
    echo 'sdist mpi4py-4.1.2.tar.gz sha256 56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02'
    echo '--- python'; { /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python -c 'import importlib.metadata as m, sys, sysconfig; print(sys.version); print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); print("abi", sysconfig.get_config_var("SOABI"), sysconfig.get_config_var("EXT_SUFFIX"), getattr(sys, "abiflags", "")); [print(p, m.version(p)) for p in []]'; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- variables'; { env | LC_ALL=C grep -E '^(HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS)=' | LC_ALL=C sort; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- C compiler'; { "${CC:-cc}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- C++ compiler'; { "${CXX:-c++}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- Fortran compiler'; { "${FC:-gfortran}" --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- MPI'; { mpi="${MPICC:-${CC:-mpicc}}"; if "$mpi" -showme:version >/dev/null 2>&1; then "$mpi" -showme; "$mpi" -showme:version; else "$mpi" -show; "$mpi" -v 2>&1 | sed -n 1p; fi; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- cmake'; { cmake --version; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
    echo '--- MPI'; { mpicc -show 2>&1; mpicc --showme:version 2>&1 || mpicc -v 2>&1; } 2>&1 | sed -E 's/^[^:]*: line [0-9]+: //' || echo "(exit $?)"
  )
}
hpcstack_build_key_mpi4py_key=$(hpcstack_build_key_mpi4py | sha256sum | cut -c1-24)
if hpcstack action reuse-wheel mpi4py /work/y07/shared/cirrus-software/.hpcstack/cache/builds/mpi4py-4.1.2/"${hpcstack_build_key_mpi4py_key}" /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/dist; then
  echo "mpi4py: build key ${hpcstack_build_key_mpi4py_key}"
else
  if [ "$(cat /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared 2>/dev/null)" = dcaf81ad7808d87bd6c9841ab19f49b306f5905a7e238e28d17e947e48c311f6 ]; then
    rm -f /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src/.mpi4py-4.1.2.prepared  # unpacked and patched by the patch step
  else
    hpcstack action unpack /work/y07/shared/cirrus-software/.hpcstack/cache/sources/mpi4py-4.1.2.tar.gz /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src
  fi
  rm -rf /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/dist
  env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE CC=mpicc CXX=mpicxx MPICC=mpicc MPICXX=mpicxx FC=mpifort MPIFC=mpifort CUDA_PATH="${NVHPC_ROOT}/cuda/12.4" MAKEFLAGS=-j8 TMPDIR=/work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2 @UV@ build --no-config --cache-dir /work/y07/shared/cirrus-software/.hpcstack/cache/uv --python /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-build-isolation --wheel --out-dir /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/dist /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/src/mpi4py-4.1.2
  mkdir -p /work/y07/shared/cirrus-software/.hpcstack/cache/builds/mpi4py-4.1.2 && tmp=$(mktemp -d /work/y07/shared/cirrus-software/.hpcstack/cache/builds/mpi4py-4.1.2/.new-XXXXXX) && chmod 755 "$tmp" && cp /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/dist/*.whl "$tmp"/ \
    && (cd "$tmp" && sha256sum -- *.whl > SHA256SUMS && chmod 644 -- *.whl SHA256SUMS) \
    && hpcstack_build_key_mpi4py > "$tmp/key.txt" && { mv -T "$tmp" /work/y07/shared/cirrus-software/.hpcstack/cache/builds/mpi4py-4.1.2/"${hpcstack_build_key_mpi4py_key}" 2>/dev/null || rm -rf "$tmp"; }
fi

# --- step install: install built packages and the stack's tools
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE PYC_INVALIDATION_MODE=UNCHECKED_HASH @UV@ pip install --python /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config --cache-dir /work/y07/shared/cirrus-software/.hpcstack/cache/uv --link-mode hardlink --compile-bytecode --reinstall-package mpi4py --no-deps --no-index --find-links /work/y07/shared/cirrus-software/.hpcstack/stage/mpi4py-4.1.2/dist mpi4py==4.1.2
bash -c 'printf "[mpi]\nmpicc = %s\n" "$(command -v "$1")" > "$2"' mpi.cfg mpicc /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages/mpi4py/mpi.cfg
mkdir -p /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/.hpcstack
hpcstack_tmp=$(mktemp /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/.hpcstack/.constraints.txt.XXXXXX)
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
mv -fT "$hpcstack_tmp" /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/.hpcstack/constraints.txt
hpcstack action sbom --spec '{"builds": [{"env": {"CC": "mpicc", "CUDA_PATH": "${NVHPC_ROOT}/cuda/12.4", "CXX": "mpicxx", "FC": "mpifort", "MPICC": "mpicc", "MPICXX": "mpicxx", "MPIFC": "mpifort"}, "package": "mpi4py", "patches": [], "probes": [["python", "/work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python -c '"'"'import importlib.metadata as m, sys, sysconfig; print(sys.version); print(sys.base_prefix, sysconfig.get_platform(), sys.implementation.cache_tag); print(\"abi\", sysconfig.get_config_var(\"SOABI\"), sysconfig.get_config_var(\"EXT_SUFFIX\"), getattr(sys, \"abiflags\", \"\")); [print(p, m.version(p)) for p in []]'"'"'"], ["variables", "env | LC_ALL=C grep -E '"'"'^(HOROVOD_[A-Z0-9_]*|CC|CXX|FC|MPICC|MPICXX|MPIFC|CFLAGS|CXXFLAGS|CPPFLAGS|FFLAGS|LDFLAGS|CUDA_HOME|CUDA_PATH|NCCL_HOME|MPI_HOME|NVCC_(APPEND|PREPEND)_FLAGS)='"'"' | LC_ALL=C sort"], ["C compiler", "\"${CC:-cc}\" --version"], ["C++ compiler", "\"${CXX:-c++}\" --version"], ["Fortran compiler", "\"${FC:-gfortran}\" --version"], ["MPI", "mpi=\"${MPICC:-${CC:-mpicc}}\"; if \"$mpi\" -showme:version >/dev/null 2>&1; then \"$mpi\" -showme; \"$mpi\" -showme:version; else \"$mpi\" -show; \"$mpi\" -v 2>&1 | sed -n 1p; fi"], ["cmake", "cmake --version"], ["MPI", "mpicc -show 2>&1; mpicc --showme:version 2>&1 || mpicc -v 2>&1"]], "sha256": "56860286dc45f20e8821e93cb06669e30462348bf866f685553fa4b712d58d02", "url": "https://files.pythonhosted.org/packages/75/83/231445bbcf7ef10864746c244ff2d82000011449b79275642c5d4ed8c8f4/mpi4py-4.1.2.tar.gz", "version": "4.1.2"}], "description": "mpi4py 4.1.2 (MPI for Python) built against the site'"'"'s MPI", "lock": "@HPCSTACK_DATA@/recipes/mpi4py/4.1.2.pypi.lock", "name": "mpi4py", "prefix": "/work/y07/shared/cirrus-software/mpi4py/4.1.2", "site": "cirrus", "site_packages": "/work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/lib/python3.12/site-packages", "version": "4.1.2"}' /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/.hpcstack/sbom.cdx.json
install -D -m 0755 @HPCSTACK_DATA@/../doctor.py /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/bin/hpcstack-doctor
install -m 0755 @HPCSTACK_DATA@/recipes/mpi4py/mpi4py-validate /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/bin/mpi4py-validate

# --- step sanitycheck: check imports, build flags and dependencies
# in the background, while the actions after it run; the step waits for it at its end
LD_LIBRARY_PATH="${NVHPC_ROOT}/cuda/lib64/stubs${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python -c 'import os, sys
import mpi4py
import mpi4py.MPI
import mpi4py.bench
print("imports ok: mpi4py, mpi4py.MPI, mpi4py.bench")
sys.stdout.flush(); sys.stderr.flush(); os._exit(0)' &
hpcstack_sanitycheck_1=$!
env -u UV_CONFIG_FILE -u UV_INDEX -u UV_DEFAULT_INDEX -u UV_INDEX_URL -u UV_EXTRA_INDEX_URL -u UV_FIND_LINKS -u UV_NO_INDEX -u UV_INDEX_STRATEGY -u UV_TORCH_BACKEND -u UV_INSECURE_HOST -u UV_NO_VERIFY_HASHES -u UV_CONSTRAINT -u UV_OVERRIDE -u UV_BUILD_CONSTRAINT -u UV_EXCLUDE_NEWER -u UV_PRERELEASE -u UV_RESOLUTION -u UV_NO_BINARY -u UV_NO_BUILD -u UV_NO_BUILD_ISOLATION -u UV_SYSTEM_PYTHON -u UV_BREAK_SYSTEM_PACKAGES -u UV_NO_CACHE -u UV_COMPILE_BYTECODE @UV@ pip check --python /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config
/work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python @HPCSTACK_DATA@/recipes/mpi4py/mpi4py-sanity mpicc
/work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/bin/hpcstack-doctor --help
mkdir -p /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/.hpcstack && @UV@ pip freeze --python /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/venv/bin/python --no-config > /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@/.hpcstack/pip-freeze.txt
wait "$hpcstack_sanitycheck_1"

# --- step permissions: make the stack world-readable and not world-writable
chmod -R u+rwX,go+rX,go-w /work/y07/shared/cirrus-software/mpi4py/.4.1.2-@BUILD@
find /work/y07/shared/cirrus-software/mpi4py -maxdepth 0 -user @USER@ -exec chmod u+rwX,go+rX,go-w '{}' +

# --- step module: publish the stack (switch its prefix link atomically) and write the modulefile
[ -L /work/y07/shared/cirrus-software/mpi4py/4.1.2 ] || [ ! -d /work/y07/shared/cirrus-software/mpi4py/4.1.2 ] || mv -T /work/y07/shared/cirrus-software/mpi4py/4.1.2 /work/y07/shared/cirrus-software/mpi4py/.4.1.2-pre-staging
ln -sfn .4.1.2-@BUILD@ /work/y07/shared/cirrus-software/mpi4py/.4.1.2.publish-tmp
mv -T /work/y07/shared/cirrus-software/mpi4py/.4.1.2.publish-tmp /work/y07/shared/cirrus-software/mpi4py/4.1.2
mkdir -p /work/y07/shared/cirrus-modulefiles/mpi4py
hpcstack_tmp=$(mktemp /work/y07/shared/cirrus-modulefiles/mpi4py/.4.1.2.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
#%Module1.0
##
## mpi4py/4.1.2: mpi4py 4.1.2 (MPI for Python) built against the site's MPI
## Written by hpcstack 0.3.0 from recipe mpi4py/4.1.2 for site cirrus.
##
proc ModulesHelp { } {
    puts stderr {mpi4py/4.1.2: mpi4py 4.1.2 (MPI for Python) built against the site's MPI}
    puts stderr ""
    puts stderr {Load it with `module load mpi4py/4.1.2`; it loads python/3.12.1-gpu first (depends-on).}
    puts stderr {The stack lives in /work/y07/shared/cirrus-software/mpi4py/4.1.2 (HPCSTACK_MPI4PY_ROOT); its python is on PATH and its}
    puts stderr {site-packages on PYTHONPATH.}
    puts stderr ""
    puts stderr {Your own packages on top of the stack: make a venv and extend it, e.g.}
    puts stderr {    module load mpi4py/4.1.2}
    puts stderr {    python -m venv ~/myvenv}
    puts stderr {    extend-venv-activate ~/myvenv}
    puts stderr {Then `source ~/myvenv/bin/activate` loads this module (if it is not loaded yet) and}
    puts stderr {puts the venv first, and `deactivate` unloads it again (only if activate loaded it).}
    puts stderr {`extend-venv-activate --help` says more; `extend-venv-activate --undo ~/myvenv`}
    puts stderr {restores the venv's original activate scripts.}
    puts stderr ""
    puts stderr {As a Jupyter kernel (JupyterLab, JupyterHub, Open OnDemand), in the stack's own}
    puts stderr {Python and ipykernel; the kernel loads this module when it starts (run it with}
    puts stderr {this module loaded: it finds the site itself):}
    puts stderr {    hpcstack kernel install mpi4py/4.1.2 --user}
    puts stderr {(add --venv ~/myvenv for a venv extended as above); undo it with}
    puts stderr {    hpcstack kernel remove mpi4py/4.1.2 --user}
    puts stderr ""
    puts stderr {What is in it (every package and its version: /work/y07/shared/cirrus-software/mpi4py/4.1.2/.hpcstack/pip-freeze.txt):}
    puts stderr {    build 1.6.1, cython 3.3.1, mpi4py 4.1.2}
    puts stderr ""
    puts stderr {What loading it changes (unloading restores each):}
    puts stderr {    HPCSTACK_MPI4PY_ROOT: /work/y07/shared/cirrus-software/mpi4py/4.1.2, the}
    puts stderr {    stack}
    puts stderr {    PATH: $HPCSTACK_MPI4PY_ROOT/venv/bin and $HPCSTACK_MPI4PY_ROOT/bin}
    puts stderr {    first: the stack's python, extend-venv-activate, hpcstack-doctor, and a}
    puts stderr {    `pip` that says where your packages go (the stack itself is read-only)}
    puts stderr {    PYTHONPATH: $HPCSTACK_MPI4PY_ROOT/venv/lib/python3.12/site-packages (an}
    puts stderr {    extended venv puts its own first)}
    puts stderr {    PYTHONNOUSERSITE=1: packages in your user site (~/.local, `pip install}
    puts stderr {    --user`) are not imported; a value of your own is replaced}
    puts stderr {    PIP_CONSTRAINT,}
    puts stderr {    UV_CONSTRAINT=$HPCSTACK_MPI4PY_ROOT/.hpcstack/constraints.txt: replace}
    puts stderr {    your own settings; pip and uv keep the stack's versions of its packages}
    puts stderr {    in your venv (and refuse what breaks them)}
    puts stderr {    SLURM_EXPORT_ENV: NONE (a job of `sbatch --export=NONE`) becomes ALL, so}
    puts stderr {    the tasks srun starts get this module's environment}
    puts stderr ""
    puts stderr {Your own packages: not with `pip install --user` (this module hides ~/.local,}
    puts stderr {PYTHONNOUSERSITE=1) but in a venv extended for this module:}
    puts stderr {    python -m venv ~/myvenv && extend-venv-activate ~/myvenv}
    puts stderr {    source ~/myvenv/bin/activate && pip install PACKAGE}
    puts stderr {`hpcstack-doctor` checks that venv (or, with none active, ~/.local).}
    puts stderr ""
    puts stderr {How to launch on cirrus (a batch script; `sbatch script`):}
    puts stderr {    #SBATCH --partition=gpu --qos=gpu --account=BUDGET --nodes=2 --gres=gpu:4 --exclusive}
    puts stderr {    module load mpi4py/4.1.2}
    puts stderr {    export OMP_NUM_THREADS=10}
    puts stderr {    srun --ntasks=8 --ntasks-per-node=4 --cpus-per-task=10 --hint=nomultithread python train.py # one rank per task (MPI, Horovod)}
}

module-whatis {Description: mpi4py 4.1.2 (MPI for Python) built against the site's MPI}

conflict mpi4py
module-whatis {Version: 4.1.2}
module-whatis {Packages: build 1.6.1, cython 3.3.1, mpi4py 4.1.2}
module-whatis {Keywords: mpi4py, build, cython}
module-whatis {Hardware: GPUs, CUDA 12.4 (site cirrus)}

depends-on python/3.12.1-gpu

if {[module-info mode load] && [info exists ::env(VIRTUAL_ENV)] && $::env(VIRTUAL_ENV) ne ""} {
    set hpcstack_extended 0
    set hpcstack_activate [file join $::env(VIRTUAL_ENV) bin activate]
    if {[file pathtype $::env(VIRTUAL_ENV)] eq "absolute" && [string index $hpcstack_activate 0] eq "/"
            && [file isfile $hpcstack_activate] && [file readable $hpcstack_activate]
            && ![catch {open $hpcstack_activate {RDONLY NONBLOCK}} hpcstack_fh]} {
        catch {set hpcstack_extended [expr {[string first {# >>> hpcstack mpi4py/4.1.2 >>>} [read $hpcstack_fh 1048576]] >= 0}]}
        close $hpcstack_fh
    }
    if {!$hpcstack_extended} {
        regsub -all {[[:cntrl:]]} $::env(VIRTUAL_ENV) ? hpcstack_venv
        puts stderr [string map [list @VENV@ $hpcstack_venv] {mpi4py/4.1.2: the active venv @VENV@ is not extended for this module, so `python` is now the stack's while `pip` installs into the venv, where that python does not look; fix: module unload mpi4py/4.1.2; deactivate; module load mpi4py/4.1.2; extend-venv-activate @VENV@; source @VENV@/bin/activate}]
    }
}

if {[module-info mode load] && [string index {/work/y07/shared/cirrus-modulefiles/.hpcstack-status.json} 0] eq "/"
        && [file isfile {/work/y07/shared/cirrus-modulefiles/.hpcstack-status.json}]
        && ![catch {open {/work/y07/shared/cirrus-modulefiles/.hpcstack-status.json} {RDONLY NONBLOCK}} hpcstack_sf]} {
    catch {
        set hpcstack_st [read $hpcstack_sf 65536]
        set hpcstack_at [string first "\n\"mpi4py/4.1.2\": \"" $hpcstack_st]
        if {$hpcstack_at >= 0} {
            set hpcstack_st [string range $hpcstack_st [expr {$hpcstack_at + 18}] end]
            set hpcstack_end [string first "\"" $hpcstack_st]
            if {$hpcstack_end > 0} {
                set hpcstack_line {mpi4py/4.1.2: }
                append hpcstack_line [string range $hpcstack_st 0 [expr {$hpcstack_end - 1}]] " (hpcstack status for details)"
                puts stderr $hpcstack_line
            }
        }
    }
    catch {close $hpcstack_sf}
}

if {[module-info mode load] && [info exists ::env(SLURM_EXPORT_ENV)] && $::env(SLURM_EXPORT_ENV) eq "NONE"} {
    setenv SLURM_EXPORT_ENV ALL
}

if {[module-info mode load] && ![file exists {/work/y07/shared/cirrus-software/mpi4py/4.1.2/venv/pyvenv.cfg}]} {
    if {[info commands reportError] ne ""} {
        reportError {mpi4py/4.1.2: its stack /work/y07/shared/cirrus-software/mpi4py/4.1.2 is missing or unreadable on this machine; tell the site's admins (`module avail mpi4py` lists the other versions)}
    } else {
        puts stderr {ERROR: mpi4py/4.1.2: its stack /work/y07/shared/cirrus-software/mpi4py/4.1.2 is missing or unreadable on this machine; tell the site's admins (`module avail mpi4py` lists the other versions)}
    }
    break
}

set root {/work/y07/shared/cirrus-software/mpi4py/4.1.2}
setenv HPCSTACK_MPI4PY_ROOT $root
prepend-path PATH {/work/y07/shared/cirrus-software/mpi4py/4.1.2/bin}
prepend-path PATH {/work/y07/shared/cirrus-software/mpi4py/4.1.2/venv/bin}
prepend-path PYTHONPATH {/work/y07/shared/cirrus-software/mpi4py/4.1.2/venv/lib/python3.12/site-packages}
setenv PYTHONNOUSERSITE {1}
setenv PIP_CONSTRAINT {/work/y07/shared/cirrus-software/mpi4py/4.1.2/.hpcstack/constraints.txt}
setenv UV_CONSTRAINT {/work/y07/shared/cirrus-software/mpi4py/4.1.2/.hpcstack/constraints.txt}
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /work/y07/shared/cirrus-modulefiles/mpi4py/4.1.2
# default version, only if mpi4py has none yet
if ! { [ -e /work/y07/shared/cirrus-modulefiles/mpi4py/.modulerc ] || [ -L /work/y07/shared/cirrus-modulefiles/mpi4py/.modulerc ] || [ -e /work/y07/shared/cirrus-modulefiles/mpi4py/.version ] || [ -L /work/y07/shared/cirrus-modulefiles/mpi4py/.version ] || [ -e /work/y07/shared/cirrus-modulefiles/mpi4py/.modulerc.lua ] || [ -L /work/y07/shared/cirrus-modulefiles/mpi4py/.modulerc.lua ] || [ -e /work/y07/shared/cirrus-modulefiles/mpi4py/default ] || [ -L /work/y07/shared/cirrus-modulefiles/mpi4py/default ]; }; then
mkdir -p /work/y07/shared/cirrus-modulefiles/mpi4py
hpcstack_tmp=$(mktemp /work/y07/shared/cirrus-modulefiles/mpi4py/..version.XXXXXX)
cat > "$hpcstack_tmp" <<'HPCSTACK_EOF'
#%Module1.0
## The default version of mpi4py: `module load mpi4py` loads mpi4py/4.1.2.
## Written by hpcstack module set-default; read by Environment Modules and by Lmod.
## Change it with: hpcstack module set-default mpi4py/VERSION --site cirrus
set ModulesVersion {4.1.2}
HPCSTACK_EOF
chmod 644 "$hpcstack_tmp"
mv -fT "$hpcstack_tmp" /work/y07/shared/cirrus-modulefiles/mpi4py/.version
fi

# afterwards hpcstack removes earlier builds of the stack but the one this replaced
